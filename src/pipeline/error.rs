use crate::capture::CaptureError;
use crate::model::ModelError;

use super::keyframe::BudgetTooSmall;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    KeyframeBudget(#[from] BudgetTooSmall),
    #[error(
        "two frames a step are for file sources (image folders, videos, the synthetic room \
         unpaced); the input ({0}) is live: its frames come one at a time, and holding one \
         for the next would add a frame of latency to every result"
    )]
    PairsNeedFileSource(String),
    #[error("cannot start the {0} thread: {1}")]
    Spawn(&'static str, std::io::Error),
}
