//! Where frames come from: a webcam (nokhwa), a video file (FFmpeg), an image folder, or the
//! synthetic room.
//!
//! Every source yields packed 8-bit RGB with its origin (capture time, source name, size as
//! captured; see [`timestamps`]) and an index, decoded off the inference thread: a camera's
//! frames on a thread of its own, a video's on its decode thread ([`video`]), files and the
//! synthetic room on a small ordered pool of workers ahead of the capture thread
//! ([`decode_pool`]). [`Paced`] turns any source into a live one at a fixed frame
//! rate. See docs/pipeline.md.

pub mod decode_pool;
pub mod error;
pub mod folder;
pub mod image_limits;
pub mod open;
pub mod paced;
pub mod spec;
pub mod synthetic;
pub mod timestamps;
pub mod video;
pub mod video_writer;
pub mod webcam;

use std::time::Instant;

use crate::frame::{FrameOrigin, RgbImage};

pub use error::CaptureError;
pub use folder::{CorruptFilePolicy, ImageFolder, decode_bytes, decode_bytes_limited};
pub use image_limits::{DecodeLimits, decode_limits, set_decode_limits};
pub use open::{SourceOptions, SyntheticPlay, open_source};
pub use paced::{Paced, Pacer};
pub use spec::InputSpec;
pub use synthetic::{SyntheticScene, SyntheticSource, SyntheticView};
pub use video::{VideoCut, VideoFile};
pub use video_writer::{VideoWritten, write_video};
pub use webcam::{CameraRequest, CameraSelector, Webcam, list_cameras};

/// One frame as a source produced it.
#[derive(Debug, Clone)]
pub struct CapturedFrame {
    /// Position in the source's stream. Folders number the files they decoded (skipped files
    /// take no index); cameras count every frame they delivered.
    pub index: u64,
    pub image: RgbImage,
    /// When it was captured, what it is called, its size as captured.
    pub origin: FrameOrigin,
    /// When the source handed the frame over (for hand-off timings).
    pub captured_at: Instant,
    /// Time spent waiting for and reading the frame (device wait, file read).
    pub capture_ms: f64,
    /// Time spent decoding it to RGB8 (MJPEG/YUYV, PNG/JPEG).
    pub decode_ms: f64,
}

/// A stream of frames.
pub trait Source: Send {
    /// The next frame; `Ok(None)` at the end of a finite source. A live source blocks until
    /// its device delivers; an error from a live source means the device is gone.
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError>;

    /// Live sources run at the device's pace: the pipeline keeps only their newest frame and
    /// counts what it drops. Non-live sources are read as fast as inference consumes them.
    fn is_live(&self) -> bool;

    /// What this source is, for logs and the summary.
    fn describe(&self) -> String;

    /// Frames still to come, when the source knows (a folder does, a camera does not).
    fn remaining_hint(&self) -> Option<u64> {
        None
    }

    /// Problems met since the last call that did not stop the source (e.g. a skipped file).
    fn take_warnings(&mut self) -> Vec<String> {
        Vec::new()
    }

    /// The size of the frames to come, when the source knows it before the first one (a
    /// camera's mode, a folder's first image): the pipeline prepares the model for it before
    /// the stream starts.
    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        None
    }

    /// Frames the source read but could not use (a file that did not decode) since the last
    /// call: the pipeline counts them as captured and skipped.
    fn take_skipped(&mut self) -> u64 {
        0
    }
}

pub(crate) fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}
