//! `streamrecon bench`: timing runs that print JSON and a short table.
//!
//! `bench attention` times one global-attention layer at the shapes of docs/performance.md
//! ([`crate::bench::attention`]); `bench e2e` the whole model ([`crate::bench::e2e`]). Both need
//! a CUDA GPU; without one they say why and fail. `bench viewer` renders the window's 3D view
//! offscreen on any wgpu adapter ([`crate::bench::viewer`], `super::bench_viewer`).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use crate::attention::AttentionLayout;
use crate::backend::cuda::AttentionKernel;
use crate::bench::attention::{AttentionConfig, AttentionProgress, AttentionReport, run_attention};
use crate::bench::cases::parse_cases;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchWhat {
    /// One global-attention layer, paged vs dense, at the performance.md shapes.
    Attention,
    /// The whole model on the GPU, frame by frame (random weights, synthetic images).
    E2e,
    /// The 3D view offscreen on a headless wgpu adapter: sprites and the compute rasteriser.
    Viewer,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to time.
    #[arg(value_enum)]
    pub what: BenchWhat,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Cases as live/seen frame counts, comma separated.
    #[arg(long, default_value = "8/8,24/24,72/72,72/1000,72/10000")]
    pub cases: String,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Untimed repetitions before timing.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Force the number of key splits (default: chosen to fill the GPU in one wave).
    #[arg(long)]
    pub splits: Option<usize>,
    /// Split counts to sweep on the 72/72 case (comma separated; empty for none).
    #[arg(long, default_value = "1,2,3,4")]
    pub sweep_splits: String,
    /// Query rows checked against the host reference per case.
    #[arg(long, default_value_t = 24)]
    pub check_rows: usize,
    /// Attention kernel for the paged and dense rows: auto (ws-m256-bounded on Hopper, else mma),
    /// mma, ws, ws-n192, ws-m256, ws-m256-bounded (a fixed softmax offset where the scores are
    /// bounded: qk-normed layers in e2e, the random data's own bound here). Every other kernel
    /// the GPU has is also timed, paged, in its own column.
    #[arg(long, default_value = "auto")]
    pub kernel: String,
    /// Tokens per page; default exact pages (= patches per frame, 999).
    #[arg(long)]
    pub page_size: Option<usize>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// e2e: random weights of this preset (full or tiny).
    #[arg(long, default_value = "full")]
    pub random_weights: String,
    /// e2e and attention: the model's input size as WIDTHxHEIGHT (multiples of 14); attention
    /// takes its frame's token count from it (518x378: 1005, 518x392: 1042).
    #[arg(long, default_value = "518x378")]
    pub resolution: String,
    /// e2e: streaming frames after the scale frames. viewer: camera positions on the orbit,
    /// each rendered and timed once per case.
    #[arg(long, default_value_t = 200)]
    pub frames: usize,
    /// e2e: attention layout of the global blocks.
    #[arg(long, value_enum, default_value_t = AttentionLayout::Paged)]
    pub attention: AttentionLayout,
    /// e2e: every k-th streaming frame is a keyframe.
    #[arg(long, default_value_t = 1)]
    pub keyframe_interval: usize,
    /// e2e: run every step eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    pub no_graphs: bool,
    /// e2e: frames run eagerly after the timed run to time each stage.
    #[arg(long, default_value_t = 10)]
    pub profile_frames: usize,
    /// e2e: bracket this streaming frame's submission (0-based) with the CUDA profiler's start
    /// and stop: `ncu --profile-from-start off …` then profiles that frame's kernels alone.
    #[arg(long)]
    pub profiler_frame: Option<usize>,
    /// e2e: the kernel of the frame-local attention (DINO and frame blocks); default as --kernel.
    #[arg(long)]
    pub local_kernel: Option<String>,
    /// e2e: take cuBLASLt's first guess for every GEMM shape instead of timing its candidates.
    #[arg(long)]
    pub gemm_heuristic: bool,
    /// e2e: calls queued before the oldest is waited for: 2 as `run` and `view` drive the model
    /// (the next frame's images and DINO overlap this frame's work), 1 one frame at a time (as
    /// the reference's profiler runs).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub in_flight: u8,
    /// e2e: streaming frames a step: 1, or 2 (two frames through the model at once, each
    /// attending to what it would see alone; a frame period more latency for fewer launches).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub frames_per_step: u8,
    /// viewer: the offscreen view's size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1920x1080")]
    pub size: String,
    /// viewer: millions of points stored, comma separated and ascending (each a stage: the
    /// store grows to it, then every path and budget is timed), e.g. 4,20,100.
    #[arg(long, default_value = "4")]
    pub points: String,
    /// viewer: a recorded session's points (a .srec file or a session folder) instead of the
    /// synthetic room; its frames are cycled until the point count is reached.
    #[arg(long, value_name = "DIR")]
    pub session: Option<std::path::PathBuf>,
    /// viewer: render paths, comma separated: sprites, compute, compute32, auto (the window's
    /// choice), all (every path the adapter has).
    #[arg(long, default_value = "auto")]
    pub path: String,
    /// viewer: draw every point (no level-of-detail stride) instead of the default budget.
    #[arg(long)]
    pub every_point: bool,
    /// viewer: budgets to time, comma separated (every, default); overrides --every-point.
    #[arg(long)]
    pub budgets: Option<String>,
    /// viewer: point size in pixels.
    #[arg(long, default_value_t = 2.0)]
    pub point_size: f32,
    /// viewer: the synthetic room's frame size (every pixel a point), WIDTHxHEIGHT.
    #[arg(long, default_value = "640x480")]
    pub room_frame: String,
    /// viewer: skip comparing the compute paths' pictures with the sprites'.
    #[arg(long)]
    pub no_compare: bool,
    /// viewer: write each case's first picture into this folder as PNG.
    #[arg(long, value_name = "DIR")]
    pub save_pictures: Option<std::path::PathBuf>,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Attention => attention(&args),
        BenchWhat::E2e => super::bench_e2e::run(&args),
        BenchWhat::Viewer => super::bench_viewer::run(&args),
    }
}

fn parse_list(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            c.trim()
                .parse()
                .with_context(|| format!("bad number `{c}`"))
        })
        .collect()
}

/// `--kernel`: None for `auto` (the library picks the best the GPU has).
pub(super) fn parse_kernel_choice(name: &str) -> anyhow::Result<Option<AttentionKernel>> {
    match name {
        "auto" => Ok(None),
        name => Ok(Some(parse_kernel_name(name)?)),
    }
}

fn attention_config(args: &BenchArgs) -> anyhow::Result<AttentionConfig> {
    let (width, height) = super::bench_e2e::parse_resolution(&args.resolution)?;
    Ok(AttentionConfig {
        cases: parse_cases(&args.cases)?,
        iters: args.iters,
        warmup: args.warmup,
        splits: args.splits,
        sweep_splits: parse_list(&args.sweep_splits)?,
        check_rows: args.check_rows,
        kernel: parse_kernel_choice(&args.kernel)?,
        page_size: args.page_size,
        width,
        height,
        device: args.device,
    })
}

fn attention(args: &BenchArgs) -> anyhow::Result<()> {
    let cfg = attention_config(args)?;
    let report = run_attention(&cfg, |progress| match progress {
        AttentionProgress::DeviceOpened { info, kernels } => eprintln!(
            "device: {} (sm_{}, {} SMs); kernels: {:?}",
            info.name, info.arch, info.sm_count, kernels
        ),
        AttentionProgress::CaseDone(case) => match serde_json::to_string(case) {
            Ok(line) => eprintln!("{line}"),
            // Only a progress line: the report below still carries the case.
            Err(e) => eprintln!(
                "case {}/{}: cannot show it as JSON: {e}",
                case.live_frames, case.frames_seen
            ),
        },
    })?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.json {
        // Through a temporary file: an interrupted write never leaves half a report.
        crate::record::export::write_file(path, |w| w.write_all(json.as_bytes()))?;
    }
    println!("{json}");
    print_table(&report);
    Ok(())
}

fn print_table(r: &AttentionReport) {
    println!(
        "\nattention, {} (sm_{}), median of {} runs; TFLOP/s = 4*Lq*Lkv*heads*head_dim/t; err = ||out-ref||/||ref||",
        r.device, r.arch, r.iters
    );
    println!(
        "{:>10} {:>5} {:>7} {:>13} {:>3} {:>16} {:>20} {:>19} {:>8} {:>8}  other kernels (paged)",
        "live/seen",
        "Lq",
        "Lkv",
        "kernel",
        "spl",
        "paged ms (TF/s)",
        "dense+concat ms (TF)",
        "dense only ms (TF)",
        "err pg",
        "err dn"
    );
    for c in &r.cases {
        let others: Vec<String> = c
            .paged_by_kernel
            .iter()
            .filter(|t| t.kernel != c.kernel)
            .map(|t| {
                format!(
                    "{:?} {:.3} ({:.0}) err {:.1e}",
                    t.kernel, t.ms, t.tflops, t.rel_err
                )
            })
            .chain(c.log2_queries.iter().map(|t| {
                format!(
                    "{:?} on log2-domain queries (the model's form) {:.3} ({:.0}) err {:.1e}",
                    t.kernel, t.ms, t.tflops, t.rel_err
                )
            }))
            .collect();
        println!(
            "{:>10} {:>5} {:>7} {:>13} {:>3} {:>8.3} ({:>5.0}) {:>12.3} ({:>5.0}) {:>11.3} ({:>5.0}) {:>8.1e} {:>8.1e}  {}",
            format!("{}/{}", c.live_frames, c.frames_seen),
            c.lq,
            c.lkv,
            format!("{:?}", c.kernel),
            c.splits,
            c.paged_ms,
            c.paged_tflops,
            c.dense_concat_ms,
            c.dense_concat_tflops,
            c.dense_attention_only_ms,
            c.dense_attention_only_tflops,
            c.paged_rel_err,
            c.dense_rel_err,
            others.join("; ")
        );
    }
    if !r.sweep_72_72.is_empty() {
        let line: Vec<String> = r
            .sweep_72_72
            .iter()
            .map(|p| {
                format!(
                    "{:?}/{}: {:.3} ({:.0})",
                    p.kernel, p.splits_used, p.paged_ms, p.paged_tflops
                )
            })
            .collect();
        println!(
            "72/72 split sweep (kernel/splits: ms (TF/s)): {}",
            line.join(", ")
        );
    }
}

/// `--kernel` (the attention kernel of every layer): a name from the attention table.
pub(super) fn parse_kernel_name(name: &str) -> anyhow::Result<AttentionKernel> {
    AttentionKernel::from_name(name).with_context(|| {
        let names: Vec<&str> = AttentionKernel::ALL.iter().map(|k| k.name()).collect();
        format!("unknown --kernel `{name}` (auto, {})", names.join(", "))
    })
}
