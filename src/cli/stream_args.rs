//! The options `run` and `view` share, so the two commands spell and check them the same way:
//! how the stream is processed (attention layout, keyframe rule and budget, window), what is
//! asked of a camera, how the input opens, and what a recording's header says.

use std::path::Path;

use anyhow::{Context, bail};

use crate::attention::AttentionLayout;
use crate::capture::{
    CameraSelector, CorruptFilePolicy, DecodeLimits, InputSpec, Source, SourceOptions,
    SyntheticPlay, VideoCut, list_cameras, open_source,
};
use crate::pipeline::keyframe::TRAINED_VIEWS;
use crate::pipeline::{
    FramesPerStep, KeyframePolicy, KeyframeRule, ModelLimits, OnBudget, PipelineConfig, PointFilter,
};

#[derive(Debug, Clone, clap::Args)]
pub struct StreamArgs {
    /// KV layout of the global attention.
    #[arg(long, value_enum, default_value_t = AttentionLayout::Paged)]
    pub attention: AttentionLayout,
    /// Keyframe rule: `fixed:N`, `adaptive` or `adaptive:BASE`. Default: for a folder the
    /// reference's ceil(N / budget), for a live input `adaptive`.
    #[arg(long)]
    pub keyframes: Option<String>,
    /// Keyframe every N frames: the same as `--keyframes fixed:N`.
    #[arg(long, value_name = "N", conflicts_with = "keyframes")]
    pub keyframe_interval: Option<u64>,
    /// Committed frames per session (capped by the model's RoPE table).
    #[arg(long, default_value_t = TRAINED_VIEWS)]
    pub view_budget: u64,
    /// What happens when the budget is spent.
    #[arg(long, value_enum, default_value_t = OnBudget::Freeze)]
    pub on_budget: OnBudget,
    /// Sliding window of keyframes (default: the model config's; at most the model's
    /// temporal table).
    #[arg(long)]
    pub window: Option<usize>,
    /// Streaming frames per model call: 1, or 2 (two frames through the model at once, each
    /// attending to what it would see alone: a frame period more latency for fewer, fuller
    /// calls). 2 is for file sources: folders, videos, the synthetic room unpaced.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub frames_per_step: u8,
}

/// Refuses a `--window` the model cannot hold before anything is written: its RoPE table
/// bounds the frames attention can ever see, so a larger window only allocates pages.
pub fn check_window(window: Option<usize>, limits: &ModelLimits) -> anyhow::Result<()> {
    if let Some(w) = window
        && w > limits.max_frame_num
    {
        bail!(
            "--window {w}: this model attends to at most {} frames (its temporal table, \
             max_frame_num); give a window of at most that",
            limits.max_frame_num
        );
    }
    Ok(())
}

impl StreamArgs {
    /// The pipeline's settings from these options; `points` differs per command.
    pub fn pipeline_config(&self, points: PointFilter) -> anyhow::Result<PipelineConfig> {
        if points.stride == 0 {
            bail!("--point-stride must be at least 1, got 0");
        }
        if !points.min_confidence.is_finite() {
            bail!(
                "--conf-threshold must be a finite number, got {}",
                points.min_confidence
            );
        }
        if self.window == Some(0) {
            bail!("--window must be at least 1 keyframe, got 0");
        }
        if self.view_budget == 0 {
            bail!("--view-budget must be at least 1, got 0");
        }
        let frames_per_step = FramesPerStep::try_from(usize::from(self.frames_per_step))
            .map_err(|e| anyhow::anyhow!("--frames-per-step {}: {e}", self.frames_per_step))?;
        Ok(PipelineConfig {
            layout: self.attention,
            window: self.window,
            keyframes: self.keyframe_policy()?,
            points,
            frames_per_step,
            ..PipelineConfig::default()
        })
    }

    /// `None` leaves the rule to the pipeline, which picks it from the source.
    fn keyframe_policy(&self) -> anyhow::Result<Option<KeyframePolicy>> {
        if self.keyframe_interval == Some(0) {
            bail!("--keyframe-interval must be at least 1 (every frame a keyframe), got 0");
        }
        let rule_text = self
            .keyframes
            .clone()
            .or_else(|| self.keyframe_interval.map(|n| format!("fixed:{n}")));
        Ok(match &rule_text {
            Some(rule) => Some(KeyframePolicy {
                rule: rule
                    .parse::<KeyframeRule>()
                    .map_err(|e| anyhow::anyhow!("--keyframes `{rule}`: {e}"))?,
                view_budget: self.view_budget,
                on_budget: self.on_budget,
            }),
            // The rule is chosen from the source; the budget and its action still apply.
            None if self.view_budget != KeyframePolicy::default().view_budget
                || self.on_budget != OnBudget::default() =>
            {
                Some(KeyframePolicy {
                    view_budget: self.view_budget,
                    on_budget: self.on_budget,
                    ..KeyframePolicy::default()
                })
            }
            None => None,
        })
    }
}

/// Points kept per frame: `run` and `view` share the flags and their defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct PointArgs {
    /// Points with confidence at or below this are dropped (a finite number; the model's
    /// confidence is at least 1).
    #[arg(long, default_value_t = DEFAULT_CONF_THRESHOLD, allow_hyphen_values = true)]
    pub conf_threshold: f32,
    /// Keep every n-th point that passes the confidence filter (at least 1).
    #[arg(long, default_value_t = DEFAULT_POINT_STRIDE)]
    pub point_stride: usize,
}

/// The confidence threshold of `run` and `view` by default.
pub const DEFAULT_CONF_THRESHOLD: f32 = 1.5;
/// Every 4th point: the viewer's long-standing default, now `run`'s too (it wrote every 10th).
pub const DEFAULT_POINT_STRIDE: usize = 4;

impl PointArgs {
    /// The filter, with each value checked and its flag named.
    pub fn filter(&self) -> anyhow::Result<PointFilter> {
        if !self.conf_threshold.is_finite() {
            bail!(
                "--conf-threshold must be a finite number, got {}",
                self.conf_threshold
            );
        }
        if self.point_stride == 0 {
            bail!("--point-stride must be at least 1, got 0");
        }
        Ok(PointFilter {
            min_confidence: self.conf_threshold,
            stride: self.point_stride,
        })
    }
}

/// The largest `--max-image-megapixels`: beyond it one image's decode alone needs tens of GB.
const MAX_IMAGE_MEGAPIXELS: f64 = 1_000.0;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct CameraArgs {
    /// Camera resolution request, `WIDTHxHEIGHT` (default: the camera's own).
    #[arg(long)]
    pub resolution: Option<String>,
    /// Frames per second: a camera's frame-rate request (default: the camera's own); for a
    /// video, use at most this many frames per second of video time; for a folder whose file
    /// names carry no times, the spacing of the frames' times (default: one second apart).
    #[arg(long, allow_negative_numbers = true)]
    pub fps: Option<f64>,
    /// Video: use every N-th frame (after --fps).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub every: Option<u64>,
    /// Video: start this many seconds into the video (its presentation time).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub start: Option<f64>,
    /// Video: use this many seconds of it from --start.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Folder images above this many megapixels are refused from their header, before any
    /// memory is taken for them (skipped with a warning naming the file; an error with
    /// --strict). Default 64.
    #[arg(long, value_name = "MP", allow_negative_numbers = true)]
    pub max_image_megapixels: Option<f64>,
    /// Deliver a folder or the synthetic room at this many frames per second, as a live camera
    /// would: inference takes the newest frame and the frames it had no time for count as
    /// dropped.
    #[arg(long, value_name = "FPS", allow_negative_numbers = true)]
    pub pace: Option<f64>,
}

impl CameraArgs {
    /// How to open an input: these camera requests, and what the command does with the
    /// synthetic room and with a folder file that does not decode.
    pub fn source_options(
        &self,
        synthetic: SyntheticPlay,
        corrupt_files: CorruptFilePolicy,
    ) -> anyhow::Result<SourceOptions> {
        if let Some(fps) = self.fps
            && !(fps.is_finite() && fps > 0.0 && fps <= 1000.0)
        {
            bail!("--fps {fps}: expected frames per second, above 0 and at most 1000");
        }
        if self.every == Some(0) {
            bail!("--every must be at least 1 (every frame), got 0");
        }
        if let Some(s) = self.start
            && !(s.is_finite() && s >= 0.0)
        {
            bail!("--start {s}: expected seconds, 0 or more");
        }
        if let Some(d) = self.duration
            && !(d.is_finite() && d > 0.0)
        {
            bail!("--duration {d}: expected seconds, above 0");
        }
        Ok(SourceOptions {
            resolution: self
                .resolution
                .as_deref()
                .map(parse_resolution)
                .transpose()?,
            fps: self.fps,
            video: VideoCut {
                every: self.every.unwrap_or(1),
                fps: None,
                start_s: self.start.unwrap_or(0.0),
                duration_s: self.duration,
            },
            synthetic,
            corrupt_files,
            pace: self.pace.map(check_pace).transpose()?,
        })
    }

    /// What a folder image may ask of memory; `strict` also refuses partial (cut) images.
    pub fn decode_limits(&self, strict: bool) -> anyhow::Result<DecodeLimits> {
        let mut limits = DecodeLimits {
            reject_partial: strict,
            ..DecodeLimits::default()
        };
        if let Some(mp) = self.max_image_megapixels {
            if !(mp.is_finite() && mp > 0.0 && mp <= MAX_IMAGE_MEGAPIXELS) {
                bail!(
                    "--max-image-megapixels must be a number above 0 and at most \
                     {MAX_IMAGE_MEGAPIXELS}, got {mp}"
                );
            }
            limits.max_pixels = (mp * 1e6) as u64;
        }
        Ok(limits)
    }

    /// Checks every camera request even where no camera is opened (`view --input demo`), so a
    /// mistyped value is never silently ignored.
    pub fn check(&self) -> anyhow::Result<()> {
        self.source_options(SyntheticPlay::Frames(1), CorruptFilePolicy::Skip)?;
        self.decode_limits(false)?;
        Ok(())
    }
}

/// `--pace` as given, if it is a frame rate a clock can keep.
fn check_pace(fps: f64) -> anyhow::Result<f64> {
    if fps.is_finite() && fps > 0.0 && fps <= 1000.0 {
        Ok(fps)
    } else {
        bail!("--pace {fps}: expected frames per second, above 0 and at most 1000")
    }
}

/// Refuses two frames a step on a live input (a camera, `--pace`), before the model loads.
pub fn check_frames_per_step(config: &PipelineConfig, source: &dyn Source) -> anyhow::Result<()> {
    config
        .check_source(source)
        .with_context(|| format!("--frames-per-step {}", config.frames_per_step.count()))
}

/// Opens `--input`; a folder that cannot be read says what else `--input` takes.
pub fn open_input(spec: &InputSpec, options: &SourceOptions) -> anyhow::Result<Box<dyn Source>> {
    let opened = open_source(spec, options);
    Ok(match spec {
        InputSpec::Folder(dir) => opened.with_context(|| folder_input_context(dir))?,
        _ => opened?,
    })
}

/// `--weights`, `--model-config` and `--random-weights` as given, for a session header.
#[derive(Debug, Clone, Copy)]
pub struct ModelFlags<'a> {
    pub weights: Option<&'a Path>,
    pub model_config: Option<&'a Path>,
    pub random_weights: Option<&'a str>,
}

/// What the header of a recording says about how it was made; `run` and `view` write the
/// same keys.
pub fn session_config(
    command: &str,
    input: &str,
    model: ModelFlags<'_>,
    stream: &StreamArgs,
    points: PointFilter,
) -> serde_json::Value {
    serde_json::json!({
        "command": command,
        "input": input,
        "weights": model.weights.map(|p| p.display().to_string()),
        "model_config": model.model_config.map(|p| p.display().to_string()),
        "random_weights": model.random_weights,
        "attention": stream.attention.to_string(),
        "window": stream.window,
        "keyframes": stream.keyframes,
        "keyframe_interval": stream.keyframe_interval,
        "view_budget": stream.view_budget,
        "on_budget": stream.on_budget.to_string(),
        "frames_per_step": stream.frames_per_step,
        "conf_threshold": points.min_confidence,
        "point_stride": points.stride,
    })
}

/// The input when `--input` is not given: the first camera, else the synthetic room.
pub fn default_input() -> InputSpec {
    if list_cameras().is_empty() {
        tracing::info!("no camera found: using the synthetic room (--input synthetic)");
        InputSpec::Synthetic
    } else {
        InputSpec::Webcam(CameraSelector::Index(0))
    }
}

/// Context for an `--input` that named no camera or built-in source and is no readable folder:
/// most often a mistyped source name, which would otherwise read as a bare "no such file".
fn folder_input_context(dir: &std::path::Path) -> String {
    format!(
        "--input {}: read as an image folder (other inputs: webcam:N, webcam:NAME, synthetic, \
         a video file, demo)",
        dir.display()
    )
}

fn parse_resolution(s: &str) -> anyhow::Result<(u32, u32)> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .with_context(|| format!("--resolution `{s}`: expected WIDTHxHEIGHT"))?;
    let parse = |side: &str, what: &str| -> anyhow::Result<u32> {
        match side.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("--resolution `{s}`: the {what} must be a positive whole number"),
        }
    };
    Ok((parse(w, "width")?, parse(h, "height")?))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        stream: StreamArgs,
        #[command(flatten)]
        camera: CameraArgs,
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("test").chain(args.iter().copied()))
    }

    fn config(args: &[&str]) -> anyhow::Result<PipelineConfig> {
        parse(args)?.stream.pipeline_config(PointFilter::default())
    }

    #[test]
    fn defaults_leave_the_rule_to_the_pipeline() {
        let c = config(&[]).expect("defaults");
        assert_eq!(c.layout, AttentionLayout::Paged);
        assert!(c.keyframes.is_none() && c.window.is_none());
    }

    #[test]
    fn keyframe_options_become_a_policy() {
        let c = config(&["--keyframes", "adaptive", "--on-budget", "reset"]).expect("adaptive");
        let policy = c.keyframes.expect("a policy");
        assert!(matches!(policy.rule, KeyframeRule::Adaptive { .. }));
        assert_eq!(policy.on_budget, OnBudget::Reset);

        let c = config(&["--keyframe-interval", "3"]).expect("fixed");
        assert_eq!(
            c.keyframes.map(|p| p.rule),
            Some(KeyframeRule::Fixed { interval: 3 })
        );

        let c = config(&["--view-budget", "100"]).expect("budget only");
        assert_eq!(c.keyframes.map(|p| p.view_budget), Some(100));
    }

    #[test]
    fn bad_values_name_the_option() {
        let err = config(&["--keyframe-interval", "0"]).expect_err("interval 0");
        assert!(err.to_string().contains("--keyframe-interval"), "{err}");
        assert!(!err.to_string().contains("fixed:0"), "{err}");
        // Values clap knows are refused by clap, with the ones it takes.
        for (option, bad) in [("--on-budget", "later"), ("--attention", "sparse")] {
            let err = parse(&[option, bad]).err().expect("refused").to_string();
            assert!(err.contains(bad) && err.contains(option), "{err}");
            assert!(err.contains("possible values"), "{err}");
        }
        assert!(parse(&["--keyframes", "adaptive", "--keyframe-interval", "2"]).is_err());
        let stride_zero = parse(&[])
            .expect("defaults")
            .stream
            .pipeline_config(PointFilter {
                stride: 0,
                ..PointFilter::default()
            });
        assert!(stride_zero.is_err());
    }

    #[test]
    fn frames_per_step_is_one_or_two() {
        assert_eq!(
            config(&[]).expect("default").frames_per_step,
            FramesPerStep::One
        );
        assert_eq!(
            config(&["--frames-per-step", "2"])
                .expect("two")
                .frames_per_step,
            FramesPerStep::Two
        );
        for bad in ["0", "3", "two"] {
            let err = parse(&["--frames-per-step", bad])
                .err()
                .expect("refused by clap")
                .to_string();
            assert!(
                err.contains("--frames-per-step") && err.contains(bad),
                "{err}"
            );
        }
    }

    #[test]
    fn camera_requests_parse_and_refuse_nonsense() {
        let options = |cli: &Cli| {
            cli.camera
                .source_options(SyntheticPlay::Frames(1), CorruptFilePolicy::Skip)
        };
        let cli = parse(&["--resolution", "1280x720", "--fps", "30"]).expect("parses");
        let request = options(&cli).expect("request");
        assert_eq!(request.resolution, Some((1280, 720)));
        assert_eq!(request.fps, Some(30.0));
        let cli = parse(&["--every", "2", "--start", "1.5", "--duration", "3"]).expect("parses");
        let cut = options(&cli).expect("cut").video;
        assert_eq!(
            (cut.every, cut.start_s, cut.duration_s),
            (2, 1.5, Some(3.0))
        );
        for (flag, bad) in [
            ("--every", "0"),
            ("--start", "-1"),
            ("--duration", "0"),
            ("--fps", "0"),
        ] {
            let cli = parse(&[flag, bad]).expect("clap takes the number");
            let err = options(&cli).expect_err(bad);
            assert!(err.to_string().contains(flag), "{err}");
        }
        for bad in ["1280", "0x720", "wide x tall", "1280x-1"] {
            let cli = parse(&["--resolution", bad]).expect("clap takes any text");
            let err = options(&cli).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
