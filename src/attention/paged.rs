//! CPU paged attention: online softmax over the pages of a `PagePlan`, f32 accumulation.
//!
//! Parallel over blocks of queries; each block walks the visible pages in tiles, converting
//! a tile's K and V of one head to f32 once and reusing it for every query of the block.

use rayon::prelude::*;

use crate::kvcache::{CacheError, KvBuf, KvElem, PagePlan};

use super::tile::{KV_TILE, OnlineSoftmax};
use super::{AttentionShape, Q_BLOCK};

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
                state.start(q_block, h, shape.heads, scale);
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
