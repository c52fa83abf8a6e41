//! How a point is stored on the GPU: 16 bytes, xyz f32, 8-bit RGB and a 16-bit code of
//! ln(confidence), whose low byte takes the place of the lowest 8 mantissa bits of x (x keeps 15
//! bits of relative precision: 0.3 mm at 10 m). The frame comes from the store's frame table,
//! since a chunk holds whole frames in order.
//!
//! Both paths read it through `load_point` (shaders/stored_point.wgsl). A 24-byte format with
//! every value exact was measured beside it on the H200 and lost (docs/viewer.md): it drew no
//! faster and took half as much memory again, so it was deleted.

use bytemuck::{Pod, Zeroable};

use crate::frame::FrameResult;

/// Bytes of one stored point.
pub const POINT_BYTES: u64 = std::mem::size_of::<CompactPoint>() as u64;

/// One point as stored (`StoredPoint` in shaders/stored_point.wgsl).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
pub struct CompactPoint {
    /// x's lowest 8 mantissa bits hold the confidence code's low byte.
    pub xyz: [f32; 3],
    /// r | g << 8 | b << 16 | confidence code's high byte << 24
    pub packed: u32,
}

/// ln of the smallest confidence the compact code tells apart (10^-4); smaller ones read as it.
pub const LN_CONFIDENCE_MIN: f32 = -9.210_34;
/// Code steps over ln(10^-4)..ln(10^8): 65535 steps of 12·ln(10)/65535.
pub const LN_CONFIDENCE_STEP: f32 = 12.0 * std::f32::consts::LN_10 / 65535.0;

/// The 16-bit code of a confidence (nearest step of its log; out of range clamps).
pub fn confidence_code(confidence: f32) -> u16 {
    let ln = quick_ln(confidence.max(f32::MIN_POSITIVE));
    let steps = ((ln - LN_CONFIDENCE_MIN) / LN_CONFIDENCE_STEP).clamp(0.0, 65535.0);
    // + 0.5 and truncate: rounds as `round` does for these non-negative values, without the
    // library call `round` is on baseline x86-64.
    (steps + 0.5) as u16
}

/// ln(x) for positive normal x, to about 1e-6: the exponent's bits plus ln of the mantissa
/// in [1, 2) by the atanh series (t ≤ 1/3, five terms). Encoding a frame's points takes one a
/// point, and the library `ln` is three times slower than the rest of the encoding together.
fn quick_ln(x: f32) -> f32 {
    let bits = x.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32 - 127;
    let mantissa = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let t = (mantissa - 1.0) / (mantissa + 1.0);
    let t2 = t * t;
    let series = 1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0))));
    exponent as f32 * std::f32::consts::LN_2 + 2.0 * t * series
}

/// The confidence a code stands for.
pub fn confidence_of_code(code: u16) -> f32 {
    (LN_CONFIDENCE_MIN + f32::from(code) * LN_CONFIDENCE_STEP).exp()
}

impl CompactPoint {
    pub fn new(xyz: [f32; 3], rgb: [u8; 3], confidence: f32) -> Self {
        let code = u32::from(confidence_code(confidence));
        let x = f32::from_bits((xyz[0].to_bits() & !0xff) | (code & 0xff));
        Self {
            xyz: [x, xyz[1], xyz[2]],
            packed: u32::from(rgb[0])
                | (u32::from(rgb[1]) << 8)
                | (u32::from(rgb[2]) << 16)
                | ((code >> 8) << 24),
        }
    }

    /// The confidence code back from its two bytes.
    pub fn confidence_code(&self) -> u16 {
        (((self.packed >> 24) << 8) | (self.xyz[0].to_bits() & 0xff)) as u16
    }
}

/// The result's first `count` points as stored, into `out` (replaced). Large frames are encoded
/// on rayon's pool: a frame of 307 k points takes a few ms on one core (a logarithm a point), and
/// the window does this on its UI thread.
pub fn encode_points(result: &FrameResult, count: usize, out: &mut Vec<u8>) {
    /// Points per task: small enough to spread a frame, large enough to amortise a task.
    const PER_TASK: usize = 16 * 1024;
    let p = &result.points;
    let count = count
        .min(p.xyz.len())
        .min(p.rgb.len())
        .min(p.confidence.len());
    let size = POINT_BYTES as usize;
    out.clear();
    out.resize(count * size, 0);
    let encode_run = |first: usize, dst: &mut [u8]| {
        for (k, slot) in dst.chunks_exact_mut(size).enumerate() {
            let i = first + k;
            let point = CompactPoint::new(p.xyz[i], p.rgb[i], p.confidence[i]);
            slot.copy_from_slice(bytemuck::bytes_of(&point));
        }
    };
    if count <= PER_TASK {
        encode_run(0, out);
    } else {
        use rayon::prelude::*;
        out.par_chunks_mut(PER_TASK * size)
            .enumerate()
            .for_each(|(task, dst)| encode_run(task * PER_TASK, dst));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_points_are_16_bytes_and_pack_rgb_and_confidence() {
        assert_eq!(std::mem::size_of::<CompactPoint>(), 16);
        assert_eq!(POINT_BYTES, 16);
        let p = CompactPoint::new([1.0, 2.0, 3.0], [1, 2, 3], 1.0);
        assert_eq!(p.packed & 0x00ff_ffff, 0x0003_0201);
        assert_eq!(p.confidence_code(), confidence_code(1.0));
        assert_eq!(p.xyz[1..], [2.0, 3.0]);
        // x keeps all but its lowest 8 mantissa bits.
        for x in [1.0f32, -3.7, 12.25, 1e-3, 250.0] {
            let q = CompactPoint::new([x, 0.0, 0.0], [0; 3], 42.0);
            assert!(
                ((q.xyz[0] - x) / x).abs() < 1.0 / 32768.0,
                "{x} -> {}",
                q.xyz[0]
            );
            assert_eq!(q.confidence_code(), confidence_code(42.0));
        }
    }

    #[test]
    fn encoding_on_the_pool_matches_one_point_at_a_time() {
        let mut stream = crate::viewer::demo::DemoStream::new(crate::viewer::demo::DemoConfig {
            width: 256,
            height: 192,
            ..Default::default()
        });
        let r = stream.next_result();
        let n = r.points.len();
        assert!(n > 40_000, "several tasks' worth: {n}");
        let mut out = vec![7u8; 3];
        encode_points(&r, n - 5, &mut out);
        assert_eq!(out.len() as u64, (n as u64 - 5) * POINT_BYTES);
        for i in [0, 1, 16_383, 16_384, 40_000, n - 6] {
            let at = i * POINT_BYTES as usize;
            let expected =
                CompactPoint::new(r.points.xyz[i], r.points.rgb[i], r.points.confidence[i]);
            assert_eq!(
                &out[at..at + POINT_BYTES as usize],
                bytemuck::bytes_of(&expected),
                "point {i}"
            );
        }
    }

    #[test]
    fn quick_ln_is_ln() {
        let mut x = f32::MIN_POSITIVE;
        while x < 1e30 {
            let (a, b) = (quick_ln(x), x.ln());
            assert!((a - b).abs() < 2e-5 * b.abs().max(1.0), "{x}: {a} vs {b}");
            x *= 1.013;
        }
    }

    #[test]
    fn confidence_codes_keep_it_to_a_fraction_of_a_percent() {
        for c in [
            2e-4f32, 0.02, 0.5, 1.0, 1.7, 3.0, 9.9, 42.0, 700.0, 9000.0, 5e7,
        ] {
            let back = confidence_of_code(confidence_code(c));
            assert!((back / c - 1.0).abs() < 5e-4, "{c} -> {back}");
        }
        // Out of range clamps; zero and negatives read as the smallest.
        assert_eq!(confidence_code(0.0), 0);
        assert_eq!(confidence_code(-3.0), 0);
        assert_eq!(confidence_code(1e9), 65535);
        // Monotonic.
        let mut last = 0;
        for i in 0..3000 {
            let code = confidence_code(1e-4 * 1.01f32.powi(i));
            assert!(code >= last);
            last = code;
        }
    }
}
