//! The depth head's large 3x3 convolutions as one implicit-GEMM kernel on Hopper
//! (`kernels/conv_sm90.cu`): the kernel gathers each k slice's pixel rows from the feature map
//! itself, so the im2col matrix that [`DeviceConv::forward`] otherwise writes and its GEMM reads
//! back (9 x cin values a pixel) never exists. [`ImplicitConv::plan`] says where it applies;
//! elsewhere (other GPUs, other shapes, maps too small to fill the GPU with 128-pixel tiles) the
//! convolution keeps im2col + cuBLASLt.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::conv::{DeviceConv, Nhwc};
use super::{CudaDevice, CudaError, DeviceInfo};

type Result<T> = std::result::Result<T, CudaError>;

/// Output pixels of a CTA (the kernel's `CONV_BM`: two consumer warpgroups of 64).
const TILE_PIXELS: usize = 128;
/// Threads of a CTA: the producer warpgroup and two consumers.
const THREADS: u32 = 384;
/// Input channels of one k slice (a 128-byte row of the swizzled tiles).
const SLICE_CHANNELS: usize = 64;
/// Bytes of the ring of stages the kernel keeps (its `ConvTile::STAGES` fill this).
const RING_BYTES: usize = 192 * 1024;

/// One entry point of the kernel: its output-channel tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImplicitConv {
    /// Output channels of a CTA: 256 or 128.
    pub tile_channels: usize,
}

impl ImplicitConv {
    /// The entry point for `conv` on `frames` maps whose output is `out`, where the kernel
    /// implements it ([`Self::widest`]) and its tiles give the GPU at least half a wave of CTAs;
    /// None to keep im2col + GEMM.
    pub fn plan(conv: &DeviceConv, info: &DeviceInfo, frames: usize, out: Nhwc) -> Option<Self> {
        let plan = Self::widest(conv, info.arch)?;
        let ctas = plan.grid(conv, frames * out.pixels()).0;
        // Fewer CTAs than half the SMs leave most of the GPU idle for the whole product: there
        // cuBLASLt's smaller tiles (or split k) over the im2col matrix win.
        (2 * ctas >= info.sm_count as usize).then_some(plan)
    }

    /// The widest tile of the kernel for `conv` on a GPU of compute capability `arch`, whatever
    /// the map's size: a 3x3, padding-1 convolution (stride 1 or 2) with a multiple of 64 input
    /// channels and of 128 output channels, on sm_90 (wgmma).
    pub fn widest(conv: &DeviceConv, arch: u32) -> Option<Self> {
        let tile_channels = [256, 128]
            .into_iter()
            .find(|&n| conv.out_channels.is_multiple_of(n))?;
        let plan = Self { tile_channels };
        plan.implements(conv, arch).then_some(plan)
    }

    /// Whether these tiles implement `conv` on sm_`arch`.
    pub fn implements(&self, conv: &DeviceConv, arch: u32) -> bool {
        arch == 90
            && conv.kernel == 3
            && conv.padding == 1
            && (conv.stride == 1 || conv.stride == 2)
            && conv.in_channels > 0
            && conv.in_channels.is_multiple_of(SLICE_CHANNELS)
            && (self.tile_channels == 256 || self.tile_channels == 128)
            && conv.out_channels > 0
            && conv.out_channels.is_multiple_of(self.tile_channels)
    }

    fn entry(&self) -> &'static str {
        if self.tile_channels == 256 {
            "dpt_conv3x3_sm90_n256"
        } else {
            "dpt_conv3x3_sm90_n128"
        }
    }

    /// Dynamic shared memory: the ring (as many whole stages of 128 pixel rows and the tile's
    /// weight rows as fit), its two mbarriers a stage and 1 KB of alignment slack.
    fn smem_bytes(&self) -> usize {
        let stage = (TILE_PIXELS + self.tile_channels) * 128;
        let stages = RING_BYTES / stage;
        1024 + stages * stage + stages * 16
    }

    /// (CTAs, grid) for `pixels` output pixels.
    fn grid(&self, conv: &DeviceConv, pixels: usize) -> (usize, (usize, usize)) {
        let (nx, ny) = (
            conv.out_channels / self.tile_channels,
            pixels.div_ceil(TILE_PIXELS),
        );
        (nx * ny, (nx, ny))
    }

    /// `y = conv(relu(x) if relu_input else x)` of each of `frames` maps of `inp` (x
    /// `[frames][h][w][cin]`, y `[frames][oh][ow][cout]`), bias added (bf16 out, f32 sums). Any
    /// map size: [`Self::plan`]'s half wave is a speed rule, not the kernel's.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &CudaDevice,
        conv: &DeviceConv,
        x: DevPtr<bf16>,
        frames: usize,
        inp: Nhwc,
        relu_input: bool,
        y: DevPtr<bf16>,
    ) -> Result<Nhwc> {
        let invalid = |m: String| CudaError::Invalid(format!("implicit-GEMM conv: {m}"));
        let out = conv.out_dims(inp.h, inp.w);
        if !self.implements(conv, dev.info.arch) || inp.c != conv.in_channels || frames == 0 {
            return Err(invalid(format!(
                "a k{} s{} p{} conv {} -> {} on {frames} x {inp:?} (sm_{}) is not what the {} \
                 tiles implement",
                conv.kernel,
                conv.stride,
                conv.padding,
                conv.in_channels,
                conv.out_channels,
                dev.info.arch,
                self.tile_channels
            )));
        }
        let pixels = frames * out.pixels();
        x.check_len(frames * inp.len(), "implicit-GEMM conv input")?;
        y.check_len(pixels * out.c, "implicit-GEMM conv output")?;
        let weight = DevPtr::of(&conv.weight);
        weight.check_len(conv.out_channels * 9 * conv.in_channels, "conv weight")?;
        let bias = match &conv.bias {
            Some(b) => {
                let p = DevPtr::of(&b.bf16);
                p.check_len(conv.out_channels, "conv bias")?;
                p.addr()
            }
            None => 0,
        };
        // The kernel's contract: its window arithmetic is 32-bit, so a map's elements (and,
        // to keep the contract one rule, the weight's) stay below 2^31.
        let fits = |n: usize, what: &str| {
            u32::try_from(n)
                .ok()
                .filter(|&v| v < 1 << 31)
                .ok_or_else(|| invalid(format!("{what}: {n} elements")))
        };
        fits(inp.len(), "one input map")?;
        fits(conv.out_channels * 9 * conv.in_channels, "the weight")?;
        let u = |v: usize, what: &str| {
            u32::try_from(v).map_err(|_| invalid(format!("{what} = {v} does not fit in 32 bits")))
        };
        let (h, w, cin, cout, stride, oh, ow, px, relu) = (
            u(inp.h, "height")?,
            u(inp.w, "width")?,
            u(conv.in_channels, "input channels")?,
            u(conv.out_channels, "output channels")?,
            u(conv.stride, "stride")?,
            u(out.h, "output height")?,
            u(out.w, "output width")?,
            u(pixels, "output pixels")?,
            u32::from(relu_input),
        );
        let (_, (gx, gy)) = self.grid(conv, pixels);
        let f = dev.kernels.get(self.entry())?;
        let smem = self.smem_bytes();
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        let cfg = LaunchConfig {
            grid_dim: (u(gx, "channel tiles")?, u(gy, "pixel tiles")?, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (xa, wa, ya) = (x.addr(), weight.addr(), y.addr());
        let mut b = dev.stream.launch_builder(f);
        b.arg(&xa)
            .arg(&wa)
            .arg(&bias)
            .arg(&ya)
            .arg(&h)
            .arg(&w)
            .arg(&cin)
            .arg(&cout)
            .arg(&stride)
            .arg(&oh)
            .arg(&ow)
            .arg(&px)
            .arg(&relu);
        // SAFETY: arguments match the entry point's; input, output, weight ([cout][3][3][cin])
        // and bias were checked against the shapes above, the shapes against the kernel's
        // contract (`implements`: cin a multiple of 64, cout of the tile) and its 32-bit indices.
        unsafe { b.launch(cfg) }?;
        Ok(out)
    }
}
