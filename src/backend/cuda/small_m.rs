//! The small-m linear layer (kernels/camera_head.cu's `cam_linear_*`): `y = x wᵀ + b` for a
//! handful of rows, streaming bf16 weights over every SM (one warp per output column; one row
//! at k = 2048 or 8192 takes the sweep form `cam_sweep_k*`, a CTA per contiguous block of
//! columns reading its weights in address order), with fused prologues (LayerNorm, the pose
//! embedding) and epilogues (bias, GELU, residual, modulation, K/V append, the pose branch).
//! Two rows (a two-frame step) take the two-row sweep `cam_sweep2_k*`. cuBLASLt is
//! latency-bound at m = 1; this is not. The camera head is its main user;
//! [`small_m_linear`] exposes the plain layer.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::{CudaDevice, CudaError};

fn invalid(msg: impl Into<String>) -> CudaError {
    CudaError::Invalid(msg.into())
}

pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| invalid(format!("small-m linear: {what} = {v} exceeds u32")))
}

/// Warps per CTA of the linear kernel (its `LIN_WARPS`); a warp owns one column group.
pub(crate) const LIN_WARPS: usize = 8;
pub(crate) const LIN_THREADS: u32 = 32 * LIN_WARPS as u32;
/// Largest row tile of the linear kernel (its entry points are for 1, 2, 4 and 8 rows).
pub(crate) const LIN_MAX_TILE: usize = 8;
/// Shared memory a prologue may use for its x tile (tile x k bf16) without opting in to more.
pub(crate) const LIN_SMEM_LIMIT: usize = 48 * 1024;

// The linear kernel's prologues and epilogues (LIN_PRO_* / LIN_EPI_* in camera_head.cu).
pub(crate) const PRO_NONE: u32 = 0;
pub(crate) const PRO_LN: u32 = 1;
pub(crate) const PRO_EMBED: u32 = 2;
pub(crate) const EPI_F32: u32 = 0;
pub(crate) const EPI_BF16: u32 = 1;
pub(crate) const EPI_BF16_GELU: u32 = 2;
pub(crate) const EPI_RESID: u32 = 3;
pub(crate) const EPI_MODULATE: u32 = 4;
pub(crate) const EPI_BRANCH: u32 = 5;

/// The linear kernel's argument (`LinArgs` in kernels/camera_head.cu, field for field: 24
/// addresses, then 16 32-bit values; 256 bytes). Null addresses are unused.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct LinArgs {
    pub(crate) x: u64,
    pub(crate) w: u64,
    pub(crate) bias: u64,
    pub(crate) src: u64,
    pub(crate) nw: u64,
    pub(crate) nb: u64,
    pub(crate) pose: u64,
    pub(crate) ew: u64,
    pub(crate) eb: u64,
    pub(crate) out_f32: u64,
    pub(crate) out_bf16: u64,
    pub(crate) h: u64,
    pub(crate) gamma: u64,
    pub(crate) mx: u64,
    pub(crate) mxn: u64,
    pub(crate) cache_k: u64,
    pub(crate) cache_v: u64,
    pub(crate) cache_len: u64,
    pub(crate) bw: u64,
    pub(crate) bb: u64,
    pub(crate) part: u64,
    pub(crate) counter: u64,
    pub(crate) raw: u64,
    pub(crate) pose_out: u64,
    pub(crate) rows: u32,
    pub(crate) n: u32,
    pub(crate) k: u32,
    pub(crate) x_stride: u32,
    pub(crate) prologue: u32,
    pub(crate) epilogue: u32,
    pub(crate) eps: f32,
    pub(crate) pose_stride: u32,
    pub(crate) capacity: u32,
    pub(crate) width: u32,
    /// Rows whose K/V go to the cache (qkv append): bit r for row r.
    pub(crate) append: u32,
    pub(crate) first: u32,
    pub(crate) groups: u32,
    pub(crate) group_stride: u32,
    /// Row r's cache slot is `cache_len[r]` (a two-frame step), not `*cache_len + r`.
    pub(crate) own_lens: u32,
    pub(crate) pad1: u32,
}

const _: () = assert!(size_of::<LinArgs>() == 256);

// SAFETY: LinArgs is repr(C), plain integers and floats, laid out as the kernel's struct.
unsafe impl DeviceRepr for LinArgs {}

/// Row tile of the linear kernel for `rows` rows: the smallest entry point (1, 2, 4, 8 rows)
/// that holds them, smaller when a prologue's x tile (tile x k bf16) would not fit in shared
/// memory.
pub(crate) fn lin_tile(rows: usize, k: usize, prologue: bool) -> Result<usize, CudaError> {
    let mut tile = rows.max(1).next_power_of_two().min(LIN_MAX_TILE);
    if prologue {
        while tile > 1 && tile * k * 2 > LIN_SMEM_LIMIT {
            tile /= 2;
        }
        if k * 2 > LIN_SMEM_LIMIT {
            return Err(invalid(format!(
                "camera head linear: a {k}-wide input row does not fit in shared memory"
            )));
        }
    }
    Ok(tile)
}

pub(crate) fn lin_name(nc3: bool, tile: usize) -> &'static str {
    match (nc3, tile) {
        (false, 1) => "cam_linear_m1",
        (false, 2) => "cam_linear_m2",
        (false, 4) => "cam_linear_m4",
        (false, _) => "cam_linear_m8",
        (true, 1) => "cam_linear3_m1",
        (true, 2) => "cam_linear3_m2",
        (true, 4) => "cam_linear3_m4",
        (true, _) => "cam_linear3_m8",
    }
}

/// CTAs of the linear kernel `name` resident on the whole GPU with `smem` bytes each.
pub(crate) fn lin_resident_ctas(
    dev: &CudaDevice,
    name: &str,
    smem: usize,
) -> Result<usize, CudaError> {
    let f = dev.kernels.get(name)?;
    let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(LIN_THREADS, smem, None)?;
    Ok((per_sm.max(1) * dev.info.sm_count.max(1)) as usize)
}

/// The sweep entry points (`cam_sweep*_k*` in camera_head.cu) by row tile (one row, two rows)
/// and k, and the most columns one of their CTAs takes (its `SWEEP_MAX_ROWS`).
pub(crate) const SWEEP_ENTRIES: [[(usize, &str); 2]; 2] = [
    [(2048, "cam_sweep_k2048"), (8192, "cam_sweep_k8192")],
    [(2048, "cam_sweep2_k2048"), (8192, "cam_sweep2_k8192")],
];
const SWEEP_MAX_ROWS: usize = 64;

/// The sweep entry point of a launch and its index (row tile, k) in [`SWEEP_ENTRIES`], where
/// it has one: one or two rows, one column a group, a k it is built for, aligned operands, not the
/// pose branch (whose epilogue reduces over the warps of the general form).
fn sweep_name(a: &LinArgs, nc3: bool, tile: usize) -> Option<(&'static str, (usize, usize))> {
    let aligned = a.w.is_multiple_of(16) && (a.prologue != PRO_NONE || a.x.is_multiple_of(16));
    if nc3 || a.epilogue == EPI_BRANCH || !aligned {
        return None;
    }
    let form = match tile {
        1 => 0,
        2 => 1,
        _ => return None,
    };
    SWEEP_ENTRIES[form]
        .iter()
        .position(|&(k, _)| k == a.k as usize)
        .map(|i| (SWEEP_ENTRIES[form][i].1, (form, i)))
}

/// CTAs of a sweep launch over `n` columns: every resident one, fewer when there are fewer
/// columns, more when a CTA would get more columns than it has room for.
fn sweep_grid_x(n: usize, resident: usize) -> usize {
    resident.min(n).max(n.div_ceil(SWEEP_MAX_ROWS)).max(1)
}

/// Resident CTAs of the linear kernel's entry points, measured once by their user.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinResident {
    /// By [NC = 3][log2 row tile].
    pub(crate) general: [[usize; 4]; 2],
    /// By [`SWEEP_ENTRIES`] index.
    pub(crate) sweep: [[usize; 2]; 2],
}

/// CTAs along x for `groups` column groups: one group per warp when they all fit at once, else
/// the fewest waves of resident CTAs, evened out so every warp walks the same number of groups.
fn lin_grid_x(groups: usize, resident: usize) -> usize {
    let needed = groups.div_ceil(LIN_WARPS).max(1);
    let waves = needed.div_ceil(resident.max(1));
    needed.div_ceil(waves)
}

/// Launches the linear kernel for `a` (everything but `groups`/`group_stride` filled in; NC = 3
/// column groups for the modulation, else 1). `resident` gives the resident CTAs of the entry
/// point for a tile (None: ask the driver).
///
/// # Safety
/// Every address in `a` must point at a live buffer as large as the launch reads or writes for
/// `a.rows`, `a.n`, `a.k` and the prologue / epilogue it selects.
pub(crate) unsafe fn launch_linear(
    dev: &CudaDevice,
    mut a: LinArgs,
    nc3: bool,
    resident: Option<&LinResident>,
) -> Result<(), CudaError> {
    let (rows, n, k) = (a.rows as usize, a.n as usize, a.k as usize);
    if rows == 0 || n == 0 || k == 0 {
        return Err(invalid(format!(
            "camera head linear: empty shape {rows} x {k} -> {n}"
        )));
    }
    let prologue = a.prologue != PRO_NONE;
    let tile = lin_tile(rows, k, prologue)?;
    let name = lin_name(nc3, tile);
    let smem = if prologue { tile * k * 2 } else { 0 };
    if nc3 {
        if !n.is_multiple_of(3) {
            return Err(invalid(
                "camera head linear: 3-column groups need n % 3 == 0",
            ));
        }
        a.groups = (n / 3) as u32;
        a.group_stride = (n / 3) as u32;
    } else {
        a.groups = n as u32;
        a.group_stride = 0;
    }
    let sweep = sweep_name(&a, nc3, tile);
    let name = sweep.map_or(name, |(name, _)| name);
    let resident = match (resident, sweep) {
        (Some(r), None) => r.general[usize::from(nc3)][tile.trailing_zeros() as usize],
        (Some(r), Some((_, (f, i)))) => r.sweep[f][i],
        (None, _) => lin_resident_ctas(dev, name, smem)?,
    };
    let grid_x = if sweep.is_some() {
        sweep_grid_x(n, resident)
    } else {
        lin_grid_x(a.groups as usize, resident)
    };
    let cfg = LaunchConfig {
        grid_dim: (grid_x as u32, rows.div_ceil(tile) as u32, 1),
        block_dim: (LIN_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let f = dev.kernels.get(name)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&a);
    // SAFETY: the caller guarantees the buffers behind `a`; the struct matches the kernel's.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// What [`small_m_linear`] writes.
#[derive(Clone, Copy, Debug)]
pub enum SmallMOut {
    /// `y = x wᵀ + b` in f32.
    F32(DevPtr<f32>),
    /// `bf16(x wᵀ + b)`.
    Bf16(DevPtr<bf16>),
    /// `bf16(GELU(bf16(x wᵀ + b)))` (exact erf GELU).
    Bf16Gelu(DevPtr<bf16>),
}

/// The camera head's small-m linear layer on its own (for tests and benchmarks): `y[r][n] =
/// x[r] · w[n] + bias[n]` for `rows` rows of `x` (bf16, `x_stride` elements apart), `w` bf16
/// `[n][k]`, f32 accumulation. Launches only.
#[allow(clippy::too_many_arguments)]
pub fn small_m_linear(
    dev: &CudaDevice,
    x: DevPtr<bf16>,
    x_stride: usize,
    w: DevPtr<bf16>,
    bias: Option<DevPtr<f32>>,
    out: SmallMOut,
    rows: usize,
    n: usize,
    k: usize,
) -> Result<(), CudaError> {
    if rows == 0 || n == 0 || k == 0 || x_stride < k {
        return Err(invalid(format!(
            "small_m_linear: {rows} rows of {k} (stride {x_stride}) -> {n}"
        )));
    }
    x.check_len((rows - 1) * x_stride + k, "small_m_linear x")?;
    w.check_len(n * k, "small_m_linear w")?;
    if let Some(b) = bias {
        b.check_len(n, "small_m_linear bias")?;
    }
    let mut a = LinArgs {
        x: x.addr(),
        w: w.addr(),
        bias: bias.map_or(0, |b| b.addr()),
        rows: u32_of(rows, "rows")?,
        n: u32_of(n, "n")?,
        k: u32_of(k, "k")?,
        x_stride: u32_of(x_stride, "x_stride")?,
        prologue: PRO_NONE,
        ..LinArgs::default()
    };
    u32_of(rows * n.max(x_stride), "elements")?;
    match out {
        SmallMOut::F32(y) => {
            y.check_len(rows * n, "small_m_linear y")?;
            a.out_f32 = y.addr();
            a.epilogue = EPI_F32;
        }
        SmallMOut::Bf16(y) | SmallMOut::Bf16Gelu(y) => {
            y.check_len(rows * n, "small_m_linear y")?;
            a.out_bf16 = y.addr();
            a.epilogue = if matches!(out, SmallMOut::Bf16(_)) {
                EPI_BF16
            } else {
                EPI_BF16_GELU
            };
        }
    }
    // SAFETY: every buffer was checked against the shape above; the rest of `a` is null.
    unsafe { launch_linear(dev, a, false, None) }
}
