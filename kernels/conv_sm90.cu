// The depth head's large 3x3 convolutions (padding 1, stride 1 or 2) for Hopper (sm_90a) as one
// implicit GEMM: y[p][n] = bias[n] + sum over taps (ky, kx) and input channels ci of
//   x[frame(p)][oy(p) s + ky - 1][ox(p) s + kx - 1][ci] . w[n][ky][kx][ci]
// (zero where the window leaves the map), bf16 in and out, f32 accumulation, NHWC maps with the
// call's frames back to back (output pixel p counts through the frames' outputs in turn; no window
// reaches into a neighbouring frame). The im2col matrix that src/backend/cuda/conv.rs otherwise
// writes and the GEMM reads back (9 x cin values a pixel: 74 MB for one of level 0's convs at
// 518x378, 295 MB for output_conv1) never exists: the producer gathers each slice's rows from the
// feature map itself.
//
// One CTA per tile of 128 output pixels x BN output channels, 384 threads:
//   warpgroup 0  producer: a k slice is 64 input channels of one tap (128 bytes a row), so the
//                GEMM's K = 9 cin is walked tap by tap. Per slice it copies the tile's 128 pixel
//                rows (zero-filled where the tap leaves the map or past the last pixel) and its BN
//                weight rows with cp.async into a ring of STAGES stages (the 128-byte swizzle the
//                wgmma descriptors read), and announces a stage on its `full` mbarrier LAG
//                slices behind the copies (rectifying its own chunks of the pixel rows first when
//                the input is rectified: the residual units' ReLU); a stage is refilled once every
//                consumer thread arrived on its `empty` mbarrier.
//   warpgroups 1, 2  consumers, 64 pixels each: four m64nBNk16 wgmma a slice, both operands from
//                shared memory, one commit group a slice, at most two in flight (the slice before
//                is released as soon as its group completed); then the epilogue: bias, bf16,
//                staged in the ring and stored as whole 16-byte chunks of a row.
// Contract (checked by the host, src/backend/cuda/conv_sm90.rs): cin a multiple of 64, cout a
// multiple of BN, 16-byte aligned buffers, the map's and the weight's elements below 2^31.

#include "common.cuh"
#include "sm90.cuh"

// Pixel rows of a CTA: two consumer warpgroups of 64.
#define CONV_BM 128

template <int BN>
struct ConvTile {
    static constexpr u32 A_BYTES = CONV_BM * 128;
    static constexpr u32 B_BYTES = BN * 128;
    static constexpr u32 STAGE_BYTES = A_BYTES + B_BYTES;
    // As many stages as fit in 192 KB: four for BN 256, six for BN 128.
    static constexpr u32 STAGES = (192 * 1024) / STAGE_BYTES;
    // Slices between a stage's copies and its announcement, as the attention kernels' producers
    // do: LAG + 1 slices of copies in flight a producer thread. The producer waits for the
    // release of slice s - STAGES before copying slice s, which needs slice s - STAGES + 1
    // announced, so LAG <= STAGES - 2; with four stages one slice keeps two ready ahead of the
    // consumers (the 192-key attention kernel's choice), with six two.
    static constexpr u32 LAG = STAGES >= 6 ? 2 : 1;
    static_assert(LAG + 2 <= STAGES, "the producer would wait for a slice it has not announced");
};

template <int BN>
__device__ __forceinline__ void conv_wgmma(float* d, u64 desc_a, u64 desc_b) {
    if constexpr (BN == 128) wgmma_m64n128k16_ss(d, desc_a, desc_b, 1);
    else wgmma_m64n256k16_ss(d, desc_a, desc_b, 1);
}

// ReLU of the eight bf16 in a 16-byte word: a set sign bit (negative, -0, or negative NaN)
// becomes +0, as dpt.cu's im2col rectifies.
__device__ __forceinline__ u32 conv_relu2(u32 v) {
    const u32 lo = (v & 0x00008000u) ? 0u : (v & 0x0000ffffu);
    const u32 hi = (v & 0x80000000u) ? 0u : (v & 0xffff0000u);
    return lo | hi;
}

// ---- producer: warpgroup 0 -------------------------------------------------------------------
// Thread `tid` (0..127) copies chunk column tid & 7 of rows (tid >> 3) + 16 i of every slice:
// i < 8 of the pixel tile, i < BN / 16 of the weight tile. With the 128-byte swizzle (which
// depends on the row only through r & 7) row (tid >> 3) + 16 i sits 2 KB past row tid >> 3.
template <int BN>
__device__ __forceinline__ void conv_producer(u32 tid, u32 ring, u32 bar_full, u32 bar_empty,
    const u16* __restrict__ x, const u16* __restrict__ w, u32 h, u32 wd, u32 cin, u32 stride,
    u32 oh, u32 ow, u32 pixels, u32 relu, u32 m0, u32 n0) {
    using T = ConvTile<BN>;
    constexpr int A_ROWS = CONV_BM / 16;
    constexpr int B_ROWS = BN / 16;
    const u32 col = tid & 7, row = tid >> 3;
    // Per pixel row of this thread: its frame's map and the window's top-left input position
    // (far outside the map for rows past the last pixel, so every tap reads zeros).
    const u16* frame[A_ROWS];
    int iy0[A_ROWS], ix0[A_ROWS];
    const u32 out_plane = oh * ow;
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
        const u32 p = m0 + row + 16 * i;
        const u32 f = p / out_plane, rem = p - f * out_plane;
        const u32 oy = rem / ow, ox = rem - oy * ow;
        const bool live = p < pixels;
        frame[i] = x + (live ? (u64)f * h * wd * cin : 0) + col * 8;
        iy0[i] = live ? (int)(oy * stride) - 1 : -(1 << 24);
        ix0[i] = (int)(ox * stride) - 1;
    }
    const u64 k_len = 9ull * cin;
    const u16* wrow = w + (u64)(n0 + row) * k_len + col * 8;
    const u32 dst0 = ring + swz(row, col) * 16;
    const u32 chunks_per_tap = cin / 64;
    const u32 slices = 9 * chunks_per_tap;

    // Announces stage `a` (its copies by this thread have landed): rectified first if asked.
    auto announce_stage = [&](u32 a) {
        if (relu) {
#pragma unroll
            for (int i = 0; i < A_ROWS; ++i) {
                const u32 addr = dst0 + a * T::STAGE_BYTES + i * 2048;
                uint4 v;
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                             : "r"(addr)
                             : "memory");
                v.x = conv_relu2(v.x);
                v.y = conv_relu2(v.y);
                v.z = conv_relu2(v.z);
                v.w = conv_relu2(v.w);
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
                             "r"(v.z), "r"(v.w)
                             : "memory");
            }
        }
        fence_proxy_async();
        mbar_arrive(bar_full + a * 8);
    };

    u32 stage = 0, phase = 0, announce = 0;
    u32 ky = 0, kx = 0, chunk = 0;  // the slice's tap and channel chunk, counted
    for (u32 s = 0; s < slices; ++s) {
        // Wait until the consumers released this stage's previous slice (s - STAGES).
        mbar_wait(bar_empty + stage * 8, phase ^ 1);
        const u32 dst = dst0 + stage * T::STAGE_BYTES;
        const u32 ch = chunk * 64;
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            const int iy = iy0[i] + (int)ky, ix = ix0[i] + (int)kx;
            // A negative position wraps to a huge unsigned one: one compare per axis.
            const bool ok = (u32)iy < h && (u32)ix < wd;
            const u16* src = ok ? frame[i] + ((u64)((u32)iy * wd + (u32)ix) * cin + ch) : x;
            cp_async_16(dst + i * 2048, src, ok);
        }
        const u16* wsrc = wrow + (u64)s * 64;
#pragma unroll
        for (int i = 0; i < B_ROWS; ++i) cp_async_16(dst + T::A_BYTES + i * 2048, wsrc + (u64)i * 16 * k_len, true);
        cp_async_commit();
        if (s >= T::LAG) {
            cp_async_wait<T::LAG>();
            announce_stage(announce);
            if (++announce == T::STAGES) announce = 0;
        }
        if (++stage == T::STAGES) {
            stage = 0;
            phase ^= 1;
        }
        if (++chunk == chunks_per_tap) {
            chunk = 0;
            if (++kx == 3) {
                kx = 0;
                ++ky;
            }
        }
    }
    cp_async_wait<0>();
    for (u32 s = slices > T::LAG ? slices - T::LAG : 0; s < slices; ++s) {
        announce_stage(announce);
        if (++announce == T::STAGES) announce = 0;
    }
}

template <int BN>
__device__ __forceinline__ void conv_body(const u16* __restrict__ x, const u16* __restrict__ w,
    const u16* __restrict__ bias, u16* __restrict__ y, u32 h, u32 wd, u32 cin, u32 cout, u32 stride,
    u32 oh, u32 ow, u32 pixels, u32 relu) {
    using T = ConvTile<BN>;
    extern __shared__ unsigned char smem_raw[];
    // The 128-byte swizzle repeats every 1024 bytes: tiles start on that boundary.
    unsigned char* smem = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
    const u32 ring = smem_addr(smem);
    const u32 bar_full = ring + T::STAGES * T::STAGE_BYTES;
    const u32 bar_empty = bar_full + T::STAGES * 8;

    const u32 tid = threadIdx.x;
    const u32 role = tid >> 7;  // 0 producer, 1 .. 2 consumers
    const u32 n0 = blockIdx.x * BN;
    const u32 m0 = blockIdx.y * CONV_BM;
    const u32 slices = 9 * (cin / 64);

    if (tid == 0) {
#pragma unroll
        for (u32 s = 0; s < T::STAGES; ++s) {
            mbar_init(bar_full + s * 8, 128);   // every producer thread
            mbar_init(bar_empty + s * 8, 256);  // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (role == 0) {
        conv_producer<BN>(tid, ring, bar_full, bar_empty, x, w, h, wd, cin, stride, oh, ow, pixels,
                          relu, m0, n0);
        return;
    }
    const u32 c = role - 1;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    u32 stage = 0, phase = 0, prev = 0;
    for (u32 s = 0; s < slices; ++s) {
        mbar_wait(bar_full + stage * 8, phase);
        const u32 a = smem_desc_lo(ring + stage * T::STAGE_BYTES + c * 64 * 128);
        const u32 b = smem_desc_lo(ring + stage * T::STAGE_BYTES + T::A_BYTES);
        fence_regs<BN / 2>(acc);
        wgmma_fence();
        // k steps of 16 channels: 32 bytes along the swizzled row (2 in the descriptor's units).
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) conv_wgmma<BN>(acc, smem_desc_of(a + 2 * kk), smem_desc_of(b + 2 * kk));
        wgmma_commit();
        // The slice before this one is done once at most one group is pending: release it.
        wgmma_wait<1>();
        fence_regs<BN / 2>(acc);
        if (s > 0) mbar_arrive(bar_empty + prev * 8);
        prev = stage;
        if (++stage == T::STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
    fence_regs<BN / 2>(acc);

    // Accumulator layout (m64nBN, f32): acc[4 j + 2 hf + e] is row 16 warp + g + 8 hf, column
    // 8 j + 2 tq + e of this warpgroup's 64 x BN tile. Staged in the ring (free once both
    // consumers' products completed: every slice was consumed, so every copy had landed), rows
    // BN * 2 + 16 bytes apart so that the eight rows of a fragment store land in distinct banks,
    // then stored as whole 16-byte chunks.
    const u32 lane = tid & 31;
    const u32 warp = (tid >> 5) & 3;
    const u32 g = lane >> 2;
    const u32 tq = lane & 3;
    constexpr u32 PITCH = BN * 2 + 16;
    named_sync(1, 256);
    unsigned char* out_tile = smem + c * 64 * PITCH;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const u32 r = warp * 16 + hf * 8 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            float v0 = acc[4 * j + 2 * hf];
            float v1 = acc[4 * j + 2 * hf + 1];
            if (bias) {
                const u32 bb = *(const u32*)(bias + n0 + j * 8 + tq * 2);
                v0 += bf16_to_f32((u16)(bb & 0xffffu));
                v1 += bf16_to_f32((u16)(bb >> 16));
            }
            *(u32*)(out_tile + r * PITCH + (j * 8 + tq * 2) * 2) = pack_bf16x2(v0, v1);
        }
    }
    named_sync(2 + c, 128);
    constexpr u32 CHUNKS = BN / 8;  // 16-byte chunks of a row
    const u32 ctid = tid & 127;
#pragma unroll 4
    for (u32 i = ctid; i < 64 * CHUNKS; i += 128) {
        const u32 r = i / CHUNKS, ch = i % CHUNKS;
        const u32 p = m0 + c * 64 + r;
        if (p < pixels) *(uint4*)(y + (u64)p * cout + n0 + ch * 8) = *(const uint4*)(out_tile + r * PITCH + ch * 16);
    }
}

// Dynamic shared memory: 1024 (alignment slack) + STAGES x (128 + BN) x 128 B + 2 x STAGES
// mbarriers (src/backend/cuda/conv_sm90.rs computes the same). grid = (cout / BN, pixel tiles).
#define CONV_ENTRY(NAME, BN)                                                                      \
    extern "C" __global__ void __launch_bounds__(384, 1) NAME(                                    \
        const u16* __restrict__ x, const u16* __restrict__ w, const u16* __restrict__ bias,       \
        u16* __restrict__ y, u32 h, u32 wd, u32 cin, u32 cout, u32 stride, u32 oh, u32 ow,         \
        u32 pixels, u32 relu) {                                                                   \
        conv_body<BN>(x, w, bias, y, h, wd, cin, cout, stride, oh, ow, pixels, relu);             \
    }

CONV_ENTRY(dpt_conv3x3_sm90_n256, 256)
CONV_ENTRY(dpt_conv3x3_sm90_n128, 128)
