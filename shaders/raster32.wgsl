// The 32-bit compute rasteriser for adapters without 64-bit atomics: a depth pass (atomicMax
// of the depth key) and a colour pass (where a point's depth key won, atomicMax of its colour,
// so ties resolve as in the 64-bit path).

@group(2) @binding(0) var<storage, read_write> depth_keys: array<atomic<u32>>;
@group(2) @binding(2) var<storage, read_write> colours: array<atomic<u32>>;

@compute @workgroup_size(256)
fn cs_depth(@builtin(global_invocation_id) gid: vec3<u32>) {
    let s = splat_of(drawn_index(gid));
    if s.radius < 0.0 {
        return;
    }
    let r = splat_rect(s);
    for (var y = r.y; y <= r.w; y++) {
        for (var x = r.x; x <= r.z; x++) {
            let i = pixel_of(x, y);
            // A plain load first: most points lose, and a load is cheaper than an atomic write.
            if splat_covers(s, x, y) && atomicLoad(&depth_keys[i]) < s.key_depth {
                atomicMax(&depth_keys[i], s.key_depth);
            }
        }
    }
}

@compute @workgroup_size(256)
fn cs_colour(@builtin(global_invocation_id) gid: vec3<u32>) {
    let s = splat_of(drawn_index(gid));
    if s.radius < 0.0 {
        return;
    }
    let r = splat_rect(s);
    for (var y = r.y; y <= r.w; y++) {
        for (var x = r.x; x <= r.z; x++) {
            let i = pixel_of(x, y);
            if splat_covers(s, x, y) && atomicLoad(&depth_keys[i]) == s.key_depth {
                atomicMax(&colours[i], s.rgb);
            }
        }
    }
}
