//! Small helpers that take typed layers out of a [`Loader`] with the shapes the model expects,
//! so each network piece states its parameters in one place, for every storage.

use super::error::Result;
use super::ops::conv::Conv2d;
use super::ops::linear::Linear;
use super::ops::norm::LayerNorm;
use super::storage::{FilterLayout, Loader, Storage};

/// A product layer: matrix weight, bias.
pub type MatLinear<S> = Linear<<S as Storage>::Matrix, <S as Storage>::Bias>;
/// A small layer kept in f32 everywhere (its consumers read f32).
pub type FullLinear<S> = Linear<<S as Storage>::Full, <S as Storage>::Full>;
/// A LayerNorm's parameters.
pub type Norm<S> = LayerNorm<<S as Storage>::Full>;
/// A convolution: filter, bias.
pub type Conv<S> = Conv2d<<S as Storage>::Filter, <S as Storage>::Bias>;
/// A convolution kept in f32 everywhere.
pub type FullConv<S> = Conv2d<<S as Storage>::Full, <S as Storage>::Full>;

pub fn linear<S: Storage>(
    l: &mut Loader<S>,
    prefix: &str,
    out: usize,
    inp: usize,
) -> Result<MatLinear<S>> {
    Ok(Linear {
        weight: l.matrix(&format!("{prefix}.weight"), &[out, inp])?,
        bias: Some(l.bias(&format!("{prefix}.bias"), &[out])?),
        in_features: inp,
        out_features: out,
    })
}

pub fn full_linear<S: Storage>(
    l: &mut Loader<S>,
    prefix: &str,
    out: usize,
    inp: usize,
) -> Result<FullLinear<S>> {
    Ok(Linear {
        weight: l.full(&format!("{prefix}.weight"), &[out, inp])?,
        bias: Some(l.full(&format!("{prefix}.bias"), &[out])?),
        in_features: inp,
        out_features: out,
    })
}

pub fn layer_norm<S: Storage>(
    l: &mut Loader<S>,
    prefix: &str,
    dim: usize,
    eps: f32,
) -> Result<Norm<S>> {
    Ok(LayerNorm {
        weight: Some(l.full(&format!("{prefix}.weight"), &[dim])?),
        bias: Some(l.full(&format!("{prefix}.bias"), &[dim])?),
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

pub fn conv<S: Storage>(l: &mut Loader<S>, prefix: &str, spec: ConvSpec) -> Result<Conv<S>> {
    let k = spec.kernel;
    Ok(Conv2d {
        weight: l.filter(
            &format!("{prefix}.weight"),
            &[spec.out, spec.inp, k, k],
            FilterLayout::Conv2d,
        )?,
        bias: if spec.bias {
            Some(l.bias(&format!("{prefix}.bias"), &[spec.out])?)
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

/// A conv layer kept in f32 everywhere.
pub fn full_conv<S: Storage>(
    l: &mut Loader<S>,
    prefix: &str,
    spec: ConvSpec,
) -> Result<FullConv<S>> {
    let k = spec.kernel;
    Ok(Conv2d {
        weight: l.full(&format!("{prefix}.weight"), &[spec.out, spec.inp, k, k])?,
        bias: if spec.bias {
            Some(l.full(&format!("{prefix}.bias"), &[spec.out])?)
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
