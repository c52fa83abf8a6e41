//! Preprocessing on the GPU against the host's `preprocess_rgb8`, and decoded frames through the
//! engine's asynchronous calls against host-preprocessed ones. Skips with a printed reason where
//! there is no GPU (CI).
//!
//! Frames: the courthouse sequence (`$STREAMRECON_SEQUENCES/courthouse`, else
//! `../shared/sequences/courthouse`) where present, and frames made here: the synthetic room at
//! 1280×720 (a webcam's size), noise (the worst case for rounding), portrait (the centre crop).

mod common;

use std::path::PathBuf;

use streamrecon::backend::cuda::gemm::Tuning;
use streamrecon::capture::folder::decode_rgb8;
use streamrecon::capture::{CorruptFilePolicy, ImageFolder, SyntheticScene};
use streamrecon::frame::RgbImage;
use streamrecon::gpu_model::engine::{GpuModel, GpuStepOutput, SessionConfig, StepImages};
use streamrecon::gpu_model::preprocess::DevicePreprocess;
use streamrecon::gpu_model::transformer::GeluMode;
use streamrecon::model::ModelConfig;
use streamrecon::model::preprocess::{PreprocessConfig, preprocess_rgb8, target_size};
use streamrecon::model::weights::WeightStore;

fn room(width: u32, height: u32, index: u64) -> RgbImage {
    SyntheticScene {
        width,
        height,
        ..SyntheticScene::default()
    }
    .render(index)
    .image
}

/// Deterministic noise: every pixel independent, so every rounding case turns up.
fn noise(width: u32, height: u32, seed: u64) -> RgbImage {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let data = (0..width as usize * height as usize * 3)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 56) as u8
        })
        .collect();
    RgbImage {
        width,
        height,
        data,
    }
}

fn courthouse() -> Vec<(String, RgbImage)> {
    let dir = std::env::var_os("STREAMRECON_SEQUENCES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/sequences"))
        })
        .join("courthouse");
    match ImageFolder::open(&dir, CorruptFilePolicy::Stop) {
        Ok(folder) => folder
            .files()
            .iter()
            .step_by(6)
            .map(|p| {
                (
                    p.display().to_string(),
                    decode_rgb8(p).expect("courthouse frame decodes"),
                )
            })
            .collect(),
        Err(e) => {
            eprintln!("courthouse frames not here ({e}): only the frames made in the test");
            Vec::new()
        }
    }
}

/// Largest difference in 8-bit levels, and how many values differ at all.
fn level_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f32;
    let mut differ = 0;
    for (&x, &y) in a.iter().zip(b) {
        let d = ((x - y) * 255.0).abs();
        worst = worst.max(d);
        differ += usize::from(x != y);
    }
    (worst, differ)
}

#[test]
fn device_preprocessing_matches_the_host() {
    let Some(dev) = common::gpu_device() else {
        return;
    };
    let cfg = PreprocessConfig::default();
    let mut frames = courthouse();
    frames.push(("room 1280×720".into(), room(1280, 720, 3)));
    frames.push(("noise 1280×720".into(), noise(1280, 720, 1)));
    frames.push(("noise 1920×1080".into(), noise(1920, 1080, 2)));
    frames.push(("portrait noise 720×1280".into(), noise(720, 1280, 3)));
    frames.push(("noise 1000×333".into(), noise(1000, 333, 4)));
    frames.push(("noise 333×250 (upscaled)".into(), noise(333, 250, 5)));
    for (name, frame) in &frames {
        let (w, h) = (frame.width as usize, frame.height as usize);
        let host = preprocess_rgb8(&frame.data, w, h, &cfg).expect("host preprocessing");
        let mut device =
            DevicePreprocess::new(&dev, cfg.clone(), host.height, host.width).expect("device");
        let got = device
            .run_to_host(&dev, &[frame])
            .expect("device preprocessing");
        let (worst, differ) = level_diff(&got, &host.data);
        eprintln!(
            "{name}: {}×{} → {}×{}: largest difference {worst} levels, {differ} of {} values differ",
            w,
            h,
            host.width,
            host.height,
            got.len()
        );
        assert!(worst <= 1.0, "{name}: {worst} levels apart");
    }
}

/// One call of several frames of different sizes that come to the same input (the scale call
/// of a stream whose camera changed mode), and a session reused across sizes.
#[test]
fn a_call_of_mixed_sizes_preprocesses_each_frame() {
    let Some(dev) = common::gpu_device() else {
        return;
    };
    let cfg = PreprocessConfig::default();
    let a = noise(1280, 720, 7);
    let b = room(1920, 1080, 5);
    let c = noise(1280, 720, 8);
    let (w, _, h) = target_size(1280, 720, &cfg).expect("size");
    let mut device = DevicePreprocess::new(&dev, cfg.clone(), h, w).expect("device");
    let got = device
        .run_to_host(&dev, &[&a, &b, &c])
        .expect("device preprocessing");
    let plane = 3 * h * w;
    for (i, f) in [&a, &b, &c].into_iter().enumerate() {
        let host =
            preprocess_rgb8(&f.data, f.width as usize, f.height as usize, &cfg).expect("host");
        let (worst, _) = level_diff(&got[i * plane..(i + 1) * plane], &host.data);
        assert!(worst <= 1.0, "frame {i}: {worst} levels apart");
    }
    // A frame that comes to another size is refused with both sizes named.
    let square = noise(640, 640, 9);
    let err = device
        .run_to_host(&dev, &[&square])
        .expect_err("wrong size");
    assert!(err.to_string().contains("640×640"), "{err}");
}

fn tiny_model() -> Option<(ModelConfig, GpuModel)> {
    let dir = common::gct_tiny_fixtures("kf1/config.json")?;
    let cfg = ModelConfig::from_json_file(&dir.join("kf1/config.json")).expect("config");
    let store = WeightStore::load(&dir.join("weights.safetensors")).expect("weights");
    match GpuModel::load(cfg.clone(), store, 0) {
        Ok(m) => Some((cfg, m)),
        Err(e) => {
            common::skip_without_gpu(e);
            None
        }
    }
}

fn session(
    model: &GpuModel,
    cfg: &ModelConfig,
    h: usize,
    w: usize,
) -> streamrecon::gpu_model::engine::GpuSession {
    let mut sc = SessionConfig::new(h, w);
    sc.window = cfg.window;
    sc.max_frames = 64;
    sc.gelu = GeluMode::Exact;
    sc.point_stride = 1;
    sc.download_maps = true;
    // The heuristic's choice is the same in both sessions: their outputs can be compared bit
    // for bit.
    sc.gemm_tuning = Tuning::Heuristic;
    model.start(sc).expect("session")
}

fn assert_same(label: &str, a: &GpuStepOutput, b: &GpuStepOutput) {
    assert_eq!(a.frames, b.frames, "{label}");
    assert_eq!(a.pose_enc, b.pose_enc, "{label}: poses");
    assert_eq!(a.depth, b.depth, "{label}: depth");
    assert_eq!(a.depth_conf, b.depth_conf, "{label}: confidence");
    assert_eq!(a.model_rgb, b.model_rgb, "{label}: model input");
    for (f, (p, q)) in a.points.iter().zip(&b.points).enumerate() {
        assert_eq!(p.xyz, q.xyz, "{label}: frame {f} points");
        assert_eq!(p.rgb, q.rgb, "{label}: frame {f} colours");
    }
}

/// Decoded 1280×720 frames preprocessed on the device and run with two calls in flight give
/// exactly what host-preprocessed frames run one call at a time give.
#[test]
fn decoded_frames_in_flight_equal_host_preprocessed_steps() {
    if common::gpu_device().is_none() {
        return;
    }
    let Some((cfg, model)) = tiny_model() else {
        return;
    };
    let pre = PreprocessConfig {
        width: cfg.img_size,
        patch: cfg.patch,
    };
    let frames: Vec<RgbImage> = (0..6).map(|i| room(1280, 720, i * 4)).collect();
    let host: Vec<_> = frames
        .iter()
        .map(|f| preprocess_rgb8(&f.data, 1280, 720, &pre).expect("host preprocessing"))
        .collect();
    let (h, w) = (host[0].height, host[0].width);
    let scale = cfg.scale_frames;

    let mut one_at_a_time = session(&model, &cfg, h, w);
    let mut in_flight = session(&model, &cfg, h, w);
    let joined: Vec<f32> = host[..scale]
        .iter()
        .flat_map(|f| f.data.iter().copied())
        .collect();
    let mut want = vec![
        one_at_a_time
            .step(&joined, 0..scale as u64, true)
            .expect("scale call"),
    ];
    for (i, f) in host.iter().enumerate().skip(scale) {
        let key = i % 2 == 0;
        want.push(
            one_at_a_time
                .step(&f.data, i as u64..i as u64 + 1, key)
                .expect("step"),
        );
    }

    let refs: Vec<&RgbImage> = frames.iter().collect();
    let mut got = Vec::new();
    in_flight
        .submit(StepImages::Rgb8(&refs[..scale]), 0..scale as u64, true)
        .expect("scale call submitted");
    for i in scale..frames.len() {
        in_flight
            .submit(
                StepImages::Rgb8(&refs[i..i + 1]),
                i as u64..i as u64 + 1,
                i % 2 == 0,
            )
            .expect("submitted behind the previous call");
        assert_eq!(in_flight.in_flight(), 2);
        // A third call in flight is refused, not queued over the second's outputs.
        assert!(
            in_flight
                .submit(StepImages::Rgb8(&refs[i..i + 1]), 99..100, true)
                .is_err()
        );
        got.push(in_flight.finish().expect("finished"));
    }
    got.push(in_flight.finish().expect("last call finished"));
    assert!(in_flight.finish().is_err(), "nothing left to finish");
    assert_eq!(got.len(), want.len());
    for (k, (g, e)) in got.iter().zip(&want).enumerate() {
        assert_same(&format!("call {k}"), g, e);
        assert!(
            g.timing.preprocess_ms > 0.0,
            "call {k}: preprocessing timed"
        );
    }
    // The host's own 8-bit input is what came back.
    let rgb0 = host[0].to_rgb8();
    assert_eq!(got[0].model_rgb[0], rgb0.data);
    eprintln!(
        "{} calls, two in flight, identical to one at a time; graph used: {}",
        got.len(),
        got.iter().any(|g| g.timing.graph)
    );
}
