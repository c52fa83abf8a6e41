// The 64-bit compute rasteriser: depth key in the high word, colour in the low word, one
// atomicMax per covered pixel keeps the nearest point (ties: the larger colour). Needs wgpu's
// SHADER_INT64 and SHADER_INT64_ATOMIC_MIN_MAX.

@group(2) @binding(0) var<storage, read_write> visibility: array<atomic<u64>>;

@compute @workgroup_size(256)
fn cs_main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let s = splat_of(drawn_index(gid));
    if s.radius < 0.0 {
        return;
    }
    let key = (u64(s.key_depth) << 32u) | u64(s.rgb);
    let r = splat_rect(s);
    for (var y = r.y; y <= r.w; y++) {
        for (var x = r.x; x <= r.z; x++) {
            if splat_covers(s, x, y) {
                atomicMax(&visibility[pixel_of(x, y)], key);
            }
        }
    }
}
