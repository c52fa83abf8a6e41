//! `bench e2e`: the whole model on the GPU, frame by frame (random weights, synthetic images,
//! phase 1 then one call per frame): per-frame milliseconds (median, p99, and around 10/50/90 %
//! of the run), phase 1, a per-stage breakdown (from eagerly run, event-timed frames after the
//! timed run), device memory, and the host's share of each frame.
//!
//! Two numbers per frame: its latency (submission to its points on the host) and the frame
//! period (the time between consecutive frames' results), the rate a stream gets. With one call
//! in flight (`in_flight: 1`, how the reference's profiler runs) the two are the same; with two
//! (how `run` and `view` drive the session) the next frame is queued while this one runs, and
//! its images and DINO overlap this frame's aggregator and heads on the GPU.

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;

use super::BenchError;
use crate::attention::AttentionLayout;
use crate::backend::cuda::AttentionKernel;
use crate::backend::cuda::gemm::Tuning;
use crate::backend::load::RandomPreset;
use crate::gpu_model::engine::{
    DeviceMemory, GpuModel, MAX_IN_FLIGHT, STREAMING_CALL_FRAMES, SessionConfig, StepImages,
};
use crate::gpu_model::transformer::GeluMode;

/// What to run, and how.
#[derive(Debug, Clone)]
pub struct E2eConfig {
    /// Sizes of the random weights.
    pub preset: RandomPreset,
    /// Input size; multiples of 14.
    pub width: usize,
    pub height: usize,
    /// Streaming frames after the scale frames.
    pub frames: usize,
    /// Attention layout of the global blocks.
    pub attention: AttentionLayout,
    /// Every k-th streaming frame is a keyframe (0 counts as 1).
    pub keyframe_interval: usize,
    /// Replay CUDA graphs; false runs every step eagerly.
    pub graphs: bool,
    /// Kernel of the global attention; None: the session's default.
    pub kernel: Option<AttentionKernel>,
    /// Kernel of the frame-local attention (DINO and frame blocks); None: as `kernel`.
    pub local_kernel: Option<AttentionKernel>,
    /// Frames run eagerly after the timed run to time each stage.
    pub profile_frames: usize,
    /// The streaming frame (0-based) whose submission is bracketed by the CUDA profiler's
    /// start and stop, so that `ncu --profile-from-start off` profiles exactly its kernels.
    pub profiler_frame: Option<usize>,
    /// How cuBLASLt's algorithm of each GEMM shape is chosen.
    pub gemm_tuning: Tuning,
    /// Calls queued before the oldest is waited for: 1 (one frame at a time) or 2 (as the
    /// product runs).
    pub in_flight: usize,
    /// Streaming frames a step: 1, or 2 (`GpuSession::submit_pair`).
    pub frames_per_step: usize,
    /// GPU ordinal.
    pub device: usize,
}

/// What the bench has got to, for a caller that shows progress (full weights take seconds).
#[derive(Debug, Clone, Copy)]
pub enum E2eProgress {
    /// The GPU answered the probe; the random weights are being built.
    BuildingWeights,
    /// The weights are built and being uploaded.
    Uploading,
    /// Phase 1 (the scale frames in one call) is done.
    PhaseOne { frames: usize, ms: f64 },
    /// Every 1000th streaming frame: `done` of `of` are done, the last took `wall_ms`.
    Frame {
        done: usize,
        of: usize,
        wall_ms: f64,
    },
}

#[derive(Debug, Serialize)]
pub struct FrameTime {
    pub frame: usize,
    pub keyframe: bool,
    /// Latency: from the frame's submission to its outputs on the host.
    pub wall_ms: f64,
    /// From the previous frame's outputs to this frame's (the first frame: its latency).
    pub period_ms: f64,
    pub gpu_ms: f64,
    /// Host time of the submission: plan, page table, image, launch, copies queued.
    pub host_ms: f64,
    pub image_upload_ms: f64,
    /// The GPU's parts of the frame (`StepTiming`): its DINO, its aggregator, its heads, and
    /// the time between the previous frame's aggregator and this one's.
    pub dino_ms: f64,
    pub aggregator_ms: f64,
    pub heads_ms: f64,
    pub between_aggregators_ms: Option<f64>,
    pub graph: bool,
    pub points: usize,
}

#[derive(Debug, Serialize)]
pub struct Window {
    pub at_percent: u32,
    pub first_frame: usize,
    pub last_frame: usize,
    pub mean_wall_ms: f64,
    pub mean_period_ms: f64,
    pub mean_gpu_ms: f64,
}

/// Mean time over the 100 frames around one streaming frame of a long run.
#[derive(Debug, Serialize)]
pub struct Growth {
    pub streaming_frame: usize,
    pub mean_wall_ms: f64,
    pub mean_period_ms: f64,
    pub mean_gpu_ms: f64,
}

/// Medians over the steady frames of where a frame's GPU time goes.
#[derive(Debug, Serialize)]
pub struct FrameParts {
    pub dino_ms: f64,
    pub aggregator_ms: f64,
    pub heads_ms: f64,
    pub between_aggregators_ms: f64,
}

/// Everything `bench e2e` measured (its JSON output).
#[derive(Debug, Serialize)]
pub struct E2eReport {
    pub device: String,
    pub preset: String,
    pub width: usize,
    pub height: usize,
    pub scale_frames: usize,
    pub window: usize,
    pub keyframe_interval: usize,
    pub attention: String,
    pub kernel: String,
    pub local_kernel: String,
    pub graphs: bool,
    pub in_flight: usize,
    pub frames_per_step: usize,
    pub streaming_frames: usize,
    pub setup_s: f64,
    pub phase1_ms: f64,
    /// Latency per frame.
    pub median_wall_ms: f64,
    pub p99_wall_ms: f64,
    /// Time between consecutive frames' results: `fps_steady` is its inverse.
    pub median_period_ms: f64,
    pub median_gpu_ms: f64,
    pub median_host_ms: f64,
    pub median_image_upload_ms: f64,
    /// Medians of the GPU's parts of a steady frame (see [`FrameTime`]).
    pub median_parts: FrameParts,
    pub fps_steady: f64,
    pub windows: Vec<Window>,
    pub growth: Vec<Growth>,
    pub stages_ms: Vec<(String, f64)>,
    pub device_memory: DeviceMemory,
    pub device_memory_used_bytes: Option<usize>,
    pub gemm_tuning: Vec<GemmChoice>,
    pub frames: Vec<FrameTime>,
}

/// One GEMM shape whose cuBLASLt algorithm was chosen by timing.
#[derive(Debug, Serialize)]
pub struct GemmChoice {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub epilogue: String,
    pub candidates: usize,
    pub first_guess_ms: f64,
    pub chosen_ms: f64,
    pub chosen: usize,
}

/// The value at fraction `p` of an ascending list (nearest rank); NaN for an empty list.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Streaming frames at which a long run reports its per-frame time (how it grows).
const GROWTH_MARKS: [usize; 8] = [100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000];
/// Frames averaged on each side of a mark.
pub const GROWTH_HALF_SPAN: usize = 50;

/// Mean latency, period and GPU time around each mark a run of `frames` reaches (streaming frame `k` is
/// `frames[k]`); the last mark is clamped to the run's end so a 10,000-frame run reports it.
fn growth(frames: &[FrameTime]) -> Vec<Growth> {
    GROWTH_MARKS
        .iter()
        .filter(|&&mark| mark <= frames.len() && frames.len() >= 2 * GROWTH_HALF_SPAN)
        .map(|&mark| {
            let hi = (mark + GROWTH_HALF_SPAN).min(frames.len());
            let span = &frames[hi - 2 * GROWTH_HALF_SPAN..hi];
            let n = span.len() as f64;
            Growth {
                streaming_frame: mark,
                mean_wall_ms: span.iter().map(|f| f.wall_ms).sum::<f64>() / n,
                mean_period_ms: span.iter().map(|f| f.period_ms).sum::<f64>() / n,
                mean_gpu_ms: span.iter().map(|f| f.gpu_ms).sum::<f64>() / n,
            }
        })
        .collect()
}

fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// Deterministic noise images in [0, 1] (cost does not depend on the values).
fn synthetic_images(count: usize, height: usize, width: usize) -> Vec<Vec<f32>> {
    (0..count)
        .map(|i| {
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
            (0..3 * height * width)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32
                })
                .collect()
        })
        .collect()
}

/// The preset's name as `--random-weights` spells it (the report's `preset`).
fn preset_name(preset: RandomPreset) -> &'static str {
    match preset {
        RandomPreset::Full => "full",
        RandomPreset::Tiny => "tiny",
    }
}

/// Probes GPU `args.device` (before any weights are built), loads random weights onto it and
/// runs phase 1, the timed streaming frames and the profiled ones; `progress` hears of each
/// slow step.
pub fn run_e2e(
    args: &E2eConfig,
    mut progress: impl FnMut(E2eProgress),
) -> Result<E2eReport, BenchError> {
    let dense = args.attention == AttentionLayout::Dense;
    let (width, height) = (args.width, args.height);
    // Say so before spending seconds and gigabytes on weights a GPU-less machine cannot use.
    crate::backend::cuda::probe(args.device).map_err(BenchError::E2eNeedsGpu)?;
    let mut cfg = args.preset.config();
    let scale = cfg.scale_frames;
    let total = scale + args.frames;
    // Committed frames of the whole run, the profiled frames after it included.
    let committed_max = total + args.profile_frames;
    // As the reference's profiler: a RoPE table long enough for the whole run.
    cfg.max_frame_num = cfg.max_frame_num.max(committed_max + 100);
    let setup = Instant::now();
    progress(E2eProgress::BuildingWeights);
    let store = crate::model::weights::random::random_store(&cfg, 0)?;
    progress(E2eProgress::Uploading);
    let model = GpuModel::load(cfg.clone(), store, args.device).map_err(BenchError::E2eLoad)?;
    let mut sc = SessionConfig::new(height, width);
    sc.window = cfg.window;
    sc.max_frames = committed_max + 1;
    sc.kernel = args.kernel;
    sc.local_kernel = args.local_kernel;
    sc.gelu = GeluMode::Fused;
    sc.graphs = args.graphs;
    sc.download_maps = false;
    sc.dense = dense;
    sc.gemm_tuning = args.gemm_tuning;
    let per_step = args.frames_per_step.clamp(1, STREAMING_CALL_FRAMES);
    sc.pair_steps = per_step == 2;
    let mut session = model.start(sc)?;
    let setup_s = setup.elapsed().as_secs_f64();
    let images = synthetic_images(4, height, width);
    let plane = 3 * height * width;

    let phase1: Vec<f32> = (0..scale)
        .flat_map(|i| images[i % images.len()].iter().copied())
        .collect();
    let out = session
        .step(&phase1, 0..scale as u64, true)
        .map_err(|source| BenchError::Step {
            step: "phase 1".into(),
            source,
        })?;
    let phase1_ms = out.timing.wall_ms;
    progress(E2eProgress::PhaseOne {
        frames: scale,
        ms: phase1_ms,
    });

    let in_flight = args.in_flight.clamp(1, MAX_IN_FLIGHT);
    let mut frames = Vec::with_capacity(args.frames);
    let interval = args.keyframe_interval.max(1);
    // The frames of each call in flight, oldest first.
    let mut queued: VecDeque<Vec<(usize, bool)>> = VecDeque::with_capacity(MAX_IN_FLIGHT);
    let mut last_result = Instant::now();
    let mut collect = |session: &mut crate::gpu_model::engine::GpuSession,
                       queued: &mut VecDeque<Vec<(usize, bool)>>,
                       frames: &mut Vec<FrameTime>|
     -> Result<(), BenchError> {
        let Some(call) = queued.pop_front() else {
            return Ok(());
        };
        let first = call.first().map_or(0, |&(i, _)| i);
        let out = session.finish().map_err(|source| BenchError::Step {
            step: format!("frame {first}"),
            source,
        })?;
        let now = Instant::now();
        let t = &out.timing;
        let call_period_ms = if frames.is_empty() {
            t.wall_ms
        } else {
            now.duration_since(last_result).as_secs_f64() * 1e3
        };
        last_result = now;
        // A two-frame step's GPU times are shared by its frames: each gets its half, so the
        // per-frame figures compare with one-frame steps'. The latency is the call's.
        let share = call.len() as f64;
        for (j, &(i, keyframe)) in call.iter().enumerate() {
            frames.push(FrameTime {
                frame: i,
                keyframe,
                wall_ms: t.wall_ms,
                period_ms: call_period_ms / share,
                gpu_ms: t.gpu_ms / share,
                host_ms: t.host_ms / share,
                image_upload_ms: t.image_upload_ms / share,
                dino_ms: t.dino_ms / share,
                aggregator_ms: t.aggregator_ms / share,
                heads_ms: t.heads_ms / share,
                between_aggregators_ms: t.between_aggregators_ms.map(|ms| ms / share),
                graph: t.graph,
                points: out.points.get(j).map_or(0, |p| p.xyz.len()),
            });
            if (i - scale + 1).is_multiple_of(1000) {
                progress(E2eProgress::Frame {
                    done: i - scale + 1,
                    of: args.frames,
                    wall_ms: t.wall_ms,
                });
            }
        }
        Ok(())
    };
    // Two consecutive synthetic images, as a two-frame step takes them.
    let pair_images: Vec<Vec<f32>> = (0..images.len())
        .map(|k| {
            [
                images[k].as_slice(),
                images[(k + 1) % images.len()].as_slice(),
            ]
            .concat()
        })
        .collect();
    let mut i = scale;
    while i < total {
        let take = if per_step == 2 && i + 1 < total { 2 } else { 1 };
        let keyframe = |i: usize| (i - scale).is_multiple_of(interval);
        while session.in_flight() >= in_flight {
            collect(&mut session, &mut queued, &mut frames)?;
        }
        let profiled = args
            .profiler_frame
            .is_some_and(|p| (i - scale..i - scale + take).contains(&p));
        let profiler = |start: bool| {
            crate::backend::cuda::profiler_range(start).map_err(|source| BenchError::Step {
                step: format!("the profiler's bracket of frame {i}"),
                source,
            })
        };
        if profiled {
            profiler(true)?;
        }
        let failed = |source| BenchError::Step {
            step: format!("frame {i}"),
            source,
        };
        if take == 2 {
            let kinds = [keyframe(i), keyframe(i + 1)];
            let images = StepImages::Model(&pair_images[i % images.len()]);
            let calls = session
                .submit_pair(images, [i as u64, i as u64 + 1], kinds)
                .map_err(failed)?;
            if calls == 2 {
                queued.push_back(vec![(i, kinds[0])]);
                queued.push_back(vec![(i + 1, kinds[1])]);
            } else {
                queued.push_back(vec![(i, kinds[0]), (i + 1, kinds[1])]);
            }
        } else {
            let img = &images[i % images.len()];
            debug_assert_eq!(img.len(), plane);
            session
                .submit(StepImages::Model(img), i as u64..i as u64 + 1, keyframe(i))
                .map_err(failed)?;
            queued.push_back(vec![(i, keyframe(i))]);
        }
        if profiled {
            profiler(false)?;
        }
        i += take;
    }
    while !queued.is_empty() {
        collect(&mut session, &mut queued, &mut frames)?;
    }

    // Per-stage breakdown: a few more frames run eagerly with events between the stages.
    session.set_mode(false, true);
    let mut stage_samples: Vec<(String, Vec<f64>)> = Vec::new();
    for k in 0..args.profile_frames {
        let i = total + k;
        let img = &images[i % images.len()];
        let out = session
            .step(img, i as u64..i as u64 + 1, true)
            .map_err(|source| BenchError::Step {
                step: format!("profiled frame {i}"),
                source,
            })?;
        for (name, ms) in out.timing.stages {
            match stage_samples.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(ms),
                None => stage_samples.push((name, vec![ms])),
            }
        }
    }
    let stages_ms = stage_samples
        .into_iter()
        .map(|(name, v)| (name, percentile(&sorted(v.into_iter()), 0.5)))
        .collect();

    // Steady state: skip the first frames (graph capture, window filling).
    let steady = &frames[frames.len().min(10)..];
    let wall = sorted(steady.iter().map(|f| f.wall_ms));
    let period = sorted(steady.iter().map(|f| f.period_ms));
    let gpu = sorted(steady.iter().map(|f| f.gpu_ms));
    let host = sorted(steady.iter().map(|f| f.host_ms));
    let image_upload = sorted(steady.iter().map(|f| f.image_upload_ms));
    let median_of = |part: fn(&FrameTime) -> Option<f64>| {
        percentile(&sorted(steady.iter().filter_map(part)), 0.5)
    };
    let median_parts = FrameParts {
        dino_ms: median_of(|f| Some(f.dino_ms)),
        aggregator_ms: median_of(|f| Some(f.aggregator_ms)),
        heads_ms: median_of(|f| Some(f.heads_ms)),
        between_aggregators_ms: median_of(|f| f.between_aggregators_ms),
    };
    let windows = [10u32, 50, 90]
        .into_iter()
        .filter(|_| !frames.is_empty())
        .map(|pct| {
            let centre = (frames.len() - 1) * pct as usize / 100;
            let lo = centre.saturating_sub(30);
            let hi = (centre + 30).min(frames.len() - 1);
            let span = &frames[lo..=hi];
            let n = span.len() as f64;
            Window {
                at_percent: pct,
                first_frame: span[0].frame,
                last_frame: span[span.len() - 1].frame,
                mean_wall_ms: span.iter().map(|f| f.wall_ms).sum::<f64>() / n,
                mean_period_ms: span.iter().map(|f| f.period_ms).sum::<f64>() / n,
                mean_gpu_ms: span.iter().map(|f| f.gpu_ms).sum::<f64>() / n,
            }
        })
        .collect();
    let median_period = percentile(&period, 0.5);
    Ok(E2eReport {
        device: model.device().info.name.clone(),
        preset: preset_name(args.preset).to_owned(),
        width,
        height,
        scale_frames: scale,
        window: cfg.window,
        keyframe_interval: interval,
        attention: args.attention.to_string(),
        kernel: format!("{:?}", session.kernel()),
        local_kernel: format!("{:?}", session.local_kernel()),
        graphs: args.graphs,
        in_flight,
        frames_per_step: per_step,
        streaming_frames: args.frames,
        setup_s,
        phase1_ms,
        median_wall_ms: percentile(&wall, 0.5),
        p99_wall_ms: percentile(&wall, 0.99),
        median_period_ms: median_period,
        median_gpu_ms: percentile(&gpu, 0.5),
        median_host_ms: percentile(&host, 0.5),
        median_image_upload_ms: percentile(&image_upload, 0.5),
        median_parts,
        fps_steady: 1e3 / median_period,
        windows,
        growth: growth(&frames),
        stages_ms,
        device_memory: session.device_memory(),
        device_memory_used_bytes: model.device_memory_used(),
        gemm_tuning: session
            .gemm_tune_records()
            .into_iter()
            .map(|t| GemmChoice {
                m: t.m,
                n: t.n,
                k: t.k,
                epilogue: format!("{:?}", t.epilogue),
                candidates: t.candidates,
                first_guess_ms: t.first_ms,
                chosen_ms: t.chosen_ms,
                chosen: t.chosen,
            })
            .collect(),
        frames,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(n: usize) -> Vec<FrameTime> {
        (0..n)
            .map(|k| FrameTime {
                frame: k + 8,
                keyframe: true,
                wall_ms: k as f64,
                period_ms: k as f64 / 4.0,
                gpu_ms: k as f64 / 2.0,
                host_ms: 0.0,
                image_upload_ms: 0.0,
                dino_ms: 0.0,
                aggregator_ms: 0.0,
                heads_ms: 0.0,
                between_aggregators_ms: None,
                graph: true,
                points: 0,
            })
            .collect()
    }

    #[test]
    fn growth_averages_around_each_mark_the_run_reaches() {
        let g = growth(&run_of(1_000));
        let marks: Vec<usize> = g.iter().map(|g| g.streaming_frame).collect();
        assert_eq!(marks, [100, 200, 500, 1_000]);
        // Frames 450..550 average 499.5; the last mark is clamped to the run: 900..1000.
        assert!((g[2].mean_wall_ms - 499.5).abs() < 1e-9);
        assert!((g[2].mean_gpu_ms - 249.75).abs() < 1e-9);
        assert!((g[2].mean_period_ms - 124.875).abs() < 1e-9);
        assert!((g[3].mean_wall_ms - 949.5).abs() < 1e-9);
        assert!((g[0].mean_wall_ms - 99.5).abs() < 1e-9);
        assert!(growth(&run_of(99)).is_empty());
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v = sorted([5.0, 1.0, 3.0, 2.0, 4.0].into_iter());
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 1.0), 5.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
