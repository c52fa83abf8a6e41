//! The pre-norm transformer block shared by DINO, the aggregator's frame and global blocks and
//! the camera head trunk. Attention itself is left to the caller (it differs per user: within
//! a frame, over the KV cache, over the camera cache), so a block is used in two halves:
//! [`TransformerBlock::qkv`] then [`TransformerBlock::finish`].

use super::error::Result;
use super::loading::{MatLinear, Norm, layer_norm, linear};
use super::ops::activation::gelu_in_place;
use super::storage::{Host, Loader, Storage};

/// One block's parameters in storage `S` (see [`crate::model::storage`]).
pub struct TransformerBlock<S: Storage = Host> {
    pub(crate) norm1: Norm<S>,
    pub(crate) qkv: MatLinear<S>,
    /// Per-head LayerNorm of q and k (aggregator blocks only).
    pub(crate) qk_norm: Option<(Norm<S>, Norm<S>)>,
    pub(crate) proj: MatLinear<S>,
    pub(crate) ls1: S::Full,
    pub(crate) norm2: Norm<S>,
    pub(crate) fc1: MatLinear<S>,
    pub(crate) fc2: MatLinear<S>,
    pub(crate) ls2: S::Full,
    pub dim: usize,
    pub heads: usize,
    pub head_dim: usize,
}

pub struct BlockSpec {
    pub dim: usize,
    pub hidden: usize,
    pub heads: usize,
    pub eps: f32,
    pub qk_norm: bool,
}

/// q, k, v of a block, each `[tokens][heads][head_dim]`.
pub struct Qkv {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl<S: Storage> TransformerBlock<S> {
    pub fn load(store: &mut Loader<S>, prefix: &str, spec: &BlockSpec) -> Result<Self> {
        let c = spec.dim;
        let head_dim = c / spec.heads;
        let qk_norm = if spec.qk_norm {
            // qk-norm always uses eps 1e-5 (aggregator blocks).
            Some((
                layer_norm(store, &format!("{prefix}.attn.q_norm"), head_dim, 1e-5)?,
                layer_norm(store, &format!("{prefix}.attn.k_norm"), head_dim, 1e-5)?,
            ))
        } else {
            None
        };
        Ok(TransformerBlock {
            norm1: layer_norm(store, &format!("{prefix}.norm1"), c, spec.eps)?,
            qkv: linear(store, &format!("{prefix}.attn.qkv"), 3 * c, c)?,
            qk_norm,
            proj: linear(store, &format!("{prefix}.attn.proj"), c, c)?,
            ls1: store.full(&format!("{prefix}.ls1.gamma"), &[c])?,
            norm2: layer_norm(store, &format!("{prefix}.norm2"), c, spec.eps)?,
            fc1: linear(store, &format!("{prefix}.mlp.fc1"), spec.hidden, c)?,
            fc2: linear(store, &format!("{prefix}.mlp.fc2"), c, spec.hidden)?,
            ls2: store.full(&format!("{prefix}.ls2.gamma"), &[c])?,
            dim: c,
            heads: spec.heads,
            head_dim,
        })
    }
}

impl TransformerBlock {
    /// First half: `LN1`, the qkv projection split into q, k, v (rows of the projection are
    /// q for all heads, then k, then v), and qk-norm when the block has it. No RoPE here.
    pub fn qkv(&self, x: &[f32], tokens: usize) -> Qkv {
        let c = self.dim;
        let normed = self.norm1.forward(x);
        let qkv = self.qkv.forward(&normed, tokens);
        let mut q = vec![0.0f32; tokens * c];
        let mut k = vec![0.0f32; tokens * c];
        let mut v = vec![0.0f32; tokens * c];
        for t in 0..tokens {
            let row = &qkv[t * 3 * c..(t + 1) * 3 * c];
            q[t * c..(t + 1) * c].copy_from_slice(&row[..c]);
            k[t * c..(t + 1) * c].copy_from_slice(&row[c..2 * c]);
            v[t * c..(t + 1) * c].copy_from_slice(&row[2 * c..]);
        }
        if let Some((qn, kn)) = &self.qk_norm {
            // Each head vector is normalised on its own; chunks of head_dim are exactly those.
            qn.forward_in_place(&mut q);
            kn.forward_in_place(&mut k);
        }
        Qkv { q, k, v }
    }

    /// Second half: `x += ls1 ⊙ proj(attn)`, then `x += ls2 ⊙ fc2(gelu(fc1(LN2(x))))`.
    pub fn finish(&self, x: &mut [f32], attn: &[f32], tokens: usize) {
        let c = self.dim;
        let projected = self.proj.forward(attn, tokens);
        add_scaled(x, &projected, &self.ls1, c);
        let normed = self.norm2.forward(x);
        let mut hidden = self.fc1.forward(&normed, tokens);
        gelu_in_place(&mut hidden);
        let out = self.fc2.forward(&hidden, tokens);
        add_scaled(x, &out, &self.ls2, c);
    }
}

/// `x[t][i] += gamma[i] · y[t][i]` (LayerScale residual).
fn add_scaled(x: &mut [f32], y: &[f32], gamma: &[f32], c: usize) {
    for (xr, yr) in x.chunks_exact_mut(c).zip(y.chunks_exact(c)) {
        for ((xv, yv), g) in xr.iter_mut().zip(yr).zip(gamma) {
            *xv += g * yv;
        }
    }
}
