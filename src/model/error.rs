//! The one error type of the model library. Every variant names what a person needs to fix the
//! problem: the file, the tensor, and what was expected against what was found.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid weights file: {reason}")]
    BadWeightsFile { path: PathBuf, reason: String },
    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    WrongShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor `{name}`: {reason}")]
    BadTensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("{path}: unexpected tensors not used by the model: {names}")]
    ExtraTensors { path: PathBuf, names: String },
    #[error("model config {source_name}: {reason}")]
    BadConfig { source_name: String, reason: String },
    #[error("input: {0}")]
    BadInput(String),
    #[error("KV cache: {0}")]
    Cache(#[from] crate::kvcache::CacheError),
    #[error("GPU: {0}")]
    Gpu(#[from] crate::backend::cuda::CudaError),
    /// A tensor read from the file could not be put where the model keeps it (on the GPU, say).
    #[error("{path}: tensor `{name}` could not be placed: {source}")]
    Place {
        path: PathBuf,
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("weights download: {0}")]
    Download(String),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn bad_file(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ModelError::BadWeightsFile {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;
