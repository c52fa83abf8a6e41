//! The GPU transformer ops (`backend::cuda::ops`, kernels/transformer.cu) against the CPU f32
//! model's own functions on random data at the real sizes (1005 tokens per frame = 6 + 27 x 37
//! patches, 16 heads x 64, C = 1024, 378 x 518 images). GPU tests skip with a printed reason
//! where there is no GPU; every case prints its errors so a failure can be read from the log.
//! `rope_tables_match_the_cpu_rope` runs everywhere (no GPU).

mod common;

use cudarc::driver::{CudaSlice, DeviceRepr};
use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::backend::cuda::CudaDevice;
use streamrecon::backend::cuda::arena::DevPtr;
use streamrecon::backend::cuda::ops::{
    self, LnOut, QkNorm, Rope, RopeHostTables, RopeTables, RowCopy,
};
use streamrecon::model::aggregator::imagenet_normalize;
use streamrecon::model::ops::activation::gelu_in_place;
use streamrecon::model::ops::norm::LayerNorm;
use streamrecon::model::ops::rope::{apply_rope_2d, apply_rope_3d, rope_3d_table};
use streamrecon::model::spec::SPECIAL_TOKENS;

const HEADS: usize = 16;
const D: usize = streamrecon::model::spec::HEAD_DIM;
const C: usize = HEADS * D;
const GRID_H: usize = 27;
const GRID_W: usize = 37;
const TOKENS_PER_FRAME: usize = SPECIAL_TOKENS + GRID_H * GRID_W;
const MAX_FRAMES: usize = 1024;
/// bf16 outputs: relative error of the values (L2 and max-abs over max |ref|).
const BF16_TOL: f64 = 1e-2;
/// f32 outputs of f32 math (only the summation order differs from the CPU).
const F32_TOL: f64 = 1e-4;

fn device() -> Option<CudaDevice> {
    common::gpu_device()
}

fn up<T: DeviceRepr>(dev: &CudaDevice, v: &[T]) -> CudaSlice<T> {
    dev.stream.clone_htod(v).expect("upload")
}

fn down<T: DeviceRepr + Default + Clone>(dev: &CudaDevice, s: &CudaSlice<T>) -> Vec<T> {
    dev.stream.clone_dtoh(s).expect("download")
}

fn down_bf16(dev: &CudaDevice, s: &CudaSlice<bf16>) -> Vec<f32> {
    down(dev, s).iter().map(|v| v.to_f32()).collect()
}

fn random(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Random values already representable in bf16 (GPU input and CPU reference see the same).
fn random_bf16(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(lo..hi)))
        .collect()
}

fn to_f32(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// Prints and checks: relative L2 error, max abs error over max |ref|, non-finite outputs.
fn check(name: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let (mut num, mut den, mut max_abs, mut max_ref) = (0f64, 0f64, 0f64, 0f64);
    let (mut worst, mut non_finite) = (0usize, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !g.is_finite() {
            non_finite += 1;
            continue;
        }
        let d = (g as f64 - w as f64).abs();
        num += d * d;
        den += (w as f64) * (w as f64);
        max_ref = max_ref.max((w as f64).abs());
        if d > max_abs {
            max_abs = d;
            worst = i;
        }
    }
    let rel = (num / den.max(1e-300)).sqrt();
    let max_rel = max_abs / max_ref.max(1e-300);
    println!(
        "{name}: {} values, rel L2 {rel:.3e}, max abs {max_abs:.3e} / max |ref| {max_ref:.3e} = {max_rel:.3e} \
         (worst [{worst}]: got {} want {}), non-finite {non_finite}",
        got.len(),
        got[worst],
        want[worst]
    );
    assert!(
        non_finite == 0 && rel <= tol && max_rel <= tol,
        "{name}: error above {tol:e}"
    );
}

// ---------------------------------------------------------------------------------------------
// CPU only

#[test]
fn rope_tables_match_the_cpu_rope() {
    let t = RopeHostTables::new(MAX_FRAMES, GRID_H, GRID_W);
    // 2D: rotating a head with ones in the first quarter of each half and zeros in the second
    // yields exactly (cos, sin) of every frequency: out[d] = c, out[d + 16] = s.
    let positions = GRID_H.max(GRID_W) + 1;
    assert_eq!(t.axial2d.len(), positions * 16 * 2);
    for p in 0..positions {
        let mut x = vec![0.0f32; D];
        for d in 0..16 {
            x[d] = 1.0;
            x[32 + d] = 1.0;
        }
        // Row and column positions differ so a swapped half would show.
        let col = (positions - 1 - p) as u32;
        apply_rope_2d(&mut x, &[(p as u32, col)], 1, D);
        for d in 0..16 {
            let row_cs = &t.axial2d[(p * 16 + d) * 2..][..2];
            let col_cs = &t.axial2d[(col as usize * 16 + d) * 2..][..2];
            assert_eq!([x[d], x[d + 16]], row_cs, "2D row position {p}, freq {d}");
            assert_eq!(
                [x[32 + d], x[48 + d]],
                col_cs,
                "2D column position {col}, freq {d}"
            );
        }
    }
    // 3D: the CPU table for (f, r, c) covering every frame, row and column index.
    let (rows, cols) = (SPECIAL_TOKENS + GRID_H, SPECIAL_TOKENS + GRID_W);
    assert_eq!(t.temporal.len(), MAX_FRAMES * 10 * 2);
    assert_eq!(t.rows.len(), rows * 11 * 2);
    assert_eq!(t.cols.len(), cols * 11 * 2);
    let pos: Vec<(u64, u64, u64)> = (0..MAX_FRAMES)
        .map(|f| (f as u64, (f % rows) as u64, ((f * 7) % cols) as u64))
        .collect();
    let cpu = rope_3d_table(&pos);
    assert_eq!(cpu.pairs, 32);
    for (i, &(f, r, c)) in pos.iter().enumerate() {
        for pair in 0..32 {
            let (table, idx) = match pair {
                0..10 => (&t.temporal, f as usize * 10 + pair),
                10..21 => (&t.rows, r as usize * 11 + pair - 10),
                _ => (&t.cols, c as usize * 11 + pair - 21),
            };
            assert_eq!(
                [cpu.cos[i * 32 + pair], cpu.sin[i * 32 + pair]],
                table[idx * 2..idx * 2 + 2],
                "3D ({f}, {r}, {c}) pair {pair}"
            );
        }
    }
    println!("rope tables: 2D {positions} positions, 3D {MAX_FRAMES} frames: identical to rope.rs");
}

// ---------------------------------------------------------------------------------------------
// GPU

#[test]
fn layer_norm_matches_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(1);
    // (rows, cols, affine, bf16 out): the block norms, a width not a multiple of the CTA, the
    // heads' 2048-wide affine-free norm.
    let cases = [
        (1005, 1024, true, true),
        (1005, 1024, true, false),
        (33, 1000, true, true),
        (7, 2048, false, false),
        (5, 2048, false, true),
        (64, 64, true, false),
    ];
    for (rows, cols, affine, bf16_out) in cases {
        // An offset mean and a spread of scales, like residual streams.
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| 3.0 + (1.0 + (i / cols) as f32 * 0.01) * rng.random_range(-4.0f32..4.0))
            .collect();
        let weight = affine.then(|| random(&mut rng, cols, 0.5, 1.5));
        let bias = affine.then(|| random(&mut rng, cols, -0.5, 0.5));
        let eps = 1e-5;
        let ln = LayerNorm {
            weight: weight.clone(),
            bias: bias.clone(),
            dim: cols,
            eps,
        };
        let want = ln.forward(&x);
        let xd = up(&dev, &x);
        let wd = weight.as_ref().map(|w| up(&dev, w));
        let bd = bias.as_ref().map(|b| up(&dev, b));
        let name = format!("layer_norm {rows}x{cols} affine={affine} bf16={bf16_out}");
        let got = if bf16_out {
            let out = dev.stream.alloc_zeros::<bf16>(rows * cols).unwrap();
            ops::layer_norm(
                &dev,
                DevPtr::of(&xd),
                rows,
                cols,
                wd.as_ref().map(DevPtr::of),
                bd.as_ref().map(DevPtr::of),
                eps,
                LnOut::Bf16(DevPtr::of(&out)),
            )
            .unwrap();
            down_bf16(&dev, &out)
        } else {
            let out = dev.stream.alloc_zeros::<f32>(rows * cols).unwrap();
            ops::layer_norm(
                &dev,
                DevPtr::of(&xd),
                rows,
                cols,
                wd.as_ref().map(DevPtr::of),
                bd.as_ref().map(DevPtr::of),
                eps,
                LnOut::F32(DevPtr::of(&out)),
            )
            .unwrap();
            down(&dev, &out)
        };
        check(
            &name,
            &got,
            &want,
            if bf16_out { BF16_TOL } else { F32_TOL },
        );
    }
    // In place (f32 out over the input).
    let (rows, cols) = (100, 1024);
    let x = random(&mut rng, rows * cols, -2.0, 2.0);
    let ln = LayerNorm {
        weight: None,
        bias: None,
        dim: cols,
        eps: 1e-6,
    };
    let xd = up(&dev, &x);
    let p = DevPtr::of(&xd);
    ops::layer_norm(&dev, p, rows, cols, None, None, 1e-6, LnOut::F32(p)).unwrap();
    check(
        "layer_norm in place",
        &down(&dev, &xd),
        &ln.forward(&x),
        F32_TOL,
    );
    // Arguments are checked.
    let short = dev.stream.alloc_zeros::<f32>(10).unwrap();
    let err = ops::layer_norm(
        &dev,
        DevPtr::of(&short),
        2,
        1024,
        None,
        None,
        1e-6,
        LnOut::F32(DevPtr::of(&short)),
    )
    .unwrap_err();
    println!("short buffer: {err}");
    assert!(err.to_string().contains("layer_norm x"));
}

#[test]
fn residual_add_scaled_matches_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(2);
    // Real size (4-wide kernel), then a width that is not a multiple of 4 (scalar kernel).
    for (rows, cols) in [(2 * TOKENS_PER_FRAME, C), (33, 1002)] {
        let resid = random(&mut rng, rows * cols, -3.0, 3.0);
        let y = random_bf16(&mut rng, rows * cols, -2.0, 2.0);
        let gamma = random(&mut rng, cols, -0.2, 0.2);
        let mut want = resid.clone();
        for (i, w) in want.iter_mut().enumerate() {
            *w += gamma[i % cols] * y[i].to_f32();
        }
        let (rd, yd, gd) = (up(&dev, &resid), up(&dev, &y), up(&dev, &gamma));
        ops::residual_add_scaled(
            &dev,
            DevPtr::of(&rd),
            DevPtr::of(&yd),
            DevPtr::of(&gd),
            rows,
            cols,
        )
        .unwrap();
        check(
            &format!("residual_add_scaled {rows}x{cols}"),
            &down(&dev, &rd),
            &want,
            F32_TOL,
        );
    }
}

#[test]
fn residual_layer_norm_equals_the_two_kernels() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(3);
    // The fused 1024-wide kernel (with and without affine), then the two-kernel fallback width.
    for (rows, cols, affine) in [(TOKENS_PER_FRAME, C, true), (37, C, false), (9, 1000, true)] {
        let resid = random(&mut rng, rows * cols, -3.0, 3.0);
        let y = random_bf16(&mut rng, rows * cols, -2.0, 2.0);
        let gamma = random(&mut rng, cols, -0.2, 0.2);
        let weight = affine.then(|| random(&mut rng, cols, 0.5, 1.5));
        let bias = affine.then(|| random(&mut rng, cols, -0.5, 0.5));
        let (yd, gd) = (up(&dev, &y), up(&dev, &gamma));
        let wd = weight.as_ref().map(|w| up(&dev, w));
        let bd = bias.as_ref().map(|b| up(&dev, b));
        let eps = 1e-6;

        let separate_x = up(&dev, &resid);
        let separate_out = dev.stream.alloc_zeros::<bf16>(rows * cols).unwrap();
        ops::residual_add_scaled(
            &dev,
            DevPtr::of(&separate_x),
            DevPtr::of(&yd),
            DevPtr::of(&gd),
            rows,
            cols,
        )
        .unwrap();
        ops::layer_norm(
            &dev,
            DevPtr::of(&separate_x),
            rows,
            cols,
            wd.as_ref().map(DevPtr::of),
            bd.as_ref().map(DevPtr::of),
            eps,
            LnOut::Bf16(DevPtr::of(&separate_out)),
        )
        .unwrap();

        let fused_x = up(&dev, &resid);
        let fused_out = dev.stream.alloc_zeros::<bf16>(rows * cols).unwrap();
        // The updated rows also go to the second half of [rows][2 * cols] (a tap's layout).
        let tap = dev.stream.alloc_zeros::<f32>(rows * 2 * cols).unwrap();
        let copy = RowCopy {
            dst: DevPtr::of(&tap)
                .slice(cols, rows * 2 * cols - cols)
                .unwrap(),
            stride: 2 * cols,
        };
        ops::residual_layer_norm(
            &dev,
            DevPtr::of(&fused_x),
            DevPtr::of(&yd),
            DevPtr::of(&gd),
            rows,
            cols,
            wd.as_ref().map(DevPtr::of),
            bd.as_ref().map(DevPtr::of),
            eps,
            DevPtr::of(&fused_out),
            Some(copy),
        )
        .unwrap();
        let what = format!("residual_layer_norm {rows}x{cols} affine={affine}");
        let updated = down(&dev, &fused_x);
        assert_eq!(updated, down(&dev, &separate_x), "{what}: residual");
        let tap = down(&dev, &tap);
        for r in 0..rows {
            let row = &tap[r * 2 * cols..(r + 1) * 2 * cols];
            assert!(
                row[..cols].iter().all(|&v| v == 0.0),
                "{what}: row {r} first half"
            );
            assert_eq!(
                &row[cols..],
                &updated[r * cols..(r + 1) * cols],
                "{what}: row {r} copy"
            );
        }
        let (a, b) = (down(&dev, &fused_out), down(&dev, &separate_out));
        assert!(a.iter().any(|v| v.to_f32() != 0.0), "{what}: no output");
        assert!(
            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{what}: the fused norm differs from the two kernels"
        );
    }
}

#[test]
fn gelu_erf_matches_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(3);
    // The MLP hidden layer (4-wide kernels), then odd sizes (scalar kernels).
    for (rows, cols) in [(TOKENS_PER_FRAME, 4 * C), (7, 1001)] {
        let x = random_bf16(&mut rng, rows * cols, -6.0, 6.0);
        let mut want = to_f32(&x);
        gelu_in_place(&mut want);
        let xd = up(&dev, &x);
        ops::gelu_erf_inplace(&dev, DevPtr::of(&xd), rows * cols).unwrap();
        check(
            &format!("gelu_erf_inplace {rows}x{cols}"),
            &down_bf16(&dev, &xd),
            &want,
            BF16_TOL,
        );

        let bias = random_bf16(&mut rng, cols, -1.0, 1.0);
        let mut want: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| v.to_f32() + bias[i % cols].to_f32())
            .collect();
        gelu_in_place(&mut want);
        let xd = up(&dev, &x);
        let bd = up(&dev, &bias);
        ops::add_bias_gelu_erf(&dev, DevPtr::of(&xd), DevPtr::of(&bd), rows, cols).unwrap();
        check(
            &format!("add_bias_gelu_erf {rows}x{cols}"),
            &down_bf16(&dev, &xd),
            &want,
            BF16_TOL,
        );
    }
}

/// q, k, v of a `[n][3][heads][64]` projection, as `TransformerBlock::qkv` splits it.
fn split(qkv: &[f32], n: usize, c: usize) -> [Vec<f32>; 3] {
    let mut out = [vec![0f32; n * c], vec![0f32; n * c], vec![0f32; n * c]];
    for t in 0..n {
        for (j, o) in out.iter_mut().enumerate() {
            o[t * c..(t + 1) * c].copy_from_slice(&qkv[t * 3 * c + j * c..][..c]);
        }
    }
    out
}

struct QkvCase<'a> {
    name: &'a str,
    frames: usize,
    norm: bool,
    /// 0 none, 1 2D, 2 3D.
    rope: u8,
    /// The 3D RoPE frame index of each frame (as many as `frames`).
    frame_index: &'a [u32],
    /// The kernel takes a token's heads four to a warp: 16 fills every group, 6 leaves a
    /// group of two.
    heads: usize,
}

fn run_qkv_case(dev: &CudaDevice, tables: &RopeTables, case: &QkvCase, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = case.frames * TOKENS_PER_FRAME;
    let (heads, c) = (case.heads, case.heads * D);
    let qkv = random_bf16(&mut rng, n * 3 * c, -3.0, 3.0);
    let [mut q, mut k, v] = split(&to_f32(&qkv), n, c);
    let norms: Vec<Vec<f32>> = (0..4)
        .map(|i| {
            if i % 2 == 0 {
                random(&mut rng, D, 0.5, 1.5)
            } else {
                random(&mut rng, D, -0.3, 0.3)
            }
        })
        .collect();
    let eps = 1e-5;
    if case.norm {
        for (x, (w, b)) in [
            (&mut q, (&norms[0], &norms[1])),
            (&mut k, (&norms[2], &norms[3])),
        ] {
            LayerNorm {
                weight: Some(w.clone()),
                bias: Some(b.clone()),
                dim: D,
                eps,
            }
            .forward_in_place(x);
        }
    }
    match case.rope {
        1 => {
            let mut pos = vec![(0u32, 0u32); SPECIAL_TOKENS];
            for r in 0..GRID_H {
                for c in 0..GRID_W {
                    pos.push((r as u32 + 1, c as u32 + 1));
                }
            }
            let all: Vec<(u32, u32)> = (0..case.frames).flat_map(|_| pos.clone()).collect();
            apply_rope_2d(&mut q, &all, heads, D);
            apply_rope_2d(&mut k, &all, heads, D);
        }
        2 => {
            let mut pos = Vec::with_capacity(n);
            for s in 0..case.frames {
                let f = case.frame_index[s] as u64;
                for j in 0..SPECIAL_TOKENS as u64 {
                    pos.push((f, j, j));
                }
                for r in 0..GRID_H as u64 {
                    for c in 0..GRID_W as u64 {
                        pos.push((f, 6 + r, 6 + c));
                    }
                }
            }
            let table = rope_3d_table(&pos);
            apply_rope_3d(&mut q, &table, heads, D);
            apply_rope_3d(&mut k, &table, heads, D);
        }
        _ => {}
    }

    let qkv_d = up(dev, &qkv);
    let norm_d: Vec<CudaSlice<f32>> = norms.iter().map(|x| up(dev, x)).collect();
    let index_d = up(dev, case.frame_index);
    let outs: Vec<CudaSlice<bf16>> = (0..3)
        .map(|_| dev.stream.alloc_zeros::<bf16>(n * c).unwrap())
        .collect();
    let norm = case.norm.then(|| QkNorm {
        q_weight: DevPtr::of(&norm_d[0]),
        q_bias: DevPtr::of(&norm_d[1]),
        k_weight: DevPtr::of(&norm_d[2]),
        k_bias: DevPtr::of(&norm_d[3]),
        eps,
    });
    let rope = match case.rope {
        1 => Rope::Axial2d {
            tables,
            tokens_per_frame: TOKENS_PER_FRAME,
            grid_w: GRID_W,
        },
        2 => Rope::Video3d {
            tables,
            tokens_per_frame: TOKENS_PER_FRAME,
            grid_w: GRID_W,
            frame_index: DevPtr::of(&index_d),
        },
        _ => Rope::None,
    };
    ops::qkv_split_norm_rope(
        dev,
        DevPtr::of(&qkv_d),
        DevPtr::of(&outs[0]),
        DevPtr::of(&outs[1]),
        DevPtr::of(&outs[2]),
        n,
        heads,
        norm,
        rope,
    )
    .unwrap();
    let (gq, gk, gv) = (
        down_bf16(dev, &outs[0]),
        down_bf16(dev, &outs[1]),
        down_bf16(dev, &outs[2]),
    );
    check(&format!("{} q", case.name), &gq, &q, BF16_TOL);
    check(&format!("{} k", case.name), &gk, &k, BF16_TOL);
    assert_eq!(gv, v, "{}: v must be copied unchanged", case.name);
    if !case.norm && case.rope == 0 {
        assert_eq!(gq, q, "{}: plain split must be exact", case.name);
        assert_eq!(gk, k, "{}: plain split must be exact", case.name);
    }
}

#[test]
fn qkv_split_norm_rope_matches_cpu() {
    let Some(dev) = device() else { return };
    let tables = RopeTables::new(&dev, MAX_FRAMES, GRID_H, GRID_W).unwrap();
    let cases = [
        QkvCase {
            name: "dino split (no norm, no rope)",
            frames: 1,
            norm: false,
            rope: 0,
            frame_index: &[0, 0],
            heads: HEADS,
        },
        QkvCase {
            name: "qk-norm only",
            frames: 1,
            norm: true,
            rope: 0,
            frame_index: &[0, 0],
            heads: HEADS,
        },
        QkvCase {
            name: "frame block (qk-norm + 2D rope, 2 frames)",
            frames: 2,
            norm: true,
            rope: 1,
            frame_index: &[0, 0],
            heads: HEADS,
        },
        QkvCase {
            name: "2D rope without norm",
            frames: 1,
            norm: false,
            rope: 1,
            frame_index: &[0, 0],
            heads: HEADS,
        },
        QkvCase {
            name: "global block (qk-norm + 3D rope, 2 frames from frame 37)",
            frames: 2,
            norm: true,
            rope: 2,
            frame_index: &[37, 38],
            heads: HEADS,
        },
        QkvCase {
            name: "global block at the table's end (frames 1022, 1023)",
            frames: 2,
            norm: true,
            rope: 2,
            frame_index: &[1022, 1023],
            heads: HEADS,
        },
        QkvCase {
            name: "global block, 6 heads (a partial group of heads per warp)",
            frames: 2,
            norm: true,
            rope: 2,
            frame_index: &[5, 6],
            heads: 6,
        },
        QkvCase {
            name: "global block, two frames of one index (a non-keyframe and the next frame)",
            frames: 2,
            norm: true,
            rope: 2,
            frame_index: &[41, 41],
            heads: HEADS,
        },
        QkvCase {
            name: "frame block, 6 heads",
            frames: 1,
            norm: true,
            rope: 1,
            frame_index: &[0, 0],
            heads: 6,
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        run_qkv_case(&dev, &tables, case, 100 + i as u64);
    }
}

#[test]
fn qkv_frames_past_the_rope_table_are_nan() {
    let Some(dev) = device() else { return };
    let tables = RopeTables::new(&dev, MAX_FRAMES, GRID_H, GRID_W).unwrap();
    let n = 2 * TOKENS_PER_FRAME;
    let qkv = dev
        .stream
        .clone_htod(&vec![bf16::from_f32(0.5); n * 3 * C])
        .unwrap();
    let outs: Vec<CudaSlice<bf16>> = (0..3)
        .map(|_| dev.stream.alloc_zeros::<bf16>(n * C).unwrap())
        .collect();
    let base = up(&dev, &[MAX_FRAMES as u32 - 1, MAX_FRAMES as u32]);
    ops::qkv_split_norm_rope(
        &dev,
        DevPtr::of(&qkv),
        DevPtr::of(&outs[0]),
        DevPtr::of(&outs[1]),
        DevPtr::of(&outs[2]),
        n,
        HEADS,
        None,
        Rope::Video3d {
            tables: &tables,
            tokens_per_frame: TOKENS_PER_FRAME,
            grid_w: GRID_W,
            frame_index: DevPtr::of(&base),
        },
    )
    .unwrap();
    let q = down_bf16(&dev, &outs[0]);
    let (first, second) = q.split_at(TOKENS_PER_FRAME * C);
    let finite_first = first.iter().filter(|v| v.is_finite()).count();
    let nan_second = second.iter().filter(|v| v.is_nan()).count();
    println!(
        "frame 1023: {finite_first}/{} finite; frame 1024: {nan_second}/{} NaN",
        first.len(),
        second.len()
    );
    assert_eq!(finite_first, first.len());
    assert_eq!(nan_second, second.len());
    // A grid larger than the tables is refused on the host.
    let err = ops::qkv_split_norm_rope(
        &dev,
        DevPtr::of(&qkv),
        DevPtr::of(&outs[0]),
        DevPtr::of(&outs[1]),
        DevPtr::of(&outs[2]),
        n,
        HEADS,
        None,
        Rope::Axial2d {
            tables: &tables,
            tokens_per_frame: SPECIAL_TOKENS + 2 * 38,
            grid_w: 38,
        },
    );
    assert!(err.is_err(), "grid 2 x 38 exceeds 27 x 37 tables");
}

#[test]
fn patchify_normalized_matches_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(4);
    let (h, w, p) = (378, 518, streamrecon::model::spec::PATCH);
    let image = random(&mut rng, 3 * h * w, 0.0, 1.0);
    // The CPU path: normalise, then flatten each patch as [channel][ky][kx] (DinoBackbone).
    let norm = imagenet_normalize(&image, 1, h * w);
    let (ph, pw) = (h / p, w / p);
    let plen = 3 * p * p;
    let mut want = vec![0f32; ph * pw * plen];
    for r in 0..ph {
        for col in 0..pw {
            let dst = &mut want[(r * pw + col) * plen..][..plen];
            for ch in 0..3 {
                for ky in 0..p {
                    let src = &norm[(ch * h + r * p + ky) * w + col * p..][..p];
                    dst[(ch * p + ky) * p..][..p].copy_from_slice(src);
                }
            }
        }
    }
    let img_d = up(&dev, &image);
    // Rows padded as the engine pads them (588 -> 592); the buffer starts non-zero so the
    // padding is seen to be written.
    let row_len = ops::patch_row_len(p);
    assert_eq!(row_len, 592);
    let out = dev
        .stream
        .clone_htod(&vec![bf16::from_f32(7.0); ph * pw * row_len])
        .unwrap();
    ops::patchify_normalized(&dev, DevPtr::of(&img_d), h, w, DevPtr::of(&out), row_len).unwrap();
    let padded = down(&dev, &out);
    assert!(
        padded
            .chunks_exact(row_len)
            .all(|r| r[plen..].iter().all(|v| *v == bf16::ZERO)),
        "the padding columns must be zero"
    );
    let got: Vec<bf16> = padded
        .chunks_exact(row_len)
        .flat_map(|r| r[..plen].iter().copied())
        .collect();
    // Rows shorter than a patch are refused.
    assert!(
        ops::patchify_normalized(&dev, DevPtr::of(&img_d), h, w, DevPtr::of(&out), plen - 1)
            .is_err()
    );
    // Same f32 math, one rounding: identical to rounding the CPU values.
    let want_bf16: Vec<bf16> = want.iter().map(|&v| bf16::from_f32(v)).collect();
    let mismatches = got.iter().zip(&want_bf16).filter(|(a, b)| a != b).count();
    check(
        "patchify_normalized 378x518",
        &to_f32(&got),
        &want,
        BF16_TOL,
    );
    println!("patchify: {mismatches} values differ from bf16(CPU)");
    assert!(
        mismatches * 1000 <= got.len(),
        "more than 0.1% differ from bf16(CPU)"
    );
}

#[test]
fn dino_assemble_matches_cpu() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(5);
    let np = GRID_H * GRID_W;
    let patch_emb = random_bf16(&mut rng, np * C, -2.0, 2.0);
    let cls = random(&mut rng, C, -1.0, 1.0);
    let regs = random(&mut rng, 4 * C, -1.0, 1.0);
    let pos = random(&mut rng, (1 + np) * C, -0.5, 0.5);
    // [cls + pos0, registers, patches + pos] as DinoBackbone::forward builds it.
    let mut want = Vec::with_capacity((5 + np) * C);
    want.extend((0..C).map(|i| cls[i] + pos[i]));
    want.extend_from_slice(&regs);
    for t in 0..np {
        want.extend((0..C).map(|i| patch_emb[t * C + i].to_f32() + pos[(1 + t) * C + i]));
    }
    let (pe, cl, rg, po) = (
        up(&dev, &patch_emb),
        up(&dev, &cls),
        up(&dev, &regs),
        up(&dev, &pos),
    );
    let out = dev.stream.alloc_zeros::<f32>((5 + np) * C).unwrap();
    ops::dino_assemble(
        &dev,
        DevPtr::of(&pe),
        DevPtr::of(&cl),
        DevPtr::of(&rg),
        DevPtr::of(&po),
        DevPtr::of(&out),
        np,
        C,
    )
    .unwrap();
    let got = down(&dev, &out);
    check("dino_assemble", &got, &want, 0.0);
}

#[test]
fn copies_are_exact() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(6);
    let rows = TOKENS_PER_FRAME;
    let frame_out = random(&mut rng, rows * C, -5.0, 5.0);
    let global_out = random(&mut rng, rows * C, -5.0, 5.0);
    let (fd, gd) = (up(&dev, &frame_out), up(&dev, &global_out));
    let both = dev.stream.alloc_zeros::<f32>(rows * 2 * C).unwrap();
    let bp = DevPtr::of(&both);
    ops::copy_rows(&dev, DevPtr::of(&fd), C, bp, 2 * C, rows, C).unwrap();
    ops::copy_rows(
        &dev,
        DevPtr::of(&gd),
        C,
        bp.slice(C, rows * 2 * C - C).unwrap(),
        2 * C,
        rows,
        C,
    )
    .unwrap();
    let got = down(&dev, &both);
    let mut want = vec![0f32; rows * 2 * C];
    for t in 0..rows {
        want[t * 2 * C..t * 2 * C + C].copy_from_slice(&frame_out[t * C..(t + 1) * C]);
        want[t * 2 * C + C..(t + 1) * 2 * C].copy_from_slice(&global_out[t * C..(t + 1) * C]);
    }
    println!("copy_rows: {} values", got.len());
    assert_eq!(got, want, "cat(frame_out, global_out)");

    let mut src = random(&mut rng, rows * C, -100.0, 100.0);
    src[0] = 0.0;
    src[1] = -0.0;
    src[2] = 1.0e-40; // subnormal
    src[3] = 3.0e38; // near the top of the bf16 range
    let sd = up(&dev, &src);
    let dst = dev.stream.alloc_zeros::<bf16>(rows * C).unwrap();
    ops::f32_to_bf16(&dev, DevPtr::of(&sd), DevPtr::of(&dst), rows * C).unwrap();
    let got = down(&dev, &dst);
    let want: Vec<bf16> = src.iter().map(|&v| bf16::from_f32(v)).collect();
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "f32_to_bf16: {differ} of {} differ from half::bf16::from_f32",
        got.len()
    );
    assert_eq!(differ, 0);
}
