// The DPT depth head and the point unprojection on the GPU (src/backend/cuda/conv.rs,
// src/gpu_model/{dpt_head,unproject}.rs). Feature maps are NHWC bf16 (u16 storage), one frame at
// a time; math in f32. Convolutions are im2col + a cuBLASLt GEMM on the host side: these kernels
// are the glue around the GEMMs. Every kernel that moves 8-channel vectors (uint4) needs the
// channel count to be a multiple of 8 (the host checks) and 16-byte aligned buffers.
//
// The semantics are those of the CPU model: src/model/dpt_head.rs, src/model/ops/{conv,resize}.rs,
// src/model/pose.rs and src/pipeline/frame.rs::filter_points.

#include "common.cuh"
#include "mma.cuh"

// Round to nearest even; NaN stays NaN (quieted, sign and payload kept: camera_head.cu and
// transformer.cu round NaN differently, each keeps its own).
__device__ __forceinline__ u16 f2bf(float x) {
    u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)((bits >> 16) | 0x40u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (u16)(bits >> 16);
}

// Eight f32 back to bf16 in one 16-byte word (bf16x8_to_f32 of common.cuh the other way).
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
// values a row; y[r][:] bf16, dense. One block per output row, eight consecutive values a thread
// (two 16-byte loads, one 16-byte store), held in registers: the row is read from memory once and
// the two statistics (mean, then the centred variance, in f32) are block sums. Reading it three
// times from global memory, as before, was three round trips per row: 11.4 us for the head's
// 999 x 2048 rows against 4 us of memory traffic. The host gives dim % 8 == 0, dim <= 8 *
// blockDim, 16-byte aligned rows and blockDim a multiple of 32. Frames of a call: blockIdx.y is
// the frame, whose rows start `frame_stride` elements after the previous frame's; its outputs
// follow the previous frame's.
extern "C" __global__ void dpt_layernorm_rows(const float* __restrict__ x, u64 row_stride,
                                              u64 frame_stride, u32 first_row, u32 dim,
                                              const float* __restrict__ weight,
                                              const float* __restrict__ bias, float eps,
                                              u16* __restrict__ y) {
    __shared__ float red[32];
    const float* row =
        x + (u64)blockIdx.y * frame_stride + (u64)(first_row + blockIdx.x) * row_stride;
    const u64 out_row = (u64)blockIdx.y * gridDim.x + blockIdx.x;
    const u32 i0 = threadIdx.x * 8u;
    const bool mine = i0 < dim;
    float v[8], w[8], b[8];
    if (mine) {
        const float4 a = *(const float4*)(row + i0);
        const float4 a2 = *(const float4*)(row + i0 + 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = a2.x, v[5] = a2.y, v[6] = a2.z, v[7] = a2.w;
        // The affine parameters now, not after the block sums (whose barriers keep the
        // compiler from hoisting loads): one trip to memory less on the row's path.
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = __ldg(weight + i0 + j), b[j] = __ldg(bias + i0 + j);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = 0.f, w[j] = 0.f, b[j] = 0.f;
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) s += v[j];
    const float mean = block_sum_ceil_warps(s, red) / (float)dim;
    float q = 0.f;
    if (mine) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float d = v[j] - mean;
            q += d * d;
        }
    }
    const float var = block_sum_ceil_warps(q, red) / (float)dim;
    const float inv = 1.f / sqrtf(var + eps);
    if (!mine) return;
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = (v[j] - mean) * inv * w[j] + b[j];
    *(uint4*)(y + out_row * dim + i0) = pack8(o);
}

// The UV positional embedding (already scaled by 0.1 on the host) is separable: channels below
// c / 2 depend on the column only, the rest on the row only. It is kept as those two halves,
// cols [w][c / 2] and rows [h][c / 2] (f32; c % 16 == 0, the host checks), instead of a full
// [h][w][c] table: at the image size that table was 100 MB read every frame. uv_at gives the
// 8 values for channels cv * 8 .. of pixel (oy, ox).
__device__ __forceinline__ const float* uv_at(const float* __restrict__ cols,
                                              const float* __restrict__ rows, u32 c, u32 oy,
                                              u32 ox, u32 cv) {
    const u32 half = c >> 1, ch = cv * 8u;
    return ch < half ? cols + (u64)ox * half + ch : rows + (u64)oy * half + (ch - half);
}

// x [frames][h][w][c] += the UV embedding, rounded to bf16 once. One thread moves 8 channels.
extern "C" __global__ void dpt_add_uv(u16* __restrict__ x, const float* __restrict__ cols,
                                      const float* __restrict__ rows, u32 frames, u32 h, u32 w,
                                      u32 c) {
    const u32 c8 = c >> 3;
    const u64 total = (u64)frames * h * w * c8;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 cv = (u32)(i % c8);
        const u64 p = i / c8;
        // The frames' maps are stacked: a row of the stack is row `% h` of its frame.
        const float* t = uv_at(cols, rows, c, (u32)((p / w) % h), (u32)(p % w), cv);
        float v[8];
        bf16x8_to_f32(*(const uint4*)(x + i * 8u), v);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] += t[j];
        *(uint4*)(x + i * 8u) = pack8(v);
    }
}

// im2col for a 3x3 convolution with padding 1 and stride `stride` on x [h][w][cin]: output rows
// row0 .. row0+rows (of a map ow wide) become cols [(r - row0) * ow + ox][ky][kx][cin], zero
// where the window leaves the input. `relu` rectifies the input on the way (ResidualConvUnit).
// The input may hold several frames' maps back to back, x [frames][h][w][cin]: output rows then
// count through the frames' outputs in turn (row r is row r % oh of frame r / oh), so that one
// launch and one GEMM cover a call's frames, and no window reaches into a neighbouring frame.
// One thread moves one 8-channel vector of one output pixel for all nine taps: the index
// arithmetic, in 32 bits (the host checks rows * ow * cin / 8 < 2^31), is done once for nine
// copies and the nine loads are in flight together. (One thread per tap and vector, with 64-bit
// divisions, left the kernel issue-bound: 35.5 us on its largest map, Nsight Compute.)
extern "C" __global__ void dpt_im2col3x3(const u16* __restrict__ x, u32 h, u32 w, u32 cin,
                                         u32 stride, u32 row0, u32 rows, u32 ow, u32 relu,
                                         u16* __restrict__ cols) {
    const u32 c8 = cin >> 3;
    const u32 total = rows * ow * c8;
    const u32 oh = (h - 1u) / stride + 1u;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 cv = i % c8;
        const u32 pix = i / c8;
        const u32 ox = pix % ow;
        const u32 row = row0 + pix / ow;
        const u32 oy = row % oh;
        const u16* frame = x + (u64)(row / oh) * h * w * cin;
        uint4 v[9];
#pragma unroll
        for (u32 tap = 0; tap < 9; ++tap) {
            const int iy = (int)(oy * stride + tap / 3u) - 1;
            const int ix = (int)(ox * stride + tap % 3u) - 1;
            v[tap] = make_uint4(0u, 0u, 0u, 0u);
            if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w) {
                v[tap] =
                    *(const uint4*)(frame + ((u64)((u32)iy * w + (u32)ix)) * cin + cv * 8u);
                if (relu) v[tap] = relu8(v[tap]);
            }
        }
        uint4* dst = (uint4*)(cols + ((u64)pix * 9u * c8 + cv) * 8u);
#pragma unroll
        for (u32 tap = 0; tap < 9; ++tap) dst[tap * c8] = v[tap];
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

// Bilinear resize (align_corners=True) x [frames][ih][iw][c] -> y [frames][oh][ow][c]; when
// `uv_cols` is not null, the UV embedding of the output map (uv_at) is added before rounding
// (after the last resize).
extern "C" __global__ void dpt_bilinear(const u16* __restrict__ x, u32 frames, u32 ih, u32 iw,
                                        u32 c, u32 oh, u32 ow, const float* __restrict__ uv_cols,
                                        const float* __restrict__ uv_rows, u16* __restrict__ y) {
    // 32-bit indices (the host checks frames * oh * ow * c / 8 < 2^31): 64-bit divisions made
    // the largest resize issue-bound.
    const u32 c8 = c >> 3;
    const u32 total = frames * oh * ow * c8;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 cv = i % c8;
        const u32 p = i / c8;
        const u32 ox = p % ow;
        const u32 row = p / ow;
        const u32 oy = row % oh;
        const u16* src = x + (u64)(row / oh) * ih * iw * c;
        u32 y0, y1, x0, x1;
        float ly, lx;
        align_corners_axis(oy, ih, oh, y0, y1, ly);
        align_corners_axis(ox, iw, ow, x0, x1, lx);
        float a[8], b[8], cc[8], d[8], r[8];
        bf16x8_to_f32(*(const uint4*)(src + ((u64)y0 * iw + x0) * c + cv * 8u), a);
        bf16x8_to_f32(*(const uint4*)(src + ((u64)y0 * iw + x1) * c + cv * 8u), b);
        bf16x8_to_f32(*(const uint4*)(src + ((u64)y1 * iw + x0) * c + cv * 8u), cc);
        bf16x8_to_f32(*(const uint4*)(src + ((u64)y1 * iw + x1) * c + cv * 8u), d);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float top = (1.f - lx) * a[j] + lx * b[j];
            const float bot = (1.f - lx) * cc[j] + lx * d[j];
            r[j] = (1.f - ly) * top + ly * bot;
        }
        if (uv_cols != nullptr) {
            const float* t = uv_at(uv_cols, uv_rows, c, oy, ox, cv);
#pragma unroll
            for (int j = 0; j < 8; ++j) r[j] += t[j];
        }
        *(uint4*)(y + (u64)i * 8u) = pack8(r);
    }
}

// out = a + (relu_b ? relu(b) : b) (+ c when c is not null), in f32, rounded once; n8 vectors of
// 8. `out` may alias `a`, `b` or `c` (each thread reads its vector before writing it).
extern "C" __global__ void dpt_add(u16* out, const u16* a, const u16* b, const u16* c, u64 n8,
                                   u32 relu_b) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (u64)gridDim.x * blockDim.x) {
        float fa[8], fb[8], fc[8];
        bf16x8_to_f32(*(const uint4*)(a + i * 8u), fa);
        uint4 vb = *(const uint4*)(b + i * 8u);
        if (relu_b) vb = relu8(vb);
        bf16x8_to_f32(vb, fb);
#pragma unroll
        for (int j = 0; j < 8; ++j) fa[j] += fb[j];
        if (c != nullptr) {
            bf16x8_to_f32(*(const uint4*)(c + i * 8u), fc);
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
        bf16x8_to_f32(relu8(*(const uint4*)(row + c)), v);
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
// The end of the head in one kernel: output_conv2's 3x3 conv (pad 1, COUT = 32, bias), its ReLU,
// the 1x1 conv 32 -> 2 and the activations, from the image-sized map x [h][w][CIN] straight to
// the planar depth and confidence maps. Unfused, the 3x3 conv alone was an im2col of the whole
// image (9 * CIN values a pixel: 450 MB at 518x378) written and read back by a GEMM whose n is
// only 32, about 0.3 ms a frame on an H200; here the input is read once.
// A call's frames (x [frames][h][w][CIN], depth and confidence [frames][h][w]) share one launch:
// the tiles of frame f follow those of frame f - 1.
//
// The conv is an implicit GEMM on the sm_80 tensor cores (m16n8k16, bf16 in, f32 accumulators):
// m = pixels, n = 32 output channels, k = 9 taps x CIN. The weight [32][3][3][CIN] stays in
// shared memory for the whole kernel (rows padded by 8 elements, an odd number of 16-byte chunks,
// so the 8 rows an ldmatrix reads fall in distinct banks). CTAs are persistent: each walks tiles
// of OC_TH x OC_TW output pixels, the input tile of the next (with its 1-pixel halo, zero outside
// the image) copied in by cp.async while the current one is multiplied. Warp w takes output row
// w of the tile, 32 pixels as two m16 tiles against all four n8 tiles, so that the 32 channels
// of a pixel end in one quad of lanes and the 1x1 conv is a sum over the quad.
//
// Rounding follows the unfused path: the conv's result plus its bf16 bias is rounded to bf16 (the
// GEMM's output), the ReLU acts on that, the 1x1 conv and the activations are f32.
#define OC_COUT 32
#define OC_WARPS 4
#define OC_THREADS (OC_WARPS * 32)
#define OC_TH OC_WARPS
#define OC_TW 32
#define OC_IN_H (OC_TH + 2)
#define OC_IN_W (OC_TW + 2)

template <int CIN>
struct OutConv {
    static constexpr int CHUNKS = CIN / 8;         // 16-byte chunks a pixel
    static constexpr int K = 9 * CIN;              // GEMM depth
    static constexpr int WROW = K + 8;             // padded weight row, elements
    static constexpr int TILE_CHUNKS = OC_IN_H * OC_IN_W * CHUNKS;
    static constexpr int W_BYTES = OC_COUT * WROW * 2;
    static constexpr int TILE_BYTES = TILE_CHUNKS * 16;
    static constexpr int SMEM = W_BYTES + 2 * TILE_BYTES;
    static_assert(CIN % 16 == 0, "the k loop takes 16 channels a step");
    static_assert((WROW * 2 / 16) % 2 == 1, "weight rows must be an odd number of chunks");
    // Chunk c of tile pixel q: XOR-swizzled over 8 chunks when a pixel has that many, so the 8
    // consecutive pixels an ldmatrix reads hit 8 distinct bank groups.
    static __device__ __forceinline__ u32 chunk_at(u32 q, u32 c) {
        return q * CHUNKS + (CHUNKS >= 8 ? (c ^ (q & 7u)) : c);
    }
};

// Tile `tile` of the frames' stacked tiles (each frame has `frame_tiles`, row-major).
template <int CIN>
__device__ __forceinline__ void out_conv_load_tile(const u16* __restrict__ x, u32 h, u32 w,
                                                   u32 tile, u32 frame_tiles, u32 tiles_x,
                                                   u32 tile_smem) {
    using C = OutConv<CIN>;
    x += (u64)(tile / frame_tiles) * h * w * CIN;
    tile %= frame_tiles;
    const int y0 = (int)((tile / tiles_x) * OC_TH) - 1;
    const int x0 = (int)((tile % tiles_x) * OC_TW) - 1;
    for (u32 i = threadIdx.x; i < (u32)C::TILE_CHUNKS; i += OC_THREADS) {
        const u32 q = i / C::CHUNKS, c = i % C::CHUNKS;
        const int gy = y0 + (int)(q / OC_IN_W), gx = x0 + (int)(q % OC_IN_W);
        const bool inside = gy >= 0 && gy < (int)h && gx >= 0 && gx < (int)w;
        const u16* src = inside ? x + ((u64)gy * w + (u64)gx) * CIN + c * 8u : x;
        cp_async_16(tile_smem + C::chunk_at(q, c) * 16u, src, inside);
    }
}

template <int CIN>
__device__ __forceinline__ void output_conv_head_body(
    const u16* __restrict__ x, u32 frames, u32 h, u32 w, const u16* __restrict__ weight,
    const u16* __restrict__ bias, const float* __restrict__ head_w,
    const float* __restrict__ head_b, float* __restrict__ depth, float* __restrict__ conf) {
#if __CUDA_ARCH__ >= 800
    using C = OutConv<CIN>;
    extern __shared__ __align__(16) u8 oc_smem[];
    const u32 ws = smem_addr(oc_smem);
    const u32 tiles_smem = ws + C::W_BYTES;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const u32 tiles_x = (w + OC_TW - 1) / OC_TW;
    const u32 frame_tiles = ((h + OC_TH - 1) / OC_TH) * tiles_x;
    const u32 tiles = frames * frame_tiles;

    // The weight, once; it lands with the first tile (same cp.async group).
    for (u32 i = threadIdx.x; i < (u32)(OC_COUT * C::K / 8); i += OC_THREADS) {
        const u32 n = i / (C::K / 8), c = i % (C::K / 8);
        cp_async_16(ws + n * (C::WROW * 2) + c * 16u, weight + (u64)n * C::K + c * 8u, true);
    }
    u32 tile = blockIdx.x;
    if (tile < tiles) out_conv_load_tile<CIN>(x, h, w, tile, frame_tiles, tiles_x, tiles_smem);
    cp_async_commit();

    // Per lane: the bias, 1x1 weights and channels of its accumulator columns
    // (n = nt * 8 + (lane % 4) * 2 + e).
    float cb[4][2], w0[4][2], w1[4][2];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const u32 n = nt * 8 + (lane & 3u) * 2 + e;
            cb[nt][e] = bf16_to_f32(bias[n]);
            w0[nt][e] = head_w[n];
            w1[nt][e] = head_w[OC_COUT + n];
        }
    const float hb0 = head_b[0], hb1 = head_b[1];

    // ldmatrix rows of this lane: for A, row (lane % 8) + 8 * ((lane / 8) % 2) of an m16 tile at
    // k half lane / 16; for B, output channel (lane % 8) + 8 * (lane / 16) of an n16 pair at k
    // half (lane / 8) % 2.
    const u32 a_row = (lane & 7u) + ((lane >> 3) & 1u) * 8u, a_half = lane >> 4;
    const u32 b_n = (lane & 7u) + (lane >> 4) * 8u, b_half = (lane >> 3) & 1u;

    for (u32 it = 0; tile < tiles; tile += gridDim.x, ++it) {
        const u32 cur = tiles_smem + (it & 1u) * C::TILE_BYTES;
        const u32 next = tile + gridDim.x;
        if (next < tiles)
            out_conv_load_tile<CIN>(x, h, w, next, frame_tiles, tiles_x,
                                    tiles_smem + ((it + 1) & 1u) * C::TILE_BYTES);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        float acc[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

#pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
            const u32 ky = tap / 3, kx = tap % 3;
#pragma unroll
            for (int ks = 0; ks < CIN / 16; ++ks) {
                u32 a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    const u32 q = (warp + ky) * OC_IN_W + mt * 16 + a_row + kx;
                    ldmatrix_x4(cur + C::chunk_at(q, ks * 2 + a_half) * 16u, a[mt][0], a[mt][1],
                                a[mt][2], a[mt][3]);
                }
                u32 b[4][2];
#pragma unroll
                for (int np = 0; np < 2; ++np) {
                    const u32 n = np * 16 + b_n;
                    const u32 k = tap * CIN + ks * 16 + b_half * 8;
                    ldmatrix_x4(ws + (n * C::WROW + k) * 2u, b[2 * np][0], b[2 * np][1],
                                b[2 * np + 1][0], b[2 * np + 1][1]);
                }
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
            }
        }

        // Lane (g = lane / 4) holds pixels g and g + 8 of each m16 tile, 8 of the 32 channels.
        const u32 in_frame = tile % frame_tiles;
        const u64 plane = (u64)(tile / frame_tiles) * h * w;
        const u32 oy = (in_frame / tiles_x) * OC_TH + warp;
        const u32 ox0 = (in_frame % tiles_x) * OC_TW;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float s0 = 0.f, s1 = 0.f;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const u16 yb = f2bf(acc[mt][nt][half * 2 + e] + cb[nt][e]);
                        const float y = (yb & 0x8000u) ? 0.f : bf16_to_f32(yb);  // relu2's rule
                        s0 = fmaf(w0[nt][e], y, s0);
                        s1 = fmaf(w1[nt][e], y, s1);
                    }
                s0 += __shfl_xor_sync(FULL_MASK, s0, 1);
                s1 += __shfl_xor_sync(FULL_MASK, s1, 1);
                s0 += __shfl_xor_sync(FULL_MASK, s0, 2);
                s1 += __shfl_xor_sync(FULL_MASK, s1, 2);
                const u32 ox = ox0 + mt * 16 + (lane >> 2) + half * 8;
                if ((lane & 3u) == 0 && oy < h && ox < w) {
                    const u64 p = plane + (u64)oy * w + ox;
                    depth[p] = expf(hb0 + s0);
                    conf[p] = 1.f + expf(hb1 + s1);
                }
            }
        __syncthreads();  // the next iteration's copies overwrite this tile
    }
    cp_async_wait<0>();
#else
    __trap();  // the host launches this on sm_80 and later only
#endif
}

// Entry points by input width: the released head's 128 channels and gct-tiny's 16.
// grid = min(tiles, resident CTAs), block = OC_THREADS, dynamic shared memory OutConv<CIN>::SMEM.
#define OUT_CONV_ENTRY(name, CIN)                                                               \
    extern "C" __global__ void __launch_bounds__(OC_THREADS)                                    \
        name(const u16* __restrict__ x, u32 frames, u32 h, u32 w,                               \
             const u16* __restrict__ weight, const u16* __restrict__ bias,                       \
             const float* __restrict__ head_w, const float* __restrict__ head_b,                 \
             float* __restrict__ depth, float* __restrict__ conf) {                              \
        output_conv_head_body<CIN>(x, frames, h, w, weight, bias, head_w, head_b, depth, conf); \
    }
OUT_CONV_ENTRY(dpt_output_conv_head_c128, 128)
OUT_CONV_ENTRY(dpt_output_conv_head_c16, 16)

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
