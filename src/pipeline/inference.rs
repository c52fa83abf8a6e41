//! The inference thread: owns the model session (and so all backend state), runs one call at
//! a time, applies control requests between calls and publishes results.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, never, select};

use crate::attention::AttentionLayout;

use super::capture_thread::{CaptureCounters, CaptureNote, FramePixels, InputFrame};
use super::control::{Control, Outputs, PipelineEvent};
use super::frame::{CallContext, PointFilter, build_results};
use super::keyframe::{Decision, KeyframePolicy, KeyframeScheduler};
use super::model::{
    CallImages, FrameModel, ModelLimits, ModelSession, ModelStep, SessionOptions, Submitted,
};
use super::summary::{PipelineSummary, StageSums};
use crate::frame::FrameType;

/// Settings a session is built with; changes wait for a reset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SessionSettings {
    pub layout: AttentionLayout,
    pub window: usize,
    pub keyframes: KeyframePolicy,
}

struct Session {
    model: Box<dyn ModelSession>,
    height: usize,
    width: usize,
    scheduler: KeyframeScheduler,
    /// Frames waiting for the scale call.
    scale_buffer: Vec<(InputFrame, Instant)>,
    scale_done: bool,
    /// Calls queued on the backend, oldest first, waiting for their outputs.
    in_flight: VecDeque<Call>,
    /// A live source may queue the scale frames until the session's first results are out and
    /// the queue it built up meanwhile has been taken.
    live_grace: bool,
    first_results_out: bool,
}

/// One model call's frames and kind.
struct Call {
    frames: Vec<(InputFrame, Instant)>,
    frame_type: FrameType,
}

pub(crate) struct Inference {
    pub model: Arc<dyn FrameModel>,
    pub limits: ModelLimits,
    pub outputs: Outputs,
    pub settings: SessionSettings,
    pub pending: SessionSettings,
    pub filter: PointFilter,
    pub frames: Receiver<InputFrame>,
    pub notes: Receiver<CaptureNote>,
    pub control: Receiver<Control>,
    pub capture_stop: Arc<AtomicBool>,
    pub capture_counters: Arc<CaptureCounters>,
    pub capture_thread: Option<JoinHandle<()>>,
    pub summary: PipelineSummary,
    /// The session's size, known before the first frame (see `Source::frame_size_hint`).
    pub prepare: Option<(usize, usize)>,
    /// Told when inference is ready for frames (dropped: go anyway).
    pub ready: Option<crossbeam_channel::Sender<()>>,
    /// A live source's queue limit (None for other sources).
    pub live_queue: Option<Arc<AtomicUsize>>,
    pub stage_sums: StageSums,
    pub started: Instant,
    /// When the first result went out, and how many had gone out then.
    first_result: Option<(Instant, u64)>,
    last_result: Option<Instant>,
    session: Option<Session>,
    paused: bool,
    input_done: bool,
    notes_done: bool,
    stopping: bool,
}

impl Inference {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        model: Arc<dyn FrameModel>,
        outputs: Outputs,
        settings: SessionSettings,
        filter: PointFilter,
        frames: Receiver<InputFrame>,
        notes: Receiver<CaptureNote>,
        control: Receiver<Control>,
        capture_stop: Arc<AtomicBool>,
        capture_counters: Arc<CaptureCounters>,
        summary: PipelineSummary,
    ) -> Self {
        let limits = model.limits();
        Inference {
            model,
            limits,
            outputs,
            settings,
            pending: settings,
            filter,
            frames,
            notes,
            control,
            capture_stop,
            capture_counters,
            capture_thread: None,
            summary,
            prepare: None,
            ready: None,
            live_queue: None,
            stage_sums: StageSums::default(),
            started: Instant::now(),
            first_result: None,
            last_result: None,
            session: None,
            paused: false,
            input_done: false,
            notes_done: false,
            stopping: false,
        }
    }

    pub(crate) fn run(mut self) {
        if let Some((height, width)) = self.prepare {
            // A failure here is reported like any session that cannot open; the first frame
            // tries again.
            self.open_session(height, width);
        }
        if let Some(ready) = self.ready.take()
            && ready.send(()).is_err()
        {
            tracing::debug!("the capture thread had stopped before inference was ready");
        }
        let no_frames = never::<InputFrame>();
        let no_notes = never::<CaptureNote>();
        while !self.stopping {
            self.end_live_grace();
            // Overlap only pays when the next frame is already here: otherwise the newest
            // result is worth more than a queued call (a live source's latency).
            if self.frames.is_empty() || self.paused || self.input_done {
                self.finish_in_flight();
            }
            let frames = if self.paused || self.input_done {
                &no_frames
            } else {
                &self.frames
            };
            let notes = if self.notes_done {
                &no_notes
            } else {
                &self.notes
            };
            select! {
                recv(self.control) -> msg => match msg {
                    Ok(c) => self.on_control(c),
                    // Every handle is gone: nobody can stop us later, so stop now.
                    Err(_) => self.stopping = true,
                },
                recv(notes) -> note => match note {
                    Ok(n) => self.on_note(n),
                    Err(_) => self.notes_done = true,
                },
                recv(frames) -> frame => match frame {
                    Ok(f) => self.on_frame(f, Instant::now()),
                    Err(_) => self.on_input_done(),
                },
            }
        }
        self.shut_down();
    }

    fn on_control(&mut self, control: Control) {
        match control {
            Control::Pause => {
                self.paused = true;
                self.outputs.publish(PipelineEvent::Paused(true));
            }
            Control::Resume => {
                self.paused = false;
                self.outputs.publish(PipelineEvent::Paused(false));
            }
            Control::Reset => self.reset("requested"),
            Control::SetAttention(layout) => self.pending.layout = layout,
            Control::SetKeyframePolicy(policy) => self.pending.keyframes = policy,
            Control::SetWindow(window) => self.pending.window = window,
            Control::Stop => self.stopping = true,
        }
    }

    fn on_note(&mut self, note: CaptureNote) {
        match note {
            CaptureNote::Warning(w) => self.warn(w),
            CaptureNote::Failed(message) => {
                self.summary.errors.push(message.clone());
                self.outputs.publish(PipelineEvent::Error {
                    stage: "capture",
                    message,
                });
            }
            CaptureNote::Ended => self.summary.input_ended = true,
        }
    }

    fn warn(&mut self, w: String) {
        tracing::warn!("{w}");
        self.summary.warnings.push(w.clone());
        self.outputs.publish(PipelineEvent::Warning(w));
    }

    /// The capture thread has exited and every frame it sent has been taken.
    fn on_input_done(&mut self) {
        self.input_done = true;
        // Notes were sent before the capture thread dropped its frame sender: read them so the
        // reason (end or failure) is known.
        while let Ok(n) = self.notes.try_recv() {
            self.on_note(n);
        }
        self.notes_done = true;
        // Fewer frames than the scale call wants: run them as the scale call.
        self.flush_scale_buffer();
        if self.summary.input_ended {
            self.outputs.publish(PipelineEvent::InputEnded);
        }
    }

    fn reset(&mut self, reason: &str) {
        // The old session's results go out before the reset does.
        self.finish_in_flight();
        if let Some(s) = self.session.take() {
            self.summary.frames_discarded += s.scale_buffer.len() as u64;
        }
        if self.pending.keyframes != self.settings.keyframes
            && let Err(e) = KeyframeScheduler::new(
                self.pending.keyframes,
                self.limits.scale_frames,
                self.limits.max_frame_num,
            )
        {
            self.warn(format!("keyframe policy not applied: {e}"));
            self.pending.keyframes = self.settings.keyframes;
        }
        self.settings = self.pending;
        self.outputs.publish(PipelineEvent::SessionReset {
            reason: reason.to_owned(),
        });
    }

    fn open_session(&mut self, height: usize, width: usize) -> Option<&mut Session> {
        let options = SessionOptions {
            layout: self.settings.layout,
            window: self.settings.window,
        };
        let scheduler = KeyframeScheduler::new(
            self.settings.keyframes,
            self.limits.scale_frames,
            self.limits.max_frame_num,
        );
        let warm_up = Instant::now();
        let opened = scheduler.map_err(|e| e.to_string()).and_then(|scheduler| {
            self.model
                .start_session(height, width, options)
                .and_then(|mut model| {
                    model.set_point_filter(self.filter);
                    model.warm_up()?;
                    Ok((model, scheduler))
                })
                .map_err(|e| e.to_string())
        });
        self.summary.session_start_s += warm_up.elapsed().as_secs_f64();
        match opened {
            Ok((model, scheduler)) => {
                self.summary.sessions += 1;
                self.session = Some(Session {
                    model,
                    height,
                    width,
                    scheduler,
                    scale_buffer: Vec::new(),
                    scale_done: false,
                    in_flight: VecDeque::new(),
                    live_grace: true,
                    first_results_out: false,
                });
                if let Some(limit) = &self.live_queue {
                    limit.store(self.limits.scale_frames.max(1), Ordering::Release);
                }
                self.session.as_mut()
            }
            Err(message) => {
                self.summary.errors.push(message.clone());
                self.outputs.publish(PipelineEvent::Error {
                    stage: "inference",
                    message,
                });
                None
            }
        }
    }

    fn on_frame(&mut self, frame: InputFrame, received_at: Instant) {
        // A session prepared from the source's size hint that the first frame does not fit (the
        // hinted file did not decode, the next is another size) is opened again at its size.
        let unused_misfit = self.session.as_ref().is_some_and(|s| {
            !s.scale_done
                && s.scale_buffer.is_empty()
                && (s.height, s.width) != (frame.height, frame.width)
        });
        if unused_misfit {
            self.session = None;
            self.summary.sessions = self.summary.sessions.saturating_sub(1);
        }
        if self.session.is_none() && self.open_session(frame.height, frame.width).is_none() {
            self.summary.frames_skipped += 1;
            return;
        }
        let Some(session) = self.session.as_mut() else {
            return;
        };
        if (frame.height, frame.width) != (session.height, session.width) {
            let name = frame.origin.name.clone();
            let msg = format!(
                "skipped {name}: {}×{} after preprocessing, the session runs at {}×{}",
                frame.width, frame.height, session.width, session.height
            );
            self.summary.frames_skipped += 1;
            self.warn(msg);
            return;
        }
        if !session.scale_done {
            session.scale_buffer.push((frame, received_at));
            if session.scale_buffer.len() >= self.limits.scale_frames {
                self.flush_scale_buffer();
            }
            return;
        }
        let committed = session.model.committed_frames();
        match session.scheduler.decide(committed) {
            Decision::Reset => {
                self.reset("keyframe budget spent");
                self.on_frame(frame, received_at);
            }
            Decision::Keyframe => self.run_call(vec![(frame, received_at)], FrameType::Keyframe),
            Decision::NonKeyframe => {
                self.run_call(vec![(frame, received_at)], FrameType::NonKeyframe)
            }
        }
    }

    fn flush_scale_buffer(&mut self) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        if session.scale_done || session.scale_buffer.is_empty() {
            return;
        }
        session.scale_done = true;
        let frames = std::mem::take(&mut session.scale_buffer);
        self.run_call(frames, FrameType::Scale);
    }

    /// Back to a one-frame live queue once the session's first results are out and the frames
    /// queued meanwhile have all been taken.
    fn end_live_grace(&mut self) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        if session.live_grace && session.first_results_out && self.frames.is_empty() {
            session.live_grace = false;
            if let Some(limit) = &self.live_queue {
                limit.store(1, Ordering::Release);
            }
        }
    }

    /// Starts one model call. A backend that queues calls gets the next one while it runs this
    /// one; the oldest is finished once the backend holds as many as it can.
    fn run_call(&mut self, frames: Vec<(InputFrame, Instant)>, frame_type: FrameType) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let n = frames.len();
        // The cache names frames by their capture index, so its events and page map speak
        // the viewer's language. A call needs a contiguous range: the scale frames (whose
        // indices may have gaps where a live source dropped frames) take `first..first + n`,
        // which stays below the next frame's index, so ids keep increasing.
        let first = frames[0].0.index;
        let ids = first..first + n as u64;
        let keyframe = frame_type != FrameType::NonKeyframe;
        let submitted = {
            let host: Vec<&[f32]> = frames
                .iter()
                .filter_map(|(f, _)| match &f.pixels {
                    FramePixels::Host { pixels, .. } => Some(pixels.as_slice()),
                    FramePixels::Decoded(_) => None,
                })
                .collect();
            let decoded: Vec<&crate::frame::RgbImage> = frames
                .iter()
                .filter_map(|(f, _)| match &f.pixels {
                    FramePixels::Decoded(image) => Some(image),
                    FramePixels::Host { .. } => None,
                })
                .collect();
            if decoded.is_empty() {
                // One frame (every streaming call) goes as it is; the scale frames are joined.
                let joined;
                let images: &[f32] = if host.len() == 1 {
                    host[0]
                } else {
                    joined = host.concat();
                    &joined
                };
                session
                    .model
                    .submit(CallImages::Preprocessed(images), ids, keyframe)
            } else if host.is_empty() {
                session
                    .model
                    .submit(CallImages::Decoded(&decoded), ids, keyframe)
            } else {
                Err(crate::model::ModelError::BadInput(
                    "a call mixes host-preprocessed and decoded frames".into(),
                ))
            }
        };
        let call = Call { frames, frame_type };
        match submitted {
            Ok(Submitted::Done(step)) => self.complete_call(call, Ok(*step)),
            Ok(Submitted::Queued) => {
                session.in_flight.push_back(call);
                if session.in_flight.len() >= session.model.max_in_flight() {
                    self.finish_oldest();
                }
            }
            Err(e) => self.complete_call(call, Err(e.to_string())),
        }
    }

    /// Waits for the oldest queued call and publishes its results.
    fn finish_oldest(&mut self) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let Some(call) = session.in_flight.pop_front() else {
            return;
        };
        let step = session.model.finish().map_err(|e| e.to_string());
        self.complete_call(call, step);
    }

    /// Every queued call, finished and published in order.
    fn finish_in_flight(&mut self) {
        while self
            .session
            .as_ref()
            .is_some_and(|s| !s.in_flight.is_empty())
        {
            self.finish_oldest();
        }
    }

    /// The results of a call (or its error) published, and the counts kept.
    fn complete_call(&mut self, call: Call, step: Result<ModelStep, String>) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let Call { frames, frame_type } = call;
        let n = frames.len();
        let (h, w) = (session.height, session.width);
        // A backend that returns the wrong number of outputs is an error event, not a panic
        // of the inference thread.
        let plane = h * w;
        let decoded = frames
            .iter()
            .any(|(f, _)| matches!(f.pixels, FramePixels::Decoded(_)));
        let step = step.and_then(|s| {
            let images_ok = !decoded
                || s.model_rgb.as_ref().is_some_and(|images| {
                    images.len() == n
                        && images.iter().all(|i| {
                            (i.height as usize, i.width as usize) == (h, w)
                                && i.data.len() == plane * 3
                        })
                });
            let complete = s.frames == n
                && (s.height, s.width) == (h, w)
                && s.cameras.len() == n
                && s.depth.len() == n * plane
                && s.depth_conf.len() == n * plane
                && images_ok;
            if complete {
                Ok(s)
            } else {
                Err(format!(
                    "the model returned {} frames ({} cameras, {} depth values, {} input images) for a call of {n} frames of {w}×{h}",
                    s.frames,
                    s.cameras.len(),
                    s.depth.len(),
                    s.model_rgb.as_ref().map_or(0, Vec::len)
                ))
            }
        });
        let mut step = match step {
            Ok(s) => s,
            Err(e) => {
                self.summary.frames_skipped += n as u64;
                let message = format!(
                    "frames {}..={}: {e}",
                    frames[0].0.index,
                    frames[n - 1].0.index
                );
                self.summary.errors.push(message.clone());
                self.outputs.publish(PipelineEvent::Error {
                    stage: "inference",
                    message,
                });
                return;
            }
        };
        session.first_results_out = true;
        let cache = session.model.cache_snapshot();
        let model_rgb = step.model_rgb.take();
        let (inputs, received): (Vec<InputFrame>, Vec<Instant>) = frames.into_iter().unzip();
        let results = build_results(
            CallContext {
                step: &step,
                frame_type,
                cache,
                filter: self.filter,
                model_rgb,
            },
            inputs,
            &received,
        );
        match frame_type {
            FrameType::Scale => self.summary.scale_frames += n as u64,
            FrameType::Keyframe => self.summary.keyframes += n as u64,
            FrameType::NonKeyframe => self.summary.non_keyframes += n as u64,
        }
        let now = Instant::now();
        if self.first_result.is_none() {
            self.first_result = Some((now, n as u64));
        }
        self.last_result = Some(now);
        for r in results {
            self.summary.frames_processed += 1;
            self.stage_sums.add(&r);
            let clock = Instant::now();
            self.outputs.publish(PipelineEvent::Frame(Arc::new(r)));
            self.summary.consumer_wait_s += clock.elapsed().as_secs_f64();
        }
    }

    fn shut_down(mut self) {
        // The calls already on the device are the frames in progress: they finish.
        self.finish_in_flight();
        self.capture_stop.store(true, Ordering::Release);
        // Drain while the capture thread winds down, so a blocked hand-off returns at once.
        let mut queued = 0u64;
        while let Some(handle) = self.capture_thread.as_ref() {
            while self.frames.try_recv().is_ok() {
                queued += 1;
            }
            if handle.is_finished() {
                if let Some(h) = self.capture_thread.take()
                    && h.join().is_err()
                {
                    self.summary
                        .errors
                        .push("the capture thread panicked".into());
                }
            } else {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        while self.frames.try_recv().is_ok() {
            queued += 1;
        }
        while let Ok(n) = self.notes.try_recv() {
            if let CaptureNote::Warning(w) = n {
                self.summary.warnings.push(w);
            } else if let CaptureNote::Failed(e) = n {
                self.summary.errors.push(e);
            } else {
                self.summary.input_ended = true;
            }
        }
        if let Some(s) = self.session.as_ref() {
            self.summary.frames_discarded += s.scale_buffer.len() as u64;
            self.summary.committed_frames_at_end = s.model.committed_frames();
        }
        let c = &self.capture_counters;
        self.summary.frames_discarded += queued + c.discarded.load(Ordering::Relaxed);
        self.summary.frames_captured = c.captured.load(Ordering::Relaxed);
        self.summary.frames_dropped = c.dropped.load(Ordering::Relaxed);
        self.summary.frames_skipped += c.skipped.load(Ordering::Relaxed);
        self.summary.wall_s = self.started.elapsed().as_secs_f64();
        self.summary.fps = self.summary.frames_processed as f64 / self.summary.wall_s.max(1e-9);
        if let (Some((first, first_frames)), Some(last)) = (self.first_result, self.last_result) {
            self.summary.first_result_s =
                Some(first.saturating_duration_since(self.started).as_secs_f64());
            let span = last.saturating_duration_since(first).as_secs_f64();
            let after = self.summary.frames_processed.saturating_sub(first_frames);
            if span > 0.0 {
                self.summary.steady_fps = after as f64 / span;
            }
        }
        self.summary.mean_stage_ms = self.stage_sums.means();
        let summary = Box::new(std::mem::take(&mut self.summary));
        self.outputs.publish(PipelineEvent::Stopped(summary));
    }
}

impl Drop for Inference {
    /// Also on a panic: the capture thread must not keep reading a source nobody consumes.
    fn drop(&mut self) {
        self.capture_stop.store(true, Ordering::Release);
    }
}
