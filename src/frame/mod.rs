//! What every stage passes along: the image a source captures, the camera model, and the
//! result the inference thread produces for each frame. It sits under capture, pipeline,
//! record and viewer, so those depend on it and never on each other for these types (the
//! import graph has no loops; docs/architecture.md draws it).

pub mod camera;
pub mod image;
pub mod origin;
pub mod result;

pub use camera::Intrinsics;
pub use image::RgbImage;
pub use origin::{CaptureTime, FrameOrigin, TimeBase};
pub use result::{CacheSnapshot, FramePoints, FrameResult, FrameType, StageTime};
