// Small kernels of the GPU model's frame step that belong to no block or head.

#include "common.cuh"

// The model input image [3][H][W] in [0, 1] as interleaved 8-bit RGB [H][W][3] (the colours of
// the frame's points), rounded to nearest like the host's preprocessing.
extern "C" __global__ void image_to_rgb8(const float* __restrict__ image, u8* __restrict__ rgb, u32 plane) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < plane; i += gridDim.x * blockDim.x) {
#pragma unroll
        for (u32 c = 0; c < 3; ++c) {
            float v = image[c * plane + i] * 255.f;
            v = fminf(fmaxf(v, 0.f), 255.f);
            rgb[3 * i + c] = (u8)__float2int_rn(v);
        }
    }
}
