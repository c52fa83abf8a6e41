//! Loading model weights: safetensors (memory-mapped) and PyTorch `.pt` checkpoints, both turned
//! into one name → f32 tensor store. The model takes tensors out of the store by name with the
//! shape it expects; whatever is left over at the end is reported as unused.
//!
//! Policy (documented in docs/model.md): a missing tensor or a wrong shape is an error naming the
//! file and the tensor; tensors the model does not use are a warning (like the reference's
//! `load_state_dict(strict=False)`), listed once, so a checkpoint with extra heads still loads.

pub mod hub;
pub mod pickle;
pub mod random;
pub mod safetensors_file;
pub mod torch_checkpoint;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use super::error::{ModelError, Result};
use super::tensor::Tensor;
use pickle::StorageDtype;

/// One tensor as read from a file, before the model claims it.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Convert little-endian storage bytes to f32.
pub(crate) fn decode_elements(bytes: &[u8], dtype: StorageDtype) -> Vec<f32> {
    match dtype {
        StorageDtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        StorageDtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StorageDtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        StorageDtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                f64::from_le_bytes(a) as f32
            })
            .collect(),
    }
}

/// All tensors of one weights source, keyed by parameter name.
#[derive(Debug)]
pub struct WeightStore {
    /// Where the tensors came from (a path, or a label such as `random:tiny`), for messages.
    source: PathBuf,
    tensors: HashMap<String, Tensor>,
}

impl WeightStore {
    /// Load a safetensors file or a PyTorch checkpoint, chosen by content (zip magic) rather
    /// than by extension, so a misnamed file still loads.
    pub fn load(path: &Path) -> Result<Self> {
        let mut magic = [0u8; 4];
        {
            use std::io::Read;
            let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
            let n = f.read(&mut magic).map_err(|e| ModelError::io(path, e))?;
            if n < 4 {
                return Err(ModelError::bad_file(
                    path,
                    "file is shorter than any header",
                ));
            }
        }
        let raw = if &magic == b"PK\x03\x04" {
            torch_checkpoint::read_torch_checkpoint(path)?
        } else {
            safetensors_file::read_safetensors(path)?
        };
        Self::from_raw(path, raw)
    }

    pub fn from_raw(source: impl Into<PathBuf>, raw: Vec<RawTensor>) -> Result<Self> {
        let source = source.into();
        let mut tensors = HashMap::with_capacity(raw.len());
        for t in raw {
            let tensor = Tensor::new(t.shape, t.data).map_err(|e| ModelError::BadTensor {
                path: source.clone(),
                name: t.name.clone(),
                reason: e.to_string(),
            })?;
            tensors.insert(t.name, tensor);
        }
        Ok(WeightStore { source, tensors })
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|t| t.shape.as_slice())
    }

    /// Remove a tensor, checking its shape.
    pub fn take(&mut self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let tensor = self
            .tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.source.clone(),
                name: name.to_owned(),
            })?;
        if tensor.shape != expected {
            return Err(ModelError::WrongShape {
                path: self.source.clone(),
                name: name.to_owned(),
                expected: expected.to_vec(),
                found: tensor.shape,
            });
        }
        Ok(tensor.data)
    }

    /// Names still in the store (not used by the model), sorted.
    pub fn leftover(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }

    /// Report unused tensors: a warning by default, an error when `strict`.
    pub fn finish(self, strict: bool) -> Result<()> {
        let left = self.leftover();
        if left.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = left.iter().take(8).map(String::as_str).collect();
        let names = if left.len() > shown.len() {
            format!(
                "{} (and {} more)",
                shown.join(", "),
                left.len() - shown.len()
            )
        } else {
            shown.join(", ")
        };
        if strict {
            return Err(ModelError::ExtraTensors {
                path: self.source,
                names,
            });
        }
        tracing::warn!(
            "{}: {} tensors not used by the model: {names}",
            self.source.display(),
            left.len()
        );
        Ok(())
    }
}
