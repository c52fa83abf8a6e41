//! The model's weight tree on the device: [`Device`] is the [`Storage`] the GPU engine
//! instantiates `GctModel` with, and [`DevicePlacement`] moves each tensor there straight from
//! the checkpoint (one tensor at a time on the host, converted on the way): matrices and
//! filters as bf16 (the reference casts the aggregator to bf16 too; filters reordered for the
//! NHWC products), norms, LayerScale gammas, tokens and the small f32 layers as f32, biases in
//! both (the aggregator's and DPT's GEMM epilogues read bf16, the camera head's kernels f32).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use super::arena::DevPtr;
use super::{CudaDevice, CudaError};
use crate::model::GctModel;
use crate::model::block::TransformerBlock;
use crate::model::ops::conv::{Conv2d, ConvTransposeUpsample};
use crate::model::ops::linear::Linear;
use crate::model::ops::norm::LayerNorm;
use crate::model::storage::{FilterLayout, PlaceError, PlaceResult, Placement, Storage};

/// Tensors in GPU memory.
pub struct Device;

/// A bias in both precisions its consumers read (biases are a few KB each).
pub struct DeviceBias {
    pub f32: CudaSlice<f32>,
    pub bf16: CudaSlice<bf16>,
}

impl Storage for Device {
    type Matrix = CudaSlice<bf16>;
    type Full = CudaSlice<f32>;
    /// Conv2d `[out][kh][kw][in]`; ConvTranspose2d `[kh][kw][out][in]` (GEMM rows ordered so
    /// that the pixel shuffle moves contiguous channel runs).
    type Filter = CudaSlice<bf16>;
    type Bias = DeviceBias;
}

/// The whole model on one GPU.
pub type DeviceModel = GctModel<Device>;
/// A product layer on the device: bf16 weight, bias in both precisions.
pub type DeviceLinear = Linear<CudaSlice<bf16>, DeviceBias>;
/// A LayerNorm's f32 parameters on the device.
pub type DeviceNorm = LayerNorm<CudaSlice<f32>>;

/// Uploads each tensor as it is read (on the device's stream); counts the device bytes.
pub struct DevicePlacement {
    stream: Arc<CudaStream>,
    bytes: usize,
}

impl DevicePlacement {
    pub fn new(dev: &CudaDevice) -> Self {
        Self {
            stream: Arc::clone(&dev.stream),
            bytes: 0,
        }
    }

    /// Device bytes of everything placed so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn bf16(&mut self, values: &[f32]) -> Result<CudaSlice<bf16>, CudaError> {
        use rayon::prelude::*;
        // In parallel: a billion parameters pass through here at startup.
        let converted: Vec<bf16> = values.par_iter().map(|&v| bf16::from_f32(v)).collect();
        self.bytes += 2 * converted.len();
        Ok(self.stream.clone_htod(&converted)?)
    }

    fn f32(&mut self, values: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
        self.bytes += 4 * values.len();
        Ok(self.stream.clone_htod(values)?)
    }
}

/// `[out][in][k][k]` to `[out][k][k][in]`.
fn conv_to_nhwc(w: &[f32], cout: usize, cin: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; w.len()];
    for co in 0..cout {
        for ci in 0..cin {
            for ky in 0..k {
                for kx in 0..k {
                    out[((co * k + ky) * k + kx) * cin + ci] =
                        w[((co * cin + ci) * k + ky) * k + kx];
                }
            }
        }
    }
    out
}

/// `[in][out][k][k]` to `[k][k][out][in]`.
fn conv_transpose_to_gemm(w: &[f32], cin: usize, cout: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; w.len()];
    for ci in 0..cin {
        for co in 0..cout {
            for ky in 0..k {
                for kx in 0..k {
                    out[((ky * k + kx) * cout + co) * cin + ci] =
                        w[((ci * cout + co) * k + ky) * k + kx];
                }
            }
        }
    }
    out
}

impl Placement<Device> for DevicePlacement {
    fn matrix(&mut self, _: &[usize], values: Vec<f32>) -> PlaceResult<CudaSlice<bf16>> {
        Ok(self.bf16(&values)?)
    }

    fn full(&mut self, _: &[usize], values: Vec<f32>) -> PlaceResult<CudaSlice<f32>> {
        Ok(self.f32(&values)?)
    }

    fn filter(
        &mut self,
        shape: &[usize],
        values: Vec<f32>,
        layout: FilterLayout,
    ) -> PlaceResult<CudaSlice<bf16>> {
        let &[a, b, k, k2] = shape else {
            return Err(format!("a filter needs 4 dimensions, got {shape:?}").into());
        };
        if k != k2 {
            return Err(format!("only square filters are supported, got {shape:?}").into());
        }
        let reordered = match layout {
            FilterLayout::Conv2d => conv_to_nhwc(&values, a, b, k),
            FilterLayout::ConvTranspose => conv_transpose_to_gemm(&values, a, b, k),
        };
        Ok(self.bf16(&reordered)?)
    }

    fn bias(&mut self, _: &[usize], values: Vec<f32>) -> PlaceResult<DeviceBias> {
        Ok(DeviceBias {
            f32: self.f32(&values)?,
            bf16: self.bf16(&values)?,
        })
    }
}

impl DeviceLinear {
    pub fn weight_ptr(&self) -> DevPtr<bf16> {
        DevPtr::of(&self.weight)
    }

    /// The bias as the GEMM epilogues read it (bf16).
    pub fn bias_ptr(&self) -> Option<DevPtr<bf16>> {
        self.bias.as_ref().map(|b| DevPtr::of(&b.bf16))
    }
}

impl DeviceNorm {
    pub fn weight_ptr(&self) -> Option<DevPtr<f32>> {
        self.weight.as_ref().map(DevPtr::of)
    }

    pub fn bias_ptr(&self) -> Option<DevPtr<f32>> {
        self.bias.as_ref().map(DevPtr::of)
    }
}

impl TransformerBlock<Device> {
    /// MLP hidden width.
    pub fn hidden(&self) -> usize {
        self.fc1.out_features
    }
}

impl DevicePlacement {
    /// A host convolution placed as the loader places one (for tests and tools that build
    /// layers by hand).
    pub fn conv2d(
        &mut self,
        c: &Conv2d,
    ) -> Result<Conv2d<CudaSlice<bf16>, DeviceBias>, PlaceError> {
        let shape = [c.out_channels, c.in_channels, c.kernel, c.kernel];
        Ok(Conv2d {
            weight: self.filter(&shape, c.weight.clone(), FilterLayout::Conv2d)?,
            bias: c
                .bias
                .as_ref()
                .map(|b| self.bias(&[b.len()], b.clone()))
                .transpose()?,
            in_channels: c.in_channels,
            out_channels: c.out_channels,
            kernel: c.kernel,
            stride: c.stride,
            padding: c.padding,
        })
    }

    /// A host transposed convolution placed as the loader places one.
    pub fn conv_transpose(
        &mut self,
        t: &ConvTransposeUpsample,
    ) -> Result<ConvTransposeUpsample<CudaSlice<bf16>, DeviceBias>, PlaceError> {
        let shape = [t.in_channels, t.out_channels, t.kernel, t.kernel];
        Ok(ConvTransposeUpsample {
            weight: self.filter(&shape, t.weight.clone(), FilterLayout::ConvTranspose)?,
            bias: self.bias(&[t.bias.len()], t.bias.clone())?,
            in_channels: t.in_channels,
            out_channels: t.out_channels,
            kernel: t.kernel,
        })
    }
}
