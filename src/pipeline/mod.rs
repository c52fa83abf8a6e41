//! Capture, inference and consumer threads joined by bounded channels.
//!
//! ```text
//!  capture thread ──InputFrame──▶ inference thread ──PipelineEvent──▶ consumers
//!  (source, decode,  (bounded)    (owns the model       (Lossless: recorder,
//!   preprocess)                    session)              Latest: viewer)
//!        ▲                            ▲
//!        └──── stop flag ─────────────┴──── Control (pause, reset, layout, window, keyframes)
//! ```
//! See docs/pipeline.md for the threading rules, drop accounting and the keyframe policy.

pub mod capture_thread;
pub mod control;
pub mod error;
pub mod frame;
pub mod inference;
pub mod keyframe;
pub mod model;
pub mod summary;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::thread::JoinHandle;

use crossbeam_channel::{Sender, bounded, unbounded};

use crate::attention::AttentionLayout;
use crate::capture::Source;

pub use control::{Control, Delivery, Outputs, PipelineEvent};
pub use error::PipelineError;
pub use frame::PointFilter;
pub use keyframe::{KeyframePolicy, KeyframeRule, KeyframeScheduler, OnBudget};
pub use model::{
    CallImages, CpuFrameModel, FrameModel, ModelLimits, ModelSession, ModelStep, PairCall,
    PairSubmitted, SessionOptions, Submitted,
};
pub use summary::PipelineSummary;

use capture_thread::{CaptureCounters, CaptureLoop};
use inference::{Inference, SessionSettings};

/// How a pipeline runs.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    pub layout: AttentionLayout,
    /// Sliding window of keyframes; `None` takes the model's.
    pub window: Option<usize>,
    /// `None`: the model's fixed interval for sources of known length... see
    /// [`PipelineConfig::keyframes_for`].
    pub keyframes: Option<KeyframePolicy>,
    pub points: PointFilter,
    /// Stop after this many captured frames.
    pub max_frames: Option<u64>,
    /// Frames a non-live source may queue ahead of inference (live sources queue one).
    pub queue: usize,
    /// Streaming frames per model call: two a step trade a frame of latency for fewer, fuller
    /// calls (file sources only; see [`PipelineConfig::check_source`]).
    pub frames_per_step: FramesPerStep,
}

/// How many streaming frames go into one model call (after the scale frames, which are one
/// call of their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FramesPerStep {
    #[default]
    One,
    /// Each frame is held until the next arrives and the two run as one step
    /// ([`ModelSession::submit_pair`]): each frame's result waits for the next frame.
    Two,
}

impl FramesPerStep {
    pub fn count(self) -> usize {
        match self {
            FramesPerStep::One => 1,
            FramesPerStep::Two => 2,
        }
    }
}

/// A frames-per-step count other than 1 or 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} frames a step: a step takes 1 or 2 streaming frames")]
pub struct BadFramesPerStep(pub usize);

impl TryFrom<usize> for FramesPerStep {
    type Error = BadFramesPerStep;
    fn try_from(n: usize) -> Result<Self, Self::Error> {
        match n {
            1 => Ok(FramesPerStep::One),
            2 => Ok(FramesPerStep::Two),
            _ => Err(BadFramesPerStep(n)),
        }
    }
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            layout: AttentionLayout::Paged,
            window: None,
            keyframes: None,
            points: PointFilter::default(),
            max_frames: None,
            queue: 2,
            frames_per_step: FramesPerStep::One,
        }
    }
}

impl PipelineConfig {
    /// Whether `source` can run with these settings: two frames a step need a file source. A
    /// live source's frames come one at a time, newest first; holding one for the next would add
    /// a frame period of latency to every result, which is what a live view must not pay.
    pub fn check_source(&self, source: &dyn Source) -> Result<(), PipelineError> {
        if self.frames_per_step == FramesPerStep::Two && source.is_live() {
            return Err(PipelineError::PairsNeedFileSource(source.describe()));
        }
        Ok(())
    }

    /// The keyframe policy for a source: the configured one, else for a source of known
    /// length the reference's `ceil(N / 320)` (or the model config's interval if larger), and
    /// for an endless source the adaptive policy.
    pub fn keyframes_for(&self, source: &dyn Source, limits: &ModelLimits) -> KeyframePolicy {
        if let Some(p) = self.keyframes {
            return p;
        }
        let defaults = KeyframePolicy::default();
        match source.remaining_hint() {
            Some(total) if !source.is_live() => {
                let mut p = KeyframePolicy::for_known_length(total, defaults.view_budget);
                if let KeyframeRule::Fixed { interval } = &mut p.rule {
                    *interval = (*interval).max(limits.default_keyframe_interval as u64);
                }
                p
            }
            _ => defaults,
        }
    }
}

/// A running pipeline. Dropping it asks the threads to stop without waiting for them.
pub struct Pipeline {
    control: Sender<Control>,
    inference: Option<JoinHandle<()>>,
    keyframes: KeyframePolicy,
}

impl Pipeline {
    /// Start the capture and inference threads. Errors here are configuration errors (e.g. a
    /// keyframe budget the model cannot hold); runtime problems arrive as events.
    pub fn start(
        source: Box<dyn Source>,
        model: Arc<dyn FrameModel>,
        config: PipelineConfig,
        outputs: Outputs,
    ) -> Result<Pipeline, PipelineError> {
        config.check_source(source.as_ref())?;
        let limits = model.limits();
        let keyframes = config.keyframes_for(source.as_ref(), &limits);
        // Fail now rather than at the first frame.
        KeyframeScheduler::new(keyframes, limits.scale_frames, limits.max_frame_num)?;
        let settings = SessionSettings {
            layout: config.layout,
            window: config.window.unwrap_or(limits.default_window),
            keyframes,
            frames_per_step: config.frames_per_step,
        };
        let mut source = source;
        // The model's session is prepared for this size before the first frame is read.
        let prepare = source.frame_size_hint().and_then(|(w, h)| {
            crate::model::preprocess::target_size(w as usize, h as usize, &limits.preprocess)
                .ok()
                .map(|(width, _, height)| (height, width))
        });
        let live = source.is_live();
        // A live source's queue holds one frame, or while a session starts its scale frames
        // (`live_queue`, set by inference); the channel is sized for the larger.
        let scale_queue = limits.scale_frames.max(1);
        let (frames_tx, frames_rx) = bounded(if live {
            scale_queue
        } else {
            config.queue.max(1)
        });
        let live_queue = Arc::new(AtomicUsize::new(scale_queue));
        let (ready_tx, ready_rx) = bounded(1);
        let (notes_tx, notes_rx) = unbounded();
        let (control_tx, control_rx) = unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(CaptureCounters::default());
        let summary = PipelineSummary {
            source: source.describe(),
            model: model.describe(),
            ..PipelineSummary::default()
        };
        let capture = CaptureLoop {
            source,
            preprocess: limits.preprocess.clone(),
            preprocess_on_device: limits.preprocesses_on_device,
            frames: frames_tx,
            frames_back: frames_rx.clone(),
            notes: notes_tx,
            stop: Arc::clone(&stop),
            counters: Arc::clone(&counters),
            max_frames: config.max_frames,
            ready: ready_rx,
            live_queue: Arc::clone(&live_queue),
        };
        let mut inference = Inference::new(
            model,
            outputs,
            settings,
            config.points,
            frames_rx,
            notes_rx,
            control_rx,
            stop,
            counters,
            summary,
        );
        inference.prepare = prepare;
        inference.ready = Some(ready_tx);
        inference.live_queue = live.then_some(live_queue);
        let capture_handle = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || capture.run())
            .map_err(|e| PipelineError::Spawn("capture", e))?;
        inference.capture_thread = Some(capture_handle);
        let inference_handle = std::thread::Builder::new()
            .name("inference".into())
            .spawn(move || inference.run())
            .map_err(|e| PipelineError::Spawn("inference", e))?;
        Ok(Pipeline {
            control: control_tx,
            inference: Some(inference_handle),
            keyframes,
        })
    }

    /// A handle for sending control requests from any thread.
    pub fn control(&self) -> Sender<Control> {
        self.control.clone()
    }

    /// Send one request. Fails only when the inference thread has already stopped.
    pub fn send(&self, control: Control) -> bool {
        self.control.send(control).is_ok()
    }

    /// The keyframe policy the first session runs with.
    pub fn keyframe_policy(&self) -> KeyframePolicy {
        self.keyframes
    }

    /// Ask to stop and wait for both threads. Lossless consumers must keep reading (or be
    /// dropped) until then, or inference waits on them.
    pub fn stop_and_join(mut self) {
        self.ask_to_stop();
        self.join_threads();
    }

    /// Sends `Stop`. It fails only when the inference thread has stopped already, which is
    /// what was asked.
    fn ask_to_stop(&self) {
        if !self.send(Control::Stop) {
            tracing::trace!("the inference thread had stopped already");
        }
    }

    /// Wait for the threads without asking them to stop (after a `Stop` sent elsewhere).
    pub fn join(mut self) {
        self.join_threads();
    }

    fn join_threads(&mut self) {
        if let Some(h) = self.inference.take()
            && h.join().is_err()
        {
            tracing::error!("the inference thread panicked");
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.ask_to_stop();
    }
}
