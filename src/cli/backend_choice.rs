//! `--backend auto|cpu|cuda` of `run` and `view`: the loaded model goes to the GPU when one is
//! usable, else stays on the CPU with the reason said once on stderr.

use std::sync::Arc;

use anyhow::bail;

use crate::gpu_model::frame_model::GpuFrameModel;
use crate::model::GctModel;
use crate::pipeline::{CpuFrameModel, FrameModel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BackendArg {
    /// The GPU when CUDA works here, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// The model behind the pipeline for `choice`. `cuda` without a usable GPU is an error naming
/// why; `auto` falls back to the CPU and says why.
pub fn frame_model(model: GctModel, choice: BackendArg) -> anyhow::Result<Arc<dyn FrameModel>> {
    let model = Arc::new(model);
    if choice == BackendArg::Cpu {
        return Ok(Arc::new(CpuFrameModel::from_shared(model)));
    }
    let gpu = crate::backend::probe_cuda()
        .map_err(|why| why.to_string())
        .and_then(|_| GpuFrameModel::from_shared(Arc::clone(&model), 0).map_err(|e| e.to_string()));
    match (gpu, choice) {
        (Ok(g), _) => Ok(Arc::new(g)),
        (Err(why), BackendArg::Cuda) => bail!("--backend cuda: {why}"),
        (Err(why), _) => {
            eprintln!("CUDA unavailable ({why}); running the model on the CPU");
            Ok(Arc::new(CpuFrameModel::from_shared(model)))
        }
    }
}
