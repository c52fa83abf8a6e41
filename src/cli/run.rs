//! `streamrecon run --headless`: the pipeline without a window. Frames come from a webcam, a
//! folder or the synthetic room; results go to the recorder (`SESSION/session.srec`) and to a
//! plain dump beside it (per-frame JSON, a binary PLY of all points, a TUM trajectory,
//! summary.json). See docs/pipeline.md.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};

use super::model_source;
use super::stream_args::{CameraArgs, StreamArgs};
use crate::capture::{
    CorruptFilePolicy, ImageFolder, InputSpec, Source, SyntheticScene, SyntheticSource, Webcam,
    list_cameras,
};
use crate::frame::FrameResult;
use crate::pipeline::{
    Control, Delivery, FrameModel, KeyframeScheduler, Outputs, Pipeline, PipelineConfig,
    PipelineEvent, PipelineSummary, PointFilter,
};
use crate::record::{Offer, Recorder, RecorderOptions};

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Where the model runs: auto (the GPU when CUDA works, else the CPU), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend_choice::BackendArg::Auto)]
    pub backend: super::backend_choice::BackendArg,
    /// Run without a window (the only mode of `run` for now; the viewer is `streamrecon view`).
    #[arg(long)]
    pub headless: bool,
    /// `webcam:N`, `webcam:NAME`, `synthetic` or an image folder. Default: webcam:0 when a
    /// camera exists, else the synthetic room.
    #[arg(long)]
    pub input: Option<String>,
    /// Session directory to write (must not exist or be empty).
    #[arg(long, value_name = "SESSION")]
    pub out: Option<PathBuf>,
    /// List the cameras the platform reports and exit.
    #[arg(long)]
    pub list_cameras: bool,
    /// Weights file (safetensors or PyTorch .pt), or `hf` for the released checkpoint.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Model config JSON (the parity fixtures' format); default: the released model's sizes,
    /// re-derived from the weights.
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// Seeded random weights of a preset (`full` or `tiny`) instead of a file.
    #[arg(long, value_name = "PRESET")]
    pub random_weights: Option<String>,
    #[command(flatten)]
    pub stream: StreamArgs,
    /// Stop after this many captured frames.
    #[arg(long)]
    pub max_frames: Option<u64>,
    #[command(flatten)]
    pub camera: CameraArgs,
    /// A folder image that does not decode stops the run (default: skipped with a warning).
    #[arg(long)]
    pub strict: bool,
    /// Frames of the synthetic input.
    #[arg(long, default_value_t = 60)]
    pub synthetic_frames: u64,
    /// Points with confidence at or below this are dropped.
    #[arg(long, default_value_t = 1.5)]
    pub conf_threshold: f32,
    /// Keep every n-th point that passes the confidence filter.
    #[arg(long, default_value_t = 10)]
    pub point_stride: usize,
    /// Write the bundled synthetic sample (PNGs, depth, ground truth) to this folder and exit.
    #[arg(long, value_name = "DIR")]
    pub write_sample: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.list_cameras {
        print_cameras();
        return Ok(());
    }
    if let Some(dir) = &args.write_sample {
        write_sample(dir)?;
        println!("wrote the synthetic sample to {}", dir.display());
        return Ok(());
    }
    if !args.headless {
        bail!("`streamrecon run` needs --headless (the windowed app is `streamrecon view`)");
    }
    let out = args
        .out
        .clone()
        .context("--out SESSION is required: the directory the run writes")?;
    let input = match &args.input {
        Some(s) => s.parse::<InputSpec>()?,
        None => super::stream_args::default_input(),
    };
    let config = pipeline_config(&args)?;
    let source = open_source(&input, &args)?;
    let model = load_model(&args)?;
    // Refuse a keyframe budget the model cannot hold before anything is written.
    let limits = model.limits();
    KeyframeScheduler::new(
        config.keyframes_for(source.as_ref(), &limits),
        limits.scale_frames,
        limits.max_frame_num,
    )?;
    prepare_session_dir(&out)?;

    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Lossless, 8);
    let total = source.remaining_hint().map(|n| match args.max_frames {
        Some(m) => n.min(m),
        None => n,
    });
    eprintln!("input: {}", source.describe());
    eprintln!("model: {}", model.describe());
    let pipeline = Pipeline::start(source, model, config, outputs)?;
    eprintln!("keyframes: {:?}", pipeline.keyframe_policy());
    let interrupted = stop_on_interrupt(pipeline.control());

    let progress = progress_bar(total);
    let started = Instant::now();
    let mut dump = SessionDump::create(&out)?;
    let recorder = Recorder::create(
        out.join(SESSION_FILE),
        &session_config(&args, &input, &pipeline),
        RecorderOptions {
            // Headless inference is far slower than the disk; a deep queue means the
            // recorder never falls behind in practice (and says so in the file if it does).
            queue: 1024,
            ..RecorderOptions::default()
        },
    )?;
    let mut write_error: Option<anyhow::Error> = None;
    let mut summary = None;
    for event in events.iter() {
        match event {
            PipelineEvent::Frame(result) => {
                if write_error.is_none()
                    && let Err(e) = dump.write_frame(&result)
                {
                    write_error = Some(e);
                    pipeline.send(Control::Stop);
                }
                if recorder.offer(Arc::clone(&result)) == Offer::Stopped && write_error.is_none() {
                    // The recorder's own error is in its status, reported at the end.
                    pipeline.send(Control::Stop);
                }
                progress.inc(1);
                progress.set_message(progress_message(&result, &dump, started));
            }
            PipelineEvent::Warning(w) => {
                recorder.note(format!("warning: {w}"));
                progress.println(format!("warning: {w}"))
            }
            PipelineEvent::Error { stage, message } => {
                recorder.note(format!("error ({stage}): {message}"));
                progress.println(format!("error ({stage}): {message}"));
                // The map so far is kept: stop here and write what there is.
                pipeline.send(Control::Stop);
            }
            PipelineEvent::SessionReset { reason } => {
                recorder.note(format!("session reset: {reason}"));
                progress.println(format!("new session: {reason}"))
            }
            PipelineEvent::InputEnded => {
                pipeline.send(Control::Stop);
            }
            PipelineEvent::Paused(_) => {}
            PipelineEvent::Stopped(s) => summary = Some(*s),
        }
    }
    progress.finish_and_clear();
    pipeline.join();
    let summary = summary.context("the pipeline ended without a summary")?;
    dump.finish(&summary)?;
    let recorded = recorder.finish();
    print_summary(&summary, &out, &dump);
    if interrupted.load(Ordering::SeqCst) {
        println!("stopped:    interrupted (Ctrl-C); the session holds every frame processed");
    }
    println!(
        "recorded:   {} frames, {} bytes in {}{}",
        recorded.frames_recorded,
        recorded.bytes_written,
        recorded.path.display(),
        if recorded.results_not_recorded > 0 {
            format!(
                " ({} results not recorded: the recorder fell behind)",
                recorded.results_not_recorded
            )
        } else {
            String::new()
        }
    );
    if let Some(e) = recorded.error {
        bail!("recording {}: {e}", recorded.path.display());
    }
    if let Some(e) = write_error {
        return Err(e.context(format!("writing the session {}", out.display())));
    }
    if let Some(first) = summary.errors.first() {
        bail!(
            "{first} ({} frames processed; the session so far is in {})",
            summary.frames_processed,
            out.display()
        );
    }
    Ok(())
}

/// The recorder's session file inside `--out` (docs/recording-format.md).
pub const SESSION_FILE: &str = "session.srec";

/// What the recording says about how it was made.
fn session_config(args: &RunArgs, input: &InputSpec, pipeline: &Pipeline) -> serde_json::Value {
    serde_json::json!({
        "command": "streamrecon run --headless",
        "input": input.to_string(),
        "weights": args.weights.as_ref().map(|p| p.display().to_string()),
        "model_config": args.model_config.as_ref().map(|p| p.display().to_string()),
        "random_weights": args.random_weights,
        "attention": args.stream.attention.to_string(),
        "window": args.stream.window,
        "keyframes": format!("{:?}", pipeline.keyframe_policy()),
        "conf_threshold": args.conf_threshold,
        "point_stride": args.point_stride,
    })
}

fn print_cameras() {
    let cameras = list_cameras();
    if cameras.is_empty() {
        println!("no cameras found");
    }
    for c in cameras {
        println!("webcam:{c}");
    }
}

fn write_sample(dir: &Path) -> anyhow::Result<()> {
    let scene = crate::capture::synthetic::sample_scene();
    scene.write_sample(dir, crate::capture::synthetic::SAMPLE_FRAMES)?;
    Ok(())
}

fn open_source(input: &InputSpec, args: &RunArgs) -> anyhow::Result<Box<dyn Source>> {
    Ok(match input {
        InputSpec::Webcam(selector) => Box::new(Webcam::open(&args.camera.request(selector)?)?),
        InputSpec::Synthetic => Box::new(SyntheticSource::new(SyntheticScene {
            frames: Some(args.synthetic_frames),
            ..SyntheticScene::default()
        })),
        InputSpec::Folder(dir) => {
            let policy = if args.strict {
                CorruptFilePolicy::Stop
            } else {
                CorruptFilePolicy::Skip
            };
            Box::new(
                ImageFolder::open(dir, policy)
                    .with_context(|| super::stream_args::folder_input_context(dir))?,
            )
        }
    })
}

fn pipeline_config(args: &RunArgs) -> anyhow::Result<PipelineConfig> {
    let mut config = args.stream.pipeline_config(PointFilter {
        min_confidence: args.conf_threshold,
        stride: args.point_stride,
    })?;
    config.max_frames = args.max_frames;
    Ok(config)
}

fn load_model(args: &RunArgs) -> anyhow::Result<Arc<dyn FrameModel>> {
    let config = model_source::config_file(args.model_config.as_deref())?;
    let model = match (&args.random_weights, &args.weights) {
        (Some(_), Some(_)) => bail!("give either --weights or --random-weights, not both"),
        (Some(preset), None) => model_source::random_model(preset, config)?,
        (None, Some(path)) => {
            let path = if path.as_os_str() == "hf" {
                crate::model::weights::hub::download_default()?
            } else {
                path.clone()
            };
            model_source::checkpoint_model(&path, config)?
        }
        (None, None) => bail!(
            "no model: give --weights FILE (or `hf`) with --model-config, or --random-weights full|tiny"
        ),
    };
    super::backend_choice::frame_model(model, args.backend)
}

fn prepare_session_dir(out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        let mut entries =
            std::fs::read_dir(out).with_context(|| format!("--out {}", out.display()))?;
        if entries.next().is_some() {
            bail!(
                "--out {} already holds files; choose a new session directory",
                out.display()
            );
        }
    }
    std::fs::create_dir_all(out.join("frames"))
        .with_context(|| format!("creating {}", out.display()))?;
    Ok(())
}

fn progress_bar(total: Option<u64>) -> ProgressBar {
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = if total.is_some() {
        "{bar:30} {pos}/{len} {msg}"
    } else {
        "{spinner} {pos} frames {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

fn progress_message(r: &FrameResult, dump: &SessionDump, started: Instant) -> String {
    let s = &r.cache.stats;
    let fps = dump.frames as f64 / started.elapsed().as_secs_f64().max(1e-9);
    format!(
        "{fps:.2} fps | cache {}/{} pages, {} committed | {} points | {} dropped",
        s.allocated_pages.saturating_sub(s.free_pages),
        s.max_pages,
        s.frames_committed,
        dump.points,
        dump.dropped
    )
}

/// Ctrl-C stops the pipeline the way the end of the input does, so the dump, the recording's
/// index and summary.json are all written for the frames processed; a second Ctrl-C quits at
/// once (the recording stays readable without its index). Returns whether it was pressed.
fn stop_on_interrupt(control: crossbeam_channel::Sender<Control>) -> Arc<AtomicBool> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    let installed = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted again: quitting without finishing the session");
            std::process::exit(130);
        }
        eprintln!("\ninterrupted: finishing the session (Ctrl-C again to quit at once)");
        let _ = control.send(Control::Stop);
    });
    if let Err(e) = installed {
        tracing::warn!("Ctrl-C will end the run without finishing the session: {e}");
    }
    interrupted
}

fn print_summary(s: &PipelineSummary, out: &Path, dump: &SessionDump) {
    println!("input:      {}", s.source);
    println!("model:      {}", s.model);
    println!(
        "frames:     {} processed of {} captured ({} dropped, {} skipped, {} discarded at stop)",
        s.frames_processed,
        s.frames_captured,
        s.frames_dropped,
        s.frames_skipped,
        s.frames_discarded
    );
    println!(
        "kinds:      {} scale, {} keyframes, {} non-keyframes; {} committed at the end; {} session(s)",
        s.scale_frames, s.keyframes, s.non_keyframes, s.committed_frames_at_end, s.sessions
    );
    println!("speed:      {:.2} fps over {:.2} s", s.fps, s.wall_s);
    let stages: Vec<String> = s
        .mean_stage_ms
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect();
    println!("mean ms:    {}", stages.join(", "));
    println!("points:     {}", dump.points);
    println!("session:    {}", out.display());
    for w in &s.warnings {
        println!("warning:    {w}");
    }
}

/// The plain dump: `frames/NNNNNN.json`, `points.ply`, `trajectory.tum`, `summary.json`.
struct SessionDump {
    dir: PathBuf,
    ply: BufWriter<File>,
    trajectory: BufWriter<File>,
    points: u64,
    frames: u64,
    dropped: u64,
}

/// The header has a fixed length so the vertex count can be patched in when the run ends:
/// a comment line pads it (plain decimal counts, which every PLY reader parses).
const PLY_HEADER_PAD: usize = 24;

fn ply_header(count: u64) -> String {
    let digits = count.to_string().len();
    format!(
        "ply\nformat binary_little_endian 1.0\ncomment streamrecon run --headless\n\
         element vertex {count}\ncomment {pad}\nproperty float x\nproperty float y\n\
         property float z\nproperty uchar red\nproperty uchar green\nproperty uchar blue\n\
         property float confidence\nend_header\n",
        pad = "-".repeat(PLY_HEADER_PAD - digits.min(PLY_HEADER_PAD - 1))
    )
}

impl SessionDump {
    fn create(dir: &Path) -> anyhow::Result<Self> {
        let open = |name: &str| -> anyhow::Result<BufWriter<File>> {
            let path = dir.join(name);
            Ok(BufWriter::new(
                File::create(&path).with_context(|| format!("creating {}", path.display()))?,
            ))
        };
        let mut ply = open("points.ply")?;
        ply.write_all(ply_header(0).as_bytes())?;
        let mut trajectory = open("trajectory.tum")?;
        writeln!(
            trajectory,
            "# frame tx ty tz qx qy qz qw (world_from_camera)"
        )?;
        Ok(SessionDump {
            dir: dir.to_owned(),
            ply,
            trajectory,
            points: 0,
            frames: 0,
            dropped: 0,
        })
    }

    fn write_frame(&mut self, r: &FrameResult) -> anyhow::Result<()> {
        let stats = &r.cache.stats;
        let meta = serde_json::json!({
            "frame": r.frame,
            "frame_type": r.frame_type,
            "world_from_camera": crate::capture::synthetic::world_from_camera_rows(&r.world_from_camera),
            "intrinsics": r.intrinsics,
            "points": r.points.len(),
            "dropped_before": r.dropped_before,
            "timings": r.timings,
            "cache": stats,
            "cache_events": r.cache.events,
            "depth_min_max": min_max(&r.depth),
        });
        let path = self.dir.join("frames").join(format!("{:06}.json", r.frame));
        std::fs::write(&path, serde_json::to_vec_pretty(&meta)?)
            .with_context(|| format!("writing {}", path.display()))?;
        for i in 0..r.points.len() {
            for v in r.points.xyz[i] {
                self.ply.write_all(&v.to_le_bytes())?;
            }
            self.ply.write_all(&r.points.rgb[i])?;
            self.ply.write_all(&r.points.confidence[i].to_le_bytes())?;
        }
        let (_, rotation, t) = r.world_from_camera.to_scale_rotation_translation();
        writeln!(
            self.trajectory,
            "{} {} {} {} {} {} {} {}",
            r.frame, t.x, t.y, t.z, rotation.x, rotation.y, rotation.z, rotation.w
        )?;
        self.points += r.points.len() as u64;
        self.frames += 1;
        self.dropped += r.dropped_before;
        // Keep the files valid after every frame, so a killed run leaves a readable session.
        self.trajectory.flush()?;
        self.patch_ply_count()?;
        Ok(())
    }

    fn patch_ply_count(&mut self) -> anyhow::Result<()> {
        self.ply.flush()?;
        // The buffer is empty after the flush: seek the file underneath directly.
        let file = self.ply.get_mut();
        file.seek(SeekFrom::Start(0))?;
        file.write_all(ply_header(self.points).as_bytes())?;
        file.seek(SeekFrom::End(0))?;
        Ok(())
    }

    fn finish(&mut self, summary: &PipelineSummary) -> anyhow::Result<()> {
        self.trajectory.flush()?;
        self.patch_ply_count()?;
        let path = self.dir.join("summary.json");
        std::fs::write(&path, serde_json::to_vec_pretty(summary)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}

fn min_max(v: &[f32]) -> [f32; 2] {
    v.iter()
        .fold([f32::INFINITY, f32::NEG_INFINITY], |[lo, hi], &x| {
            [lo.min(x), hi.max(x)]
        })
}
