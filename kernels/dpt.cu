// The DPT depth head and the point unprojection on the GPU (src/backend/cuda/conv.rs,
// src/gpu_model/{dpt_head,unproject}.rs). Feature maps are NHWC bf16 (u16 storage), one frame at
// a time; math in f32. Convolutions are im2col + a cuBLASLt GEMM on the host side: these kernels
// are the glue around the GEMMs. Every kernel that moves 8-channel vectors (uint4) needs the
// channel count to be a multiple of 8 (the host checks) and 16-byte aligned buffers.
//
// The semantics are those of the CPU model: src/model/dpt_head.rs, src/model/ops/{conv,resize}.rs,
// src/model/pose.rs and src/pipeline/frame.rs::filter_points.

#include "common.cuh"

// Round to nearest even; NaN stays NaN (quieted, sign and payload kept: camera_head.cu and
// transformer.cu round NaN differently, each keeps its own).
__device__ __forceinline__ u16 f2bf(float x) {
    u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (u16)(bits >> 16);
}

// Eight bf16 (one uint4, element 0 in the low half of .x) to f32 and back.
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    f[0] = __uint_as_float(v.x << 16);
    f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16);
    f[3] = __uint_as_float(v.y & 0xffff0000u);
    f[4] = __uint_as_float(v.z << 16);
    f[5] = __uint_as_float(v.z & 0xffff0000u);
    f[6] = __uint_as_float(v.w << 16);
    f[7] = __uint_as_float(v.w & 0xffff0000u);
}

__device__ __forceinline__ uint4 pack8(const float* f) {
    uint4 v;
    v.x = (u32)f2bf(f[0]) | ((u32)f2bf(f[1]) << 16);
    v.y = (u32)f2bf(f[2]) | ((u32)f2bf(f[3]) << 16);
    v.z = (u32)f2bf(f[4]) | ((u32)f2bf(f[5]) << 16);
    v.w = (u32)f2bf(f[6]) | ((u32)f2bf(f[7]) << 16);
    return v;
}

// ReLU of two packed bf16: a set sign bit (negative, -0, or negative NaN) becomes +0.
__device__ __forceinline__ u32 relu2(u32 v) {
    const u32 lo = (v & 0x00008000u) ? 0u : (v & 0x0000ffffu);
    const u32 hi = (v & 0x80000000u) ? 0u : (v & 0xffff0000u);
    return lo | hi;
}

__device__ __forceinline__ uint4 relu8(uint4 v) {
    v.x = relu2(v.x);
    v.y = relu2(v.y);
    v.z = relu2(v.z);
    v.w = relu2(v.w);
    return v;
}

// Inclusive prefix sum over the block in thread order (blockDim.x a multiple of 32, at most
// 1024); `total` gets the block's sum. `warp_tot` holds 32 u32 of shared memory.
__device__ __forceinline__ u32 block_scan_incl(u32 v, u32* warp_tot, u32& total) {
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u32 x = v;
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // warp_tot may still be read by a previous call
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    u32 before = 0, all = 0;
    for (u32 k = 0; k < nw; ++k) {
        const u32 t = warp_tot[k];
        if (k < warp) before += t;
        all += t;
    }
    total = all;
    return x + before;
}

// ---------------------------------------------------------------------------------------------
// DPT head glue
// ---------------------------------------------------------------------------------------------

// LayerNorm of rows `first_row ..` of an f32 matrix with row stride `row_stride` (elements), `dim`
// values a row; y[r][:] bf16, dense. One block (a multiple of 32 threads) per output row.
// Two passes over the row (mean, then the centred variance) in f32.
extern "C" __global__ void dpt_layernorm_rows(const float* __restrict__ x, u64 row_stride,
                                              u32 first_row, u32 dim,
                                              const float* __restrict__ weight,
                                              const float* __restrict__ bias, float eps,
                                              u16* __restrict__ y) {
    __shared__ float red[32];
    const float* row = x + (u64)(first_row + blockIdx.x) * row_stride;
    u16* out = y + (u64)blockIdx.x * dim;
    float s = 0.f;
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) s += row[i];
    const float mean = block_sum(s, red) / (float)dim;
    float q = 0.f;
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        const float d = row[i] - mean;
        q += d * d;
    }
    const float var = block_sum(q, red) / (float)dim;
    const float inv = 1.f / sqrtf(var + eps);
    for (u32 i = threadIdx.x; i < dim; i += blockDim.x) {
        out[i] = f2bf((row[i] - mean) * inv * weight[i] + bias[i]);
    }
}

// x[i] = bf16(x[i] + table[i]): the UV positional embedding (already scaled by 0.1 on the host).
extern "C" __global__ void dpt_add_table(u16* __restrict__ x, const float* __restrict__ table,
                                         u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        x[i] = f2bf(bf16_to_f32(x[i]) + table[i]);
    }
}

// im2col for a 3x3 convolution with padding 1 and stride `stride` on x [h][w][cin]: output rows
// row0 .. row0+rows (of a map ow wide) become cols [(r - row0) * ow + ox][ky][kx][cin], zero
// where the window leaves the input. `relu` rectifies the input on the way (ResidualConvUnit).
// One thread moves 8 channels.
extern "C" __global__ void dpt_im2col3x3(const u16* __restrict__ x, u32 h, u32 w, u32 cin,
                                         u32 stride, u32 row0, u32 rows, u32 ow, u32 relu,
                                         u16* __restrict__ cols) {
    const u32 c8 = cin >> 3;
    const u64 total = (u64)rows * ow * 9u * c8;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 cv = (u32)(i % c8);
        const u64 rest = i / c8;
        const u32 tap = (u32)(rest % 9u);
        const u64 pix = rest / 9u;
        const u32 ox = (u32)(pix % ow);
        const u32 oy = row0 + (u32)(pix / ow);
        const int iy = (int)(oy * stride + tap / 3u) - 1;
        const int ix = (int)(ox * stride + tap % 3u) - 1;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w) {
            v = *(const uint4*)(x + ((u64)iy * w + (u64)ix) * cin + cv * 8u);
            if (relu) v = relu8(v);
        }
        *(uint4*)(cols + i * 8u) = v;
    }
}

// The scatter of a ConvTranspose whose stride equals its kernel k: the GEMM left
// y [h*w][ky][kx][cout] (one row per input pixel, bias already added); out [h*k][w*k][cout].
extern "C" __global__ void dpt_pixel_shuffle(const u16* __restrict__ y, u32 h, u32 w, u32 k,
                                             u32 cout, u16* __restrict__ out) {
    const u32 c8 = cout >> 3;
    const u32 ow = w * k;
    const u64 total = (u64)h * k * ow * c8;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 cv = (u32)(i % c8);
        const u64 p = i / c8;
        const u32 ox = (u32)(p % ow);
        const u32 oy = (u32)(p / ow);
        const u32 iy = oy / k, ky = oy % k, ix = ox / k, kx = ox % k;
        const u64 src = ((((u64)iy * w + ix) * k + ky) * k + kx) * cout + cv * 8u;
        *(uint4*)(out + i * 8u) = *(const uint4*)(y + src);
    }
}

// Source taps along one axis for bilinear resizing with align_corners=True, in f32 exactly as
// src/model/ops/resize.rs computes them.
__device__ __forceinline__ void align_corners_axis(u32 o, u32 in, u32 out, u32& i0, u32& i1,
                                                   float& l) {
    const float scale = out > 1 ? ((float)in - 1.f) / ((float)out - 1.f) : 0.f;
    const float src = scale * (float)o;
    u32 a = (u32)floorf(src);
    if (a > in - 1) a = in - 1;
    i0 = a;
    i1 = a + 1 < in ? a + 1 : a;
    l = src - (float)a;
}

// Bilinear resize (align_corners=True) x [ih][iw][c] -> y [oh][ow][c]; when `add` is not null,
// add[oh][ow][c] (f32) is added before rounding (the UV embedding after the last resize).
extern "C" __global__ void dpt_bilinear(const u16* __restrict__ x, u32 ih, u32 iw, u32 c, u32 oh,
                                        u32 ow, const float* __restrict__ add,
                                        u16* __restrict__ y) {
    const u32 c8 = c >> 3;
    const u64 total = (u64)oh * ow * c8;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 cv = (u32)(i % c8);
        const u64 p = i / c8;
        const u32 ox = (u32)(p % ow);
        const u32 oy = (u32)(p / ow);
        u32 y0, y1, x0, x1;
        float ly, lx;
        align_corners_axis(oy, ih, oh, y0, y1, ly);
        align_corners_axis(ox, iw, ow, x0, x1, lx);
        float a[8], b[8], cc[8], d[8], r[8];
        unpack8(*(const uint4*)(x + ((u64)y0 * iw + x0) * c + cv * 8u), a);
        unpack8(*(const uint4*)(x + ((u64)y0 * iw + x1) * c + cv * 8u), b);
        unpack8(*(const uint4*)(x + ((u64)y1 * iw + x0) * c + cv * 8u), cc);
        unpack8(*(const uint4*)(x + ((u64)y1 * iw + x1) * c + cv * 8u), d);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float top = (1.f - lx) * a[j] + lx * b[j];
            const float bot = (1.f - lx) * cc[j] + lx * d[j];
            r[j] = (1.f - ly) * top + ly * bot;
        }
        if (add != nullptr) {
            const float* t = add + i * 8u;
#pragma unroll
            for (int j = 0; j < 8; ++j) r[j] += t[j];
        }
        *(uint4*)(y + i * 8u) = pack8(r);
    }
}

// out = a + (relu_b ? relu(b) : b) (+ c when c is not null), in f32, rounded once; n8 vectors of
// 8. `out` may alias `a`, `b` or `c` (each thread reads its vector before writing it).
extern "C" __global__ void dpt_add(u16* out, const u16* a, const u16* b, const u16* c, u64 n8,
                                   u32 relu_b) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (u64)gridDim.x * blockDim.x) {
        float fa[8], fb[8], fc[8];
        unpack8(*(const uint4*)(a + i * 8u), fa);
        uint4 vb = *(const uint4*)(b + i * 8u);
        if (relu_b) vb = relu8(vb);
        unpack8(vb, fb);
#pragma unroll
        for (int j = 0; j < 8; ++j) fa[j] += fb[j];
        if (c != nullptr) {
            unpack8(*(const uint4*)(c + i * 8u), fc);
#pragma unroll
            for (int j = 0; j < 8; ++j) fa[j] += fc[j];
        }
        *(uint4*)(out + i * 8u) = pack8(fa);
    }
}

// The end of the head: ReLU, the 1x1 conv cin -> 2 (f32 weights [2][cin], bias [2]), then
// depth = exp(ch0) and conf = 1 + exp(ch1) as planar f32 maps. x [n][cin] bf16, one pixel a thread.
extern "C" __global__ void dpt_output_head(const u16* __restrict__ x, u32 n, u32 cin,
                                           const float* __restrict__ weight,
                                           const float* __restrict__ bias,
                                           float* __restrict__ depth, float* __restrict__ conf) {
    const u32 p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    float s0 = bias[0], s1 = bias[1];
    const u16* row = x + (u64)p * cin;
    for (u32 c = 0; c < cin; c += 8) {
        float v[8];
        unpack8(relu8(*(const uint4*)(row + c)), v);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s0 += weight[c + j] * v[j];
            s1 += weight[cin + c + j] * v[j];
        }
    }
    depth[p] = expf(s0);
    conf[p] = 1.f + expf(s1);
}

// ---------------------------------------------------------------------------------------------
// Pose decoding, unprojection and the ordered point compaction
// ---------------------------------------------------------------------------------------------
// The arithmetic uses the _rn intrinsics so nvcc cannot contract it into FMAs: the points then
// round exactly as src/model/pose.rs does (up to tanf), and the kept set and order are the CPU's.

#define FM(a, b) __fmul_rn((a), (b))
#define FA(a, b) __fadd_rn((a), (b))
#define FS(a, b) __fsub_rn((a), (b))
#define FD(a, b) __fdiv_rn((a), (b))

// enc [9] = t(3), q xyzw (4), fov_h, fov_w  ->  cam [16]: [R | t] row-major 3x4 (camera-to-world),
// then fx, fy, cx, cy. One thread.
static_assert(SPEC_POSE_ENC_LEN == 9, "dpt_decode_pose reads the 9-value encoding above");
extern "C" __global__ void dpt_decode_pose(const float* __restrict__ enc, u32 height, u32 width,
                                           float* __restrict__ cam) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const float tx = enc[0], ty = enc[1], tz = enc[2];
    const float i = enc[3], j = enc[4], k = enc[5], r = enc[6];
    const float fov_h = enc[7], fov_w = enc[8];
    const float two_s = FD(2.f, FA(FA(FA(FM(i, i), FM(j, j)), FM(k, k)), FM(r, r)));
    cam[0] = FS(1.f, FM(two_s, FA(FM(j, j), FM(k, k))));
    cam[1] = FM(two_s, FS(FM(i, j), FM(k, r)));
    cam[2] = FM(two_s, FA(FM(i, k), FM(j, r)));
    cam[3] = tx;
    cam[4] = FM(two_s, FA(FM(i, j), FM(k, r)));
    cam[5] = FS(1.f, FM(two_s, FA(FM(i, i), FM(k, k))));
    cam[6] = FM(two_s, FS(FM(j, k), FM(i, r)));
    cam[7] = ty;
    cam[8] = FM(two_s, FS(FM(i, k), FM(j, r)));
    cam[9] = FM(two_s, FA(FM(j, k), FM(i, r)));
    cam[10] = FS(1.f, FM(two_s, FA(FM(i, i), FM(j, j))));
    cam[11] = tz;
    const float h = (float)height, w = (float)width;
    cam[12] = FD(FD(w, 2.f), tanf(FD(fov_w, 2.f)));
    cam[13] = FD(FD(h, 2.f), tanf(FD(fov_h, 2.f)));
    cam[14] = FD(w, 2.f);
    cam[15] = FD(h, 2.f);
}

__device__ __forceinline__ bool finite_f32(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

// World point of pixel p (u = column, v = row, no half-pixel offset) and whether it is kept
// before striding: conf > min_conf (NaN fails) and all three coordinates finite.
__device__ __forceinline__ bool point_at(u32 p, u32 width, const float* __restrict__ cam,
                                         const float* __restrict__ depth,
                                         const float* __restrict__ conf, float min_conf,
                                         float* xyz) {
    const float d = depth[p];
    const float u = (float)(p % width), v = (float)(p / width);
    const float pc0 = FD(FM(FS(u, cam[14]), d), cam[12]);
    const float pc1 = FD(FM(FS(v, cam[15]), d), cam[13]);
    const float pc2 = d;
#pragma unroll
    for (int row = 0; row < 3; ++row) {
        const float* m = cam + 4 * row;
        xyz[row] = FA(FA(FA(FM(m[0], pc0), FM(m[1], pc1)), FM(m[2], pc2)), m[3]);
    }
    return conf[p] > min_conf && finite_f32(xyz[0]) && finite_f32(xyz[1]) && finite_f32(xyz[2]);
}

// A tile of PTS_TILE consecutive pixels per block: PTS_THREADS threads x PTS_PER_THREAD
// consecutive pixels, so thread order is pixel order.
#define PTS_THREADS 256
#define PTS_PER_THREAD 4
#define PTS_TILE (PTS_THREADS * PTS_PER_THREAD)

// Pass 1: how many pixels of each tile pass the filter.
extern "C" __global__ void dpt_points_count(const float* __restrict__ depth,
                                            const float* __restrict__ conf,
                                            const float* __restrict__ cam, u32 n, u32 width,
                                            float min_conf, u32* __restrict__ tile_counts) {
    __shared__ u32 warp_tot[32];
    const u32 base = blockIdx.x * PTS_TILE + threadIdx.x * PTS_PER_THREAD;
    u32 cnt = 0;
    for (u32 j = 0; j < PTS_PER_THREAD; ++j) {
        const u32 p = base + j;
        float xyz[3];
        if (p < n && point_at(p, width, cam, depth, conf, min_conf, xyz)) ++cnt;
    }
    u32 total;
    block_scan_incl(cnt, warp_tot, total);
    if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

// Pass 2 (one block): tile counts -> exclusive offsets in place; out_count = kept points after
// striding = ceil(passed / stride).
extern "C" __global__ void dpt_points_scan(u32* __restrict__ tile_counts, u32 tiles, u32 stride,
                                           u32* __restrict__ out_count) {
    __shared__ u32 warp_tot[32];
    u32 carry = 0;
    for (u32 start = 0; start < tiles; start += blockDim.x) {
        const u32 i = start + threadIdx.x;
        const u32 v = i < tiles ? tile_counts[i] : 0u;
        u32 chunk;
        const u32 incl = block_scan_incl(v, warp_tot, chunk);
        if (i < tiles) tile_counts[i] = carry + incl - v;
        carry += chunk;
    }
    if (threadIdx.x == 0) *out_count = (carry + stride - 1u) / stride;
}

// Pass 3: every passing pixel learns its rank in pixel order (tile offset + rank in the tile);
// ranks that are multiples of `stride` are written at rank / stride.
extern "C" __global__ void dpt_points_write(const float* __restrict__ depth,
                                            const float* __restrict__ conf,
                                            const float* __restrict__ cam,
                                            const u8* __restrict__ rgb, u32 n, u32 width,
                                            float min_conf, u32 stride,
                                            const u32* __restrict__ tile_offsets,
                                            float* __restrict__ out_xyz, u8* __restrict__ out_rgb,
                                            float* __restrict__ out_conf) {
    __shared__ u32 warp_tot[32];
    const u32 base = blockIdx.x * PTS_TILE + threadIdx.x * PTS_PER_THREAD;
    float xyz[PTS_PER_THREAD][3];
    bool pass[PTS_PER_THREAD];
    u32 cnt = 0;
#pragma unroll
    for (u32 j = 0; j < PTS_PER_THREAD; ++j) {
        const u32 p = base + j;
        pass[j] = p < n && point_at(p, width, cam, depth, conf, min_conf, xyz[j]);
        cnt += pass[j] ? 1u : 0u;
    }
    u32 total;
    const u32 incl = block_scan_incl(cnt, warp_tot, total);
    u32 rank = tile_offsets[blockIdx.x] + incl - cnt;
#pragma unroll
    for (u32 j = 0; j < PTS_PER_THREAD; ++j) {
        if (!pass[j]) continue;
        if (rank % stride == 0) {
            const u64 o = rank / stride;
            const u32 p = base + j;
            out_xyz[3 * o] = xyz[j][0];
            out_xyz[3 * o + 1] = xyz[j][1];
            out_xyz[3 * o + 2] = xyz[j][2];
            out_rgb[3 * o] = rgb[3 * (u64)p];
            out_rgb[3 * o + 1] = rgb[3 * (u64)p + 1];
            out_rgb[3 * o + 2] = rgb[3 * (u64)p + 2];
            out_conf[o] = conf[p];
        }
        ++rank;
    }
}
