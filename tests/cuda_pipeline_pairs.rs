//! Two frames a step on the GPU through the product path: the pipeline over a folder with the
//! CUDA backend, one frame a step against two, must give every frame the same kind, index and
//! place in the order, poses within 1e-2 and depth within a few percent (bf16: a two-frame step
//! runs the same kernels on twice the rows, so a GEMM may round differently), and the same
//! counts. The GPU session behind `FrameModel` must run a pair of each kind as one call of two
//! frames (not its two-call fallback). Skips with a printed reason where there is no GPU (CI).
//!
//! Fixtures: `$STREAMRECON_FIXTURES` (the gct-tiny folder), else `../shared/fixtures/gct-tiny`.
//! Frames: `$STREAMRECON_SEQUENCES/courthouse`, else `../shared/sequences/courthouse`; without
//! it, the synthetic room (unpaced, so a file source).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use streamrecon::attention::AttentionLayout;
use streamrecon::backend::cuda::CudaError;
use streamrecon::capture::{
    CorruptFilePolicy, ImageFolder, Source, SyntheticScene, SyntheticSource,
};
use streamrecon::frame::{FrameResult, RgbImage};
use streamrecon::gpu_model::frame_model::GpuFrameModel;
use streamrecon::model::preprocess::target_size;
use streamrecon::model::weights::WeightStore;
use streamrecon::model::{ModelConfig, ModelError};
use streamrecon::pipeline::{
    CallImages, Control, Delivery, FrameModel, FramesPerStep, KeyframePolicy, KeyframeRule,
    ModelSession, ModelStep, OnBudget, Outputs, PairSubmitted, Pipeline, PipelineConfig,
    PipelineEvent, PipelineSummary, PointFilter, SessionOptions, Submitted,
};

const PATIENCE: Duration = Duration::from_secs(300);
/// Poses: each element within this of one frame a step's, relative to 1 + its size.
const POSE_TOLERANCE: f32 = 1e-2;
/// Depth and confidence: relative L2 error of each frame's map.
const MAP_TOLERANCE: f64 = 3e-2;

/// Whether a GPU is here; says why not.
fn gpu_present() -> bool {
    match streamrecon::backend::probe_cuda() {
        Ok(_) => true,
        Err(why) => {
            common::skip_without_gpu(why);
            false
        }
    }
}

/// The gct-tiny model on GPU 0; None (with the reason printed) without fixtures or a GPU.
fn gpu_model() -> Option<Arc<GpuFrameModel>> {
    if !gpu_present() {
        return None;
    }
    let dir = common::gct_tiny_fixtures("kf1/config.json")?;
    let cfg = ModelConfig::from_json_file(&dir.join("kf1/config.json")).expect("config");
    let store = WeightStore::load(&dir.join("weights.safetensors")).expect("weights");
    match GpuFrameModel::load(cfg, store, 0) {
        Ok(m) => Some(Arc::new(m)),
        Err(ModelError::Gpu(CudaError::Unavailable(why))) => {
            common::skip_without_gpu(why);
            None
        }
        Err(e) => panic!("the GPU model failed to load: {e}"),
    }
}

fn courthouse_dir() -> PathBuf {
    std::env::var_os("STREAMRECON_SEQUENCES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/sequences"))
        })
        .join("courthouse")
}

/// The courthouse folder, else the synthetic room as a file source (unpaced).
fn frames_source() -> Box<dyn Source> {
    let dir = courthouse_dir();
    match ImageFolder::open(&dir, CorruptFilePolicy::Stop) {
        Ok(folder) => Box::new(folder),
        Err(e) => {
            eprintln!(
                "courthouse frames not here ({}: {e}): the synthetic room instead",
                dir.display()
            );
            Box::new(SyntheticSource::new(SyntheticScene {
                width: 320,
                height: 240,
                frames: Some(64),
                ..SyntheticScene::default()
            }))
        }
    }
}

fn config(frames: u64, interval: u64, per_step: FramesPerStep) -> PipelineConfig {
    PipelineConfig {
        max_frames: Some(frames),
        keyframes: Some(KeyframePolicy {
            rule: KeyframeRule::Fixed { interval },
            view_budget: 320,
            on_budget: OnBudget::Freeze,
        }),
        frames_per_step: per_step,
        ..PipelineConfig::default()
    }
}

struct Seen {
    results: Vec<Arc<FrameResult>>,
    summary: PipelineSummary,
}

fn run(model: Arc<dyn FrameModel>, config: PipelineConfig) -> Seen {
    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Lossless, 4);
    let pipeline = Pipeline::start(frames_source(), model, config, outputs).expect("pipeline");
    let control = pipeline.control();
    let mut results = Vec::new();
    let mut summary = None;
    loop {
        match events.recv_timeout(PATIENCE) {
            Ok(PipelineEvent::Frame(r)) => results.push(r),
            Ok(PipelineEvent::InputEnded) => {
                // The pipeline may have stopped already; what it did is in its events.
                control.send(Control::Stop).ok();
            }
            Ok(PipelineEvent::Error { stage, message }) => panic!("{stage}: {message}"),
            Ok(PipelineEvent::Stopped(s)) => summary = Some(*s),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => panic!("no event for {PATIENCE:?}: a hang"),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    pipeline.join();
    Seen {
        results,
        summary: summary.expect("a summary at the end"),
    }
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        num += d * d;
        den += (y as f64) * (y as f64);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Largest element difference of two poses, relative to 1 + the element's size.
fn pose_err(a: &glam::Mat4, b: &glam::Mat4) -> f32 {
    a.to_cols_array()
        .iter()
        .zip(b.to_cols_array())
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

fn points_agree(a: usize, b: usize) -> bool {
    // Points near the confidence threshold may fall either side in bf16.
    (a as f64 - b as f64).abs() <= (b as f64 * 0.05).max(3.0)
}

#[test]
fn gpu_pipeline_pairs_give_the_single_frame_results() {
    let Some(model) = gpu_model() else { return };
    // 2 scale frames, then pairs; odd counts leave the last frame to run alone. Window 3: the
    // window fills and evicts inside pairs. Interval 3 makes (K, N), (N, K) and (N, N) pairs.
    for (frames, interval) in [(13, 1), (14, 2), (15, 3)] {
        let label = format!("{frames} frames, keyframe interval {interval}");
        let single = run(model.clone(), config(frames, interval, FramesPerStep::One));
        let paired = run(model.clone(), config(frames, interval, FramesPerStep::Two));
        let order = |s: &Seen| {
            s.results
                .iter()
                .map(|r| (r.frame, r.frame_type))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(&paired),
            order(&single),
            "{label}: frames, kinds, order"
        );
        assert_eq!(single.results.len() as u64, frames, "{label}");
        let mut worst = (0.0f32, 0.0f64);
        for (a, b) in single.results.iter().zip(&paired.results) {
            let at = format!("{label}, frame {}", a.frame);
            let e_pose = pose_err(&b.world_from_camera, &a.world_from_camera);
            let e_depth = rel_err(&b.depth, &a.depth);
            let e_conf = rel_err(&b.confidence, &a.confidence);
            let (n_a, n_b) = (a.points.xyz.len(), b.points.xyz.len());
            eprintln!(
                "{at} ({:?}): pose {e_pose:.2e} depth {e_depth:.2e} conf {e_conf:.2e}; points {n_b} / {n_a}",
                a.frame_type
            );
            assert!(
                e_pose <= POSE_TOLERANCE,
                "{at}: pose differs by {e_pose:.3e}"
            );
            assert!(
                e_depth <= MAP_TOLERANCE,
                "{at}: depth differs by {e_depth:.3e}"
            );
            assert!(
                e_conf <= MAP_TOLERANCE,
                "{at}: confidence differs by {e_conf:.3e}"
            );
            assert!(
                points_agree(n_b, n_a),
                "{at}: {n_b} points in pairs, {n_a} alone"
            );
            assert_eq!(b.image, a.image, "{at}: the model input");
            worst = (worst.0.max(e_pose), worst.1.max(e_depth).max(e_conf));
        }
        let counts = |s: &PipelineSummary| {
            (
                s.frames_captured,
                s.frames_processed,
                s.frames_skipped,
                s.scale_frames,
                s.keyframes,
                s.non_keyframes,
                s.sessions,
                s.committed_frames_at_end,
            )
        };
        assert_eq!(counts(&paired.summary), counts(&single.summary), "{label}");
        assert!(
            paired.summary.errors.is_empty(),
            "{:?}",
            paired.summary.errors
        );
        eprintln!(
            "{label}: worst pose {:.2e}, worst map {:.2e}",
            worst.0, worst.1
        );
    }
}

/// Decoded frames from the source, at most `n`.
fn decoded_frames(n: usize) -> Vec<RgbImage> {
    let mut source = frames_source();
    let mut frames = Vec::new();
    while frames.len() < n {
        match source.next_frame().expect("a frame") {
            Some(f) => frames.push(f.image),
            None => break,
        }
    }
    assert_eq!(frames.len(), n, "the source has {} frames", frames.len());
    frames
}

fn finish_queued(session: &mut dyn ModelSession, submitted: Submitted) -> ModelStep {
    match submitted {
        Submitted::Queued => session.finish().expect("finished"),
        Submitted::Done(step) => *step,
    }
}

/// The session behind `FrameModel` runs pairs of every kind as one call of two frames (the
/// engine's two-frame step, with the graphs its pair warm-up captured), each frame as it comes
/// one frame a step.
#[test]
fn gpu_session_runs_each_kind_of_pair_as_one_call() {
    let Some(model) = gpu_model() else { return };
    let (k, n) = (true, false);
    let pairs = [
        [k, k],
        [k, n],
        [n, k],
        [n, n],
        [k, n],
        [n, k],
        [k, k],
        [n, n],
    ];
    let images = decoded_frames(2 + 2 * pairs.len());
    let limits = model.limits();
    let (width, _, height) = target_size(
        images[0].width as usize,
        images[0].height as usize,
        &limits.preprocess,
    )
    .expect("a model input size");
    let options = SessionOptions {
        layout: AttentionLayout::Paged,
        window: limits.default_window,
    };
    let open = |pairs: bool| {
        let mut s = if pairs {
            model.start_pair_session(height, width, options)
        } else {
            model.start_session(height, width, options)
        }
        .expect("session");
        s.set_point_filter(PointFilter::default());
        s.warm_up().expect("warm-up");
        let scale: Vec<&RgbImage> = images[..2].iter().collect();
        let submitted = s
            .submit(CallImages::Decoded(&scale), 0..2, true)
            .expect("scale call");
        finish_queued(s.as_mut(), submitted);
        s
    };
    let mut single = open(false);
    let mut paired = open(true);
    for (p, keys) in pairs.iter().enumerate() {
        let f = 2 + 2 * p;
        let ids = [f as u64, f as u64 + 1];
        let alone: Vec<ModelStep> = (0..2)
            .map(|j| {
                let frame = [&images[f + j]];
                let submitted = single
                    .submit(CallImages::Decoded(&frame), ids[j]..ids[j] + 1, keys[j])
                    .expect("one-frame call");
                finish_queued(single.as_mut(), submitted)
            })
            .collect();
        let two = [&images[f], &images[f + 1]];
        let together = match paired.submit_pair(CallImages::Decoded(&two), ids, *keys) {
            PairSubmitted::Together(call) => {
                let submitted = call.submitted.expect("the two-frame step");
                finish_queued(paired.as_mut(), submitted)
            }
            PairSubmitted::Apart(_) => panic!("frames {ids:?} {keys:?} fell back to two calls"),
        };
        assert_eq!(together.frames, 2, "frames {ids:?}");
        assert_eq!(together.cameras.len(), 2);
        assert_eq!(together.model_rgb.as_ref().map(Vec::len), Some(2));
        let plane = height * width;
        for j in 0..2 {
            let a = &alone[j];
            let pose_a: Vec<f32> = a.cameras[0]
                .world_from_camera
                .iter()
                .flatten()
                .copied()
                .collect();
            let pose_b: Vec<f32> = together.cameras[j]
                .world_from_camera
                .iter()
                .flatten()
                .copied()
                .collect();
            let e_pose = pose_a
                .iter()
                .zip(&pose_b)
                .map(|(x, y)| (x - y).abs() / (1.0 + x.abs()))
                .fold(0.0, f32::max);
            let e_depth = rel_err(&together.depth[j * plane..(j + 1) * plane], &a.depth);
            eprintln!(
                "frame {} ({}) in a pair against alone: pose {e_pose:.2e} depth {e_depth:.2e}",
                ids[j],
                if keys[j] { "keyframe" } else { "non-keyframe" }
            );
            assert!(
                e_pose <= POSE_TOLERANCE,
                "frame {}: pose {e_pose:.3e}",
                ids[j]
            );
            assert!(
                e_depth <= MAP_TOLERANCE,
                "frame {}: depth {e_depth:.3e}",
                ids[j]
            );
            let points = |s: &ModelStep, i: usize| s.points.as_ref().map_or(0, |p| p[i].xyz.len());
            assert!(
                points_agree(points(&together, j), points(a, 0)),
                "frame {}: points {} in a pair, {} alone",
                ids[j],
                points(&together, j),
                points(a, 0)
            );
        }
        assert_eq!(paired.committed_frames(), single.committed_frames());
    }
}
