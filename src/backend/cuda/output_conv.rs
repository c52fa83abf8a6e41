//! The end of the depth head in one kernel (kernels/dpt.cu's `dpt_output_conv_head_*`):
//! `output_conv2`'s 3x3 convolution to 32 channels, its ReLU, the 1x1 convolution 32 -> 2 and the
//! activations, `depth = exp(ch0)` and `conf = 1 + exp(ch1)`, from the image-sized feature map
//! straight to the two planar maps. The 3x3 convolution is an implicit GEMM on the tensor cores,
//! so the image-sized im2col that the general path writes and reads back (9 x 128 values a
//! pixel) never exists. [`fuses`] says where it applies; elsewhere the head keeps
//! [`DeviceConv::forward`] followed by [`super::conv::output_head`].

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::conv::DeviceConv;
use super::{CudaDevice, CudaError};

type Result<T> = std::result::Result<T, CudaError>;

/// Output channels of the fused 3x3 convolution (the kernel's `OC_COUT`).
const COUT: usize = 32;
/// Threads of a CTA (its `OC_THREADS`): four warps, one output row of a tile each.
const THREADS: u32 = 128;
/// Output tile of a CTA (its `OC_TH` x `OC_TW`), with the 1-pixel halo it reads.
const TILE_H: usize = 4;
const TILE_W: usize = 32;

/// The entry point for `cin` input channels, where there is one.
fn entry(cin: usize) -> Option<&'static str> {
    match cin {
        128 => Some("dpt_output_conv_head_c128"),
        16 => Some("dpt_output_conv_head_c16"),
        _ => None,
    }
}

/// Dynamic shared memory of the kernel for `cin` (its `OutConv<CIN>::SMEM`): the padded weight,
/// then two input tiles.
fn smem_bytes(cin: usize) -> usize {
    let weight = COUT * (9 * cin + 8) * 2;
    let tile = (TILE_H + 2) * (TILE_W + 2) * cin * 2;
    weight + 2 * tile
}

/// Whether the fused kernel implements `conv` on a GPU of compute capability `arch`: a 3x3,
/// stride-1, pad-1 convolution with a bias, 32 outputs, 128 or 16 inputs (the released head and
/// gct-tiny), on sm_80 or later (mma.sync with bf16).
pub fn fuses(conv: &DeviceConv, arch: u32) -> bool {
    arch >= 80
        && conv.kernel == 3
        && conv.stride == 1
        && conv.padding == 1
        && conv.out_channels == COUT
        && conv.bias.is_some()
        && entry(conv.in_channels).is_some()
}

/// `depth`, `conf` (`frames * h * w` f32 each) from `x` (`[frames][h][w][cin]` bf16): `conv`
/// (see [`fuses`]), ReLU, the 1x1 convolution `head_weight` (f32 `[2][32]`) + `head_bias` (f32
/// `[2]`), exp; one launch for all the frames.
#[allow(clippy::too_many_arguments)]
pub fn output_conv_head(
    dev: &CudaDevice,
    conv: &DeviceConv,
    x: DevPtr<bf16>,
    frames: usize,
    (h, w): (usize, usize),
    head_weight: DevPtr<f32>,
    head_bias: DevPtr<f32>,
    depth: DevPtr<f32>,
    conf: DevPtr<f32>,
) -> Result<()> {
    let invalid = |m: String| CudaError::Invalid(format!("fused output conv: {m}"));
    if !fuses(conv, dev.info.arch) {
        return Err(invalid(format!(
            "a k{} s{} p{} conv {} -> {} (bias: {}) on sm_{} is not what the kernel implements",
            conv.kernel,
            conv.stride,
            conv.padding,
            conv.in_channels,
            conv.out_channels,
            conv.bias.is_some(),
            dev.info.arch
        )));
    }
    let Some(bias) = conv.bias.as_ref() else {
        return Err(invalid("the convolution has no bias".into()));
    };
    let cin = conv.in_channels;
    let pixels = frames * h * w;
    if pixels == 0 {
        return Err(invalid(format!("empty {frames} x {h} x {w} maps")));
    }
    x.check_len(pixels * cin, "fused output conv input")?;
    DevPtr::of(&conv.weight).check_len(COUT * 9 * cin, "fused output conv weight")?;
    DevPtr::of(&bias.bf16).check_len(COUT, "fused output conv bias")?;
    head_weight.check_len(2 * COUT, "fused output conv 1x1 weight")?;
    head_bias.check_len(2, "fused output conv 1x1 bias")?;
    depth.check_len(pixels, "depth map")?;
    conf.check_len(pixels, "confidence map")?;
    let (n32, h32, w32) = (
        u32::try_from(frames).map_err(|_| invalid(format!("{frames} frames")))?,
        u32::try_from(h).map_err(|_| invalid(format!("height {h}")))?,
        u32::try_from(w).map_err(|_| invalid(format!("width {w}")))?,
    );
    u32::try_from(h * w * cin).map_err(|_| invalid(format!("{h} x {w} x {cin} elements")))?;

    let name = entry(cin).ok_or_else(|| invalid(format!("{cin} input channels")))?;
    let f = dev.kernels.get(name)?;
    let smem = smem_bytes(cin);
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )?;
    // Persistent CTAs: as many as are resident, never more than there are tiles.
    let tiles = frames * h.div_ceil(TILE_H) * w.div_ceil(TILE_W);
    u32::try_from(tiles).map_err(|_| invalid(format!("{tiles} tiles")))?;
    let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(THREADS, smem, None)?;
    let resident = (per_sm.max(1) * dev.info.sm_count.max(1)) as usize;
    let cfg = LaunchConfig {
        grid_dim: (tiles.min(resident) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let (xa, wa, ba, hwa, hba, da, ca) = (
        x.addr(),
        DevPtr::of(&conv.weight).addr(),
        DevPtr::of(&bias.bf16).addr(),
        head_weight.addr(),
        head_bias.addr(),
        depth.addr(),
        conf.addr(),
    );
    let mut b = dev.stream.launch_builder(f);
    b.arg(&xa)
        .arg(&n32)
        .arg(&h32)
        .arg(&w32)
        .arg(&wa)
        .arg(&ba)
        .arg(&hwa)
        .arg(&hba)
        .arg(&da)
        .arg(&ca);
    // SAFETY: arguments match the kernel's; every buffer was checked against the shape above and
    // the weight and bias are the convolution's own ([32][3][3][cin] and [32]).
    unsafe { b.launch(cfg) }?;
    Ok(())
}
