//! CPU paged attention: online softmax over the pages of a `PagePlan`, f32 accumulation.
//!
//! Parallel over blocks of queries; each block walks the visible pages in tiles, converting
//! a tile's K and V of one head to f32 once and reusing it for every query of the block.

use rayon::prelude::*;

use crate::kvcache::{CacheError, KvBuf, KvElem, PagePlan};

use super::{AttentionShape, KV_TILE, Q_BLOCK};

/// Where a layer's pages live: `[page][K|V][page_size][heads][head_dim]`.
#[derive(Debug, Clone, Copy)]
pub struct PagedLayer<'a> {
    pub data: &'a KvBuf,
    /// Elements of one K (or V) page.
    pub page_elems: usize,
}

/// `out = softmax(q·Kᵀ·scale)·V` over every token the plan makes visible.
/// `q` and `out` are `[queries][heads][head_dim]`.
pub fn paged_attention(
    shape: AttentionShape,
    q: &[f32],
    layer: PagedLayer<'_>,
    plan: &PagePlan,
    out: &mut [f32],
) -> Result<(), CacheError> {
    shape.check(q, out)?;
    if plan.kv_tokens() == 0 {
        return Err(CacheError::NothingVisible);
    }
    let token_elems = shape.heads * shape.head_dim;
    let pages = plan.indices.len() as u64;
    let needed = pages_end(plan) * 2 * layer.page_elems as u64;
    if (layer.data.len() as u64) < needed {
        return Err(CacheError::WrongSize {
            what: "paged K/V storage (pages referenced by the plan)",
            expected: needed as usize,
            found: layer.data.len(),
        });
    }
    debug_assert!(pages > 0);
    match layer.data {
        KvBuf::F32(data) => attend_pages(shape, q, data, layer.page_elems, token_elems, plan, out),
        KvBuf::Bf16(data) => attend_pages(shape, q, data, layer.page_elems, token_elems, plan, out),
    }
    Ok(())
}

fn pages_end(plan: &PagePlan) -> u64 {
    plan.indices
        .iter()
        .map(|&p| p as u64 + 1)
        .max()
        .unwrap_or(0)
}

fn attend_pages<T: KvElem>(
    shape: AttentionShape,
    q: &[f32],
    data: &[T],
    page_elems: usize,
    token_elems: usize,
    plan: &PagePlan,
    out: &mut [f32],
) {
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
                state.start(q_block, h, shape.heads, d, scale);
                for (&page, &len) in plan.indices.iter().zip(&plan.page_lens) {
                    let page_base = page as usize * 2 * page_elems;
                    let mut start = 0usize;
                    while start < len as usize {
                        let n = KV_TILE.min(len as usize - start);
                        for t in 0..n {
                            let at = page_base + (start + t) * token_elems + h * d;
                            let v_at = at + page_elems;
                            for j in 0..d {
                                k_tile[t * d + j] = data[at + j].to_f32();
                                v_tile[t * d + j] = data[v_at + j].to_f32();
                            }
                        }
                        state.absorb(&k_tile[..n * d], &v_tile[..n * d], n);
                        start += n;
                    }
                }
                state.finish_into(out_block, h, shape.heads);
            }
        });
}

/// Running max, sum and weighted values of one head for a block of queries.
struct OnlineSoftmax {
    nq: usize,
    d: usize,
    q: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
    scores: Vec<f32>,
}

impl OnlineSoftmax {
    fn new(nq: usize, d: usize) -> Self {
        Self {
            nq,
            d,
            q: vec![0.0; nq * d],
            max: vec![f32::NEG_INFINITY; nq],
            sum: vec![0.0; nq],
            acc: vec![0.0; nq * d],
            scores: vec![0.0; KV_TILE],
        }
    }

    /// Loads head `h` of the block's queries (pre-scaled) and clears the running state.
    fn start(&mut self, q_block: &[f32], h: usize, heads: usize, d: usize, scale: f32) {
        for i in 0..self.nq {
            let src = &q_block[(i * heads + h) * d..][..d];
            for (dst, &x) in self.q[i * d..][..d].iter_mut().zip(src) {
                *dst = x * scale;
            }
        }
        self.max.fill(f32::NEG_INFINITY);
        self.sum.fill(0.0);
        self.acc.fill(0.0);
    }

    fn absorb(&mut self, k: &[f32], v: &[f32], n: usize) {
        let d = self.d;
        for i in 0..self.nq {
            let qi = &self.q[i * d..][..d];
            let mut tile_max = f32::NEG_INFINITY;
            for t in 0..n {
                let s = dot(qi, &k[t * d..][..d]);
                self.scores[t] = s;
                tile_max = tile_max.max(s);
            }
            let new_max = self.max[i].max(tile_max);
            // exp(-inf) = 0 clears the empty initial state without a branch on the first tile.
            let correction = (self.max[i] - new_max).exp();
            self.max[i] = new_max;
            let acc = &mut self.acc[i * d..][..d];
            for a in acc.iter_mut() {
                *a *= correction;
            }
            let mut tile_sum = 0.0;
            for t in 0..n {
                let p = (self.scores[t] - new_max).exp();
                tile_sum += p;
                for (a, &x) in acc.iter_mut().zip(&v[t * d..][..d]) {
                    *a += p * x;
                }
            }
            self.sum[i] = self.sum[i] * correction + tile_sum;
        }
    }

    fn finish_into(&self, out_block: &mut [f32], h: usize, heads: usize) {
        let d = self.d;
        for i in 0..self.nq {
            let inv = 1.0 / self.sum[i];
            let dst = &mut out_block[(i * heads + h) * d..][..d];
            for (o, &a) in dst.iter_mut().zip(&self.acc[i * d..][..d]) {
                *o = a * inv;
            }
        }
    }
}

#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent partial sums let the compiler vectorise without reassociating floats.
    let mut partial = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            partial[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut total: f32 = partial.iter().sum();
    for j in chunks * 8..a.len() {
        total += a[j] * b[j];
    }
    total
}
