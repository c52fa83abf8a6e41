// How points are stored: 16 bytes (`CompactPoint` in src/viewer/point_format.rs): xyz and one
// word of r, g, b and the high byte of a 16-bit code of ln(confidence) (`LN_CONFIDENCE_MIN` +
// code * `LN_CONFIDENCE_STEP`), whose low byte sits in x's lowest 8 mantissa bits (masked off
// when x is read: x is kept to 2^-15 of itself). The frame comes from the frame table.

const LN_CONFIDENCE_MIN: f32 = -9.21034;
const LN_CONFIDENCE_STEP: f32 = 0.00042162236;

struct StoredPoint {
    x: f32,
    y: f32,
    z: f32,
    // r | g << 8 | b << 16 | confidence code's high byte << 24
    packed: u32,
};

@group(1) @binding(0) var<storage, read> points: array<StoredPoint>;

// Point `i` of the bound chunk, whose first point is `chunk_first` in the store.
fn load_point(i: u32, chunk_first: u32) -> Point {
    let s = points[i];
    let x_bits = bitcast<u32>(s.x);
    let code = ((s.packed >> 24u) << 8u) | (x_bits & 0xffu);
    var frame = 0u;
    if view.colour_mode == COLOUR_FRAME_AGE {
        frame = frame_of(chunk_first + i);
    }
    var confidence = 0.0;
    if view.colour_mode == COLOUR_CONFIDENCE {
        confidence = exp(LN_CONFIDENCE_MIN + f32(code) * LN_CONFIDENCE_STEP);
    }
    return Point(
        vec3<f32>(bitcast<f32>(x_bits & 0xffffff00u), s.y, s.z),
        s.packed & 0x00ffffffu,
        confidence,
        frame,
        // The threshold is compared as a code too (worked out on the CPU), so a point and a
        // threshold that round to the same step agree.
        code >= view.threshold_code,
    );
}
