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
    #[error("cannot start the {0} thread: {1}")]
    Spawn(&'static str, std::io::Error),
}
