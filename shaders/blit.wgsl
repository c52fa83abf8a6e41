// Copies the offscreen 3D view into egui's render pass. The viewport is the callback's
// rectangle, so one triangle covering clip space fills exactly that rectangle.

@group(0) @binding(0) var scene: texture_2d<f32>;

struct BlitOut {
    @builtin(position) position: vec4<f32>,
    @location(0) uv: vec2<f32>,
};

@vertex
fn vs_main(@builtin(vertex_index) vertex_index: u32) -> BlitOut {
    var positions = array<vec2<f32>, 3>(
        vec2<f32>(-1.0, -3.0),
        vec2<f32>(-1.0, 1.0),
        vec2<f32>(3.0, 1.0),
    );
    let p = positions[vertex_index];
    var out: BlitOut;
    out.position = vec4<f32>(p, 0.0, 1.0);
    out.uv = vec2<f32>(p.x * 0.5 + 0.5, 0.5 - p.y * 0.5);
    return out;
}

@fragment
fn fs_main(in: BlitOut) -> @location(0) vec4<f32> {
    // The fragment position is in framebuffer pixels (offset by the viewport), so address the
    // texture through the interpolated uv instead.
    let size = vec2<f32>(textureDimensions(scene));
    let texel = vec2<i32>(clamp(in.uv * size, vec2<f32>(0.0), size - 1.0));
    return textureLoad(scene, texel, 0);
}
