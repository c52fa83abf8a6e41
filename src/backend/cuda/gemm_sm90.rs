//! The Hopper linear layer (kernels/gemm_sm90.cu): `y[m][n] = x[m][k] · w[n][k]ᵀ (+ bias) (GELU)`
//! in bf16 with f32 accumulation, one tile shape per entry point, operands loaded by TMA.
//! [`super::gemm::Gemm`] times these shapes beside cuBLASLt's candidates and keeps whichever is
//! fastest for each product (`Tuning::Measure`); at m ≈ 1005 the shapes that make one wave of
//! CTAs on 132 SMs are what cuBLASLt lacks (docs/gpu-model.md).

use cudarc::driver::sys::{
    self, CUfunction_attribute, CUresult, CUtensorMap, CUtensorMapDataType,
    CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::arena::DevPtr;
use super::gemm::Epilogue;
use super::ops::QkvSplitArgs;
use super::{CudaDevice, CudaError};
use half::bf16;

/// Columns of k per pipeline stage (the kernel's `GEMM_BK`: one 128-byte swizzle row of bf16).
pub const K_SLICE: usize = 64;
/// Shared memory the kernel's ring may take (its `GemmTile::STAGES` rule).
const RING_BYTES: usize = 192 * 1024;
const MAX_STAGES: usize = 8;

/// One entry point of kernels/gemm_sm90.cu: a CTA computes `rows() x cols()` of the output with
/// `rows() / 64` consumer warpgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmTileShape {
    entry: &'static str,
    rows: usize,
    cols: usize,
}

const fn shape(entry: &'static str, rows: usize, cols: usize) -> GemmTileShape {
    GemmTileShape { entry, rows, cols }
}

impl GemmTileShape {
    /// Every entry point (`GEMM_ENTRY` in kernels/gemm_sm90.cu, and the registry's list).
    pub const ALL: [Self; 6] = [
        shape("gemm_bf16_sm90_m128n256", 128, 256),
        shape("gemm_bf16_sm90_m128n192", 128, 192),
        shape("gemm_bf16_sm90_m128n128", 128, 128),
        shape("gemm_bf16_sm90_m128n64", 128, 64),
        shape("gemm_bf16_sm90_m64n128", 64, 128),
        shape("gemm_bf16_sm90_m64n64", 64, 64),
    ];

    /// The kernel's entry point.
    pub fn entry(self) -> &'static str {
        self.entry
    }

    /// Output rows of one CTA (64 per consumer warpgroup).
    pub fn rows(self) -> usize {
        self.rows
    }

    /// Output columns of one CTA.
    pub fn cols(self) -> usize {
        self.cols
    }

    fn threads(self) -> u32 {
        (self.rows() / 64 + 1) as u32 * 128
    }

    /// Pipeline stages: as many A + B slices as fit in the ring, at most eight.
    pub fn stages(self) -> usize {
        let stage = (self.rows() + self.cols()) * K_SLICE * 2;
        (RING_BYTES / stage).min(MAX_STAGES)
    }

    /// Dynamic shared memory: alignment slack, the ring, a full and an empty mbarrier per stage.
    pub fn smem_bytes(self) -> u32 {
        let stage = (self.rows() + self.cols()) * K_SLICE * 2;
        (1024 + self.stages() * (stage + 16)) as u32
    }

    /// Whether this shape computes an `m x n x k` product (any m; n in whole tiles; k in whole
    /// slices).
    pub fn fits(self, m: usize, n: usize, k: usize) -> bool {
        m > 0 && k > 0 && k.is_multiple_of(K_SLICE) && n.is_multiple_of(self.cols())
    }

    /// CTAs of one launch for `m x n`.
    pub fn ctas(self, m: usize, n: usize) -> usize {
        m.div_ceil(self.rows()) * (n / self.cols())
    }

    /// How `bench` and the tuning records name it.
    pub fn label(self) -> String {
        format!("wgmma m{}n{}", self.rows, self.cols)
    }
}

/// The shapes this device can run for an `m x n x k` product (none off Hopper).
pub fn shapes_for(dev: &CudaDevice, m: usize, n: usize, k: usize) -> Vec<GemmTileShape> {
    GemmTileShape::ALL
        .into_iter()
        .filter(|s| s.fits(m, n, k) && dev.kernels.has(s.entry()))
        .collect()
}

/// A `CUtensorMap` (128 bytes, 64-byte aligned) as the kernel takes it
/// (`const __grid_constant__ TmaDesc`).
#[derive(Clone, Copy)]
#[repr(transparent)]
struct TensorMap(CUtensorMap);

// SAFETY: a plain 128-byte value with the alignment the kernel declares for it.
unsafe impl DeviceRepr for TensorMap {}

impl TensorMap {
    /// The row-major bf16 matrix `[rows][cols]` at `addr`, read in boxes of `box_rows` rows x
    /// 64 columns with the 128-byte swizzle the kernel's descriptors expect; rows past the end
    /// read as zeros.
    fn matrix(addr: u64, rows: usize, cols: usize, box_rows: usize) -> Result<Self, CudaError> {
        if !addr.is_multiple_of(16) || !(cols * 2).is_multiple_of(16) {
            return Err(CudaError::Invalid(format!(
                "TMA: matrix at {addr:#x} with {cols} bf16 columns (16-byte aligned address and rows needed)"
            )));
        }
        let dims: [u64; 2] = [cols as u64, rows as u64];
        let strides: [u64; 1] = [(cols * 2) as u64];
        let boxes: [u32; 2] = [K_SLICE as u32, box_rows as u32];
        let element_strides: [u32; 2] = [1, 1];
        let mut map = CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer refers to a live local array of the rank's length; the driver
        // only writes `map`.
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                addr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if status != CUresult::CUDA_SUCCESS {
            return Err(CudaError::Invalid(format!(
                "cuTensorMapEncodeTiled refused a {rows}x{cols} bf16 matrix (box {boxes:?}): {status:?}"
            )));
        }
        Ok(Self(map))
    }
}

// The kernel's GEMM_EPI_* values.
const EPI_NONE: u32 = 0;
const EPI_BIAS: u32 = 1;
const EPI_BIAS_GELU: u32 = 2;

/// The device addresses of one product (bf16 everywhere; lengths checked by the caller).
#[derive(Debug, Clone, Copy)]
pub struct GemmOperands {
    pub x: u64,
    pub w: u64,
    pub bias: Option<u64>,
    pub y: u64,
}

/// Whether the kernel can take these addresses: x and w are read by TMA (16-byte aligned rows
/// of `k` bf16), the bias in pairs (4-byte aligned), the output in 16-byte chunks.
pub fn accepts(ops: &GemmOperands, k: usize) -> bool {
    ops.x.is_multiple_of(16)
        && ops.w.is_multiple_of(16)
        && (k * 2).is_multiple_of(16)
        && ops.bias.is_none_or(|b| b.is_multiple_of(4))
        && ops.y.is_multiple_of(16)
}

/// `y = x · wᵀ (+ bias) (GELU)` with tile shape `shape` on the device's stream. The tensor maps
/// are encoded on the host at each launch (no device work; a captured graph keeps its own).
#[allow(clippy::too_many_arguments)]
pub fn linear(
    dev: &CudaDevice,
    shape: GemmTileShape,
    ops: GemmOperands,
    m: usize,
    n: usize,
    k: usize,
    epilogue: Epilogue,
) -> Result<(), CudaError> {
    if !shape.fits(m, n, k) {
        return Err(CudaError::Invalid(format!(
            "{}: a {m}x{n}x{k} product needs n a multiple of {} and k of {K_SLICE}",
            shape.label(),
            shape.cols()
        )));
    }
    let (epi, bias) = match (epilogue, ops.bias) {
        (Epilogue::None, None) => (EPI_NONE, 0u64),
        (Epilogue::None | Epilogue::Bias, Some(b)) => (EPI_BIAS, b),
        (Epilogue::BiasGelu, Some(b)) => (EPI_BIAS_GELU, b),
        (e, None) => {
            return Err(CudaError::Invalid(format!(
                "linear {m}x{n}x{k}: epilogue {e:?} needs a bias"
            )));
        }
    };
    if !bias.is_multiple_of(4) || !ops.y.is_multiple_of(16) {
        return Err(CudaError::Invalid(format!(
            "{}: bias {bias:#x} and output {:#x} must be 4- and 16-byte aligned",
            shape.label(),
            ops.y
        )));
    }
    let too_big = |v: usize, what: &str| {
        u32::try_from(v)
            .map_err(|_| CudaError::Invalid(format!("{}: {what} = {v} exceeds u32", shape.label())))
    };
    let (m32, n32, k32) = (too_big(m, "m")?, too_big(n, "n")?, too_big(k, "k")?);
    let grid_y = too_big(m.div_ceil(shape.rows()), "row tiles")?;
    let a_map = TensorMap::matrix(ops.x, m, k, shape.rows())?;
    let b_map = TensorMap::matrix(ops.w, n, k, shape.cols())?;
    let f = dev.kernels.get(shape.entry())?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        shape.smem_bytes() as i32,
    )?;
    let cfg = LaunchConfig {
        grid_dim: ((n / shape.cols()) as u32, grid_y, 1),
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: shape.smem_bytes(),
    };
    let mut b = dev.stream.launch_builder(f);
    b.arg(&a_map)
        .arg(&b_map)
        .arg(&bias)
        .arg(&ops.y)
        .arg(&m32)
        .arg(&n32)
        .arg(&k32)
        .arg(&epi);
    // SAFETY: the arguments follow GEMM_ENTRY's signature; the tensor maps describe the
    // caller's length-checked x and w; the shape fits the product (checked above).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// The q/k/v product with the split fused into its epilogue (128 x 192 tiles).
const QKV_SPLIT_ENTRY: &str = "gemm_bf16_sm90_qkv_m128n192";
const QKV_SPLIT_TILE: GemmTileShape = shape(QKV_SPLIT_ENTRY, 128, 192);
/// The kernel's `QkvRowPrep` after the ring and barriers: a K slot address and 32 RoPE
/// (cos, sin) pairs per row of the tile, the qk-norm's four 64-vectors.
const QKV_ROW_PREP_BYTES: usize = 128 * 8 + 128 * 32 * 8 + 4 * 64 * 4;

fn qkv_split_smem_bytes() -> u32 {
    QKV_SPLIT_TILE.smem_bytes() + QKV_ROW_PREP_BYTES as u32
}

/// Whether [`linear_qkv_split`] can take an `m x n x k` q/k/v product on this device: n = 3 k
/// in whole 192-column tiles (each 64-column head inside one tile) and k in whole slices.
pub fn fuses_qkv_split(dev: &CudaDevice, m: usize, n: usize, k: usize) -> bool {
    n == 3 * k
        && k.is_multiple_of(HEAD_DIM)
        && QKV_SPLIT_TILE.fits(m, n, k)
        && dev.kernels.has(QKV_SPLIT_ENTRY)
}

const HEAD_DIM: usize = crate::model::spec::HEAD_DIM;

/// `qkv = x · wᵀ + bias` (`x` `[m][k]`, `w` `[3k][k]`, columns `[q | k | v][heads][64]`), then
/// the q/k/v split (`ops::qkv_split_norm_rope_to_pages`: qk-norm, RoPE, q into its rows, K/V
/// into the pages) as the product's epilogue: one kernel, and the product is never written.
pub fn linear_qkv_split(
    dev: &CudaDevice,
    x: DevPtr<bf16>,
    w: DevPtr<bf16>,
    bias: DevPtr<bf16>,
    m: usize,
    k: usize,
    split: &QkvSplitArgs,
) -> Result<(), CudaError> {
    let n = 3 * k;
    if !fuses_qkv_split(dev, m, n, k) {
        return Err(CudaError::Invalid(format!(
            "the fused q/k/v split takes n = 3k in 192-column tiles and k in whole 64-column heads on Hopper; got {m}x{n}x{k}"
        )));
    }
    if split.n_tokens as usize != m || split.heads as usize * HEAD_DIM != k || split.pool == 0 {
        return Err(CudaError::Invalid(format!(
            "the fused q/k/v split of {m} tokens x {k} columns was given {} tokens of {} heads{}",
            split.n_tokens,
            split.heads,
            if split.pool == 0 { " and no pages" } else { "" }
        )));
    }
    x.check_len(m * k, "q/k/v input")?;
    w.check_len(n * k, "q/k/v weight")?;
    bias.check_len(n, "q/k/v bias")?;
    let ops = GemmOperands {
        x: x.addr(),
        w: w.addr(),
        bias: Some(bias.addr()),
        y: 0,
    };
    if !ops.x.is_multiple_of(16) || !ops.w.is_multiple_of(16) || !bias.addr().is_multiple_of(4) {
        return Err(CudaError::Invalid(
            "the fused q/k/v split needs 16-byte aligned x and w and a 4-byte aligned bias".into(),
        ));
    }
    let shape = QKV_SPLIT_TILE;
    let a_map = TensorMap::matrix(ops.x, m, k, shape.rows())?;
    let b_map = TensorMap::matrix(ops.w, n, k, shape.cols())?;
    let f = dev.kernels.get(QKV_SPLIT_ENTRY)?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        qkv_split_smem_bytes() as i32,
    )?;
    let cfg = LaunchConfig {
        grid_dim: (
            (n / shape.cols()) as u32,
            m.div_ceil(shape.rows()) as u32,
            1,
        ),
        block_dim: (shape.threads(), 1, 1),
        shared_mem_bytes: qkv_split_smem_bytes(),
    };
    let (bias_a, m32, n32, k32) = (bias.addr(), m as u32, n as u32, k as u32);
    let mut b = dev.stream.launch_builder(f);
    b.arg(&a_map)
        .arg(&b_map)
        .arg(&bias_a)
        .arg(&m32)
        .arg(&n32)
        .arg(&k32)
        .arg(split);
    // SAFETY: the arguments follow gemm_bf16_sm90_qkv_m128n192's signature; x, w and bias were
    // length-checked, `split` was validated by ops::qkv_split_args (q's length, the tables) and
    // its pages by the cache's page writer; sizes fit u32 (m = the split's u32 token count).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_fits_the_shared_memory_and_its_source() {
        let src = include_str!("../../../kernels/gemm_sm90.cu");
        for s in GemmTileShape::ALL {
            assert!(
                s.smem_bytes() <= 227 * 1024,
                "{s:?}: {} bytes",
                s.smem_bytes()
            );
            assert!(s.stages() >= 3, "{s:?}: {} stages", s.stages());
            let line = format!("GEMM_ENTRY({}, {}, {})", s.entry(), s.cols(), s.rows() / 64);
            assert!(src.contains(&line), "kernels/gemm_sm90.cu lacks `{line}`");
        }
        assert!(qkv_split_smem_bytes() <= 227 * 1024);
        // The fused q/k/v entry instantiates the body with the same tile.
        assert!(src.contains(&format!(
            "void __launch_bounds__(384, 1) {QKV_SPLIT_ENTRY}("
        )));
        assert!(src.contains("gemm_body<192, 2, true>"));
    }

    #[test]
    fn the_registry_loads_every_entry_point() {
        let src = crate::backend::cuda::registry::SOURCES
            .iter()
            .find(|s| s.name == "gemm_sm90")
            .expect("gemm_sm90 is registered");
        assert!(src.hopper_only);
        let listed: Vec<&str> = src.entry_points().collect();
        for e in GemmTileShape::ALL
            .map(GemmTileShape::entry)
            .into_iter()
            .chain([QKV_SPLIT_ENTRY])
        {
            assert!(listed.contains(&e), "{e} is not loaded");
        }
        assert_eq!(listed.len(), GemmTileShape::ALL.len() + 1);
    }

    #[test]
    fn one_wave_shapes_exist_for_a_frame_of_tokens() {
        // 1005 tokens on 132 SMs: every block's product has a shape of at most one wave.
        for (n, k) in [(3072, 1024), (1024, 1024), (4096, 1024), (1024, 4096)] {
            let best = GemmTileShape::ALL
                .into_iter()
                .filter(|s| s.fits(1005, n, k) && s.ctas(1005, n) <= 132)
                .max_by_key(|s| s.ctas(1005, n));
            assert_eq!(best.map(|s| s.ctas(1005, n)), Some(128), "{n}x{k}");
        }
    }
}
