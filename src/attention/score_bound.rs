//! A bound on a layer's attention scores, and the softmax it allows.
//!
//! The online softmax tracks each row's running maximum so that `2^(s - max)` never overflows,
//! and rescales the partial output whenever the maximum moves. Where every score of a layer is
//! known to lie in `[-B, B]` (log2 domain), one offset for all of them does the same job: the
//! GPU's global attention then computes no maxima and never rescales (0.566 against 0.658 ms a
//! layer at 72/72 on the H200, docs/cuda.md). Softmax is invariant to the offset; the result
//! differs from the online form only by rounding.
//!
//! The aggregator's q and k are LayerNormed per head (qk-norm) before RoPE, which rotates pairs
//! of dimensions and keeps their length, so their lengths are bounded by the norms' parameters:
//! a LayerNorm's normalised vector `n` of `d` values has `|n|² = d · var / (var + eps) ≤ d`, and
//! `|w ⊙ n + b| ≤ max|w| · √d + |b|`. By Cauchy–Schwarz `|q·k| ≤ |q| |k|`.

use half::bf16;

use crate::model::ops::norm::LayerNorm;

/// The largest exponent a score may reach after the offset: every `p ≤ 2^64`, so a row's sums
/// (of fewer than 2^24 keys, values below 2^30) stay far from f32's 2^128.
pub const MAX_ABOVE_OFFSET: f32 = 64.0;

/// How far below the offset a row's largest score may fall: its `p ≥ 2^-100` is a normal f32
/// (and bf16) number with room beneath it, so the row's sum never flushes to zero.
pub const MAX_BELOW_OFFSET: f32 = 100.0;

/// Slack on the bound for the bf16 rounding of the stored q and k (each value within 2^-9, so
/// each length within 0.2 %) and the f32 rounding of RoPE and of the products.
const ROUNDING_SLACK: f32 = 1.02;

/// How a softmax offsets its scores before exponentiating them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Softmax {
    /// The running row maximum (online softmax): any scores.
    #[default]
    RunningMax,
    /// One offset (log2 domain) for every score of the call: `p = 2^(s - offset)`. Only for
    /// scores within `[offset - MAX_BELOW_OFFSET, offset + MAX_ABOVE_OFFSET]`
    /// ([`ScoreBound::softmax`] chooses it so).
    FixedOffset(f32),
    /// [`Self::FixedOffset`] for queries the caller already multiplied by
    /// [`log2_query_scale`] (folded into their norm's parameters): the product `q·k` is the
    /// score in the log2 domain, and with offset 0 it is the exponent itself.
    Log2Queries { offset: f32 },
}

impl Softmax {
    /// The same softmax for queries multiplied by [`log2_query_scale`] (a running maximum
    /// stays one: only fixed offsets gain from such queries).
    pub fn for_log2_queries(self) -> Self {
        match self {
            Self::FixedOffset(offset) | Self::Log2Queries { offset } => {
                Self::Log2Queries { offset }
            }
            Self::RunningMax => Self::RunningMax,
        }
    }
}

/// What multiplies a query so that its product with a key is the score in the log2 domain:
/// `log2(e) / √head_dim`.
pub fn log2_query_scale(head_dim: usize) -> f32 {
    std::f32::consts::LOG2_E / (head_dim as f32).sqrt()
}

/// `max |q·k| · scale · log2(e)` over every query and key a layer can meet: its scores in the
/// log2 domain lie in `[-bound, bound]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreBound {
    pub log2: f32,
}

impl ScoreBound {
    /// From the longest query and key the layer can meet and its softmax scale (1/√head_dim).
    pub fn from_lengths(q_max: f32, k_max: f32, scale: f32) -> Self {
        Self {
            log2: q_max * k_max * scale * std::f32::consts::LOG2_E * ROUNDING_SLACK,
        }
    }

    /// For these queries and keys, `head_dim` values a vector (bf16, any layout of whole
    /// vectors): the longest of each (any superset of the keys, a pool with its values, gives a
    /// valid bound too). For data without a norm to bound them: benches and tests.
    pub fn from_head_vectors(q: &[bf16], k: &[bf16], head_dim: usize) -> Self {
        let longest = |v: &[bf16]| {
            v.chunks_exact(head_dim)
                .map(|h| h.iter().map(|x| x.to_f32() * x.to_f32()).sum::<f32>())
                .fold(0.0f32, f32::max)
                .sqrt()
        };
        Self::from_lengths(longest(q), longest(k), 1.0 / (head_dim as f32).sqrt())
    }

    /// For q and k that went through these per-head LayerNorms (then at most a rotation).
    pub fn from_qk_norms(q_norm: &LayerNorm, k_norm: &LayerNorm) -> Self {
        let scale = 1.0 / (q_norm.dim as f32).sqrt();
        Self::from_lengths(longest_normed(q_norm), longest_normed(k_norm), scale)
    }

    /// The fixed offset where the bound allows one (scores within 82 of zero: the offset is
    /// `max(0, bound - 64)`, so the largest `p` is at most 2^64 and the smallest row maximum at
    /// least 2^-100), else the running maximum.
    pub fn softmax(self) -> Softmax {
        let b = self.log2;
        if !b.is_finite() {
            return Softmax::RunningMax;
        }
        let offset = (b - MAX_ABOVE_OFFSET).max(0.0);
        if b + offset <= MAX_BELOW_OFFSET {
            Softmax::FixedOffset(offset)
        } else {
            Softmax::RunningMax
        }
    }
}

/// The longest vector a LayerNorm of `dim` values can give: `max|w| · √dim + |b|`.
fn longest_normed(norm: &LayerNorm) -> f32 {
    let max_w = norm
        .weight
        .as_ref()
        .map_or(1.0, |w| w.iter().fold(0.0f32, |m, v| m.max(v.abs())));
    let bias_len = norm
        .bias
        .as_ref()
        .map_or(0.0, |b| b.iter().map(|v| v * v).sum::<f32>().sqrt());
    max_w * (norm.dim as f32).sqrt() + bias_len
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(weight: Vec<f32>, bias: Vec<f32>) -> LayerNorm {
        LayerNorm {
            dim: weight.len(),
            weight: Some(weight),
            bias: Some(bias),
            eps: 1e-5,
        }
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn unit_norms_allow_offset_zero() {
        // w = 1, b = 0 over 64 values: |q|, |k| <= 8, |q·k|/8 <= 8, 11.5 in log2 units.
        let n = norm(vec![1.0; 64], vec![0.0; 64]);
        let bound = ScoreBound::from_qk_norms(&n, &n);
        assert!((bound.log2 - 8.0 * std::f32::consts::LOG2_E * ROUNDING_SLACK).abs() < 1e-4);
        assert_eq!(bound.softmax(), Softmax::FixedOffset(0.0));
    }

    #[test]
    fn offset_rises_with_the_bound_then_gives_way() {
        let at = |log2| ScoreBound { log2 }.softmax();
        assert_eq!(at(64.0), Softmax::FixedOffset(0.0));
        assert_eq!(at(70.0), Softmax::FixedOffset(6.0));
        assert_eq!(at(82.0), Softmax::FixedOffset(18.0));
        assert_eq!(at(82.5), Softmax::RunningMax);
        assert_eq!(at(f32::INFINITY), Softmax::RunningMax);
        assert_eq!(at(f32::NAN), Softmax::RunningMax);
    }

    #[test]
    fn log2_queries_keep_the_offset() {
        assert_eq!(
            Softmax::FixedOffset(6.0).for_log2_queries(),
            Softmax::Log2Queries { offset: 6.0 }
        );
        assert_eq!(Softmax::RunningMax.for_log2_queries(), Softmax::RunningMax);
        assert!((log2_query_scale(64) - 0.180_336_88).abs() < 1e-7);
    }

    #[test]
    fn large_norm_weights_fall_back_to_the_running_maximum() {
        // max|w| = 3 on both: |q|, |k| <= 24, |q·k|/8 <= 72, 104 in log2 units.
        let n = norm(vec![3.0; 64], vec![0.0; 64]);
        assert_eq!(
            ScoreBound::from_qk_norms(&n, &n).softmax(),
            Softmax::RunningMax
        );
    }

    #[test]
    fn head_vectors_bound_by_their_longest() {
        // Two 4-wide vectors of lengths 2 and 4 against one of length 3: 4 · 3 / 2 · log2(e).
        let q: Vec<bf16> = [2.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0]
            .map(bf16::from_f32)
            .to_vec();
        let k: Vec<bf16> = [0.0, 0.0, 3.0, 0.0].map(bf16::from_f32).to_vec();
        let bound = ScoreBound::from_head_vectors(&q, &k, 4);
        let expected = 6.0 * std::f32::consts::LOG2_E * ROUNDING_SLACK;
        assert!((bound.log2 - expected).abs() < 1e-5, "{}", bound.log2);
    }

    proptest! {
        /// The bound holds for any inputs through any norm parameters, including the worst
        /// case where q and k line up.
        #[test]
        fn bound_holds_for_normed_q_and_k(
            wq in prop::collection::vec(-3.0f32..3.0, 64),
            bq in prop::collection::vec(-1.0f32..1.0, 64),
            wk in prop::collection::vec(-3.0f32..3.0, 64),
            bk in prop::collection::vec(-1.0f32..1.0, 64),
            xq in prop::collection::vec(-50.0f32..50.0, 64),
            xk in prop::collection::vec(-50.0f32..50.0, 64),
            aligned in any::<bool>(),
        ) {
            let (qn, kn) = (norm(wq, bq), norm(wk, bk));
            let bound = ScoreBound::from_qk_norms(&qn, &kn);
            let q = qn.forward(&xq);
            let k = if aligned { kn.forward(&xq) } else { kn.forward(&xk) };
            let score = dot(&q, &k) / 8.0 * std::f32::consts::LOG2_E;
            prop_assert!(score.abs() <= bound.log2, "score {score} bound {}", bound.log2);
            // And the longest possible q is reached only up to the bound.
            let q_len = dot(&q, &q).sqrt();
            prop_assert!(q_len <= longest_normed(&qn) * 1.0001);
        }
    }
}
