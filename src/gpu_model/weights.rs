//! The aggregator's weights (DINO, frame and global blocks, special tokens) uploaded once from
//! the CPU model: matrices as bf16 (the reference casts the aggregator to bf16 too), LayerNorm
//! parameters, LayerScale gammas and tokens as f32.

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::model::block::TransformerBlock;
use crate::model::ops::linear::Linear;
use crate::model::ops::norm::LayerNorm;

pub fn upload_f32(dev: &CudaDevice, values: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
    Ok(dev.stream.clone_htod(values)?)
}

pub fn upload_bf16(dev: &CudaDevice, values: &[f32]) -> Result<CudaSlice<bf16>, CudaError> {
    let converted: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
    Ok(dev.stream.clone_htod(&converted)?)
}

/// A linear layer: weight `[out][in]` and bias `[out]`, bf16.
pub struct GpuLinear {
    pub weight: CudaSlice<bf16>,
    pub bias: Option<CudaSlice<bf16>>,
    pub in_features: usize,
    pub out_features: usize,
}

impl GpuLinear {
    pub fn upload(dev: &CudaDevice, cpu: &Linear) -> Result<Self, CudaError> {
        Ok(Self {
            weight: upload_bf16(dev, &cpu.weight)?,
            bias: cpu.bias.as_ref().map(|b| upload_bf16(dev, b)).transpose()?,
            in_features: cpu.in_features,
            out_features: cpu.out_features,
        })
    }

    pub fn weight_ptr(&self) -> DevPtr<bf16> {
        DevPtr::of(&self.weight)
    }

    pub fn bias_ptr(&self) -> Option<DevPtr<bf16>> {
        self.bias.as_ref().map(DevPtr::of)
    }
}

/// LayerNorm parameters, f32 (the norm itself runs in f32).
pub struct GpuLayerNorm {
    pub weight: Option<CudaSlice<f32>>,
    pub bias: Option<CudaSlice<f32>>,
    pub dim: usize,
    pub eps: f32,
}

impl GpuLayerNorm {
    pub fn upload(dev: &CudaDevice, cpu: &LayerNorm) -> Result<Self, CudaError> {
        Ok(Self {
            weight: cpu
                .weight
                .as_ref()
                .map(|w| upload_f32(dev, w))
                .transpose()?,
            bias: cpu.bias.as_ref().map(|b| upload_f32(dev, b)).transpose()?,
            dim: cpu.dim,
            eps: cpu.eps,
        })
    }

    pub fn weight_ptr(&self) -> Option<DevPtr<f32>> {
        self.weight.as_ref().map(DevPtr::of)
    }

    pub fn bias_ptr(&self) -> Option<DevPtr<f32>> {
        self.bias.as_ref().map(DevPtr::of)
    }
}

/// One pre-norm transformer block's weights.
pub struct GpuBlockWeights {
    pub norm1: GpuLayerNorm,
    pub qkv: GpuLinear,
    pub qk_norm: Option<(GpuLayerNorm, GpuLayerNorm)>,
    pub proj: GpuLinear,
    pub ls1: CudaSlice<f32>,
    pub norm2: GpuLayerNorm,
    pub fc1: GpuLinear,
    pub fc2: GpuLinear,
    pub ls2: CudaSlice<f32>,
    pub dim: usize,
    pub hidden: usize,
    pub heads: usize,
}

impl GpuBlockWeights {
    pub fn upload(dev: &CudaDevice, cpu: &TransformerBlock) -> Result<Self, CudaError> {
        Ok(Self {
            norm1: GpuLayerNorm::upload(dev, &cpu.norm1)?,
            qkv: GpuLinear::upload(dev, &cpu.qkv)?,
            qk_norm: cpu
                .qk_norm
                .as_ref()
                .map(|(q, k)| -> Result<_, CudaError> {
                    Ok((GpuLayerNorm::upload(dev, q)?, GpuLayerNorm::upload(dev, k)?))
                })
                .transpose()?,
            proj: GpuLinear::upload(dev, &cpu.proj)?,
            ls1: upload_f32(dev, &cpu.ls1)?,
            norm2: GpuLayerNorm::upload(dev, &cpu.norm2)?,
            fc1: GpuLinear::upload(dev, &cpu.fc1)?,
            fc2: GpuLinear::upload(dev, &cpu.fc2)?,
            ls2: upload_f32(dev, &cpu.ls2)?,
            dim: cpu.dim,
            hidden: cpu.fc1.out_features,
            heads: cpu.heads,
        })
    }

    /// Device bytes of this block's parameters.
    pub fn bytes(&self) -> usize {
        let lin = |l: &GpuLinear| 2 * (l.weight.len() + l.bias.as_ref().map_or(0, |b| b.len()));
        lin(&self.qkv) + lin(&self.proj) + lin(&self.fc1) + lin(&self.fc2) + 4 * 6 * self.dim
    }
}

/// DINO's own parameters besides its blocks.
pub struct GpuDinoWeights {
    /// The stride-14 patch convolution as `[C][3·14·14]`.
    pub patch_proj: GpuLinear,
    pub cls: CudaSlice<f32>,
    pub registers: CudaSlice<f32>,
    pub blocks: Vec<GpuBlockWeights>,
    pub norm: GpuLayerNorm,
}

/// Everything of the aggregator on the device.
pub struct GpuAggregatorWeights {
    pub dino: GpuDinoWeights,
    /// `[2][C]`: the first frame's variant, then the rest's.
    pub camera_token: CudaSlice<f32>,
    /// `[2][4][C]`.
    pub register_token: CudaSlice<f32>,
    /// `[2][C]`: the scale frames' variant, then the rest's.
    pub scale_token: CudaSlice<f32>,
    pub frame_blocks: Vec<GpuBlockWeights>,
    pub global_blocks: Vec<GpuBlockWeights>,
}

impl GpuAggregatorWeights {
    pub fn upload(
        dev: &CudaDevice,
        cpu: &crate::model::aggregator::Aggregator,
    ) -> Result<Self, CudaError> {
        let blocks = |list: &[TransformerBlock]| {
            list.iter()
                .map(|b| GpuBlockWeights::upload(dev, b))
                .collect::<Result<Vec<_>, _>>()
        };
        let d = &cpu.dino;
        Ok(Self {
            dino: GpuDinoWeights {
                patch_proj: GpuLinear::upload(dev, &d.patch_proj)?,
                cls: upload_f32(dev, &d.cls_token)?,
                registers: upload_f32(dev, &d.register_tokens)?,
                blocks: blocks(&d.blocks)?,
                norm: GpuLayerNorm::upload(dev, &d.norm)?,
            },
            camera_token: upload_f32(dev, &cpu.camera_token)?,
            register_token: upload_f32(dev, &cpu.register_token)?,
            scale_token: upload_f32(dev, &cpu.scale_token)?,
            frame_blocks: blocks(&cpu.frame_blocks)?,
            global_blocks: blocks(&cpu.global_blocks)?,
        })
    }

    pub fn bytes(&self) -> usize {
        let blocks: usize = self
            .dino
            .blocks
            .iter()
            .chain(&self.frame_blocks)
            .chain(&self.global_blocks)
            .map(GpuBlockWeights::bytes)
            .sum();
        blocks + 2 * self.dino.patch_proj.weight.len()
    }
}
