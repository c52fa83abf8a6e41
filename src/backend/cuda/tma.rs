//! The paged K/V pool described to the Hopper tensor-memory accelerator (TMA): one tensor map per
//! attention launch, passed by value as a kernel parameter, so a captured graph keeps its own.

use cudarc::driver::DeviceRepr;
use cudarc::driver::sys::{
    self, CUresult, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};

use super::CudaError;
use crate::model::spec::HEAD_DIM;

/// A `CUtensorMap` (128 bytes, 64-byte aligned) as the warp-specialised kernels take it
/// (`const __grid_constant__ TmaDesc kv_map`).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct KvTensorMap(CUtensorMap);

// SAFETY: a plain 128-byte value with the alignment the kernels declare for it.
unsafe impl DeviceRepr for KvTensorMap {}

impl KvTensorMap {
    /// For kernels that never read it (their producers copy with cp.async).
    pub fn unused() -> Self {
        Self(CUtensorMap { opaque: [0; 16] })
    }

    /// The pool `[pages][K|V][heads][page_size][64]` bf16 at `addr` (`elems` elements) as the
    /// 4-D tensor {64, page_size, heads, 2 x pages} (plane 2p is page p's K, 2p + 1 its V), read
    /// in boxes of {64, `rows`, 1, 1} (one head's consecutive slots: a contiguous read) with the
    /// 128-byte swizzle the kernels' shared-memory tiles use. Slots past `page_size` read as
    /// zeros.
    pub fn paged_pool(
        addr: u64,
        elems: usize,
        page_size: usize,
        heads: usize,
        rows: usize,
    ) -> Result<Self, CudaError> {
        let plane = page_size * heads * HEAD_DIM;
        // (A pool carved from a larger buffer may run past its last plane: that tail is unused.)
        if plane == 0 || elems < plane {
            return Err(CudaError::Invalid(format!(
                "a K/V pool of {elems} elements holds no {page_size}-slot plane of {heads} heads"
            )));
        }
        if !(1..=256).contains(&rows) || !addr.is_multiple_of(16) {
            return Err(CudaError::Invalid(format!(
                "TMA boxes of {rows} rows (1..=256) from address {addr:#x} (16-byte aligned)"
            )));
        }
        let dims: [u64; 4] = [
            HEAD_DIM as u64,
            page_size as u64,
            heads as u64,
            (elems / plane) as u64,
        ];
        // Byte strides of dimensions 1.. (dimension 0 is contiguous).
        let strides: [u64; 3] = [
            (HEAD_DIM * 2) as u64,
            (page_size * HEAD_DIM * 2) as u64,
            (plane * 2) as u64,
        ];
        let boxes: [u32; 4] = [HEAD_DIM as u32, rows as u32, 1, 1];
        let element_strides: [u32; 4] = [1; 4];
        let mut map = CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer refers to a live local array of the rank's length; the driver
        // only writes `map`.
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                4,
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
                "cuTensorMapEncodeTiled refused the K/V pool (dims {dims:?}, strides {strides:?}, box {boxes:?}): {status:?}"
            )));
        }
        Ok(Self(map))
    }
}
