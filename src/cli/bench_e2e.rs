//! `streamrecon bench e2e`: the whole model on the GPU, frame by frame, as the reference's
//! profiler measures it (random weights, synthetic images, phase 1 then one call per frame),
//! printing JSON and a short table: per-frame milliseconds (median, p99, and around 10/50/90 % of
//! the run), phase 1, a per-stage breakdown (from eagerly run, event-timed frames after the timed
//! run), device memory, and the host's share of each frame.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::attention::AttentionLayout;
use crate::backend::cuda::AttentionKernel;
use crate::backend::cuda::gemm::Tuning;
use crate::gpu_model::engine::{DeviceMemory, GpuModel, SessionConfig};
use crate::gpu_model::transformer::GeluMode;
use crate::model::ModelConfig;

/// Options of `bench e2e` (flags of `streamrecon bench`).
#[derive(Debug, Clone)]
pub struct E2eArgs {
    pub preset: String,
    pub resolution: String,
    pub frames: usize,
    pub attention: AttentionLayout,
    pub keyframe_interval: usize,
    pub graphs: bool,
    pub kernel: Option<AttentionKernel>,
    pub local_kernel: Option<AttentionKernel>,
    pub profile_frames: usize,
    pub gemm_heuristic: bool,
    pub json: Option<PathBuf>,
    pub device: usize,
}

#[derive(Debug, Serialize)]
struct FrameTime {
    frame: usize,
    keyframe: bool,
    wall_ms: f64,
    gpu_ms: f64,
    host_ms: f64,
    image_upload_ms: f64,
    graph: bool,
    points: usize,
}

#[derive(Debug, Serialize)]
struct Window {
    at_percent: u32,
    first_frame: usize,
    last_frame: usize,
    mean_wall_ms: f64,
    mean_gpu_ms: f64,
}

/// Mean time over the 100 frames around one streaming frame of a long run.
#[derive(Debug, Serialize)]
struct Growth {
    streaming_frame: usize,
    mean_wall_ms: f64,
    mean_gpu_ms: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    device: String,
    preset: String,
    width: usize,
    height: usize,
    scale_frames: usize,
    window: usize,
    keyframe_interval: usize,
    attention: String,
    kernel: String,
    local_kernel: String,
    graphs: bool,
    streaming_frames: usize,
    setup_s: f64,
    phase1_ms: f64,
    median_wall_ms: f64,
    p99_wall_ms: f64,
    median_gpu_ms: f64,
    median_host_ms: f64,
    median_image_upload_ms: f64,
    fps_steady: f64,
    windows: Vec<Window>,
    growth: Vec<Growth>,
    stages_ms: Vec<(String, f64)>,
    device_memory: DeviceMemory,
    device_memory_used_bytes: Option<usize>,
    gemm_tuning: Vec<GemmChoice>,
    frames: Vec<FrameTime>,
}

/// One GEMM shape whose cuBLASLt algorithm was chosen by timing.
#[derive(Debug, Serialize)]
struct GemmChoice {
    m: usize,
    n: usize,
    k: usize,
    epilogue: String,
    candidates: usize,
    first_guess_ms: f64,
    chosen_ms: f64,
    chosen: usize,
}

fn parse_resolution(s: &str) -> anyhow::Result<(usize, usize)> {
    let (w, h) = s
        .split_once('x')
        .with_context(|| format!("--resolution `{s}`: expected WIDTHxHEIGHT, e.g. 518x378"))?;
    let w: usize = w
        .trim()
        .parse()
        .with_context(|| format!("--resolution `{s}`: bad width"))?;
    let h: usize = h
        .trim()
        .parse()
        .with_context(|| format!("--resolution `{s}`: bad height"))?;
    Ok((w, h))
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
const GROWTH_HALF_SPAN: usize = 50;

/// Mean wall and GPU time around each mark a run of `frames` reaches (streaming frame `k` is
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

pub fn run(args: &E2eArgs) -> anyhow::Result<()> {
    let dense = args.attention == AttentionLayout::Dense;
    let (width, height) = parse_resolution(&args.resolution)?;
    // Say so before spending seconds and gigabytes on weights a GPU-less machine cannot use.
    crate::backend::cuda::probe(args.device)
        .map_err(|why| anyhow::anyhow!("bench e2e needs a CUDA GPU: {why}"))?;
    let mut cfg = match args.preset.as_str() {
        "full" => ModelConfig::default(),
        "tiny" => ModelConfig::tiny(),
        other => bail!("unknown --random-weights preset `{other}` (use full or tiny)"),
    };
    let scale = cfg.scale_frames;
    let total = scale + args.frames;
    // Committed frames of the whole run, the profiled frames after it included.
    let committed_max = total + args.profile_frames;
    // As the reference's profiler: a RoPE table long enough for the whole run.
    cfg.max_frame_num = cfg.max_frame_num.max(committed_max + 100);
    let setup = Instant::now();
    eprintln!("bench e2e: building random {} weights…", args.preset);
    let store = crate::model::weights::random::random_store(&cfg, 0)?;
    eprintln!("bench e2e: uploading to GPU {}…", args.device);
    let model =
        GpuModel::load(cfg.clone(), store, args.device).context("bench e2e needs a CUDA GPU")?;
    let mut sc = SessionConfig::new(height, width);
    sc.window = cfg.window;
    sc.max_frames = committed_max + 1;
    sc.kernel = args.kernel;
    sc.local_kernel = args.local_kernel;
    sc.gelu = GeluMode::Fused;
    sc.graphs = args.graphs;
    sc.download_maps = false;
    sc.dense = dense;
    sc.gemm_tuning = if args.gemm_heuristic {
        Tuning::Heuristic
    } else {
        Tuning::Measure
    };
    let mut session = model.start(sc).map_err(|e| anyhow::anyhow!("{e}"))?;
    let setup_s = setup.elapsed().as_secs_f64();
    let images = synthetic_images(4, height, width);
    let plane = 3 * height * width;

    let phase1: Vec<f32> = (0..scale)
        .flat_map(|i| images[i % images.len()].iter().copied())
        .collect();
    let out = session
        .step(&phase1, 0..scale as u64, true)
        .map_err(|e| anyhow::anyhow!("phase 1: {e}"))?;
    let phase1_ms = out.timing.wall_ms;
    eprintln!("bench e2e: phase 1 ({scale} frames) {phase1_ms:.1} ms");

    let mut frames = Vec::with_capacity(args.frames);
    let interval = args.keyframe_interval.max(1);
    for i in scale..total {
        let keyframe = (i - scale).is_multiple_of(interval);
        let img = &images[i % images.len()];
        debug_assert_eq!(img.len(), plane);
        let out = session
            .step(img, i as u64..i as u64 + 1, keyframe)
            .map_err(|e| anyhow::anyhow!("frame {i}: {e}"))?;
        let t = &out.timing;
        frames.push(FrameTime {
            frame: i,
            keyframe,
            wall_ms: t.wall_ms,
            gpu_ms: t.gpu_ms,
            host_ms: t.host_ms,
            image_upload_ms: t.image_upload_ms,
            graph: t.graph,
            points: out.points.iter().map(|p| p.xyz.len()).sum(),
        });
        if (i - scale + 1).is_multiple_of(1000) {
            eprintln!(
                "bench e2e: frame {} of {}: {:.2} ms",
                i - scale + 1,
                args.frames,
                t.wall_ms
            );
        }
    }

    // Per-stage breakdown: a few more frames run eagerly with events between the stages.
    session.set_mode(false, true);
    let mut stage_samples: Vec<(String, Vec<f64>)> = Vec::new();
    for k in 0..args.profile_frames {
        let i = total + k;
        let img = &images[i % images.len()];
        let out = session
            .step(img, i as u64..i as u64 + 1, true)
            .map_err(|e| anyhow::anyhow!("profiled frame {i}: {e}"))?;
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
    let gpu = sorted(steady.iter().map(|f| f.gpu_ms));
    let host = sorted(steady.iter().map(|f| f.host_ms));
    let image_upload = sorted(steady.iter().map(|f| f.image_upload_ms));
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
                mean_gpu_ms: span.iter().map(|f| f.gpu_ms).sum::<f64>() / n,
            }
        })
        .collect();
    let median_wall = percentile(&wall, 0.5);
    let report = Report {
        device: model.device().info.name.clone(),
        preset: args.preset.clone(),
        width,
        height,
        scale_frames: scale,
        window: cfg.window,
        keyframe_interval: interval,
        attention: args.attention.to_string(),
        kernel: format!("{:?}", session.kernel()),
        local_kernel: format!("{:?}", session.local_kernel()),
        graphs: args.graphs,
        streaming_frames: args.frames,
        setup_s,
        phase1_ms,
        median_wall_ms: median_wall,
        p99_wall_ms: percentile(&wall, 0.99),
        median_gpu_ms: percentile(&gpu, 0.5),
        median_host_ms: percentile(&host, 0.5),
        median_image_upload_ms: percentile(&image_upload, 0.5),
        fps_steady: 1e3 / median_wall,
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
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print_table(&report);
    Ok(())
}

fn print_table(r: &Report) {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    println!(
        "e2e,{} {}x{} on {}, kernel {} (frame-local {}), graphs {}, {} scale + {} frames, keyframe every {}",
        r.preset,
        r.width,
        r.height,
        r.device,
        r.kernel,
        r.local_kernel,
        r.graphs,
        r.scale_frames,
        r.streaming_frames,
        r.keyframe_interval
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| phase 1 ({} frames) | {:.1} ms |",
        r.scale_frames, r.phase1_ms
    );
    println!(
        "| per frame, median (wall / GPU / host before launch) | {:.2} / {:.2} / {:.3} ms |",
        r.median_wall_ms, r.median_gpu_ms, r.median_host_ms
    );
    println!(
        "| host before launch: plan + page table / image upload | {:.3} / {:.3} ms |",
        r.median_host_ms - r.median_image_upload_ms,
        r.median_image_upload_ms
    );
    println!("| per frame, p99 (wall) | {:.2} ms |", r.p99_wall_ms);
    println!("| steady FPS | {:.1} |", r.fps_steady);
    for w in &r.windows {
        println!(
            "| mean around {} % (frames {}–{}) wall / GPU | {:.2} / {:.2} ms |",
            w.at_percent, w.first_frame, w.last_frame, w.mean_wall_ms, w.mean_gpu_ms
        );
    }
    // Only long runs: the 10/50/90 % rows already describe a few hundred frames.
    if r.streaming_frames >= 1_000 {
        for g in &r.growth {
            println!(
                "| mean around streaming frame {} (±{}) wall / GPU | {:.2} / {:.2} ms |",
                g.streaming_frame, GROWTH_HALF_SPAN, g.mean_wall_ms, g.mean_gpu_ms
            );
        }
    }
    for (name, ms) in &r.stages_ms {
        println!("| stage {name} (eager, events) | {ms:.2} ms |");
    }
    // The shapes where timing beat the heuristic's first guess by more than a microsecond.
    let gains: Vec<&GemmChoice> = r
        .gemm_tuning
        .iter()
        .filter(|g| g.first_guess_ms - g.chosen_ms > 1e-3)
        .collect();
    if !r.gemm_tuning.is_empty() {
        println!(
            "| GEMM shapes timed / improved | {} / {} |",
            r.gemm_tuning.len(),
            gains.len()
        );
    }
    for g in gains {
        println!(
            "| GEMM {}x{}x{} {}: first guess / chosen (#{} of {}) | {:.4} / {:.4} ms |",
            g.m, g.n, g.k, g.epilogue, g.chosen, g.candidates, g.first_guess_ms, g.chosen_ms
        );
    }
    let m = &r.device_memory;
    println!(
        "| device memory: KV {:.2} GiB, arena {:.2} GiB, aggregator weights {:.2} GiB, camera cache {:.2} GiB | used {} |",
        gib(m.kv_bytes),
        gib(m.arena_bytes),
        gib(m.weight_bytes),
        gib(m.camera_cache_bytes),
        r.device_memory_used_bytes
            .map(|b| format!("{:.2} GiB", gib(b)))
            .unwrap_or_else(|| "?".into())
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolutions_parse_and_bad_ones_name_the_problem() {
        assert_eq!(parse_resolution("518x378").unwrap(), (518, 378));
        for bad in ["518", "x378", "518xabc", "518*378"] {
            let e = parse_resolution(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    fn run_of(n: usize) -> Vec<FrameTime> {
        (0..n)
            .map(|k| FrameTime {
                frame: k + 8,
                keyframe: true,
                wall_ms: k as f64,
                gpu_ms: k as f64 / 2.0,
                host_ms: 0.0,
                image_upload_ms: 0.0,
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
