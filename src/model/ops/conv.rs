//! Convolutions for the DPT head on `[channels][height][width]` maps: a general conv2d (im2col
//! in bounded row chunks + gemm) and the stride-equals-kernel transposed convolution the head
//! uses for upsampling.

use rayon::prelude::*;

use super::linear::{Strides, strided_matmul};

/// A feature map of one frame.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureMap {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub data: Vec<f32>,
}

impl FeatureMap {
    pub fn zeros(channels: usize, height: usize, width: usize) -> Self {
        FeatureMap {
            channels,
            height,
            width,
            data: vec![0.0; channels * height * width],
        }
    }
    pub fn plane(&self) -> usize {
        self.height * self.width
    }
}

/// Conv2d weights, on the CPU in PyTorch layout `[out][in][kh][kw]` (filter `F`, bias `B`).
#[derive(Clone, Debug)]
pub struct Conv2d<F = Vec<f32>, B = F> {
    pub weight: F,
    pub bias: Option<B>,
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

/// Upper bound for one im2col buffer, in f32 values (32 MiB).
const IM2COL_BUDGET: usize = 8 << 20;

impl Conv2d {
    pub fn forward(&self, x: &FeatureMap) -> FeatureMap {
        debug_assert_eq!(x.channels, self.in_channels);
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let oh = (x.height + 2 * p - k) / s + 1;
        let ow = (x.width + 2 * p - k) / s + 1;
        let mut out = FeatureMap::zeros(self.out_channels, oh, ow);
        if let Some(b) = &self.bias {
            for (co, plane) in out.data.chunks_exact_mut(oh * ow).enumerate() {
                plane.fill(b[co]);
            }
        }
        let kk = self.in_channels * k * k;
        let rows_per_chunk = (IM2COL_BUDGET / (kk * ow).max(1)).clamp(1, oh);
        let out_plane = oh * ow;
        for r0 in (0..oh).step_by(rows_per_chunk) {
            let nr = rows_per_chunk.min(oh - r0);
            let npix = nr * ow;
            let cols = if k == 1 && s == 1 && p == 0 {
                // A 1×1 convolution reads the input rows directly.
                x.data
                    .chunks_exact(x.plane())
                    .flat_map(|plane| plane[r0 * ow..r0 * ow + npix].iter().copied())
                    .collect::<Vec<f32>>()
            } else {
                im2col(x, k, s, p, r0, nr, ow)
            };
            // out[co][r0*ow + j] += W[co][kk] · cols[kk][j]
            strided_matmul(
                (self.out_channels, npix, kk),
                &mut out.data[r0 * ow..],
                Strides {
                    row: out_plane,
                    col: 1,
                },
                &self.weight,
                Strides { row: kk, col: 1 },
                &cols,
                Strides { row: npix, col: 1 },
                true,
            );
        }
        out
    }
}

/// `[in·k·k][rows·ow]` patch matrix for output rows `r0..r0+nr`, zero outside the input.
fn im2col(
    x: &FeatureMap,
    k: usize,
    s: usize,
    p: usize,
    r0: usize,
    nr: usize,
    ow: usize,
) -> Vec<f32> {
    let npix = nr * ow;
    let mut cols = vec![0.0f32; x.channels * k * k * npix];
    cols.par_chunks_mut(npix)
        .enumerate()
        .for_each(|(row, dst)| {
            let ci = row / (k * k);
            let ky = (row / k) % k;
            let kx = row % k;
            let plane = &x.data[ci * x.plane()..(ci + 1) * x.plane()];
            for r in 0..nr {
                let iy = ((r0 + r) * s + ky) as isize - p as isize;
                if iy < 0 || iy >= x.height as isize {
                    continue;
                }
                let src_row = &plane[iy as usize * x.width..(iy as usize + 1) * x.width];
                for c in 0..ow {
                    let ix = (c * s + kx) as isize - p as isize;
                    if ix >= 0 && (ix as usize) < x.width {
                        dst[r * ow + c] = src_row[ix as usize];
                    }
                }
            }
        });
    cols
}

/// Transposed convolution whose stride equals its kernel (non-overlapping upsampling), weights
/// in PyTorch layout `[in][out][k][k]`.
#[derive(Clone, Debug)]
pub struct ConvTransposeUpsample<F = Vec<f32>, B = F> {
    pub weight: F,
    pub bias: B,
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
}

impl ConvTransposeUpsample {
    pub fn forward(&self, x: &FeatureMap) -> FeatureMap {
        let k = self.kernel;
        let (h, w) = (x.height, x.width);
        let m = self.out_channels * k * k;
        let npix = h * w;
        // y[(co,ky,kx)][pix] = Σ_ci W[ci][(co,ky,kx)] · x[ci][pix]
        let mut y = vec![0.0f32; m * npix];
        strided_matmul(
            (m, npix, self.in_channels),
            &mut y,
            Strides { row: npix, col: 1 },
            &self.weight,
            Strides { row: 1, col: m },
            &x.data,
            Strides { row: npix, col: 1 },
            false,
        );
        let (oh, ow) = (h * k, w * k);
        let mut out = FeatureMap::zeros(self.out_channels, oh, ow);
        out.data
            .par_chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(co, plane)| {
                for ky in 0..k {
                    for kx in 0..k {
                        let src = &y[((co * k + ky) * k + kx) * npix..][..npix];
                        for iy in 0..h {
                            for ix in 0..w {
                                plane[(iy * k + ky) * ow + ix * k + kx] =
                                    src[iy * w + ix] + self.bias[co];
                            }
                        }
                    }
                }
            });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_conv(x: &FeatureMap, c: &Conv2d) -> FeatureMap {
        let (k, s, p) = (c.kernel, c.stride, c.padding);
        let oh = (x.height + 2 * p - k) / s + 1;
        let ow = (x.width + 2 * p - k) / s + 1;
        let mut out = FeatureMap::zeros(c.out_channels, oh, ow);
        for co in 0..c.out_channels {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = c.bias.as_ref().map_or(0.0, |b| b[co]);
                    for ci in 0..c.in_channels {
                        for ky in 0..k {
                            for kx in 0..k {
                                let iy = (oy * s + ky) as isize - p as isize;
                                let ix = (ox * s + kx) as isize - p as isize;
                                if iy >= 0
                                    && ix >= 0
                                    && (iy as usize) < x.height
                                    && (ix as usize) < x.width
                                {
                                    acc += c.weight[((co * c.in_channels + ci) * k + ky) * k + kx]
                                        * x.data
                                            [(ci * x.height + iy as usize) * x.width + ix as usize];
                                }
                            }
                        }
                    }
                    out.data[(co * oh + oy) * ow + ox] = acc;
                }
            }
        }
        out
    }

    #[test]
    fn conv_matches_naive() {
        let x = FeatureMap {
            channels: 3,
            height: 7,
            width: 6,
            data: (0..3 * 42).map(|i| (i as f32 * 0.37).sin()).collect(),
        };
        for (k, s, p) in [(3, 1, 1), (3, 2, 1), (1, 1, 0)] {
            let c = Conv2d {
                weight: (0..4 * 3 * k * k)
                    .map(|i| (i as f32 * 0.21).cos())
                    .collect(),
                bias: Some(vec![0.1, 0.2, 0.3, 0.4]),
                in_channels: 3,
                out_channels: 4,
                kernel: k,
                stride: s,
                padding: p,
            };
            let got = c.forward(&x);
            let want = naive_conv(&x, &c);
            assert_eq!((got.height, got.width), (want.height, want.width));
            for (a, b) in got.data.iter().zip(&want.data) {
                assert!((a - b).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn transposed_conv_places_kernels() {
        let x = FeatureMap {
            channels: 1,
            height: 1,
            width: 2,
            data: vec![1.0, 2.0],
        };
        let t = ConvTransposeUpsample {
            weight: vec![1.0, 2.0, 3.0, 4.0],
            bias: vec![0.5],
            in_channels: 1,
            out_channels: 1,
            kernel: 2,
        };
        let y = t.forward(&x);
        assert_eq!(y.data, vec![1.5, 2.5, 2.5, 4.5, 3.5, 4.5, 6.5, 8.5]);
    }
}
