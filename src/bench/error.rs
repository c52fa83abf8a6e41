//! Why a benchmark could not run (a slow kernel is a result, not an error).

use cudarc::driver::DriverError;

use crate::backend::cuda::{AttentionKernel, CudaError};
use crate::kvcache::CacheError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("`bench attention` needs a CUDA GPU: {0}")]
    AttentionNeedsGpu(#[source] CudaError),
    /// The probe before any weights are built: a GPU-less machine is told so at once.
    #[error("bench e2e needs a CUDA GPU: {0}")]
    E2eNeedsGpu(#[source] CudaError),
    #[error("bench e2e needs a CUDA GPU: {0}")]
    E2eLoad(#[source] ModelError),
    #[error("the {kernel:?} kernel needs a Hopper GPU (sm_90); this is sm_{arch}")]
    KernelNeedsHopper { kernel: AttentionKernel, arch: u32 },
    #[error("case `{0}` is not live/seen")]
    CaseNotLiveSeen(String),
    #[error("bad {count} count in `{case}`: {source}")]
    CaseCount {
        /// `live` or `seen`.
        count: &'static str,
        case: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("case `{case}`: need 0 < live <= seen and live <= {max_live}")]
    CaseOutOfRange { case: String, max_live: usize },
    #[error(
        "case `{case}`: with {scale_frames} scale frames and a window of {window}, {seen} frames seen leave {live} live"
    )]
    CaseLiveMismatch {
        case: String,
        scale_frames: usize,
        window: usize,
        seen: u64,
        live: u64,
    },
    #[error("case {live}/{seen}: {source}")]
    Case {
        live: usize,
        seen: u64,
        #[source]
        source: Box<BenchError>,
    },
    #[error(
        "input {width}x{height}: the width and height must be positive multiples of the patch size, {patch}"
    )]
    Resolution {
        width: usize,
        height: usize,
        patch: usize,
    },
    #[error("the chosen kernel was not timed")]
    ChosenKernelNotTimed,
    #[error("{step}: {source}")]
    Step {
        /// `phase 1`, `frame 12`, `profiled frame 208`.
        step: String,
        #[source]
        source: CudaError,
    },
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Events, copies and synchronisation called on cudarc directly.
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error(transparent)]
    Model(#[from] ModelError),
}
