// The 64-bit compute rasteriser: depth key in the high word, colour in the low word, one
// atomicMax per covered pixel keeps the nearest point (ties: the larger colour). Needs wgpu's
// SHADER_INT64 and SHADER_INT64_ATOMIC_MIN_MAX. `worth_writing` (raster64_peek.wgsl or
// raster64_blind.wgsl, prepended) says whether the point may still win the pixel.

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
            let i = pixel_of(x, y);
            if splat_covers(s, x, y) && worth_writing(i, s.key_depth) {
                atomicMax(&visibility[i], key);
            }
        }
    }
}
