//! The camera head: each frame's camera token, refined over `cam_iters` iterations by a small
//! transformer trunk that attends over the camera tokens of every committed frame. Each
//! iteration has its own KV cache, which is never evicted (one token per frame is cheap).

use super::block::{BlockSpec, TransformerBlock};
use super::config::ModelConfig;
use super::error::Result;
use super::loading::{FullLinear, MatLinear, Norm, full_linear, layer_norm, linear};
use super::ops::activation::{gelu_in_place, silu};
use super::ops::attention::{AttentionShape, attend};
use super::ops::norm::LayerNorm;
use super::record::{Recorder, put};
use super::spec::POSE_ENC_LEN;
use super::storage::{Host, Loader, Storage};

/// The camera head's parameters in storage `S`. The pose embedding (9 → W) and the pose
/// branch's last layer (W/2 → 9) are tiny and stay f32 everywhere.
pub struct CameraHead<S: Storage = Host> {
    pub(crate) empty_pose: S::Full,
    pub(crate) token_norm: Norm<S>,
    pub(crate) embed_pose: FullLinear<S>,
    pub(crate) modulation: MatLinear<S>,
    /// LayerNorm without affine parameters, eps 1e-6 (the adaptive norm's base).
    pub(crate) adaptive_norm: Norm<S>,
    pub(crate) trunk: Vec<TransformerBlock<S>>,
    pub(crate) trunk_norm: Norm<S>,
    pub(crate) branch_fc1: MatLinear<S>,
    pub(crate) branch_fc2: FullLinear<S>,
    pub(crate) width: usize,
    pub(crate) iterations: usize,
}

/// Keys and values of committed frames' camera tokens, per iteration and trunk layer:
/// `k[iteration][layer]` is `[frames][heads][head_dim]`.
#[derive(Default, Clone)]
pub struct CameraCache {
    k: Vec<Vec<Vec<f32>>>,
    v: Vec<Vec<Vec<f32>>>,
    frames: usize,
}

impl CameraCache {
    pub fn frames(&self) -> usize {
        self.frames
    }
    pub fn reset(&mut self) {
        *self = CameraCache::default();
    }
    /// Bytes held (f32 K and V).
    pub fn bytes(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .flatten()
            .map(|l| l.len() * 4)
            .sum()
    }
}

impl<S: Storage> CameraHead<S> {
    pub fn load(store: &mut Loader<S>, cfg: &ModelConfig) -> Result<Self> {
        let w = cfg.head_input_dim();
        let spec = BlockSpec {
            dim: w,
            hidden: w * cfg.mlp_ratio,
            heads: cfg.cam_heads,
            eps: 1e-5,
            qk_norm: false,
        };
        let trunk = (0..cfg.cam_trunk)
            .map(|j| TransformerBlock::load(store, &format!("camera_head.trunk.{j}"), &spec))
            .collect::<Result<Vec<_>>>()?;
        Ok(CameraHead {
            empty_pose: store.full("camera_head.empty_pose_tokens", &[1, 1, POSE_ENC_LEN])?,
            token_norm: layer_norm(store, "camera_head.token_norm", w, 1e-5)?,
            embed_pose: full_linear(store, "camera_head.embed_pose", w, POSE_ENC_LEN)?,
            modulation: linear(store, "camera_head.poseLN_modulation.1", 3 * w, w)?,
            adaptive_norm: LayerNorm {
                weight: None,
                bias: None,
                dim: w,
                eps: 1e-6,
            },
            trunk,
            trunk_norm: layer_norm(store, "camera_head.trunk_norm", w, 1e-5)?,
            branch_fc1: linear(store, "camera_head.pose_branch.fc1", w / 2, w)?,
            branch_fc2: full_linear(store, "camera_head.pose_branch.fc2", POSE_ENC_LEN, w / 2)?,
            width: w,
            iterations: cfg.cam_iters,
        })
    }
}

impl CameraHead {
    /// Pose encodings `[S][9]` from the last tap's camera tokens `[S][2C]`. `commit` appends
    /// this call's K/V to the cache (scale frames and keyframes); otherwise the frames attend
    /// to the cache plus themselves and leave nothing behind.
    pub fn forward(
        &self,
        camera_tokens: &[f32],
        frames: usize,
        cache: &mut CameraCache,
        commit: bool,
        mut rec: Option<&mut Recorder>,
    ) -> Result<Vec<f32>> {
        let w = self.width;
        let layers = self.trunk.len();
        if cache.k.is_empty() {
            cache.k = vec![vec![Vec::new(); layers]; self.iterations];
            cache.v = vec![vec![Vec::new(); layers]; self.iterations];
        }
        let x = self.token_norm.forward(camera_tokens);
        let x_normed = self.adaptive_norm.forward(&x);
        let mut raw: Option<Vec<f32>> = None;
        let mut pose = Vec::new();
        for it in 0..self.iterations {
            // Input pose: the learned empty pose first, then the previous pre-activation sum.
            let pose_in: Vec<f32> = match &raw {
                None => self.empty_pose.repeat(frames),
                Some(r) => r.clone(),
            };
            let mut embedded = self.embed_pose.forward(&pose_in, frames);
            for v in &mut embedded {
                *v = silu(*v);
            }
            let mods = self.modulation.forward(&embedded, frames);
            // h = gate ⊙ (LN(x) ⊙ (1 + scale) + shift) + x; chunks are [shift, scale, gate].
            let mut h = vec![0.0f32; frames * w];
            for s in 0..frames {
                let m = &mods[s * 3 * w..(s + 1) * 3 * w];
                for i in 0..w {
                    let (shift, scale, gate) = (m[i], m[w + i], m[2 * w + i]);
                    h[s * w + i] =
                        gate * (x_normed[s * w + i] * (1.0 + scale) + shift) + x[s * w + i];
                }
            }
            for (j, block) in self.trunk.iter().enumerate() {
                let qkv = block.qkv(&h, frames);
                let cached_k = &cache.k[it][j];
                let cached_v = &cache.v[it][j];
                let keys = cached_k.len() / w + frames;
                let mut k_all = Vec::with_capacity(keys * w);
                k_all.extend_from_slice(cached_k);
                k_all.extend_from_slice(&qkv.k);
                let mut v_all = Vec::with_capacity(keys * w);
                v_all.extend_from_slice(cached_v);
                v_all.extend_from_slice(&qkv.v);
                let shape = AttentionShape {
                    queries: frames,
                    keys,
                    heads: block.heads,
                    head_dim: block.head_dim,
                };
                let mut attn = vec![0.0f32; frames * w];
                attend(&qkv.q, &k_all, &v_all, &shape, &mut attn);
                if commit {
                    cache.k[it][j].extend_from_slice(&qkv.k);
                    cache.v[it][j].extend_from_slice(&qkv.v);
                }
                block.finish(&mut h, &attn, frames);
            }
            let normed = self.trunk_norm.forward(&h);
            let mut hidden = self.branch_fc1.forward(&normed, frames);
            gelu_in_place(&mut hidden);
            let delta = self.branch_fc2.forward(&hidden, frames);
            let sum = match raw {
                None => delta,
                Some(r) => r.iter().zip(&delta).map(|(a, b)| a + b).collect(),
            };
            // Output: translation and quaternion as they are, field of view through ReLU.
            pose = sum.clone();
            for s in 0..frames {
                for i in 7..POSE_ENC_LEN {
                    let v = &mut pose[s * POSE_ENC_LEN + i];
                    *v = v.max(0.0);
                }
            }
            put(
                &mut rec,
                &format!("pose_enc_iter{it}"),
                vec![1, frames, POSE_ENC_LEN],
                &pose,
            );
            raw = Some(sum);
        }
        if commit {
            cache.frames += frames;
        }
        Ok(pose)
    }
}
