//! NHWC convolution building blocks on bf16 feature maps (`kernels/dpt.cu`), for the DPT head.
//!
//! A convolution is an im2col into `[out pixel][ky][kx][cin]` followed by one cuBLASLt GEMM
//! against the weight reordered on the host to `[cout][ky][kx][cin]` (f32 accumulation, the conv
//! bias in the GEMM epilogue). A 1x1 convolution is the GEMM alone. A transposed convolution whose
//! stride equals its kernel (the head's k4s4 and k2s2 upsamplers: non-overlapping) is a GEMM
//! against the weight reordered to `[ky][kx][cout][cin]`, with the bias repeated per (ky, kx) in
//! the epilogue, then a pixel-shuffle scatter. Bilinear resizing (align_corners=True), the
//! ResidualConvUnit's additions and the final activations are small kernels.
//!
//! Everything here only enqueues work on the device's stream with fixed addresses and sizes, so
//! it can be captured in a CUDA graph; device memory is allocated only by the `upload`
//! constructors. Channel counts must be multiples of 8 (the kernels move 16-byte vectors).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::conv_sm90::ImplicitConv;
use super::gemm::{Epilogue, Gemm};
use super::storage::DeviceBias;
use super::{CudaDevice, CudaError};
use crate::model::dpt_head::add_uv_embedding;
use crate::model::ops::conv::{Conv2d, ConvTransposeUpsample, FeatureMap};

/// Threads per block of the elementwise kernels (grid-stride loops).
const THREADS: u32 = 256;
/// Largest block of `dpt_layernorm_rows` (eight values a thread).
const LAYER_NORM_MAX_THREADS: usize = 1024;
/// Grid cap of the grid-stride kernels: plenty to fill any GPU.
const MAX_BLOCKS: u64 = 1 << 16;

type Result<T> = std::result::Result<T, CudaError>;

fn invalid(msg: String) -> CudaError {
    CudaError::Invalid(msg)
}

/// `work` items of a kernel that numbers them in 32 bits, stepping by its grid (so below 2^31).
fn index32(work: usize, what: &str) -> Result<u64> {
    if work >= 1 << 31 {
        return Err(invalid(format!(
            "{what}: {work} work items exceed the kernel's 32-bit indices"
        )));
    }
    Ok(work as u64)
}

/// Grid-stride launch over `work` items.
fn grid_stride(work: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            work.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn as_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| invalid(format!("{what} = {v} does not fit in 32 bits")))
}

fn check_vec8(c: usize, what: &str) -> Result<()> {
    if c == 0 || !c.is_multiple_of(8) {
        return Err(invalid(format!(
            "{what}: {c} channels; the NHWC kernels need a positive multiple of 8"
        )));
    }
    Ok(())
}

/// f32 host values to a new bf16 device buffer (round to nearest even).
pub fn upload_bf16(dev: &CudaDevice, host: &[f32]) -> Result<CudaSlice<bf16>> {
    let v: Vec<bf16> = host.iter().map(|&x| bf16::from_f32(x)).collect();
    Ok(dev.stream.clone_htod(&v)?)
}

/// f32 host values to a new f32 device buffer.
pub fn upload_f32(dev: &CudaDevice, host: &[f32]) -> Result<CudaSlice<f32>> {
    Ok(dev.stream.clone_htod(host)?)
}

/// Height, width and channels of an NHWC map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nhwc {
    pub h: usize,
    pub w: usize,
    pub c: usize,
}

impl Nhwc {
    pub fn new(h: usize, w: usize, c: usize) -> Self {
        Self { h, w, c }
    }
    pub fn pixels(&self) -> usize {
        self.h * self.w
    }
    pub fn len(&self) -> usize {
        self.h * self.w * self.c
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// LayerNorm of `rows` rows of `dim` f32 values, the first at row `first_row` of `x` (row stride
/// `row_stride` elements), into dense bf16 `y [rows][dim]`; weight and bias f32 `[dim]`. With
/// `frames` > 1 the same rows of each frame, frame f's `x` starting `f * frame_stride` elements
/// in, go to `y [frames][rows][dim]`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_rows(
    dev: &CudaDevice,
    x: DevPtr<f32>,
    row_stride: usize,
    first_row: usize,
    rows: usize,
    (frames, frame_stride): (usize, usize),
    dim: usize,
    weight: DevPtr<f32>,
    bias: DevPtr<f32>,
    eps: f32,
    y: DevPtr<bf16>,
) -> Result<()> {
    if rows == 0 || frames == 0 {
        return Ok(());
    }
    if row_stride < dim {
        return Err(invalid(format!(
            "layer_norm_rows: row stride {row_stride} < width {dim}"
        )));
    }
    if frames > 1 && frame_stride < (first_row + rows - 1) * row_stride + dim {
        return Err(invalid(format!(
            "layer_norm_rows: frames {frame_stride} values apart overlap rows {first_row}..{} \
             of {row_stride} values",
            first_row + rows
        )));
    }
    x.check_len(
        (frames - 1) * frame_stride + (first_row + rows - 1) * row_stride + dim,
        "layer_norm_rows input",
    )?;
    weight.check_len(dim, "layer_norm_rows weight")?;
    bias.check_len(dim, "layer_norm_rows bias")?;
    y.check_len(frames * rows * dim, "layer_norm_rows output")?;
    // The kernel holds eight values a thread and loads them as two 16-byte vectors.
    if dim == 0 || !dim.is_multiple_of(8) || dim > 8 * LAYER_NORM_MAX_THREADS {
        return Err(invalid(format!(
            "layer_norm_rows: width {dim}; the kernel takes a positive multiple of 8 up to {}",
            8 * LAYER_NORM_MAX_THREADS
        )));
    }
    if !row_stride.is_multiple_of(4)
        || !frame_stride.is_multiple_of(4)
        || !x.addr().is_multiple_of(16)
    {
        return Err(invalid(format!(
            "layer_norm_rows: rows must start on 16 bytes (row stride {row_stride}, frame \
             stride {frame_stride} values)"
        )));
    }
    let f = dev.kernels.get("dpt_layernorm_rows")?;
    let (xa, wa, ba, ya) = (x.addr(), weight.addr(), bias.addr(), y.addr());
    let stride = row_stride as u64;
    let frame_stride = frame_stride as u64;
    let first = as_u32(first_row, "first_row")?;
    let dim32 = as_u32(dim, "dim")?;
    let threads = (dim / 8).next_multiple_of(32) as u32;
    let cfg = LaunchConfig {
        grid_dim: (as_u32(rows, "rows")?, as_u32(frames, "frames")?, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream.launch_builder(f);
    b.arg(&xa)
        .arg(&stride)
        .arg(&frame_stride)
        .arg(&first)
        .arg(&dim32)
        .arg(&wa)
        .arg(&ba)
        .arg(&eps)
        .arg(&ya);
    // SAFETY: arguments match dpt_layernorm_rows; every range was length-checked above.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// The DPT head's UV positional embedding (×0.1, `model::dpt_head::add_uv_embedding`) for one
/// map size, on the device as its two separable halves: channels `[0, c/2)` depend on the column
/// only (`cols [w][c/2]`), channels `[c/2, c)` on the row only (`rows [h][c/2]`). The kernels
/// look the values up ([`add_uv`], [`bilinear`]) instead of reading an `[h][w][c]` table, which
/// at the image size was 100 MB a frame.
pub struct UvTable {
    dims: Nhwc,
    cols: CudaSlice<f32>,
    rows: CudaSlice<f32>,
}

/// The two halves of the UV embedding of a `dims` map (see [`UvTable`]), made by the CPU's
/// `add_uv_embedding` so that every value is the CPU's. The column half depends on the width
/// alone and the row half on the height alone, so a one-row map (`c x 1 x w`) gives the first and
/// a one-column map (`c x h x 1`) the second, without the full `h x w x c` map (100 MB at the
/// image size).
pub fn uv_halves(dims: Nhwc, aspect: f64) -> Result<(Vec<f32>, Vec<f32>)> {
    let Nhwc { h, w, c } = dims;
    if c == 0 || !c.is_multiple_of(16) || h == 0 || w == 0 {
        return Err(invalid(format!(
            "UV embedding of {dims:?}: needs a non-empty map and a positive multiple of 16 channels"
        )));
    }
    let mut one_row = FeatureMap::zeros(c, 1, w);
    add_uv_embedding(&mut one_row, aspect);
    let mut one_col = FeatureMap::zeros(c, h, 1);
    add_uv_embedding(&mut one_col, aspect);
    let half = c / 2;
    let mut cols = vec![0.0f32; w * half];
    let mut rows = vec![0.0f32; h * half];
    for ch in 0..half {
        for x in 0..w {
            cols[x * half + ch] = one_row.data[ch * w + x];
        }
        for y in 0..h {
            rows[y * half + ch] = one_col.data[(half + ch) * h + y];
        }
    }
    Ok((cols, rows))
}

impl UvTable {
    pub fn new(dev: &CudaDevice, dims: Nhwc, aspect: f64) -> Result<Self> {
        let (cols, rows) = uv_halves(dims, aspect)?;
        Ok(Self {
            dims,
            cols: upload_f32(dev, &cols)?,
            rows: upload_f32(dev, &rows)?,
        })
    }

    fn check(&self, dims: Nhwc, what: &str) -> Result<()> {
        if self.dims != dims {
            return Err(invalid(format!(
                "{what}: a UV table of {:?} for a {dims:?} map",
                self.dims
            )));
        }
        Ok(())
    }
}

/// `x [frames][h][w][c] += the UV embedding` (`uv`'s dims, the same for every frame), rounded
/// to bf16 once.
pub fn add_uv(dev: &CudaDevice, x: DevPtr<bf16>, frames: usize, uv: &UvTable) -> Result<()> {
    let d = uv.dims;
    x.check_len(frames * d.len(), "add_uv map")?;
    let f = dev.kernels.get("dpt_add_uv")?;
    let (xa, ca, ra) = (
        x.addr(),
        DevPtr::of(&uv.cols).addr(),
        DevPtr::of(&uv.rows).addr(),
    );
    let (h, w, c) = (as_u32(d.h, "h")?, as_u32(d.w, "w")?, as_u32(d.c, "c")?);
    let n = as_u32(frames, "frames")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&xa).arg(&ca).arg(&ra).arg(&n).arg(&h).arg(&w).arg(&c);
    // SAFETY: arguments match dpt_add_uv; the map's length checked, the halves are the table's
    // own ([w][c/2] and [h][c/2], c % 16 == 0).
    unsafe { b.launch(grid_stride((frames * d.len() / 8) as u64)) }?;
    Ok(())
}

/// Output size of a 3x3 convolution with padding 1 along one axis.
pub fn conv3x3_out(len: usize, stride: usize) -> usize {
    (len + 2 - 3) / stride + 1
}

/// im2col of a 3x3, padding-1 convolution over `x` (`frames` maps of dims `inp`, back to back)
/// for output rows `row0 .. row0 + rows` of the frames' outputs in turn (row r is row `r % oh`
/// of frame `r / oh`): `cols [rows * ow][3][3][cin]`, the input rectified when `relu`.
#[allow(clippy::too_many_arguments)]
pub fn im2col3x3(
    dev: &CudaDevice,
    x: DevPtr<bf16>,
    inp: Nhwc,
    frames: usize,
    stride: usize,
    row0: usize,
    rows: usize,
    relu: bool,
    cols: DevPtr<bf16>,
) -> Result<()> {
    check_vec8(inp.c, "im2col3x3")?;
    if stride == 0 || inp.h == 0 || inp.w == 0 {
        return Err(invalid(format!("im2col3x3: stride {stride} on {inp:?}")));
    }
    let (oh, ow) = (conv3x3_out(inp.h, stride), conv3x3_out(inp.w, stride));
    if row0 + rows > frames * oh {
        return Err(invalid(format!(
            "im2col3x3: rows {row0}..{} of {frames} x {oh}",
            row0 + rows
        )));
    }
    x.check_len(frames * inp.len(), "im2col3x3 input")?;
    let n = rows * ow * 9 * inp.c;
    cols.check_len(n, "im2col3x3 columns")?;
    // One thread per output pixel and 8 channels, all nine taps.
    let threads = index32(rows * ow * (inp.c / 8), "im2col3x3")?;
    let f = dev.kernels.get("dpt_im2col3x3")?;
    let (xa, ca) = (x.addr(), cols.addr());
    let (h, w, c) = (
        as_u32(inp.h, "h")?,
        as_u32(inp.w, "w")?,
        as_u32(inp.c, "c")?,
    );
    let (s, r0, nr, ow32, relu32) = (
        stride as u32,
        row0 as u32,
        rows as u32,
        ow as u32,
        u32::from(relu),
    );
    let mut b = dev.stream.launch_builder(f);
    b.arg(&xa)
        .arg(&h)
        .arg(&w)
        .arg(&c)
        .arg(&s)
        .arg(&r0)
        .arg(&nr)
        .arg(&ow32)
        .arg(&relu32)
        .arg(&ca);
    // SAFETY: arguments match dpt_im2col3x3; input and output lengths checked above, the
    // thread count against the kernel's 32-bit indices.
    unsafe { b.launch(grid_stride(threads)) }?;
    Ok(())
}

/// The scatter after a kernel == stride transposed convolution's GEMM:
/// `y [h*w][k][k][cout]` to `out [h*k][w*k][cout]`.
pub fn pixel_shuffle(
    dev: &CudaDevice,
    y: DevPtr<bf16>,
    inp: Nhwc,
    k: usize,
    cout: usize,
    out: DevPtr<bf16>,
) -> Result<()> {
    check_vec8(cout, "pixel_shuffle")?;
    let n = inp.pixels() * k * k * cout;
    y.check_len(n, "pixel_shuffle input")?;
    out.check_len(n, "pixel_shuffle output")?;
    let f = dev.kernels.get("dpt_pixel_shuffle")?;
    let (ya, oa) = (y.addr(), out.addr());
    let (h, w, k32, c) = (
        as_u32(inp.h, "h")?,
        as_u32(inp.w, "w")?,
        as_u32(k, "k")?,
        as_u32(cout, "cout")?,
    );
    let mut b = dev.stream.launch_builder(f);
    b.arg(&ya).arg(&h).arg(&w).arg(&k32).arg(&c).arg(&oa);
    // SAFETY: arguments match dpt_pixel_shuffle; lengths checked.
    unsafe { b.launch(grid_stride((n / 8) as u64)) }?;
    Ok(())
}

/// Bilinear resize with align_corners=True of `x` (`frames` maps of dims `inp`, back to back)
/// to `oh x ow` each, plus the UV embedding `uv` of the output map when given (added before the
/// one rounding to bf16).
pub fn bilinear(
    dev: &CudaDevice,
    x: DevPtr<bf16>,
    inp: Nhwc,
    frames: usize,
    (oh, ow): (usize, usize),
    uv: Option<&UvTable>,
    y: DevPtr<bf16>,
) -> Result<()> {
    check_vec8(inp.c, "bilinear")?;
    if inp.h == 0 || inp.w == 0 {
        return Err(invalid(format!("bilinear: empty input {inp:?}")));
    }
    let n = frames * oh * ow * inp.c;
    let threads = index32(n / 8, "bilinear")?;
    x.check_len(frames * inp.len(), "bilinear input")?;
    y.check_len(n, "bilinear output")?;
    if let Some(t) = uv {
        t.check(Nhwc::new(oh, ow, inp.c), "bilinear")?;
    }
    let f = dev.kernels.get("dpt_bilinear")?;
    let (xa, ya) = (x.addr(), y.addr());
    let (uc, ur) = uv.map_or((0u64, 0u64), |t| {
        (DevPtr::of(&t.cols).addr(), DevPtr::of(&t.rows).addr())
    });
    let (ih, iw, c) = (
        as_u32(inp.h, "h")?,
        as_u32(inp.w, "w")?,
        as_u32(inp.c, "c")?,
    );
    let (oh32, ow32) = (as_u32(oh, "oh")?, as_u32(ow, "ow")?);
    let n32 = as_u32(frames, "frames")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&xa)
        .arg(&n32)
        .arg(&ih)
        .arg(&iw)
        .arg(&c)
        .arg(&oh32)
        .arg(&ow32)
        .arg(&uc)
        .arg(&ur)
        .arg(&ya);
    // SAFETY: arguments match dpt_bilinear; lengths checked, the UV table is for the output's
    // dims; null halves (no table) are allowed; the thread count fits the kernel's 32-bit
    // indices.
    unsafe { b.launch(grid_stride(threads)) }?;
    Ok(())
}

/// `out = a + (relu(b) if relu_b else b) (+ c)` over `n` values (a multiple of 8), rounded once.
/// `out` may be one of the inputs.
pub fn add(
    dev: &CudaDevice,
    out: DevPtr<bf16>,
    a: DevPtr<bf16>,
    b: DevPtr<bf16>,
    c: Option<DevPtr<bf16>>,
    n: usize,
    relu_b: bool,
) -> Result<()> {
    check_vec8(n, "add")?;
    out.check_len(n, "add output")?;
    a.check_len(n, "add a")?;
    b.check_len(n, "add b")?;
    if let Some(c) = c {
        c.check_len(n, "add c")?;
    }
    let f = dev.kernels.get("dpt_add")?;
    let (oa, aa, ba) = (out.addr(), a.addr(), b.addr());
    let ca = c.map_or(0u64, |c| c.addr());
    let (n8, r) = ((n / 8) as u64, u32::from(relu_b));
    let mut bl = dev.stream.launch_builder(f);
    bl.arg(&oa).arg(&aa).arg(&ba).arg(&ca).arg(&n8).arg(&r);
    // SAFETY: arguments match dpt_add; lengths checked; a null `c` is allowed.
    unsafe { bl.launch(grid_stride(n8)) }?;
    Ok(())
}

/// ReLU, 1x1 conv `cin -> 2` (f32 weight `[2][cin]`, bias `[2]`), then `depth = exp(ch0)` and
/// `conf = 1 + exp(ch1)` into planar f32 maps of `pixels` values; `x [pixels][cin]`.
#[allow(clippy::too_many_arguments)]
pub fn output_head(
    dev: &CudaDevice,
    x: DevPtr<bf16>,
    pixels: usize,
    cin: usize,
    weight: DevPtr<f32>,
    bias: DevPtr<f32>,
    depth: DevPtr<f32>,
    conf: DevPtr<f32>,
) -> Result<()> {
    check_vec8(cin, "output_head")?;
    x.check_len(pixels * cin, "output_head input")?;
    weight.check_len(2 * cin, "output_head weight")?;
    bias.check_len(2, "output_head bias")?;
    depth.check_len(pixels, "depth map")?;
    conf.check_len(pixels, "confidence map")?;
    let f = dev.kernels.get("dpt_output_head")?;
    let (xa, wa, ba, da, ca) = (
        x.addr(),
        weight.addr(),
        bias.addr(),
        depth.addr(),
        conf.addr(),
    );
    let (n, c) = (as_u32(pixels, "pixels")?, as_u32(cin, "cin")?);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(THREADS).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream.launch_builder(f);
    b.arg(&xa)
        .arg(&n)
        .arg(&c)
        .arg(&wa)
        .arg(&ba)
        .arg(&da)
        .arg(&ca);
    // SAFETY: arguments match dpt_output_head; lengths checked.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// A convolution on the device: 1x1 (stride 1, no padding) or 3x3 with padding 1 (stride 1 or
/// 2), filter bf16 `[cout][k][k][cin]`, optional bias (the GEMM epilogue reads its bf16 copy).
/// The model's own weights (`Conv2d<Device>` of the weight tree), with the device's methods.
pub type DeviceConv = Conv2d<CudaSlice<bf16>, DeviceBias>;

impl DeviceConv {
    /// Whether the kernels implement this convolution.
    pub fn check(&self) -> Result<()> {
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let supported = (k == 1 && s == 1 && p == 0) || (k == 3 && p == 1 && (s == 1 || s == 2));
        if !supported {
            return Err(invalid(format!(
                "conv k{k} s{s} p{p}: only 1x1 and 3x3 pad-1 (stride 1 or 2) are implemented"
            )));
        }
        check_vec8(self.in_channels, "conv input")?;
        check_vec8(self.out_channels, "conv output")
    }

    /// Output dims for an `h x w` input.
    pub fn out_dims(&self, h: usize, w: usize) -> Nhwc {
        if self.kernel == 1 {
            Nhwc::new(h, w, self.out_channels)
        } else {
            Nhwc::new(
                conv3x3_out(h, self.stride),
                conv3x3_out(w, self.stride),
                self.out_channels,
            )
        }
    }

    /// im2col elements for the whole output of an `h x w` input (0 for a 1x1 conv); `forward`
    /// works in row chunks when its column buffer is smaller.
    pub fn cols_for(&self, h: usize, w: usize) -> usize {
        if self.kernel == 1 {
            0
        } else {
            self.out_dims(h, w).pixels() * 9 * self.in_channels
        }
    }

    /// Elements of one output row's im2col (the least column buffer `forward` can work with).
    pub fn cols_per_row(&self, w: usize) -> usize {
        if self.kernel == 1 {
            0
        } else {
            conv3x3_out(w, self.stride) * 9 * self.in_channels
        }
    }

    /// `y = conv(relu(x) if relu_input else x)` of each of `frames` maps; x `[frames][h][w][cin]`,
    /// y `[frames][oh][ow][cout]`. A 3x3 conv is one implicit-GEMM launch where
    /// [`ImplicitConv::plan`] says so (Hopper, large maps), else it goes through `cols` in as many
    /// output-row chunks as its length requires (the rows of all frames, in turn); a call's frames
    /// share its GEMMs.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        x: DevPtr<bf16>,
        frames: usize,
        (h, w): (usize, usize),
        relu_input: bool,
        cols: DevPtr<bf16>,
        y: DevPtr<bf16>,
    ) -> Result<Nhwc> {
        let inp = Nhwc::new(h, w, self.in_channels);
        let out = self.out_dims(h, w);
        x.check_len(frames * inp.len(), "conv input")?;
        y.check_len(frames * out.len(), "conv output")?;
        let weight = DevPtr::of(&self.weight);
        let bias = self.bias.as_ref().map(|b| DevPtr::of(&b.bf16));
        let epilogue = if bias.is_some() {
            Epilogue::Bias
        } else {
            Epilogue::None
        };
        if self.kernel == 1 {
            if relu_input {
                return Err(invalid(
                    "a 1x1 conv with a rectified input is not implemented".into(),
                ));
            }
            gemm.linear(
                dev,
                x,
                weight,
                bias,
                y,
                frames * out.pixels(),
                self.out_channels,
                self.in_channels,
                epilogue,
            )?;
            return Ok(out);
        }
        if let Some(implicit) = ImplicitConv::plan(self, &dev.info, frames, out) {
            return implicit.forward(dev, self, x, frames, inp, relu_input, y);
        }
        let per_row = self.cols_per_row(w);
        let out_rows = frames * out.h;
        let rows_per_chunk = (cols.len() / per_row).min(out_rows);
        if rows_per_chunk == 0 {
            return Err(invalid(format!(
                "conv column buffer of {} elements is smaller than one output row ({per_row})",
                cols.len()
            )));
        }
        let kk = 9 * self.in_channels;
        let mut r0 = 0;
        while r0 < out_rows {
            let nr = rows_per_chunk.min(out_rows - r0);
            let m = nr * out.w;
            im2col3x3(dev, x, inp, frames, self.stride, r0, nr, relu_input, cols)?;
            gemm.linear(
                dev,
                cols.slice(0, m * kk)?,
                weight,
                bias,
                y.slice(r0 * out.w * self.out_channels, m * self.out_channels)?,
                m,
                self.out_channels,
                kk,
                epilogue,
            )?;
            r0 += nr;
        }
        Ok(out)
    }
}

/// A transposed convolution with kernel == stride on the device: filter bf16 `[k][k][cout][cin]`
/// (GEMM rows ordered so that the scatter moves contiguous channel runs). Its GEMM adds the bias
/// repeated per (ky, kx), `[k][k][cout]`: [`Self::tiled_bias`] makes that once.
pub type DeviceConvTranspose = ConvTransposeUpsample<CudaSlice<bf16>, DeviceBias>;

impl DeviceConvTranspose {
    /// Whether the kernels implement this transposed convolution.
    pub fn check(&self) -> Result<()> {
        check_vec8(self.in_channels, "conv-transpose input")?;
        check_vec8(self.out_channels, "conv-transpose output")?;
        if self.kernel == 0 {
            return Err(invalid("conv-transpose with a zero kernel".into()));
        }
        Ok(())
    }

    /// The bias repeated for every (ky, kx), as the GEMM epilogue adds it (device copies only).
    pub fn tiled_bias(&self, dev: &CudaDevice) -> Result<CudaSlice<bf16>> {
        let (k, cout) = (self.kernel, self.out_channels);
        let mut tiled = dev.stream.alloc_zeros::<bf16>(k * k * cout)?;
        for t in 0..k * k {
            let mut dst = tiled.slice_mut(t * cout..(t + 1) * cout);
            dev.stream.memcpy_dtod(&self.bias.bf16, &mut dst)?;
        }
        Ok(tiled)
    }

    pub fn out_dims(&self, h: usize, w: usize) -> Nhwc {
        Nhwc::new(h * self.kernel, w * self.kernel, self.out_channels)
    }

    /// Elements of the GEMM result `tmp` that `forward` needs for an `h x w` input.
    pub fn tmp_for(&self, h: usize, w: usize) -> usize {
        h * w * self.kernel * self.kernel * self.out_channels
    }

    /// `y [h*k][w*k][cout] = convT(x [h][w][cin])` for each of `frames` maps back to back,
    /// through `tmp` (`frames` times [`Self::tmp_for`]). With kernel == stride no output pixel
    /// has two sources, so the frames are one map `frames * h` rows high.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        tiled_bias: DevPtr<bf16>,
        x: DevPtr<bf16>,
        frames: usize,
        (h, w): (usize, usize),
        tmp: DevPtr<bf16>,
        y: DevPtr<bf16>,
    ) -> Result<Nhwc> {
        let n = self.kernel * self.kernel * self.out_channels;
        let tmp = tmp.slice(0, frames * self.tmp_for(h, w))?;
        gemm.linear(
            dev,
            x,
            DevPtr::of(&self.weight),
            Some(tiled_bias),
            tmp,
            frames * h * w,
            n,
            self.in_channels,
            Epilogue::Bias,
        )?;
        pixel_shuffle(
            dev,
            tmp,
            Nhwc::new(frames * h, w, self.in_channels),
            self.kernel,
            self.out_channels,
            y,
        )?;
        Ok(self.out_dims(h, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two halves put back together are the CPU's full embedding of the whole map, value for
    /// value (the halves themselves come from one-row and one-column maps).
    #[test]
    fn uv_halves_rebuild_the_cpu_embedding() {
        for (c, h, w, aspect) in [
            (16, 5, 7, 1.4),
            (128, 27, 37, 518.0 / 378.0),
            (32, 1, 9, 0.5),
            (64, 9, 1, 2.0),
            (128, 378, 518, 518.0 / 378.0),
        ] {
            let (cols, rows) = uv_halves(Nhwc::new(h, w, c), aspect).expect("halves");
            let mut map = FeatureMap::zeros(c, h, w);
            add_uv_embedding(&mut map, aspect);
            let half = c / 2;
            for ch in 0..c {
                for y in 0..h {
                    for x in 0..w {
                        let want = map.data[(ch * h + y) * w + x];
                        let got = if ch < half {
                            cols[x * half + ch]
                        } else {
                            rows[y * half + ch - half]
                        };
                        assert_eq!(got.to_bits(), want.to_bits(), "c {c} ch {ch} at ({y}, {x})");
                    }
                }
            }
        }
    }

    #[test]
    fn uv_halves_refuse_what_the_kernels_cannot_index() {
        for dims in [Nhwc::new(4, 4, 8), Nhwc::new(0, 4, 16), Nhwc::new(4, 4, 24)] {
            let err = uv_halves(dims, 1.0).expect_err("refused");
            assert!(err.to_string().contains("multiple of 16"), "{err}");
        }
    }
}
