//! The per-frame types now live in [`crate::frame`]. This path stays only because
//! `gpu_model::frame_model` still imports them from here; it goes when that import moves.

pub use crate::frame::{CacheSnapshot, FramePoints, StageTime};
