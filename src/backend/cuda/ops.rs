//! The elementwise and normalisation operations of the GPU transformer blocks (kernels in
//! `kernels/transformer.cu`): LayerNorm, LayerScale residuals, exact GELU, the q/k/v split with
//! qk-norm and RoPE, DINO's patchify and token assembly, and strided copies.
//!
//! Every function only launches on `dev.stream` (no allocation, no synchronisation, no reads of
//! device data on the host), so all of them can be captured into the frame step's CUDA graph.
//! Values that change per frame (the RoPE frame index) are read by the kernel from device memory.
//! Semantics follow the CPU model (`src/model/ops/`, `block.rs`, `dino.rs`, `aggregator.rs`);
//! activations are token-major `[tokens][channels]`, math is f32, bf16 outputs are rounded once.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::{CudaDevice, CudaError};
use crate::model::spec::{
    DINO_REGISTERS, HEAD_DIM, PATCH, ROPE2D_BASE, ROPE2D_FREQS, ROPE3D_SPLIT, ROPE3D_THETA,
    SPECIAL_TOKENS,
};
/// Widest row [`layer_norm`] takes (256 threads x 8 values in registers).
pub const LAYER_NORM_MAX_COLS: usize = 2048;

/// Pairs of the 3D RoPE per axis (temporal, row, column): 10 / 11 / 11.
pub const ROPE3D_PAIRS: [usize; 3] = [
    ROPE3D_SPLIT[0] / 2,
    ROPE3D_SPLIT[1] / 2,
    ROPE3D_SPLIT[2] / 2,
];

/// Threads per CTA of the grid-stride elementwise kernels.
const THREADS: u32 = 256;
/// Grid-stride kernels never need more CTAs than this to fill any GPU.
const MAX_BLOCKS: usize = 1 << 16;
/// Warps per CTA of `qkv_split_norm_rope`; each takes one token's next
/// `QKV_HEADS_PER_WARP` heads (the constants of kernels/transformer.cu), 16 bytes a lane.
const QKV_WARPS: usize = 8;
const QKV_HEADS_PER_WARP: usize = 8;

fn product(a: usize, b: usize, what: &str) -> Result<usize, CudaError> {
    a.checked_mul(b)
        .ok_or_else(|| CudaError::Invalid(format!("{what}: {a} x {b} overflows")))
}

fn to_u32(v: usize, what: &str) -> Result<u32, CudaError> {
    u32::try_from(v)
        .map_err(|_| CudaError::Invalid(format!("{what} = {v} does not fit in 32 bits")))
}

/// Grid-stride launch over `n` elements (`n > 0`).
fn elementwise_cfg(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn require_aligned<T>(p: &DevPtr<T>, bytes: u64, what: &str) -> Result<(), CudaError> {
    if !p.addr().is_multiple_of(bytes) {
        return Err(CudaError::Invalid(format!(
            "{what}: address {:#x} is not {bytes}-byte aligned",
            p.addr()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

/// Rows per CTA and warps per row of the 1024-wide LayerNorm kernels (LN1K_ROWS_PER_CTA and
/// LN1K_WARPS_PER_ROW in kernels/transformer.cu).
const LN1K_ROWS_PER_CTA: u32 = 4;
const LN1K_WARPS_PER_ROW: u32 = 4;

/// The launch of the 1024-wide LayerNorm kernels over `rows` rows.
fn ln1k_cfg(rows: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(LN1K_ROWS_PER_CTA), 1, 1),
        block_dim: (32 * LN1K_WARPS_PER_ROW * LN1K_ROWS_PER_CTA, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Where [`layer_norm`] writes its `[rows][cols]` result.
#[derive(Debug, Clone, Copy)]
pub enum LnOut {
    /// GEMM input.
    Bf16(DevPtr<bf16>),
    /// f32 (heads, final norms).
    F32(DevPtr<f32>),
}

/// LayerNorm over each row of `x` (`[rows][cols]` f32), statistics in f32 (two passes: mean,
/// then the biased variance of `x - mean`), optional affine (`None` = no weight / no bias).
/// `cols <= LAYER_NORM_MAX_COLS`. May write in place (`out` = `x` as f32).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    dev: &CudaDevice,
    x: DevPtr<f32>,
    rows: usize,
    cols: usize,
    weight: Option<DevPtr<f32>>,
    bias: Option<DevPtr<f32>>,
    eps: f32,
    out: LnOut,
) -> Result<(), CudaError> {
    if cols == 0 || cols > LAYER_NORM_MAX_COLS {
        return Err(CudaError::Invalid(format!(
            "layer_norm: cols = {cols}, supported 1..={LAYER_NORM_MAX_COLS}"
        )));
    }
    let n = product(rows, cols, "layer_norm rows x cols")?;
    x.check_len(n, "layer_norm x")?;
    if let Some(w) = &weight {
        w.check_len(cols, "layer_norm weight")?;
    }
    if let Some(b) = &bias {
        b.check_len(cols, "layer_norm bias")?;
    }
    let (out_addr, out_bf16) = match out {
        LnOut::Bf16(p) => {
            p.check_len(n, "layer_norm out (bf16)")?;
            (p.addr(), 1u32)
        }
        LnOut::F32(p) => {
            p.check_len(n, "layer_norm out (f32)")?;
            (p.addr(), 0u32)
        }
    };
    if rows == 0 {
        return Ok(());
    }
    let x_addr = x.addr();
    let w_addr = weight.map_or(0u64, |w| w.addr());
    let b_addr = bias.map_or(0u64, |b| b.addr());
    // 1024-wide rows with 16-byte aligned buffers: the 1024-wide kernel.
    let aligned = [x_addr, w_addr, b_addr, out_addr]
        .iter()
        .all(|a| a.is_multiple_of(16));
    if cols == 1024 && aligned {
        let rows_u32 = to_u32(rows, "layer_norm rows")?;
        let cfg = ln1k_cfg(rows_u32);
        let f = dev.kernels.get("layer_norm_rows_1024")?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&x_addr)
            .arg(&rows_u32)
            .arg(&w_addr)
            .arg(&b_addr)
            .arg(&eps)
            .arg(&out_addr)
            .arg(&out_bf16);
        // SAFETY: the arguments match layer_norm_rows_1024; buffers hold rows x 1024 (weight /
        // bias: 1024) elements (checked) and are 16-byte aligned (checked).
        unsafe { b.launch(cfg) }?;
        return Ok(());
    }
    let cfg = LaunchConfig {
        grid_dim: (to_u32(rows, "layer_norm rows")?, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let cols_u32 = cols as u32;
    let f = dev.kernels.get("layer_norm_rows")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&x_addr)
        .arg(&cols_u32)
        .arg(&w_addr)
        .arg(&b_addr)
        .arg(&eps)
        .arg(&out_addr)
        .arg(&out_bf16);
    // SAFETY: the arguments match layer_norm_rows; every buffer was checked to hold rows x cols
    // (weight / bias: cols) elements, and cols fits the kernel's registers.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Residuals and activations

/// Where a kernel also copies the rows it updated: row `r` to `dst[r * stride ..]`.
#[derive(Clone, Copy, Debug)]
pub struct RowCopy {
    pub dst: DevPtr<f32>,
    pub stride: usize,
}

/// The LayerScale residual and the LayerNorm that follows it, as one pass where it can:
/// `resid[r] += gamma ⊙ y[r]`, then `out[r] = LN(resid[r])` (bf16), and with `copy` the updated
/// `resid` rows also copied there. 1024-wide rows with aligned buffers take one fused kernel
/// (bit-identical to the two-kernel path and its copy, which serve the rest).
#[allow(clippy::too_many_arguments)]
pub fn residual_layer_norm(
    dev: &CudaDevice,
    resid: DevPtr<f32>,
    y: DevPtr<bf16>,
    gamma: DevPtr<f32>,
    rows: usize,
    cols: usize,
    weight: Option<DevPtr<f32>>,
    bias: Option<DevPtr<f32>>,
    eps: f32,
    out: DevPtr<bf16>,
    copy: Option<RowCopy>,
) -> Result<(), CudaError> {
    let n = product(rows, cols, "residual_layer_norm rows x cols")?;
    resid.check_len(n, "residual_layer_norm resid")?;
    y.check_len(n, "residual_layer_norm y")?;
    out.check_len(n, "residual_layer_norm out")?;
    gamma.check_len(cols, "residual_layer_norm gamma")?;
    if let Some(w) = &weight {
        w.check_len(cols, "residual_layer_norm weight")?;
    }
    if let Some(b) = &bias {
        b.check_len(cols, "residual_layer_norm bias")?;
    }
    if let Some(c) = &copy {
        if c.stride < cols {
            return Err(CudaError::Invalid(format!(
                "residual_layer_norm: copy row stride {} < width {cols}",
                c.stride
            )));
        }
        if rows > 0 {
            c.dst
                .check_len((rows - 1) * c.stride + cols, "residual_layer_norm copy")?;
        }
    }
    if rows == 0 {
        return Ok(());
    }
    let (r, ya, g, o) = (resid.addr(), y.addr(), gamma.addr(), out.addr());
    let (w_addr, b_addr) = (weight.map_or(0, |w| w.addr()), bias.map_or(0, |b| b.addr()));
    let (copy_addr, copy_stride) = copy.map_or((0, 0), |c| (c.dst.addr(), c.stride as u64));
    let aligned = [r, g, w_addr, b_addr, copy_addr]
        .iter()
        .all(|a| a.is_multiple_of(16))
        && copy_stride.is_multiple_of(4)
        && ya.is_multiple_of(8)
        && o.is_multiple_of(8);
    if cols != 1024 || !aligned {
        residual_add_scaled(dev, resid, y, gamma, rows, cols)?;
        layer_norm(dev, resid, rows, cols, weight, bias, eps, LnOut::Bf16(out))?;
        if let Some(c) = copy {
            copy_rows(dev, resid, cols, c.dst, c.stride, rows, cols)?;
        }
        return Ok(());
    }
    let rows_u32 = to_u32(rows, "residual_layer_norm rows")?;
    let cfg = ln1k_cfg(rows_u32);
    let name = if copy.is_some() {
        "residual_layer_norm_copy_1024"
    } else {
        "residual_layer_norm_1024"
    };
    let f = dev.kernels.get(name)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&r)
        .arg(&ya)
        .arg(&g)
        .arg(&rows_u32)
        .arg(&w_addr)
        .arg(&b_addr)
        .arg(&eps)
        .arg(&o);
    if copy.is_some() {
        b.arg(&copy_addr).arg(&copy_stride);
    }
    // SAFETY: the arguments match residual_layer_norm(_copy)_1024; every buffer holds rows x 1024
    // (gamma / weight / bias: 1024) elements (checked) with the alignment its vector loads need;
    // the copy (or null) holds `rows` rows `copy_stride` apart (checked).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// LayerScale residual: `resid[r][c] += gamma[c] * y[r][c]`.
pub fn residual_add_scaled(
    dev: &CudaDevice,
    resid: DevPtr<f32>,
    y: DevPtr<bf16>,
    gamma: DevPtr<f32>,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let n = product(rows, cols, "residual_add_scaled rows x cols")?;
    resid.check_len(n, "residual_add_scaled resid")?;
    y.check_len(n, "residual_add_scaled y")?;
    gamma.check_len(cols, "residual_add_scaled gamma")?;
    if n == 0 {
        return Ok(());
    }
    let (r, ya, g) = (resid.addr(), y.addr(), gamma.addr());
    let cols_u32 = to_u32(cols, "residual_add_scaled cols")?;
    // Four elements per access when rows split into aligned groups of 4.
    let x4 = cols.is_multiple_of(4)
        && r.is_multiple_of(16)
        && g.is_multiple_of(16)
        && ya.is_multiple_of(8);
    let (name, units) = if x4 {
        ("residual_add_scaled_x4", n / 4)
    } else {
        ("residual_add_scaled", n)
    };
    let units_u64 = units as u64;
    let f = dev.kernels.get(name)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&r).arg(&ya).arg(&g).arg(&cols_u32).arg(&units_u64);
    // SAFETY: arguments match residual_add_scaled(_x4); lengths checked above, the x4 kernel
    // only with cols % 4 == 0 (so n % 4 == 0) and 16/8-byte aligned addresses.
    unsafe { b.launch(elementwise_cfg(units)) }?;
    Ok(())
}

/// Exact (erf) GELU in place on `n` bf16 values.
pub fn gelu_erf_inplace(dev: &CudaDevice, x: DevPtr<bf16>, n: usize) -> Result<(), CudaError> {
    x.check_len(n, "gelu_erf_inplace x")?;
    if n == 0 {
        return Ok(());
    }
    let a = x.addr();
    let x4 = n.is_multiple_of(4) && a.is_multiple_of(8);
    let (name, units) = if x4 {
        ("gelu_erf_bf16_x4", n / 4)
    } else {
        ("gelu_erf_bf16", n)
    };
    let units_u64 = units as u64;
    let f = dev.kernels.get(name)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&a).arg(&units_u64);
    // SAFETY: arguments match gelu_erf_bf16(_x4); length checked above, the x4 kernel only with
    // n % 4 == 0 and an 8-byte aligned address.
    unsafe { b.launch(elementwise_cfg(units)) }?;
    Ok(())
}

/// `x[r][c] = gelu_erf(x[r][c] + bias[c])` in place, the sum and GELU in f32, one rounding.
pub fn add_bias_gelu_erf(
    dev: &CudaDevice,
    x: DevPtr<bf16>,
    bias: DevPtr<bf16>,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let n = product(rows, cols, "add_bias_gelu_erf rows x cols")?;
    x.check_len(n, "add_bias_gelu_erf x")?;
    bias.check_len(cols, "add_bias_gelu_erf bias")?;
    if n == 0 {
        return Ok(());
    }
    let (a, ba) = (x.addr(), bias.addr());
    let cols_u32 = to_u32(cols, "add_bias_gelu_erf cols")?;
    let x4 = cols.is_multiple_of(4) && a.is_multiple_of(8) && ba.is_multiple_of(8);
    let (name, units) = if x4 {
        ("add_bias_gelu_erf_bf16_x4", n / 4)
    } else {
        ("add_bias_gelu_erf_bf16", n)
    };
    let units_u64 = units as u64;
    let f = dev.kernels.get(name)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&a).arg(&ba).arg(&cols_u32).arg(&units_u64);
    // SAFETY: arguments match add_bias_gelu_erf_bf16(_x4); lengths checked above, the x4 kernel
    // only with cols % 4 == 0 and 8-byte aligned addresses.
    unsafe { b.launch(elementwise_cfg(units)) }?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// RoPE tables

/// The RoPE tables on the host, as interleaved `(cos, sin)` f32 pairs, exactly the values
/// `src/model/ops/rope.rs` uses (2D: formed in f32 as there; 3D: f64 then rounded to f32).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeHostTables {
    /// 2D: `[position][ROPE2D_FREQS][2]`, positions `0..=max(grid_h, grid_w)`.
    pub axial2d: Vec<f32>,
    /// 3D temporal: `[max_frame_num][10][2]`.
    pub temporal: Vec<f32>,
    /// 3D row: `[SPECIAL_TOKENS + grid_h][11][2]`.
    pub rows: Vec<f32>,
    /// 3D column: `[SPECIAL_TOKENS + grid_w][11][2]`.
    pub cols: Vec<f32>,
    pub max_frame_num: usize,
    pub grid_h: usize,
    pub grid_w: usize,
}

impl RopeHostTables {
    pub fn new(max_frame_num: usize, grid_h: usize, grid_w: usize) -> Self {
        // 2D, as apply_rope_2d forms it: inv_freq = 1 / base^(2j / half) and the angle p * f,
        // all in f32.
        let half = HEAD_DIM / 2;
        let inv_freq: Vec<f32> = (0..ROPE2D_FREQS)
            .map(|j| 1.0f32 / ROPE2D_BASE.powf((2 * j) as f32 / half as f32))
            .collect();
        let positions_2d = grid_h.max(grid_w) + 1;
        let mut axial2d = Vec::with_capacity(positions_2d * ROPE2D_FREQS * 2);
        for p in 0..positions_2d {
            for &f in &inv_freq {
                let a = p as f32 * f;
                axial2d.extend([a.cos(), a.sin()]);
            }
        }
        // 3D, as rope_3d_table forms it: freq_i = 1 / theta^(2i / d) and the angle in f64.
        let axis = |positions: usize, dim: usize| {
            let freqs: Vec<f64> = (0..dim / 2)
                .map(|i| 1.0 / ROPE3D_THETA.powf((2 * i) as f64 / dim as f64))
                .collect();
            let mut t = Vec::with_capacity(positions * freqs.len() * 2);
            for p in 0..positions {
                for &w in &freqs {
                    let a = p as f64 * w;
                    t.extend([a.cos() as f32, a.sin() as f32]);
                }
            }
            t
        };
        RopeHostTables {
            axial2d,
            temporal: axis(max_frame_num, ROPE3D_SPLIT[0]),
            rows: axis(SPECIAL_TOKENS + grid_h, ROPE3D_SPLIT[1]),
            cols: axis(SPECIAL_TOKENS + grid_w, ROPE3D_SPLIT[2]),
            max_frame_num,
            grid_h,
            grid_w,
        }
    }
}

/// The RoPE tables on the device, built once per session (for the session's patch grid).
pub struct RopeTables {
    axial2d: CudaSlice<f32>,
    temporal: CudaSlice<f32>,
    rows: CudaSlice<f32>,
    cols: CudaSlice<f32>,
    max_frame_num: usize,
    grid_h: usize,
    grid_w: usize,
}

impl RopeTables {
    /// 2D table for positions `0..=max(grid_h, grid_w)`; 3D tables for frames
    /// `0..max_frame_num`, rows `0..6 + grid_h`, columns `0..6 + grid_w`.
    pub fn new(
        dev: &CudaDevice,
        max_frame_num: usize,
        grid_h: usize,
        grid_w: usize,
    ) -> Result<Self, CudaError> {
        if max_frame_num == 0 || grid_h == 0 || grid_w == 0 {
            return Err(CudaError::Invalid(format!(
                "RopeTables: max_frame_num {max_frame_num}, grid {grid_h} x {grid_w} must all be positive"
            )));
        }
        if u32::try_from(max_frame_num).is_err() {
            return Err(CudaError::Invalid(format!(
                "RopeTables: max_frame_num {max_frame_num} does not fit in 32 bits"
            )));
        }
        let host = RopeHostTables::new(max_frame_num, grid_h, grid_w);
        Ok(RopeTables {
            axial2d: dev.stream.clone_htod(&host.axial2d)?,
            temporal: dev.stream.clone_htod(&host.temporal)?,
            rows: dev.stream.clone_htod(&host.rows)?,
            cols: dev.stream.clone_htod(&host.cols)?,
            max_frame_num,
            grid_h,
            grid_w,
        })
    }

    pub fn max_frame_num(&self) -> usize {
        self.max_frame_num
    }

    /// The largest patch grid (rows, columns) the tables cover.
    pub fn grid(&self) -> (usize, usize) {
        (self.grid_h, self.grid_w)
    }
}

// ---------------------------------------------------------------------------------------------
// q/k/v split, qk-norm, RoPE

/// Per-head LayerNorm(64) of q and k (aggregator blocks), applied before RoPE.
#[derive(Debug, Clone, Copy)]
pub struct QkNorm {
    pub q_weight: DevPtr<f32>,
    pub q_bias: DevPtr<f32>,
    pub k_weight: DevPtr<f32>,
    pub k_bias: DevPtr<f32>,
    pub eps: f32,
}

/// The rotary embedding applied to q and k. Token `n` is token `t = n % tokens_per_frame` of
/// local frame `s = n / tokens_per_frame`; `t < 6` are the special tokens, `t >= 6` the patch
/// `t - 6` of a row-major grid `grid_w` wide.
#[derive(Clone, Copy)]
pub enum Rope<'a> {
    None,
    /// Frame blocks: specials at (0, 0), patch (r, c) at (r + 1, c + 1), rotate-half, base 100.
    Axial2d {
        tables: &'a RopeTables,
        tokens_per_frame: usize,
        grid_w: usize,
    },
    /// Global blocks: specials j at (f, j, j), patch (r, c) at (f, 6 + r, 6 + c), interleaved
    /// pairs, with `f = frame_index[s]` (local frame s of the call) read on the device. A frame at or past the tables'
    /// `max_frame_num` gets NaN q and k (the caller checks the count before the step).
    Video3d {
        tables: &'a RopeTables,
        tokens_per_frame: usize,
        grid_w: usize,
        frame_index: DevPtr<u32>,
    },
}

/// Kernel arguments of a [`Rope`], validated.
struct RopeArgs {
    mode: u32,
    tokens_per_frame: u32,
    grid_w: u32,
    axial2d: u64,
    temporal: u64,
    rows: u64,
    cols: u64,
    frame_index: u64,
    max_frame: u32,
}

impl RopeArgs {
    fn of(rope: &Rope<'_>, n_tokens: usize) -> Result<Self, CudaError> {
        let (mode, tables, tokens_per_frame, grid_w, frame_index) = match *rope {
            Rope::None => {
                return Ok(RopeArgs {
                    mode: 0,
                    tokens_per_frame: 1,
                    grid_w: 1,
                    axial2d: 0,
                    temporal: 0,
                    rows: 0,
                    cols: 0,
                    frame_index: 0,
                    max_frame: 0,
                });
            }
            Rope::Axial2d {
                tables,
                tokens_per_frame,
                grid_w,
            } => (1, tables, tokens_per_frame, grid_w, 0u64),
            Rope::Video3d {
                tables,
                tokens_per_frame,
                grid_w,
                frame_index,
            } => {
                let frames = n_tokens.div_ceil(tokens_per_frame.max(1)).max(1);
                frame_index.check_len(frames, "qkv_split_norm_rope frame_index")?;
                (2, tables, tokens_per_frame, grid_w, frame_index.addr())
            }
        };
        let patches = tokens_per_frame.saturating_sub(SPECIAL_TOKENS);
        if tokens_per_frame <= SPECIAL_TOKENS || grid_w == 0 || !patches.is_multiple_of(grid_w) {
            return Err(CudaError::Invalid(format!(
                "qkv_split_norm_rope: {tokens_per_frame} tokens per frame is not {SPECIAL_TOKENS} + a grid {grid_w} wide"
            )));
        }
        let grid_h = patches / grid_w;
        let (th, tw) = tables.grid();
        if grid_h > th || grid_w > tw {
            return Err(CudaError::Invalid(format!(
                "qkv_split_norm_rope: grid {grid_h} x {grid_w} exceeds the RoPE tables' {th} x {tw}"
            )));
        }
        if !n_tokens.is_multiple_of(tokens_per_frame) {
            return Err(CudaError::Invalid(format!(
                "qkv_split_norm_rope: {n_tokens} tokens are not whole frames of {tokens_per_frame}"
            )));
        }
        Ok(RopeArgs {
            mode,
            tokens_per_frame: to_u32(tokens_per_frame, "tokens_per_frame")?,
            grid_w: to_u32(grid_w, "grid_w")?,
            axial2d: DevPtr::of(&tables.axial2d).addr(),
            temporal: DevPtr::of(&tables.temporal).addr(),
            rows: DevPtr::of(&tables.rows).addr(),
            cols: DevPtr::of(&tables.cols).addr(),
            frame_index,
            max_frame: tables.max_frame_num as u32,
        })
    }
}

/// Splits the qkv projection `[n][3][heads][64]` into q, k, v `[n][heads][64]` (bf16), with the
/// optional per-head LayerNorm of q and k and then RoPE on q and k, in f32 with one rounding;
/// v is copied unchanged. `norm: None, rope: Rope::None` is the plain split (DINO).
#[allow(clippy::too_many_arguments)]
pub fn qkv_split_norm_rope(
    dev: &CudaDevice,
    qkv: DevPtr<bf16>,
    q: DevPtr<bf16>,
    k: DevPtr<bf16>,
    v: DevPtr<bf16>,
    n_tokens: usize,
    heads: usize,
    norm: Option<QkNorm>,
    rope: Rope<'_>,
) -> Result<(), CudaError> {
    let n = product(
        n_tokens,
        heads * HEAD_DIM,
        "qkv_split_norm_rope tokens x heads x 64",
    )?;
    k.check_len(n, "qkv_split_norm_rope k")?;
    v.check_len(n, "qkv_split_norm_rope v")?;
    require_aligned(&k, 16, "qkv_split_norm_rope k")?;
    require_aligned(&v, 16, "qkv_split_norm_rope v")?;
    launch_qkv(
        dev,
        qkv,
        q,
        KvDest::Rows { k, v },
        n_tokens,
        heads,
        norm,
        rope,
    )
}

/// Where a cache layer's step K/V go when [`qkv_split_norm_rope_to_pages`] writes them
/// straight into the pages (made by `DeviceKvCache::page_writer`, which checked the runs).
#[derive(Debug, Clone, Copy)]
pub struct PagedKvDest {
    /// The layer's pool `[page][K|V][heads][page_size][64]`.
    pub pool: u64,
    /// The step's write runs `[src_token, page, slot, len]` and their count (device memory).
    pub runs: u64,
    pub n_runs: u64,
    pub page_size: u32,
}

#[derive(Clone, Copy)]
enum KvDest {
    Rows { k: DevPtr<bf16>, v: DevPtr<bf16> },
    Pages(PagedKvDest),
}

/// As [`qkv_split_norm_rope`], with K and V written into the cache pages named by the step's
/// write runs instead of into rows (one pass fewer than rows + `kv_write_tokens`).
#[allow(clippy::too_many_arguments)]
pub fn qkv_split_norm_rope_to_pages(
    dev: &CudaDevice,
    qkv: DevPtr<bf16>,
    q: DevPtr<bf16>,
    dest: PagedKvDest,
    n_tokens: usize,
    heads: usize,
    norm: Option<QkNorm>,
    rope: Rope<'_>,
) -> Result<(), CudaError> {
    launch_qkv(
        dev,
        qkv,
        q,
        KvDest::Pages(dest),
        n_tokens,
        heads,
        norm,
        rope,
    )
}

#[allow(clippy::too_many_arguments)]
fn launch_qkv(
    dev: &CudaDevice,
    qkv: DevPtr<bf16>,
    q: DevPtr<bf16>,
    kv: KvDest,
    n_tokens: usize,
    heads: usize,
    norm: Option<QkNorm>,
    rope: Rope<'_>,
) -> Result<(), CudaError> {
    if heads == 0 {
        return Err(CudaError::Invalid("qkv_split_norm_rope: heads = 0".into()));
    }
    let row = product(heads, HEAD_DIM, "qkv_split_norm_rope heads x 64")?;
    let n = product(n_tokens, row, "qkv_split_norm_rope tokens x heads x 64")?;
    qkv.check_len(
        product(n, 3, "qkv_split_norm_rope qkv")?,
        "qkv_split_norm_rope qkv",
    )?;
    q.check_len(n, "qkv_split_norm_rope q")?;
    // Each lane moves eight bf16 as one 16-byte word.
    for (p, what) in [(&qkv, "qkv"), (&q, "q")] {
        require_aligned(p, 16, &format!("qkv_split_norm_rope {what}"))?;
    }
    let (qw, qb, kw, kb, eps) = match &norm {
        Some(nm) => {
            nm.q_weight.check_len(HEAD_DIM, "qk-norm q_weight")?;
            nm.q_bias.check_len(HEAD_DIM, "qk-norm q_bias")?;
            nm.k_weight.check_len(HEAD_DIM, "qk-norm k_weight")?;
            nm.k_bias.check_len(HEAD_DIM, "qk-norm k_bias")?;
            (
                nm.q_weight.addr(),
                nm.q_bias.addr(),
                nm.k_weight.addr(),
                nm.k_bias.addr(),
                nm.eps,
            )
        }
        None => (0, 0, 0, 0, 0.0f32),
    };
    let r = RopeArgs::of(&rope, n_tokens)?;
    let items = product(
        n_tokens,
        heads.div_ceil(QKV_HEADS_PER_WARP),
        "qkv_split_norm_rope tokens x head groups",
    )?;
    if items == 0 {
        return Ok(());
    }
    // The kernel numbers its (token, head group) items in 32 bits.
    to_u32(
        items + QKV_WARPS,
        "qkv_split_norm_rope tokens x head groups",
    )?;
    let cfg = LaunchConfig {
        grid_dim: (
            to_u32(items.div_ceil(QKV_WARPS), "qkv_split_norm_rope blocks")?,
            1,
            1,
        ),
        block_dim: ((QKV_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (k_a, v_a, pages) = match kv {
        KvDest::Rows { k, v } => (k.addr(), v.addr(), None),
        KvDest::Pages(d) => {
            if !d.pool.is_multiple_of(16) {
                return Err(CudaError::Invalid(format!(
                    "qkv_split_norm_rope pages: pool address {:#x} is not 16-byte aligned",
                    d.pool
                )));
            }
            (0, 0, Some(d))
        }
    };
    let (pool, runs, n_runs, page_size) =
        pages.map_or((0, 0, 0, 0), |d| (d.pool, d.runs, d.n_runs, d.page_size));
    let (qkv_a, q_a) = (qkv.addr(), q.addr());
    let n_u32 = to_u32(n_tokens, "qkv_split_norm_rope n_tokens")?;
    let heads_u32 = to_u32(heads, "qkv_split_norm_rope heads")?;
    let f = dev.kernels.get("qkv_split_norm_rope")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&qkv_a)
        .arg(&q_a)
        .arg(&k_a)
        .arg(&v_a)
        .arg(&n_u32)
        .arg(&heads_u32)
        .arg(&qw)
        .arg(&qb)
        .arg(&kw)
        .arg(&kb)
        .arg(&eps)
        .arg(&r.mode)
        .arg(&r.tokens_per_frame)
        .arg(&r.grid_w)
        .arg(&r.axial2d)
        .arg(&r.temporal)
        .arg(&r.rows)
        .arg(&r.cols)
        .arg(&r.frame_index)
        .arg(&r.max_frame)
        .arg(&pool)
        .arg(&runs)
        .arg(&n_runs)
        .arg(&page_size);
    // SAFETY: arguments match qkv_split_norm_rope; buffers checked for length and alignment,
    // the grid checked against the tables (positions stay inside them; frame indices past the
    // temporal table are not read, the kernel writes NaN instead).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// DINO input

/// ImageNet-normalised patches of `image` (`[3][height][width]` f32 RGB in [0, 1]) as GEMM rows:
/// `out` `[Np][row_len]` bf16, columns (channel, ky, kx) then zeros up to `row_len` (at least
/// `3 * 14 * 14`; [`patch_row_len`] pads it to whole 16-byte words), patches row-major over the
/// `(height / 14) x (width / 14)` grid; `gemm.linear(out, proj_weight as [C][row_len], bias)` is
/// the stride-14 patch convolution.
pub fn patchify_normalized(
    dev: &CudaDevice,
    image: DevPtr<f32>,
    height: usize,
    width: usize,
    out: DevPtr<bf16>,
    row_len: usize,
) -> Result<(), CudaError> {
    if height == 0 || width == 0 || !height.is_multiple_of(PATCH) || !width.is_multiple_of(PATCH) {
        return Err(CudaError::Invalid(format!(
            "patchify_normalized: image {width} x {height} is not a positive multiple of the patch size {PATCH}"
        )));
    }
    let cols = 3 * PATCH * PATCH;
    if row_len < cols {
        return Err(CudaError::Invalid(format!(
            "patchify_normalized: rows of {row_len} values cannot hold a patch's {cols}"
        )));
    }
    let pixels = product(height, width, "patchify_normalized height x width")?;
    image.check_len(
        product(3, pixels, "patchify_normalized image")?,
        "patchify_normalized image",
    )?;
    let elements = product(pixels / (PATCH * PATCH), row_len, "patchify_normalized out")?;
    out.check_len(elements, "patchify_normalized out")?;
    let (img_a, out_a) = (image.addr(), out.addr());
    let h_u32 = to_u32(height, "patchify_normalized height")?;
    let w_u32 = to_u32(width, "patchify_normalized width")?;
    let row_len_u32 = to_u32(row_len, "patchify_normalized row length")?;
    let patch = PATCH as u32;
    let f = dev.kernels.get("patchify_normalized")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&img_a)
        .arg(&h_u32)
        .arg(&w_u32)
        .arg(&patch)
        .arg(&out_a)
        .arg(&row_len_u32);
    // SAFETY: arguments match patchify_normalized; lengths checked above.
    unsafe { b.launch(elementwise_cfg(elements)) }?;
    Ok(())
}

/// The patch rows' length for `patchify_normalized`: `3 * patch * patch` rounded up to whole
/// 16-byte words of bf16. cuBLASLt picks its Hopper kernels only for 16-byte aligned rows; at
/// 588 columns it fell back to an sm_80 WMMA kernel with 2-element alignment (H100, Nsight
/// Compute: 42.5 us of DINO's 2.64 ms for the patch embedding alone).
pub fn patch_row_len(patch: usize) -> usize {
    (3 * patch * patch).next_multiple_of(8)
}

/// DINO's token sequence `out` `[1 + 4 + np][c]` f32: `[cls + pos[0], registers 0..4 (no
/// position), patch_emb[i] + pos[1 + i]]` (as `DinoBackbone::forward`). `pos` is the position
/// table already interpolated for this grid, `[1 + np][c]`.
#[allow(clippy::too_many_arguments)]
pub fn dino_assemble(
    dev: &CudaDevice,
    patch_emb: DevPtr<bf16>,
    cls: DevPtr<f32>,
    registers: DevPtr<f32>,
    pos: DevPtr<f32>,
    out: DevPtr<f32>,
    np: usize,
    c: usize,
) -> Result<(), CudaError> {
    patch_emb.check_len(
        product(np, c, "dino_assemble patch_emb")?,
        "dino_assemble patch_emb",
    )?;
    cls.check_len(c, "dino_assemble cls")?;
    registers.check_len(
        product(DINO_REGISTERS, c, "dino_assemble registers")?,
        "dino_assemble registers",
    )?;
    pos.check_len(
        product(1 + np, c, "dino_assemble pos")?,
        "dino_assemble pos",
    )?;
    let n = product(1 + DINO_REGISTERS + np, c, "dino_assemble out")?;
    out.check_len(n, "dino_assemble out")?;
    if c == 0 {
        return Ok(());
    }
    let (pe, cl, rg, po, o) = (
        patch_emb.addr(),
        cls.addr(),
        registers.addr(),
        pos.addr(),
        out.addr(),
    );
    let np_u32 = to_u32(np, "dino_assemble np")?;
    let c_u32 = to_u32(c, "dino_assemble c")?;
    let f = dev.kernels.get("dino_assemble")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&pe)
        .arg(&cl)
        .arg(&rg)
        .arg(&po)
        .arg(&o)
        .arg(&np_u32)
        .arg(&c_u32);
    // SAFETY: arguments match dino_assemble; lengths checked above.
    unsafe { b.launch(elementwise_cfg(n)) }?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Copies

/// Strided 2D copy (strides in elements): `dst[r * dst_stride + c] = src[r * src_stride + c]`
/// for `r < rows`, `c < cols`. Builds the heads' `cat(frame_out, global_out)` rows.
pub fn copy_rows(
    dev: &CudaDevice,
    src: DevPtr<f32>,
    src_stride: usize,
    dst: DevPtr<f32>,
    dst_stride: usize,
    rows: usize,
    cols: usize,
) -> Result<(), CudaError> {
    if cols > src_stride || cols > dst_stride {
        return Err(CudaError::Invalid(format!(
            "copy_rows: {cols} columns do not fit the strides (src {src_stride}, dst {dst_stride})"
        )));
    }
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let span = |stride: usize, what: &str| {
        product(rows - 1, stride, what)?
            .checked_add(cols)
            .ok_or_else(|| CudaError::Invalid(format!("{what}: size overflows")))
    };
    src.check_len(span(src_stride, "copy_rows src")?, "copy_rows src")?;
    dst.check_len(span(dst_stride, "copy_rows dst")?, "copy_rows dst")?;
    let n = product(rows, cols, "copy_rows rows x cols")?;
    let (s, d) = (src.addr(), dst.addr());
    let (ss, ds) = (src_stride as u64, dst_stride as u64);
    let cols_u32 = to_u32(cols, "copy_rows cols")?;
    let n_u64 = n as u64;
    let f = dev.kernels.get("copy_rows_f32")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&s)
        .arg(&ss)
        .arg(&d)
        .arg(&ds)
        .arg(&cols_u32)
        .arg(&n_u64);
    // SAFETY: arguments match copy_rows_f32; both spans checked above.
    unsafe { b.launch(elementwise_cfg(n)) }?;
    Ok(())
}

/// `dst[i] = bf16(src[i])` (round to nearest even) for `i < n`.
pub fn f32_to_bf16(
    dev: &CudaDevice,
    src: DevPtr<f32>,
    dst: DevPtr<bf16>,
    n: usize,
) -> Result<(), CudaError> {
    src.check_len(n, "f32_to_bf16 src")?;
    dst.check_len(n, "f32_to_bf16 dst")?;
    if n == 0 {
        return Ok(());
    }
    let (s, d) = (src.addr(), dst.addr());
    let n_u64 = n as u64;
    let f = dev.kernels.get("f32_to_bf16_kernel")?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&s).arg(&d).arg(&n_u64);
    // SAFETY: arguments match f32_to_bf16_kernel; lengths checked above.
    unsafe { b.launch(elementwise_cfg(n)) }?;
    Ok(())
}
