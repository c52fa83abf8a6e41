// The model's input preprocessing on the device: a decoded 8-bit RGB frame of any size is
// resized to the session's width with the antialiased bicubic filter, centre-cropped, and written
// as the model's [3][H][W] input in [0, 1].
//
// It computes exactly what the host's `preprocess_rgb8` computes: the same f64 weights (made on
// the host and uploaded), the same order of summation, products and sums rounded separately
// (__dmul_rn / __dadd_rn stop nvcc from contracting them into FMAs the host never does), and the
// same rounding to 8-bit levels after each pass, as PIL does for 8-bit images. So the GPU input
// is bit-identical to the CPU path's, not merely close.

#include "common.cuh"

// One 1-D resampling tap set per output index: the first input index, the number of taps and
// `taps_per_output` weights (only the first `count` are read).
struct AxisTaps {
    const int* start;
    const int* count;
    const double* weight;
    u32 stride;
};

__device__ __forceinline__ double resample(const AxisTaps& t, u32 o, const u8* src, u32 step) {
    const int first = t.start[o];
    const int n = t.count[o];
    const double* w = t.weight + (u64)o * t.stride;
    double sum = 0.0;
    for (int j = 0; j < n; ++j) sum = __dadd_rn(sum, __dmul_rn(w[j], (double)src[(u64)(first + j) * step]));
    return sum;
}

// round() (halves away from zero, as the host's f64::round), clamped to 8 bits.
__device__ __forceinline__ u8 to_level(double v) {
    double r = round(v);
    r = fmin(fmax(r, 0.0), 255.0);
    return (u8)r;
}

// Width pass over source rows row0 .. row0 + rows: src [src_h][src_w][3] → tmp [rows][out_w][3].
extern "C" __global__ void preprocess_resize_rows(const u8* __restrict__ src, u32 src_w, u32 row0, u32 rows,
                                                  u32 out_w, const int* __restrict__ start,
                                                  const int* __restrict__ count,
                                                  const double* __restrict__ weight, u32 taps_per_output,
                                                  u8* __restrict__ tmp) {
    const AxisTaps taps{start, count, weight, taps_per_output};
    const u32 total = rows * out_w;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 r = i / out_w, o = i % out_w;
        const u8* row = src + (u64)(row0 + r) * src_w * 3;
#pragma unroll
        for (u32 c = 0; c < 3; ++c) tmp[(u64)i * 3 + c] = to_level(resample(taps, o, row + c, 3));
    }
}

// Height pass for the kept rows top .. top + out_h of the resized image: tmp (source rows from
// row0) → image [3][out_h][out_w] in [0, 1].
extern "C" __global__ void preprocess_resize_cols(const u8* __restrict__ tmp, u32 row0, u32 top, u32 out_h,
                                                  u32 out_w, const int* __restrict__ start,
                                                  const int* __restrict__ count,
                                                  const double* __restrict__ weight, u32 taps_per_output,
                                                  float* __restrict__ image) {
    const AxisTaps taps{start, count, weight, taps_per_output};
    const u32 plane = out_h * out_w;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < plane; i += gridDim.x * blockDim.x) {
        const u32 y = i / out_w, x = i % out_w;
        // Tap indices are source rows; tmp starts at row0.
        const u8* column = tmp - (u64)row0 * out_w * 3 + (u64)x * 3;
#pragma unroll
        for (u32 c = 0; c < 3; ++c) {
            const u8 level = to_level(resample(taps, top + y, column + c, out_w * 3));
            image[(u64)c * plane + i] = (float)level / 255.f;
        }
    }
}
