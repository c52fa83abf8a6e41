// Linear layers for Hopper (sm_90a): y[m][n] = x[m][k] . w[n][k]^T (+ bias) (GELU), bf16 in and
// out, f32 accumulation; the row-major layouts of src/backend/cuda/gemm.rs. Why a kernel of our
// own beside cuBLASLt: a frame's products have m = 1005 rows, and cuBLASLt's tiles at that size
// leave SMs idle or run a second, mostly empty wave (docs/gpu-model.md: 250-480 TFLOP/s). Here
// every entry point is one tile shape, and the host picks the shape that makes one wave of CTAs
// (1005 x 1024: 64 x 128 tiles, 16 x 8 = 128 CTAs; 1005 x 4096: 128 x 256 tiles, 8 x 16), timed
// against cuBLASLt's candidates per shape (Tuning::Measure), so it runs only where it wins.
//
// One CTA per output tile of BM = 64 NC rows x BN columns, 128 (NC + 1) threads:
//   warpgroup 0  producer: one thread loads the A (x rows) and B (w rows) tiles of each 64-wide
//                k slice with TMA into a ring of STAGES stages (128-byte swizzle, rows past m
//                read as zeros) and announces each on its `full` mbarrier by transaction bytes;
//                a stage is refilled once every consumer thread arrived on its `empty` mbarrier.
//   warpgroups 1 .. NC  consumers, 64 rows each: per k slice four m64nBNk16 wgmma (both operands
//                from shared memory), one commit group per slice, at most two in flight (the
//                slice before is released as soon as its group completed); then the epilogue
//                from the accumulators: bias, the tanh GELU (cuBLASLt's GELU epilogue), bf16,
//                staged in the ring (free by then) and stored as whole 16-byte chunks.
// Contract (checked by the host): k a multiple of 64, n a multiple of BN, x and w 16-byte
// aligned; any m.

#include "common.cuh"
#include "sm90.cuh"

// A CUtensorMap, passed by value (`const __grid_constant__`).
struct __align__(64) TmaDesc {
    u64 opaque[16];
};

__device__ __forceinline__ void mbar_expect_tx_arrive(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Box (c0, c1) of a 2-D tensor map into shared memory at dst, completing on mbarrier bar.
__device__ __forceinline__ void tma_load_2d(u32 dst, const TmaDesc* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The epilogues (GEMM_EPI_* in src/backend/cuda/gemm_sm90.rs).
#define GEMM_EPI_NONE 0
#define GEMM_EPI_BIAS 1
#define GEMM_EPI_BIAS_GELU 2

// k slice: 64 bf16 = 128 bytes, one swizzle row.
#define GEMM_BK 64

template <int BN, int NC>
struct GemmTile {
    static constexpr u32 BM = 64 * NC;
    static constexpr u32 A_BYTES = BM * GEMM_BK * 2;
    static constexpr u32 B_BYTES = BN * GEMM_BK * 2;
    static constexpr u32 STAGE_BYTES = A_BYTES + B_BYTES;
    // As many stages as fit in about 192 KB, at most 8 (k = 1024 is only 16 slices).
    static constexpr u32 STAGES = (192 * 1024) / STAGE_BYTES > 8 ? 8 : (192 * 1024) / STAGE_BYTES;
};

template <int BN>
__device__ __forceinline__ void wgmma_tile(float* d, u64 desc_a, u64 desc_b) {
    if constexpr (BN == 64) wgmma_m64n64k16_ss(d, desc_a, desc_b, 1);
    else if constexpr (BN == 128) wgmma_m64n128k16_ss(d, desc_a, desc_b, 1);
    else if constexpr (BN == 192) wgmma_m64n192k16_ss(d, desc_a, desc_b, 1);
    else wgmma_m64n256k16_ss(d, desc_a, desc_b, 1);
}

// The tanh form of GELU, as cuBLASLt's GELU epilogue computes it.
__device__ __forceinline__ float gelu_tanh(float x) {
    float t;
    const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
    return 0.5f * x * (1.f + t);
}

// ---- The q/k/v split as the q/k/v product's epilogue (entry gemm_bf16_sm90_qkv_m128n192) ----
// The product's columns are [q | k | v] x heads x 64; a 64-column chunk of the tile is one head
// of one of them. The tile is staged in shared memory as bf16 with its bias (the values the
// split kernel reads from the product's output), then each consumer thread takes half a head
// (32 dims) of a row, the other half in the next lane: q and k get the qk-norm and RoPE of
// kernels/transformer.cu's qkv_split_norm_rope (the same formulas and tables, in f32 with one
// rounding; the norm's sums in another order), q goes to its rows, K and V into the cache pages
// named by the step's write runs.
// Field for field ops::QkvSplitArgs (src/backend/cuda/ops.rs).
struct QkvSplitArgs {
    u16* q;
    u16* k;  // the rows layout of the split kernel: unused here (the host passes pages)
    u16* v;
    u16* pool;
    const u32* runs;
    const u32* n_runs;
    const float* qw;
    const float* qb;
    const float* kw;
    const float* kb;
    const float2* table2d;
    const float2* table_t;
    const float2* table_h;
    const float2* table_w;
    const u32* frame_base;
    u32 heads;
    float eps;
    u32 rope_mode;
    u32 tokens_per_frame;
    u32 grid_w;
    u32 max_frame;
    u32 page_size;
    u32 n_tokens;
};

static_assert(HEAD_DIM == 64, "the fused q/k/v epilogue takes 64-wide heads");

__device__ __forceinline__ void store_half(u16* dst, const float* x) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint4 w;
        w.x = pack_bf16x2(x[8 * i + 0], x[8 * i + 1]);
        w.y = pack_bf16x2(x[8 * i + 2], x[8 * i + 3]);
        w.z = pack_bf16x2(x[8 * i + 4], x[8 * i + 5]);
        w.w = pack_bf16x2(x[8 * i + 6], x[8 * i + 7]);
        *(uint4*)(dst + 8 * i) = w;
    }
}

// Sum of 32 values in four independent chains (the dependent adds, not the loads, set the time).
__device__ __forceinline__ float sum32(const float* v) {
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int d = 0; d < 32; ++d) s[d & 3] += v[d];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

// What the epilogue needs of each of the tile's rows besides the product, prepared in shared
// memory by the consumers before their first slice arrives, so that the epilogue reads no
// global memory (its dependent loads, not its arithmetic, made it as slow as the split kernel):
// per row its K slot (the page address of head 0, or null when no write run holds the token)
// and the RoPE (cos, sin) of its 32 pairs; the qk-norm's weights once.
struct QkvRowPrep {
    u16* slot[128];
    float2 rope[128][HEAD_DIM / 2];  // 2D: 16 for the row's half, then 16 for the column's
    float norm[4][HEAD_DIM];         // q weight, q bias, k weight, k bias
};

// Thread t (0 .. 255) of the consumers: row t, or (t >= 128) two of the norm's 256 values.
__device__ __forceinline__ void qkv_prepare_rows(const QkvSplitArgs& p, QkvRowPrep* prep, u32 m0,
                                                 u32 m, u32 t) {
    if (t >= 128) {
        if (p.qw) {
            for (u32 i = t - 128; i < 4 * HEAD_DIM; i += 128) {
                const float* src = i < HEAD_DIM ? p.qw : i < 2 * HEAD_DIM ? p.qb : i < 3 * HEAD_DIM ? p.kw : p.kb;
                prep->norm[i / HEAD_DIM][i % HEAD_DIM] = __ldg(src + i % HEAD_DIM);
            }
        }
        return;
    }
    const u32 n_runs = __ldg(p.n_runs);
    const u32 f0 = p.rope_mode == 2 ? *p.frame_base : 0;
    {
        const u32 r = t;
        const u32 n = m0 + r;
        u16* slot = nullptr;
        for (u32 k = 0; k < n_runs && n < m; ++k) {
            const u32 first = __ldg(p.runs + 4 * k), len = __ldg(p.runs + 4 * k + 3);
            if (n < first || n >= first + len) continue;
            const u32 page = __ldg(p.runs + 4 * k + 1), s = __ldg(p.runs + 4 * k + 2);
            const u64 v_offset = (u64)p.page_size * p.heads * HEAD_DIM;
            slot = p.pool + (u64)page * 2 * v_offset + (u64)(s + n - first) * HEAD_DIM;
            break;
        }
        prep->slot[r] = slot;
        if (p.rope_mode == 0) return;
        const u32 s = n / p.tokens_per_frame, tk = n % p.tokens_per_frame;
        const bool special = tk < SPEC_SPECIAL_TOKENS;
        const u32 pp = special ? 0 : tk - SPEC_SPECIAL_TOKENS;
        const u32 pr = pp / p.grid_w, pc = pp % p.grid_w;
        if (p.rope_mode == 1) {
            for (u32 hf = 0; hf < 2; ++hf) {
                const u32 pos = special ? 0 : (hf == 0 ? pr + 1 : pc + 1);
                for (u32 j = 0; j < SPEC_ROPE2D_FREQS; ++j)
                    prep->rope[r][16 * hf + j] = __ldg(p.table2d + (u64)pos * SPEC_ROPE2D_FREQS + j);
            }
        } else {
            const u32 f = f0 + s;
            const bool in_table = f < p.max_frame;
            for (u32 i = 0; i < HEAD_DIM / 2; ++i) {
                float2 e;
                if (i < SPEC_ROPE3D_T_PAIRS) {
                    e = __ldg(p.table_t + (u64)(in_table ? f : 0) * SPEC_ROPE3D_T_PAIRS + i);
                } else if (i < SPEC_ROPE3D_T_PAIRS + SPEC_ROPE3D_HW_PAIRS) {
                    const u32 ph = special ? tk : SPEC_SPECIAL_TOKENS + pr;
                    e = __ldg(p.table_h + (u64)ph * SPEC_ROPE3D_HW_PAIRS + (i - SPEC_ROPE3D_T_PAIRS));
                } else {
                    const u32 pw = special ? tk : SPEC_SPECIAL_TOKENS + pc;
                    e = __ldg(p.table_w + (u64)pw * SPEC_ROPE3D_HW_PAIRS +
                              (i - SPEC_ROPE3D_T_PAIRS - SPEC_ROPE3D_HW_PAIRS));
                }
                // A frame past the table poisons the whole head (as the split kernel does).
                if (!in_table) e.x = __int_as_float(0x7fc00000);
                prep->rope[r][i] = e;
            }
        }
    }
}

// Half `hf` (dims 32 hf .. 32 hf + 31) of head `head` of tile row r (token n), 32 bf16 at `src`
// in shared memory; part 0 q, 1 k, 2 v. The two halves of a head are in adjacent lanes
// (lane ^ 1): the norm's sums are exchanged between them, and both lanes always call this
// together (`store` false for rows past the product: nothing is written, the shuffles still
// pair up).
__device__ __forceinline__ void qkv_split_half(const QkvSplitArgs& p, const QkvRowPrep* prep, u32 r,
                                               u32 n, u32 part, u32 head, u32 hf,
                                               const unsigned char* src, bool store) {
    u16* slot = prep->slot[r];
    if (slot) slot += (u64)head * p.page_size * HEAD_DIM;
    if (part == 2) {
        if (!slot || !store) return;
        u16* dst = slot + (u64)p.page_size * p.heads * HEAD_DIM + 32 * hf;
#pragma unroll
        for (int i = 0; i < 4; ++i) *(uint4*)(dst + 8 * i) = *(const uint4*)(src + 16 * i);
        return;
    }
    float x[32];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 w = *(const uint4*)(src + 16 * i);
        const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            x[8 * i + 2 * e] = bf16_to_f32((u16)(ws[e] & 0xffffu));
            x[8 * i + 2 * e + 1] = bf16_to_f32((u16)(ws[e] >> 16));
        }
    }
    if (p.qw) {
        const float* w = prep->norm[2 * part] + 32 * hf;
        const float* b = prep->norm[2 * part + 1] + 32 * hf;
        float sum = sum32(x);
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        const float mean = sum * (1.f / HEAD_DIM);
#pragma unroll
        for (int d = 0; d < 32; ++d) x[d] -= mean;
        float sq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int d = 0; d < 32; ++d) sq[d & 3] += x[d] * x[d];
        float var = (sq[0] + sq[1]) + (sq[2] + sq[3]);
        var += __shfl_xor_sync(FULL_MASK, var, 1);
        const float inv = 1.f / sqrtf(var * (1.f / HEAD_DIM) + p.eps);
#pragma unroll
        for (int d = 0; d < 32; ++d) x[d] = x[d] * inv * w[d] + b[d];
    }
    const float2* cs = prep->rope[r] + 16 * hf;
    if (p.rope_mode == 1) {
        // Rotate-half within this 32-dim half (the row's, or the column's): dim j < 16 pairs
        // with j + 16, both at frequency j.
#pragma unroll
        for (int j = 0; j < SPEC_ROPE2D_FREQS; ++j) {
            const float2 e = cs[j];
            const float a = x[j], b = x[j + 16];
            x[j] = a * e.x - b * e.y;
            x[j + 16] = b * e.x + a * e.y;
        }
    } else if (p.rope_mode == 2) {
        // Interleaved pairs: this half holds pairs 16 hf .. 16 hf + 15.
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const float2 e = cs[k];
            const float a = x[2 * k], b = x[2 * k + 1];
            x[2 * k] = a * e.x - b * e.y;
            x[2 * k + 1] = a * e.y + b * e.x;
        }
    }
    if (!store) return;
    u16* dst = part == 0 ? p.q + ((u64)n * p.heads + head) * HEAD_DIM : slot;
    if (dst) store_half(dst + 32 * hf, x);
}

template <int BN, int NC, bool QKV>
__device__ __forceinline__ void gemm_body(const TmaDesc* a_map, const TmaDesc* b_map,
    const u16* __restrict__ bias, u16* __restrict__ y, u32 m, u32 n, u32 k, u32 epi,
    const QkvSplitArgs* split) {
    using T = GemmTile<BN, NC>;
    extern __shared__ unsigned char smem_raw[];
    // The 128-byte swizzle repeats every 1024 bytes: tiles start on that boundary.
    unsigned char* smem = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
    const u32 ring = smem_addr(smem);
    const u32 bar_full = ring + T::STAGES * T::STAGE_BYTES;
    const u32 bar_empty = bar_full + T::STAGES * 8;
    // QKV: the rows' prepared data after the barriers (the host adds its size).
    QkvRowPrep* prep = (QkvRowPrep*)(smem + T::STAGES * T::STAGE_BYTES + T::STAGES * 16);

    const u32 tid = threadIdx.x;
    const u32 role = tid >> 7;  // 0 producer, 1 .. NC consumers
    const u32 n0 = blockIdx.x * BN;
    const u32 m0 = blockIdx.y * T::BM;
    const u32 k_tiles = k / GEMM_BK;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < T::STAGES; ++s) {
            mbar_init(bar_full + s * 8, 1);          // the producer's expect-tx arrive
            mbar_init(bar_empty + s * 8, NC * 128);  // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (role == 0) {
        if constexpr (NC == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            for (u32 kt = 0; kt < k_tiles; ++kt) {
                const u32 s = kt % T::STAGES;
                mbar_wait(bar_empty + s * 8, ((kt / T::STAGES) & 1) ^ 1);
                const u32 full = bar_full + s * 8;
                mbar_expect_tx_arrive(full, T::STAGE_BYTES);
                const u32 dst = ring + s * T::STAGE_BYTES;
                tma_load_2d(dst, a_map, (int)(kt * GEMM_BK), (int)m0, full);
                tma_load_2d(dst + T::A_BYTES, b_map, (int)(kt * GEMM_BK), (int)n0, full);
            }
        }
        return;
    }
    if constexpr (NC == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const u32 c = role - 1;
    if constexpr (QKV) {
        // While the first slices are on their way: the rows' data for the epilogue (read after
        // the consumers' barrier that follows the products).
        static_assert(T::BM == 128 && NC == 2, "the row preparation is written for 128 rows, 256 threads");
        qkv_prepare_rows(*split, prep, m0, m, tid - 128);
    }
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    for (u32 kt = 0; kt < k_tiles; ++kt) {
        const u32 s = kt % T::STAGES;
        mbar_wait(bar_full + s * 8, (kt / T::STAGES) & 1);
        const u32 a = ring + s * T::STAGE_BYTES + c * 64 * 128;
        const u32 b = ring + s * T::STAGE_BYTES + T::A_BYTES;
        fence_regs<BN / 2>(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) wgmma_tile<BN>(acc, smem_desc(a + kk * 32), smem_desc(b + kk * 32));
        wgmma_commit();
        // The slice before this one is done once at most one group is pending: release it.
        wgmma_wait<1>();
        fence_regs<BN / 2>(acc);
        if (kt > 0) mbar_arrive(bar_empty + ((kt - 1) % T::STAGES) * 8);
    }
    wgmma_wait<0>();
    fence_regs<BN / 2>(acc);

    // Accumulator layout (m64nBN, f32): acc[4 j + 2 hf + e] is row 16 warp + g + 8 hf, column
    // 8 j + 2 tq + e of this warpgroup's 64 x BN tile.
    const u32 lane = tid & 31;
    const u32 warp = (tid >> 5) & 3;
    const u32 g = lane >> 2;
    const u32 tq = lane & 3;
    {
        // Through shared memory, so that global stores are whole 16-byte chunks of a row (the
        // fragments' own 4-byte stores cost 30 % more time at 1005 x 3072 x 1024: docs/cuda.md):
        // the ring is free once both consumers' products completed (every slice was consumed).
        // Rows are BN * 2 + 16 bytes apart: the eight rows of a fragment store land in
        // distinct banks.
        constexpr u32 PITCH = BN * 2 + 16;
        named_sync(1, NC * 128);
        unsigned char* out_tile = smem + c * 64 * PITCH;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const u32 r = warp * 16 + hf * 8 + g;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                float v0 = acc[4 * j + 2 * hf];
                float v1 = acc[4 * j + 2 * hf + 1];
                if (epi != GEMM_EPI_NONE) {
                    const u32 bb = *(const u32*)(bias + n0 + j * 8 + tq * 2);
                    v0 += bf16_to_f32((u16)(bb & 0xffffu));
                    v1 += bf16_to_f32((u16)(bb >> 16));
                    if (epi == GEMM_EPI_BIAS_GELU) {
                        v0 = gelu_tanh(v0);
                        v1 = gelu_tanh(v1);
                    }
                }
                *(u32*)(out_tile + r * PITCH + (j * 8 + tq * 2) * 2) = pack_bf16x2(v0, v1);
            }
        }
        if constexpr (QKV) {
            // Every consumer's rows are staged.
            named_sync(1, NC * 128);
            const u32 C = split->heads * HEAD_DIM;
            constexpr u32 HALVES = T::BM * (BN / HEAD_DIM) * 2;
            // Every thread takes the same number of halves, so that paired lanes meet at the
            // norm's shuffles; a warp's 16 pairs are consecutive rows of one head chunk, so q,
            // k or v is the same across the warp (the full-mask shuffles see every lane).
            static_assert(HALVES % (NC * 128) == 0, "whole rounds of half-heads");
            for (u32 i = tid - 128; i < HALVES; i += NC * 128) {
                const u32 hf = i & 1, rest = i >> 1;
                const u32 r = rest % T::BM, hc = rest / T::BM;
                const u32 row = m0 + r;
                const u32 col = n0 + hc * HEAD_DIM;
                qkv_split_half(*split, prep, r, row, col / C, (col % C) / HEAD_DIM, hf,
                               smem + r * PITCH + hc * HEAD_DIM * 2 + hf * 64, row < m);
            }
            return;
        }
        named_sync(2 + c, 128);
        constexpr u32 CHUNKS = BN / 8;  // 16-byte chunks of a row
        const u32 ctid = tid & 127;
#pragma unroll 4
        for (u32 i = ctid; i < 64 * CHUNKS; i += 128) {
            const u32 r = i / CHUNKS, ch = i % CHUNKS;
            const u32 row = m0 + c * 64 + r;
            if (row < m) *(uint4*)(y + (u64)row * n + n0 + ch * 8) = *(const uint4*)(out_tile + r * PITCH + ch * 16);
        }
    }
}

// Smem: 1024 (alignment slack) + STAGES x (BM + BN) x 128 B + 2 x STAGES mbarriers. The host
// names each entry point once more, in src/backend/cuda/gemm_sm90.rs (GemmTileShape).
#define GEMM_ENTRY(NAME, BN, NC)                                                                  \
    extern "C" __global__ void __launch_bounds__(((NC) + 1) * 128, 1) NAME(                      \
        const __grid_constant__ TmaDesc a_map, const __grid_constant__ TmaDesc b_map,           \
        const u16* __restrict__ bias, u16* __restrict__ y, u32 m, u32 n, u32 k, u32 epi) {       \
        gemm_body<BN, NC, false>(&a_map, &b_map, bias, y, m, n, k, epi, nullptr);        \
    }

GEMM_ENTRY(gemm_bf16_sm90_m128n256, 256, 2)
GEMM_ENTRY(gemm_bf16_sm90_m128n192, 192, 2)
GEMM_ENTRY(gemm_bf16_sm90_m128n128, 128, 2)
GEMM_ENTRY(gemm_bf16_sm90_m128n64, 64, 2)
GEMM_ENTRY(gemm_bf16_sm90_m64n128, 128, 1)
GEMM_ENTRY(gemm_bf16_sm90_m64n64, 64, 1)

// The q/k/v product with the split as its epilogue (the shape of one wave at 1005 tokens x
// 3 x 1024; nothing of the product is written).
extern "C" __global__ void __launch_bounds__(384, 1) gemm_bf16_sm90_qkv_m128n192(
    const __grid_constant__ TmaDesc a_map, const __grid_constant__ TmaDesc b_map,
    const u16* __restrict__ bias, u32 m, u32 n, u32 k, const __grid_constant__ QkvSplitArgs split) {
    gemm_body<192, 2, true>(&a_map, &b_map, bias, nullptr, m, n, k, GEMM_EPI_BIAS, &split);
}
