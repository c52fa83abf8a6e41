//! Global attention over the KV cache: the paged layout and the dense (concatenating) baseline.
//!
//! * `paged`: online-softmax attention over a `PagePlan` (the CPU reference of the GPU kernel).
//! * `dense`: per-frame K/V lists concatenated at every call, then plain attention.
//! * `cpu_cache`: `CpuKvCache`, the one object the model talks to, over either layout.
//! * `score_bound`: a bound on a layer's scores, and the fixed softmax offset it allows.

mod cpu_cache;
pub mod dense;
pub mod paged;
pub mod score_bound;
mod tile;

pub use cpu_cache::{AttentionLayout, CpuKvCache, LayerKvState};
pub use dense::{DenseKvStore, dense_attention};
pub use paged::{PagedLayer, paged_attention};
pub use score_bound::{ScoreBound, Softmax, log2_query_scale};

use crate::kvcache::CacheError;

/// Queries per parallel task: big enough to amortise converting a K/V tile, small enough to
/// give two cores several tasks even for one frame.
pub(crate) const Q_BLOCK: usize = 32;

/// Heads and head size of `[tokens][heads][head_dim]` tensors. Scale is `1/sqrt(head_dim)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    pub fn scale(self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    fn check(self, q: &[f32], out: &[f32]) -> Result<(), CacheError> {
        let token = self.heads * self.head_dim;
        if token == 0 || q.is_empty() || !q.len().is_multiple_of(token) {
            return Err(CacheError::WrongSize {
                what: "queries ([tokens][heads][head_dim])",
                expected: q.len().div_ceil(token.max(1)).max(1) * token,
                found: q.len(),
            });
        }
        if out.len() != q.len() {
            return Err(CacheError::WrongSize {
                what: "attention output",
                expected: q.len(),
                found: out.len(),
            });
        }
        Ok(())
    }
}
