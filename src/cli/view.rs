//! `streamrecon view` (and `streamrecon` with no arguments): the viewer on an input.
//!
//! The window runs on the main thread. A feeder thread loads the model, starts the pipeline
//! and forwards its events to the viewer (and the viewer's controls to the pipeline), so the
//! window opens at once and stays responsive while weights load.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use crossbeam_channel::{Receiver, Sender, bounded, select, unbounded};

use crate::attention::AttentionLayout;
use crate::capture::{
    CameraRequest, CorruptFilePolicy, ImageFolder, InputSpec, Source, SyntheticScene,
    SyntheticSource, Webcam, list_cameras,
};
use crate::model::weights::WeightStore;
use crate::model::{GctModel, ModelConfig};
use crate::pipeline::{
    Control, CpuFrameModel, Delivery, FrameModel, KeyframePolicy, KeyframeRule, Outputs, Pipeline,
    PipelineConfig, PipelineEvent, PointFilter,
};
use crate::viewer::demo::{DemoConfig, DemoStream};
use crate::viewer::{
    ExitPlan, StreamSettings, ViewerControl, ViewerEvent, ViewerOptions, run_viewer,
};

/// Events queued between the feeder and the window; the pipeline drops frames (for the viewer
/// only) when the window falls behind.
const VIEWER_QUEUE: usize = 16;
/// Frames per second of the synthetic room when it stands in for a camera.
const SYNTHETIC_FPS: f64 = 30.0;

#[derive(Debug, Clone, Args)]
pub struct ViewArgs {
    /// `webcam:N`, `webcam:NAME`, `synthetic`, an image folder, or `demo` (a synthetic room
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
    /// KV layout of the global attention at start: paged or dense.
    #[arg(long, default_value = "paged")]
    pub attention: String,
    /// Sliding window of keyframes at start (default: the model's).
    #[arg(long)]
    pub window: Option<usize>,
    /// Keyframe every N frames at start (default: the pipeline's choice for the input).
    #[arg(long, value_name = "N")]
    pub keyframe_interval: Option<u64>,
    /// Points with confidence at or below this are not sent to the viewer.
    #[arg(long, default_value_t = 1.5)]
    pub conf_threshold: f32,
    /// Keep every n-th point that passes the confidence filter.
    #[arg(long, default_value_t = 4)]
    pub point_stride: usize,
    /// Save a PNG of the window before exiting (needs --exit-after).
    #[arg(long, value_name = "FILE")]
    pub screenshot: Option<PathBuf>,
    /// Close after this many processed frames (a headless check, e.g. under Xvfb).
    #[arg(long, value_name = "N")]
    pub exit_after: Option<u64>,
    /// Frames per second of `--input demo`.
    #[arg(long, default_value_t = 30.0)]
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
    if args.point_stride == 0 {
        bail!("--point-stride must be at least 1");
    }
    let (events_tx, events_rx) = bounded::<ViewerEvent>(VIEWER_QUEUE);
    let (control_tx, control_rx) = unbounded::<ViewerControl>();
    let source_label = match args.input.as_deref() {
        Some("demo") => {
            let fps = args.demo_fps;
            if !(fps.is_finite() && fps > 0.0) {
                bail!("--demo-fps must be a positive number, got {fps}");
            }
            let (width, height) = parse_size(&args.demo_size)?;
            let demo_frames = args.demo_frames;
            let demo = DemoConfig {
                width,
                height,
                ..DemoConfig::default()
            };
            spawn_feeder("demo-source", move || {
                feed_demo(&events_tx, &control_rx, fps, demo, demo_frames)
            })?;
            "demo: synthetic room, simulated cache (no model)".to_string()
        }
        input => {
            let spec = match input {
                Some(s) => s.parse::<InputSpec>()?,
                None => default_input(),
            };
            // Open the source here so a bad input is an error before any window opens.
            let source = open_source(&spec)?;
            let config = pipeline_config(&args)?;
            let label = source.describe();
            let model_args = args.clone();
            spawn_feeder("viewer-feed", move || {
                feed_pipeline(source, config, &model_args, &events_tx, &control_rx)
            })?;
            label
        }
    };
    let options = ViewerOptions {
        source_label,
        notices: Vec::new(),
        exit: ExitPlan {
            exit_after: args.exit_after,
            screenshot: args.screenshot.clone(),
        },
        recording_available: false,
        point_budget: args.point_budget,
    };
    let report = run_viewer(events_rx, Some(control_tx), options).context("running the viewer")?;
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

fn parse_size(s: &str) -> anyhow::Result<(u32, u32)> {
    let parsed = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)));
    match parsed {
        Some((w, h)) if w > 0 && h > 0 => Ok((w, h)),
        _ => bail!("`{s}`: expected WIDTHxHEIGHT, both positive"),
    }
}

fn spawn_feeder(name: &str, body: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
    thread::Builder::new()
        .name(name.to_string())
        .spawn(body)
        .map(drop)
        .with_context(|| format!("starting the {name} thread"))
}

fn default_input() -> InputSpec {
    if list_cameras().is_empty() {
        tracing::info!("no camera found: using the synthetic room (--input synthetic)");
        InputSpec::Synthetic
    } else {
        "webcam:0".parse().unwrap_or(InputSpec::Synthetic)
    }
}

fn open_source(input: &InputSpec) -> anyhow::Result<Box<dyn Source>> {
    Ok(match input {
        InputSpec::Webcam(selector) => Box::new(Webcam::open(&CameraRequest {
            selector: selector.clone(),
            resolution: None,
            fps: None,
        })?),
        // Endless and paced like a camera, so the viewer shows live behaviour (drops included).
        InputSpec::Synthetic => Box::new(SyntheticSource::live(
            SyntheticScene {
                frames: None,
                ..SyntheticScene::default()
            },
            SYNTHETIC_FPS,
        )),
        InputSpec::Folder(dir) => Box::new(ImageFolder::open(dir, CorruptFilePolicy::Skip)?),
    })
}

fn pipeline_config(args: &ViewArgs) -> anyhow::Result<PipelineConfig> {
    let layout: AttentionLayout = args.attention.parse()?;
    let keyframes = args.keyframe_interval.map(|interval| KeyframePolicy {
        rule: KeyframeRule::Fixed {
            interval: interval.max(1),
        },
        ..KeyframePolicy::default()
    });
    Ok(PipelineConfig {
        layout,
        window: args.window,
        keyframes,
        points: PointFilter {
            min_confidence: args.conf_threshold,
            stride: args.point_stride,
        },
        ..PipelineConfig::default()
    })
}

/// The model to run and, for random weights, the notice the viewer must keep on screen.
fn load_model(args: &ViewArgs) -> anyhow::Result<(Arc<dyn FrameModel>, Option<String>)> {
    let file_cfg = args
        .model_config
        .as_deref()
        .map(ModelConfig::from_json_file)
        .transpose()?;
    let random = |preset: &str,
                  why: &str|
     -> anyhow::Result<(Arc<dyn FrameModel>, Option<String>)> {
        let cfg = match (preset, file_cfg.clone()) {
            (_, Some(c)) => c,
            ("tiny", None) => ModelConfig::tiny(),
            ("full", None) => ModelConfig::default(),
            (other, None) => bail!("unknown --random-weights preset `{other}` (use full or tiny)"),
        };
        let store = crate::model::weights::random::random_store(&cfg, 0)?;
        let model = GctModel::from_store(cfg, store)?;
        let notice = format!(
            "RANDOM WEIGHTS ({preset} model): {why}. The geometry shown is meaningless; \
             pass --weights FILE for a real reconstruction."
        );
        Ok((Arc::new(CpuFrameModel::new(model)), Some(notice)))
    };
    if let Some(preset) = &args.random_weights {
        if args.weights.is_some() {
            bail!("give either --weights or --random-weights, not both");
        }
        return random(preset, "asked for with --random-weights");
    }
    let path = match &args.weights {
        Some(p) if p.as_os_str() != "hf" => p.clone(),
        explicit => match crate::model::weights::hub::download_default() {
            Ok(p) => p,
            // Asked for the hub explicitly: its failure is the answer.
            Err(e) if explicit.is_some() => return Err(e.into()),
            // The default: a window that runs beats no window; the notice says why.
            Err(e) => return random("tiny", &format!("no checkpoint ({e})")),
        },
    };
    let store = WeightStore::load(&path).with_context(|| format!("loading {}", path.display()))?;
    let cfg = match file_cfg {
        Some(c) => c,
        None => ModelConfig::default().infer_from_weights(&store)?,
    };
    let model = GctModel::from_store(cfg, store)?;
    Ok((Arc::new(CpuFrameModel::new(model)), None))
}

/// Loads the model, runs the pipeline and relays between it and the window until either ends.
fn feed_pipeline(
    source: Box<dyn Source>,
    config: PipelineConfig,
    args: &ViewArgs,
    viewer: &Sender<ViewerEvent>,
    controls: &Receiver<ViewerControl>,
) {
    let _ = viewer.send(ViewerEvent::Status("loading the model…".to_string()));
    let (model, notice) = match load_model(args) {
        Ok(m) => m,
        Err(e) => {
            let _ = viewer.send(ViewerEvent::Notice(format!(
                "could not load the model: {e:#}"
            )));
            // Nothing will come: let a headless run (--exit-after) finish with the notice shown.
            let _ = viewer.send(ViewerEvent::InputEnded);
            return;
        }
    };
    if let Some(notice) = notice {
        let _ = viewer.send(ViewerEvent::Notice(notice));
    }
    let _ = viewer.send(ViewerEvent::Status(model.describe()));
    let window = config.window.unwrap_or(model.limits().default_window);
    let paged = config.layout == AttentionLayout::Paged;
    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Latest, 4);
    let pipeline = match Pipeline::start(source, model, config, outputs) {
        Ok(p) => p,
        Err(e) => {
            let _ = viewer.send(ViewerEvent::Notice(format!(
                "could not start the pipeline: {e}"
            )));
            let _ = viewer.send(ViewerEvent::InputEnded);
            return;
        }
    };
    let mut policy = pipeline.keyframe_policy();
    let keyframe_interval = match policy.rule {
        KeyframeRule::Fixed { interval } => Some(interval),
        KeyframeRule::Adaptive { .. } => None,
    };
    let _ = viewer.send(ViewerEvent::Settings(StreamSettings {
        paged,
        sliding_window: window,
        keyframe_interval,
    }));
    loop {
        select! {
            recv(events) -> event => {
                let Ok(event) = event else { break };
                let forwarded = match event {
                    PipelineEvent::Frame(r) => ViewerEvent::Frame(r),
                    PipelineEvent::Warning(w) => ViewerEvent::Status(format!("warning: {w}")),
                    PipelineEvent::Error { stage, message } => {
                        ViewerEvent::Notice(format!("{stage} failed: {message}"))
                    }
                    PipelineEvent::SessionReset { reason } => ViewerEvent::SessionReset(reason),
                    PipelineEvent::InputEnded => ViewerEvent::InputEnded,
                    PipelineEvent::Paused(p) => ViewerEvent::Paused(p),
                    PipelineEvent::Stopped(summary) => ViewerEvent::Status(format!(
                        "stopped: {} frames at {:.2} fps",
                        summary.frames_processed, summary.fps
                    )),
                };
                if viewer.send(forwarded).is_err() {
                    break;
                }
            }
            recv(controls) -> control => {
                let Ok(control) = control else { break };
                for c in to_pipeline(control, &mut policy) {
                    if !pipeline.send(c) {
                        break;
                    }
                }
            }
        }
    }
    pipeline.stop_and_join();
}

/// The pipeline's requests for a viewer control. Layout, window and keyframe settings take
/// effect at the next reset (a session's cache cannot change shape midway), so they are
/// followed by one.
fn to_pipeline(control: ViewerControl, policy: &mut KeyframePolicy) -> Vec<Control> {
    match control {
        ViewerControl::Pause(true) => vec![Control::Pause],
        ViewerControl::Pause(false) => vec![Control::Resume],
        ViewerControl::Reset => vec![Control::Reset],
        ViewerControl::PagedAttention(paged) => vec![
            Control::SetAttention(if paged {
                AttentionLayout::Paged
            } else {
                AttentionLayout::Dense
            }),
            Control::Reset,
        ],
        ViewerControl::SlidingWindow(n) => vec![Control::SetWindow(n), Control::Reset],
        ViewerControl::KeyframeInterval(n) => {
            policy.rule = KeyframeRule::Fixed {
                interval: u64::from(n.max(1)),
            };
            vec![Control::SetKeyframePolicy(*policy), Control::Reset]
        }
        // Nothing records yet; the toggle is disabled in the window.
        ViewerControl::Recording(_) => Vec::new(),
    }
}

/// The demo stream at `fps`, obeying pause and reset, until the window closes.
fn feed_demo(
    viewer: &Sender<ViewerEvent>,
    controls: &Receiver<ViewerControl>,
    fps: f64,
    config: DemoConfig,
    frames: Option<u64>,
) {
    let period = Duration::from_secs_f64(1.0 / fps);
    let mut stream = DemoStream::new(config);
    let _ = viewer.send(ViewerEvent::Settings(StreamSettings {
        paged: true,
        sliding_window: config.sliding_window,
        keyframe_interval: Some(config.keyframe_interval),
    }));
    let mut paused = false;
    let mut sent = 0u64;
    loop {
        let deadline = std::time::Instant::now() + period;
        while let Ok(control) = controls.recv_deadline(deadline) {
            match control {
                ViewerControl::Pause(p) => {
                    paused = p;
                    if viewer.send(ViewerEvent::Paused(p)).is_err() {
                        return;
                    }
                }
                ViewerControl::Reset => stream.reset(),
                _ => {}
            }
        }
        if paused {
            continue;
        }
        if frames.is_some_and(|n| sent >= n) {
            let _ = viewer.send(ViewerEvent::InputEnded);
            // Stay until the window closes, still answering controls (nothing to do).
            while controls.recv().is_ok() {}
            return;
        }
        sent += 1;
        if viewer
            .send(ViewerEvent::Frame(Arc::new(stream.next_result())))
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_defaults_are_clap_defaults() {
        let args = ViewArgs::default();
        assert_eq!(args.attention, "paged");
        assert_eq!(args.point_stride, 4);
        assert!(args.conf_threshold > 1.0);
        assert_eq!(args.demo_size, "96x72");
        assert!(args.input.is_none() && args.exit_after.is_none());
    }

    #[test]
    fn controls_map_to_pipeline_requests() {
        let mut policy = KeyframePolicy::default();
        assert_eq!(
            to_pipeline(ViewerControl::Pause(true), &mut policy),
            vec![Control::Pause]
        );
        assert_eq!(
            to_pipeline(ViewerControl::SlidingWindow(9), &mut policy),
            vec![Control::SetWindow(9), Control::Reset]
        );
        let requests = to_pipeline(ViewerControl::KeyframeInterval(3), &mut policy);
        assert_eq!(policy.rule, KeyframeRule::Fixed { interval: 3 });
        assert_eq!(requests.last(), Some(&Control::Reset));
        assert!(to_pipeline(ViewerControl::Recording(true), &mut policy).is_empty());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("640x480").ok(), Some((640, 480)));
        assert!(parse_size("0x4").is_err());
        assert!(parse_size("wide").is_err());
    }
}
