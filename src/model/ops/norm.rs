//! Layer normalisation over the last dimension.

use rayon::prelude::*;

/// Parameters of type `V` (f32 vectors on the CPU, device buffers on the GPU).
#[derive(Clone, Debug)]
pub struct LayerNorm<V = Vec<f32>> {
    /// `None` for the affine-free norm of the camera head's modulation.
    pub weight: Option<V>,
    pub bias: Option<V>,
    pub dim: usize,
    pub eps: f32,
}

impl LayerNorm {
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        self.forward_in_place(&mut y);
        y
    }

    /// Normalise each row of `dim` values. Statistics are taken in f64 so the result does not
    /// depend on the summation order (PyTorch's own reduction order is not reproducible anyway).
    pub fn forward_in_place(&self, x: &mut [f32]) {
        let dim = self.dim;
        x.par_chunks_mut(dim.max(1)).for_each(|row| {
            let n = row.len() as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row
                .iter()
                .map(|&v| {
                    let d = v as f64 - mean;
                    d * d
                })
                .sum::<f64>()
                / n;
            let inv = 1.0 / (var + self.eps as f64).sqrt();
            for (i, v) in row.iter_mut().enumerate() {
                let mut y = ((*v as f64 - mean) * inv) as f32;
                if let Some(w) = &self.weight {
                    y *= w[i];
                }
                if let Some(b) = &self.bias {
                    y += b[i];
                }
                *v = y;
            }
        });
    }
}
