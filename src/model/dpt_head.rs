//! The DPT depth head: four tapped token maps reassembled into a feature pyramid, fused
//! coarse-to-fine, upsampled to the image and turned into depth and confidence.

use rayon::prelude::*;

use super::config::ModelConfig;
use super::error::Result;
use super::loading::{Conv, ConvSpec, FullConv, Norm, conv, full_conv, layer_norm};
use super::ops::conv::{ConvTransposeUpsample, FeatureMap};
use super::ops::resize::bilinear_align_corners;
use super::spec::SPECIAL_TOKENS;
use super::storage::{FilterLayout, Host, Loader, Storage};

/// How a projected tap is brought to its pyramid level.
pub(crate) enum Resize<S: Storage = Host> {
    Up(ConvTransposeUpsample<S::Filter, S::Bias>),
    Identity,
    Down(Conv<S>),
}

/// `RCU(x) = conv2(relu(conv1(relu(x)))) + relu(x)`: the reference's ReLU works in place on its
/// input, so the skip connection adds the rectified input, not `x` itself.
pub(crate) struct ResidualConvUnit<S: Storage = Host> {
    pub(crate) conv1: Conv<S>,
    pub(crate) conv2: Conv<S>,
}

impl ResidualConvUnit {
    fn forward(&self, x: &FeatureMap) -> FeatureMap {
        let mut rx = x.clone();
        relu(&mut rx.data);
        let mut y = self.conv1.forward(&rx);
        relu(&mut y.data);
        let mut y = self.conv2.forward(&y);
        for (a, b) in y.data.iter_mut().zip(&rx.data) {
            *a += b;
        }
        y
    }
}

pub(crate) struct FusionBlock<S: Storage = Host> {
    pub(crate) unit1: Option<ResidualConvUnit<S>>,
    pub(crate) unit2: ResidualConvUnit<S>,
    pub(crate) out_conv: Conv<S>,
}

impl FusionBlock {
    /// `out_conv(resize(RCU2(a + RCU1(b))))`, resized to `size` or ×2.
    fn forward(
        &self,
        a: &FeatureMap,
        skip: Option<&FeatureMap>,
        size: Option<(usize, usize)>,
    ) -> FeatureMap {
        let mut x = a.clone();
        if let (Some(unit1), Some(b)) = (&self.unit1, skip) {
            let r = unit1.forward(b);
            for (v, w) in x.data.iter_mut().zip(&r.data) {
                *v += w;
            }
        }
        let x = self.unit2.forward(&x);
        let (h, w) = size.unwrap_or((x.height * 2, x.width * 2));
        let x = bilinear_align_corners(&x, h, w);
        self.out_conv.forward(&x)
    }
}

/// The depth head's parameters in storage `S`; its last 1×1 convolution (32 → 2) is tiny and
/// stays f32 everywhere.
pub struct DptHead<S: Storage = Host> {
    pub(crate) norm: Norm<S>,
    pub(crate) projects: Vec<Conv<S>>,
    pub(crate) resize: Vec<Resize<S>>,
    pub(crate) layer_rn: Vec<Conv<S>>,
    /// refinenet1..4 in that order.
    pub(crate) refine: Vec<FusionBlock<S>>,
    pub(crate) output_conv1: Conv<S>,
    pub(crate) output_conv2a: Conv<S>,
    pub(crate) output_conv2b: FullConv<S>,
    pub(crate) patch: usize,
}

fn relu(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

impl<S: Storage> DptHead<S> {
    pub fn load(store: &mut Loader<S>, cfg: &ModelConfig) -> Result<Self> {
        let w = cfg.head_input_dim();
        let f = cfg.dpt_features;
        let o = &cfg.dpt_out;
        let spec = |out, inp, kernel, stride, padding, bias| ConvSpec {
            out,
            inp,
            kernel,
            stride,
            padding,
            bias,
        };
        let mut projects = Vec::new();
        for (i, &oc) in o.iter().enumerate() {
            projects.push(conv(
                store,
                &format!("depth_head.projects.{i}"),
                spec(oc, w, 1, 1, 0, true),
            )?);
        }
        let up = |store: &mut Loader<S>, i: usize, k: usize| -> Result<Resize<S>> {
            let c = o[i];
            Ok(Resize::Up(ConvTransposeUpsample {
                weight: store.filter(
                    &format!("depth_head.resize_layers.{i}.weight"),
                    &[c, c, k, k],
                    FilterLayout::ConvTranspose,
                )?,
                bias: store.bias(&format!("depth_head.resize_layers.{i}.bias"), &[c])?,
                in_channels: c,
                out_channels: c,
                kernel: k,
            }))
        };
        let resize = vec![
            up(store, 0, 4)?,
            up(store, 1, 2)?,
            Resize::Identity,
            Resize::Down(conv(
                store,
                "depth_head.resize_layers.3",
                spec(o[3], o[3], 3, 2, 1, true),
            )?),
        ];
        let mut layer_rn = Vec::new();
        for (i, &oc) in o.iter().enumerate() {
            layer_rn.push(conv(
                store,
                &format!("depth_head.scratch.layer{}_rn", i + 1),
                spec(f, oc, 3, 1, 1, false),
            )?);
        }
        let unit = |store: &mut Loader<S>, r: usize, u: usize| -> Result<ResidualConvUnit<S>> {
            let pre = format!("depth_head.scratch.refinenet{r}.resConfUnit{u}");
            Ok(ResidualConvUnit {
                conv1: conv(store, &format!("{pre}.conv1"), spec(f, f, 3, 1, 1, true))?,
                conv2: conv(store, &format!("{pre}.conv2"), spec(f, f, 3, 1, 1, true))?,
            })
        };
        let mut refine = Vec::new();
        for r in 1..=4 {
            refine.push(FusionBlock {
                unit1: if r == 4 {
                    None
                } else {
                    Some(unit(store, r, 1)?)
                },
                unit2: unit(store, r, 2)?,
                out_conv: conv(
                    store,
                    &format!("depth_head.scratch.refinenet{r}.out_conv"),
                    spec(f, f, 1, 1, 0, true),
                )?,
            });
        }
        Ok(DptHead {
            norm: layer_norm(store, "depth_head.norm", w, 1e-5)?,
            projects,
            resize,
            layer_rn,
            refine,
            output_conv1: conv(
                store,
                "depth_head.scratch.output_conv1",
                spec(f / 2, f, 3, 1, 1, true),
            )?,
            output_conv2a: conv(
                store,
                "depth_head.scratch.output_conv2.0",
                spec(32, f / 2, 3, 1, 1, true),
            )?,
            output_conv2b: full_conv(
                store,
                "depth_head.scratch.output_conv2.2",
                spec(2, 32, 1, 1, 0, true),
            )?,
            patch: cfg.patch,
        })
    }
}

impl DptHead {
    /// Raw 2-channel output `[S][2][H][W]` (log-depth and confidence logit) from the 4 taps,
    /// each `[S][P][2C]`.
    pub fn forward(
        &self,
        taps: &[Vec<f32>],
        frames: usize,
        height: usize,
        width: usize,
    ) -> Vec<f32> {
        let (ph, pw) = (height / self.patch, width / self.patch);
        let np = ph * pw;
        let p = SPECIAL_TOKENS + np;
        let mut out = Vec::with_capacity(frames * 2 * height * width);
        for s in 0..frames {
            out.extend(self.forward_frame(taps, s, p, ph, pw, height, width).data);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_frame(
        &self,
        taps: &[Vec<f32>],
        s: usize,
        p: usize,
        ph: usize,
        pw: usize,
        height: usize,
        width: usize,
    ) -> FeatureMap {
        let w = self.norm.dim;
        let np = ph * pw;
        let aspect = width as f64 / height as f64;
        let mut levels = Vec::with_capacity(4);
        for (i, tap) in taps.iter().enumerate() {
            let tokens = &tap[(s * p + SPECIAL_TOKENS) * w..(s + 1) * p * w];
            let normed = self.norm.forward(tokens);
            // [Np][W] → [W][ph][pw]
            let mut map = FeatureMap::zeros(w, ph, pw);
            map.data
                .par_chunks_mut(np)
                .enumerate()
                .for_each(|(ch, plane)| {
                    for t in 0..np {
                        plane[t] = normed[t * w + ch];
                    }
                });
            let mut x = self.projects[i].forward(&map);
            add_uv_embedding(&mut x, aspect);
            let x = match &self.resize[i] {
                Resize::Up(t) => t.forward(&x),
                Resize::Identity => x,
                Resize::Down(c) => c.forward(&x),
            };
            levels.push(self.layer_rn[i].forward(&x));
        }
        let size = |m: &FeatureMap| Some((m.height, m.width));
        let r4 = self.refine[3].forward(&levels[3], None, size(&levels[2]));
        let r3 = self.refine[2].forward(&r4, Some(&levels[2]), size(&levels[1]));
        let r2 = self.refine[1].forward(&r3, Some(&levels[1]), size(&levels[0]));
        let r1 = self.refine[0].forward(&r2, Some(&levels[0]), None);
        let x = self.output_conv1.forward(&r1);
        let mut x = bilinear_align_corners(&x, height, width);
        add_uv_embedding(&mut x, aspect);
        let mut x = self.output_conv2a.forward(&x);
        relu(&mut x.data);
        self.output_conv2b.forward(&x)
    }
}

/// Add the sin/cos embedding of a centred UV grid (scaled by 0.1) to a feature map: the first
/// half of the channels encode x, the second half y; each half is [sin ω_k v, cos ω_k v].
pub fn add_uv_embedding(x: &mut FeatureMap, aspect: f64) {
    let (h, w, c) = (x.height, x.width, x.channels);
    let diag = (aspect * aspect + 1.0).sqrt();
    let span_x = (aspect / diag) as f32;
    let span_y = (1.0 / diag) as f32;
    let xs = linspace_f32(
        -span_x * (w as f32 - 1.0) / w as f32,
        span_x * (w as f32 - 1.0) / w as f32,
        w,
    );
    let ys = linspace_f32(
        -span_y * (h as f32 - 1.0) / h as f32,
        span_y * (h as f32 - 1.0) / h as f32,
        h,
    );
    let quarter = c / 4;
    let omega: Vec<f64> = (0..quarter)
        .map(|k| 1.0 / 100f64.powf(k as f64 / quarter as f64))
        .collect();
    x.data
        .par_chunks_mut(h * w)
        .enumerate()
        .for_each(|(ch, plane)| {
            let (from_x, within) = if ch < c / 2 {
                (true, ch)
            } else {
                (false, ch - c / 2)
            };
            let (k, use_cos) = if within < quarter {
                (within, false)
            } else {
                (within - quarter, true)
            };
            for r in 0..h {
                for col in 0..w {
                    let v = if from_x { xs[col] } else { ys[r] } as f64;
                    let a = v * omega[k];
                    let e = if use_cos { a.cos() } else { a.sin() } as f32;
                    plane[r * w + col] += e * 0.1;
                }
            }
        });
}

/// `torch.linspace` in f32: the first half counts up from `start`, the second down from `end`.
fn linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps as f32 - 1.0);
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}
