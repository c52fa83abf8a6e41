//! The dense baseline: per-frame K/V kept as a list and concatenated at every call, as the
//! reference's SDPA path does, then ordinary (two-pass) softmax attention.

use std::collections::VecDeque;

use rayon::prelude::*;

use crate::kvcache::{CacheConfig, CacheError, KvBuf, StorageDtype};

use super::{AttentionShape, Q_BLOCK, paged::dot};

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

/// Plain attention over contiguous K/V `[keys][heads][head_dim]`: full score rows, max, exp,
/// sum, weighted values. Independent of the paged path's online softmax.
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
            let mut scores = vec![0f32; keys];
            let mut key = vec![0f32; d];
            let mut value = vec![0f32; d];
            let mut acc = vec![0f32; d];
            for h in 0..shape.heads {
                for i in 0..nq {
                    let qi = &q[((block * Q_BLOCK + i) * shape.heads + h) * d..][..d];
                    let mut max = f32::NEG_INFINITY;
                    for (t, s) in scores.iter_mut().enumerate() {
                        k.read(t * token_elems + h * d, &mut key);
                        *s = dot(qi, &key) * scale;
                        max = max.max(*s);
                    }
                    let mut sum = 0.0;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        sum += *s;
                    }
                    acc.fill(0.0);
                    for (t, &p) in scores.iter().enumerate() {
                        v.read(t * token_elems + h * d, &mut value);
                        for (a, &x) in acc.iter_mut().zip(&value) {
                            *a += p * x;
                        }
                    }
                    let dst = &mut out_block[(i * shape.heads + h) * d..][..d];
                    for (o, &a) in dst.iter_mut().zip(&acc) {
                        *o = a / sum;
                    }
                }
            }
        });
    Ok(())
}
