//! `streamrecon run --headless`: the pipeline without a window. Frames come from a webcam, a
//! folder or the synthetic room; results go to a session folder (`record::SessionDir`: the
//! recording, per-frame JSON, and at the end summary.json, a PLY cloud and a TUM trajectory
//! from the recording). See docs/pipeline.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};

use super::interrupt::{self, Interrupted};
use super::stream_args::{self, CameraArgs, ModelFlags, PointArgs, StreamArgs};
use super::{model_source, run_output};
use crate::capture::{CorruptFilePolicy, InputSpec, SyntheticPlay, list_cameras};
use crate::pipeline::{
    Control, Delivery, FrameModel, KeyframeScheduler, Outputs, Pipeline, PipelineConfig,
    PipelineEvent, PointFilter,
};
use crate::record::{Offer, RecorderOptions, SessionDir, SessionRecorder, record_event};

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Where the model runs: auto (the GPU when CUDA works, else the CPU), cpu or cuda.
    #[arg(long, value_enum, default_value_t = super::backend_choice::BackendArg::Auto)]
    pub backend: super::backend_choice::BackendArg,
    /// Run without a window (the only mode of `run` for now; the viewer is `streamrecon view`).
    #[arg(long)]
    pub headless: bool,
    /// `webcam:N`, `webcam:NAME`, `synthetic`, a video file (`clip.mp4`: any container and
    /// codec the system's FFmpeg decodes) or an image folder. Default: webcam:0 when a
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
    #[arg(long, allow_negative_numbers = true)]
    pub max_frames: Option<u64>,
    #[command(flatten)]
    pub camera: CameraArgs,
    /// A folder image that does not decode stops the run (default: skipped with a warning).
    #[arg(long)]
    pub strict: bool,
    /// Frames of the synthetic input.
    #[arg(long, default_value_t = 60, allow_negative_numbers = true)]
    pub synthetic_frames: u64,
    #[command(flatten)]
    pub points: PointArgs,
    /// Write only the per-frame JSON and summary.json to --out, no recording (and so no cloud
    /// or trajectory, which come from it): inference's speed without the disk.
    #[arg(long)]
    pub no_recording: bool,
    /// Write the bundled synthetic sample (PNGs, depth, ground truth, and `room.mp4`: three
    /// seconds of the room as a video) to this folder and exit.
    #[arg(long, value_name = "DIR")]
    pub write_sample: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let launched = Instant::now();
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
    let input = match args.input.as_deref() {
        Some("demo") => bail!(
            "--input demo is the viewer's simulated stream (`streamrecon view --input demo`); \
             `run` takes webcam:N, webcam:NAME, synthetic, a video file or an image folder"
        ),
        Some(s) => s.parse::<InputSpec>()?,
        None => super::stream_args::default_input(),
    };
    let config = pipeline_config(&args)?;
    crate::capture::set_decode_limits(args.camera.decode_limits(args.strict)?);
    let source = stream_args::open_input(
        &input,
        &args.camera.source_options(
            SyntheticPlay::Frames(args.synthetic_frames),
            if args.strict {
                CorruptFilePolicy::Stop
            } else {
                CorruptFilePolicy::Skip
            },
        )?,
    )?;
    stream_args::check_frames_per_step(&config, source.as_ref())?;
    let model = load_model(&args)?;
    // Refuse a keyframe budget the model cannot hold before anything is written.
    let limits = model.limits();
    stream_args::check_window(config.window, &limits)?;
    KeyframeScheduler::new(
        config.keyframes_for(source.as_ref(), &limits),
        limits.scale_frames,
        limits.max_frame_num,
    )?;
    let mut dir = SessionDir::create(&out).context("--out")?;

    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Lossless, 8);
    let total = source.remaining_hint().map(|n| match args.max_frames {
        Some(m) => n.min(m),
        None => n,
    });
    eprintln!("input: {}", source.describe());
    eprintln!("model: {}", model.describe());
    let pipeline = Pipeline::start(source, model, config, outputs)?;
    let pipeline_started = launched.elapsed().as_secs_f64();
    eprintln!("keyframes: {:?}", pipeline.keyframe_policy());
    let interrupted = stop_on_interrupt(pipeline.control());

    let progress = run_output::progress_bar(total);
    let started = Instant::now();
    let mut header = stream_args::session_config(
        "streamrecon run --headless",
        &input.to_string(),
        model_flags(&args),
        &args.stream,
        point_filter(&args),
    );
    header["keyframe_policy"] = format!("{:?}", pipeline.keyframe_policy()).into();
    // Where an image folder's frames are, wherever the export later runs from: an export's
    // `--colmap-images original` links the user's own frames from there.
    if let InputSpec::Folder(dir) = &input
        && let Ok(absolute) = dir.canonicalize().or_else(|_| std::path::absolute(dir))
    {
        header["input_path"] = absolute.display().to_string().into();
    }
    let recorder = if args.no_recording {
        None
    } else {
        Some(SessionRecorder::create(
            dir.session_file(),
            &header,
            RecorderOptions {
                // A deep queue: the recorder never falls behind in practice (and says so in
                // the file if it does).
                queue: 1024,
                ..RecorderOptions::default()
            },
        )?)
    };
    let mut write_error: Option<anyhow::Error> = None;
    let mut summary = None;
    for event in events.iter() {
        let offered = recorder.as_ref().and_then(|r| record_event(r, &event));
        if offered == Some(Offer::Stopped) && write_error.is_none() {
            // The recorder's own error is in its status, reported at the end.
            pipeline.send(Control::Stop);
        }
        match event {
            PipelineEvent::Frame(result) => {
                if write_error.is_none()
                    && let Err(e) = dir.write_frame(&result)
                {
                    write_error = Some(e.into());
                    pipeline.send(Control::Stop);
                }
                progress.inc(1);
                progress.set_message(run_output::progress_message(&result, &dir, started));
            }
            PipelineEvent::Warning(w) => progress.println(format!("warning: {w}")),
            PipelineEvent::Error { stage, message } => {
                progress.println(format!("error ({stage}): {message}"));
                // The map so far is kept: stop here and write what there is.
                pipeline.send(Control::Stop);
            }
            PipelineEvent::SessionReset { reason } => {
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
    let recorded = recorder.map(SessionRecorder::finish);
    // The cloud and trajectory come from the recording, so it is finished first.
    let finished = match recorded {
        Some(_) => dir.finish(&summary).map(Some),
        None => dir.write_summary(&summary).map(|()| None),
    };
    let exported = match finished {
        Ok(exported) => exported,
        Err(e) => {
            if write_error.is_none() {
                write_error = Some(e.into());
            }
            None
        }
    };
    run_output::print_summary(&summary, &dir);
    if let Some(first) = summary.first_result_s {
        println!(
            "startup:    model ready {pipeline_started:.2} s after launch, session prepared in {:.2} s, first result at {:.2} s",
            summary.session_start_s,
            pipeline_started + first
        );
    }
    if let Some(signal) = interrupted.signal() {
        println!("stopped:    interrupted ({signal}); the session holds every frame processed");
    }
    if let Some(recorded) = &recorded {
        run_output::print_recorded(recorded);
    }
    if let Some(exported) = &exported {
        run_output::print_exported(exported);
    }
    let disk_full = recorded.as_ref().is_some_and(|r| r.disk_full)
        || write_error
            .as_ref()
            .and_then(|e| e.downcast_ref::<crate::record::RecordError>())
            .is_some_and(|e| e.is_disk_full());
    if disk_full {
        println!("stopped:    the disk is full");
        let cause = recorded
            .as_ref()
            .and_then(|r| r.error.clone())
            .or_else(|| write_error.as_ref().map(super::error_text))
            .unwrap_or_default();
        // Counted from the file itself: frames still in the recorder's buffer when the disk
        // filled are not in it, whatever the recorder had been handed.
        let kept = match &recorded {
            Some(r) => {
                let frames = crate::record::SessionReader::open(&r.path)
                    .map(|reader| reader.frames().len())
                    .unwrap_or(0);
                format!(
                    "the recording keeps the {frames} frames written before ({}, readable with \
                     `streamrecon export` and `replay`)",
                    r.path.display()
                )
            }
            None => format!("{} frames' JSON were written (no recording)", dir.frames()),
        };
        bail!(
            "the disk holding {} is full: the run stopped after {} frames processed; {kept}{}. \
             Cause: {cause}",
            out.display(),
            summary.frames_processed,
            run_output::missing_outputs(&dir)
        );
    }
    if let Some(recorded) = recorded
        && let Some(e) = recorded.error
    {
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

/// The model options as the session header records them.
fn model_flags(args: &RunArgs) -> ModelFlags<'_> {
    ModelFlags {
        weights: args.weights.as_deref(),
        model_config: args.model_config.as_deref(),
        random_weights: args.random_weights.as_deref(),
    }
}

fn point_filter(args: &RunArgs) -> PointFilter {
    PointFilter {
        min_confidence: args.points.conf_threshold,
        stride: args.points.point_stride,
    }
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
    let video = crate::capture::synthetic::write_sample_video(
        &dir.join(crate::capture::synthetic::SAMPLE_VIDEO_FILE),
    )?;
    println!(
        "wrote {} ({} frames, {}, {} KB)",
        video.path.display(),
        video.frames,
        video.codec,
        video.bytes / 1024
    );
    Ok(())
}

fn pipeline_config(args: &RunArgs) -> anyhow::Result<PipelineConfig> {
    let mut config = args.stream.pipeline_config(args.points.filter()?)?;
    config.max_frames = args.max_frames;
    Ok(config)
}

fn load_model(args: &RunArgs) -> anyhow::Result<Arc<dyn FrameModel>> {
    let config = model_source::config_file(args.model_config.as_deref())?;
    let request = match (&args.random_weights, &args.weights) {
        (Some(_), Some(_)) => bail!("give either --weights or --random-weights, not both"),
        (Some(preset), None) => model_source::random(preset, config, args.backend)?,
        (None, Some(path)) => {
            let path = if path.as_os_str() == "hf" {
                // The terminal's bar is the whole report here.
                model_source::hub_checkpoint(&|_| {})?
            } else {
                path.clone()
            };
            model_source::checkpoint(&path, config, args.backend)
        }
        (None, None) => bail!(
            "no model: give --weights FILE (or `hf`) with --model-config, or --random-weights full|tiny"
        ),
    };
    model_source::load(&request)
}

/// Ctrl-C, SIGTERM or SIGHUP stops the pipeline the way the end of the input does, so the
/// frames' JSON, the recording's index and summary.json are all written for the frames
/// processed; a second signal quits at once (the recording stays readable without its index).
fn stop_on_interrupt(control: crossbeam_channel::Sender<Control>) -> Interrupted {
    interrupt::on_interrupt("the run", move |name| {
        eprintln!("\n{name}: finishing the session ({name} again to quit at once)");
        if control.send(Control::Stop).is_err() {
            // The pipeline has stopped already: the session is being finished anyway.
        }
    })
}
