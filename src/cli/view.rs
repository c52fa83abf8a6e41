//! `streamrecon view` (and `streamrecon` with no arguments): the viewer on an input.
//!
//! The window runs on the main thread. A feeder thread loads the model, starts the pipeline
//! and forwards its events to the viewer (and the viewer's controls to the pipeline), so the
//! window opens at once and stays responsive while weights load.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::Args;
use crossbeam_channel::{Receiver, Sender, bounded, select, tick, unbounded};

use super::model_source;
use super::stream_args::{CameraArgs, StreamArgs};
use crate::attention::AttentionLayout;
use crate::capture::{
    CorruptFilePolicy, ImageFolder, InputSpec, Source, SyntheticScene, SyntheticSource, Webcam,
};
use crate::pipeline::{
    Control, Delivery, FrameModel, KeyframePolicy, KeyframeRule, Outputs, Pipeline, PipelineConfig,
    PipelineEvent, PointFilter,
};
use crate::record::{Recorder, RecorderOptions, RecorderStatus};
use crate::viewer::demo::{DemoConfig, DemoStream};
use crate::viewer::{
    ExitPlan, StreamSettings, ViewerControl, ViewerEvent, ViewerOptions, run_viewer,
};

/// Events queued between the feeder and the window; the pipeline drops frames (for the viewer
/// only) when the window falls behind.
const VIEWER_QUEUE: usize = 16;
/// Frames per second of the synthetic room when it stands in for a camera.
const SYNTHETIC_FPS: f64 = 30.0;
/// Events queued for the recording relay. Lossless, so inference would wait on a full queue,
/// but the relay only hands results to the recorder's own queue (which never blocks).
const RECORD_QUEUE: usize = 8;
/// How often the window is told how the recording is going.
const RECORD_STATUS_EVERY: Duration = Duration::from_millis(500);
/// How long the command waits, after the window closes, for the feeder to stop the pipeline
/// and finish a recording (write its index), before giving up on it.
const FEEDER_EXIT_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Args)]
pub struct ViewArgs {
    /// Where the model runs: auto (the GPU when CUDA works, else the CPU), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend_choice::BackendArg::Auto)]
    pub backend: super::backend_choice::BackendArg,
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
    /// The stream's settings at start (the window's controls change them later).
    #[command(flatten)]
    pub stream: StreamArgs,
    #[command(flatten)]
    pub camera: CameraArgs,
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
    // Said now rather than as a notice in a window that then records nothing.
    if let Some(path) = &args.record
        && path.exists()
    {
        bail!(
            "--record {}: the file exists (a recording never overwrites)",
            path.display()
        );
    }
    let (events_tx, events_rx) = bounded::<ViewerEvent>(VIEWER_QUEUE);
    let (control_tx, control_rx) = unbounded::<ViewerControl>();
    let mut feeder = None;
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
            if args.record.is_some() {
                bail!("--record needs a pipeline; the demo stream has nothing to record");
            }
            spawn_feeder("demo-source", move || {
                feed_demo(&events_tx, &control_rx, fps, demo, demo_frames)
            })?;
            "demo: synthetic room, simulated cache (no model)".to_string()
        }
        input => {
            let spec = match input {
                Some(s) => s.parse::<InputSpec>()?,
                None => super::stream_args::default_input(),
            };
            // Open the source here so a bad input is an error before any window opens.
            let source = open_source(&spec, &args.camera)?;
            let config = pipeline_config(&args)?;
            let label = source.describe();
            let model_args = args.clone();
            let recording = RecordingPlan {
                dir: args.record_dir.clone(),
                at_launch: args.record.clone(),
                config: session_config(&args, &label),
            };
            feeder = Some(spawn_feeder("viewer-feed", move || {
                feed_pipeline(
                    source,
                    config,
                    &model_args,
                    recording,
                    &events_tx,
                    &control_rx,
                )
            })?);
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
        recording_available: feeder.is_some(),
        point_budget: args.point_budget,
        timeline: None,
    };
    let report = run_viewer(events_rx, Some(control_tx), options).context("running the viewer");
    // The window has closed, so the feeder's channels are gone and it is stopping the pipeline;
    // a recording in progress gets its index only if the process waits for that.
    if let Some((done, _thread)) = feeder
        && done.recv_timeout(FEEDER_EXIT_WAIT) == Err(crossbeam_channel::RecvTimeoutError::Timeout)
    {
        eprintln!("viewer: the pipeline did not stop in time; a recording may lack its index");
    }
    let report = report?;
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

/// Starts `body` on a named thread; the receiver disconnects when it has returned (or panicked).
fn spawn_feeder(
    name: &str,
    body: impl FnOnce() + Send + 'static,
) -> anyhow::Result<(Receiver<()>, JoinHandle<()>)> {
    let (done_tx, done_rx) = bounded::<()>(1);
    let thread = thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _done = done_tx;
            body();
        })
        .with_context(|| format!("starting the {name} thread"))?;
    Ok((done_rx, thread))
}

/// What the session header of a recording from the window says about how it was made.
fn session_config(args: &ViewArgs, source: &str) -> serde_json::Value {
    serde_json::json!({
        "command": "streamrecon view",
        "input": source,
        "weights": args.weights.as_ref().map(|p| p.display().to_string()),
        "model_config": args.model_config.as_ref().map(|p| p.display().to_string()),
        "random_weights": args.random_weights,
        "attention": args.stream.attention.to_string(),
        "window": args.stream.window,
        "keyframes": args.stream.keyframes,
        "keyframe_interval": args.stream.keyframe_interval,
        "view_budget": args.stream.view_budget,
        "on_budget": args.stream.on_budget.to_string(),
        "conf_threshold": args.conf_threshold,
        "point_stride": args.point_stride,
    })
}

/// How `view` records: where the toggle writes, and a file to start with.
pub struct RecordingPlan {
    pub dir: PathBuf,
    pub at_launch: Option<PathBuf>,
    pub config: serde_json::Value,
}

/// The recording side of `view`: a thread that drains a lossless subscription of the pipeline
/// and hands results to the recorder while one is active. It exists for the whole run (so the
/// subscription is never left full and inference never waits for it) and only `offer`s, which
/// never blocks; the viewer's own stream drops frames and is never recorded from.
pub struct RecordingRelay {
    config: serde_json::Value,
    active: Arc<Mutex<Option<Recorder>>>,
    /// Events taken off the subscription and dealt with (recorded or not).
    seen: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl RecordingRelay {
    /// Starts relaying `events` (a `Delivery::Lossless` subscription) until it disconnects.
    pub fn spawn(
        events: Receiver<PipelineEvent>,
        config: serde_json::Value,
    ) -> anyhow::Result<Self> {
        let active: Arc<Mutex<Option<Recorder>>> = Arc::default();
        let slot = Arc::clone(&active);
        let seen: Arc<AtomicU64> = Arc::default();
        let counter = Arc::clone(&seen);
        let thread = thread::Builder::new()
            .name("record-relay".into())
            .spawn(move || relay_loop(&events, &slot, &counter))
            .context("starting the record-relay thread")?;
        Ok(Self {
            config,
            active,
            seen,
            thread: Some(thread),
        })
    }

    /// Starts recording into `path` (which must not exist); a recording in progress is
    /// finished first.
    pub fn start(&self, path: &Path) -> anyhow::Result<RecorderStatus> {
        self.stop();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the directory {}", dir.display()))?;
        }
        let recorder = Recorder::create(path, &self.config, RecorderOptions::default())
            .with_context(|| format!("starting a recording at {}", path.display()))?;
        let status = recorder.status();
        if let Ok(mut slot) = self.active.lock() {
            *slot = Some(recorder);
        }
        Ok(status)
    }

    /// Starts recording into a new timestamped file in `dir`.
    pub fn start_in(&self, dir: &Path) -> anyhow::Result<RecorderStatus> {
        let path = new_session_path(dir, SystemTime::now())?;
        self.start(&path)
    }

    /// Finishes the recording in progress (queue, index, footer) and says how it went.
    pub fn stop(&self) -> Option<RecorderStatus> {
        // Taken out under the lock, finished outside it: the relay goes on draining meanwhile.
        let recorder = self.active.lock().ok()?.take()?;
        Some(recorder.finish())
    }

    /// Events the relay has dealt with so far (whether or not a recording was active): lets a
    /// caller know that what it sent before a toggle has been through.
    pub fn events_seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    /// How the recording in progress is going (`None`: not recording).
    pub fn status(&self) -> Option<RecorderStatus> {
        self.active.lock().ok()?.as_ref().map(Recorder::status)
    }

    /// Waits for the subscription to end (the pipeline stopped), then finishes any recording.
    pub fn join(mut self) -> Option<RecorderStatus> {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.stop()
    }
}

fn relay_loop(
    events: &Receiver<PipelineEvent>,
    active: &Mutex<Option<Recorder>>,
    seen: &AtomicU64,
) {
    for event in events.iter() {
        relay_one(event, active);
        seen.fetch_add(1, Ordering::AcqRel);
    }
}

fn relay_one(event: PipelineEvent, active: &Mutex<Option<Recorder>>) {
    let Ok(slot) = active.lock() else { return };
    let Some(recorder) = slot.as_ref() else {
        return;
    };
    // The recorder counts and notes what it cannot take; nothing to do with the answer.
    let _ = match event {
        PipelineEvent::Frame(result) => recorder.offer(result),
        PipelineEvent::Warning(w) => recorder.note(format!("warning: {w}")),
        PipelineEvent::Error { stage, message } => {
            recorder.note(format!("error ({stage}): {message}"))
        }
        PipelineEvent::SessionReset { reason } => recorder.note(format!("session reset: {reason}")),
        PipelineEvent::InputEnded | PipelineEvent::Paused(_) | PipelineEvent::Stopped(_) => {
            return;
        }
    };
}

/// `dir/session-YYYYMMDD-HHMMSS.srec` (UTC) that does not exist yet: a suffix `-2`, `-3`, …
/// when two recordings start within a second.
pub fn new_session_path(dir: &Path, now: SystemTime) -> anyhow::Result<PathBuf> {
    let stamp = utc_stamp(now);
    for n in 1..1000u32 {
        let name = if n == 1 {
            format!("session-{stamp}.srec")
        } else {
            format!("session-{stamp}-{n}.srec")
        };
        let path = dir.join(name);
        if !path.exists() {
            return Ok(path);
        }
    }
    bail!("{}: too many sessions named session-{stamp}", dir.display())
}

/// `YYYYMMDD-HHMMSS` in UTC, from the civil-from-days algorithm (no date crate needed).
fn utc_stamp(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn open_source(input: &InputSpec, camera: &CameraArgs) -> anyhow::Result<Box<dyn Source>> {
    Ok(match input {
        InputSpec::Webcam(selector) => Box::new(Webcam::open(&camera.request(selector)?)?),
        // Endless and paced like a camera, so the viewer shows live behaviour (drops included).
        InputSpec::Synthetic => Box::new(SyntheticSource::live(
            SyntheticScene {
                frames: None,
                ..SyntheticScene::default()
            },
            SYNTHETIC_FPS,
        )),
        InputSpec::Folder(dir) => Box::new(
            ImageFolder::open(dir, CorruptFilePolicy::Skip)
                .with_context(|| super::stream_args::folder_input_context(dir))?,
        ),
    })
}

fn pipeline_config(args: &ViewArgs) -> anyhow::Result<PipelineConfig> {
    args.stream.pipeline_config(PointFilter {
        min_confidence: args.conf_threshold,
        stride: args.point_stride,
    })
}

/// The model to run and, for random weights, the notice the viewer must keep on screen.
fn load_model(args: &ViewArgs) -> anyhow::Result<(Arc<dyn FrameModel>, Option<String>)> {
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
        explicit => match crate::model::weights::hub::download_default() {
            Ok(p) => p,
            // Asked for the hub explicitly: its failure is the answer.
            Err(e) if explicit.is_some() => return Err(e.into()),
            // The default: a window that runs beats no window; the notice says why.
            Err(e) => return random("tiny", &format!("no checkpoint ({e})")),
        },
    };
    let request = model_source::checkpoint(&path, config, args.backend);
    Ok((model_source::load(&request)?, None))
}

/// Loads the model, runs the pipeline and relays between it and the window until either ends.
fn feed_pipeline(
    source: Box<dyn Source>,
    config: PipelineConfig,
    args: &ViewArgs,
    recording: RecordingPlan,
    viewer: &Sender<ViewerEvent>,
    controls: &Receiver<ViewerControl>,
) {
    let _ = viewer.send(ViewerEvent::Status("loading the model…".to_string()));
    let (model, notice) = match load_model(args) {
        Ok(m) => m,
        Err(e) => {
            let _ = viewer.send(ViewerEvent::Notice(format!(
                "could not load the model: {}",
                super::error_text(&e)
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
    let relay = match RecordingRelay::spawn(
        outputs.subscribe(Delivery::Lossless, RECORD_QUEUE),
        recording.config,
    ) {
        Ok(r) => r,
        Err(e) => {
            let _ = viewer.send(ViewerEvent::Notice(super::error_text(&e)));
            let _ = viewer.send(ViewerEvent::InputEnded);
            return;
        }
    };
    // Before the pipeline starts, so the recording has the first frame.
    if let Some(path) = &recording.at_launch {
        let status = relay.start(path);
        send_recording(viewer, status);
    }
    let pipeline = match Pipeline::start(source, model, config, outputs) {
        Ok(p) => p,
        Err(e) => {
            let _ = viewer.send(ViewerEvent::Notice(format!(
                "could not start the pipeline: {e}"
            )));
            let _ = viewer.send(ViewerEvent::InputEnded);
            if let Some(status) = relay.join() {
                let _ = viewer.send(ViewerEvent::Recording(Some(status)));
            }
            return;
        }
    };
    let mut policy = pipeline.keyframe_policy();
    let _ = viewer.send(ViewerEvent::Settings(StreamSettings {
        paged,
        sliding_window: window,
        keyframe_rule: policy.rule,
    }));
    let status_ticks = tick(RECORD_STATUS_EVERY);
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
            recv(status_ticks) -> _ => {
                if let Some(status) = relay.status()
                    && viewer.send(ViewerEvent::Recording(Some(status))).is_err()
                {
                    break;
                }
            }
            recv(controls) -> control => {
                let Ok(control) = control else { break };
                if let ViewerControl::Recording(on) = control {
                    if on {
                        let status = relay.start_in(&recording.dir);
                        send_recording(viewer, status);
                    } else {
                        let finished = relay.stop();
                        if let Some(s) = &finished {
                            let _ = viewer.send(ViewerEvent::Status(recording_summary(s)));
                        }
                        let _ = viewer.send(ViewerEvent::Recording(None));
                    }
                    continue;
                }
                for c in to_pipeline(control, &mut policy) {
                    if !pipeline.send(c) {
                        break;
                    }
                }
            }
        }
    }
    pipeline.stop_and_join();
    // The pipeline has stopped, so the relay's subscription ends and the file can be closed.
    if let Some(status) = relay.join() {
        eprintln!("viewer: {}", recording_summary(&status));
    }
}

/// Tells the window a recording started (or why it did not, unticking the toggle).
fn send_recording(viewer: &Sender<ViewerEvent>, started: anyhow::Result<RecorderStatus>) {
    match started {
        Ok(status) => {
            let _ = viewer.send(ViewerEvent::Recording(Some(status)));
        }
        Err(e) => {
            let _ = viewer.send(ViewerEvent::Notice(format!(
                "recording failed: {}",
                super::error_text(&e)
            )));
            let _ = viewer.send(ViewerEvent::Recording(None));
        }
    }
}

/// One line on a finished recording, for the status bar and the terminal.
fn recording_summary(s: &RecorderStatus) -> String {
    let mut line = format!(
        "recorded {} frames to {} ({} bytes)",
        s.frames_recorded,
        s.path.display(),
        s.bytes_written
    );
    if s.results_not_recorded > 0 {
        line.push_str(&format!(
            "; fell behind: {} not recorded",
            s.results_not_recorded
        ));
    }
    if let Some(e) = &s.error {
        line.push_str(&format!("; {e}"));
    }
    line
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
        ViewerControl::AdaptiveKeyframes(n) => {
            policy.rule = KeyframeRule::Adaptive {
                base_interval: u64::from(n.max(1)),
            };
            vec![Control::SetKeyframePolicy(*policy), Control::Reset]
        }
        // Recording is the feeder's (the relay), not the pipeline's.
        ViewerControl::Recording(_) => Vec::new(),
        // A live stream has no timeline (the window shows it only in replay).
        ViewerControl::Seek(_) | ViewerControl::Speed(_) => Vec::new(),
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
        keyframe_rule: KeyframeRule::Fixed {
            interval: config.keyframe_interval,
        },
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
        assert_eq!(args.stream.attention, AttentionLayout::Paged);
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
        let requests = to_pipeline(ViewerControl::AdaptiveKeyframes(2), &mut policy);
        assert_eq!(policy.rule, KeyframeRule::Adaptive { base_interval: 2 });
        assert_eq!(requests.last(), Some(&Control::Reset));
        assert!(to_pipeline(ViewerControl::Recording(true), &mut policy).is_empty());
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
    }
}
