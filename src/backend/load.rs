//! Loading the model for the backend a user asked for: the one place that chooses between the
//! CPU and the GPU, used by every subcommand that runs the model.
//!
//! On the GPU the checkpoint's tensors stream straight to the device (no host copy of the model
//! is built); the f32 CPU model is built only for the CPU backend, including the fallback of
//! [`Preference::Auto`] when the GPU cannot take the model (the checkpoint is then read again).

use std::path::PathBuf;
use std::sync::Arc;

use super::{Backend, Preference, probe_cuda};
use crate::gpu_model::frame_model::GpuFrameModel;
use crate::model::weights::WeightStore;
use crate::model::weights::random::random_store;
use crate::model::{GctModel, ModelConfig, ModelError};
use crate::pipeline::{CpuFrameModel, FrameModel};

/// Where the weights come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    /// A safetensors file or a PyTorch `.pt` checkpoint.
    File(PathBuf),
    /// Seeded random weights of a size (benchmarks and demos; the geometry is meaningless).
    Random(RandomPreset),
}

/// Sizes of random weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomPreset {
    /// The released checkpoint's sizes.
    Full,
    /// The parity fixtures' tiny sizes.
    Tiny,
}

impl RandomPreset {
    pub fn parse(name: &str) -> Result<Self, LoadError> {
        match name {
            "full" => Ok(Self::Full),
            "tiny" => Ok(Self::Tiny),
            other => Err(LoadError::UnknownPreset(other.to_owned())),
        }
    }

    pub fn config(self) -> ModelConfig {
        match self {
            Self::Full => ModelConfig::default(),
            Self::Tiny => ModelConfig::tiny(),
        }
    }
}

/// What to load, and where to run it.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub weights: Weights,
    /// The model's sizes; None: every size the tensors fix comes from the file (random weights:
    /// the preset's).
    pub config: Option<ModelConfig>,
    pub backend: Preference,
    /// GPU ordinal for the CUDA backend.
    pub device: usize,
}

/// A model ready for the pipeline.
pub struct LoadedModel {
    pub model: Arc<dyn FrameModel>,
    pub backend: Backend,
    /// Why the GPU is not used, when [`Preference::Auto`] fell back to the CPU.
    pub cuda_unavailable: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("unknown random-weights preset `{0}` (use full or tiny)")]
    UnknownPreset(String),
    /// `--backend cuda` on a machine where the GPU cannot run the model.
    #[error("the CUDA backend is unavailable: {0}")]
    CudaUnavailable(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The store and sizes of `req`'s weights, opened afresh (each backend consumes a store).
fn open(req: &ModelRequest) -> Result<(ModelConfig, WeightStore), ModelError> {
    match &req.weights {
        Weights::File(path) => {
            let store = WeightStore::load(path)?;
            let cfg = match &req.config {
                Some(c) => c.clone(),
                None => ModelConfig::default().infer_from_weights(&store)?,
            };
            Ok((cfg, store))
        }
        Weights::Random(preset) => {
            let cfg = req.config.clone().unwrap_or_else(|| preset.config());
            let store = random_store(&cfg, 0)?;
            Ok((cfg, store))
        }
    }
}

fn cpu_model(req: &ModelRequest) -> Result<Arc<dyn FrameModel>, ModelError> {
    let (cfg, store) = open(req)?;
    Ok(Arc::new(CpuFrameModel::new(GctModel::from_store(
        cfg, store,
    )?)))
}

/// The GPU model, or why the GPU cannot run it. Errors of the weights themselves (a missing
/// tensor, a bad file) are not a reason to fall back: they would fail on the CPU too.
fn gpu_model(req: &ModelRequest) -> Result<Result<Arc<dyn FrameModel>, String>, ModelError> {
    if let Err(why) = probe_cuda() {
        return Ok(Err(why.to_string()));
    }
    let (cfg, store) = open(req)?;
    match GpuFrameModel::load(cfg, store, req.device) {
        Ok(model) => Ok(Ok(Arc::new(model))),
        Err(ModelError::Gpu(e)) => Ok(Err(e.to_string())),
        Err(ModelError::Place { name, source, .. }) => Ok(Err(format!(
            "tensor `{name}` could not go to the GPU: {source}"
        ))),
        Err(other) => Err(other),
    }
}

/// Loads `req`'s model on the backend it asks for. [`Preference::Cuda`] without a usable GPU is
/// an error naming why; [`Preference::Auto`] then falls back to the CPU and says why in
/// [`LoadedModel::cuda_unavailable`].
pub fn load_frame_model(req: &ModelRequest) -> Result<LoadedModel, LoadError> {
    if req.backend == Preference::Cpu {
        return Ok(LoadedModel {
            model: cpu_model(req)?,
            backend: Backend::Cpu,
            cuda_unavailable: None,
        });
    }
    match (gpu_model(req)?, req.backend) {
        (Ok(model), _) => Ok(LoadedModel {
            model,
            backend: Backend::Cuda,
            cuda_unavailable: None,
        }),
        (Err(why), Preference::Cuda) => Err(LoadError::CudaUnavailable(why)),
        (Err(why), _) => Ok(LoadedModel {
            model: cpu_model(req)?,
            backend: Backend::Cpu,
            cuda_unavailable: Some(why),
        }),
    }
}
