//! Seeded random weights for any configuration (benchmarks and demos without a checkpoint).
//! Values are scaled so activations stay in a sane range: LayerNorm weights 1, biases 0,
//! LayerScale at the model's initial values, matrices ~ N(0, 1/fan_in).

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

use super::{RawTensor, WeightStore};
use crate::model::config::ModelConfig;
use crate::model::error::Result;

/// A store holding every parameter of `cfg`, drawn from `seed`.
pub fn random_store(cfg: &ModelConfig, seed: u64) -> Result<WeightStore> {
    let shapes = cfg.parameter_shapes();
    let raw: Vec<RawTensor> = shapes
        .into_par_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n: usize = shape.iter().product();
            let data = if name.ends_with("norm1.weight")
                || name.ends_with("norm2.weight")
                || name.ends_with("norm.weight")
                || name.ends_with("_norm.weight")
            {
                vec![1.0; n]
            } else if name.ends_with(".gamma") {
                let init = if name.contains("patch_embed.blocks") {
                    1.0
                } else {
                    0.01
                };
                vec![init; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                let fan_in = if shape.len() >= 2 {
                    shape[1..].iter().product::<usize>()
                } else {
                    1
                };
                let std = if shape.len() >= 2 {
                    (1.0 / fan_in as f64).sqrt() as f32
                } else {
                    0.02
                };
                let mut rng =
                    StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64));
                match Normal::new(0.0f32, std) {
                    Ok(dist) => (0..n).map(|_| dist.sample(&mut rng)).collect(),
                    Err(_) => vec![0.0; n],
                }
            };
            RawTensor { name, shape, data }
        })
        .collect();
    let label = format!("random-weights(seed {seed})");
    WeightStore::from_raw(label, raw)
}
