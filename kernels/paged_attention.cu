// Paged attention over the GCT KV cache, FlashAttention-2 style, for NVIDIA GPUs from sm_80 on.
//
// Layout (shared with the host, see src/backend/cuda/kv.rs):
//   q, out           [lq][heads][64]                       bf16
//   pool (one layer) [page][K|V][heads][page_size][64]     bf16 (head-major: a head's slots of a
//                    page are contiguous)
//   page table       indices[n_pages] (physical page ids in attention order) and
//                    cum[n_pages + 1] (prefix sums of each visible page's valid length)
// The keys form one logical sequence of cum[n_pages] tokens: token t lives in the visible page p
// with cum[p] <= t < cum[p + 1], at slot t - cum[p]. Padding slots of padded pages are therefore
// never part of the sequence (masked by construction), and a key tile may straddle any number of
// pages (page size 999 is not a multiple of the tile).
//
// One CTA = 4 warps = 128 query rows of one head against one split of the keys. Each warp owns 32
// rows (two m16 tiles), so every K/V fragment read from shared memory feeds two MMAs: with 16 rows
// per warp the ldmatrix traffic would nearly saturate shared memory at the target rate.
// K/V tiles of 64 keys are double-buffered with cp.async; softmax is online in the log2 domain.
//
// Shared helpers (swizzle, bf16 packing, exp2, find_page) come from common.cuh, cp.async,
// ldmatrix and the m16n8k16 MMA from mma.cuh.

#include "common.cuh"
#include "mma.cuh"

// The fragment layouts below are written for 64-wide heads.
static_assert(HEAD_DIM == 64, "paged_attention.cu is specialised for head_dim 64");
#define BLOCK_M 128
#define BLOCK_N 64
#define NUM_WARPS 4
#define NUM_THREADS (NUM_WARPS * 32)
// Split-KV: blockIdx.x = query tile (fastest, so the CTAs reading the same keys run together and
// share them through L2), blockIdx.y = split, blockIdx.z = head.
// n_splits == 1: `out` gets the normalised bf16 result. Otherwise `part_o` gets the normalised f32
// result of this split and `part_lse` its log2-sum-exp, for attention_combine.
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 2)
paged_attention_fwd(const u16* __restrict__ q, u16* __restrict__ out, float* __restrict__ part_o,
                    float* __restrict__ part_lse, const u16* __restrict__ pool, u32 page_size,
                    const u32* __restrict__ indices, const u32* __restrict__ cum,
                    const u32* __restrict__ n_pages_ptr, u32 lq, u32 heads, u32 n_splits,
                    float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem[];
    u16* sq = (u16*)smem;                          // [BLOCK_M][64]
    u16* skv = sq + BLOCK_M * HEAD_DIM;            // [2 stages][K|V][BLOCK_N][64]

    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31;
    const u32 warp = tid >> 5;
    const u32 q0 = blockIdx.x * BLOCK_M;
    const u32 split = blockIdx.y;
    const u32 h = blockIdx.z;
    // The table's size is read here, not passed by the host, so a captured CUDA graph can be
    // replayed as the cache grows; the split size follows from it.
    const u32 n_pages = __ldg(n_pages_ptr);
    const u32 kv_len = __ldg(cum + n_pages);
    const u32 tiles_per_split = ((kv_len + BLOCK_N - 1) / BLOCK_N + n_splits - 1) / n_splits;
    const u32 kv_begin = split * tiles_per_split * BLOCK_N;
    u32 kv_end = kv_begin + tiles_per_split * BLOCK_N;
    if (kv_end > kv_len) kv_end = kv_len;
    // An empty split (more splits than tiles) writes an empty partial: LSE -inf.
    const u32 n_tiles = kv_end > kv_begin ? (kv_end - kv_begin + BLOCK_N - 1) / BLOCK_N : 0;

    const u64 head_stride = (u64)page_size * HEAD_DIM;     // elements between heads of a page
    const u64 v_offset = head_stride * heads;              // K -> V within a page
    const u64 page_stride = 2 * v_offset;

    // ---- Q tile: 128 rows x 8 chunks, 8 chunks per thread.
#pragma unroll
    for (int i = 0; i < (BLOCK_M * ROW_CHUNKS) / NUM_THREADS; ++i) {
        u32 c = tid + i * NUM_THREADS;
        u32 r = c >> 3, ch = c & 7;
        u32 row = q0 + r;
        bool ok = row < lq;
        const u16* src = q + ((u64)(ok ? row : 0) * heads + h) * HEAD_DIM + ch * 8;
        cp_async_16(smem_addr(sq + swz(r, ch) * 8), src, ok);
    }

    // ---- K/V loader: this thread copies chunk column (tid & 7) of rows (tid >> 3) + 16 i.
    // Each row keeps its own page cursor, advanced as the tiles move forward.
    const u32 ld_col = tid & 7;
    const u32 ld_row = tid >> 3;
    u32 cursor[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 t = kv_begin + ld_row + 16 * i;
        cursor[i] = find_page(cum, n_pages, t < kv_len ? t : kv_len - 1);
    }

    auto load_kv = [&](u32 tile, u32 stage) {
        u16* sk = skv + stage * (2 * BLOCK_N * HEAD_DIM);
        u16* sv = sk + BLOCK_N * HEAD_DIM;
        u32 t0 = kv_begin + tile * BLOCK_N;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 r = ld_row + 16 * i;
            u32 t = t0 + r;
            bool ok = t < kv_end;
            const u16* src = pool;
            if (ok) {
                u32 p = cursor[i];
                while (__ldg(cum + p + 1) <= t) ++p;
                cursor[i] = p;
                u32 slot = t - __ldg(cum + p);
                u64 page = __ldg(indices + p);
                src = pool + page * page_stride + h * head_stride + (u64)slot * HEAD_DIM + ld_col * 8;
            }
            u32 off = swz(r, ld_col) * 8;
            cp_async_16(smem_addr(sk + off), src, ok);
            cp_async_16(smem_addr(sv + off), ok ? src + v_offset : src, ok);
        }
    };

    load_kv(0, 0);
    cp_async_commit();  // group: Q + tile 0

    // Accumulators: rows of m-tile mt are warp*32 + mt*16 + {g, g+8} (g = lane / 4).
    float o_acc[2][8][4];
    float row_max[2][2];
    float row_sum[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int d = 0; d < 8; ++d)
#pragma unroll
            for (int c = 0; c < 4; ++c) o_acc[mt][d][c] = 0.f;
        row_max[mt][0] = row_max[mt][1] = NEG_INF;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    u32 q_frag[2][4][4];

    for (u32 tile = 0; tile < n_tiles; ++tile) {
        const u32 stage = tile & 1;
        if (tile + 1 < n_tiles) {
            load_kv(tile + 1, stage ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        if (tile == 0) {
            // Q fragments stay in registers for the whole loop.
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int kc = 0; kc < 4; ++kc) {
                    u32 r = warp * 32 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    u32 ch = kc * 2 + (lane >> 4);
                    ldmatrix_x4(smem_addr(sq + swz(r, ch) * 8), q_frag[mt][kc][0], q_frag[mt][kc][1],
                                q_frag[mt][kc][2], q_frag[mt][kc][3]);
                }
        }

        const u16* sk = skv + stage * (2 * BLOCK_N * HEAD_DIM);
        const u16* sv = sk + BLOCK_N * HEAD_DIM;

        // ---- S = Q K^T (per warp 32 x 64).
        float s[2][8][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) s[mt][nt][c] = 0.f;
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                u32 key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                u32 ch = kc * 2 + ((lane >> 3) & 1);
                u32 b0, b1, b2, b3;
                ldmatrix_x4(smem_addr(sk + swz(key, ch) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_bf16(s[mt][2 * np], q_frag[mt][kc], b0, b1);
                    mma_bf16(s[mt][2 * np + 1], q_frag[mt][kc], b2, b3);
                }
            }
        }

        // ---- Mask keys past the end of this split (only the last tile can be partial).
        const u32 t0 = kv_begin + tile * BLOCK_N;
        if (t0 + BLOCK_N > kv_end) {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    u32 col = nt * 8 + (lane & 3) * 2 + (c & 1);
                    if (t0 + col >= kv_end) {
                        s[0][nt][c] = NEG_INF;
                        s[1][nt][c] = NEG_INF;
                    }
                }
        }

        // ---- Online softmax (log2 domain). Row sums stay per-thread partial until the end.
        u32 p_frag[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float mx = NEG_INF;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][hf * 2], s[mt][nt][hf * 2 + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                float m_new = fmaxf(row_max[mt][hf], mx * scale_log2);
                float corr = fast_exp2(row_max[mt][hf] - m_new);
                row_max[mt][hf] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < 8; ++nt) {
                    float p0 = fast_exp2(fmaf(s[mt][nt][hf * 2], scale_log2, -m_new));
                    float p1 = fast_exp2(fmaf(s[mt][nt][hf * 2 + 1], scale_log2, -m_new));
                    s[mt][nt][hf * 2] = p0;
                    s[mt][nt][hf * 2 + 1] = p1;
                    sum += p0 + p1;
                }
                row_sum[mt][hf] = row_sum[mt][hf] * corr + sum;
#pragma unroll
                for (int d = 0; d < 8; ++d) {
                    o_acc[mt][d][hf * 2] *= corr;
                    o_acc[mt][d][hf * 2 + 1] *= corr;
                }
            }
            // C layout of two adjacent n8 tiles == A layout of one k16 chunk.
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
                p_frag[mt][kc][0] = pack_bf16x2(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                p_frag[mt][kc][1] = pack_bf16x2(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                p_frag[mt][kc][2] = pack_bf16x2(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                p_frag[mt][kc][3] = pack_bf16x2(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }
        }

        // ---- O += P V.
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
#pragma unroll
            for (int dp = 0; dp < 4; ++dp) {
                u32 key = kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                u32 ch = dp * 2 + (lane >> 4);
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(smem_addr(sv + swz(key, ch) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    mma_bf16(o_acc[mt][2 * dp], p_frag[mt][kc], b0, b1);
                    mma_bf16(o_acc[mt][2 * dp + 1], p_frag[mt][kc], b2, b3);
                }
            }
        }
        // The next iteration's loads overwrite the stage just read.
        __syncthreads();
    }

    // ---- Epilogue.
    const u32 g = lane >> 2;
    const u32 tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            float l = row_sum[mt][hf];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            float inv = l > 0.f ? 1.f / l : 0.f;
            u32 row = q0 + warp * 32 + mt * 16 + hf * 8 + g;
            if (row >= lq) continue;
            u64 base = ((u64)row * heads + h) * HEAD_DIM;
            if (n_splits == 1) {
#pragma unroll
                for (int d = 0; d < 8; ++d) {
                    u32 v = pack_bf16x2(o_acc[mt][d][hf * 2] * inv, o_acc[mt][d][hf * 2 + 1] * inv);
                    *(u32*)(out + base + d * 8 + tq * 2) = v;
                }
            } else {
                u64 pbase = (u64)split * lq * heads * HEAD_DIM + base;
#pragma unroll
                for (int d = 0; d < 8; ++d) {
                    float2 v = make_float2(o_acc[mt][d][hf * 2] * inv, o_acc[mt][d][hf * 2 + 1] * inv);
                    *(float2*)(part_o + pbase + d * 8 + tq * 2) = v;
                }
                if (tq == 0)
                    part_lse[((u64)split * lq + row) * heads + h] =
                        l > 0.f ? row_max[mt][hf] + __log2f(l) : NEG_INF;
            }
        }
    }
}

// Merges the splits of paged_attention_fwd: out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max).
// One thread per output element pair; lq * heads * 32 threads.
extern "C" __global__ void attention_combine(const float* __restrict__ part_o,
                                             const float* __restrict__ part_lse,
                                             u16* __restrict__ out, u32 lq, u32 heads,
                                             u32 n_splits) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = (u64)lq * heads * (HEAD_DIM / 2);
    if (i >= total) return;
    u64 rh = i / (HEAD_DIM / 2);  // row * heads + h
    u32 d2 = (u32)(i % (HEAD_DIM / 2));
    u64 plane_lse = (u64)lq * heads;
    float mx = NEG_INF;
    for (u32 s = 0; s < n_splits; ++s) mx = fmaxf(mx, part_lse[s * plane_lse + rh]);
    float acc0 = 0.f, acc1 = 0.f, wsum = 0.f;
    for (u32 s = 0; s < n_splits; ++s) {
        float lse = part_lse[s * plane_lse + rh];
        float w = (lse == NEG_INF) ? 0.f : fast_exp2(lse - mx);
        float2 v = *(const float2*)(part_o + (s * plane_lse + rh) * HEAD_DIM + d2 * 2);
        acc0 += w * v.x;
        acc1 += w * v.y;
        wsum += w;
    }
    float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    *(u32*)(out + rh * HEAD_DIM + d2 * 2) = pack_bf16x2(acc0 * inv, acc1 * inv);
}
