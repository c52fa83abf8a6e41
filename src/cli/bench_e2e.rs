//! `streamrecon bench e2e`: [`crate::bench::e2e`] (the whole model on the GPU, frame by frame)
//! with its progress on stderr, a short table on stdout and, with `--json`, the whole report.

use std::io::Write as _;

use anyhow::{Context, bail};

use super::bench::{BenchArgs, parse_kernel_choice, parse_kernel_name};
use crate::backend::cuda::gemm::Tuning;
use crate::backend::load::RandomPreset;
use crate::bench::e2e::{E2eConfig, E2eProgress, E2eReport, GROWTH_HALF_SPAN, GemmChoice, run_e2e};

pub(super) fn parse_resolution(s: &str) -> anyhow::Result<(usize, usize)> {
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

/// `--random-weights`: `full` or `tiny`.
fn parse_preset(name: &str) -> anyhow::Result<RandomPreset> {
    match name {
        "full" => Ok(RandomPreset::Full),
        "tiny" => Ok(RandomPreset::Tiny),
        other => bail!("unknown --random-weights preset `{other}` (use full or tiny)"),
    }
}

fn e2e_config(args: &BenchArgs) -> anyhow::Result<E2eConfig> {
    let kernel = parse_kernel_choice(&args.kernel)?;
    let local_kernel = args
        .local_kernel
        .as_deref()
        .map(parse_kernel_name)
        .transpose()?;
    let (width, height) = parse_resolution(&args.resolution)?;
    Ok(E2eConfig {
        preset: parse_preset(&args.random_weights)?,
        width,
        height,
        frames: args.frames,
        attention: args.attention,
        keyframe_interval: args.keyframe_interval,
        graphs: !args.no_graphs,
        kernel,
        local_kernel,
        profile_frames: args.profile_frames,
        profiler_frame: args.profiler_frame,
        gemm_tuning: if args.gemm_heuristic {
            Tuning::Heuristic
        } else {
            Tuning::Measure
        },
        in_flight: usize::from(args.in_flight),
        frames_per_step: usize::from(args.frames_per_step),
        device: args.device,
    })
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let cfg = e2e_config(args)?;
    let report = run_e2e(&cfg, |progress| match progress {
        E2eProgress::BuildingWeights => {
            eprintln!(
                "bench e2e: building random {} weights…",
                args.random_weights
            )
        }
        E2eProgress::Uploading => eprintln!("bench e2e: uploading to GPU {}…", args.device),
        E2eProgress::PhaseOne { frames, ms } => {
            eprintln!("bench e2e: phase 1 ({frames} frames) {ms:.1} ms")
        }
        E2eProgress::Frame { done, of, wall_ms } => {
            eprintln!("bench e2e: frame {done} of {of}: {wall_ms:.2} ms")
        }
    })?;
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        // Through a temporary file: an interrupted write never leaves half a report.
        crate::record::export::write_file(path, |w| w.write_all(json.as_bytes()))?;
    }
    print_table(&report);
    Ok(())
}

fn print_table(r: &E2eReport) {
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    println!(
        "e2e,{} {}x{} on {}, kernel {} (frame-local {}), graphs {}, {} in flight, {} frame(s) a step, {} scale + {} frames, keyframe every {}",
        r.preset,
        r.width,
        r.height,
        r.device,
        r.kernel,
        r.local_kernel,
        r.graphs,
        r.in_flight,
        r.frames_per_step,
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
        "| frame period, median (one result to the next) | {:.2} ms |",
        r.median_period_ms
    );
    println!(
        "| per frame, median (latency / GPU / host submission) | {:.2} / {:.2} / {:.3} ms |",
        r.median_wall_ms, r.median_gpu_ms, r.median_host_ms
    );
    println!(
        "| host submission: plan, page table, launch, copies queued / image upload | {:.3} / {:.3} ms |",
        r.median_host_ms - r.median_image_upload_ms,
        r.median_image_upload_ms
    );
    let parts = &r.median_parts;
    println!(
        "| GPU parts, median: aggregator / between two aggregators / heads / DINO (beside the heads before) | {:.2} / {:.2} / {:.2} / {:.2} ms |",
        parts.aggregator_ms, parts.between_aggregators_ms, parts.heads_ms, parts.dino_ms
    );
    println!("| per frame, p99 (latency) | {:.2} ms |", r.p99_wall_ms);
    println!("| steady FPS | {:.1} |", r.fps_steady);
    for w in &r.windows {
        println!(
            "| mean around {} % (frames {}–{}) period / latency / GPU | {:.2} / {:.2} / {:.2} ms |",
            w.at_percent,
            w.first_frame,
            w.last_frame,
            w.mean_period_ms,
            w.mean_wall_ms,
            w.mean_gpu_ms
        );
    }
    // Only long runs: the 10/50/90 % rows already describe a few hundred frames.
    if r.streaming_frames >= 1_000 {
        for g in &r.growth {
            println!(
                "| mean around streaming frame {} (±{}) period / latency / GPU | {:.2} / {:.2} / {:.2} ms |",
                g.streaming_frame,
                GROWTH_HALF_SPAN,
                g.mean_period_ms,
                g.mean_wall_ms,
                g.mean_gpu_ms
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
        "| device memory: KV {:.2} GiB, arena {:.2} GiB, weights (heads included) {:.2} GiB, camera cache {:.2} GiB | used {} |",
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
}
