//! The DPT head on the GPU against the CPU f32 model on random weights and inputs: each conv
//! building block (3x3 s1/s2, 1x1, k4s4/k2s2 transposed), bilinear resize, LayerNorm and adds;
//! the Hopper implicit-GEMM 3x3 conv against the CPU and the im2col path; the whole head at the
//! gct-tiny configuration and with the released checkpoint's channel widths on a small patch grid
//! and on one large enough for the implicit-GEMM convs; the fused end of the head against the CPU
//! and the general path; and the point compactor against `unproject_to_world` + `filter_points`
//! (same count, same order). Skips with a printed reason where there is no GPU (CI).

mod common;

use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rand_distr::{Distribution, Normal};
use streamrecon::backend::cuda::CudaDevice;
use streamrecon::backend::cuda::arena::DevPtr;
use streamrecon::backend::cuda::conv::{self, Nhwc, UvTable};
use streamrecon::backend::cuda::conv_sm90::ImplicitConv;
use streamrecon::backend::cuda::gemm::{Epilogue, Gemm};
use streamrecon::backend::cuda::output_conv;
use streamrecon::backend::cuda::storage::{Device, DevicePlacement};
use streamrecon::gpu_model::dpt_head::{GpuDptHead, Taps};
use streamrecon::gpu_model::unproject::PointCompactor;
use streamrecon::model::ModelConfig;
use streamrecon::model::dpt_head::{DptHead, add_uv_embedding};
use streamrecon::model::ops::conv::{Conv2d, ConvTransposeUpsample, FeatureMap};
use streamrecon::model::ops::norm::LayerNorm;
use streamrecon::model::ops::resize::bilinear_align_corners;
use streamrecon::model::pose::{decode_pose, unproject_to_world};
use streamrecon::model::spec::{POSE_ENC_LEN, SPECIAL_TOKENS};
use streamrecon::model::storage::{HostPlacement, Loader};
use streamrecon::model::weights::{RawTensor, WeightStore};
use streamrecon::pipeline::frame::{PointFilter, filter_points};

/// bf16 storage, f32 accumulation: one op.
const OP_TOLERANCE: f64 = 1e-2;
/// The whole head (about 30 bf16 roundings deep).
const HEAD_TOLERANCE: f64 = 2.5e-2;

fn device() -> Option<(CudaDevice, Gemm)> {
    let dev = common::gpu_device()?;
    match Gemm::new(&dev) {
        Ok(g) => Some((dev, g)),
        Err(e) => {
            common::skip_without_gpu(e);
            None
        }
    }
}

fn normal(rng: &mut StdRng, n: usize, std: f32) -> Vec<f32> {
    let d = Normal::new(0.0f32, std).expect("valid std");
    (0..n).map(|_| d.sample(rng)).collect()
}

/// `‖got − want‖ / ‖want‖` and the largest absolute difference.
fn errors(got: &[f32], want: &[f32]) -> (f64, f64) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let (mut num, mut den, mut max) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = (g as f64 - w as f64).abs();
        num += d * d;
        den += (w as f64) * (w as f64);
        max = max.max(if d.is_nan() { f64::INFINITY } else { d });
    }
    ((num / den.max(1e-30)).sqrt(), max)
}

fn check(what: &str, got: &[f32], want: &[f32], tol: f64) {
    let (rel, max) = errors(got, want);
    eprintln!(
        "{what}: rel {rel:.3e}, max abs {max:.3e} ({} values)",
        got.len()
    );
    assert!(rel < tol, "{what}: relative error {rel:.3e} >= {tol:.1e}");
}

fn to_hwc(m: &FeatureMap) -> Vec<f32> {
    let (c, plane) = (m.channels, m.plane());
    let mut out = vec![0.0; c * plane];
    for ch in 0..c {
        for p in 0..plane {
            out[p * c + ch] = m.data[ch * plane + p];
        }
    }
    out
}

/// A random map, rounded to bf16 so both sides start from the same values.
fn random_map(rng: &mut StdRng, c: usize, h: usize, w: usize) -> FeatureMap {
    let mut m = FeatureMap::zeros(c, h, w);
    m.data = normal(rng, c * h * w, 1.0)
        .into_iter()
        .map(|v| bf16::from_f32(v).to_f32())
        .collect();
    m
}

fn alloc(dev: &CudaDevice, n: usize) -> cudarc::driver::CudaSlice<bf16> {
    dev.stream.alloc_zeros::<bf16>(n.max(8)).expect("alloc")
}

fn download(dev: &CudaDevice, s: &cudarc::driver::CudaSlice<bf16>, n: usize) -> Vec<f32> {
    let v = dev.stream.clone_dtoh(s).expect("download");
    v[..n].iter().map(|x| x.to_f32()).collect()
}

fn random_conv(
    rng: &mut StdRng,
    cin: usize,
    cout: usize,
    (k, s, p): (usize, usize, usize),
    bias: bool,
) -> Conv2d {
    Conv2d {
        weight: normal(rng, cout * cin * k * k, (1.0 / (cin * k * k) as f32).sqrt()),
        bias: bias.then(|| normal(rng, cout, 0.5)),
        in_channels: cin,
        out_channels: cout,
        kernel: k,
        stride: s,
        padding: p,
    }
}

#[test]
fn conv_blocks_match_cpu() {
    let Some((dev, mut gemm)) = device() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(1);
    let (cin, cout, h, w) = (32, 48, 13, 10);
    for (ksp, bias) in [
        ((3, 1, 1), true),
        ((3, 2, 1), true),
        ((3, 1, 1), false),
        ((1, 1, 0), true),
    ] {
        let c = random_conv(&mut rng, cin, cout, ksp, bias);
        // Two frames' maps back to back: one call must give each frame its own conv.
        let xs = [
            random_map(&mut rng, cin, h, w),
            random_map(&mut rng, cin, h, w),
        ];
        let dc = DevicePlacement::new(&dev).conv2d(&c).expect("upload conv");
        dc.check().expect("a conv the kernels implement");
        let both: Vec<f32> = xs.iter().flat_map(to_hwc).collect();
        let xd = conv::upload_bf16(&dev, &both).expect("upload");
        for relu in [false, true] {
            if relu && ksp.0 == 1 {
                continue;
            }
            let want: Vec<FeatureMap> = xs
                .iter()
                .map(|x| {
                    let mut xin = x.clone();
                    if relu {
                        xin.data.iter_mut().for_each(|v| *v = v.max(0.0));
                    }
                    c.forward(&xin)
                })
                .collect();
            let one = want[0].data.len();
            // Full column buffers for one and two frames, two output rows (chunks that end at
            // the frames' boundary when the output height is even) and three (a chunk across it).
            for frames in [1, 2] {
                for cols_len in [
                    frames * dc.cols_for(h, w),
                    2 * dc.cols_per_row(w),
                    3 * dc.cols_per_row(w),
                ] {
                    let cols = alloc(&dev, cols_len);
                    let y = alloc(&dev, frames * one);
                    let d = dc
                        .forward(
                            &dev,
                            &mut gemm,
                            DevPtr::of(&xd),
                            frames,
                            (h, w),
                            relu,
                            DevPtr::of(&cols).slice(0, cols_len.max(1)).expect("slice"),
                            DevPtr::of(&y),
                        )
                        .expect("conv forward");
                    assert_eq!((d.h, d.w, d.c), (want[0].height, want[0].width, cout));
                    let got = download(&dev, &y, frames * one);
                    for f in 0..frames {
                        check(
                            &format!(
                                "conv k{} s{} bias {bias} relu {relu} cols {cols_len} frame \
                                 {f} of {frames}",
                                ksp.0, ksp.1
                            ),
                            &got[f * one..(f + 1) * one],
                            &to_hwc(&want[f]),
                            OP_TOLERANCE,
                        );
                    }
                }
            }
        }
    }
}

/// The Hopper implicit-GEMM 3x3 conv, both tile widths, against the CPU on maps of any size:
/// two frames of an odd size (a partial last pixel tile, windows at every border, tiles that
/// cross the frames' boundary), strides 1 and 2, a rectified input or not, with and without a
/// bias, two 64-channel slices a tap.
#[test]
fn implicit_conv_matches_cpu() {
    let Some((dev, _gemm)) = device() else {
        return;
    };
    if dev.info.arch != 90 {
        eprintln!("skipping: the implicit-GEMM conv is built for Hopper (sm_90a) alone");
        return;
    }
    let mut rng = StdRng::seed_from_u64(5);
    let (cin, h, w) = (128, 13, 10);
    for (cout, stride, bias) in [(256, 1, true), (128, 2, true), (256, 2, false)] {
        let c = random_conv(&mut rng, cin, cout, (3, stride, 1), bias);
        let xs = [
            random_map(&mut rng, cin, h, w),
            random_map(&mut rng, cin, h, w),
        ];
        let dc = DevicePlacement::new(&dev).conv2d(&c).expect("upload conv");
        let both: Vec<f32> = xs.iter().flat_map(to_hwc).collect();
        let xd = conv::upload_bf16(&dev, &both).expect("upload");
        for relu in [false, true] {
            let want: Vec<Vec<f32>> = xs
                .iter()
                .map(|x| {
                    let mut xin = x.clone();
                    if relu {
                        xin.data.iter_mut().for_each(|v| *v = v.max(0.0));
                    }
                    to_hwc(&c.forward(&xin))
                })
                .collect();
            let one = want[0].len();
            for tile_channels in [256, 128] {
                let implicit = ImplicitConv { tile_channels };
                if !implicit.implements(&dc, dev.info.arch) {
                    continue;
                }
                for frames in [1, 2] {
                    let y = alloc(&dev, frames * one);
                    let d = implicit
                        .forward(
                            &dev,
                            &dc,
                            DevPtr::of(&xd),
                            frames,
                            Nhwc::new(h, w, cin),
                            relu,
                            DevPtr::of(&y),
                        )
                        .expect("implicit conv");
                    assert_eq!(d.c, cout);
                    let got = download(&dev, &y, frames * one);
                    for f in 0..frames {
                        check(
                            &format!(
                                "implicit conv {cin}->{cout} s{stride} bias {bias} relu {relu} \
                                 tile {tile_channels} frame {f} of {frames}"
                            ),
                            &got[f * one..(f + 1) * one],
                            &want[f],
                            OP_TOLERANCE,
                        );
                    }
                }
            }
        }
    }
}

/// A level-0 residual unit's conv at 518x378 (148 x 108 pixels, 256 -> 256, rectified input):
/// `DeviceConv::forward` takes the implicit-GEMM kernel there on Hopper, and it agrees with the
/// im2col + cuBLASLt path it replaces.
#[test]
fn implicit_conv_matches_im2col_at_full_size() {
    let Some((dev, mut gemm)) = device() else {
        return;
    };
    if dev.info.arch != 90 {
        eprintln!("skipping: the implicit-GEMM conv is built for Hopper (sm_90a) alone");
        return;
    }
    let mut rng = StdRng::seed_from_u64(6);
    let (cin, cout, h, w) = (256, 256, 108, 148);
    let c = random_conv(&mut rng, cin, cout, (3, 1, 1), true);
    let dc = DevicePlacement::new(&dev).conv2d(&c).expect("upload conv");
    let x = random_map(&mut rng, cin, h, w);
    let xd = conv::upload_bf16(&dev, &to_hwc(&x)).expect("upload");
    let inp = Nhwc::new(h, w, cin);
    let out = dc.out_dims(h, w);
    assert_eq!(
        ImplicitConv::plan(&dc, &dev.info, 1, out),
        Some(ImplicitConv { tile_channels: 256 }),
        "the implicit kernel should take a level-0 conv on {} SMs",
        dev.info.sm_count
    );
    let n = out.len();
    // The path forward takes now (no columns needed) ...
    let y = alloc(&dev, n);
    let empty = alloc(&dev, 8);
    dc.forward(
        &dev,
        &mut gemm,
        DevPtr::of(&xd),
        1,
        (h, w),
        true,
        DevPtr::of(&empty),
        DevPtr::of(&y),
    )
    .expect("conv forward");
    // ... against im2col + the GEMM, as forward ran it before.
    let kk = 9 * cin;
    let cols = alloc(&dev, out.pixels() * kk);
    let y_ref = alloc(&dev, n);
    conv::im2col3x3(
        &dev,
        DevPtr::of(&xd),
        inp,
        1,
        1,
        0,
        out.h,
        true,
        DevPtr::of(&cols),
    )
    .expect("im2col");
    let bias = dc.bias.as_ref().map(|b| DevPtr::of(&b.bf16));
    gemm.linear(
        &dev,
        DevPtr::of(&cols),
        DevPtr::of(&dc.weight),
        bias,
        DevPtr::of(&y_ref),
        out.pixels(),
        cout,
        kk,
        Epilogue::Bias,
    )
    .expect("im2col GEMM");
    check(
        "level-0 conv, implicit against im2col + GEMM",
        &download(&dev, &y, n),
        &download(&dev, &y_ref, n),
        OP_TOLERANCE,
    );
}

#[test]
fn conv_transpose_matches_cpu() {
    let Some((dev, mut gemm)) = device() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(2);
    let (cin, cout, h, w) = (16, 24, 5, 7);
    for k in [4, 2] {
        let t = ConvTransposeUpsample {
            weight: normal(&mut rng, cin * cout * k * k, (1.0 / cin as f32).sqrt()),
            bias: normal(&mut rng, cout, 0.5),
            in_channels: cin,
            out_channels: cout,
            kernel: k,
        };
        // Two frames in one call.
        let xs = [
            random_map(&mut rng, cin, h, w),
            random_map(&mut rng, cin, h, w),
        ];
        let want: Vec<Vec<f32>> = xs.iter().map(|x| to_hwc(&t.forward(x))).collect();
        let one = want[0].len();
        let dt = DevicePlacement::new(&dev)
            .conv_transpose(&t)
            .expect("upload");
        let bias = dt.tiled_bias(&dev).expect("tiled bias");
        let both: Vec<f32> = xs.iter().flat_map(to_hwc).collect();
        let xd = conv::upload_bf16(&dev, &both).expect("upload");
        let tmp = alloc(&dev, 2 * dt.tmp_for(h, w));
        let y = alloc(&dev, 2 * one);
        let d = dt
            .forward(
                &dev,
                &mut gemm,
                DevPtr::of(&bias),
                DevPtr::of(&xd),
                2,
                (h, w),
                DevPtr::of(&tmp),
                DevPtr::of(&y),
            )
            .expect("forward");
        assert_eq!((d.h, d.w, d.c), (h * k, w * k, cout));
        let got = download(&dev, &y, 2 * one);
        for (f, want) in want.iter().enumerate() {
            check(
                &format!("conv-transpose k{k}s{k} frame {f} of 2"),
                &got[f * one..(f + 1) * one],
                want,
                OP_TOLERANCE,
            );
        }
    }
}

#[test]
fn bilinear_matches_cpu() {
    let Some((dev, _gemm)) = device() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(3);
    let c = 16;
    for ((ih, iw), (oh, ow)) in [
        ((5, 7), (11, 9)),
        ((7, 5), (20, 28)),
        ((14, 19), (27, 37)),
        ((1, 4), (3, 8)),
        ((6, 6), (6, 6)),
    ] {
        // Two frames in one call, each resized on its own.
        let xs = [
            random_map(&mut rng, c, ih, iw),
            random_map(&mut rng, c, ih, iw),
        ];
        let both: Vec<f32> = xs.iter().flat_map(to_hwc).collect();
        let xd = conv::upload_bf16(&dev, &both).expect("upload");
        let aspect = 1.3;
        let (mut want, mut want_uv) = (Vec::new(), Vec::new());
        for x in &xs {
            let resized = bilinear_align_corners(x, oh, ow);
            want.extend(to_hwc(&resized));
            let mut with_uv = resized.clone();
            add_uv_embedding(&mut with_uv, aspect);
            want_uv.extend(to_hwc(&with_uv));
        }
        let one = oh * ow * c;
        let table = UvTable::new(&dev, Nhwc::new(oh, ow, c), aspect).expect("UV table");
        for with_table in [false, true] {
            for frames in [1, 2] {
                let y = alloc(&dev, frames * one);
                conv::bilinear(
                    &dev,
                    DevPtr::of(&xd),
                    Nhwc::new(ih, iw, c),
                    frames,
                    (oh, ow),
                    with_table.then_some(&table),
                    DevPtr::of(&y),
                )
                .expect("bilinear");
                let got = download(&dev, &y, frames * one);
                let want = if with_table { &want_uv } else { &want };
                for f in 0..frames {
                    check(
                        &format!(
                            "bilinear {ih}x{iw} -> {oh}x{ow} table {with_table} frame {f} of \
                             {frames}"
                        ),
                        &got[f * one..(f + 1) * one],
                        &want[f * one..(f + 1) * one],
                        OP_TOLERANCE,
                    );
                }
            }
        }
        // The UV embedding added in place at the input's size (the taps' path), both frames.
        let x_uv: Vec<f32> = xs
            .iter()
            .flat_map(|x| {
                let mut x_uv = x.clone();
                add_uv_embedding(&mut x_uv, aspect);
                to_hwc(&x_uv)
            })
            .collect();
        let input_table = UvTable::new(&dev, Nhwc::new(ih, iw, c), aspect).expect("UV table");
        conv::add_uv(&dev, DevPtr::of(&xd), 2, &input_table).expect("add uv");
        check(
            &format!("add uv {ih}x{iw}, two frames"),
            &download(&dev, &xd, 2 * ih * iw * c),
            &x_uv,
            OP_TOLERANCE,
        );
        // A table made for another size is refused.
        if (ih, iw) != (oh, ow) {
            let y = alloc(&dev, want.len());
            let wrong = conv::bilinear(
                &dev,
                DevPtr::of(&xd),
                Nhwc::new(ih, iw, c),
                1,
                (oh, ow),
                Some(&input_table),
                DevPtr::of(&y),
            );
            assert!(
                wrong.is_err(),
                "a {ih}x{iw} UV table for a {oh}x{ow} output"
            );
        }
    }
}

#[test]
fn layer_norm_and_adds_match_cpu() {
    let Some((dev, _gemm)) = device() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(4);
    // LayerNorm of rows 6.. of each of two frames of a strided f32 matrix.
    let (dim, stride, rows) = (2048, 2048 + 64, 23);
    let total = SPECIAL_TOKENS + rows;
    let frame_stride = total * stride;
    let x: Vec<f32> = normal(&mut rng, 2 * frame_stride, 2.0)
        .into_iter()
        .map(|v| v + 0.5)
        .collect();
    let ln = LayerNorm {
        weight: Some(normal(&mut rng, dim, 0.2).iter().map(|v| 1.0 + v).collect()),
        bias: Some(normal(&mut rng, dim, 0.2)),
        dim,
        eps: 1e-5,
    };
    let dense: Vec<f32> = (0..2)
        .flat_map(|f| (SPECIAL_TOKENS..total).map(move |r| f * total + r))
        .flat_map(|r| x[r * stride..r * stride + dim].iter().copied())
        .collect();
    let want = ln.forward(&dense);
    let xd = conv::upload_f32(&dev, &x).expect("x");
    let wd = conv::upload_f32(&dev, ln.weight.as_deref().expect("w")).expect("w");
    let bd = conv::upload_f32(&dev, ln.bias.as_deref().expect("b")).expect("b");
    for frames in [1, 2] {
        let y = alloc(&dev, frames * rows * dim);
        conv::layer_norm_rows(
            &dev,
            DevPtr::of(&xd),
            stride,
            SPECIAL_TOKENS,
            rows,
            (frames, frame_stride),
            dim,
            DevPtr::of(&wd),
            DevPtr::of(&bd),
            1e-5,
            DevPtr::of(&y),
        )
        .expect("layer norm");
        check(
            &format!("layer norm rows, {frames} frames"),
            &download(&dev, &y, frames * rows * dim),
            &want[..frames * rows * dim],
            OP_TOLERANCE,
        );
    }
    // Frames closer together than a frame's rows are refused.
    let y = alloc(&dev, 2 * rows * dim);
    let overlapping = conv::layer_norm_rows(
        &dev,
        DevPtr::of(&xd),
        stride,
        SPECIAL_TOKENS,
        rows,
        (2, stride * rows),
        dim,
        DevPtr::of(&wd),
        DevPtr::of(&bd),
        1e-5,
        DevPtr::of(&y),
    );
    assert!(overlapping.is_err(), "overlapping frames accepted");

    // out = a + relu(b) + c, in place on a.
    let n = 8 * 301;
    let round =
        |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect() };
    let a = round(normal(&mut rng, n, 1.0));
    let b = round(normal(&mut rng, n, 1.0));
    let c = round(normal(&mut rng, n, 1.0));
    let (ad, bd, cd) = (
        conv::upload_bf16(&dev, &a).expect("a"),
        conv::upload_bf16(&dev, &b).expect("b"),
        conv::upload_bf16(&dev, &c).expect("c"),
    );
    conv::add(
        &dev,
        DevPtr::of(&ad),
        DevPtr::of(&ad),
        DevPtr::of(&bd),
        Some(DevPtr::of(&cd)),
        n,
        true,
    )
    .expect("add");
    let want: Vec<f32> = (0..n).map(|i| a[i] + b[i].max(0.0) + c[i]).collect();
    check(
        "a + relu(b) + c",
        &download(&dev, &ad, n),
        &want,
        OP_TOLERANCE,
    );
    conv::add(
        &dev,
        DevPtr::of(&bd),
        DevPtr::of(&cd),
        DevPtr::of(&bd),
        None,
        n,
        false,
    )
    .expect("add");
    let want: Vec<f32> = (0..n).map(|i| c[i] + b[i]).collect();
    check("c + b", &download(&dev, &bd, n), &want, OP_TOLERANCE);
}

/// The fused end of the head (3x3 conv to 32 channels, ReLU, 1x1 to 2, exp) against the CPU and
/// against the general path it replaces (im2col + GEMM, then `output_head`), for both widths the
/// kernel has, on maps that leave partial tiles in both directions and on one smaller than a tile.
#[test]
fn fused_output_conv_head_matches_cpu_and_unfused_path() {
    let Some((dev, mut gemm)) = device() else {
        return;
    };
    if dev.info.arch < 80 {
        eprintln!("skipped: sm_{} has no bf16 mma.sync", dev.info.arch);
        return;
    }
    let mut rng = StdRng::seed_from_u64(7);
    // (cin, h, w, frames): a call's frames share one launch.
    for (cin, h, w, frames) in [
        (128, 37, 70, 1),
        (16, 9, 33, 2),
        (128, 3, 20, 2),
        (128, 13, 40, 2),
    ] {
        let c = random_conv(&mut rng, cin, 32, (3, 1, 1), true);
        let xs: Vec<FeatureMap> = (0..frames)
            .map(|_| random_map(&mut rng, cin, h, w))
            .collect();
        let head_w = normal(&mut rng, 2 * 32, 0.05);
        let head_b = vec![0.1f32, -0.2];
        let dc = DevicePlacement::new(&dev).conv2d(&c).expect("upload conv");
        assert!(
            output_conv::fuses(&dc, dev.info.arch),
            "cin {cin} must fuse"
        );

        // CPU: the conv rounded to bf16 as the GPU's conv output is, ReLU, 1x1, exp.
        let plane = h * w;
        let (mut want_depth, mut want_conf) = (Vec::new(), Vec::new());
        for x in &xs {
            let y = c.forward(x);
            for p in 0..plane {
                let (mut s0, mut s1) = (head_b[0], head_b[1]);
                for n in 0..32 {
                    let v = bf16::from_f32(y.data[n * plane + p]).to_f32().max(0.0);
                    s0 += head_w[n] * v;
                    s1 += head_w[32 + n] * v;
                }
                want_depth.push(s0.exp());
                want_conf.push(1.0 + s1.exp());
            }
        }
        let all: Vec<f32> = xs.iter().flat_map(to_hwc).collect();
        let xd = conv::upload_bf16(&dev, &all).expect("upload");
        let plane = frames * plane;
        let hw = conv::upload_f32(&dev, &head_w).expect("1x1 weight");
        let hb = conv::upload_f32(&dev, &head_b).expect("1x1 bias");
        let maps = || {
            (
                dev.stream.alloc_zeros::<f32>(plane).expect("depth"),
                dev.stream.alloc_zeros::<f32>(plane).expect("conf"),
            )
        };
        let (fd, fc) = maps();
        output_conv::output_conv_head(
            &dev,
            &dc,
            DevPtr::of(&xd),
            frames,
            (h, w),
            DevPtr::of(&hw),
            DevPtr::of(&hb),
            DevPtr::of(&fd),
            DevPtr::of(&fc),
        )
        .expect("fused output conv");
        let (ud, uc) = maps();
        let cols = alloc(&dev, frames * dc.cols_for(h, w));
        let head2 = alloc(&dev, plane * 32);
        dc.forward(
            &dev,
            &mut gemm,
            DevPtr::of(&xd),
            frames,
            (h, w),
            false,
            DevPtr::of(&cols),
            DevPtr::of(&head2),
        )
        .expect("conv");
        conv::output_head(
            &dev,
            DevPtr::of(&head2),
            plane,
            32,
            DevPtr::of(&hw),
            DevPtr::of(&hb),
            DevPtr::of(&ud),
            DevPtr::of(&uc),
        )
        .expect("output head");
        let get = |m: &cudarc::driver::CudaSlice<f32>| dev.stream.clone_dtoh(m).expect("download");
        let (fd, fc, ud, uc) = (get(&fd), get(&fc), get(&ud), get(&uc));
        let label = format!("fused output conv cin {cin} {frames} x {h}x{w}");
        check(
            &format!("{label} depth vs cpu"),
            &fd,
            &want_depth,
            OP_TOLERANCE,
        );
        check(
            &format!("{label} conf vs cpu"),
            &fc,
            &want_conf,
            OP_TOLERANCE,
        );
        // The two GPU paths differ only in the order of the conv's f32 sums.
        check(&format!("{label} depth vs unfused"), &fd, &ud, 1e-3);
        check(&format!("{label} conf vs unfused"), &fc, &uc, 1e-3);
    }
}

/// A store with every `depth_head.*` parameter of `cfg`: convs ~ N(0, 1/fan_in), biases
/// ~ N(0, 0.1), the LayerNorm's weight ~ 1 + N(0, 0.1) (non-trivial, unlike `random_store`).
fn random_head_tensors(cfg: &ModelConfig, seed: u64) -> Vec<RawTensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let raw: Vec<RawTensor> = cfg
        .parameter_shapes()
        .into_iter()
        .filter(|(name, _)| name.starts_with("depth_head."))
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data = if name == "depth_head.norm.weight" {
                normal(&mut rng, n, 0.1).iter().map(|v| 1.0 + v).collect()
            } else if name.ends_with(".bias") || shape.len() < 2 {
                normal(&mut rng, n, 0.1)
            } else {
                let fan_in: usize = shape[1..].iter().product();
                normal(&mut rng, n, (1.0 / fan_in as f32).sqrt())
            };
            RawTensor { name, shape, data }
        })
        .collect();
    raw
}

fn random_head(cfg: &ModelConfig, seed: u64) -> DptHead {
    let mut store =
        WeightStore::from_raw("random depth head", random_head_tensors(cfg, seed)).expect("store");
    DptHead::load(&mut Loader::new(&mut store, &mut HostPlacement), cfg).expect("head loads")
}

/// The same head as [`random_head`], loaded onto the device.
fn random_device_head(dev: &CudaDevice, cfg: &ModelConfig, seed: u64) -> DptHead<Device> {
    let mut store =
        WeightStore::from_raw("random depth head", random_head_tensors(cfg, seed)).expect("store");
    let mut place = DevicePlacement::new(dev);
    DptHead::<Device>::load(&mut Loader::new(&mut store, &mut place), cfg)
        .expect("head goes to the device")
}

/// The whole head vs the CPU: on the second of two frames alone (the frame offset), and on both
/// frames in one call.
fn head_case(cfg: &ModelConfig, height: usize, width: usize, seed: u64) {
    // The CPU side first: the random head must load even where the GPU part is skipped.
    let head = random_head(cfg, seed);
    let mut rng = StdRng::seed_from_u64(seed + 1);
    let dim = cfg.head_input_dim();
    let (ph, pw) = (height / cfg.patch, width / cfg.patch);
    let p = SPECIAL_TOKENS + ph * pw;
    let frames = 2;
    // CPU taps: [frames][P][dim]; on the device each row is padded to `stride`.
    let taps: Vec<Vec<f32>> = (0..4)
        .map(|_| {
            normal(&mut rng, frames * p * dim, 1.0)
                .into_iter()
                .map(|v| v + 0.3)
                .collect()
        })
        .collect();
    let raw = head.forward(&taps, frames, height, width);
    let plane = height * width;
    // The CPU's depth and confidence of frame f, activations applied.
    let want = |f: usize| -> (Vec<f32>, Vec<f32>) {
        (
            raw[2 * f * plane..(2 * f + 1) * plane]
                .iter()
                .map(|v| v.exp())
                .collect(),
            raw[(2 * f + 1) * plane..(2 * f + 2) * plane]
                .iter()
                .map(|v| 1.0 + v.exp())
                .collect(),
        )
    };

    let Some((dev, mut gemm)) = device() else {
        return;
    };
    let stride = dim + 32;
    let tap_bufs: Vec<_> = taps
        .iter()
        .map(|t| {
            let mut padded = vec![f32::NAN; frames * p * stride];
            for r in 0..frames * p {
                padded[r * stride..r * stride + dim].copy_from_slice(&t[r * dim..(r + 1) * dim]);
            }
            conv::upload_f32(&dev, &padded).expect("tap")
        })
        .collect();
    // The taps from frame `f0` on.
    let taps_from = |f0: usize| Taps {
        first: std::array::from_fn(|i| {
            let all = DevPtr::of(&tap_bufs[i]);
            all.slice(f0 * p * stride, (frames - f0) * p * stride)
                .expect("frame slice")
        }),
        row_stride: stride,
        frame_stride: p * stride,
    };
    let device_head = random_device_head(&dev, cfg, seed);
    let mut gpu = GpuDptHead::new(&dev, &device_head, height, width, frames).expect("buffers");
    assert_eq!(gpu.tokens_per_frame(), p);
    assert_eq!(gpu.batch(), frames);
    let depth = dev
        .stream
        .alloc_zeros::<f32>(frames * plane)
        .expect("depth");
    let conf = dev.stream.alloc_zeros::<f32>(frames * plane).expect("conf");
    let mut alone = None;
    // The second frame alone (the frame offset), twice (the second run must not depend on what
    // the first left in the scratch buffers), then both frames in one call.
    for (run, (f0, n)) in [(1, 1), (1, 1), (0, 2)].into_iter().enumerate() {
        gpu.forward(
            &dev,
            &mut gemm,
            &device_head,
            n,
            taps_from(f0),
            DevPtr::of(&depth),
            DevPtr::of(&conf),
        )
        .expect("head forward");
        let got_depth = dev.stream.clone_dtoh(&depth).expect("depth");
        let got_conf = dev.stream.clone_dtoh(&conf).expect("conf");
        for i in 0..n {
            let f = f0 + i;
            let (want_depth, want_conf) = want(f);
            let got_depth = &got_depth[i * plane..(i + 1) * plane];
            let got_conf = &got_conf[i * plane..(i + 1) * plane];
            let label = format!("dpt {height}x{width} dim {dim} run {run}, frame {f} of {n}");
            let log_got: Vec<f32> = got_depth.iter().map(|v| v.ln()).collect();
            let (_, log_max) = errors(&log_got, &raw[2 * f * plane..(2 * f + 1) * plane]);
            eprintln!("{label}: log-depth max abs error {log_max:.3e}");
            check(
                &format!("{label} depth"),
                got_depth,
                &want_depth,
                HEAD_TOLERANCE,
            );
            check(
                &format!("{label} conf"),
                got_conf,
                &want_conf,
                HEAD_TOLERANCE,
            );
            if f == 1 {
                match &alone {
                    None => alone = Some(got_depth.to_vec()),
                    // In a call of two, the frame's depth is what it is alone, up to the GEMMs'
                    // order of sums (another M may pick another algorithm).
                    Some(a) => check(&format!("{label} depth vs alone"), got_depth, a, 1e-2),
                }
            }
        }
    }
    // More frames than the buffers were made for are refused.
    let err = gpu
        .forward(
            &dev,
            &mut gemm,
            &device_head,
            frames + 1,
            taps_from(0),
            DevPtr::of(&depth),
            DevPtr::of(&conf),
        )
        .expect_err("too many frames");
    assert!(err.to_string().contains("frames"), "{err}");
}

#[test]
fn dpt_head_tiny_matches_cpu() {
    head_case(&ModelConfig::tiny(), 70, 98, 10);
}

#[test]
fn dpt_head_full_channels_small_grid_matches_cpu() {
    // The released widths (2048 in, 256 features, [256, 512, 1024, 1024]) on 8x10 patches.
    head_case(&ModelConfig::default(), 8 * 14, 10 * 14, 20);
}

#[test]
fn dpt_head_full_channels_implicit_convs_match_cpu() {
    // The released widths on 22x24 patches: level 0 is 88 x 96 pixels, 66 tiles of 128, so on
    // Hopper its layer_rn and residual-unit convs and output_conv1 (176 x 192) take the
    // implicit-GEMM kernel (half a wave of 132 SMs), the coarser levels im2col + cuBLASLt. The
    // CPU head at this size is some 150 GFLOP: not worth spending where no GPU can be compared.
    if device().is_none() {
        return;
    }
    head_case(&ModelConfig::default(), 22 * 14, 24 * 14, 21);
}

struct PointsCase {
    height: usize,
    width: usize,
    stride: u32,
}

#[test]
fn point_compactor_matches_filter_points() {
    let Some((dev, _gemm)) = device() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(5);
    let cases = [
        PointsCase {
            height: 37,
            width: 53,
            stride: 1,
        },
        PointsCase {
            height: 378,
            width: 518,
            stride: 10,
        },
        PointsCase {
            height: 378,
            width: 518,
            stride: 3,
        },
        // More than 1024 tiles: the scan's carry across chunks.
        PointsCase {
            height: 1040,
            width: 1024,
            stride: 7,
        },
    ];
    for case in cases {
        let (h, w) = (case.height, case.width);
        let n = h * w;
        let depth: Vec<f32> = (0..n)
            .map(|i| match i % 997 {
                5 => f32::NAN,
                6 => f32::INFINITY,
                _ => rng.random_range(0.2f32..8.0),
            })
            .collect();
        let conf: Vec<f32> = (0..n)
            .map(|i| {
                if i % 1009 == 3 {
                    f32::NAN
                } else {
                    rng.random_range(1.0f32..3.0)
                }
            })
            .collect();
        let rgb: Vec<u8> = (0..3 * n).map(|_| rng.random()).collect();
        let mut enc = [0.0f32; POSE_ENC_LEN];
        for v in enc.iter_mut().take(7) {
            *v = rng.random_range(-1.5f32..1.5);
        }
        enc[7] = rng.random_range(0.6f32..1.4);
        enc[8] = rng.random_range(0.6f32..1.4);
        let filter = PointFilter {
            min_confidence: 1.5,
            stride: case.stride as usize,
        };
        let cam = decode_pose(&enc, h, w);
        let world = unproject_to_world(&depth, h, w, &cam);
        let want = filter_points(&world, &conf, &rgb, filter);

        let mut compactor = PointCompactor::new(&dev, h, w).expect("compactor");
        let max = compactor.max_points(case.stride);
        let dd = conv::upload_f32(&dev, &depth).expect("depth");
        let cd = conv::upload_f32(&dev, &conf).expect("conf");
        let ed = conv::upload_f32(&dev, &enc).expect("enc");
        let rd = dev.stream.clone_htod(&rgb).expect("rgb");
        let out_xyz = dev.stream.alloc_zeros::<f32>(3 * max).expect("xyz");
        let out_rgb = dev.stream.alloc_zeros::<u8>(3 * max).expect("rgb out");
        let out_conf = dev.stream.alloc_zeros::<f32>(max).expect("conf out");
        let out_count = dev.stream.alloc_zeros::<u32>(1).expect("count");
        compactor
            .run(
                &dev,
                DevPtr::of(&dd),
                DevPtr::of(&cd),
                DevPtr::of(&ed),
                DevPtr::of(&rd),
                filter.min_confidence,
                case.stride,
                DevPtr::of(&out_xyz),
                DevPtr::of(&out_rgb),
                DevPtr::of(&out_conf),
                DevPtr::of(&out_count),
            )
            .expect("compact");
        let count = dev.stream.clone_dtoh(&out_count).expect("count")[0] as usize;
        let xyz = dev.stream.clone_dtoh(&out_xyz).expect("xyz");
        let col = dev.stream.clone_dtoh(&out_rgb).expect("rgb");
        let cf = dev.stream.clone_dtoh(&out_conf).expect("conf");
        let mut worst = 0.0f32;
        for (i, p) in want.xyz.iter().enumerate().take(count) {
            for a in 0..3 {
                let (g, e) = (xyz[3 * i + a], p[a]);
                worst = worst.max((g - e).abs() / e.abs().max(1.0));
            }
        }
        eprintln!(
            "points {h}x{w} stride {}: gpu {count}, cpu {}, worst xyz rel error {worst:.2e}",
            case.stride,
            want.len()
        );
        assert_eq!(count, want.len(), "point count");
        assert!(worst <= 1e-4, "xyz differ by {worst}");
        for i in 0..count {
            assert_eq!(
                [col[3 * i], col[3 * i + 1], col[3 * i + 2]],
                want.rgb[i],
                "colour of point {i}"
            );
            assert_eq!(
                cf[i].to_bits(),
                want.confidence[i].to_bits(),
                "confidence of point {i}"
            );
        }
    }
}
