//! Loading model weights: safetensors and PyTorch `.pt` checkpoints, both seen as one
//! name → tensor store that reads each tensor (converted to f32) when it is taken. The model
//! takes tensors out of the store by name with the shape it expects; whatever is left over at
//! the end is reported as unused.
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

/// Convert little-endian storage bytes to f32; large tensors in parallel chunks (a checkpoint of
/// a billion parameters is mostly this).
pub(crate) fn decode_elements(bytes: &[u8], dtype: StorageDtype) -> Vec<f32> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let size = dtype.size_bytes();
    let n = bytes.len() / size;
    let mut out = vec![0.0f32; n];
    if n <= CHUNK {
        decode_into(bytes, dtype, &mut out);
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(bytes[..n * size].par_chunks(CHUNK * size))
            .for_each(|(dst, src)| decode_into(src, dtype, dst));
    }
    out
}

/// Decode `dst.len()` elements of `bytes` into `dst`.
fn decode_into(bytes: &[u8], dtype: StorageDtype, dst: &mut [f32]) {
    match dtype {
        StorageDtype::F32 => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        StorageDtype::F16 => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        StorageDtype::BF16 => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        StorageDtype::F64 => {
            for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                *d = f64::from_le_bytes(a) as f32;
            }
        }
    }
}

/// Where a store's tensor values come from.
enum Backing {
    /// Already in memory (random weights, tests).
    Memory(HashMap<String, Vec<f32>>),
    /// A safetensors file, read one tensor at a time.
    Safetensors {
        mmap: memmap2::Mmap,
        entries: HashMap<String, safetensors_file::SafetensorsEntry>,
    },
    /// A PyTorch zip checkpoint, one storage record at a time.
    Torch {
        archive: Box<zip::ZipArchive<std::fs::File>>,
        data_prefix: String,
        entries: HashMap<String, pickle::TensorRef>,
    },
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backing::Memory(_) => "Memory",
            Backing::Safetensors { .. } => "Safetensors",
            Backing::Torch { .. } => "Torch",
        })
    }
}

/// All tensors of one weights source, keyed by parameter name. A file-backed store indexes
/// names and shapes when it opens and reads a tensor's values only when it is taken, so the
/// caller decides where each tensor goes (kept as f32 by the CPU model, sent to the GPU as
/// bf16 and dropped) and no whole copy of the checkpoint ever sits in memory.
#[derive(Debug)]
pub struct WeightStore {
    /// Where the tensors came from (a path, or a label such as `random:tiny`), for messages.
    source: PathBuf,
    shapes: HashMap<String, Vec<usize>>,
    backing: Backing,
}

impl WeightStore {
    /// Open a safetensors file or a PyTorch checkpoint, chosen by content (zip magic) rather
    /// than by extension, so a misnamed file still loads. Only the index is read here; a
    /// damaged header or a missing storage record is an error now, not later.
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
        let mut shapes = HashMap::new();
        let backing = if &magic == b"PK\x03\x04" {
            let index = torch_checkpoint::index_torch_checkpoint(path)?;
            let mut entries = HashMap::with_capacity(index.tensors.len());
            for (name, t) in index.tensors {
                shapes.insert(name.clone(), t.shape.clone());
                entries.insert(name, t);
            }
            Backing::Torch {
                archive: Box::new(index.archive),
                data_prefix: index.data_prefix,
                entries,
            }
        } else {
            let index = safetensors_file::index_safetensors(path)?;
            let mut entries = HashMap::with_capacity(index.tensors.len());
            for (name, shape, entry) in index.tensors {
                shapes.insert(name.clone(), shape);
                entries.insert(name, entry);
            }
            Backing::Safetensors {
                mmap: index.mmap,
                entries,
            }
        };
        Ok(WeightStore {
            source: path.to_owned(),
            shapes,
            backing,
        })
    }

    pub fn from_raw(source: impl Into<PathBuf>, raw: Vec<RawTensor>) -> Result<Self> {
        let source = source.into();
        let mut shapes = HashMap::with_capacity(raw.len());
        let mut values = HashMap::with_capacity(raw.len());
        for t in raw {
            let expected: usize = t.shape.iter().product();
            if expected != t.data.len() {
                return Err(ModelError::BadTensor {
                    path: source.clone(),
                    name: t.name,
                    reason: format!(
                        "shape {:?} needs {expected} values, got {}",
                        t.shape,
                        t.data.len()
                    ),
                });
            }
            shapes.insert(t.name.clone(), t.shape);
            values.insert(t.name, t.data);
        }
        Ok(WeightStore {
            source,
            shapes,
            backing: Backing::Memory(values),
        })
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn len(&self) -> usize {
        self.shapes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.shapes.keys().map(String::as_str)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.shapes.get(name).map(Vec::as_slice)
    }

    /// A tensor's values, read from the source; the tensor stays in the store.
    pub fn read(&mut self, name: &str) -> Result<Tensor> {
        let shape = self
            .shapes
            .get(name)
            .cloned()
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.source.clone(),
                name: name.to_owned(),
            })?;
        let data = self.read_values(name)?;
        Tensor::new(shape, data).map_err(|e| ModelError::BadTensor {
            path: self.source.clone(),
            name: name.to_owned(),
            reason: e.to_string(),
        })
    }

    fn read_values(&mut self, name: &str) -> Result<Vec<f32>> {
        let missing = || ModelError::MissingTensor {
            path: self.source.clone(),
            name: name.to_owned(),
        };
        match &mut self.backing {
            Backing::Memory(values) => values.get(name).cloned().ok_or_else(missing),
            Backing::Safetensors { mmap, entries } => {
                let entry = entries.get(name).ok_or_else(missing)?;
                Ok(safetensors_file::read_entry(mmap, entry))
            }
            Backing::Torch {
                archive,
                data_prefix,
                entries,
            } => {
                let tensor = entries.get(name).ok_or_else(missing)?;
                torch_checkpoint::read_tensor(archive, data_prefix, tensor, &self.source)
            }
        }
    }

    /// Remove a tensor's entry after checking its shape, without reading it.
    fn remove_checked(&mut self, name: &str, expected: &[usize]) -> Result<()> {
        let shape = self
            .shapes
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.source.clone(),
                name: name.to_owned(),
            })?;
        if shape != expected {
            return Err(ModelError::WrongShape {
                path: self.source.clone(),
                name: name.to_owned(),
                expected: expected.to_vec(),
                found: shape.clone(),
            });
        }
        self.shapes.remove(name);
        Ok(())
    }

    /// Remove a tensor, checking its shape, and return its values.
    pub fn take(&mut self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        self.remove_checked(name, expected)?;
        // Values already in memory move out as they are; a file-backed tensor is read now.
        if let Backing::Memory(values) = &mut self.backing {
            return values
                .remove(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    path: self.source.clone(),
                    name: name.to_owned(),
                });
        }
        self.read_values(name)
    }

    /// Mark a tensor the model does not use at inference as used, checking its shape, without
    /// reading its values.
    pub fn claim(&mut self, name: &str, expected: &[usize]) -> Result<()> {
        self.remove_checked(name, expected)?;
        if let Backing::Memory(values) = &mut self.backing {
            values.remove(name);
        }
        Ok(())
    }

    /// Names still in the store (not used by the model), sorted.
    pub fn leftover(&self) -> Vec<String> {
        let mut v: Vec<String> = self.shapes.keys().cloned().collect();
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
