// Points stored in full: 24 bytes (`GpuPoint` in src/viewer/chunks.rs), every value exact.

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

// Point `i` of the bound chunk, whose first point is `chunk_first` in the store.
fn load_point(i: u32, chunk_first: u32) -> Point {
    let s = points[i];
    return Point(
        vec3<f32>(s.x, s.y, s.z),
        s.rgb,
        s.confidence,
        s.frame,
        s.confidence >= view.confidence_threshold,
    );
}
