//! Images as sources produce them and the model takes them.

use serde::{Deserialize, Serialize};

/// An 8-bit RGB image, row-major.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}
