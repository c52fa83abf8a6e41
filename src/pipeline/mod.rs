//! Capture, inference and consumer threads joined by bounded channels.

pub mod result;

pub use result::{CacheSnapshot, FramePoints, FrameResult, FrameType, Intrinsics, RgbImage, StageTime};
