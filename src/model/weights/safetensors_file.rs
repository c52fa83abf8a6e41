//! safetensors files: the header is indexed first, then each tensor is read and converted to f32
//! when the model asks for it, so a large file is never held in memory as a whole.

use std::fs::File;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::decode_elements;
use super::pickle::StorageDtype;
use crate::model::error::{ModelError, Result};

/// Where one tensor of a safetensors file lies.
#[derive(Clone, Debug)]
pub(crate) struct SafetensorsEntry {
    pub dtype: StorageDtype,
    /// Absolute byte range in the file.
    pub start: u64,
    pub len: usize,
}

/// The tensors of a safetensors file, indexed from its header alone: nothing else of the file is
/// read until a tensor is asked for, so loading a large checkpoint touches each byte once.
pub(crate) struct SafetensorsIndex {
    pub mmap: memmap2::Mmap,
    pub tensors: Vec<(String, Vec<usize>, SafetensorsEntry)>,
}

pub(crate) fn index_safetensors(path: &Path) -> Result<SafetensorsIndex> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the mapping is read-only; a file truncated by another process while mapped is
    // outside what we can defend against (as for any mmap use).
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
        .map_err(|e| ModelError::bad_file(path, format!("safetensors header: {e}")))?;
    let data_start = 8 + header_len as u64;
    let mut tensors = Vec::new();
    for (name, info) in metadata.tensors() {
        let dtype = match info.dtype {
            Dtype::F32 => StorageDtype::F32,
            Dtype::F16 => StorageDtype::F16,
            Dtype::BF16 => StorageDtype::BF16,
            Dtype::F64 => StorageDtype::F64,
            other => {
                return Err(ModelError::BadTensor {
                    path: path.to_owned(),
                    name,
                    reason: format!("dtype {other:?} is not a floating-point weight type"),
                });
            }
        };
        let (begin, end) = info.data_offsets;
        tensors.push((
            name,
            info.shape.clone(),
            SafetensorsEntry {
                dtype,
                start: data_start + begin as u64,
                len: end - begin,
            },
        ));
    }
    Ok(SafetensorsIndex { mmap, tensors })
}

/// One tensor's values as f32, decoded straight from the mapping. Its pages are then dropped
/// from this process (they stay in the page cache), so a model read tensor by tensor never holds
/// more of the file than one tensor.
pub(crate) fn read_entry(mmap: &memmap2::Mmap, entry: &SafetensorsEntry) -> Vec<f32> {
    let start = entry.start as usize;
    let values = decode_elements(&mmap[start..start + entry.len], entry.dtype);
    // Whole pages inside the tensor only: a page shared with a neighbour stays mapped.
    const PAGE: usize = 4096;
    let first = start.next_multiple_of(PAGE);
    let end = (start + entry.len) / PAGE * PAGE;
    if end > first {
        // SAFETY: the mapping is read-only and file-backed, so dropping its pages loses nothing
        // (a later read faults them in from the file again), and no slice into the range is
        // alive: the decode above finished. A failure only leaves the pages mapped, so it is
        // ignored.
        let _ = unsafe {
            mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
        };
    }
    values
}

/// A tensor's name, shape and values widened to f64.
pub type NamedValues = (String, Vec<usize>, Vec<f64>);

/// Read any tensor (f32 or integer) of a safetensors file as f64, for fixtures such as
/// `total_frames_processed` (i64). Used by the parity tool.
pub fn read_safetensors_any(path: &Path) -> Result<Vec<NamedValues>> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| ModelError::bad_file(path, format!("safetensors header: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let d = view.data();
        let values: Vec<f64> = match view.dtype() {
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(c);
                    i64::from_le_bytes(a) as f64
                })
                .collect(),
            Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            Dtype::F32 => decode_elements(d, StorageDtype::F32)
                .into_iter()
                .map(f64::from)
                .collect(),
            Dtype::F64 => decode_elements(d, StorageDtype::F64)
                .into_iter()
                .map(f64::from)
                .collect(),
            Dtype::F16 => decode_elements(d, StorageDtype::F16)
                .into_iter()
                .map(f64::from)
                .collect(),
            Dtype::BF16 => decode_elements(d, StorageDtype::BF16)
                .into_iter()
                .map(f64::from)
                .collect(),
            other => {
                return Err(ModelError::BadTensor {
                    path: path.to_owned(),
                    name,
                    reason: format!("dtype {other:?} is not supported"),
                });
            }
        };
        out.push((name, view.shape().to_vec(), values));
    }
    Ok(out)
}
