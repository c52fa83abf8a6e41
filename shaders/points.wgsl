// Point sprites: one quad (two triangles, six vertices) per point, built from `vertex_index`.
// Points live in append-only storage buffers (one per chunk) and are never re-uploaded; all
// filtering and colouring happens here, driven by the uniforms, so changing a setting costs
// nothing on the CPU.

struct Point {
    x: f32,
    y: f32,
    z: f32,
    // r | g << 8 | b << 16
    rgb: u32,
    confidence: f32,
    frame: u32,
};

@group(1) @binding(0) var<storage, read> points: array<Point>;

struct VertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) corner: vec2<f32>,
    @location(1) colour: vec3<f32>,
};

fn corner_of(i: u32) -> vec2<f32> {
    var corners = array<vec2<f32>, 6>(
        vec2<f32>(-1.0, -1.0),
        vec2<f32>(1.0, -1.0),
        vec2<f32>(1.0, 1.0),
        vec2<f32>(-1.0, -1.0),
        vec2<f32>(1.0, 1.0),
        vec2<f32>(-1.0, 1.0),
    );
    return corners[i];
}

fn unpack_rgb(packed: u32) -> vec3<f32> {
    return vec3<f32>(
        f32(packed & 0xffu),
        f32((packed >> 8u) & 0xffu),
        f32((packed >> 16u) & 0xffu),
    ) / 255.0;
}

fn colour_of(p: Point, view_depth: f32) -> vec3<f32> {
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
        return ramp((view_depth - range.x) / max(range.y - range.x, 1e-6));
    }
    return unpack_rgb(p.rgb);
}

@vertex
fn vs_main(@builtin(vertex_index) vertex_index: u32) -> VertexOut {
    let point = points[(vertex_index / 6u) * view.stride];
    let corner = corner_of(vertex_index % 6u);
    var out: VertexOut;
    out.corner = corner;
    if point.confidence < view.confidence_threshold {
        // Behind the far plane: the rasteriser drops the whole quad.
        out.position = vec4<f32>(0.0, 0.0, 2.0, 1.0);
        out.colour = vec3<f32>(0.0);
        return out;
    }
    let world = vec4<f32>(point.x, point.y, point.z, 1.0);
    let clip = view.clip_from_world * world;
    let view_depth = -(view.view_from_world * world).z;
    // Size in pixels regardless of distance: offset in NDC, scaled by w to undo the divide.
    let offset_ndc = corner * view.point_size_px / view.viewport_px;
    out.position = clip + vec4<f32>(offset_ndc * clip.w, 0.0, 0.0);
    out.colour = colour_of(point, view_depth);
    return out;
}

@fragment
fn fs_main(in: VertexOut) -> @location(0) vec4<f32> {
    // Round sprites.
    if dot(in.corner, in.corner) > 1.0 {
        discard;
    }
    return vec4<f32>(in.colour, 1.0);
}
