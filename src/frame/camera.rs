//! The camera model every stage shares.

use glam::Mat4;
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

/// A 4×4 transform row by row, as the JSON files beside a session write poses.
pub fn row_major(m: &Mat4) -> [[f32; 4]; 4] {
    m.transpose().to_cols_array_2d()
}
