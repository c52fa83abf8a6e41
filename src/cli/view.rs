//! `streamrecon view` (and `streamrecon` with no arguments): the viewer on an input. The
//! window runs on the main thread; a feed (`viewer::feed`) loads the model, runs the pipeline
//! and records on a thread of its own, so the window opens at once.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, bail};
use clap::Args;

use super::stream_args::{self, CameraArgs, ModelFlags, PointArgs, StreamArgs};
use super::{interrupt, model_source};
use crate::capture::{CorruptFilePolicy, InputSpec, SyntheticPlay};
use crate::pipeline::{FrameModel, PipelineConfig, PointFilter};
use crate::viewer::demo::DemoConfig;
use crate::viewer::feed::{DemoFeed, Feed, LiveFeed, LoadError, LoadedModel, RecordingPlan};
use crate::viewer::{ExitPlan, ViewerOptions};

/// Frames per second of the synthetic room when it stands in for a camera.
const SYNTHETIC_FPS: f64 = 30.0;

#[derive(Debug, Clone, Args)]
pub struct ViewArgs {
    /// Where the model runs: auto (the GPU when CUDA works, else the CPU), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend_choice::BackendArg::Auto)]
    pub backend: super::backend_choice::BackendArg,
    /// `webcam:N`, `webcam:NAME`, `synthetic`, a video file (`clip.mp4`), an image folder, or `demo` (a synthetic room
    /// with a simulated cache and no model). Default: webcam:0 when a camera exists, else the
    /// synthetic room.
    #[arg(long)]
    pub input: Option<String>,
    /// Weights file (safetensors or PyTorch .pt). Default: the released checkpoint from the
    /// Hugging Face cache, downloaded if missing; random weights (with an on-screen notice) if
    /// that fails.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Model config JSON for --weights or --random-weights (default: derived from the weights).
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// Seeded random weights of a preset (`full` or `tiny`): speed checks only, the geometry is
    /// meaningless.
    #[arg(long, value_name = "PRESET")]
    pub random_weights: Option<String>,
    /// The stream's settings at start (the window's controls change them later).
    #[command(flatten)]
    pub stream: StreamArgs,
    #[command(flatten)]
    pub camera: CameraArgs,
    #[command(flatten)]
    pub points: PointArgs,
    /// Save a PNG of the window before exiting (needs --exit-after).
    #[arg(long, value_name = "FILE")]
    pub screenshot: Option<PathBuf>,
    /// Close after this many processed frames (a headless check, e.g. under Xvfb).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub exit_after: Option<u64>,
    /// Frames per second of `--input demo`.
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true)]
    pub demo_fps: f64,
    /// Image size of `--input demo`, `WIDTHxHEIGHT` (every pixel is a point: 640x480 makes
    /// 300 k points a frame, for load tests of the 3D view).
    #[arg(long, default_value = "96x72")]
    pub demo_size: String,
    /// Frames `--input demo` produces before it ends (default: endless).
    #[arg(long, value_name = "N")]
    pub demo_frames: Option<u64>,
    /// Most point sprites the 3D view draws per repaint; above it every n-th point is drawn.
    #[arg(long)]
    pub point_budget: Option<u64>,
    /// Where the "record" toggle writes sessions (`session-YYYYMMDD-HHMMSS.srec`, UTC).
    #[arg(long, value_name = "DIR", default_value = "sessions")]
    pub record_dir: PathBuf,
    /// Start recording to FILE at launch (it must not exist yet).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
}

/// The arguments of a bare `streamrecon` (no subcommand): clap's defaults, not `Default`'s zeros.
impl Default for ViewArgs {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Bare {
            #[command(flatten)]
            view: ViewArgs,
        }
        <Bare as clap::Parser>::parse_from(["streamrecon"]).view
    }
}

pub fn run(args: ViewArgs) -> anyhow::Result<()> {
    if args.screenshot.is_some() && args.exit_after.is_none() {
        bail!("--screenshot needs --exit-after N (the screenshot is taken after N frames)");
    }
    if args.exit_after == Some(0) {
        bail!("--exit-after must be at least 1");
    }
    // Every flag is checked whatever the input, so a mistyped value is never ignored.
    args.camera.check()?;
    args.points.filter()?;
    crate::capture::set_decode_limits(args.camera.decode_limits(false)?);
    // Said now rather than as a notice in a window that then records nothing.
    if let Some(path) = &args.record
        && path.exists()
    {
        bail!(
            "--record {}: the file exists (a recording never overwrites)",
            path.display()
        );
    }
    let (feed, source_label): (Box<dyn Feed>, String) = match args.input.as_deref() {
        Some("demo") => {
            let fps = args.demo_fps;
            if !(0.01..=1000.0).contains(&fps) {
                bail!("--demo-fps must be between 0.01 and 1000 frames per second, got {fps:?}");
            }
            let (width, height) = parse_size(&args.demo_size)?;
            if args.record.is_some() {
                bail!("--record needs a pipeline; the demo stream has nothing to record");
            }
            let demo = DemoFeed {
                fps,
                config: DemoConfig {
                    width,
                    height,
                    ..DemoConfig::default()
                },
                frames: args.demo_frames,
            };
            (
                Box::new(demo),
                "demo: synthetic room, simulated cache (no model)".to_string(),
            )
        }
        input => {
            let spec = match input {
                Some(s) => s.parse::<InputSpec>()?,
                None => stream_args::default_input(),
            };
            // Opened here so a bad input is an error before any window opens.
            let options = args.camera.source_options(
                SyntheticPlay::Live { fps: SYNTHETIC_FPS },
                CorruptFilePolicy::Skip,
            )?;
            let source = stream_args::open_input(&spec, &options)?;
            let config = pipeline_config(&args)?;
            stream_args::check_frames_per_step(&config, source.as_ref())?;
            let label = source.describe();
            let recording = RecordingPlan {
                dir: args.record_dir.clone(),
                at_launch: args.record.clone(),
                config: stream_args::session_config(
                    "streamrecon view",
                    &label,
                    ModelFlags {
                        weights: args.weights.as_deref(),
                        model_config: args.model_config.as_deref(),
                        random_weights: args.random_weights.as_deref(),
                    },
                    &args.stream,
                    point_filter(&args),
                ),
            };
            let model_args = args.clone();
            let live = LiveFeed {
                source,
                config,
                load_model: Box::new(move |status| -> Result<LoadedModel, LoadError> {
                    let (model, notice) = load_model(&model_args, status)?;
                    Ok(LoadedModel { model, notice })
                }),
                recording,
            };
            (Box::new(live), label)
        }
    };
    let live = args.input.as_deref() != Some("demo");
    let options = ViewerOptions {
        source_label,
        notices: Vec::new(),
        exit: ExitPlan {
            exit_after: args.exit_after,
            screenshot: args.screenshot.clone(),
        },
        recording_available: live,
        point_budget: args.point_budget,
        timeline: None,
        close_requested: Some(close_on_interrupt()),
    };
    let fed = crate::viewer::show(feed, options).context("running the viewer")?;
    // A recording in progress gets its index only when the feed has stopped the pipeline.
    if !fed.feed_stopped {
        eprintln!("viewer: the pipeline did not stop in time; a recording may lack its index");
    }
    for line in &fed.feed_lines {
        eprintln!("viewer: {line}");
    }
    let report = fed.report;
    eprintln!(
        "viewer: {} frames processed, {} repaints in {:.1} s ({:.1} FPS mean); at the end \
         {:.2} FPS drawing {} of {} points on the GPU",
        report.frames_processed,
        report.repaints,
        report.seconds,
        report.mean_fps(),
        report.fps_at_end,
        report.sprites_drawn,
        report.points_on_gpu
    );
    for notice in &report.notices {
        eprintln!("viewer: notice: {notice}");
    }
    if let Some(error) = report.error {
        bail!(error);
    }
    if let Some(n) = args.exit_after
        && report.frames_processed < n
    {
        bail!(
            "the input ended after {} of the {n} frames asked for with --exit-after",
            report.frames_processed
        );
    }
    if let Some(path) = &args.screenshot {
        match &report.screenshot {
            Some(saved) => eprintln!("viewer: screenshot saved to {}", saved.display()),
            None => bail!(
                "the window closed before the screenshot {} was taken",
                path.display()
            ),
        }
    }
    Ok(())
}

/// Ctrl-C, SIGTERM or SIGHUP closes the window as its close button does: the pipeline stops
/// and a recording in progress is finished with its index. A second signal quits at once.
fn close_on_interrupt() -> Arc<AtomicBool> {
    let close = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&close);
    interrupt::on_interrupt("the viewer", move |name| {
        eprintln!(
            "\n{name}: closing the window and finishing any recording ({name} again to quit at once)"
        );
        flag.store(true, Ordering::SeqCst);
    });
    close
}

/// The largest `--demo-size` side: every pixel is a point, so 4096×4096 is 16 M a frame.
const MAX_DEMO_SIDE: u32 = 4096;

fn parse_size(s: &str) -> anyhow::Result<(u32, u32)> {
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    match parsed {
        Some((w, h)) if (1..=MAX_DEMO_SIDE).contains(&w) && (1..=MAX_DEMO_SIDE).contains(&h) => {
            Ok((w, h))
        }
        _ => bail!("--demo-size `{s}`: expected WIDTHxHEIGHT, each from 1 to {MAX_DEMO_SIDE}"),
    }
}

fn point_filter(args: &ViewArgs) -> PointFilter {
    PointFilter {
        min_confidence: args.points.conf_threshold,
        stride: args.points.point_stride,
    }
}

fn pipeline_config(args: &ViewArgs) -> anyhow::Result<PipelineConfig> {
    args.stream.pipeline_config(args.points.filter()?)
}

/// The model to run and, for random weights, the notice the viewer must keep on screen.
/// `status` goes to the window's status bar (the download's progress).
fn load_model(
    args: &ViewArgs,
    status: &dyn Fn(String),
) -> anyhow::Result<(Arc<dyn FrameModel>, Option<String>)> {
    let config = model_source::config_file(args.model_config.as_deref())?;
    let random =
        |preset: &str, why: &str| -> anyhow::Result<(Arc<dyn FrameModel>, Option<String>)> {
            let request = model_source::random(preset, config.clone(), args.backend)?;
            let notice = format!(
                "RANDOM WEIGHTS ({preset} model): {why}. The geometry shown is meaningless; \
             pass --weights FILE for a real reconstruction."
            );
            Ok((model_source::load(&request)?, Some(notice)))
        };
    if let Some(preset) = &args.random_weights {
        if args.weights.is_some() {
            bail!("give either --weights or --random-weights, not both");
        }
        return random(preset, "asked for with --random-weights");
    }
    let path = match &args.weights {
        Some(p) if p.as_os_str() != "hf" => p.clone(),
        explicit => match model_source::hub_checkpoint(status) {
            Ok(p) => p,
            // Asked for the hub explicitly: its failure is the answer.
            Err(e) if explicit.is_some() => return Err(e),
            // The default: a window that runs beats no window; the notice says why.
            Err(e) => return random("tiny", &format!("no checkpoint ({e})")),
        },
    };
    let request = model_source::checkpoint(&path, config, args.backend);
    Ok((model_source::load(&request)?, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::AttentionLayout;

    #[test]
    fn bare_defaults_are_clap_defaults() {
        let args = ViewArgs::default();
        assert_eq!(args.stream.attention, AttentionLayout::Paged);
        assert_eq!(args.points.point_stride, 4);
        assert!(args.points.conf_threshold > 1.0);
        assert_eq!(args.demo_size, "96x72");
        assert!(args.input.is_none() && args.exit_after.is_none());
    }

    #[test]
    fn record_refuses_an_existing_file_before_any_window_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let taken = dir.path().join("taken.srec");
        std::fs::write(&taken, b"keep").expect("write");
        let args = ViewArgs {
            record: Some(taken.clone()),
            ..ViewArgs::default()
        };
        let err = run(args).expect_err("refused");
        assert!(err.to_string().contains("exists"), "{err}");
        assert_eq!(std::fs::read(&taken).expect("read"), b"keep");
        assert_eq!(ViewArgs::default().record_dir, PathBuf::from("sessions"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("640x480").ok(), Some((640, 480)));
        assert!(parse_size("0x4").is_err());
        assert!(parse_size("wide").is_err());
        assert!(
            parse_size("100000x100000").is_err(),
            "every pixel is a point"
        );
    }
}
