//! A small f64-accumulating reference for paged attention on the host, over the same storage
//! layout as the device pools. It is the oracle of the CUDA tests and of `bench`'s error column,
//! written independently of the kernel (plain per-key page lookup, two-pass softmax).

use half::bf16;
use rayon::prelude::*;

/// One layer's paged keys on the host: pool `[page][K|V][heads][page_size][head_dim]` bf16 and the
/// visible pages with their valid lengths.
pub struct HostPagedKv<'a> {
    pub pool: &'a [bf16],
    pub page_size: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub indices: &'a [u32],
    pub page_lens: &'a [u32],
}

impl HostPagedKv<'_> {
    /// (K row, V row) of head `h` of each visible key, in attention order.
    fn keys(&self, h: usize) -> impl Iterator<Item = (&[bf16], &[bf16])> + '_ {
        let head = self.page_size * self.head_dim;
        let v_off = self.heads * head;
        self.indices
            .iter()
            .zip(self.page_lens)
            .flat_map(move |(&page, &len)| {
                let base = page as usize * 2 * v_off + h * head;
                (0..len as usize).map(move |slot| {
                    let k = base + slot * self.head_dim;
                    (
                        &self.pool[k..k + self.head_dim],
                        &self.pool[k + v_off..k + v_off + self.head_dim],
                    )
                })
            })
    }
}

/// Attention output `[rows.len()][heads][head_dim]` (f32) for the query rows `rows` of
/// `q: [lq][heads][head_dim]`, scale 1/sqrt(head_dim), no mask. Zero where no key is visible.
pub fn paged_attention_rows(q: &[bf16], kv: &HostPagedKv<'_>, rows: &[usize]) -> Vec<f32> {
    paged_attention_rows_scaled(q, kv, rows, 1.0 / (kv.head_dim as f64).sqrt())
}

/// [`paged_attention_rows`] with the scores `q·k · scale` (`ln 2` for queries already in the
/// log2 domain, whose softmax is `2^(q·k)` normalised).
pub fn paged_attention_rows_scaled(
    q: &[bf16],
    kv: &HostPagedKv<'_>,
    rows: &[usize],
    scale: f64,
) -> Vec<f32> {
    let (heads, d) = (kv.heads, kv.head_dim);
    let jobs: Vec<(usize, usize)> = rows
        .iter()
        .flat_map(|&r| (0..heads).map(move |h| (r, h)))
        .collect();
    let results: Vec<Vec<f32>> = jobs
        .par_iter()
        .map(|&(r, h)| {
            let qr: Vec<f64> = q[(r * heads + h) * d..(r * heads + h + 1) * d]
                .iter()
                .map(|x| x.to_f64())
                .collect();
            let logits: Vec<f64> = kv
                .keys(h)
                .map(|(k, _)| qr.iter().zip(k).map(|(a, b)| a * b.to_f64()).sum::<f64>() * scale)
                .collect();
            let mut acc = vec![0f64; d];
            if logits.is_empty() {
                return vec![0f32; d];
            }
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut denom = 0f64;
            for ((_, v), &s) in kv.keys(h).zip(&logits) {
                let p = (s - max).exp();
                denom += p;
                for (a, x) in acc.iter_mut().zip(v) {
                    *a += p * x.to_f64();
                }
            }
            acc.iter().map(|a| (a / denom) as f32).collect()
        })
        .collect();
    results.concat()
}

/// ‖a − b‖ / ‖b‖ (NaN anywhere gives NaN, so it never passes a threshold).
pub fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if a.len() != b.len() {
        return f64::NAN;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}
