//! The Hopper linear layer (`backend::cuda::gemm_sm90`, kernels/gemm_sm90.cu): every tile shape
//! against an f64 host product on sampled rows (the ragged last row tile included), against
//! cuBLASLt on the same inputs, with every epilogue, through `Gemm` when timing picks among
//! cuBLASLt's candidates and ours, and the q/k/v product with the split fused into it against
//! the product followed by the split kernel. Skips with the reason without a GPU, and says so
//! off Hopper.

mod common;

use cudarc::driver::CudaSlice;
use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::backend::cuda::CudaDevice;
use streamrecon::backend::cuda::arena::DevPtr;
use streamrecon::backend::cuda::gemm::{Epilogue, Gemm, SharedChoices, Tuning};
use streamrecon::backend::cuda::gemm_sm90::{self, GemmOperands, GemmTileShape};
use streamrecon::backend::cuda::ops::{self, PagedKvDest, QkNorm, Rope, RopeTables};
use streamrecon::model::spec::SPECIAL_TOKENS;

/// bf16 output of a k-long f32 sum: the rounding of the result dominates (2^-9 relative).
const TOLERANCE: f64 = 1e-2;
/// Written after the output to catch stores past row m (exact in bf16).
const GUARD: f32 = 12288.0;

fn hopper() -> Option<CudaDevice> {
    let dev = common::gpu_device()?;
    if gemm_sm90::shapes_for(&dev, 1024, 1024, 1024).is_empty() {
        eprintln!(
            "skipped: the sm_90a GEMM kernels are not loaded on this GPU (compute capability {})",
            dev.info.arch
        );
        return None;
    }
    Some(dev)
}

fn random_bf16(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-scale..scale)))
        .collect()
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    x: Vec<bf16>,
    w: Vec<bf16>,
    bias: Vec<bf16>,
}

impl Case {
    fn new(m: usize, n: usize, k: usize, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        // Activations of LayerNorm scale, weights of a trained layer's scale.
        let x = random_bf16(&mut rng, m * k, 2.0);
        let w = random_bf16(&mut rng, n * k, (3.0 / k as f32).sqrt());
        let bias = random_bf16(&mut rng, n, 0.5);
        Self {
            m,
            n,
            k,
            x,
            w,
            bias,
        }
    }

    /// Rows checked against the host: a spread over the matrix and the last six (the ragged
    /// last row tile).
    fn rows(&self) -> Vec<usize> {
        let mut rows: Vec<usize> = (0..self.m).step_by(61).collect();
        rows.extend(self.m.saturating_sub(6)..self.m);
        rows.dedup();
        rows
    }

    fn reference(&self, row: usize, epilogue: Epilogue) -> Vec<f64> {
        let x = &self.x[row * self.k..(row + 1) * self.k];
        (0..self.n)
            .map(|j| {
                let w = &self.w[j * self.k..(j + 1) * self.k];
                let dot: f64 = x.iter().zip(w).map(|(a, b)| a.to_f64() * b.to_f64()).sum();
                match epilogue {
                    Epilogue::None => dot,
                    Epilogue::Bias => dot + self.bias[j].to_f64(),
                    Epilogue::BiasGelu => gelu_tanh(dot + self.bias[j].to_f64()),
                }
            })
            .collect()
    }
}

struct Buffers {
    x: CudaSlice<bf16>,
    w: CudaSlice<bf16>,
    bias: CudaSlice<bf16>,
    y: CudaSlice<bf16>,
}

impl Buffers {
    fn new(dev: &CudaDevice, c: &Case) -> Self {
        let guard = vec![bf16::from_f32(GUARD); c.m * c.n + c.n];
        Self {
            x: dev.stream.clone_htod(&c.x).expect("upload x"),
            w: dev.stream.clone_htod(&c.w).expect("upload w"),
            bias: dev.stream.clone_htod(&c.bias).expect("upload bias"),
            y: dev.stream.clone_htod(&guard).expect("upload y"),
        }
    }

    fn operands(&self, epilogue: Epilogue) -> GemmOperands {
        GemmOperands {
            x: DevPtr::of(&self.x).addr(),
            w: DevPtr::of(&self.w).addr(),
            bias: (epilogue != Epilogue::None).then(|| DevPtr::of(&self.bias).addr()),
            y: DevPtr::of(&self.y).addr(),
        }
    }

    fn output(&self, dev: &CudaDevice) -> Vec<f32> {
        let y: Vec<bf16> = dev.stream.clone_dtoh(&self.y).expect("download y");
        y.iter().map(|v| v.to_f32()).collect()
    }
}

/// `‖got − want‖ / ‖want‖` over the checked rows, and the largest difference over max |want|.
fn errors(c: &Case, y: &[f32], epilogue: Epilogue) -> (f64, f64) {
    let (mut num, mut den, mut max_d, mut max_w) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for row in c.rows() {
        let want = c.reference(row, epilogue);
        for (j, w) in want.iter().enumerate() {
            let d = y[row * c.n + j] as f64 - w;
            num += d * d;
            den += w * w;
            max_d = max_d.max(d.abs());
            max_w = max_w.max(w.abs());
        }
    }
    ((num / den).sqrt(), max_d / max_w)
}

fn check(dev: &CudaDevice, c: &Case, shape: GemmTileShape, epilogue: Epilogue) {
    let b = Buffers::new(dev, c);
    gemm_sm90::linear(dev, shape, b.operands(epilogue), c.m, c.n, c.k, epilogue).expect("launch");
    let y = b.output(dev);
    let (rel, max) = errors(c, &y, epilogue);
    println!(
        "{} {}x{}x{} {epilogue:?}: relative error {rel:.2e}, max {max:.2e}",
        shape.label(),
        c.m,
        c.n,
        c.k
    );
    assert!(
        rel < TOLERANCE && max < TOLERANCE,
        "{shape:?} {}x{}x{} {epilogue:?}: {rel:.2e} / {max:.2e}",
        c.m,
        c.n,
        c.k
    );
    let past = &y[c.m * c.n..];
    assert!(
        past.iter().all(|&v| v == GUARD),
        "{shape:?} wrote past row {}",
        c.m
    );
}

#[test]
fn every_tile_shape_matches_the_host_product() {
    let Some(dev) = hopper() else { return };
    // A frame's four products (1005 tokens), a multi-wave one (8 frames) and a small one.
    let products = [
        (1005, 3072, 1024, Epilogue::Bias),
        (1005, 1024, 1024, Epilogue::Bias),
        (1005, 4096, 1024, Epilogue::BiasGelu),
        (1005, 1024, 4096, Epilogue::Bias),
        (8040, 1024, 1024, Epilogue::Bias),
        (70, 768, 192, Epilogue::None),
    ];
    for (i, &(m, n, k, epilogue)) in products.iter().enumerate() {
        let case = Case::new(m, n, k, 17 + i as u64);
        let shapes = gemm_sm90::shapes_for(&dev, m, n, k);
        assert!(!shapes.is_empty(), "no tile shape for {m}x{n}x{k}");
        for shape in shapes {
            check(&dev, &case, shape, epilogue);
        }
    }
}

#[test]
fn every_epilogue_matches_cublaslt() {
    let Some(dev) = hopper() else { return };
    let mut lt = match Gemm::new(&dev) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let c = Case::new(1005, 1024, 1024, 5);
    for shape in gemm_sm90::shapes_for(&dev, c.m, c.n, c.k) {
        for epilogue in [Epilogue::None, Epilogue::Bias, Epilogue::BiasGelu] {
            let ours = Buffers::new(&dev, &c);
            let theirs = Buffers::new(&dev, &c);
            gemm_sm90::linear(
                &dev,
                shape,
                ours.operands(epilogue),
                c.m,
                c.n,
                c.k,
                epilogue,
            )
            .expect("ours");
            let bias = (epilogue != Epilogue::None).then(|| DevPtr::of(&theirs.bias));
            lt.linear(
                &dev,
                DevPtr::of(&theirs.x),
                DevPtr::of(&theirs.w),
                bias,
                DevPtr::of(&theirs.y),
                c.m,
                c.n,
                c.k,
                epilogue,
            )
            .expect("cuBLASLt");
            let (a, b) = (ours.output(&dev), theirs.output(&dev));
            let n = c.m * c.n;
            let num: f64 = a[..n]
                .iter()
                .zip(&b[..n])
                .map(|(x, y)| ((x - y) as f64).powi(2))
                .sum();
            let den: f64 = b[..n].iter().map(|y| (*y as f64).powi(2)).sum();
            let rel = (num / den).sqrt();
            println!(
                "{} {epilogue:?}: ours against cuBLASLt, relative difference {rel:.2e}",
                shape.label()
            );
            assert!(rel < TOLERANCE, "{shape:?} {epilogue:?}: {rel:.2e}");
        }
    }
}

#[test]
fn measured_choice_computes_the_product() {
    let Some(dev) = hopper() else { return };
    let mut gemm = match Gemm::new(&dev) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    gemm.set_tuning(Tuning::Measure, &SharedChoices::default());
    for (i, (m, n, k)) in [(1005, 3072, 1024), (1005, 1024, 4096)]
        .into_iter()
        .enumerate()
    {
        let c = Case::new(m, n, k, 90 + i as u64);
        let b = Buffers::new(&dev, &c);
        // Twice: the first call times the candidates (the output is rewritten each time), the
        // second runs the chosen one alone.
        for _ in 0..2 {
            gemm.linear(
                &dev,
                DevPtr::of(&b.x),
                DevPtr::of(&b.w),
                Some(DevPtr::of(&b.bias)),
                DevPtr::of(&b.y),
                m,
                n,
                k,
                Epilogue::Bias,
            )
            .expect("linear");
        }
        let (rel, max) = errors(&c, &b.output(&dev), Epilogue::Bias);
        let record = gemm.tune_records().last().expect("a timed shape").clone();
        println!(
            "{m}x{n}x{k}: chose {} ({:.4} ms; best cuBLASLt {:.4} ms; {} candidates), relative error {rel:.2e}",
            record.chosen_kernel, record.chosen_ms, record.best_cublaslt_ms, record.candidates
        );
        assert!(record.candidates > GemmTileShape::ALL.len().min(2));
        assert!(rel < TOLERANCE && max < TOLERANCE, "{rel:.2e} / {max:.2e}");
    }
}

/// How the fused q/k/v epilogue is checked: against our own product (the same tile, so the
/// same bf16 q/k/v) followed by the split kernel.
struct SplitCase {
    name: &'static str,
    norm: bool,
    /// 0 none, 1 2D (frame blocks), 2 3D (global blocks).
    rope: u8,
}

#[test]
fn fused_qkv_split_matches_the_product_then_the_split() {
    let Some(dev) = hopper() else { return };
    const HEADS: usize = 16;
    const C: usize = HEADS * 64;
    const GRID_H: usize = 27;
    const GRID_W: usize = 37;
    let tokens = SPECIAL_TOKENS + GRID_H * GRID_W;
    if !gemm_sm90::fuses_qkv_split(&dev, tokens, 3 * C, C) {
        eprintln!("skipped: the fused q/k/v kernel is not loaded");
        return;
    }
    let tables = RopeTables::new(&dev, 1024, GRID_H, GRID_W).expect("rope tables");
    let c = Case::new(tokens, 3 * C, C, 77);
    let mut rng = StdRng::seed_from_u64(78);
    let norm_host: Vec<Vec<f32>> = (0..4)
        .map(|i| {
            let (lo, hi) = if i % 2 == 0 { (0.5, 1.5) } else { (-0.3, 0.3) };
            (0..64).map(|_| rng.random_range(lo..hi)).collect()
        })
        .collect();
    let norm_d: Vec<CudaSlice<f32>> = norm_host
        .iter()
        .map(|v| dev.stream.clone_htod(v).expect("norm"))
        .collect();
    let frame_base = dev.stream.clone_htod(&[37u32]).expect("frame base");
    // Three pages of 400 slots; the runs leave the last five tokens without a slot, and start
    // mid-page, so both the page lookup and "no run" are exercised.
    const PAGE: usize = 400;
    let runs: [u32; 12] = [0, 2, 10, 390, 390, 0, 0, 400, 790, 1, 5, 210];
    let runs_d = dev.stream.clone_htod(&runs).expect("runs");
    let n_runs_d = dev.stream.clone_htod(&[3u32]).expect("run count");
    let pool_len = 3 * 2 * HEADS * PAGE * 64;
    let cases = [
        SplitCase {
            name: "plain",
            norm: false,
            rope: 0,
        },
        SplitCase {
            name: "qk-norm + 2D RoPE",
            norm: true,
            rope: 1,
        },
        SplitCase {
            name: "qk-norm + 3D RoPE",
            norm: true,
            rope: 2,
        },
    ];
    let shape = GemmTileShape::ALL
        .into_iter()
        .find(|s| s.rows() == 128 && s.cols() == 192)
        .expect("the 128 x 192 tile");
    for case in &cases {
        let b = Buffers::new(&dev, &c);
        let mut outs = Vec::new();
        for fused in [false, true] {
            let q = dev.stream.alloc_zeros::<bf16>(tokens * C).expect("q");
            let pool = dev.stream.alloc_zeros::<bf16>(pool_len).expect("pool");
            let dest = PagedKvDest {
                pool: DevPtr::of(&pool).addr(),
                runs: DevPtr::of(&runs_d).addr(),
                n_runs: DevPtr::of(&n_runs_d).addr(),
                page_size: PAGE as u32,
            };
            let norm = case.norm.then(|| QkNorm {
                q_weight: DevPtr::of(&norm_d[0]),
                q_bias: DevPtr::of(&norm_d[1]),
                k_weight: DevPtr::of(&norm_d[2]),
                k_bias: DevPtr::of(&norm_d[3]),
                eps: 1e-6,
            });
            let rope = match case.rope {
                1 => Rope::Axial2d {
                    tables: &tables,
                    tokens_per_frame: tokens,
                    grid_w: GRID_W,
                },
                2 => Rope::Video3d {
                    tables: &tables,
                    tokens_per_frame: tokens,
                    grid_w: GRID_W,
                    frame_base: DevPtr::of(&frame_base),
                },
                _ => Rope::None,
            };
            if fused {
                let args = ops::qkv_split_args(DevPtr::of(&q), dest, tokens, HEADS, norm, rope)
                    .expect("split arguments");
                gemm_sm90::linear_qkv_split(
                    &dev,
                    DevPtr::of(&b.x),
                    DevPtr::of(&b.w),
                    DevPtr::of(&b.bias),
                    tokens,
                    C,
                    &args,
                )
                .expect("fused");
            } else {
                gemm_sm90::linear(
                    &dev,
                    shape,
                    b.operands(Epilogue::Bias),
                    tokens,
                    3 * C,
                    C,
                    Epilogue::Bias,
                )
                .expect("product");
                ops::qkv_split_norm_rope_to_pages(
                    &dev,
                    DevPtr::of(&b.y),
                    DevPtr::of(&q),
                    dest,
                    tokens,
                    HEADS,
                    norm,
                    rope,
                )
                .expect("split");
            }
            let q: Vec<bf16> = dev.stream.clone_dtoh(&q).expect("q back");
            let pool: Vec<bf16> = dev.stream.clone_dtoh(&pool).expect("pool back");
            outs.push((q, pool));
        }
        let ((q0, p0), (q1, p1)) = (&outs[0], &outs[1]);
        let rel = |a: &[bf16], b: &[bf16]| {
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for (x, y) in a.iter().zip(b) {
                num += (x.to_f64() - y.to_f64()).powi(2);
                den += y.to_f64().powi(2);
            }
            (num / den.max(1e-30)).sqrt()
        };
        // V (the second half of each page) is copied: identical. K and q: the norm's sums run
        // in another order, a few bf16 roundings differ.
        let half = HEADS * PAGE * 64;
        let v_same = (0..3).all(|p| {
            let v = (2 * p + 1) * half..(2 * p + 2) * half;
            p0[v.clone()] == p1[v]
        });
        let (rq, rp) = (rel(q1, q0), rel(p1, p0));
        println!(
            "{}: fused against product + split: q {rq:.2e}, K/V pages {rp:.2e}, V identical {v_same}",
            case.name
        );
        assert!(v_same, "{}: V differs", case.name);
        assert!(
            rq < 3e-3 && rp < 3e-3,
            "{}: q {rq:.2e}, pages {rp:.2e}",
            case.name
        );
        if !case.norm && case.rope == 0 {
            assert_eq!(q0, q1, "{}: the plain split must be exact", case.name);
        }
        // Slots no run names stay untouched (page 2 before slot 10, page 1 past slot 215).
        let k_page2 = 2 * 2 * half;
        assert!(
            p1[k_page2..k_page2 + 10 * 64]
                .iter()
                .all(|v| v.to_f32() == 0.0),
            "{}: wrote a slot before the run",
            case.name
        );
    }
}
