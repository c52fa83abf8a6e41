//! Softmax attention on the CPU: `softmax(q kᵀ / √d) v` per head, without masks (the model never
//! needs one). Layout of q, k, v and the output: `[tokens][heads][head_dim]`, the order the
//! projections produce and the KV cache stores.

use rayon::prelude::*;

use super::linear::matmul;

/// Query rows handled per score block; bounds the score buffer to `QUERY_BLOCK × keys`.
const QUERY_BLOCK: usize = 128;

pub struct AttentionShape {
    pub queries: usize,
    pub keys: usize,
    pub heads: usize,
    pub head_dim: usize,
}

/// `out[q][h][:] = Σ_j softmax_j(q·k_j/√d) v_j[h][:]`.
pub fn attend(q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, out: &mut [f32]) {
    let AttentionShape {
        queries,
        keys,
        heads,
        head_dim: d,
    } = *shape;
    let row = heads * d;
    assert!(q.len() >= queries * row && out.len() >= queries * row);
    assert!(k.len() >= keys * row && v.len() >= keys * row);
    if keys == 0 {
        out[..queries * row].fill(0.0);
        return;
    }
    let scale = 1.0 / (d as f32).sqrt();
    // Gather each head's K and V contiguously once, so the products below are dense.
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let mut kt = vec![0.0f32; d * keys]; // [d][keys]: K_hᵀ
            let mut vh = vec![0.0f32; keys * d]; // [keys][d]
            for j in 0..keys {
                let src = &k[j * row + h * d..j * row + (h + 1) * d];
                for (c, &val) in src.iter().enumerate() {
                    kt[c * keys + j] = val;
                }
                vh[j * d..(j + 1) * d].copy_from_slice(&v[j * row + h * d..j * row + (h + 1) * d]);
            }
            (kt, vh)
        })
        .collect();

    let blocks: Vec<(usize, usize)> = (0..heads)
        .flat_map(|h| (0..queries.div_ceil(QUERY_BLOCK)).map(move |b| (h, b)))
        .collect();
    let results: Vec<(usize, usize, Vec<f32>)> = blocks
        .into_par_iter()
        .map(|(h, b)| {
            let q0 = b * QUERY_BLOCK;
            let nq = QUERY_BLOCK.min(queries - q0);
            let mut qh = vec![0.0f32; nq * d];
            for i in 0..nq {
                let src = &q[(q0 + i) * row + h * d..(q0 + i) * row + (h + 1) * d];
                for (c, &val) in src.iter().enumerate() {
                    qh[i * d + c] = val * scale;
                }
            }
            let (kt, vh) = &per_head[h];
            let mut scores = vec![0.0f32; nq * keys];
            matmul_single(&qh, kt, &mut scores, nq, keys, d);
            for s in scores.chunks_exact_mut(keys) {
                softmax_in_place(s);
            }
            let mut o = vec![0.0f32; nq * d];
            matmul_single(&scores, vh, &mut o, nq, d, keys);
            (h, q0, o)
        })
        .collect();
    for (h, q0, o) in results {
        for (i, chunk) in o.chunks_exact(d).enumerate() {
            let at = (q0 + i) * row + h * d;
            out[at..at + d].copy_from_slice(chunk);
        }
    }
}

/// Row-major product without nested parallelism (the caller already runs blocks in parallel).
fn matmul_single(lhs: &[f32], rhs: &[f32], dst: &mut [f32], m: usize, n: usize, k: usize) {
    // A product this small never crosses the parallel threshold of `matmul`, but large score
    // blocks might; nested rayon inside rayon is fine, only slower, so accept either.
    matmul(lhs, rhs, dst, m, n, k);
}

pub fn softmax_in_place(s: &mut [f32]) {
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in s.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_attention() {
        let (nq, nk, h, d) = (3, 5, 2, 4);
        let f = |i: usize, s: f32| ((i as f32) * s).sin();
        let q: Vec<f32> = (0..nq * h * d).map(|i| f(i, 0.3)).collect();
        let k: Vec<f32> = (0..nk * h * d).map(|i| f(i, 0.7)).collect();
        let v: Vec<f32> = (0..nk * h * d).map(|i| f(i, 1.1)).collect();
        let mut out = vec![0.0; nq * h * d];
        let shape = AttentionShape {
            queries: nq,
            keys: nk,
            heads: h,
            head_dim: d,
        };
        attend(&q, &k, &v, &shape, &mut out);
        for qi in 0..nq {
            for hh in 0..h {
                let logits: Vec<f32> = (0..nk)
                    .map(|j| {
                        (0..d)
                            .map(|c| q[qi * h * d + hh * d + c] * k[j * h * d + hh * d + c])
                            .sum::<f32>()
                            / (d as f32).sqrt()
                    })
                    .collect();
                let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = logits.iter().map(|l| (l - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for c in 0..d {
                    let want: f32 = (0..nk).map(|j| e[j] / z * v[j * h * d + hh * d + c]).sum();
                    let got = out[qi * h * d + hh * d + c];
                    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                }
            }
        }
    }
}
