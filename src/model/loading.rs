//! Small helpers that take typed layers out of a [`WeightStore`] with the shapes the model
//! expects, so each network piece states its parameters in one place.

use super::error::Result;
use super::ops::conv::Conv2d;
use super::ops::linear::Linear;
use super::ops::norm::LayerNorm;
use super::weights::WeightStore;

pub fn linear(store: &mut WeightStore, prefix: &str, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear {
        weight: store.take(&format!("{prefix}.weight"), &[out, inp])?,
        bias: Some(store.take(&format!("{prefix}.bias"), &[out])?),
        in_features: inp,
        out_features: out,
    })
}

pub fn layer_norm(
    store: &mut WeightStore,
    prefix: &str,
    dim: usize,
    eps: f32,
) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: Some(store.take(&format!("{prefix}.weight"), &[dim])?),
        bias: Some(store.take(&format!("{prefix}.bias"), &[dim])?),
        dim,
        eps,
    })
}

/// A conv layer `[out][in][k][k]`, with or without bias.
pub struct ConvSpec {
    pub out: usize,
    pub inp: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    pub bias: bool,
}

pub fn conv(store: &mut WeightStore, prefix: &str, spec: ConvSpec) -> Result<Conv2d> {
    let k = spec.kernel;
    Ok(Conv2d {
        weight: store.take(&format!("{prefix}.weight"), &[spec.out, spec.inp, k, k])?,
        bias: if spec.bias {
            Some(store.take(&format!("{prefix}.bias"), &[spec.out])?)
        } else {
            None
        },
        in_channels: spec.inp,
        out_channels: spec.out,
        kernel: k,
        stride: spec.stride,
        padding: spec.padding,
    })
}
