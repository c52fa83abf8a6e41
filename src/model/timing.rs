//! Per-stage wall-clock timings of one call (for benchmarks and the UI's latency panel).

use std::time::Instant;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageTimings {
    pub dino_ms: f64,
    pub frame_blocks_ms: f64,
    /// Global blocks in total, including their attention over the KV cache.
    pub global_blocks_ms: f64,
    /// The KV cache write and attention of the global blocks alone.
    pub global_attention_ms: f64,
    pub camera_head_ms: f64,
    pub depth_head_ms: f64,
    pub total_ms: f64,
}

pub fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}
