// Small helpers for benchmarks and tests.

#include "common.cuh"

// A counter-based hash (splitmix64 finaliser): element i of stream `seed` is the same on every
// run and every GPU, so the host can regenerate any element for a reference check.
__device__ __forceinline__ u64 mix64(u64 x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// dst[i] = bf16(uniform in [-scale, scale)), rounded to nearest even.
extern "C" __global__ void fill_random_bf16(u16* __restrict__ dst, u64 n, u64 seed, float scale) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 r = mix64(seed * 0x100000001b3ull + i);
        float u = (float)(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        float x = (2.f * u - 1.f) * scale;
        u32 bits = __float_as_uint(x);
        bits += 0x7fffu + ((bits >> 16) & 1u);
        dst[i] = (u16)(bits >> 16);
    }
}
