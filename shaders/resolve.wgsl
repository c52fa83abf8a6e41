// Turns the compute rasteriser's visibility buffer into the offscreen colour and depth target,
// so the line overlays (drawn next in the same pass) and the blit see what the sprites would
// have left there. Uncovered pixels are discarded (the pass cleared them).

@group(2) @binding(0) var<storage, read> visibility64: array<vec2<u32>>;
@group(2) @binding(1) var<storage, read> depth_keys32: array<u32>;
@group(2) @binding(2) var<storage, read> colours32: array<u32>;

struct ResolveOut {
    @location(0) colour: vec4<f32>,
    @builtin(frag_depth) depth: f32,
};

@vertex
fn vs_main(@builtin(vertex_index) vertex_index: u32) -> @builtin(position) vec4<f32> {
    var positions = array<vec2<f32>, 3>(
        vec2<f32>(-1.0, -3.0),
        vec2<f32>(-1.0, 1.0),
        vec2<f32>(3.0, 1.0),
    );
    return vec4<f32>(positions[vertex_index], 0.0, 1.0);
}

fn pixel_at(position: vec4<f32>) -> u32 {
    return u32(position.y) * u32(view.viewport_px.x) + u32(position.x);
}

fn resolved(rgb: u32, key_depth: u32) -> ResolveOut {
    var out: ResolveOut;
    out.colour = vec4<f32>(
        f32(rgb & 0xffu),
        f32((rgb >> 8u) & 0xffu),
        f32((rgb >> 16u) & 0xffu),
        255.0,
    ) / 255.0;
    out.depth = bitcast<f32>(0xffffffffu - key_depth);
    return out;
}

@fragment
fn fs_resolve64(@builtin(position) position: vec4<f32>) -> ResolveOut {
    // Little-endian: .x is the low word (colour), .y the high word (depth key).
    let v = visibility64[pixel_at(position)];
    if v.y == 0u {
        discard;
    }
    return resolved(v.x, v.y);
}

@fragment
fn fs_resolve32(@builtin(position) position: vec4<f32>) -> ResolveOut {
    let i = pixel_at(position);
    let key_depth = depth_keys32[i];
    if key_depth == 0u {
        discard;
    }
    return resolved(colours32[i], key_depth);
}
