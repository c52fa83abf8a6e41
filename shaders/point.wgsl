// A point as the shaders use it, and how the view colours it: shared by the sprite shader
// (points.wgsl) and the compute rasteriser (splat.wgsl), so both paths filter and colour alike.
// How points are stored is the business of stored_point.wgsl (it follows this file), which
// defines `load_point`. Points live in append-only storage buffers
// (one per chunk) and are never re-uploaded; all filtering and colouring happens on the GPU,
// driven by the uniforms.

struct Point {
    position: vec3<f32>,
    rgb: u32,
    // Only filled in the confidence colours (compact points decode it with an exp).
    confidence: f32,
    // Only filled in the frame-age colours (it may cost a search of the frame table).
    frame: u32,
    // At or above the confidence threshold.
    kept: bool,
};

// (first point's index in the store, frame), one per stored frame, in store order.
@group(0) @binding(1) var<storage, read> frame_starts: array<vec2<u32>>;

// The frame of the point at `index` (in the store): the last frame starting at or before it.
fn frame_of(index: u32) -> u32 {
    if view.frame_count == 0u {
        return 0u;
    }
    var lo = 0u;
    var hi = view.frame_count;
    while hi - lo > 1u {
        let mid = (lo + hi) / 2u;
        if frame_starts[mid].x <= index {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return frame_starts[lo].y;
}

// The z row of view_from_world (column-major storage).
fn view_row_z() -> vec4<f32> {
    let m = view.view_from_world;
    return vec4<f32>(m[0].z, m[1].z, m[2].z, m[3].z);
}

fn unpack_rgb(packed: u32) -> vec3<f32> {
    return vec3<f32>(
        f32(packed & 0xffu),
        f32((packed >> 8u) & 0xffu),
        f32((packed >> 16u) & 0xffu),
    ) / 255.0;
}

// The view depth is worked out only in the depth colours: one matrix row less per point
// in the others.
fn colour_of(p: Point) -> vec3<f32> {
    let mode = view.colour_mode;
    if mode == COLOUR_CONFIDENCE {
        let range = view.log_confidence_range;
        let t = (log(max(p.confidence, 1e-6)) - range.x) / max(range.y - range.x, 1e-6);
        return ramp(t);
    }
    if mode == COLOUR_FRAME_AGE {
        // Newest frames bright, old ones dark.
        let age = f32(view.newest_frame - min(p.frame, view.newest_frame));
        return ramp(1.0 - age / max(view.age_span_frames, 1.0));
    }
    if mode == COLOUR_DEPTH {
        let range = view.depth_range;
        let view_depth = -dot(view_row_z(), vec4<f32>(p.position, 1.0));
        return ramp((view_depth - range.x) / max(range.y - range.x, 1e-6));
    }
    return unpack_rgb(p.rgb);
}
