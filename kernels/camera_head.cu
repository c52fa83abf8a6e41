// The camera head on the GPU. The head sees one token per frame, so every matrix product here
// has m = 1 row in streaming (at most a handful in phase 1): the layers are weight-streaming
// GEMVs, latency- and bandwidth-bound, and every kernel spreads its work over all SMs.
//
// Layouts (token-major, row-major):
//   f32 activations [frames][width]; bf16 operands [frames][width] stored as u16;
//   qkv (bf16) [frames][3 * width] = q | k | v, each [heads][head_dim];
//   camera cache (bf16), one (iteration, layer) plane: [capacity][width] for K and for V.
// The number of cached frames is read from device memory (the step is captured in a CUDA graph,
// so it must not be a launch-time scalar).
//
// Launches per call (iterations x trunk blocks = 4 x 4 at full size):
//   cam_token_norm                         once
//   cam_linear3_m* (modulation)            per iteration: SiLU(embed_pose(pose)) in its prologue,
//                                          the modulation h = gate (xn (1 + scale) + shift) + x in
//                                          its epilogue (one warp owns shift, scale and gate of a
//                                          column)
//   cam_linear_m* (qkv)                    per block: LN1(h) in its prologue; bias, bf16, and the
//                                          K/V cache append in its epilogue
//   cam_attention_partial                  per block: split over the keys; the last split of a
//                                          (frame, head) to finish merges them all
//   cam_linear_m* (proj)                   per block: h += ls1 (attn wᵀ + b)
//   cam_linear_m* (fc1)                    per block: LN2(h) prologue; bias, bf16, GELU, bf16
//   cam_linear_m* (fc2)                    per block: h += ls2 (hidden wᵀ + b)
//   cam_linear_m* (pose branch fc1)        per iteration: trunk_norm(h) prologue; its epilogue
//                                          feeds GELU(hidden) through the 9-wide fc2 and the last
//                                          CTA to finish accumulates the pose encoding
//
// Shared helpers (bf16, reductions, GELU) come from common.cuh.

#include "common.cuh"

// Threads of the attention kernel; its combine across warps needs head_dim <= ATT_THREADS.
#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)

// Round to nearest even; NaN becomes the canonical quiet NaN (the rounding add could carry it
// into infinity). dpt.cu and transformer.cu round NaN differently; each keeps its own.
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0u;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (u16)(bits >> 16);
}

__device__ __forceinline__ float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// A load that bypasses L1 (data another CTA of the same kernel wrote).
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

struct alignas(16) Chunk8 {
    u32 w[4];
};

__device__ __forceinline__ void unpack8(const Chunk8& c, float* f) {
    bf16x8_to_f32(make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]), f);
}

// 16 bytes of weights, streamed: read-only, not kept in L1 (the activations live there), with a
// 256-byte L2 prefetch (a warp reads 512 contiguous bytes per load).
__device__ __forceinline__ Chunk8 ld_stream(const u16* p) {
    Chunk8 c;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(c.w[0]), "=r"(c.w[1]), "=r"(c.w[2]), "=r"(c.w[3])
        : "l"(p));
    return c;
}

// ---------------------------------------------------------------------------------------------
// x = token_norm(token) (LN, affine, eps_token) and xn = LN(x) without affine (eps_adaptive):
// the trunk's base and the adaptive modulation's normalised input, computed once per call.
// grid = frames, block = 256 (or more for widths above 2048: width <= 8 * blockDim); the row
// stays in registers. Token r starts at tokens + r * token_stride.
#define TN_PER_THREAD 8
extern "C" __global__ void __launch_bounds__(1024)
    cam_token_norm(const float* __restrict__ tokens, u64 token_stride,
                   const float* __restrict__ w, const float* __restrict__ b, float eps_token,
                   float eps_adaptive, float* __restrict__ x, float* __restrict__ xn, u32 width) {
    __shared__ float red[32];
    const u32 r = blockIdx.x;
    const float* in = tokens + (u64)r * token_stride;
    float v[TN_PER_THREAD];
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < TN_PER_THREAD; ++j) {
        const u32 i = threadIdx.x + j * blockDim.x;
        v[j] = i < width ? in[i] : 0.f;
        s += v[j];
    }
    float mean = block_sum_ceil_warps(s, red) / (float)width;
    float q = 0.f;
#pragma unroll
    for (int j = 0; j < TN_PER_THREAD; ++j) {
        const u32 i = threadIdx.x + j * blockDim.x;
        const float d = v[j] - mean;
        if (i < width) q += d * d;
    }
    float inv = rsqrtf(block_sum_ceil_warps(q, red) / (float)width + eps_token);
    s = 0.f;
#pragma unroll
    for (int j = 0; j < TN_PER_THREAD; ++j) {
        const u32 i = threadIdx.x + j * blockDim.x;
        if (i < width) {
            float y = (v[j] - mean) * inv;
            if (w) y *= w[i];
            if (b) y += b[i];
            v[j] = y;
            x[(u64)r * width + i] = y;
            s += y;
        }
    }
    mean = block_sum_ceil_warps(s, red) / (float)width;
    q = 0.f;
#pragma unroll
    for (int j = 0; j < TN_PER_THREAD; ++j) {
        const u32 i = threadIdx.x + j * blockDim.x;
        const float d = v[j] - mean;
        if (i < width) q += d * d;
    }
    inv = rsqrtf(block_sum_ceil_warps(q, red) / (float)width + eps_adaptive);
#pragma unroll
    for (int j = 0; j < TN_PER_THREAD; ++j) {
        const u32 i = threadIdx.x + j * blockDim.x;
        if (i < width) xn[(u64)r * width + i] = (v[j] - mean) * inv;
    }
}

// ---------------------------------------------------------------------------------------------
// The small-m linear layer: y[r][n] = x[r][:] · w[n][:] + bias[n], w bf16 [n][k] row-major
// (torch's [out, in]), f32 accumulation, with a prologue that makes x and an epilogue that
// consumes y (see LIN_PRO_* / LIN_EPI_*).
//
// A warp owns a group of NC output columns (g, g + group_stride, ...: NC = 3 lets the modulation
// see shift, scale and gate of one column together) for a tile of M rows (blockIdx.y): each lane
// streams every 32nd 16-byte chunk of the group's weight rows (U chunks per row in flight, the
// first batch issued before the prologue so that it overlaps it), multiplies them with the M
// rows of x (shared memory after a prologue, else global/L1), and the warp reduces by shuffles.
// The weights are read once per row tile. Warps walk the groups with a grid stride (the host
// sizes the grid to what is resident, so the prologue runs once per CTA).
//
// The rounding points are the model's: bf16 operands, f32 accumulation and bias; the bf16
// outputs are rounded once after the bias (and once more after a GELU that feeds a GEMM).

#define LIN_WARPS 8
#define LIN_THREADS (LIN_WARPS * 32)

// Prologues (where x comes from).
#define LIN_PRO_NONE 0   // x: bf16 rows in global memory, x_stride apart (k % 8 == 0 or not)
#define LIN_PRO_LN 1     // x = bf16(LN(src) * nw + nb), src f32 [rows][k], eps (k % 8 == 0)
#define LIN_PRO_EMBED 2  // x = bf16(SiLU(eb + ew · pose)), ew f32 [k][9], pose rows pose_stride apart
// Epilogues (where y goes; "v" is the accumulated dot product, b the bias or 0).
#define LIN_EPI_F32 0        // out_f32[r][n] = v + b
#define LIN_EPI_BF16 1       // out_bf16[r][n] = bf16(v + b); for rows r in the append mask,
                             // columns >= width (K | V of a qkv row) also go to cache slot
                             // *cache_len + r, or cache_len[r] with own_lens
#define LIN_EPI_BF16_GELU 2  // out_bf16[r][n] = bf16(GELU(bf16(v + b)))
#define LIN_EPI_RESID 3      // h[r][n] += gamma[n] (v + b)
#define LIN_EPI_MODULATE 4   // NC = 3, columns (c, c + W, c + 2W) = shift, scale, gate:
                             // h[r][c] = gate (mxn[r][c] (1 + scale) + shift) + mx[r][c]
#define LIN_EPI_BRANCH 5     // pose branch: u = GELU(bf16(v + b)); delta[r][o] = bb[o] +
                             // sum_n u bw[o][n] (o < 9) through per-CTA partials merged by the
                             // last CTA, which updates raw and pose_out (see below)

// The kernel's one argument (mirrored by `LinArgs` in src/gpu_model/camera_head.rs: pointers
// first, then 32-bit fields, 256 bytes). Unused pointers are null.
struct LinArgs {
    const u16* x;
    const u16* w;
    const float* bias;
    const float* src;  // LN prologue
    const float* nw;
    const float* nb;
    const float* pose;  // embed prologue
    const float* ew;
    const float* eb;
    float* out_f32;
    u16* out_bf16;
    float* h;  // residual / modulation
    const float* gamma;
    const float* mx;
    const float* mxn;
    u16* cache_k;  // qkv append
    u16* cache_v;
    const u32* cache_len;
    const float* bw;  // pose branch
    const float* bb;
    float* part;
    u32* counter;
    float* raw;
    float* pose_out;
    u32 rows;
    u32 n;
    u32 k;
    u32 x_stride;
    u32 prologue;
    u32 epilogue;
    float eps;
    u32 pose_stride;
    u32 capacity;
    u32 width;
    u32 append;  // rows whose K/V go to the cache: bit r for row r (rows < 32)
    u32 first;
    u32 groups;
    u32 group_stride;
    u32 own_lens;  // row r has its own cache length cache_len[r] (a two-frame step)
    u32 pad1;
};

// Sums each of v[0..M) over the CTA (every thread gets the totals). red: M x 32 floats.
template <int M>
__device__ __forceinline__ void block_sum_rows(float* v, float* red) {
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < M; ++r) v[r] = warp_sum(v[r]);
    __syncthreads();
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < M; ++r) red[r * 32 + warp] = v[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < M; ++r) v[r] = warp_sum(lane < LIN_WARPS ? red[r * 32 + lane] : 0.f);
}

// Values of a row one thread keeps in registers in the LayerNorm prologue below (K <= 2048).
#define LN_REG_VALUES 8

// The LayerNorm prologue of one or two rows with each thread's values held in registers: the
// rows are read from memory once, with the affine parameters, instead of once a pass (three
// dependent trips, about 3 us of each streaming linear's start). The same sums in the same
// order as the general form below (element i of a row by thread i % LIN_THREADS, in rising
// i), so the results are bit-identical.
template <int M>
__device__ __forceinline__ void ln_prologue_in_registers(const LinArgs& a, u32 K, u32 row0, u32 nr,
                                                         u16* __restrict__ xs, float* red) {
    float v[M][LN_REG_VALUES], w[LN_REG_VALUES], b[LN_REG_VALUES];
#pragma unroll
    for (int j = 0; j < LN_REG_VALUES; ++j) {
        const u32 i = threadIdx.x + (u32)j * LIN_THREADS;
        const bool in = i < K;
        w[j] = in && a.nw ? a.nw[i] : 1.f;
        b[j] = in && a.nb ? a.nb[i] : 0.f;
#pragma unroll
        for (int r = 0; r < M; ++r) v[r][j] = in && (u32)r < nr ? a.src[(u64)(row0 + r) * K + i] : 0.f;
    }
    float s[M];
#pragma unroll
    for (int r = 0; r < M; ++r) {
        s[r] = 0.f;
#pragma unroll
        for (int j = 0; j < LN_REG_VALUES; ++j)
            if (threadIdx.x + (u32)j * LIN_THREADS < K && (u32)r < nr) s[r] += v[r][j];
    }
    block_sum_rows<M>(s, red);
    float mean[M];
#pragma unroll
    for (int r = 0; r < M; ++r) {
        mean[r] = s[r] / (float)K;
        s[r] = 0.f;
#pragma unroll
        for (int j = 0; j < LN_REG_VALUES; ++j)
            if (threadIdx.x + (u32)j * LIN_THREADS < K && (u32)r < nr) {
                const float d = v[r][j] - mean[r];
                s[r] += d * d;
            }
    }
    block_sum_rows<M>(s, red);
#pragma unroll
    for (int r = 0; r < M; ++r) s[r] = rsqrtf(s[r] / (float)K + a.eps);
#pragma unroll
    for (int j = 0; j < LN_REG_VALUES; ++j) {
        const u32 i = threadIdx.x + (u32)j * LIN_THREADS;
        if (i >= K) continue;
#pragma unroll
        for (int r = 0; r < M; ++r) {
            u16 o = 0;
            if ((u32)r < nr) {
                float x = (v[r][j] - mean[r]) * s[r];
                if (a.nw) x *= w[j];
                if (a.nb) x += b[j];
                o = f32_to_bf16(x);
            }
            xs[(u64)r * K + i] = o;
        }
    }
}

template <int NC, int U>
__device__ __forceinline__ void lin_load(Chunk8 (&wb)[NC][U], const LinArgs& a, u32 g, u32 base,
                                         u32 lane, u32 nchunks) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        const u16* wr = a.w + (u64)(g + c * a.group_stride) * a.k;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 idx = base + u * 32 + lane;
            if (idx < nchunks) {
                wb[c][u] = ld_stream(wr + (u64)idx * 8);
            } else {
                wb[c][u].w[0] = wb[c][u].w[1] = wb[c][u].w[2] = wb[c][u].w[3] = 0u;
            }
        }
    }
}

// One group's outputs for one row (see LIN_EPI_*); v: the warp-reduced dot products.
template <int NC>
__device__ __forceinline__ void lin_epilogue(const LinArgs& a, u32 g, u32 row, const float* v,
                                             u32 cache_len, float* bacc) {
    float y[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) y[c] = v[c] + (a.bias ? a.bias[g + c * a.group_stride] : 0.f);

    switch (a.epilogue) {
        case LIN_EPI_F32:
#pragma unroll
            for (int c = 0; c < NC; ++c)
                a.out_f32[(u64)row * a.n + g + c * a.group_stride] = y[c];
            break;
        case LIN_EPI_BF16:
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const u32 col = g + c * a.group_stride;
                const u16 o = f32_to_bf16(y[c]);
                a.out_bf16[(u64)row * a.n + col] = o;
                if (row < 32 && ((a.append >> row) & 1u) && col >= a.width) {
                    const u64 slot = a.own_lens ? (u64)a.cache_len[row] : (u64)cache_len + row;
                    if (slot < a.capacity) {
                        u16* dst = col < 2 * a.width ? a.cache_k : a.cache_v;
                        dst[slot * a.width + col % a.width] = o;
                    }
                }
            }
            break;
        case LIN_EPI_BF16_GELU:
#pragma unroll
            for (int c = 0; c < NC; ++c)
                a.out_bf16[(u64)row * a.n + g + c * a.group_stride] =
                    f32_to_bf16(gelu_erf(bf16_round(y[c])));
            break;
        case LIN_EPI_RESID:
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const u32 col = g + c * a.group_stride;
                const float gm = a.gamma ? a.gamma[col] : 1.f;
                a.h[(u64)row * a.n + col] += gm * y[c];
            }
            break;
        case LIN_EPI_MODULATE:
            if constexpr (NC == 3) {
                const u64 at = (u64)row * a.group_stride + g;
                a.h[at] = y[2] * (a.mxn[at] * (1.f + y[1]) + y[0]) + a.mx[at];
            }
            break;
        case LIN_EPI_BRANCH: {
            const float u = gelu_erf(bf16_round(y[0]));
#pragma unroll
            for (int o = 0; o < SPEC_POSE_ENC_LEN; ++o) bacc[o] += u * a.bw[(u64)o * a.n + g];
        } break;
        default:
            break;
    }
}

// The sweep form (R > 0; M = 1 or 2 rows, one column a group, k = 2048 R): the CTA owns the
// contiguous columns [c0, c1) of a grid that splits n evenly, so its weight rows are one
// contiguous block, and its 256 threads walk that block in address order, U x 16 bytes a thread
// a batch (U / R whole rows), the next batch in flight while the current one is multiplied. A
// thread always meets the same R chunks of each x row, kept in registers. Warp sums of each
// (column, row) go to shared memory (at most SWEEP_MAX_ROWS columns a CTA), one thread a
// (column, row) adds them and runs the epilogue. Against a warp per column, whose warps stream rows 4 or 16 KB apart all over
// the matrix, the camera head took 1.25 ms instead of 1.35 for one row, and the heads of a
// two-frame step 0.07 ms a frame less for two (docs/gpu-model.md). Not for the pose branch, whose
// epilogue reduces across its warps. Eight chunks a batch instead of four was a tie.
#define SWEEP_MAX_ROWS 64

template <int M, int NC, int U, int R = 0>
__device__ __forceinline__ void linear_body(const LinArgs& a, u16* xs) {
    __shared__ float red[8 * 32];
    __shared__ float bred[LIN_WARPS][8][SPEC_POSE_ENC_LEN];
    __shared__ u32 s_last;

    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 row0 = blockIdx.y * M;
    const u32 nr = min((u32)M, a.rows - row0);
    const u32 K = a.k;
    // 16-byte loads need 16-byte aligned rows (x in shared memory always is).
    const bool vec = (K & 7u) == 0 && ((u64)a.w & 15u) == 0 &&
                     (a.prologue != LIN_PRO_NONE ||
                      ((a.x_stride & 7u) == 0 && ((u64)a.x & 15u) == 0));
    const u32 nchunks = K >> 3;
    const u32 nwarps_total = gridDim.x * LIN_WARPS;
    u32 g = blockIdx.x * LIN_WARPS + warp;

    // The first batch of weights, in flight during the prologue.
    Chunk8 wb[NC][U];
    if (R == 0 && vec && g < a.groups) lin_load<NC, U>(wb, a, g, 0, lane, nchunks);
    // Sweep form: the CTA's columns, and its first batch issued before the prologue too.
    constexpr int RR = R > 0 ? R : 1;
    const u32 sw_c0 = (u32)(((u64)blockIdx.x * a.n) / gridDim.x);
    const u32 sw_c1 = (u32)(((u64)(blockIdx.x + 1) * a.n) / gridDim.x);
    Chunk8 sw_cur[U];
    auto sw_load = [&](Chunk8 (&b)[U], u32 row) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 r = row + u / RR;
            if (r < sw_c1)
                b[u] = ld_stream(a.w + (u64)r * K + (u64)((u % RR) * 256 + threadIdx.x) * 8);
        }
    };
    if constexpr (R > 0) {
        if (sw_c0 < sw_c1) sw_load(sw_cur, sw_c0);
    }

    // x rows: shared memory (prologue) or global. Dead rows of the tile (r >= nr) read zeros
    // (shared) or row 0 again (global); their results are dropped.
    const u16* xrow[M];
    if (a.prologue == LIN_PRO_NONE) {
#pragma unroll
        for (int r = 0; r < M; ++r)
            xrow[r] = a.x + (u64)(row0 + ((u32)r < nr ? r : 0)) * a.x_stride;
    } else {
#pragma unroll
        for (int r = 0; r < M; ++r) xrow[r] = xs + (u64)r * K;
        bool ln_done = false;
        if constexpr (M <= 2) {
            if (a.prologue == LIN_PRO_LN && K <= LIN_THREADS * LN_REG_VALUES) {
                ln_prologue_in_registers<M>(a, K, row0, nr, xs, red);
                ln_done = true;
            }
        }
        if (a.prologue == LIN_PRO_LN && !ln_done) {
            // Two passes (mean, then squared deviations; the CPU reference uses f64, two passes
            // keep f32 close to it), each thread walking every LIN_THREADS-th element as the
            // former single-CTA kernel did.
            float s[M];
#pragma unroll
            for (int r = 0; r < M; ++r) s[r] = 0.f;
#pragma unroll 4
            for (u32 i = threadIdx.x; i < K; i += LIN_THREADS) {
#pragma unroll
                for (int r = 0; r < M; ++r)
                    if ((u32)r < nr) s[r] += a.src[(u64)(row0 + r) * K + i];
            }
            block_sum_rows<M>(s, red);
            float mean[M];
#pragma unroll
            for (int r = 0; r < M; ++r) {
                mean[r] = s[r] / (float)K;
                s[r] = 0.f;
            }
#pragma unroll 4
            for (u32 i = threadIdx.x; i < K; i += LIN_THREADS) {
#pragma unroll
                for (int r = 0; r < M; ++r)
                    if ((u32)r < nr) {
                        const float d = a.src[(u64)(row0 + r) * K + i] - mean[r];
                        s[r] += d * d;
                    }
            }
            block_sum_rows<M>(s, red);
#pragma unroll
            for (int r = 0; r < M; ++r) s[r] = rsqrtf(s[r] / (float)K + a.eps);
#pragma unroll 4
            for (u32 i = threadIdx.x; i < K; i += LIN_THREADS) {
                const float wi = a.nw ? a.nw[i] : 1.f;
                const float bi = a.nb ? a.nb[i] : 0.f;
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    u16 o = 0;
                    if ((u32)r < nr) {
                        float v = (a.src[(u64)(row0 + r) * K + i] - mean[r]) * s[r];
                        if (a.nw) v *= wi;
                        if (a.nb) v += bi;
                        o = f32_to_bf16(v);
                    }
                    xs[(u64)r * K + i] = o;
                }
            }
        } else if (a.prologue == LIN_PRO_EMBED) {
#pragma unroll 4
            for (u32 i = threadIdx.x; i < K; i += LIN_THREADS) {
                float wi[SPEC_POSE_ENC_LEN];
#pragma unroll
                for (int j = 0; j < SPEC_POSE_ENC_LEN; ++j) wi[j] = a.ew[i * SPEC_POSE_ENC_LEN + j];
                const float bi = a.eb ? a.eb[i] : 0.f;
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    u16 o = 0;
                    if ((u32)r < nr) {
                        const float* p = a.pose + (u64)(row0 + r) * a.pose_stride;
                        float acc = bi;
#pragma unroll
                        for (int j = 0; j < SPEC_POSE_ENC_LEN; ++j) acc += wi[j] * p[j];
                        o = f32_to_bf16(silu(acc));
                    }
                    xs[(u64)r * K + i] = o;
                }
            }
        }
        __syncthreads();
    }

    u32 cache_len = 0;
    if (a.epilogue == LIN_EPI_BF16 && a.append) cache_len = *a.cache_len;
    float bacc[SPEC_POSE_ENC_LEN];  // pose branch: this lane's row's delta contributions
#pragma unroll
    for (int o = 0; o < SPEC_POSE_ENC_LEN; ++o) bacc[o] = 0.f;

    if constexpr (R > 0) {
        __shared__ float sw_part[SWEEP_MAX_ROWS][M][LIN_WARPS];
        constexpr int G = U / R;
        const u32 t = threadIdx.x;
        const u32 c0 = sw_c0, c1 = sw_c1;
        float xf[M][R][8];
#pragma unroll
        for (int r = 0; r < M; ++r)
#pragma unroll
            for (int j = 0; j < R; ++j)
                unpack8(*(const Chunk8*)(xrow[r] + (u64)(j * 256 + t) * 8), xf[r][j]);
        Chunk8 nxt[U];
        Chunk8 (&cur)[U] = sw_cur;
        for (u32 row = c0; row < c1; row += G) {
            if (row + G < c1) sw_load(nxt, row + G);
            float acc[G][M];
#pragma unroll
            for (int q = 0; q < G; ++q)
#pragma unroll
                for (int r = 0; r < M; ++r) acc[q][r] = 0.f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float wf[8];
                unpack8(cur[u], wf);
#pragma unroll
                for (int r = 0; r < M; ++r)
#pragma unroll
                    for (int e = 0; e < 8; ++e)
                        acc[u / R][r] = fmaf(wf[e], xf[r][u % R][e], acc[u / R][r]);
            }
#pragma unroll
            for (int q = 0; q < G; ++q)
#pragma unroll
                for (int r = 0; r < M; ++r) {
                    const float v = warp_sum(acc[q][r]);
                    if (lane == 0 && row + q < c1) sw_part[row + q - c0][r][warp] = v;
                }
#pragma unroll
            for (int u = 0; u < U; ++u) cur[u] = nxt[u];
        }
        __syncthreads();
        // One thread a (column, row): c1 - c0 <= SWEEP_MAX_ROWS, so M * 64 <= LIN_THREADS.
        const u32 col = t / M, r = t % M;
        if (col < c1 - c0 && r < nr) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < LIN_WARPS; ++w) v += sw_part[col][r][w];
            lin_epilogue<1>(a, c0 + col, row0 + r, &v, cache_len, bacc);
        }
        return;
    }

    bool loaded = vec;
    for (; g < a.groups; g += nwarps_total) {
        float acc[NC][M];
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int r = 0; r < M; ++r) acc[c][r] = 0.f;

        if (vec) {
            for (u32 base = 0; base < nchunks; base += 32 * U) {
                if (!loaded) lin_load<NC, U>(wb, a, g, base, lane, nchunks);
                loaded = false;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const u32 idx = base + u * 32 + lane;
                    if (idx < nchunks) {
                        float wf[NC][8];
#pragma unroll
                        for (int c = 0; c < NC; ++c) unpack8(wb[c][u], wf[c]);
#pragma unroll
                        for (int r = 0; r < M; ++r) {
                            float xf[8];
                            unpack8(*(const Chunk8*)(xrow[r] + (u64)idx * 8), xf);
#pragma unroll
                            for (int c = 0; c < NC; ++c)
#pragma unroll
                                for (int e = 0; e < 8; ++e)
                                    acc[c][r] = fmaf(wf[c][e], xf[e], acc[c][r]);
                        }
                    }
                }
            }
        } else {
            // Unaligned rows (k % 8 != 0; never the camera head's shapes): scalar loads.
            for (u32 i = lane; i < K; i += 32) {
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    const float wv = bf16_to_f32(a.w[(u64)(g + c * a.group_stride) * K + i]);
#pragma unroll
                    for (int r = 0; r < M; ++r)
                        acc[c][r] = fmaf(wv, bf16_to_f32(xrow[r][i]), acc[c][r]);
                }
            }
        }

        // Reduce over the warp; lane r keeps row r's sums.
        float v[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            v[c] = 0.f;
#pragma unroll
            for (int r = 0; r < M; ++r) {
                const float t = warp_sum(acc[c][r]);
                if (lane == (u32)r) v[c] = t;
            }
        }
        if (lane < nr) lin_epilogue<NC>(a, g, row0 + lane, v, cache_len, bacc);
    }

    if (a.epilogue != LIN_EPI_BRANCH) return;
    // The pose branch's 9-wide last layer: warps -> CTA partial (fixed order) -> the last CTA
    // of the row tile to finish sums the partials in CTA order (deterministic), adds the bias,
    // accumulates raw and writes pose_out (FoV, outputs 7 and 8, through a ReLU).
    if (lane < nr) {
#pragma unroll
        for (int o = 0; o < SPEC_POSE_ENC_LEN; ++o) bred[warp][lane][o] = bacc[o];
    }
    __syncthreads();
    const u32 t = threadIdx.x;
    float* part = a.part + ((u64)blockIdx.y * gridDim.x + blockIdx.x) * (8 * SPEC_POSE_ENC_LEN);
    if (t < nr * SPEC_POSE_ENC_LEN) {
        const u32 r = t / SPEC_POSE_ENC_LEN, o = t % SPEC_POSE_ENC_LEN;
        float s = 0.f;
        for (int w = 0; w < LIN_WARPS; ++w) s += bred[w][r][o];
        part[t] = s;
    }
    __threadfence();
    __syncthreads();
    if (t == 0) s_last = atomicAdd(a.counter + blockIdx.y, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (t < nr * SPEC_POSE_ENC_LEN) {
        const u32 r = t / SPEC_POSE_ENC_LEN, o = t % SPEC_POSE_ENC_LEN;
        const float* p0 = a.part + (u64)blockIdx.y * gridDim.x * (8 * SPEC_POSE_ENC_LEN) + t;
        float delta = 0.f;
        for (u32 c = 0; c < gridDim.x; ++c) delta += ld_cg(p0 + (u64)c * (8 * SPEC_POSE_ENC_LEN));
        delta += a.bb ? a.bb[o] : 0.f;
        const u64 at = (u64)(row0 + r) * SPEC_POSE_ENC_LEN + o;
        const float sum = a.first ? delta : a.raw[at] + delta;
        a.raw[at] = sum;
        a.pose_out[at] = o >= 7 ? fmaxf(sum, 0.f) : sum;
    }
    if (t == 0) a.counter[blockIdx.y] = 0;  // ready for the next launch (graph replays)
}

// Entry points: M rows per tile (1, 2, 4, 8), NC columns per warp. grid = (CTAs, row tiles),
// block = LIN_THREADS, dynamic shared memory = M * k * 2 bytes with a prologue, else 0.
#define LIN_ENTRY(name, M, NC, U)                                                     \
    extern "C" __global__ void __launch_bounds__(LIN_THREADS, 2) name(const LinArgs a) { \
        extern __shared__ __align__(16) u16 lin_xs[];                                 \
        linear_body<M, NC, U>(a, lin_xs);                                             \
    }
// Four chunks a lane per batch (a warp streams 2 KB of a weight row at a time): measured on the
// H200 against eight (4 KB), the camera head's four trunk shapes took 49.8 us a block instead of
// 55.0, at the same three CTAs an SM. Prefetching the next batch while the current one is
// multiplied, more columns a warp (2, 4, 8) and grids of one column a warp all measured no
// better or worse (docs/gpu-model.md).
LIN_ENTRY(cam_linear_m1, 1, 1, 4)
LIN_ENTRY(cam_linear_m2, 2, 1, 4)
LIN_ENTRY(cam_linear_m4, 4, 1, 4)
LIN_ENTRY(cam_linear_m8, 8, 1, 4)
LIN_ENTRY(cam_linear3_m1, 1, 3, 4)
LIN_ENTRY(cam_linear3_m2, 2, 3, 4)
LIN_ENTRY(cam_linear3_m4, 4, 3, 4)
LIN_ENTRY(cam_linear3_m8, 8, 3, 4)
// Sweep entry points (M rows, k = 2048 R): grid = (CTAs, 1), the columns split evenly over
// them, at most SWEEP_MAX_ROWS a CTA; dynamic shared memory as the general entries.
#define LIN_SWEEP_ENTRY(name, M, R)                                                   \
    extern "C" __global__ void __launch_bounds__(LIN_THREADS, 2) name(const LinArgs a) { \
        extern __shared__ __align__(16) u16 lin_xs[];                                 \
        linear_body<M, 1, 4, R>(a, lin_xs);                                           \
    }
LIN_SWEEP_ENTRY(cam_sweep_k2048, 1, 1)
LIN_SWEEP_ENTRY(cam_sweep_k8192, 1, 4)
LIN_SWEEP_ENTRY(cam_sweep2_k2048, 2, 1)
LIN_SWEEP_ENTRY(cam_sweep2_k8192, 2, 4)

// ---------------------------------------------------------------------------------------------
// Attention of the frames' queries over cache[0 .. cache_len) followed by the current frames'
// keys (N = cache_len + frames keys, no mask), split over `splits` CTAs per (query, head); with
// own_lens (the two frames of a two-frame step, each as if streamed alone) frame r attends to
// cache[0 .. cache_len[r]) followed by its own key alone:
// split s takes keys [s * chunk, min(N, (s + 1) * chunk)), chunk = ceil(N / splits), computed on
// the device since N is. Each writes its normalised partial output and its log2-sum-exp; the
// last split of a (frame, head) to finish (a device counter per (frame, head), reset by that
// split for the next launch) merges them into out (bf16 [frames][width]).
//
// Inside a CTA (4 warps) a key is handled by a group of head_dim / 8 lanes, each lane owning 8
// dimensions (one 16-byte load of K and one of V), so a warp takes 32 / (head_dim / 8) keys at a
// time, every group running its own online softmax; groups then warps are merged at the end.
// Scores are in the log2 domain: scale_log2 = log2(e) / sqrt(head_dim).
// grid = (splits, heads, frames), block = ATT_THREADS; head_dim is 8..128, a power of two.

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    cam_attention_partial(const u16* __restrict__ qkv, const u16* __restrict__ cache_k,
                          const u16* __restrict__ cache_v, const u32* __restrict__ cache_len_ptr,
                          u32 own_lens, u32 capacity, u32 frames, u32 width, u32 head_dim,
                          u32 splits,
                          float scale_log2, float* __restrict__ part_o,
                          float* __restrict__ part_lse, u32* __restrict__ counters,
                          u16* __restrict__ out) {
    __shared__ float sm_m[ATT_WARPS];
    __shared__ float sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][128];
    __shared__ u32 s_last;

    const u32 split = blockIdx.x, head = blockIdx.y, r = blockIdx.z;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 lanes_per_key = head_dim >> 3;
    const u32 keys_per_warp = 32 / lanes_per_key;
    const u32 group = lane / lanes_per_key, part = lane % lanes_per_key;
    const u32 keys_per_round = ATT_WARPS * keys_per_warp;

    const u32 cached = min(cache_len_ptr[own_lens ? r : 0], capacity);
    const u32 n_keys = cached + (own_lens ? 1 : frames);
    // Row of the qkv scratch holding key `cached + i`.
    const u32 first_own = own_lens ? r : 0;
    const u32 chunk = (n_keys + splits - 1) / splits;
    const u32 begin = min(split * chunk, n_keys);
    const u32 end = min(begin + chunk, n_keys);

    const u64 qkv_row = 3ull * width;
    const u32 dim_off = head * head_dim + part * 8;
    float q[8];
    {
        const Chunk8 c = *(const Chunk8*)(qkv + r * qkv_row + dim_off);
        unpack8(c, q);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] *= scale_log2;
    }

    float m = NEG_INF, l = 0.f, acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;

    // The loop bound is uniform across the warp so that every lane reaches the shuffles.
    for (u32 t0 = begin + warp * keys_per_warp; t0 < end; t0 += keys_per_round) {
        const u32 t = t0 + group;
        const bool valid = t < end;
        Chunk8 kc = {{0u, 0u, 0u, 0u}}, vc = {{0u, 0u, 0u, 0u}};
        if (valid) {
            const u16* kp;
            const u16* vp;
            if (t < cached) {
                kp = cache_k + (u64)t * width;
                vp = cache_v + (u64)t * width;
            } else {
                const u16* row = qkv + (u64)(first_own + t - cached) * qkv_row;
                kp = row + width;
                vp = row + 2 * width;
            }
            kc = *(const Chunk8*)(kp + dim_off);
            vc = *(const Chunk8*)(vp + dim_off);
        }
        float kf[8], vf[8];
        unpack8(kc, kf);
        unpack8(vc, vf);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s += q[i] * kf[i];
        for (u32 off = lanes_per_key >> 1; off > 0; off >>= 1)
            s += __shfl_xor_sync(FULL_MASK, s, off);
        if (valid) {
            const float m_new = fmaxf(m, s);
            const float corr = exp2f(m - m_new);  // 0 while m is still -inf
            const float p = exp2f(s - m_new);
            l = l * corr + p;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = acc[i] * corr + p * vf[i];
            m = m_new;
        }
    }

    // Merge the groups of a warp (they differ in the lane bits at and above lanes_per_key).
    for (u32 off = lanes_per_key; off < 32; off <<= 1) {
        const float m_o = __shfl_xor_sync(FULL_MASK, m, off);
        const float l_o = __shfl_xor_sync(FULL_MASK, l, off);
        float acc_o[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc_o[i] = __shfl_xor_sync(FULL_MASK, acc[i], off);
        const float m_new = fmaxf(m, m_o);
        if (m_new != NEG_INF) {
            const float a = exp2f(m - m_new), c = exp2f(m_o - m_new);
            l = l * a + l_o * c;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = acc[i] * a + acc_o[i] * c;
            m = m_new;
        }
    }
    if (lane < lanes_per_key) {  // group 0 now holds the warp's total
#pragma unroll
        for (int i = 0; i < 8; ++i) sm_acc[warp][part * 8 + i] = acc[i];
        if (lane == 0) {
            sm_m[warp] = m;
            sm_l[warp] = l;
        }
    }
    __syncthreads();

    // Merge the warps: thread d < head_dim owns output dimension d.
    const u32 d = threadIdx.x;
    if (d < head_dim) {
        float mx = NEG_INF;
        for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, sm_m[w]);
        float o = 0.f, lse = NEG_INF;
        if (mx != NEG_INF) {
            float sum_l = 0.f, sum_o = 0.f;
            for (int w = 0; w < ATT_WARPS; ++w) {
                const float f = exp2f(sm_m[w] - mx);
                sum_l += sm_l[w] * f;
                sum_o += sm_acc[w][d] * f;
            }
            o = sum_o / sum_l;
            lse = mx + log2f(sum_l);
        }
        const u64 slot = ((u64)r * gridDim.y + head) * splits + split;
        part_o[slot * head_dim + d] = o;
        if (d == 0) part_lse[slot] = lse;
    }

    // The last split to finish merges: out = bf16(sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s -
    // max)). Empty splits carry lse = -inf and weigh nothing; at least one split is never empty
    // (the current frames' keys are always there).
    __threadfence();
    __syncthreads();
    u32* counter = counters + (u64)r * gridDim.y + head;
    if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == splits - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (d < head_dim) {
        const u64 first = ((u64)r * gridDim.y + head) * splits;
        float mx = NEG_INF;
        for (u32 s = 0; s < splits; ++s) mx = fmaxf(mx, ld_cg(part_lse + first + s));
        float sum_w = 0.f, sum_o = 0.f;
        for (u32 s = 0; s < splits; ++s) {
            const float lse = ld_cg(part_lse + first + s);
            if (lse == NEG_INF) continue;
            const float f = exp2f(lse - mx);
            sum_w += f;
            sum_o += f * ld_cg(part_o + (first + s) * head_dim + d);
        }
        out[(u64)r * width + head * head_dim + d] =
            f32_to_bf16(sum_w > 0.f ? sum_o / sum_w : 0.f);
    }
    if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (graph replays)
}
