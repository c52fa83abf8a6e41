// One stored point and how the view colours it: shared by the sprite shader (points.wgsl) and
// the compute rasteriser (raster.wgsl, raster64.wgsl), so both paths filter and colour alike.
// Points live in append-only storage buffers (one per chunk) and are never re-uploaded; all
// filtering and colouring happens on the GPU, driven by the uniforms.

// As stored (`GpuPoint` in src/viewer/chunks.rs).
struct StoredPoint {
    x: f32,
    y: f32,
    z: f32,
    // r | g << 8 | b << 16
    rgb: u32,
    confidence: f32,
    frame: u32,
};

@group(1) @binding(0) var<storage, read> points: array<StoredPoint>;

// As the shaders use it.
struct Point {
    position: vec3<f32>,
    rgb: u32,
    confidence: f32,
    frame: u32,
};

fn load_point(i: u32) -> Point {
    let s = points[i];
    return Point(vec3<f32>(s.x, s.y, s.z), s.rgb, s.confidence, s.frame);
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
