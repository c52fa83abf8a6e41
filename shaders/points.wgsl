// Point sprites: one triangle per point around its round footprint, built from
// `vertex_index`, one draw call per chunk, no vertex buffers. A triangle (three vertices)
// rather than a quad (six, as there is no index buffer) halves the vertex work, which is what
// bounds small sprites; the fragment shader keeps the same disc either way.

const SPRITE_VERTICES: u32 = 3u;

struct VertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) corner: vec2<f32>,
    @location(1) colour: vec3<f32>,
};

// The equilateral triangle whose inscribed circle is the unit disc.
fn corner_of(i: u32) -> vec2<f32> {
    var corners = array<vec2<f32>, 3>(
        vec2<f32>(0.0, 2.0),
        vec2<f32>(-1.7320508, -1.0),
        vec2<f32>(1.7320508, -1.0),
    );
    return corners[i];
}

@vertex
fn vs_main(
    @builtin(vertex_index) vertex_index: u32,
    // One instance per draw: the chunk's index in the store.
    @builtin(instance_index) chunk: u32,
) -> VertexOut {
    let point = load_point((vertex_index / SPRITE_VERTICES) * view.stride, chunk * view.chunk_points);
    let corner = corner_of(vertex_index % SPRITE_VERTICES);
    var out: VertexOut;
    out.corner = corner;
    if !point.kept {
        // Behind the far plane: the rasteriser drops the whole triangle.
        out.position = vec4<f32>(0.0, 0.0, 2.0, 1.0);
        out.colour = vec3<f32>(0.0);
        return out;
    }
    let world = vec4<f32>(point.position, 1.0);
    let clip = view.clip_from_world * world;
    // Size in pixels regardless of distance: offset in NDC, scaled by w to undo the divide.
    // The disc's radius is point_size_px / 2 pixels.
    let offset_ndc = corner * view.point_size_px / view.viewport_px;
    out.position = clip + vec4<f32>(offset_ndc * clip.w, 0.0, 0.0);
    out.colour = colour_of(point);
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
