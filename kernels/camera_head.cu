// The camera head on the GPU: the small kernels around its GEMMs (which go through cuBLASLt).
//
// The head sees one token per frame, so every row kernel here is one CTA per row (frame) and the
// elementwise ones are grid-stride loops: m is 1 in streaming and at most a handful in phase 1.
// Layouts (token-major, row-major):
//   f32 activations [frames][width]; bf16 GEMM operands [frames][width] stored as u16;
//   qkv (bf16) [frames][3 * width] = q | k | v, each [heads][head_dim];
//   camera cache (bf16), one (iteration, layer) plane: [capacity][width] for K and for V.
// The number of cached frames is read from device memory (the step is captured in a CUDA graph,
// so it must not be a launch-time scalar).
//
// No CUDA headers are included so that NVRTC compiles this file with no include path.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
// No <math.h> under NVRTC: spell negative infinity out.
#define NEG_INF __int_as_float(0xff800000u)
#define POSE_LEN 9
// Threads of the attention kernel; its combine across warps needs head_dim <= ATT_THREADS.
#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)

__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float(((u32)v) << 16); }

// Round to nearest even; NaN stays NaN (the rounding add could carry it into infinity).
__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fc0u;
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (u16)(bits >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

// Sum over the CTA, returned to every thread. `red` is 32 floats of shared memory; the leading
// barrier lets consecutive calls reuse it. The barriers also make the CTA's earlier global writes
// visible to all its threads.
__device__ float block_sum(float v, float* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? red[lane] : 0.f;
    return warp_sum(t);
}

// Mean and 1/sqrt(var + eps) of a row of n floats, in two passes (mean, then the squared
// deviations), as the CPU reference does (it uses f64; two passes keep f32 close to it).
__device__ void row_stats(const float* x, u32 n, float eps, float* red, float& mean, float& inv) {
    float s = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    mean = block_sum(s, red) / (float)n;
    float q = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        float d = x[i] - mean;
        q += d * d;
    }
    inv = rsqrtf(block_sum(q, red) / (float)n + eps);
}

__device__ __forceinline__ float gelu_exact(float x) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// ---------------------------------------------------------------------------------------------
// x = token_norm(token) (LN, affine, eps_token) and xn = LN(x) without affine (eps_adaptive):
// the trunk's base and the adaptive modulation's normalised input, computed once per call.
// grid = frames; token r starts at tokens + r * token_stride.
extern "C" __global__ void cam_token_norm(const float* __restrict__ tokens, u64 token_stride,
                                          const float* __restrict__ w, const float* __restrict__ b,
                                          float eps_token, float eps_adaptive, float* x, float* xn,
                                          u32 width) {
    __shared__ float red[32];
    const u32 r = blockIdx.x;
    const float* in = tokens + (u64)r * token_stride;
    float* xr = x + (u64)r * width;
    float* xnr = xn + (u64)r * width;
    float mean, inv;
    row_stats(in, width, eps_token, red, mean, inv);
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        float y = (in[i] - mean) * inv;
        if (w) y *= w[i];
        if (b) y += b[i];
        xr[i] = y;
    }
    // row_stats' barriers order these writes before the reads below.
    row_stats(xr, width, eps_adaptive, red, mean, inv);
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) xnr[i] = (xr[i] - mean) * inv;
}

// out[r][o] = bf16(SiLU(b[o] + sum_k w[o][k] * pose[r][k])), k < 9. pose_stride 0 broadcasts one
// pose (the learned empty pose of iteration 0) to every frame.
extern "C" __global__ void cam_embed_pose_silu(const float* __restrict__ pose, u32 pose_stride,
                                               const float* __restrict__ w,
                                               const float* __restrict__ b, u16* __restrict__ out,
                                               u32 width, u32 frames) {
    const u64 n = (u64)frames * width;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (u64)gridDim.x * blockDim.x) {
        const u32 r = (u32)(idx / width), o = (u32)(idx % width);
        const float* p = pose + (u64)r * pose_stride;
        float acc = b ? b[o] : 0.f;
        for (int k = 0; k < POSE_LEN; ++k) acc += w[o * POSE_LEN + k] * p[k];
        out[idx] = f32_to_bf16(silu(acc));
    }
}

// h = gate * (xn * (1 + scale) + shift) + x, with mods[r] = [shift | scale | gate] (3 * width).
extern "C" __global__ void cam_modulate(const float* __restrict__ x, const float* __restrict__ xn,
                                        const float* __restrict__ mods, float* __restrict__ h,
                                        u32 width, u32 frames) {
    const u64 n = (u64)frames * width;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (u64)gridDim.x * blockDim.x) {
        const u64 r = idx / width, i = idx % width;
        const float* m = mods + r * 3 * width;
        const float shift = m[i], scale = m[width + i], gate = m[2 * width + i];
        h[idx] = gate * (xn[idx] * (1.f + scale) + shift) + x[idx];
    }
}

// Residual then LayerNorm, one CTA per row: when y is given, h += gamma * y (gamma null: 1);
// then out = bf16(LN(h) * w + b) (w, b may be null). grid = frames.
extern "C" __global__ void cam_residual_ln(float* h, const float* __restrict__ y,
                                           const float* __restrict__ gamma,
                                           const float* __restrict__ w,
                                           const float* __restrict__ b, float eps,
                                           u16* __restrict__ out, u32 width) {
    __shared__ float red[32];
    const u64 base = (u64)blockIdx.x * width;
    float* hr = h + base;
    if (y) {
        for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
            const float g = gamma ? gamma[i] : 1.f;
            hr[i] += g * y[base + i];
        }
    }
    float mean, inv;
    row_stats(hr, width, eps, red, mean, inv);
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        float v = (hr[i] - mean) * inv;
        if (w) v *= w[i];
        if (b) v += b[i];
        out[base + i] = f32_to_bf16(v);
    }
}

// h += gamma * y (LayerScale residual) without a norm after it.
extern "C" __global__ void cam_residual(float* __restrict__ h, const float* __restrict__ y,
                                        const float* __restrict__ gamma, u32 width, u32 frames) {
    const u64 n = (u64)frames * width;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (u64)gridDim.x * blockDim.x) {
        const float g = gamma ? gamma[idx % width] : 1.f;
        h[idx] += g * y[idx];
    }
}

// Exact (erf) GELU in place over n bf16 values (cuBLASLt's fused GELU is the tanh form).
extern "C" __global__ void cam_gelu_bf16(u16* __restrict__ x, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x)
        x[i] = f32_to_bf16(gelu_exact(bf16_to_f32(x[i])));
}

// The pose branch's last layer and the pose accumulation, one CTA of 9 warps per frame, warp o
// computing output o: delta = b[o] + sum_k GELU(hidden[r][k]) * w[o][k] (hidden is fc1's output
// before its activation); raw = delta on the first iteration, else raw + delta; pose_out = raw
// with ReLU on the field of view (outputs 7 and 8).
extern "C" __global__ void cam_pose_branch_out(const u16* __restrict__ hidden,
                                               const float* __restrict__ w,
                                               const float* __restrict__ b, float* raw,
                                               float* __restrict__ pose_out, u32 k_dim,
                                               u32 first) {
    const u32 r = blockIdx.x;
    const u32 o = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (o >= POSE_LEN) return;  // whole warps only: the shuffles below stay convergent
    const u16* hr = hidden + (u64)r * k_dim;
    const float* wr = w + (u64)o * k_dim;
    float acc = 0.f;
    for (u32 k = lane; k < k_dim; k += 32) acc += gelu_exact(bf16_to_f32(hr[k])) * wr[k];
    acc = warp_sum(acc);
    if (lane == 0) {
        const float delta = acc + (b ? b[o] : 0.f);
        const u64 at = (u64)r * POSE_LEN + o;
        const float sum = first ? delta : raw[at] + delta;
        raw[at] = sum;
        pose_out[at] = o >= 7 ? fmaxf(sum, 0.f) : sum;
    }
}

// Appends this call's K and V (from qkv) to one (iteration, layer) plane of the camera cache, at
// slots cache_len .. cache_len + frames; slots at or past the capacity are dropped (the host
// guarantees they never occur).
extern "C" __global__ void cam_cache_append(const u16* __restrict__ qkv, u16* __restrict__ cache_k,
                                            u16* __restrict__ cache_v,
                                            const u32* __restrict__ cache_len, u32 capacity,
                                            u32 width, u32 frames) {
    const u32 len = *cache_len;
    const u64 n = (u64)frames * width;
    for (u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (u64)gridDim.x * blockDim.x) {
        const u64 r = idx / width, i = idx % width;
        const u64 slot = (u64)len + r;
        if (slot >= capacity) continue;
        const u16* row = qkv + r * 3 * width;
        cache_k[slot * width + i] = row[width + i];
        cache_v[slot * width + i] = row[2 * width + i];
    }
}

// ---------------------------------------------------------------------------------------------
// Attention of the frames' queries over cache[0 .. cache_len) followed by the current frames'
// keys (N = cache_len + frames keys, no mask), split over `splits` CTAs per (query, head):
// split s takes keys [s * chunk, min(N, (s + 1) * chunk)), chunk = ceil(N / splits), computed on
// the device since N is. Each writes its normalised partial output and its log2-sum-exp;
// cam_attention_combine merges them.
//
// Inside a CTA (4 warps) a key is handled by a group of head_dim / 8 lanes, each lane owning 8
// dimensions (one 16-byte load of K and one of V), so a warp takes 32 / (head_dim / 8) keys at a
// time, every group running its own online softmax; groups then warps are merged at the end.
// Scores are in the log2 domain: scale_log2 = log2(e) / sqrt(head_dim).
// grid = (splits, heads, frames), block = ATT_THREADS; head_dim is 8..128, a power of two.

struct alignas(16) Chunk8 {
    u32 w[4];
};

__device__ __forceinline__ void unpack8(const Chunk8& c, float* f) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(c.w[i] << 16);
        f[2 * i + 1] = __uint_as_float(c.w[i] & 0xffff0000u);
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    cam_attention_partial(const u16* __restrict__ qkv, const u16* __restrict__ cache_k,
                          const u16* __restrict__ cache_v, const u32* __restrict__ cache_len_ptr,
                          u32 capacity, u32 frames, u32 width, u32 head_dim, u32 splits,
                          float scale_log2, float* __restrict__ part_o,
                          float* __restrict__ part_lse) {
    __shared__ float sm_m[ATT_WARPS];
    __shared__ float sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][128];

    const u32 split = blockIdx.x, head = blockIdx.y, r = blockIdx.z;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 lanes_per_key = head_dim >> 3;
    const u32 keys_per_warp = 32 / lanes_per_key;
    const u32 group = lane / lanes_per_key, part = lane % lanes_per_key;
    const u32 keys_per_round = ATT_WARPS * keys_per_warp;

    const u32 cached = min(*cache_len_ptr, capacity);
    const u32 n_keys = cached + frames;
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
                const u16* row = qkv + (u64)(t - cached) * qkv_row;
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
}

// out[r][head * head_dim + d] = bf16(sum_s 2^(lse_s - max) o_s[d] / sum_s 2^(lse_s - max)).
// grid = (heads, frames), block = head_dim. Empty splits carry lse = -inf and weigh nothing; at
// least one split is never empty (the current frames' keys are always there).
extern "C" __global__ void cam_attention_combine(const float* __restrict__ part_o,
                                                 const float* __restrict__ part_lse,
                                                 u16* __restrict__ out, u32 width, u32 head_dim,
                                                 u32 splits) {
    const u32 head = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
    if (d >= head_dim) return;
    const u64 first = ((u64)r * gridDim.x + head) * splits;
    float mx = NEG_INF;
    for (u32 s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[first + s]);
    float sum_w = 0.f, sum_o = 0.f;
    for (u32 s = 0; s < splits; ++s) {
        const float lse = part_lse[first + s];
        if (lse == NEG_INF) continue;
        const float f = exp2f(lse - mx);
        sum_w += f;
        sum_o += f * part_o[(first + s) * head_dim + d];
    }
    out[(u64)r * width + head * head_dim + d] = f32_to_bf16(sum_w > 0.f ? sum_o / sum_w : 0.f);
}
