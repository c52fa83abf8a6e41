// The compute rasteriser's shared half (after Schütz, Kerbl and Wimmer, "Software Rasterization
// of 2 Billion Points in Real Time", HPG 2022): one thread per drawn point projects it and
// covers the same round footprint a sprite covers, writing with atomics into a per-pixel
// visibility buffer that a resolve pass (resolve.wgsl) turns into colour and depth.
// raster64.wgsl keeps depth and colour in one 64-bit word; raster32.wgsl takes two passes.

// One per chunk dispatch (a dynamic offset into one uniform buffer).
struct ChunkDraw {
    // Points drawn from this chunk (its length over the stride, rounded up).
    count: u32,
    // Dispatches wider than the per-dimension limit fold into y rows of this many threads.
    row_threads: u32,
    // The chunk's first point in the store (for the frame table).
    chunk_first: u32,
    pad0: u32,
};

@group(2) @binding(1) var<uniform> chunk_draw: ChunkDraw;

// Larger footprints would make one thread loop for long; sprites stop at 12 px in the UI.
const MAX_RADIUS_PX: f32 = 16.0;

struct Splat {
    // Framebuffer pixels (y down), the sprite's centre.
    centre: vec2<f32>,
    // Half the point size in pixels; negative: nothing drawn.
    radius: f32,
    // 0xffffffff minus the bits of the NDC depth: larger is nearer, 0 is "empty".
    key_depth: u32,
    // r | g << 8 | b << 16 | 1 << 24 (the top byte marks a covered pixel).
    rgb: u32,
};

fn drawn_index(gid: vec3<u32>) -> u32 {
    return gid.x + gid.y * chunk_draw.row_threads;
}

fn splat_of(k: u32) -> Splat {
    var s: Splat;
    s.radius = -1.0;
    if k >= chunk_draw.count {
        return s;
    }
    let p = load_point(k * view.stride, chunk_draw.chunk_first);
    if !p.kept {
        return s;
    }
    let world = vec4<f32>(p.position, 1.0);
    let clip = view.clip_from_world * world;
    if clip.w <= 0.0 {
        return s;
    }
    let ndc = clip.xyz / clip.w;
    // The sprite's four corners share this depth, so depth clipping drops all or nothing.
    if !(ndc.z >= 0.0 && ndc.z <= 1.0) {
        return s;
    }
    let radius = min(view.point_size_px * 0.5, MAX_RADIUS_PX);
    let centre = vec2<f32>(
        (ndc.x * 0.5 + 0.5) * view.viewport_px.x,
        (0.5 - ndc.y * 0.5) * view.viewport_px.y,
    );
    if centre.x + radius < 0.0 || centre.y + radius < 0.0
        || centre.x - radius > view.viewport_px.x || centre.y - radius > view.viewport_px.y {
        return s;
    }
    var depth_bits = bitcast<u32>(ndc.z);
    if depth_bits >= 0x80000000u {
        // -0.0: as near as +0.0.
        depth_bits = 0u;
    }
    var rgb = p.rgb;
    if view.colour_mode != COLOUR_RGB {
        let c = vec3<u32>(round(clamp(colour_of(p), vec3<f32>(0.0), vec3<f32>(1.0)) * 255.0));
        rgb = c.x | (c.y << 8u) | (c.z << 16u);
    }
    s.centre = centre;
    s.radius = radius;
    s.key_depth = 0xffffffffu - depth_bits;
    s.rgb = rgb | 0x01000000u;
    return s;
}

// Pixels whose centres lie in the splat's bounding square, clamped to the view: x0, y0, x1,
// y1 inclusive (empty when x1 < x0).
fn splat_rect(s: Splat) -> vec4<i32> {
    let size = vec2<i32>(view.viewport_px) - vec2<i32>(1);
    let lo = max(vec2<i32>(ceil(s.centre - s.radius - 0.5)), vec2<i32>(0));
    let hi = min(vec2<i32>(floor(s.centre + s.radius - 0.5)), size);
    return vec4<i32>(lo, hi);
}

// A sprite keeps the pixels whose centres lie inside its disc.
fn splat_covers(s: Splat, x: i32, y: i32) -> bool {
    let d = vec2<f32>(f32(x) + 0.5, f32(y) + 0.5) - s.centre;
    return dot(d, d) <= s.radius * s.radius;
}

fn pixel_of(x: i32, y: i32) -> u32 {
    return u32(y) * u32(view.viewport_px.x) + u32(x);
}
