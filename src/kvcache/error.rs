use thiserror::Error;

/// Everything the KV cache can refuse. Each names the value and what was expected.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CacheError {
    #[error("invalid cache config: {field} = {value}, expected {expected}")]
    InvalidConfig {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("no frame step is in progress: call begin_step (append a frame) before {0}")]
    NoStep(&'static str),
    #[error(
        "a frame step is already in progress (frames {0}..{1}); end it before beginning another"
    )]
    StepInProgress(u64, u64),
    #[error("a frame step needs at least one frame")]
    EmptyStep,
    #[error("a non-keyframe step holds exactly one frame, got {0}")]
    NonKeyframeStep(usize),
    #[error(
        "frame {frame} is not after the last committed frame {last}: frames must arrive in order"
    )]
    FrameOrder { frame: u64, last: u64 },
    #[error("{what}: expected {expected} values, found {found}")]
    WrongSize {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("layer {layer} is out of range: the cache has {layers} layers")]
    LayerOutOfRange { layer: usize, layers: usize },
    #[error(
        "the special-token pool is full: {cap_frames} frames' special tokens ({cap_pages} pages) are held; \
         raise special_pool.max_frames, choose the drop-oldest policy, or reset the session"
    )]
    SpecialPoolFull { cap_frames: u64, cap_pages: usize },
    #[error(
        "no free patch page for frame {frame}: a step of {frames} frames needs more than the pool's {pool} pages"
    )]
    PatchPoolExhausted {
        frame: u64,
        frames: usize,
        pool: usize,
    },
    #[error("this step reused pages it freed, so it cannot be rolled back")]
    CannotRollback,
    #[error(
        "layer {layer}'s K/V of this step were not written: call write_layer before attend_layer"
    )]
    LayerNotWritten { layer: usize },
    #[error("attention has nothing to attend to: no tokens are visible")]
    NothingVisible,
}
