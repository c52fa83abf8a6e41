// Paged attention for Hopper (sm_90a): the same contract as paged_attention.cu (read its header
// for the layouts and the page table), with both matrix products on wgmma.
//
// One CTA = 2 warpgroups = 128 query rows (64 per warpgroup) of one head against one key split;
// key tiles of 128. S = Q K^T is m64n128k16 with Q and K both read from shared memory through
// descriptors (K-major); O += P V is m64n64k16 with P from registers and V read MN-major
// (transposed by the instruction). Tiles are stored with the 128-byte swizzle that the
// descriptors expect (16-byte chunk c of row r at c ^ (r & 7)), written by cp.async (the paged
// gather: a tile may straddle pages), three stages deep so that one barrier per tile suffices.
// Two CTAs per SM, so one warpgroup's softmax overlaps another's matrix products. The O rescale is
// skipped for a warp when no row maximum moved.
//
// A 64-key variant that kept Q in registers (A-from-registers for S as well) produced wrong
// results in some builds (docs/cuda.md); it was removed rather than shipped.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define HEAD_DIM 64
#define BLOCK_N 64
#define ROW_CHUNKS 8
#define NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 swz(u32 r, u32 c) { return r * ROW_CHUNKS + (c ^ (r & 7)); }

__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
    u32 n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }


__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Shared-memory matrix descriptor for a 128-byte-swizzled tile: start address, leading byte
// offset 16 (unused by these shapes), stride byte offset 1024 (between groups of 8 rows of 128 B).
__device__ __forceinline__ u64 smem_desc(u32 addr) {
    u64 d = 0;
    d |= (u64)((addr & 0x3FFFF) >> 4);
    d |= (u64)1 << 16;
    d |= (u64)(1024 >> 4) << 32;
    d |= (u64)1 << 62;  // 128B swizzle
    return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator registers across the asynchronous MMAs.
__device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64x64] (+)= A[64x16] (registers) * B[16x64] (shared, descriptor). TRANS_B = 1: B is stored
// MN-major (V as [key][dim]); 0: K-major (K as [key][dim], i.e. B^T rows).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float* d, const u32* a, u64 desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TRANS_B), "r"(scale_d));
}

__device__ __forceinline__ u32 find_page(const u32* __restrict__ cum, u32 n_pages, u32 t) {
    u32 lo = 0, hi = n_pages;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) >> 1;
        if (__ldg(cum + mid) <= t) lo = mid; else hi = mid;
    }
    return lo;
}

// ---------------------------------------------------------------------------------------------
// 128 keys per tile: Q read from shared memory (no Q registers), so the 64 S accumulators fit
// next to O in 128 registers; twice the work per barrier and per S instruction of 64-key tiles.

#define BN_WIDE 128

__device__ __forceinline__ void wgmma_m64n128k16_ss(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

#define STAGES 3

template <int WGS>
__device__ __forceinline__ void wide_body(const u16* __restrict__ q, u16* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_lse, const u16* __restrict__ pool, u32 page_size,
    const u32* __restrict__ indices, const u32* __restrict__ cum, const u32* __restrict__ n_pages_ptr,
    u32 lq, u32 heads, u32 n_splits, float scale_log2) {
    constexpr u32 kBlockM = 64 * WGS;
    constexpr u32 kThreads = 128 * WGS;
    constexpr int kLoadRows = (BN_WIDE * ROW_CHUNKS) / kThreads;
    constexpr u32 kRowStep = kThreads / ROW_CHUNKS;
    constexpr u32 kTileBytes = BN_WIDE * HEAD_DIM * 2;  // one K or V tile, 16 KB
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
    u16* sq = (u16*)smem;
    u16* skv = (u16*)(smem + kBlockM * HEAD_DIM * 2);  // [STAGES][K|V][BN_WIDE][64]

    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31;
    const u32 warp = tid >> 5;
    const u32 wg = warp >> 2;
    const u32 wg_row0 = wg * 64 + (warp & 3) * 16;
    const u32 q0 = blockIdx.x * kBlockM;
    const u32 split = blockIdx.y;
    const u32 h = blockIdx.z;
    // The table's size is read here, not passed by the host, so a captured CUDA graph can be
    // replayed as the cache grows; splits are whole 128-key tiles.
    const u32 n_pages = __ldg(n_pages_ptr);
    const u32 kv_len = __ldg(cum + n_pages);
    const u32 tiles_per_split = ((kv_len + BN_WIDE - 1) / BN_WIDE + n_splits - 1) / n_splits;
    const u32 kv_begin = split * tiles_per_split * BN_WIDE;
    u32 kv_end = kv_begin + tiles_per_split * BN_WIDE;
    if (kv_end > kv_len) kv_end = kv_len;
    // An empty split (more splits than tiles) writes an empty partial: LSE -inf.
    const u32 n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + BN_WIDE - 1) / BN_WIDE : 0;

    // 32-bit strides (the host checks that a page, K and V, has fewer than 2^32 elements): the
    // kernel is at its register cap, and 64-bit constants cost two registers each.
    const u32 head_stride = page_size * HEAD_DIM;
    const u32 v_offset = head_stride * heads;
    const u32 page_stride = 2 * v_offset;

#pragma unroll
    for (int i = 0; i < (int)((kBlockM * ROW_CHUNKS) / kThreads); ++i) {
        u32 c = tid + i * kThreads;
        u32 r = c >> 3, ch = c & 7;
        u32 row = q0 + r;
        bool ok = row < lq;
        const u16* src = q + ((u64)(ok ? row : 0) * heads + h) * HEAD_DIM + ch * 8;
        cp_async_16(smem_addr(sq + swz(r, ch) * 8), src, ok);
    }
    const u32 ld_col = tid & 7;
    const u32 ld_row = tid >> 3;
    // One page cursor per thread, for its first row of the tile; its other rows lie further on,
    // so their pages are found by walking forward from it (fewer live registers than a cursor
    // per row).
    u32 cursor = find_page(cum, n_pages, kv_begin + ld_row < kv_len ? kv_begin + ld_row : kv_len - 1);
    auto load_kv = [&](u32 tile, u32 stage) {
        u16* sk = skv + stage * (2 * BN_WIDE * HEAD_DIM);
        u16* sv = sk + BN_WIDE * HEAD_DIM;
        u32 t0 = kv_begin + tile * BN_WIDE;
        u32 p = cursor;
#pragma unroll
        for (int i = 0; i < kLoadRows; ++i) {
            u32 r = ld_row + kRowStep * i;
            u32 t = t0 + r;
            bool ok = t < kv_end;
            const u16* src = pool;
            if (ok) {
                while (__ldg(cum + p + 1) <= t) ++p;
                if (i == 0) cursor = p;
                u32 slot = t - __ldg(cum + p);
                u64 page = __ldg(indices + p);
                src = pool + page * page_stride + (h * head_stride + slot * HEAD_DIM + ld_col * 8);
            }
            u32 off = swz(r, ld_col) * 8;
            cp_async_16(smem_addr(sk + off), src, ok);
            cp_async_16(smem_addr(sv + off), ok ? src + v_offset : src, ok);
        }
    };

    load_kv(0, 0);
    cp_async_commit();
    if (n_tiles > 1) {
        load_kv(1, 1);
        cp_async_commit();
    }

    float o_acc[32];
    float s[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) o_acc[i] = 0.f;
    float row_max[2] = {NEG_INF, NEG_INF};
    float row_sum[2] = {0.f, 0.f};
    const u32 sq_wg = smem_addr(sq) + wg * 64 * 128;  // this warpgroup's 64 Q rows

    for (u32 tile = 0; tile < n_tiles; ++tile) {
        const u32 stage = tile % STAGES;
        // Groups in flight: this tile's and the next one's. After the barrier every thread has
        // finished the previous tile, whose stage the tile after next may now refill: one barrier
        // per tile.
        if (tile + 1 < n_tiles) cp_async_wait<1>(); else cp_async_wait<0>();
        // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (tile + 2 < n_tiles) {
            load_kv(tile + 2, (tile + 2) % STAGES);
            cp_async_commit();
        }
        const u32 sk = smem_addr(skv + stage * (2 * BN_WIDE * HEAD_DIM));
        const u32 sv = sk + kTileBytes;

        // The first k-step overwrites S (scale-d = 0); s was zeroed once before the loop so that
        // the asynchronous MMA never reads undefined registers.
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            wgmma_m64n128k16_ss(s, smem_desc(sq_wg + kc * 32), smem_desc(sk + kc * 32), kc);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(s[i])::"memory");

        const u32 t0 = kv_begin + tile * BN_WIDE;
        if (t0 + BN_WIDE > kv_end) {
#pragma unroll
            for (int j = 0; j < 16; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    u32 col = j * 8 + (lane & 3) * 2 + (c & 1);
                    if (t0 + col >= kv_end) s[j * 4 + c] = NEG_INF;
                }
        }
        u32 p_frag[8][4];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + hf * 2], s[j * 4 + hf * 2 + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(row_max[hf], mx * scale_log2);
            float corr = fast_exp2(row_max[hf] - m_new);
            row_max[hf] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                float p0 = fast_exp2(fmaf(s[j * 4 + hf * 2], scale_log2, -m_new));
                float p1 = fast_exp2(fmaf(s[j * 4 + hf * 2 + 1], scale_log2, -m_new));
                s[j * 4 + hf * 2] = p0;
                s[j * 4 + hf * 2 + 1] = p1;
                sum += p0 + p1;
            }
            row_sum[hf] = row_sum[hf] * corr + sum;
            // Once the running maximum settles, most tiles change no row's maximum (corr == 1
            // exactly): skip the rescale when that holds for the whole warp.
            if (__any_sync(0xffffffffu, corr != 1.f)) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    o_acc[j * 4 + hf * 2] *= corr;
                    o_acc[j * 4 + hf * 2 + 1] *= corr;
                }
            }
        }
#pragma unroll
        for (int kc = 0; kc < 8; ++kc) {
            p_frag[kc][0] = pack_bf16x2(s[(2 * kc) * 4 + 0], s[(2 * kc) * 4 + 1]);
            p_frag[kc][1] = pack_bf16x2(s[(2 * kc) * 4 + 2], s[(2 * kc) * 4 + 3]);
            p_frag[kc][2] = pack_bf16x2(s[(2 * kc + 1) * 4 + 0], s[(2 * kc + 1) * 4 + 1]);
            p_frag[kc][3] = pack_bf16x2(s[(2 * kc + 1) * 4 + 2], s[(2 * kc + 1) * 4 + 3]);
        }
        fence_acc(o_acc);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 8; ++kc) wgmma_m64n64k16_rs<1>(o_acc, p_frag[kc], smem_desc(sv + kc * 2048), 1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_acc(o_acc);
#pragma unroll
        for (int kc = 0; kc < 8; ++kc)
#pragma unroll
            for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(p_frag[kc][i])::"memory");
    }

    const u32 g = lane >> 2;
    const u32 tq = lane & 3;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        float l = row_sum[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float inv = l > 0.f ? 1.f / l : 0.f;
        u32 row = q0 + wg_row0 + hf * 8 + g;
        if (row >= lq) continue;
        u64 base = ((u64)row * heads + h) * HEAD_DIM;
        if (n_splits == 1) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *(u32*)(out + base + j * 8 + tq * 2) =
                    pack_bf16x2(o_acc[j * 4 + hf * 2] * inv, o_acc[j * 4 + hf * 2 + 1] * inv);
        } else {
            u64 pbase = (u64)split * lq * heads * HEAD_DIM + base;
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *(float2*)(part_o + pbase + j * 8 + tq * 2) =
                    make_float2(o_acc[j * 4 + hf * 2] * inv, o_acc[j * 4 + hf * 2 + 1] * inv);
            if (tq == 0)
                part_lse[((u64)split * lq + row) * heads + h] =
                    l > 0.f ? row_max[hf] + __log2f(l) : NEG_INF;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2) paged_attention_fwd_sm90_wide(const u16* __restrict__ q, u16* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_lse, const u16* __restrict__ pool, u32 page_size,
    const u32* __restrict__ indices, const u32* __restrict__ cum, const u32* __restrict__ n_pages_ptr,
    u32 lq, u32 heads, u32 n_splits, float scale_log2) {
    wide_body<2>(q, out, part_o, part_lse, pool, page_size, indices, cum, n_pages_ptr, lq, heads,
                 n_splits, scale_log2);
}
