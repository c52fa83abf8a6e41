//! The camera model every stage shares.

use serde::{Deserialize, Serialize};

/// Pinhole intrinsics in pixels of the model's input image.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Intrinsics {
    pub fx: f32,
    pub fy: f32,
    pub cx: f32,
    pub cy: f32,
    pub width: u32,
    pub height: u32,
}
