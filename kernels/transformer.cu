// Elementwise and normalisation kernels of the GPU transformer blocks (DINO ViT-L, aggregator
// frame/global blocks). The GEMMs are cuBLASLt's and attention is paged_attention.cu: what is left
// is LayerNorm, LayerScale residuals, exact GELU, the q/k/v split with qk-norm and RoPE, DINO's
// patchify / token assembly and a few copies. Host side: src/backend/cuda/ops.rs.
//
// Storage: bf16 as u16 bits, f32 for residual streams; all math in f32, every bf16 output rounded
// once (round to nearest even). Activations are token-major [tokens][channels].
// Shared helpers (bf16, reductions, GELU) come from common.cuh.

#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// Helpers

// Round to nearest even; NaN stays NaN (the PTX conversion handles it; camera_head.cu and dpt.cu
// round NaN differently, each keeps its own).
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
    return r;
}

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------------
// LayerNorm over rows of `cols` f32 values. One CTA of LN_THREADS per row; each thread keeps its
// LN_PER_THREAD values in registers (cols <= LN_THREADS * LN_PER_THREAD = 2048, checked by the
// host). Two passes like the CPU code: mean, then the mean of (x - mean)^2 (biased variance).
// weight / bias may be null (no affine). Output bf16 (out_bf16 != 0) or f32, [rows][cols].
// x and out may be the same buffer (in place): every value is in registers before the first
// write, so neither pointer is __restrict__.

#define LN_THREADS 256
#define LN_PER_THREAD 8

extern "C" __global__ void __launch_bounds__(LN_THREADS)
layer_norm_rows(const float* x, u32 cols, const float* __restrict__ weight,
                const float* __restrict__ bias, float eps, void* out, u32 out_bf16) {
    __shared__ float scratch[32];
    const u64 row = blockIdx.x;
    const float* xr = x + row * cols;
    float v[LN_PER_THREAD];
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < LN_PER_THREAD; ++k) {
        const u32 c = threadIdx.x + k * LN_THREADS;
        v[k] = c < cols ? xr[c] : 0.f;
        sum += v[k];
    }
    const float mean = block_sum(sum, scratch) / (float)cols;
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < LN_PER_THREAD; ++k) {
        const u32 c = threadIdx.x + k * LN_THREADS;
        const float d = v[k] - mean;
        sq += c < cols ? d * d : 0.f;
    }
    const float var = block_sum(sq, scratch) / (float)cols;
    const float inv = 1.f / sqrtf(var + eps);
#pragma unroll
    for (int k = 0; k < LN_PER_THREAD; ++k) {
        const u32 c = threadIdx.x + k * LN_THREADS;
        if (c >= cols) continue;
        float y = (v[k] - mean) * inv;
        if (weight) y *= weight[c];
        if (bias) y += bias[c];
        if (out_bf16) {
            ((u16*)out)[row * cols + c] = f32_to_bf16(y);
        } else {
            ((float*)out)[row * cols + c] = y;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LayerScale residual and exact GELU. Each has a scalar kernel and an `_x4` kernel moving four
// consecutive elements per access (8-byte bf16, 16-byte f32 loads); the host picks `_x4` when
// the element count (and cols) is a multiple of 4 and the addresses are aligned for it.

__device__ __forceinline__ u32 pack2(u16 lo, u16 hi) { return (u32)lo | ((u32)hi << 16); }
__device__ __forceinline__ float lo_f32(u32 w) { return bf16_to_f32((u16)(w & 0xffffu)); }
__device__ __forceinline__ float hi_f32(u32 w) { return bf16_to_f32((u16)(w >> 16)); }

// resid[r][c] += gamma[c] * y[r][c].
extern "C" __global__ void residual_add_scaled(float* __restrict__ resid, const u16* __restrict__ y,
                                               const float* __restrict__ gamma, u32 cols, u64 n) {
    GRID_STRIDE(i, n) { resid[i] += gamma[i % cols] * bf16_to_f32(y[i]); }
}

// The same over n4 = n / 4 groups; cols % 4 == 0, so a group never straddles a row.
extern "C" __global__ void residual_add_scaled_x4(float4* __restrict__ resid, const uint2* __restrict__ y,
                                                  const float4* __restrict__ gamma, u32 cols, u64 n4) {
    const u32 cols4 = cols / 4;
    GRID_STRIDE(i, n4) {
        float4 r = resid[i];
        const uint2 w = y[i];
        const float4 g = gamma[i % cols4];
        r.x += g.x * lo_f32(w.x);
        r.y += g.y * hi_f32(w.x);
        r.z += g.z * lo_f32(w.y);
        r.w += g.w * hi_f32(w.y);
        resid[i] = r;
    }
}

// Exact GELU in place on bf16.
extern "C" __global__ void gelu_erf_bf16(u16* __restrict__ x, u64 n) {
    GRID_STRIDE(i, n) { x[i] = f32_to_bf16(gelu_erf(bf16_to_f32(x[i]))); }
}

__device__ __forceinline__ u32 gelu_word(u32 w) {
    return pack2(f32_to_bf16(gelu_erf(lo_f32(w))), f32_to_bf16(gelu_erf(hi_f32(w))));
}

extern "C" __global__ void gelu_erf_bf16_x4(uint2* __restrict__ x, u64 n4) {
    GRID_STRIDE(i, n4) {
        uint2 w = x[i];
        w.x = gelu_word(w.x);
        w.y = gelu_word(w.y);
        x[i] = w;
    }
}

// x[r][c] = gelu(x[r][c] + bias[c]): the sum in f32, one rounding.
extern "C" __global__ void add_bias_gelu_erf_bf16(u16* __restrict__ x, const u16* __restrict__ bias,
                                                  u32 cols, u64 n) {
    GRID_STRIDE(i, n) {
        const float v = bf16_to_f32(x[i]) + bf16_to_f32(bias[i % cols]);
        x[i] = f32_to_bf16(gelu_erf(v));
    }
}

__device__ __forceinline__ u32 bias_gelu_word(u32 w, u32 b) {
    return pack2(f32_to_bf16(gelu_erf(lo_f32(w) + lo_f32(b))),
                 f32_to_bf16(gelu_erf(hi_f32(w) + hi_f32(b))));
}

extern "C" __global__ void add_bias_gelu_erf_bf16_x4(uint2* __restrict__ x, const uint2* __restrict__ bias,
                                                     u32 cols, u64 n4) {
    const u32 cols4 = cols / 4;
    GRID_STRIDE(i, n4) {
        uint2 w = x[i];
        const uint2 b = bias[i % cols4];
        w.x = bias_gelu_word(w.x, b.x);
        w.y = bias_gelu_word(w.y, b.y);
        x[i] = w;
    }
}

// ---------------------------------------------------------------------------------------------
// q/k/v split, per-head LayerNorm(64) of q and k, RoPE, bf16 out.
//
// qkv: [n][3][heads][64] bf16 (the Linear(C, 3C) output); q, k, v: [n][heads][64] bf16.
// One warp per (token, QKV_HEADS_PER_WARP heads), in rounds of four heads: lane 8 i + m holds
// dims 8 m .. 8 m + 7 of the round's head i, one 16-byte load per tensor (512 contiguous bytes
// a warp), so a head's sums take three shuffles and every lane's RoPE entries serve all its
// heads. The token's position, RoPE table entries and K/V destination are worked out once per
// warp, and every load of the warp is issued before the first reduction. (The form before it,
// two dims a lane and a head a warp-wide 64-vector, executed about 885 instructions a warp: ten
// shuffles a head for its two sums alone.) Normalisation and rotation in f32, one rounding at
// the end.
//
// Token n is token t = n % tokens_per_frame of local frame s = n / tokens_per_frame. t < 6: the
// special tokens; t >= 6: patch p = t - 6 at row p / grid_w, column p % grid_w.
//
// rope_mode 1, 2D (frame blocks): positions specials (0, 0), patches (r + 1, c + 1). Rotate-half
//   within each 32-dim half (dims 0-31 by the row, 32-63 by the column): dim j of a half pairs
//   with j + 16 at frequency j % 16. Chunk m holds dims 8 m .. 8 m + 7: half m / 4, the first of
//   their pairs when m % 4 < 2, frequencies 8 (m % 2) + e, partners in chunk m ^ 2 (lane ^ 2).
//   Table: float2 (cos, sin) [position][16].
// rope_mode 2, 3D video (global blocks): positions specials (f, t, t), patches (f, 6 + r, 6 + c),
//   f = frame_index[s] (read on the device: it changes every step inside a CUDA graph, and the
//   two frames of a two-frame step whose first is a non-keyframe share an index).
//   Interleaved pairs (2i, 2i+1): chunk m holds pairs 4 m .. 4 m + 3; pairs 0-9 temporal, 10-20
//   row, 21-31 column. Tables float2 (cos, sin): t [max_frame][10], h [rows_h][11], w [rows_w][11].
//   A frame index at or past max_frame has no table row: q and k are written as NaN so the
//   mistake cannot pass unnoticed (the host checks the frame count before the step).

#define QKV_WARPS 8
#define QKV_HEADS_PER_WARP 8
// The token layout and RoPE split come from spec.cuh (src/model/spec.rs); the lane mapping above
// is written for 64-wide heads in eight 8-dim chunks, split into 32 pairs (3D) or two halves of
// 16 frequencies (2D).
static_assert(HEAD_DIM == 64, "qkv_split_norm_rope maps eight lanes onto a head's 64 dims");
static_assert(QKV_HEADS_PER_WARP % 4 == 0, "qkv_split_norm_rope takes four heads a round");
static_assert(SPEC_ROPE3D_T_PAIRS + 2 * SPEC_ROPE3D_HW_PAIRS == HEAD_DIM / 2, "3D RoPE: 32 pairs");
static_assert(SPEC_ROPE2D_FREQS == HEAD_DIM / 4, "2D RoPE: 16 frequencies per half");

#define QKV_ROUNDS (QKV_HEADS_PER_WARP / 4)

// Eight f32 as one 16-byte word of bf16 (bf16x8_to_f32 of common.cuh reads them).
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
    return make_uint4(pack2(f32_to_bf16(x[0]), f32_to_bf16(x[1])), pack2(f32_to_bf16(x[2]), f32_to_bf16(x[3])),
                      pack2(f32_to_bf16(x[4]), f32_to_bf16(x[5])), pack2(f32_to_bf16(x[6]), f32_to_bf16(x[7])));
}

// Sum over the eight lanes of one head (lanes 8 i .. 8 i + 7).
__device__ __forceinline__ float head_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
}

// LayerNorm of one 64-vector spread over eight lanes (8 values a lane), affine per dim (this
// lane's eight weights and biases, loaded once per warp).
__device__ __forceinline__ void head_norm(float (&x)[8], const float (&w)[8], const float (&b)[8], float eps) {
    float sum = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += x[e];
    const float mean = head_sum(sum) * (1.f / HEAD_DIM);
    float sq = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        x[e] -= mean;
        sq += x[e] * x[e];
    }
    const float inv = 1.f / sqrtf(head_sum(sq) * (1.f / HEAD_DIM) + eps);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = x[e] * inv * w[e] + b[e];
}

// 2D rotate-half: cs[e] the (cos, sin) of dim e of this chunk; `first`: the chunk holds the first
// of each pair (its partners are in lane ^ 2).
__device__ __forceinline__ void rope2d(float (&x)[8], const float2 (&cs)[8], bool first) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const float o = __shfl_xor_sync(0xffffffffu, x[e], 2);
        x[e] = first ? x[e] * cs[e].x - o * cs[e].y : x[e] * cs[e].x + o * cs[e].y;
    }
}

// 3D: four interleaved pairs, cs[p] for dims 2 p and 2 p + 1 of this chunk.
__device__ __forceinline__ void rope3d(float (&x)[8], const float2 (&cs)[4]) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const float a = x[2 * p], b = x[2 * p + 1];
        x[2 * p] = a * cs[p].x - b * cs[p].y;
        x[2 * p + 1] = a * cs[p].y + b * cs[p].x;
    }
}

extern "C" __global__ void __launch_bounds__(QKV_WARPS * 32)
qkv_split_norm_rope(const u16* __restrict__ qkv, u16* __restrict__ q, u16* __restrict__ k,
                    u16* __restrict__ v, u32 n_tokens, u32 heads,
                    // qk-norm: null weights = none
                    const float* __restrict__ qw, const float* __restrict__ qb,
                    const float* __restrict__ kw, const float* __restrict__ kb, float eps,
                    // rope: 0 none, 1 axial 2D, 2 video 3D
                    u32 rope_mode, u32 tokens_per_frame, u32 grid_w,
                    const float2* __restrict__ table2d, const float2* __restrict__ table_t,
                    const float2* __restrict__ table_h, const float2* __restrict__ table_w,
                    const u32* __restrict__ frame_index, u32 max_frame,
                    // K/V straight into the cache pages (pool != null; k and v unused): the
                    // step's write runs [src_token, page, slot, len] and their count, read on
                    // the device as kv_write_tokens does (pool [page][K|V][heads][page_size][64]).
                    u16* __restrict__ pool, const u32* __restrict__ runs,
                    const u32* __restrict__ n_runs_ptr, u32 page_size) {
    const u32 lane = threadIdx.x & 31;
    const u32 quad_head = lane >> 3;  // head of the round
    const u32 chunk = lane & 7;       // dims 8 chunk .. 8 chunk + 7
    const u32 groups = (heads + QKV_HEADS_PER_WARP - 1) / QKV_HEADS_PER_WARP;
    const u32 item = blockIdx.x * QKV_WARPS + (threadIdx.x >> 5);
    if (item >= n_tokens * groups) return;  // whole warps exit together (the host checked
                                            // that n_tokens x groups fits 32 bits)
    const u32 n = item / groups;
    const u32 h_lane = (item % groups) * QKV_HEADS_PER_WARP + quad_head;  // round 0's head

    // Every load of the warp's heads first (a head past `heads` loads nothing and stores nothing).
    const u64 row = (u64)heads * HEAD_DIM;
    const u16* src = qkv + (u64)n * 3 * row + (u64)h_lane * HEAD_DIM + 8 * chunk;
    float xq[QKV_ROUNDS][8], xk[QKV_ROUNDS][8];
    uint4 xv[QKV_ROUNDS];
#pragma unroll
    for (int r = 0; r < QKV_ROUNDS; ++r) {
        uint4 wq = make_uint4(0u, 0u, 0u, 0u), wk = wq;
        xv[r] = wq;
        if (h_lane + 4 * r < heads) {
            const u16* s = src + (u64)(4 * r) * HEAD_DIM;
            wq = *(const uint4*)s;
            wk = *(const uint4*)(s + row);
            xv[r] = *(const uint4*)(s + 2 * row);  // v unchanged
        }
        bf16x8_to_f32(wq, xq[r]);
        bf16x8_to_f32(wk, xk[r]);
    }

    // Where this token's K and V go: rows, or the page slot of the write run holding token n
    // (a token no run holds writes no K/V). Each round's head is `kv_round_stride` further.
    u16* kdst = nullptr;
    u16* vdst = nullptr;
    u64 kv_round_stride = 4 * HEAD_DIM;
    if (!pool) {
        kdst = k + ((u64)n * heads + h_lane) * HEAD_DIM + 8 * chunk;
        vdst = v + ((u64)n * heads + h_lane) * HEAD_DIM + 8 * chunk;
    } else {
        const u32 n_runs = __ldg(n_runs_ptr);
        const u64 v_offset = (u64)page_size * heads * HEAD_DIM;
        kv_round_stride = 4 * (u64)page_size * HEAD_DIM;
        for (u32 r = 0; r < n_runs; ++r) {
            const u32 first = __ldg(runs + 4 * r), len = __ldg(runs + 4 * r + 3);
            if (n < first || n >= first + len) continue;
            const u32 page = __ldg(runs + 4 * r + 1), slot = __ldg(runs + 4 * r + 2);
            kdst = pool + (u64)page * 2 * v_offset +
                   ((u64)h_lane * page_size + slot + n - first) * HEAD_DIM + 8 * chunk;
            vdst = kdst + v_offset;
            break;
        }
    }

    // qk-norm weights of this lane's dims, shared by every head.
    float nqw[8], nqb[8], nkw[8], nkb[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const u32 d = 8 * chunk + e;
        nqw[e] = qw ? __ldg(qw + d) : 0.f;
        nqb[e] = qw ? __ldg(qb + d) : 0.f;
        nkw[e] = qw ? __ldg(kw + d) : 0.f;
        nkb[e] = qw ? __ldg(kb + d) : 0.f;
    }

    // The token's rotation for this lane's dims, shared by every head.
    float2 cs2[8], cs3[4];
#pragma unroll
    for (int e = 0; e < 8; ++e) cs2[e] = make_float2(1.f, 0.f);
#pragma unroll
    for (int e = 0; e < 4; ++e) cs3[e] = make_float2(1.f, 0.f);
    const bool first_of_pair = (chunk & 3) < 2;
    if (rope_mode != 0) {
        const u32 s = n / tokens_per_frame, t = n % tokens_per_frame;
        const bool special = t < SPEC_SPECIAL_TOKENS;
        const u32 p = special ? 0 : t - SPEC_SPECIAL_TOKENS;
        const u32 r = p / grid_w, c = p % grid_w;
        if (rope_mode == 1) {
            const u32 pos = special ? 0 : (chunk < 4 ? r + 1 : c + 1);
            const float2* cs = table2d + (u64)pos * SPEC_ROPE2D_FREQS + 8 * (chunk & 1);
#pragma unroll
            for (int e = 0; e < 8; ++e) cs2[e] = cs[e];
        } else {
            const u32 f = frame_index[s];
            const bool in_table = f < max_frame;
            const u32 ph = special ? t : SPEC_SPECIAL_TOKENS + r;
            const u32 pw = special ? t : SPEC_SPECIAL_TOKENS + c;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 pair = 4 * chunk + e;
                if (pair < SPEC_ROPE3D_T_PAIRS) {
                    cs3[e] = table_t[(u64)(in_table ? f : 0) * SPEC_ROPE3D_T_PAIRS + pair];
                } else if (pair < SPEC_ROPE3D_T_PAIRS + SPEC_ROPE3D_HW_PAIRS) {
                    cs3[e] = table_h[(u64)ph * SPEC_ROPE3D_HW_PAIRS + (pair - SPEC_ROPE3D_T_PAIRS)];
                } else {
                    cs3[e] = table_w[(u64)pw * SPEC_ROPE3D_HW_PAIRS +
                                     (pair - SPEC_ROPE3D_T_PAIRS - SPEC_ROPE3D_HW_PAIRS)];
                }
                // A frame past the table poisons the whole head, not just the temporal pairs.
                if (!in_table) cs3[e].x = __int_as_float(0x7fc00000);
            }
        }
    }

    u16* qdst = q + ((u64)n * heads + h_lane) * HEAD_DIM + 8 * chunk;
#pragma unroll
    for (int r = 0; r < QKV_ROUNDS; ++r) {
        // The sums and rotations shuffle within the round's eight-lane groups: every lane takes
        // part, a head past `heads` only skips its stores.
        if (qw) {
            head_norm(xq[r], nqw, nqb, eps);
            head_norm(xk[r], nkw, nkb, eps);
        }
        if (rope_mode == 1) {
            rope2d(xq[r], cs2, first_of_pair);
            rope2d(xk[r], cs2, first_of_pair);
        } else if (rope_mode == 2) {
            rope3d(xq[r], cs3);
            rope3d(xk[r], cs3);
        }
        if (h_lane + 4 * r >= heads) continue;
        *(uint4*)(qdst + (u64)(4 * r) * HEAD_DIM) = pack8(xq[r]);
        if (kdst) {
            *(uint4*)(kdst + (u64)r * kv_round_stride) = pack8(xk[r]);
            *(uint4*)(vdst + (u64)r * kv_round_stride) = xv[r];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// DINO input: ImageNet-normalised patches as GEMM rows. image [3][H][W] f32 in [0, 1];
// out [Np][row_len] bf16, columns (channel, ky, kx) like the conv weight [C][3][p][p], then
// zeros up to row_len (>= 3 * patch * patch: the host pads 588 to 592 so that cuBLASLt sees
// 16-byte aligned rows), patches row-major over the (H / patch) x (W / patch) grid. One thread
// per output element (writes coalesced; reads are runs of `patch` contiguous floats).

// Element `i` (0..2) of a three-value constant by selects, not an indexed load, so the values
// stay immediates in the code.
__device__ __forceinline__ float pick3(const float (&v)[3], u32 i) { return i == 0 ? v[0] : (i == 1 ? v[1] : v[2]); }

extern "C" __global__ void patchify_normalized(const float* __restrict__ image, u32 height, u32 width,
                                               u32 patch, u16* __restrict__ out, u32 row_len) {
    const u32 pw = width / patch;
    const u32 plen = patch * patch;
    const u32 cols = 3 * plen;
    const u64 n = (u64)(height / patch) * pw * row_len;
    GRID_STRIDE(i, n) {
        const u64 pidx = i / row_len;
        const u32 col = (u32)(i % row_len);
        if (col >= cols) {
            out[i] = 0;  // the padding: zero, so it adds nothing to the GEMM's sums
            continue;
        }
        const u32 ch = col / plen, ky = (col / patch) % patch, kx = col % patch;
        const u32 pr = (u32)(pidx / pw), pc = (u32)(pidx % pw);
        const float x = image[((u64)ch * height + pr * patch + ky) * width + pc * patch + kx];
        // ImageNet statistics (src/model/spec.rs), the same f32 division as the CPU code.
        constexpr float mean[3] = SPEC_IMAGENET_MEAN;
        constexpr float stdev[3] = SPEC_IMAGENET_STD;
        out[i] = f32_to_bf16((x - pick3(mean, ch)) / pick3(stdev, ch));
    }
}

// DINO token sequence [1 + 4 + Np][C] f32: [cls + pos[0], 4 registers (no position),
// patch_i + pos[1 + i]] (the register count: SPEC_DINO_REGISTERS).

extern "C" __global__ void dino_assemble(const u16* __restrict__ patch_emb, const float* __restrict__ cls,
                                         const float* __restrict__ registers, const float* __restrict__ pos,
                                         float* __restrict__ out, u32 np, u32 c) {
    const u64 n = (u64)(SPEC_DINO_PREFIX_TOKENS + np) * c;
    GRID_STRIDE(i, n) {
        const u64 row = i / c;
        const u32 ch = (u32)(i % c);
        float y;
        if (row == 0) {
            y = cls[ch] + pos[ch];
        } else if (row <= SPEC_DINO_REGISTERS) {
            y = registers[(row - 1) * c + ch];
        } else {
            const u64 t = row - SPEC_DINO_PREFIX_TOKENS;
            y = bf16_to_f32(patch_emb[t * c + ch]) + pos[(1 + t) * c + ch];
        }
        out[i] = y;
    }
}

// ---------------------------------------------------------------------------------------------
// Copies.

// dst[r * dst_stride + c] = src[r * src_stride + c] for c < cols (strides in elements).
extern "C" __global__ void copy_rows_f32(const float* __restrict__ src, u64 src_stride, float* __restrict__ dst,
                                         u64 dst_stride, u32 cols, u64 n) {
    GRID_STRIDE(i, n) {
        const u64 r = i / cols, c = i % cols;
        dst[r * dst_stride + c] = src[r * src_stride + c];
    }
}

extern "C" __global__ void f32_to_bf16_kernel(const float* __restrict__ src, u16* __restrict__ dst, u64 n) {
    GRID_STRIDE(i, n) { dst[i] = f32_to_bf16(src[i]); }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm of 1024-wide rows (every transformer block of the model): LN1K_WARPS_PER_ROW warps
// per row, each lane holding LN1K_CHUNKS float4 of it; reductions by shuffles within a warp, then
// over the row's warps through shared memory (a named barrier per row). A frame is only about a
// thousand rows: with one warp per row an SM had seven or eight warps, each one long chain of
// dependent instructions, and the kernel waited on latency (Nsight Compute: 12 % achieved
// occupancy, 14 cycles per issued instruction). The 256-thread kernel above spends most of its
// time in its two CTA-wide reductions at this width.
#define LN1K_COLS 1024
#define LN1K_ROWS_PER_CTA 4
#define LN1K_WARPS_PER_ROW 4
#define LN1K_CHUNKS (LN1K_COLS / 128 / LN1K_WARPS_PER_ROW)
static_assert(LN1K_CHUNKS * 128 * LN1K_WARPS_PER_ROW == LN1K_COLS, "whole float4 per lane");

// This thread's place in the CTA: the row, the warp's part of it, the lane.
struct Ln1kSlot {
    u32 row_in_cta, part, lane;
};
__device__ __forceinline__ Ln1kSlot ln1k_slot() {
    const u32 warp = threadIdx.x >> 5;
    return Ln1kSlot{warp / LN1K_WARPS_PER_ROW, warp % LN1K_WARPS_PER_ROW, threadIdx.x & 31};
}
// Column of the lane's float4 k: 4 * (lane + 32 * (part * LN1K_CHUNKS + k)).
__device__ __forceinline__ u32 ln1k_chunk(const Ln1kSlot& t, int k) {
    return t.lane + 32 * (t.part * LN1K_CHUNKS + k);
}

// The row's total of every lane's `v`: a shuffle tree in each warp, then the warps' sums added
// in part order (the same order for every row, so results do not depend on timing).
__device__ __forceinline__ float ln1k_row_total(float v, const Ln1kSlot& t, float (*red)[LN1K_WARPS_PER_ROW]) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (LN1K_WARPS_PER_ROW == 1) return v;
    if (t.lane == 0) red[t.row_in_cta][t.part] = v;
    named_sync(1 + t.row_in_cta, 32 * LN1K_WARPS_PER_ROW);  // the row's warps only
    float total = red[t.row_in_cta][0];
#pragma unroll
    for (int p = 1; p < LN1K_WARPS_PER_ROW; ++p) total += red[t.row_in_cta][p];
    return total;
}

// The two-pass statistics of the row and the affine normalisation of this lane's values,
// written as bf16 or f32 to `out_row`. Shared by the plain and the residual-fused kernels so both
// round exactly alike.
__device__ __forceinline__ void ln1k_normalize_row(const float4 (&v)[LN1K_CHUNKS], const Ln1kSlot& t,
                                                   const float* __restrict__ weight,
                                                   const float* __restrict__ bias, float eps,
                                                   void* out_row, bool out_bf16) {
    __shared__ float red_sum[LN1K_ROWS_PER_CTA][LN1K_WARPS_PER_ROW];
    __shared__ float red_sq[LN1K_ROWS_PER_CTA][LN1K_WARPS_PER_ROW];
    // The affine parameters are loaded before the reductions, not after: their barriers are
    // memory clobbers the compiler will not move loads across, so loaded at their use they
    // cost one more trip to L2 at the end of every launch.
    float4 wv[LN1K_CHUNKS], bv[LN1K_CHUNKS];
#pragma unroll
    for (int k = 0; k < LN1K_CHUNKS; ++k) {
        const u32 c0 = 4 * ln1k_chunk(t, k);
        wv[k] = weight ? __ldg((const float4*)(weight + c0)) : make_float4(1.f, 1.f, 1.f, 1.f);
        bv[k] = bias ? __ldg((const float4*)(bias + c0)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < LN1K_CHUNKS; ++k) sum += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    const float mean = ln1k_row_total(sum, t, red_sum) / (float)LN1K_COLS;
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < LN1K_CHUNKS; ++k) {
        const float a = v[k].x - mean, b = v[k].y - mean, c = v[k].z - mean, d = v[k].w - mean;
        sq += (a * a + b * b) + (c * c + d * d);
    }
    const float inv = 1.f / sqrtf(ln1k_row_total(sq, t, red_sq) / (float)LN1K_COLS + eps);
#pragma unroll
    for (int k = 0; k < LN1K_CHUNKS; ++k) {
        const u32 c0 = 4 * ln1k_chunk(t, k);
        float y[4] = {(v[k].x - mean) * inv, (v[k].y - mean) * inv, (v[k].z - mean) * inv,
                      (v[k].w - mean) * inv};
        if (weight) {
            const float4 w = wv[k];
            y[0] *= w.x; y[1] *= w.y; y[2] *= w.z; y[3] *= w.w;
        }
        if (bias) {
            const float4 bb = bv[k];
            y[0] += bb.x; y[1] += bb.y; y[2] += bb.z; y[3] += bb.w;
        }
        if (out_bf16) {
            uint2 packed;
            packed.x = (u32)f32_to_bf16(y[0]) | ((u32)f32_to_bf16(y[1]) << 16);
            packed.y = (u32)f32_to_bf16(y[2]) | ((u32)f32_to_bf16(y[3]) << 16);
            *(uint2*)((u16*)out_row + c0) = packed;
        } else {
            *(float4*)((float*)out_row + c0) = make_float4(y[0], y[1], y[2], y[3]);
        }
    }
}

// Threads per CTA of both 1024-wide kernels (the host's warp_per_row_cfg).
#define LN1K_THREADS (32 * LN1K_WARPS_PER_ROW * LN1K_ROWS_PER_CTA)

extern "C" __global__ void __launch_bounds__(LN1K_THREADS)
layer_norm_rows_1024(const float* __restrict__ x, u32 rows, const float* __restrict__ weight,
                     const float* __restrict__ bias, float eps, void* out, u32 out_bf16) {
    const Ln1kSlot t = ln1k_slot();
    const u64 row = (u64)blockIdx.x * LN1K_ROWS_PER_CTA + t.row_in_cta;
    if (row >= rows) return;  // the row's warps leave together: its barrier is theirs alone
    const float4* xr = (const float4*)(x + row * LN1K_COLS);
    float4 v[LN1K_CHUNKS];
#pragma unroll
    for (int k = 0; k < LN1K_CHUNKS; ++k) v[k] = xr[ln1k_chunk(t, k)];
    void* out_row = out_bf16 ? (void*)((u16*)out + row * LN1K_COLS)
                             : (void*)((float*)out + row * LN1K_COLS);
    ln1k_normalize_row(v, t, weight, bias, eps, out_row, out_bf16 != 0);
}

// ---------------------------------------------------------------------------------------------
// LayerScale residual fused with the LayerNorm that always follows it (a block's second norm, or
// the next block's first): x[r] += gamma * y[r], then out[r] = LN(x[r]) in bf16. The row layout
// of layer_norm_rows_1024; the updated values stay in registers for the statistics, so x is read
// once instead of twice and one launch disappears. Same arithmetic, in the same order, as
// residual_add_scaled_x4 followed by layer_norm_rows_1024 (bit-identical results). The _copy
// entry also writes the updated rows to copy[row * copy_stride ..] (16-byte aligned rows): the
// depth head's taps, which were a copy kernel of their own after the block. It is a separate
// entry because a run-time test of the copy in this kernel made every launch 0.3-0.4 us slower
// (H200, 4.54 -> 4.92 us), with or without a copy.
template <bool COPY>
__device__ __forceinline__ void residual_layer_norm_body(float* __restrict__ x, const u16* __restrict__ y,
                                                         const float* __restrict__ gamma, u32 rows,
                                                         const float* __restrict__ weight,
                                                         const float* __restrict__ bias, float eps,
                                                         u16* __restrict__ out, float* __restrict__ copy,
                                                         u64 copy_stride) {
    const Ln1kSlot t = ln1k_slot();
    const u64 row = (u64)blockIdx.x * LN1K_ROWS_PER_CTA + t.row_in_cta;
    if (row >= rows) return;  // the row's warps leave together: its barrier is theirs alone
    float4* xr = (float4*)(x + row * LN1K_COLS);
    const uint2* yr = (const uint2*)(y + row * LN1K_COLS);
    const float4* g4 = (const float4*)gamma;
    float4 v[LN1K_CHUNKS];
#pragma unroll
    for (int k = 0; k < LN1K_CHUNKS; ++k) {
        const u32 j = ln1k_chunk(t, k);
        v[k] = xr[j];
        const uint2 w = yr[j];
        const float4 g = g4[j];
        v[k].x += g.x * lo_f32(w.x);
        v[k].y += g.y * hi_f32(w.x);
        v[k].z += g.z * lo_f32(w.y);
        v[k].w += g.w * hi_f32(w.y);
        xr[j] = v[k];
        if constexpr (COPY) ((float4*)(copy + row * copy_stride))[j] = v[k];
    }
    ln1k_normalize_row(v, t, weight, bias, eps, out + row * LN1K_COLS, true);
}

extern "C" __global__ void __launch_bounds__(LN1K_THREADS)
residual_layer_norm_1024(float* __restrict__ x, const u16* __restrict__ y,
                         const float* __restrict__ gamma, u32 rows,
                         const float* __restrict__ weight, const float* __restrict__ bias,
                         float eps, u16* __restrict__ out) {
    residual_layer_norm_body<false>(x, y, gamma, rows, weight, bias, eps, out, nullptr, 0);
}

extern "C" __global__ void __launch_bounds__(LN1K_THREADS)
residual_layer_norm_copy_1024(float* __restrict__ x, const u16* __restrict__ y,
                              const float* __restrict__ gamma, u32 rows,
                              const float* __restrict__ weight, const float* __restrict__ bias,
                              float eps, u16* __restrict__ out, float* __restrict__ copy,
                              u64 copy_stride) {
    residual_layer_norm_body<true>(x, y, gamma, rows, weight, bias, eps, out, copy, copy_stride);
}
