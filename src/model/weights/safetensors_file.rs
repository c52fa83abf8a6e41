//! safetensors files, memory-mapped: the header is parsed in place and each tensor is converted
//! to f32 straight from the mapping, so a large file is never copied as a whole.

use std::fs::File;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::pickle::StorageDtype;
use super::{RawTensor, decode_elements};
use crate::model::error::{ModelError, Result};

pub fn read_safetensors(path: &Path) -> Result<Vec<RawTensor>> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the mapping is read-only and lives only inside this function; a file truncated by
    // another process while mapped is outside what we can defend against (as for any mmap use).
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    let st = SafeTensors::deserialize(&mmap)
        .map_err(|e| ModelError::bad_file(path, format!("safetensors header: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let dtype = match view.dtype() {
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
        out.push(RawTensor {
            shape: view.shape().to_vec(),
            data: decode_elements(view.data(), dtype),
            name,
        });
    }
    Ok(out)
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
