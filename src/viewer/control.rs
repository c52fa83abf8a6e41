//! The viewer's two message types: what arrives (results and news about the stream) and what
//! the controls ask of whatever runs the stream (the pipeline's control channel). Kept apart
//! from the pipeline's own types so the viewer runs on any producer (the demo stream, a replay).

use std::sync::Arc;

use crate::frame::FrameResult;
use crate::pipeline::KeyframeRule;
use crate::record::RecorderStatus;

/// What the viewer receives, in order.
#[derive(Debug, Clone)]
pub enum ViewerEvent {
    Frame(Arc<FrameResult>),
    /// Shown on top of the 3D view for the rest of the run (e.g. random weights).
    Notice(String),
    /// Shown in the status bar until the next one (warnings, session resets, loading).
    Status(String),
    Paused(bool),
    /// The settings the stream runs with (so the controls start from the truth).
    Settings(StreamSettings),
    /// A new session started (empty cache, new world frame): the cloud starts over.
    SessionReset(String),
    /// The input has no more frames.
    InputEnded,
    /// How the recording is going (sent while one runs); `None`: not recording.
    Recording(Option<RecorderStatus>),
}

/// What the pipeline controls show at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    pub paged: bool,
    pub sliding_window: usize,
    pub keyframe_rule: KeyframeRule,
}

// Not `Eq`: `Speed` carries a factor.
#[derive(Debug, Clone, PartialEq)]
pub enum ViewerControl {
    Pause(bool),
    /// Clear the cache and start the reconstruction over.
    Reset,
    /// Paged attention (true) or the dense baseline (false).
    PagedAttention(bool),
    SlidingWindow(usize),
    /// A keyframe every n frames.
    KeyframeInterval(u32),
    /// The adaptive rule: a keyframe every n frames at first, the interval doubling each time
    /// the remaining keyframe budget halves.
    AdaptiveKeyframes(u32),
    Recording(bool),
    /// Replay only: show the session as it was at this stream frame, then play on from it.
    Seek(u64),
    /// Replay only: 1.0 the recorded pace, 2.0 twice as fast; 0 as fast as possible.
    Speed(f64),
}
