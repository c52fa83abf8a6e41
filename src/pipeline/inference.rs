//! The inference thread: owns the model session (and so all backend state), runs one call at
//! a time, applies control requests between calls and publishes results. With two frames a
//! step it holds each streaming frame until the next arrives and runs the two as one call
//! ([`ModelSession::submit_pair`]); a frame with no partner (the input ends, a pause, a reset)
//! runs alone, so no frame is lost or reordered.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, never, select};

use crate::attention::AttentionLayout;

use super::FramesPerStep;
use super::capture_thread::{CaptureCounters, CaptureNote, FramePixels, InputFrame};
use super::control::{Control, Outputs, PipelineEvent};
use super::frame::{CallContext, PointFilter, build_results};
use super::keyframe::{Decision, KeyframePolicy, KeyframeScheduler};
use super::model::{
    CallImages, FrameModel, ModelLimits, ModelSession, ModelStep, PairSubmitted, SessionOptions,
    Submitted,
};
use super::summary::{PipelineSummary, StageSums};
use crate::frame::{CacheSnapshot, FrameType};
use crate::model::ModelError;

/// Settings a session is built with; changes wait for a reset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SessionSettings {
    pub layout: AttentionLayout,
    pub window: usize,
    pub keyframes: KeyframePolicy,
    pub frames_per_step: FramesPerStep,
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
    /// With two frames a step: a decided streaming frame waiting for the next one.
    held: Option<Decided>,
    /// A live source may queue the scale frames until the session's first results are out and
    /// the queue it built up meanwhile has been taken.
    live_grace: bool,
    first_results_out: bool,
}

/// A frame taken for a call, with its kind (scale, or as the keyframe policy decided).
struct Decided {
    frame: InputFrame,
    received: Instant,
    frame_type: FrameType,
}

/// One model call's frames, in order.
struct Call {
    frames: Vec<Decided>,
    /// The cache as the call left it, when the backend gave it at submission
    /// ([`super::model::PairCall::cache`]); else it is taken when the call completes.
    cache: Option<Box<CacheSnapshot>>,
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
                // A held frame would wait for a partner until the resume: it runs now, alone,
                // and its results go out before the pause is said.
                self.flush_held();
                self.finish_in_flight();
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
        // The last frame of an odd count has no partner.
        self.flush_held();
        // Every captured frame's results go out before the end is said.
        self.finish_in_flight();
        if self.summary.input_ended {
            self.outputs.publish(PipelineEvent::InputEnded);
        }
    }

    fn reset(&mut self, reason: &str) {
        // The old session's results go out before the reset does; a held frame belongs to the
        // old session and runs there, alone.
        self.flush_held();
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
        let pairs = self.settings.frames_per_step == FramesPerStep::Two;
        let opened = scheduler.map_err(|e| e.to_string()).and_then(|scheduler| {
            let started = if pairs {
                self.model.start_pair_session(height, width, options)
            } else {
                self.model.start_session(height, width, options)
            };
            started
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
                    held: None,
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
        // A held keyframe is committed before this frame runs: the decision counts it, so
        // it is the one the frame gets streamed alone.
        let committed = session.model.committed_frames();
        let ahead = session
            .held
            .as_ref()
            .map_or(0, |h| u64::from(h.frame_type == FrameType::Keyframe));
        let frame_type = match session.scheduler.decide_after(committed, ahead) {
            Decision::Reset => {
                // Flushes a held frame into the spent session first.
                self.reset("keyframe budget spent");
                self.on_frame(frame, received_at);
                return;
            }
            Decision::Keyframe => FrameType::Keyframe,
            Decision::NonKeyframe => FrameType::NonKeyframe,
        };
        let decided = Decided {
            frame,
            received: received_at,
            frame_type,
        };
        if self.settings.frames_per_step == FramesPerStep::One {
            self.run_call(vec![decided]);
            return;
        }
        match session.held.take() {
            None => session.held = Some(decided),
            Some(held) if pairable(&held.frame, &decided.frame) => self.run_pair([held, decided]),
            Some(held) => {
                // Two frames one call cannot take together: the first goes alone, the second
                // waits for a partner of its own.
                self.run_call(vec![held]);
                if let Some(session) = self.session.as_mut() {
                    session.held = Some(decided);
                }
            }
        }
    }

    /// A held frame with no partner coming (the input ended, a pause, a reset, a stop), run
    /// alone.
    fn flush_held(&mut self) {
        if let Some(held) = self.session.as_mut().and_then(|s| s.held.take()) {
            self.run_call(vec![held]);
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
        let frames = std::mem::take(&mut session.scale_buffer)
            .into_iter()
            .map(|(frame, received)| Decided {
                frame,
                received,
                frame_type: FrameType::Scale,
            })
            .collect();
        self.run_call(frames);
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
    fn run_call(&mut self, frames: Vec<Decided>) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let n = frames.len();
        // The cache names frames by their capture index, so its events and page map speak
        // the viewer's language. A call needs a contiguous range: the scale frames (whose
        // indices may have gaps where a live source dropped frames) take `first..first + n`,
        // which stays below the next frame's index, so ids keep increasing.
        let first = frames[0].frame.index;
        let ids = first..first + n as u64;
        // A call here is the scale call (all keyframes) or one streaming frame: its first
        // frame's kind is the call's.
        let keyframe = frames[0].frame_type != FrameType::NonKeyframe;
        let submitted = with_images(&frames, |images| {
            session.model.submit(images, ids, keyframe)
        })
        .and_then(|submitted| submitted);
        self.take_call(
            Call {
                frames,
                cache: None,
            },
            submitted,
        );
        self.finish_over_limit();
    }

    /// Starts two streaming frames as one step. The backend runs them as one call, or as two
    /// (its fallback, or a backend without two-frame steps); either way each frame's results
    /// are published as they would be one frame a step.
    fn run_pair(&mut self, pair: [Decided; 2]) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let ids = [pair[0].frame.index, pair[1].frame.index];
        let keyframes = [
            pair[0].frame_type != FrameType::NonKeyframe,
            pair[1].frame_type != FrameType::NonKeyframe,
        ];
        let submitted = with_images(&pair, |images| {
            session.model.submit_pair(images, ids, keyframes)
        });
        let [first, second] = pair;
        match submitted {
            Ok(PairSubmitted::Together(call)) => self.take_call(
                Call {
                    frames: vec![first, second],
                    cache: call.cache,
                },
                call.submitted,
            ),
            Ok(PairSubmitted::Apart([call0, call1])) => {
                self.take_call(
                    Call {
                        frames: vec![first],
                        cache: call0.cache,
                    },
                    call0.submitted,
                );
                self.take_call(
                    Call {
                        frames: vec![second],
                        cache: call1.cache,
                    },
                    call1.submitted,
                );
            }
            Err(e) => self.take_call(
                Call {
                    frames: vec![first, second],
                    cache: None,
                },
                Err(e),
            ),
        }
        self.finish_over_limit();
    }

    /// A submitted call: published now when it ran to the end (or failed), else queued.
    fn take_call(&mut self, call: Call, submitted: Result<Submitted, ModelError>) {
        match submitted {
            Ok(Submitted::Done(step)) => {
                // Results leave in frame order, even from a backend that mixes queued calls
                // with ones it ran at once.
                self.finish_in_flight();
                self.complete_call(call, Ok(*step));
            }
            Ok(Submitted::Queued) => match self.session.as_mut() {
                Some(session) => session.in_flight.push_back(call),
                None => self.complete_call(call, Err("the session closed".into())),
            },
            Err(e) => self.complete_call(call, Err(e.to_string())),
        }
    }

    /// Finishes the oldest calls until fewer than the backend's limit are in flight (a
    /// two-frame step that went as two calls may have passed it by one).
    fn finish_over_limit(&mut self) {
        while self.session.as_ref().is_some_and(|s| {
            !s.in_flight.is_empty() && s.in_flight.len() >= s.model.max_in_flight()
        }) {
            self.finish_oldest();
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
        let Call { frames, cache } = call;
        let n = frames.len();
        let (h, w) = (session.height, session.width);
        // A backend that returns the wrong number of outputs is an error event, not a panic
        // of the inference thread.
        let plane = h * w;
        let decoded = frames
            .iter()
            .any(|d| matches!(d.frame.pixels, FramePixels::Decoded(_)));
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
                    frames[0].frame.index,
                    frames[n - 1].frame.index
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
        let cache = cache.map_or_else(|| session.model.cache_snapshot(), |c| *c);
        let model_rgb = step.model_rgb.take();
        let mut inputs = Vec::with_capacity(n);
        let mut received = Vec::with_capacity(n);
        let mut frame_types = Vec::with_capacity(n);
        for d in frames {
            match d.frame_type {
                FrameType::Scale => self.summary.scale_frames += 1,
                FrameType::Keyframe => self.summary.keyframes += 1,
                FrameType::NonKeyframe => self.summary.non_keyframes += 1,
            }
            inputs.push(d.frame);
            received.push(d.received);
            frame_types.push(d.frame_type);
        }
        let results = build_results(
            CallContext {
                step: &step,
                frame_types: &frame_types,
                cache,
                filter: self.filter,
                model_rgb,
            },
            inputs,
            &received,
        );
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
        // The calls already on the device are the frames in progress: they finish. A held
        // frame was taken for a call too: it runs alone.
        self.flush_held();
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

/// Whether two frames can share one call: one size, and pixels of one kind.
fn pairable(a: &InputFrame, b: &InputFrame) -> bool {
    (a.height, a.width) == (b.height, b.width)
        && matches!(a.pixels, FramePixels::Host { .. })
            == matches!(b.pixels, FramePixels::Host { .. })
}

/// The frames' images as one call takes them: host-preprocessed frames back to back (one frame
/// goes as it is), or the decoded frames for a backend that preprocesses.
fn with_images<R>(
    frames: &[Decided],
    submit: impl FnOnce(CallImages<'_>) -> R,
) -> Result<R, ModelError> {
    let host: Vec<&[f32]> = frames
        .iter()
        .filter_map(|d| match &d.frame.pixels {
            FramePixels::Host { pixels, .. } => Some(pixels.as_slice()),
            FramePixels::Decoded(_) => None,
        })
        .collect();
    let decoded: Vec<&crate::frame::RgbImage> = frames
        .iter()
        .filter_map(|d| match &d.frame.pixels {
            FramePixels::Decoded(image) => Some(image),
            FramePixels::Host { .. } => None,
        })
        .collect();
    if decoded.is_empty() {
        let joined;
        let images: &[f32] = if host.len() == 1 {
            host[0]
        } else {
            joined = host.concat();
            &joined
        };
        Ok(submit(CallImages::Preprocessed(images)))
    } else if host.is_empty() {
        Ok(submit(CallImages::Decoded(&decoded)))
    } else {
        Err(ModelError::BadInput(
            "a call mixes host-preprocessed and decoded frames".into(),
        ))
    }
}

impl Drop for Inference {
    /// Also on a panic: the capture thread must not keep reading a source nobody consumes.
    fn drop(&mut self) {
        self.capture_stop.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    //! The pairing logic against a scripted backend: which calls the frames go in, and the
    //! results that come out, frame by frame and in order.

    use std::ops::Range;
    use std::sync::Mutex;

    use crossbeam_channel::{Sender, bounded, unbounded};

    use super::*;
    use crate::frame::{CaptureTime, FrameOrigin, FrameResult, RgbImage, TimeBase};
    use crate::model::pose::Camera;
    use crate::model::preprocess::PreprocessConfig;
    use crate::pipeline::keyframe::{KeyframeRule, OnBudget};
    use crate::pipeline::model::PairCall;

    const H: usize = 2;
    const W: usize = 3;

    /// A call as the backend saw it: its frames and their kinds, and whether it came as a pair.
    #[derive(Debug, Clone, PartialEq)]
    struct Logged {
        pair: bool,
        frames: Vec<u64>,
        keyframes: Vec<bool>,
    }

    #[derive(Default)]
    struct Log {
        calls: Vec<Logged>,
        /// A `submit_pair` came with the backend's calls in flight at its limit.
        over_limit: bool,
        deepest: usize,
    }

    /// Runs no model: each frame's camera carries its index (the x of its translation), so a
    /// result shows which frame's outputs it got. `queued`: calls wait for `finish`;
    /// `together`: a pair is one call of two frames (else the trait's default, two calls).
    struct Scripted {
        log: Arc<Mutex<Log>>,
        queued: bool,
        together: bool,
    }

    struct ScriptedSession {
        log: Arc<Mutex<Log>>,
        queued: bool,
        together: bool,
        committed: u64,
        held: VecDeque<ModelStep>,
    }

    fn limits() -> ModelLimits {
        ModelLimits {
            preprocess: PreprocessConfig::default(),
            scale_frames: 2,
            max_frame_num: 64,
            default_window: 3,
            default_keyframe_interval: 1,
            preprocesses_on_device: false,
        }
    }

    impl FrameModel for Scripted {
        fn describe(&self) -> String {
            "scripted".into()
        }
        fn limits(&self) -> ModelLimits {
            limits()
        }
        fn start_session(
            &self,
            _height: usize,
            _width: usize,
            _options: SessionOptions,
        ) -> Result<Box<dyn ModelSession>, ModelError> {
            Ok(Box::new(ScriptedSession {
                log: Arc::clone(&self.log),
                queued: self.queued,
                together: self.together,
                committed: 0,
                held: VecDeque::new(),
            }))
        }
    }

    impl ScriptedSession {
        fn outputs(&mut self, frames: &[u64], keyframes: &[bool], pair: bool) -> ModelStep {
            let mut log = self.log.lock().unwrap();
            log.calls.push(Logged {
                pair,
                frames: frames.to_vec(),
                keyframes: keyframes.to_vec(),
            });
            self.committed += keyframes.iter().filter(|k| **k).count() as u64;
            let n = frames.len();
            let cameras = frames
                .iter()
                .map(|&f| Camera {
                    world_from_camera: [
                        [1.0, 0.0, 0.0, f as f32],
                        [0.0, 1.0, 0.0, 0.0],
                        [0.0, 0.0, 1.0, 0.0],
                    ],
                    intrinsics: [[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0]],
                })
                .collect();
            ModelStep {
                frames: n,
                height: H,
                width: W,
                depth: vec![1.0; n * H * W],
                depth_conf: vec![2.0; n * H * W],
                cameras,
                stages: Vec::new(),
                points: None,
                model_rgb: None,
            }
        }

        fn hand_over(&mut self, step: ModelStep) -> Submitted {
            if self.queued {
                self.held.push_back(step);
                let mut log = self.log.lock().unwrap();
                log.deepest = log.deepest.max(self.held.len());
                Submitted::Queued
            } else {
                Submitted::Done(Box::new(step))
            }
        }
    }

    impl ModelSession for ScriptedSession {
        fn step(
            &mut self,
            _images: &[f32],
            frames: Range<u64>,
            keyframe: bool,
        ) -> Result<ModelStep, ModelError> {
            let frames: Vec<u64> = frames.collect();
            let keyframes = vec![keyframe; frames.len()];
            Ok(self.outputs(&frames, &keyframes, false))
        }
        fn submit(
            &mut self,
            images: CallImages<'_>,
            frames: Range<u64>,
            keyframe: bool,
        ) -> Result<Submitted, ModelError> {
            let CallImages::Preprocessed(pixels) = images else {
                return Err(ModelError::BadInput("decoded images".into()));
            };
            let step = self.step(pixels, frames, keyframe)?;
            Ok(self.hand_over(step))
        }
        fn submit_pair(
            &mut self,
            images: CallImages<'_>,
            frames: [u64; 2],
            keyframes: [bool; 2],
        ) -> PairSubmitted {
            if self.held.len() >= self.max_in_flight() {
                self.log.lock().unwrap().over_limit = true;
            }
            if !self.together {
                return default_submit_pair(self, images, frames, keyframes);
            }
            let step = self.outputs(&frames, &keyframes, true);
            PairSubmitted::Together(PairCall {
                submitted: Ok(self.hand_over(step)),
                cache: None,
            })
        }
        fn finish(&mut self) -> Result<ModelStep, ModelError> {
            self.held
                .pop_front()
                .ok_or_else(|| ModelError::BadInput("nothing to finish".into()))
        }
        fn max_in_flight(&self) -> usize {
            if self.queued { 2 } else { 1 }
        }
        fn committed_frames(&self) -> u64 {
            self.committed
        }
        fn cache_snapshot(&self) -> CacheSnapshot {
            CacheSnapshot::default()
        }
        fn cache_occupancy(&self) -> (usize, usize) {
            (0, 0)
        }
    }

    /// The trait's own `submit_pair`, for a session that overrides it.
    fn default_submit_pair(
        session: &mut ScriptedSession,
        images: CallImages<'_>,
        frames: [u64; 2],
        keyframes: [bool; 2],
    ) -> PairSubmitted {
        struct Plain<'a>(&'a mut ScriptedSession);
        impl ModelSession for Plain<'_> {
            fn step(
                &mut self,
                images: &[f32],
                frames: Range<u64>,
                keyframe: bool,
            ) -> Result<ModelStep, ModelError> {
                self.0.step(images, frames, keyframe)
            }
            fn submit(
                &mut self,
                images: CallImages<'_>,
                frames: Range<u64>,
                keyframe: bool,
            ) -> Result<Submitted, ModelError> {
                self.0.submit(images, frames, keyframe)
            }
            fn committed_frames(&self) -> u64 {
                self.0.committed_frames()
            }
            fn cache_snapshot(&self) -> CacheSnapshot {
                self.0.cache_snapshot()
            }
            fn cache_occupancy(&self) -> (usize, usize) {
                self.0.cache_occupancy()
            }
        }
        Plain(session).submit_pair(images, frames, keyframes)
    }

    struct Harness {
        inference: Inference,
        events: Receiver<PipelineEvent>,
        log: Arc<Mutex<Log>>,
        // Kept so the channels stay open.
        _frames: Sender<InputFrame>,
        _notes: Sender<CaptureNote>,
        _control: Sender<Control>,
    }

    fn harness(
        per_step: FramesPerStep,
        rule: KeyframeRule,
        view_budget: u64,
        on_budget: OnBudget,
        (queued, together): (bool, bool),
    ) -> Harness {
        let log = Arc::new(Mutex::new(Log::default()));
        let model = Arc::new(Scripted {
            log: Arc::clone(&log),
            queued,
            together,
        });
        let mut outputs = Outputs::default();
        let events = outputs.subscribe(super::super::Delivery::Lossless, 10_000);
        let (frames_tx, frames_rx) = bounded(1);
        let (notes_tx, notes_rx) = unbounded();
        let (control_tx, control_rx) = unbounded();
        let settings = SessionSettings {
            layout: AttentionLayout::Paged,
            window: 3,
            keyframes: KeyframePolicy {
                rule,
                view_budget,
                on_budget,
            },
            frames_per_step: per_step,
        };
        let inference = Inference::new(
            model,
            outputs,
            settings,
            PointFilter::default(),
            frames_rx,
            notes_rx,
            control_rx,
            Arc::new(AtomicBool::new(false)),
            Arc::new(CaptureCounters::default()),
            PipelineSummary::default(),
        );
        Harness {
            inference,
            events,
            log,
            _frames: frames_tx,
            _notes: notes_tx,
            _control: control_tx,
        }
    }

    fn frame(index: u64) -> InputFrame {
        InputFrame {
            index,
            origin: FrameOrigin {
                name: format!("{index:06}.png"),
                time: CaptureTime::new(index as i64, TimeBase::Nominal),
                original_size: None,
            },
            pixels: FramePixels::Host {
                pixels: vec![0.5; 3 * H * W],
                model_rgb: RgbImage {
                    width: W as u32,
                    height: H as u32,
                    data: vec![128; 3 * H * W],
                },
            },
            height: H,
            width: W,
            capture_ms: 0.0,
            decode_ms: 0.0,
            preprocess_ms: 0.0,
            sent_at: Instant::now(),
            dropped_before: 0,
        }
    }

    impl Harness {
        fn feed(&mut self, frames: Range<u64>) {
            for i in frames {
                self.inference.on_frame(frame(i), Instant::now());
            }
        }

        fn calls(&self) -> Vec<(bool, Vec<u64>)> {
            let log = self.log.lock().unwrap();
            log.calls
                .iter()
                .map(|c| (c.pair, c.frames.clone()))
                .collect()
        }

        /// Every event so far, frames as (index, type) after checking each got its own outputs.
        fn events(&self) -> Vec<String> {
            self.events
                .try_iter()
                .map(|e| match e {
                    PipelineEvent::Frame(r) => result_text(&r),
                    PipelineEvent::SessionReset { reason } => format!("reset ({reason})"),
                    PipelineEvent::InputEnded => "end".into(),
                    PipelineEvent::Paused(p) => format!("paused {p}"),
                    PipelineEvent::Error { message, .. } => format!("error {message}"),
                    other => format!("{other:?}"),
                })
                .collect()
        }
    }

    fn result_text(r: &FrameResult) -> String {
        assert_eq!(
            r.camera_position().x,
            r.frame as f32,
            "frame {} got another frame's outputs",
            r.frame
        );
        let kind = match r.frame_type {
            FrameType::Scale => "S",
            FrameType::Keyframe => "K",
            FrameType::NonKeyframe => "N",
        };
        format!("{}{kind}", r.frame)
    }

    const FIXED_1: KeyframeRule = KeyframeRule::Fixed { interval: 1 };

    #[test]
    fn pairs_run_together_and_an_odd_last_frame_runs_alone() {
        for backend in [(false, false), (false, true), (true, false), (true, true)] {
            let mut h = harness(FramesPerStep::Two, FIXED_1, 320, OnBudget::Freeze, backend);
            h.feed(0..7);
            // Frame 6 waits for a partner.
            let expected = if backend.1 {
                vec![(false, vec![0, 1]), (true, vec![2, 3]), (true, vec![4, 5])]
            } else {
                // The trait's default: a pair is two one-frame calls.
                vec![
                    (false, vec![0, 1]),
                    (false, vec![2]),
                    (false, vec![3]),
                    (false, vec![4]),
                    (false, vec![5]),
                ]
            };
            assert_eq!(h.calls(), expected, "{backend:?}");
            h.inference.on_input_done();
            let calls = h.calls();
            assert_eq!(calls.last(), Some(&(false, vec![6])), "{backend:?}");
            let events = h.events();
            assert_eq!(
                events,
                ["0S", "1S", "2K", "3K", "4K", "5K", "6K"],
                "{backend:?}"
            );
            assert!(!h.log.lock().unwrap().over_limit, "{backend:?}");
        }
    }

    #[test]
    fn pairs_carry_each_frames_kind_as_one_frame_a_step_does() {
        for interval in [2, 3] {
            let rule = KeyframeRule::Fixed { interval };
            let mut single = harness(
                FramesPerStep::One,
                rule,
                320,
                OnBudget::Freeze,
                (false, false),
            );
            single.feed(0..14);
            single.inference.on_input_done();
            let mut paired = harness(
                FramesPerStep::Two,
                rule,
                320,
                OnBudget::Freeze,
                (true, true),
            );
            paired.feed(0..14);
            paired.inference.on_input_done();
            let expected = single.events();
            assert_eq!(paired.events(), expected, "interval {interval}");
            // Keyframe-then-not and not-then-keyframe pairs both ran as one call.
            let log = paired.log.lock().unwrap();
            let kinds: Vec<&[bool]> = log
                .calls
                .iter()
                .filter(|c| c.pair)
                .map(|c| c.keyframes.as_slice())
                .collect();
            assert!(kinds.contains(&&[true, false][..]), "{kinds:?}");
            if interval == 3 {
                assert!(kinds.contains(&&[false, true][..]), "{kinds:?}");
                assert!(kinds.contains(&&[false, false][..]), "{kinds:?}");
            }
        }
    }

    #[test]
    fn reset_pause_and_stop_run_the_held_frame_alone_first() {
        let mut h = harness(
            FramesPerStep::Two,
            FIXED_1,
            320,
            OnBudget::Freeze,
            (true, true),
        );
        h.feed(0..3);
        h.inference.on_control(Control::Reset);
        assert_eq!(h.calls(), [(false, vec![0, 1]), (false, vec![2])]);
        assert_eq!(h.events(), ["0S", "1S", "2K", "reset (requested)"]);

        // A new session: scale frames 3 and 4, frame 5 held, then a pause.
        h.feed(3..6);
        h.inference.on_control(Control::Pause);
        assert_eq!(h.calls()[2..], [(false, vec![3, 4]), (false, vec![5])]);
        assert_eq!(h.events(), ["3S", "4S", "5K", "paused true"]);

        h.inference.on_control(Control::Resume);
        h.feed(6..9);
        // 6 and 7 ran together; 8 is held when the stop comes.
        let summary_events = {
            let events = h.events.clone();
            h.inference.shut_down();
            events.try_iter().collect::<Vec<_>>()
        };
        let frames: Vec<String> = summary_events
            .iter()
            .filter_map(|e| match e {
                PipelineEvent::Frame(r) => Some(result_text(r)),
                _ => None,
            })
            .collect();
        assert_eq!(frames, ["6K", "7K", "8K"]);
        let Some(PipelineEvent::Stopped(summary)) = summary_events.last() else {
            panic!("the last event is the summary: {summary_events:?}");
        };
        assert_eq!(summary.frames_processed, 9);
        assert_eq!((summary.scale_frames, summary.keyframes), (4, 5));
        let log = h.log.lock().unwrap();
        assert_eq!(log.calls.last().map(|c| c.frames.clone()), Some(vec![8]));
    }

    #[test]
    fn a_reset_decision_splits_the_pair() {
        // Budget 5: scale frames 0 and 1, then 2 and 3 as a pair (4 committed), 4 is the fifth
        // keyframe, and 5, decided counting 4, finds the budget spent: 4 runs alone in the old
        // session, 5 starts the new one.
        let mut h = harness(
            FramesPerStep::Two,
            FIXED_1,
            5,
            OnBudget::Reset,
            (false, true),
        );
        h.feed(0..8);
        h.inference.on_input_done();
        assert_eq!(
            h.calls(),
            [
                (false, vec![0, 1]),
                (true, vec![2, 3]),
                (false, vec![4]),
                (false, vec![5, 6]),
                (false, vec![7]),
            ]
        );
        assert_eq!(
            h.events(),
            [
                "0S",
                "1S",
                "2K",
                "3K",
                "4K",
                "reset (keyframe budget spent)",
                "5S",
                "6S",
                "7K",
            ]
        );
    }
}
