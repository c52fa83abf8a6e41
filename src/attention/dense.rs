//! The dense baseline: per-frame K/V kept as a list and concatenated at every call, as the
//! reference's SDPA path does, then attention over the contiguous copy.

use std::collections::VecDeque;

use rayon::prelude::*;

use crate::kvcache::{CacheConfig, CacheError, KvBuf, StorageDtype};

use super::tile::{KV_TILE, OnlineSoftmax};
use super::{AttentionShape, Q_BLOCK};

/// One frame held in full: all its tokens (special then patch).
#[derive(Debug, Clone)]
pub struct DenseFrame {
    pub frame: u64,
    pub k: KvBuf,
    pub v: KvBuf,
}

/// One layer of the dense cache.
#[derive(Debug, Clone)]
pub struct DenseLayer {
    pub frames: VecDeque<DenseFrame>,
    /// Special tokens of evicted frames, oldest first: `[E·special][heads][head_dim]`.
    pub special_k: KvBuf,
    pub special_v: KvBuf,
    /// The frames those special tokens belong to.
    pub special_frames: Vec<u64>,
    /// What the step in progress changed, so it can be undone.
    pushed_this_step: usize,
    evicted_this_step: Vec<(usize, DenseFrame)>,
    specials_added_this_step: usize,
}

impl DenseLayer {
    fn new(dtype: StorageDtype) -> Self {
        Self {
            frames: VecDeque::new(),
            special_k: KvBuf::zeros(dtype, 0),
            special_v: KvBuf::zeros(dtype, 0),
            special_frames: Vec::new(),
            pushed_this_step: 0,
            evicted_this_step: Vec::new(),
            specials_added_this_step: 0,
        }
    }
}

/// Per-layer frame lists following the same residency rules as the paged table.
#[derive(Debug, Clone)]
pub struct DenseKvStore {
    layers: Vec<DenseLayer>,
    dtype: StorageDtype,
    token_elems: usize,
    tokens_per_frame: usize,
    special_tokens: usize,
}

impl DenseKvStore {
    pub fn new(cfg: &CacheConfig) -> Self {
        Self {
            layers: (0..cfg.layers)
                .map(|_| DenseLayer::new(cfg.dtype))
                .collect(),
            dtype: cfg.dtype,
            token_elems: cfg.heads * cfg.head_dim,
            tokens_per_frame: cfg.tokens_per_frame(),
            special_tokens: cfg.special_tokens,
        }
    }

    pub fn layer(&self, layer: usize) -> Result<&DenseLayer, CacheError> {
        self.layers.get(layer).ok_or(CacheError::LayerOutOfRange {
            layer,
            layers: self.layers.len(),
        })
    }

    /// Applies a step to one layer: frames the step evicted keep only their special tokens,
    /// the step's surviving frames are appended in full.
    pub fn write_step(
        &mut self,
        layer: usize,
        step_frames: std::ops::Range<u64>,
        evicted: &[u64],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), CacheError> {
        let layers = self.layers.len();
        let te = self.token_elems;
        let tpf = self.tokens_per_frame;
        let specials = self.special_tokens * te;
        let dtype = self.dtype;
        let entry = self
            .layers
            .get_mut(layer)
            .ok_or(CacheError::LayerOutOfRange { layer, layers })?;
        for &frame in evicted {
            if step_frames.contains(&frame) {
                // Evicted inside its own step: only its special tokens survive.
                let at = (frame - step_frames.start) as usize * tpf * te;
                entry.special_k.extend_from_f32(&k[at..at + specials]);
                entry.special_v.extend_from_f32(&v[at..at + specials]);
            } else if let Some(at) = entry.frames.iter().position(|f| f.frame == frame)
                && let Some(old) = entry.frames.remove(at)
            {
                entry.special_k.extend_from_buf(&old.k, 0..specials);
                entry.special_v.extend_from_buf(&old.v, 0..specials);
                entry.evicted_this_step.push((at, old));
            }
            entry.special_frames.push(frame);
            entry.specials_added_this_step += specials;
        }
        for (i, frame) in step_frames.enumerate() {
            if evicted.contains(&frame) {
                continue;
            }
            let at = i * tpf * te;
            let mut fk = KvBuf::zeros(dtype, 0);
            let mut fv = KvBuf::zeros(dtype, 0);
            fk.extend_from_f32(&k[at..at + tpf * te]);
            fv.extend_from_f32(&v[at..at + tpf * te]);
            entry.frames.push_back(DenseFrame {
                frame,
                k: fk,
                v: fv,
            });
            entry.pushed_this_step += 1;
        }
        Ok(())
    }

    /// Forgets the undo information: the step stays.
    pub fn commit_step(&mut self) {
        for layer in &mut self.layers {
            layer.pushed_this_step = 0;
            layer.evicted_this_step.clear();
            layer.specials_added_this_step = 0;
        }
    }

    /// Undoes the step on every layer it touched.
    pub fn undo_step(&mut self) {
        for layer in &mut self.layers {
            for _ in 0..layer.pushed_this_step {
                layer.frames.pop_back();
            }
            let keep = layer.special_k.len() - layer.specials_added_this_step;
            layer.special_k.resize(keep);
            layer.special_v.resize(keep);
            let groups =
                layer.specials_added_this_step / (self.special_tokens * self.token_elems).max(1);
            let kept_groups = layer.special_frames.len() - groups;
            layer.special_frames.truncate(kept_groups);
            for (at, old) in layer.evicted_this_step.drain(..).rev() {
                layer.frames.insert(at, old);
            }
            layer.pushed_this_step = 0;
            layer.specials_added_this_step = 0;
        }
    }

    pub fn reset(&mut self) {
        for layer in &mut self.layers {
            *layer = DenseLayer::new(self.dtype);
        }
    }

    /// Concatenates the layer's K and V (evicted specials, then each frame in full) into fresh
    /// contiguous buffers: the copy the reference's SDPA path makes at every call.
    pub fn concatenated(&self, layer: usize) -> Result<(KvBuf, KvBuf), CacheError> {
        let entry = self.layer(layer)?;
        let total = entry.special_k.len() + entry.frames.iter().map(|f| f.k.len()).sum::<usize>();
        let mut k = KvBuf::zeros(self.dtype, 0);
        let mut v = KvBuf::zeros(self.dtype, 0);
        reserve(&mut k, total);
        reserve(&mut v, total);
        k.extend_from_buf(&entry.special_k, 0..entry.special_k.len());
        v.extend_from_buf(&entry.special_v, 0..entry.special_v.len());
        for frame in &entry.frames {
            k.extend_from_buf(&frame.k, 0..frame.k.len());
            v.extend_from_buf(&frame.v, 0..frame.v.len());
        }
        Ok((k, v))
    }
}

fn reserve(buf: &mut KvBuf, n: usize) {
    match buf {
        KvBuf::F32(b) => b.reserve(n),
        KvBuf::Bf16(b) => b.reserve(n),
    }
}

/// Attention over contiguous K/V `[keys][heads][head_dim]` (what the concatenation produced),
/// with the same online-softmax tiles as the paged path, so an A/B of the two layouts measures
/// the layout and not two different kernels.
pub fn dense_attention(
    shape: AttentionShape,
    q: &[f32],
    k: &KvBuf,
    v: &KvBuf,
    out: &mut [f32],
) -> Result<(), CacheError> {
    shape.check(q, out)?;
    let token_elems = shape.heads * shape.head_dim;
    if k.len() != v.len() || !k.len().is_multiple_of(token_elems) {
        return Err(CacheError::WrongSize {
            what: "dense K/V",
            expected: k.len().div_ceil(token_elems) * token_elems,
            found: v.len(),
        });
    }
    let keys = k.len() / token_elems;
    if keys == 0 {
        return Err(CacheError::NothingVisible);
    }
    let d = shape.head_dim;
    let scale = shape.scale();
    out.par_chunks_mut(Q_BLOCK * token_elems)
        .enumerate()
        .for_each(|(block, out_block)| {
            let nq = out_block.len() / token_elems;
            let q_block = &q[block * Q_BLOCK * token_elems..][..nq * token_elems];
            let mut state = OnlineSoftmax::new(nq, d);
            let mut k_tile = vec![0f32; KV_TILE * d];
            let mut v_tile = vec![0f32; KV_TILE * d];
            for h in 0..shape.heads {
                state.start(q_block, h, shape.heads, scale);
                let mut start = 0;
                while start < keys {
                    let n = KV_TILE.min(keys - start);
                    for t in 0..n {
                        let at = (start + t) * token_elems + h * d;
                        k.read(at, &mut k_tile[t * d..][..d]);
                        v.read(at, &mut v_tile[t * d..][..d]);
                    }
                    state.absorb(&k_tile[..n * d], &v_tile[..n * d], n);
                    start += n;
                }
                state.finish_into(out_block, h, shape.heads);
            }
        });
    Ok(())
}
