//! `bench gemm`: every candidate for a linear layer's product, timed on the GPU: cuBLASLt's
//! heuristic list and, on Hopper, our kernel's tile shapes (`backend::cuda::gemm_sm90`), on
//! random bf16 operands, the way `Tuning::Measure` times them for the model (one untimed launch,
//! then `reps` back to back). The default shapes are a frame's (1005 tokens) four block products.

use cudarc::driver::CudaSlice;
use half::bf16;
use serde::Serialize;

use super::BenchError;
use super::attention::fill_random_scaled;
use crate::backend::cuda::CudaDevice;
use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::gemm::{Epilogue, Gemm, SharedChoices, Tuning};

/// One product to time: `[m][k] · [n][k]ᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: Epilogue,
}

/// A frame's products in every transformer block (1005 tokens, C = 1024): q/k/v, proj, fc1 with
/// its GELU, fc2.
pub fn frame_shapes() -> Vec<GemmShape> {
    let shape = |n, k, epilogue| GemmShape {
        m: 1005,
        n,
        k,
        epilogue,
    };
    vec![
        shape(3072, 1024, Epilogue::Bias),
        shape(1024, 1024, Epilogue::Bias),
        shape(4096, 1024, Epilogue::BiasGelu),
        shape(1024, 4096, Epilogue::Bias),
    ]
}

/// Parses `MxNxK` items, comma separated (the bias epilogue; `g` after K adds the GELU).
pub fn parse_shapes(list: &str) -> Result<Vec<GemmShape>, BenchError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let bad = || BenchError::GemmShape(item.to_owned());
            let (dims, epilogue) = match item.strip_suffix('g') {
                Some(d) => (d, Epilogue::BiasGelu),
                None => (item, Epilogue::Bias),
            };
            let v: Vec<usize> = dims
                .split('x')
                .map(|d| d.parse().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            match v[..] {
                [m, n, k] if m > 0 && n > 0 && k > 0 => Ok(GemmShape { m, n, k, epilogue }),
                _ => Err(bad()),
            }
        })
        .collect()
}

/// One candidate's time for one shape.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateTime {
    /// `cuBLASLt #i` (position in the heuristic's list) or `wgmma mRnC`.
    pub kernel: String,
    pub ms: f64,
    pub tflops: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShapeReport {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: String,
    pub candidates: Vec<CandidateTime>,
    pub chosen: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct GemmReport {
    pub device: String,
    pub reps: usize,
    pub shapes: Vec<ShapeReport>,
}

/// Times every candidate of every shape on GPU `device`.
pub fn run_gemm(
    device: usize,
    shapes: &[GemmShape],
    reps: usize,
) -> Result<GemmReport, BenchError> {
    let dev = CudaDevice::open(device).map_err(BenchError::GemmNeedsGpu)?;
    let mut report = GemmReport {
        device: dev.info.name.clone(),
        reps,
        shapes: Vec::new(),
    };
    for (i, s) in shapes.iter().enumerate() {
        // A handle per shape: each measures afresh, with nothing chosen before.
        let mut gemm = Gemm::new(&dev)?;
        gemm.set_tuning(Tuning::Measure, &SharedChoices::default());
        gemm.set_tuning_reps(reps);
        let buffer = |len: usize, seed: u64, scale: f32| -> Result<CudaSlice<bf16>, BenchError> {
            let mut b = dev.stream.alloc_zeros::<bf16>(len)?;
            fill_random_scaled(&dev, &mut b, seed, scale)?;
            Ok(b)
        };
        let seed = 1000 * i as u64;
        let x = buffer(s.m * s.k, seed + 1, 2.0)?;
        let w = buffer(s.n * s.k, seed + 2, (3.0 / s.k as f32).sqrt())?;
        let bias = buffer(s.n, seed + 3, 0.5)?;
        let y = dev.stream.alloc_zeros::<bf16>(s.m * s.n)?;
        gemm.linear(
            &dev,
            DevPtr::of(&x),
            DevPtr::of(&w),
            Some(DevPtr::of(&bias)),
            DevPtr::of(&y),
            s.m,
            s.n,
            s.k,
            s.epilogue,
        )?;
        dev.stream.synchronize()?;
        let flop = 2.0 * (s.m * s.n * s.k) as f64;
        let (candidates, chosen) = match gemm.tune_records().last() {
            Some(r) => (
                r.timings
                    .iter()
                    .map(|(kernel, ms)| CandidateTime {
                        kernel: kernel.clone(),
                        ms: *ms,
                        tflops: flop / (ms * 1e-3) / 1e12,
                    })
                    .collect(),
                r.chosen_kernel.clone(),
            ),
            // A single candidate is not timed.
            None => (Vec::new(), "the only candidate".to_owned()),
        };
        report.shapes.push(ShapeReport {
            m: s.m,
            n: s.n,
            k: s.k,
            epilogue: format!("{:?}", s.epilogue),
            candidates,
            chosen,
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_with_and_without_gelu() {
        let s = parse_shapes("1005x3072x1024, 1005x4096x1024g").expect("valid");
        assert_eq!(s[0].n, 3072);
        assert_eq!(s[0].epilogue, Epilogue::Bias);
        assert_eq!(s[1].epilogue, Epilogue::BiasGelu);
        for bad in ["1005x3072", "0x1x1", "axbxc", "1x2x3x4"] {
            assert!(parse_shapes(bad).is_err(), "{bad}");
        }
    }
}
