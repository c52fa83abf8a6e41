// Helpers every kernel file shares, written once; included as "common.cuh" (nvcc: -I kernels;
// NVRTC: handed to the compiler by src/backend/cuda/nvrtc.rs). No CUDA headers are included, so
// NVRTC needs no include path. spec.cuh is generated from src/model/spec.rs (build.rs writes it
// for nvcc, nvrtc.rs renders it for NVRTC): the constants the CPU model and the GPU agree on.
#pragma once

#include "spec.cuh"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xffffffffu
// No <math.h> under NVRTC: spell negative infinity out.
#define NEG_INF __int_as_float(0xff800000u)
// The head width every attention and K/V kernel is written for.
#define HEAD_DIM SPEC_HEAD_DIM

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` of the CTA, a multiple of 32, meet
// at barrier `id`; arrive counts towards it without waiting.
__device__ __forceinline__ void named_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(u32 id, u32 threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float bf16_to_f32(u16 v) { return __uint_as_float(((u32)v) << 16); }

// Eight bf16 in one 16-byte word (element 0 in the low half of .x) as f32, in order.
__device__ __forceinline__ void bf16x8_to_f32(uint4 v, float* f) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Two f32 as packed bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x on the special-function unit (flushes denormals; the softmax runs in the log2 domain).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Exact GELU, x/2 (1 + erf(x / sqrt 2)), as PyTorch's default (not the tanh form).
__device__ __forceinline__ float gelu_erf(float x) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ float warp_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 16);
    v += __shfl_xor_sync(FULL_MASK, v, 8);
    v += __shfl_xor_sync(FULL_MASK, v, 4);
    v += __shfl_xor_sync(FULL_MASK, v, 2);
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v;
}

// Sum over the whole CTA (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 floats of shared memory; the leading barrier makes it reusable back
// to back.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.f;
    return warp_sum(t);
}

// block_sum as camera_head.cu has always had it: the warp count rounded up (a partial last warp
// counts) and left to the compiler to inline. The same sum for every block size the host launches
// (multiples of 32), but different machine code, so cam_token_norm keeps it.
__device__ float block_sum_ceil_warps(float v, float* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? red[lane] : 0.f;
    return warp_sum(t);
}

// Paged keys: the visible page holding logical key `t`, i.e. the largest p with cum[p] <= t
// (read paged_attention.cu's header for the page table).
__device__ __forceinline__ u32 find_page(const u32* __restrict__ cum, u32 n_pages, u32 t) {
    u32 lo = 0, hi = n_pages;  // invariant: cum[lo] <= t < cum[hi]
    while (hi - lo > 1) {
        u32 mid = (lo + hi) >> 1;
        if (__ldg(cum + mid) <= t) lo = mid; else hi = mid;
    }
    return lo;
}

// 16-byte chunks per row of HEAD_DIM bf16, and the 128-byte swizzle of the attention kernels'
// shared-memory tiles: chunk `c` of row `r` sits at c ^ (r & 7), so ldmatrix (8 rows at one chunk
// column) avoids bank conflicts and wgmma's 128B-swizzle descriptors read the same layout.
#define ROW_CHUNKS (HEAD_DIM * 2 / 16)
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 swz(u32 r, u32 c) { return r * ROW_CHUNKS + (c ^ (r & 7)); }
