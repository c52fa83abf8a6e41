//! The DPT depth head on the GPU: the CPU head (`model::dpt_head`) with bf16 NHWC feature maps,
//! f32 accumulation in cuBLASLt GEMMs and the glue kernels of `kernels/dpt.cu` (through
//! `backend::cuda::conv`). Up to `batch` frames go through at once, their maps back to back:
//! every launch and every GEMM covers them all (a convolution never reads across frames).
//!
//! Per tap: LayerNorm of the patch tokens → 1x1 projection → + UV embedding → resize (k4s4 /
//! k2s2 transposed conv, identity, 3x3 stride-2 conv) → 3x3 `layer_rn`. Then the fusion blocks
//! coarse to fine, `output_conv1`, the bilinear resize to the image (+ UV embedding),
//! `output_conv2` and the activations, written as planar f32 depth and confidence maps (one
//! kernel on sm_80 and later, `backend::cuda::output_conv`: no image-sized im2col).
//!
//! The weights are the model's `DptHead<Device>` (uploaded once with the model). Every buffer for
//! the resolution given to [`GpuDptHead::new`] is allocated there, once: `forward` only enqueues
//! kernels and GEMMs on fixed addresses (it runs inside a CUDA graph).

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::conv::{self, DeviceConv, Nhwc, UvTable, upload_f32};
use crate::backend::cuda::conv_sm90::ImplicitConv;
use crate::backend::cuda::gemm::Gemm;
use crate::backend::cuda::output_conv;
use crate::backend::cuda::storage::Device;
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::model::dpt_head::{DptHead, ResidualConvUnit, Resize};
use crate::model::spec::SPECIAL_TOKENS;

type Result<T> = std::result::Result<T, CudaError>;

/// Upper bound of the im2col buffer in bf16 elements (128 MiB): the large full-resolution convs
/// run in a few row chunks instead of one huge column matrix.
const COLS_BUDGET: usize = 1 << 26;

/// Where a call's four aggregator taps are: `first[i]` points at tap i's row of the first
/// frame's token 0; rows `row_stride` f32 values apart, frames `frame_stride` apart.
#[derive(Debug, Clone, Copy)]
pub struct Taps {
    pub first: [DevPtr<f32>; 4],
    pub row_stride: usize,
    pub frame_stride: usize,
}

/// Scratch feature maps, each sized for its largest use at this resolution (times the batch).
struct Scratch {
    /// Normalised patch tokens `[np][dim]`.
    ln: CudaSlice<bf16>,
    /// A projected tap `[np][oc]`.
    proj: CudaSlice<bf16>,
    /// The transposed convs' GEMM result `[np][k][k][oc]`.
    up: CudaSlice<bf16>,
    /// A tap brought to its pyramid level.
    resized: CudaSlice<bf16>,
    /// The four pyramid levels after `layer_rn`.
    levels: Vec<CudaSlice<bf16>>,
    /// Inside a residual conv unit (two), the fusion sum and the unit's output: level-sized.
    t1: CudaSlice<bf16>,
    t2: CudaSlice<bf16>,
    sum: CudaSlice<bf16>,
    rcu: CudaSlice<bf16>,
    /// A fusion block's resized map and its `out_conv` output (the next block's input).
    zoomed: CudaSlice<bf16>,
    fused: CudaSlice<bf16>,
    /// `output_conv1` output, then the same resized to the image.
    head1: CudaSlice<bf16>,
    full: CudaSlice<bf16>,
    /// `output_conv2.0` output `[H][W][32]`, where the end of the head is not one kernel.
    head2: Option<CudaSlice<bf16>>,
    /// im2col columns.
    cols: CudaSlice<bf16>,
}

/// The depth head's buffers for one resolution and batch on the device (the weights stay the
/// model's).
pub struct GpuDptHead {
    height: usize,
    width: usize,
    /// Frames one `forward` may take.
    batch: usize,
    ph: usize,
    pw: usize,
    dim: usize,
    /// The transposed convolutions' biases repeated per (ky, kx), by resize index.
    tiled_bias: Vec<Option<CudaSlice<bf16>>>,
    /// `output_conv2.2`'s bias when the checkpoint has none: zeros.
    zero_out_bias: Option<CudaSlice<f32>>,
    /// UV embeddings (×0.1, separable halves) of the four projections and of the image-size map.
    uv_taps: Vec<UvTable>,
    uv_full: UvTable,
    level_dims: Vec<Nhwc>,
    s: Scratch,
}

fn alloc_bf16(dev: &CudaDevice, n: usize) -> Result<CudaSlice<bf16>> {
    Ok(dev.stream.alloc_zeros::<bf16>(n.max(8))?)
}

/// Every convolution of the head, checked against what the kernels implement.
fn check_convs(head: &DptHead<Device>) -> Result<()> {
    let convs = head
        .projects
        .iter()
        .chain(&head.layer_rn)
        .chain(head.resize.iter().filter_map(|r| match r {
            Resize::Down(c) => Some(c),
            _ => None,
        }))
        .chain(head.refine.iter().flat_map(|f| {
            f.unit1
                .iter()
                .chain([&f.unit2])
                .flat_map(|u: &ResidualConvUnit<Device>| [&u.conv1, &u.conv2])
                .chain([&f.out_conv])
        }))
        .chain([&head.output_conv1, &head.output_conv2a]);
    for c in convs {
        c.check()?;
    }
    for r in &head.resize {
        if let Resize::Up(t) = r {
            t.check()?;
        }
    }
    Ok(())
}

impl GpuDptHead {
    /// Checks `head` against the kernels and allocates every buffer for up to `batch` frames of
    /// `height × width` input images a call.
    pub fn new(
        dev: &CudaDevice,
        head: &DptHead<Device>,
        height: usize,
        width: usize,
        batch: usize,
    ) -> Result<Self> {
        if batch == 0 {
            return Err(CudaError::Invalid("DPT head: a batch of 0 frames".into()));
        }
        let (ph, pw) = (height / head.patch.max(1), width / head.patch.max(1));
        let four = [
            head.projects.len(),
            head.resize.len(),
            head.layer_rn.len(),
            head.refine.len(),
        ];
        if ph == 0 || pw == 0 || four != [4; 4] {
            return Err(CudaError::Invalid(format!(
                "DPT head: {height}x{width} images with patch {} (or a head without 4 taps)",
                head.patch
            )));
        }
        check_convs(head)?;
        let np = ph * pw;
        let dim = head.norm.dim;
        let aspect = width as f64 / height as f64;
        if head.norm.weight.is_none() || head.norm.bias.is_none() {
            return Err(CudaError::Invalid("DPT head norm without affine".into()));
        }

        let projects = &head.projects;
        let resize = &head.resize;
        let layer_rn = &head.layer_rn;
        let refine = &head.refine;
        let output_conv1 = &head.output_conv1;
        let output_conv2a = &head.output_conv2a;
        let last = &head.output_conv2b;
        if last.kernel != 1
            || last.out_channels != 2
            || last.in_channels != output_conv2a.out_channels
        {
            return Err(CudaError::Invalid(format!(
                "DPT output_conv2.2: {}→{} k{}, expected a 1x1 {}→2",
                last.in_channels, last.out_channels, last.kernel, output_conv2a.out_channels
            )));
        }
        let zero_out_bias = match last.bias {
            Some(_) => None,
            None => Some(upload_f32(dev, &[0.0f32; 2])?),
        };
        let tiled_bias = resize
            .iter()
            .map(|r| match r {
                Resize::Up(t) => t.tiled_bias(dev).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;

        // Shapes along the way, to size every buffer.
        let mut cols = 0usize;
        let mut cols_row = 0usize;
        // A conv that is one implicit-GEMM launch for a single frame is one for more frames too
        // (more pixel tiles): it needs no columns.
        let mut note_conv = |c: &DeviceConv, h: usize, w: usize| {
            if ImplicitConv::plan(c, &dev.info, 1, c.out_dims(h, w)).is_some() {
                return;
            }
            cols = cols.max((batch * c.cols_for(h, w)).min(COLS_BUDGET));
            cols_row = cols_row.max(c.cols_per_row(w));
        };
        let mut proj_len = 0;
        let mut up_len = 0;
        let mut resized_len = 0;
        let mut level_dims = Vec::with_capacity(4);
        for i in 0..4 {
            let p = &projects[i];
            if p.kernel != 1 || p.in_channels != dim {
                return Err(CudaError::Invalid(format!(
                    "DPT projects.{i}: expected a 1x1 conv from {dim} channels"
                )));
            }
            proj_len = proj_len.max(np * p.out_channels);
            let d = match &resize[i] {
                Resize::Up(t) => {
                    up_len = up_len.max(t.tmp_for(ph, pw));
                    let d = t.out_dims(ph, pw);
                    resized_len = resized_len.max(d.len());
                    d
                }
                Resize::Identity => Nhwc::new(ph, pw, p.out_channels),
                Resize::Down(c) => {
                    note_conv(c, ph, pw);
                    let d = c.out_dims(ph, pw);
                    resized_len = resized_len.max(d.len());
                    d
                }
            };
            if d.c != layer_rn[i].in_channels {
                return Err(CudaError::Invalid(format!(
                    "DPT tap {i}: {} channels into layer{}_rn of {}",
                    d.c,
                    i + 1,
                    layer_rn[i].in_channels
                )));
            }
            note_conv(&layer_rn[i], d.h, d.w);
            level_dims.push(layer_rn[i].out_dims(d.h, d.w));
        }
        let features = level_dims[0].c;
        let level_max = level_dims.iter().map(Nhwc::len).max().unwrap_or(0);
        // Fusion outputs: levels 2, 1, 0 sizes, then twice level 0.
        let l0 = level_dims[0];
        let final_fused = Nhwc::new(2 * l0.h, 2 * l0.w, features);
        let fused_max = level_dims[..3]
            .iter()
            .map(Nhwc::len)
            .chain([final_fused.len()])
            .max()
            .unwrap_or(0);
        for (r, f) in refine.iter().enumerate() {
            // refinenet r+1 works at level r's size.
            let d = level_dims[r];
            for unit in f.unit1.iter().chain([&f.unit2]) {
                note_conv(&unit.conv1, d.h, d.w);
                note_conv(&unit.conv2, d.h, d.w);
            }
        }
        note_conv(output_conv1, final_fused.h, final_fused.w);
        let c1 = output_conv1.out_dims(final_fused.h, final_fused.w);
        let fused_end = output_conv::fuses(output_conv2a, dev.info.arch);
        if !fused_end {
            note_conv(output_conv2a, height, width);
        }
        let cols = cols.max(cols_row);

        let uv_taps = projects
            .iter()
            .map(|p| UvTable::new(dev, Nhwc::new(ph, pw, p.out_channels), aspect))
            .collect::<Result<Vec<_>>>()?;
        let uv_full = UvTable::new(dev, Nhwc::new(height, width, c1.c), aspect)?;

        // Every map holds `batch` frames back to back.
        let maps = |len: usize| alloc_bf16(dev, batch * len);
        let s = Scratch {
            ln: maps(np * dim)?,
            proj: maps(proj_len)?,
            up: maps(up_len)?,
            resized: maps(resized_len)?,
            levels: level_dims
                .iter()
                .map(|d| maps(d.len()))
                .collect::<Result<Vec<_>>>()?,
            t1: maps(level_max)?,
            t2: maps(level_max)?,
            sum: maps(level_max)?,
            rcu: maps(level_max)?,
            zoomed: maps(fused_max)?,
            fused: maps(fused_max)?,
            head1: maps(c1.len())?,
            full: maps(height * width * c1.c)?,
            head2: if fused_end {
                None
            } else {
                Some(maps(height * width * output_conv2a.out_channels)?)
            },
            cols: alloc_bf16(dev, cols)?,
        };
        Ok(Self {
            height,
            width,
            batch,
            ph,
            pw,
            dim,
            tiled_bias,
            zero_out_bias,
            uv_taps,
            uv_full,
            level_dims,
            s,
        })
    }

    pub fn height(&self) -> usize {
        self.height
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// Frames one [`Self::forward`] may take.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Tokens per frame the taps must hold: the special tokens, then the patch grid.
    pub fn tokens_per_frame(&self) -> usize {
        SPECIAL_TOKENS + self.ph * self.pw
    }

    /// Depth `[frames][H][W]` and confidence `[frames][H][W]` (f32, activations applied) of
    /// `frames` frames (at most [`Self::batch`]) from their four aggregator taps: `taps[i]` points
    /// at the first frame's token 0, rows of `dim` f32 values `taps.row_stride` elements apart,
    /// each frame `taps.frame_stride` elements after the one before; the patch tokens are rows
    /// `6 ..` of a frame.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        head: &DptHead<Device>,
        frames: usize,
        taps: Taps,
        depth: DevPtr<f32>,
        conf: DevPtr<f32>,
    ) -> Result<()> {
        if frames == 0 || frames > self.batch {
            return Err(CudaError::Invalid(format!(
                "DPT head: {frames} frames in a call; these buffers take 1 to {}",
                self.batch
            )));
        }
        let (ph, pw) = (self.ph, self.pw);
        let np = ph * pw;
        let n = frames;
        let s = &self.s;
        if head.norm.dim != self.dim || head.resize.len() != self.tiled_bias.len() {
            return Err(CudaError::Invalid(
                "DPT head: weights differ from the head these buffers were made for".into(),
            ));
        }
        let missing = || CudaError::Invalid("DPT head norm without affine".into());
        let norm_weight = head.norm.weight.as_ref().ok_or_else(missing)?;
        let norm_bias = head.norm.bias.as_ref().ok_or_else(missing)?;
        let cols = DevPtr::of(&s.cols);
        for (i, tap) in taps.first.iter().enumerate() {
            let ln = DevPtr::of(&s.ln);
            conv::layer_norm_rows(
                dev,
                *tap,
                taps.row_stride,
                SPECIAL_TOKENS,
                np,
                (n, taps.frame_stride),
                self.dim,
                DevPtr::of(norm_weight),
                DevPtr::of(norm_bias),
                head.norm.eps,
                ln,
            )?;
            let proj = DevPtr::of(&s.proj);
            let pd = head.projects[i].forward(dev, gemm, ln, n, (ph, pw), false, cols, proj)?;
            conv::add_uv(dev, proj, n, &self.uv_taps[i])?;
            let resized = DevPtr::of(&s.resized);
            let (src, d) = match (&head.resize[i], &self.tiled_bias[i]) {
                (Resize::Up(t), Some(bias)) => {
                    let up = DevPtr::of(&s.up);
                    let d =
                        t.forward(dev, gemm, DevPtr::of(bias), proj, n, (ph, pw), up, resized)?;
                    (resized, d)
                }
                (Resize::Up(_), None) => {
                    return Err(CudaError::Invalid(
                        "DPT head: a transposed convolution without its tiled bias".into(),
                    ));
                }
                (Resize::Identity, _) => (proj, pd),
                (Resize::Down(c), _) => {
                    let d = c.forward(dev, gemm, proj, n, (ph, pw), false, cols, resized)?;
                    (resized, d)
                }
            };
            head.layer_rn[i].forward(
                dev,
                gemm,
                src,
                n,
                (d.h, d.w),
                false,
                cols,
                DevPtr::of(&s.levels[i]),
            )?;
        }

        // Fusion, coarse to fine: refinenet4 on level 3 alone, then refinenet r with level r-1.
        let fused = DevPtr::of(&s.fused);
        let l0 = self.level_dims[0];
        for r in (0..4).rev() {
            let d = self.level_dims[r];
            let target = if r == 0 {
                (2 * l0.h, 2 * l0.w)
            } else {
                (self.level_dims[r - 1].h, self.level_dims[r - 1].w)
            };
            let level = DevPtr::of(&s.levels[r]);
            let block = &head.refine[r];
            // x = a + RCU1(level) for refinenet1..3 (a = the previous block's output, already
            // at this level's size); refinenet4's x is level 3 itself.
            let x = match (&block.unit1, r) {
                (Some(unit1), 0..=2) => {
                    let sum = DevPtr::of(&s.sum);
                    rcu(dev, gemm, unit1, level, (n, d), cols, s, Some(fused), sum)?;
                    sum
                }
                (None, 3) => level,
                _ => {
                    return Err(CudaError::Invalid(format!(
                        "DPT refinenet{}: unexpected residual units",
                        r + 1
                    )));
                }
            };
            let y = DevPtr::of(&s.rcu);
            rcu(dev, gemm, &block.unit2, x, (n, d), cols, s, None, y)?;
            let zoomed = DevPtr::of(&s.zoomed);
            conv::bilinear(dev, y, d, n, target, None, zoomed)?;
            block
                .out_conv
                .forward(dev, gemm, zoomed, n, target, false, cols, fused)?;
        }

        let (fh, fw) = (2 * l0.h, 2 * l0.w);
        let head1 = DevPtr::of(&s.head1);
        let c1 = head
            .output_conv1
            .forward(dev, gemm, fused, n, (fh, fw), false, cols, head1)?;
        let full = DevPtr::of(&s.full);
        conv::bilinear(
            dev,
            head1,
            c1,
            n,
            (self.height, self.width),
            Some(&self.uv_full),
            full,
        )?;
        let out_weight = DevPtr::of(&head.output_conv2b.weight);
        let out_bias = match (&head.output_conv2b.bias, &self.zero_out_bias) {
            (Some(b), _) | (None, Some(b)) => DevPtr::of(b),
            (None, None) => {
                return Err(CudaError::Invalid(
                    "DPT output_conv2.2 without a bias".into(),
                ));
            }
        };
        let (h, w) = (self.height, self.width);
        let Some(head2) = s.head2.as_ref().map(DevPtr::of) else {
            // No head2 buffer: `new` found the fused kernel applies.
            return output_conv::output_conv_head(
                dev,
                &head.output_conv2a,
                full,
                n,
                (h, w),
                out_weight,
                out_bias,
                depth,
                conf,
            );
        };
        let c2 = head
            .output_conv2a
            .forward(dev, gemm, full, n, (h, w), false, cols, head2)?;
        conv::output_head(
            dev,
            head2,
            n * h * w,
            c2.c,
            out_weight,
            out_bias,
            depth,
            conf,
        )
    }
}

/// `out = conv2(relu(conv1(relu(x)))) + relu(x) (+ extra)` on `frames` maps of dims `d`, through
/// `s.t1`/`s.t2`.
#[allow(clippy::too_many_arguments)]
fn rcu(
    dev: &CudaDevice,
    gemm: &mut Gemm,
    unit: &ResidualConvUnit<Device>,
    x: DevPtr<bf16>,
    (frames, d): (usize, Nhwc),
    cols: DevPtr<bf16>,
    s: &Scratch,
    extra: Option<DevPtr<bf16>>,
    out: DevPtr<bf16>,
) -> Result<()> {
    let (t1, t2) = (DevPtr::of(&s.t1), DevPtr::of(&s.t2));
    unit.conv1
        .forward(dev, gemm, x, frames, (d.h, d.w), true, cols, t1)?;
    unit.conv2
        .forward(dev, gemm, t1, frames, (d.h, d.w), true, cols, t2)?;
    conv::add(dev, out, t2, x, extra, frames * d.len(), true)
}
