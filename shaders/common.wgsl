// Shared by points.wgsl and lines.wgsl (concatenated in front of each at load time, so both
// read the same per-view uniform block with one layout).

struct ViewUniforms {
    clip_from_world: mat4x4<f32>,
    view_from_world: mat4x4<f32>,
    viewport_px: vec2<f32>,
    point_size_px: f32,
    confidence_threshold: f32,
    colour_mode: u32,
    // Level of detail: draw every `stride`-th point of each chunk.
    stride: u32,
    newest_frame: u32,
    age_span_frames: f32,
    depth_range: vec2<f32>,
    // log(confidence) mapped from .x to .y onto the colour ramp.
    log_confidence_range: vec2<f32>,
    // Points per chunk (a sprite chunk's first point is instance_index * chunk_points).
    chunk_points: u32,
    // Entries of the frame table (point.wgsl).
    frame_count: u32,
    // The confidence threshold as a stored point's confidence code (point_format.rs).
    threshold_code: u32,
    pad0: u32,
};

@group(0) @binding(0) var<uniform> view: ViewUniforms;

const COLOUR_RGB: u32 = 0u;
const COLOUR_CONFIDENCE: u32 = 1u;
const COLOUR_FRAME_AGE: u32 = 2u;
const COLOUR_DEPTH: u32 = 3u;

// A perceptual-ish ramp (dark blue, teal, green, yellow, warm white) in five linear pieces:
// cheap, monotonic in lightness, readable on a dark background.
fn ramp(t_in: f32) -> vec3<f32> {
    let t = clamp(t_in, 0.0, 1.0) * 4.0;
    let i = min(u32(floor(t)), 3u);
    let f = t - f32(i);
    var stops = array<vec3<f32>, 5>(
        vec3<f32>(0.16, 0.09, 0.45),
        vec3<f32>(0.10, 0.42, 0.62),
        vec3<f32>(0.20, 0.70, 0.42),
        vec3<f32>(0.90, 0.80, 0.20),
        vec3<f32>(1.00, 0.95, 0.85),
    );
    return mix(stops[i], stops[i + 1u], f);
}
