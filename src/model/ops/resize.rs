//! Resampling: bilinear with `align_corners=True` (DPT head), and the separable antialiased
//! bicubic resampler shared by PyTorch's `_upsample_bicubic2d_aa` and PIL's `BICUBIC` resize
//! (same filter, a = -0.5, support widened by the downscale factor).

use rayon::prelude::*;

use super::conv::FeatureMap;

/// Bilinear resize of every channel, `align_corners=True` (corner pixels map onto corners).
pub fn bilinear_align_corners(x: &FeatureMap, out_h: usize, out_w: usize) -> FeatureMap {
    // Source coordinates in f32, as PyTorch computes them for f32 tensors.
    let axis = |inp: usize, out: usize| -> Vec<(usize, usize, f32)> {
        let scale = if out > 1 {
            (inp as f32 - 1.0) / (out as f32 - 1.0)
        } else {
            0.0
        };
        (0..out)
            .map(|o| {
                let src = scale * o as f32;
                let i0 = (src.floor() as usize).min(inp - 1);
                let i1 = if i0 + 1 < inp { i0 + 1 } else { i0 };
                (i0, i1, src - i0 as f32)
            })
            .collect()
    };
    let ys = axis(x.height, out_h);
    let xs = axis(x.width, out_w);
    let mut out = FeatureMap::zeros(x.channels, out_h, out_w);
    out.data
        .par_chunks_mut(out_h * out_w)
        .zip(x.data.par_chunks(x.plane()))
        .for_each(|(dst, src)| {
            for (oy, &(y0, y1, ly)) in ys.iter().enumerate() {
                for (ox, &(x0, x1, lx)) in xs.iter().enumerate() {
                    let top = (1.0 - lx) * src[y0 * x.width + x0] + lx * src[y0 * x.width + x1];
                    let bot = (1.0 - lx) * src[y1 * x.width + x0] + lx * src[y1 * x.width + x1];
                    dst[oy * out_w + ox] = (1.0 - ly) * top + ly * bot;
                }
            }
        });
    out
}

/// Keys' cubic convolution kernel with a = -0.5 (the antialiasing resamplers' choice).
fn cubic_aa(x: f64) -> f64 {
    let a = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

/// For each output index: first input index and normalised weights.
pub fn aa_bicubic_weights(in_size: usize, out_size: usize) -> Vec<(usize, Vec<f64>)> {
    let scale = in_size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = 2.0 * filter_scale;
    let inv = 1.0 / filter_scale;
    (0..out_size)
        .map(|i| {
            let center = scale * (i as f64 + 0.5);
            // Truncation toward zero, as the C code's casts do.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64).max(0) as usize;
            let mut w: Vec<f64> = (xmin..xmax)
                .map(|j| cubic_aa((j as f64 - center + 0.5) * inv))
                .collect();
            let total: f64 = w.iter().sum();
            if total != 0.0 {
                for v in &mut w {
                    *v /= total;
                }
            }
            (xmin, w)
        })
        .collect()
}

/// Antialiased bicubic resize of `[channels][h][w]` planes: width pass first, then height
/// (PyTorch's order for the separable AA kernels). `round_between` clamps and rounds to 8-bit
/// levels after each pass, the way PIL resizes 8-bit images (values given in 0..=255).
pub fn resize_bicubic_aa(
    x: &FeatureMap,
    out_h: usize,
    out_w: usize,
    round_between: bool,
) -> FeatureMap {
    let wx = aa_bicubic_weights(x.width, out_w);
    let wy = aa_bicubic_weights(x.height, out_h);
    let quantise = |v: f64| -> f32 {
        if round_between {
            v.round().clamp(0.0, 255.0) as f32
        } else {
            v as f32
        }
    };
    let mut out = FeatureMap::zeros(x.channels, out_h, out_w);
    out.data
        .par_chunks_mut(out_h * out_w)
        .zip(x.data.par_chunks(x.plane()))
        .for_each(|(dst, src)| {
            let mut tmp = vec![0.0f32; x.height * out_w];
            for r in 0..x.height {
                let row = &src[r * x.width..(r + 1) * x.width];
                for (o, (start, w)) in wx.iter().enumerate() {
                    let v: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(j, &wj)| wj * row[start + j] as f64)
                        .sum();
                    tmp[r * out_w + o] = quantise(v);
                }
            }
            for (o, (start, w)) in wy.iter().enumerate() {
                for c in 0..out_w {
                    let v: f64 = w
                        .iter()
                        .enumerate()
                        .map(|(j, &wj)| wj * tmp[(start + j) * out_w + c] as f64)
                        .sum();
                    dst[o * out_w + c] = quantise(v);
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_identity() {
        let x = FeatureMap {
            channels: 1,
            height: 3,
            width: 4,
            data: (0..12).map(|i| i as f32).collect(),
        };
        assert_eq!(resize_bicubic_aa(&x, 3, 4, false).data, x.data);
        assert_eq!(bilinear_align_corners(&x, 3, 4).data, x.data);
    }

    #[test]
    fn bilinear_corners_align() {
        let x = FeatureMap {
            channels: 1,
            height: 2,
            width: 2,
            data: vec![0.0, 1.0, 2.0, 3.0],
        };
        let y = bilinear_align_corners(&x, 3, 3);
        assert_eq!(y.data, vec![0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 2.5, 3.0]);
    }
}
