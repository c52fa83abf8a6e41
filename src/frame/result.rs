//! What the inference thread hands to the viewer and the recorder for every frame: produced
//! once, shared behind an `Arc`, never mutated.

use glam::{Mat4, Vec3};
use serde::{Deserialize, Serialize};

use super::{FrameOrigin, Intrinsics, RgbImage};
use crate::kvcache::{CacheEvent, CacheStats, PageState};

/// How the model treated a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameType {
    /// One of the first frames, run together in phase 1 and kept forever.
    Scale,
    /// Committed to the cache.
    Keyframe,
    /// Attended to the cache and rolled back.
    NonKeyframe,
}

/// The points of one frame that passed the confidence filter, in world coordinates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FramePoints {
    pub xyz: Vec<[f32; 3]>,
    pub rgb: Vec<[u8; 3]>,
    pub confidence: Vec<f32>,
}

impl FramePoints {
    pub fn len(&self) -> usize {
        self.xyz.len()
    }
    pub fn is_empty(&self) -> bool {
        self.xyz.is_empty()
    }
}

/// The cache as this frame's step left it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CacheSnapshot {
    pub stats: CacheStats,
    /// Events of this step, in order.
    pub events: Vec<CacheEvent>,
    /// State of every allocated page id (the page map panel).
    pub page_map: Vec<PageState>,
}

/// One named stage's wall-clock time. A list rather than fields so the latency panel stacks
/// whatever stages a backend reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    pub stage: String,
    pub ms: f64,
}

#[derive(Debug, Clone)]
pub struct FrameResult {
    /// Index of the frame in the stream (as captured; live sources may skip indices).
    pub frame: u64,
    /// Its capture time, source name and size as captured.
    pub origin: FrameOrigin,
    pub frame_type: FrameType,
    /// `world_from_camera * point_in_camera = point_in_world`.
    pub world_from_camera: Mat4,
    pub camera_from_world: Mat4,
    pub intrinsics: Intrinsics,
    pub points: FramePoints,
    /// The model's input image (after preprocessing), for the input panel and the recorder.
    pub image: RgbImage,
    /// Depth and confidence at the input image's size, row-major.
    pub depth: Vec<f32>,
    pub confidence: Vec<f32>,
    pub cache: CacheSnapshot,
    /// Capture, decode, preprocess, model stages, unprojection, hand-off.
    pub timings: Vec<StageTime>,
    /// Frames a live source dropped since the previous result.
    pub dropped_before: u64,
}

impl FrameResult {
    pub fn keyframe(&self) -> bool {
        self.frame_type != FrameType::NonKeyframe
    }

    /// Camera centre in world coordinates.
    pub fn camera_position(&self) -> Vec3 {
        self.world_from_camera.w_axis.truncate()
    }

    pub fn total_ms(&self) -> f64 {
        self.timings.iter().map(|t| t.ms).sum()
    }
}
