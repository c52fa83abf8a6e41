//! Rotary position embeddings. Two conventions, both as the reference uses them:
//! - 2D (frame blocks): rotate-half, base 100; the first half of each head is rotated by the
//!   row, the second half by the column.
//! - 3D "video" (global blocks): interleaved pairs, theta 10000, head dim split 20/22/22 into
//!   temporal / row / column pairs.
//!
//! Both act in place on `[tokens][heads][head_dim]`.

use rayon::prelude::*;

use crate::model::spec::{ROPE2D_BASE, ROPE3D_SPLIT, ROPE3D_THETA};

/// Apply 2D RoPE. `positions[t] = (row, col)` for token t.
pub fn apply_rope_2d(x: &mut [f32], positions: &[(u32, u32)], heads: usize, head_dim: usize) {
    let half = head_dim / 2;
    let quarter = half / 2;
    // Frequencies in f32 exactly as the reference forms them: 1 / base^(2j/half).
    let inv_freq: Vec<f32> = (0..quarter)
        .map(|j| 1.0f32 / ROPE2D_BASE.powf((2 * j) as f32 / half as f32))
        .collect();
    let row_len = heads * head_dim;
    x.par_chunks_mut(row_len)
        .zip(positions.par_iter())
        .for_each(|(token, &(py, px))| {
            let tables: [Vec<(f32, f32)>; 2] = [py, px].map(|p| {
                inv_freq
                    .iter()
                    .map(|&f| {
                        let a = p as f32 * f;
                        (a.cos(), a.sin())
                    })
                    .collect()
            });
            for head in token.chunks_exact_mut(head_dim) {
                for (axis, table) in tables.iter().enumerate() {
                    let part = &mut head[axis * half..(axis + 1) * half];
                    for (d, &(c, s)) in table.iter().enumerate() {
                        let a = part[d];
                        let b = part[d + quarter];
                        part[d] = a * c - b * s;
                        part[d + quarter] = b * c + a * s;
                    }
                }
            }
        });
}

/// Per-token cos/sin of the 3D RoPE, `[tokens][head_dim/2]` each, in f32 (computed in f64).
pub struct Rope3dTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub pairs: usize,
}

/// Build the 3D RoPE table for tokens at `(frame, row, col)` indices.
pub fn rope_3d_table(positions: &[(u64, u64, u64)]) -> Rope3dTable {
    let freqs: Vec<Vec<f64>> = ROPE3D_SPLIT
        .iter()
        .map(|&dim| {
            (0..dim / 2)
                .map(|i| 1.0 / ROPE3D_THETA.powf((2 * i) as f64 / dim as f64))
                .collect()
        })
        .collect();
    let pairs: usize = ROPE3D_SPLIT.iter().map(|d| d / 2).sum();
    let mut cos = Vec::with_capacity(positions.len() * pairs);
    let mut sin = Vec::with_capacity(positions.len() * pairs);
    for &(f, r, c) in positions {
        for (axis, fr) in freqs.iter().enumerate() {
            let p = [f, r, c][axis] as f64;
            for &w in fr {
                let a = p * w;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
    }
    Rope3dTable { cos, sin, pairs }
}

/// Apply 3D RoPE with a table from [`rope_3d_table`] (interleaved-pair convention).
pub fn apply_rope_3d(x: &mut [f32], table: &Rope3dTable, heads: usize, head_dim: usize) {
    let pairs = table.pairs;
    debug_assert_eq!(pairs * 2, head_dim);
    x.par_chunks_mut(heads * head_dim)
        .enumerate()
        .for_each(|(t, token)| {
            let cos = &table.cos[t * pairs..(t + 1) * pairs];
            let sin = &table.sin[t * pairs..(t + 1) * pairs];
            for head in token.chunks_exact_mut(head_dim) {
                for i in 0..pairs {
                    let (a, b) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = a * cos[i] - b * sin[i];
                    head[2 * i + 1] = a * sin[i] + b * cos[i];
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotations_preserve_norms() {
        let (heads, d) = (2, 64);
        let mut x: Vec<f32> = (0..3 * heads * d).map(|i| (i as f32 * 0.1).sin()).collect();
        let norm = |x: &[f32]| x.iter().map(|v| v * v).sum::<f32>();
        let before = norm(&x);
        apply_rope_2d(&mut x, &[(0, 0), (1, 2), (3, 4)], heads, d);
        let t = rope_3d_table(&[(0, 0, 0), (5, 6, 7), (9, 1, 2)]);
        apply_rope_3d(&mut x, &t, heads, d);
        assert!((norm(&x) - before).abs() < 1e-3);
    }

    #[test]
    fn position_zero_is_identity() {
        let mut x: Vec<f32> = (0..64).map(|i| i as f32).collect();
        let orig = x.clone();
        apply_rope_2d(&mut x, &[(0, 0)], 1, 64);
        assert_eq!(x, orig);
    }
}
