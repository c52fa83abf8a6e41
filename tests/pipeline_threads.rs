//! The threaded pipeline with the real CPU model (the gct-tiny fixture): ordering, drop
//! accounting for live sources, back-pressure for files, shutdown with frames in flight, a
//! source that fails midway, control requests, and the keyframe budget.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use streamrecon::capture::{
    CaptureError, CapturedFrame, CorruptFilePolicy, ImageFolder, Source, SyntheticScene,
    SyntheticSource,
};
use streamrecon::frame::{FrameResult, FrameType};
use streamrecon::model::{GctModel, ModelConfig};
use streamrecon::pipeline::{
    Control, CpuFrameModel, Delivery, FrameModel, KeyframePolicy, KeyframeRule, OnBudget, Outputs,
    Pipeline, PipelineConfig, PipelineEvent, PipelineSummary,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/gct-tiny");
const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);
/// No test here should come near this; reaching it means a hang.
const PATIENCE: Duration = Duration::from_secs(60);

/// Sends a control request. A pipeline that has stopped already takes none; what the test
/// checks is what the pipeline did, in its events.
fn request(control: &crossbeam_channel::Sender<Control>, c: Control) {
    if control.send(c).is_err() {
        eprintln!("the pipeline had stopped before a request");
    }
}

fn tiny_model() -> Arc<dyn FrameModel> {
    let dir = Path::new(FIXTURE);
    let cfg = ModelConfig::from_json_file(&dir.join("kf1/config.json")).unwrap();
    let model = GctModel::load(cfg, &dir.join("weights.safetensors")).unwrap();
    Arc::new(CpuFrameModel::new(model))
}

fn small_scene(frames: u64) -> SyntheticScene {
    SyntheticScene {
        width: 112,
        height: 84,
        frames: Some(frames),
        ..SyntheticScene::default()
    }
}

/// Everything a consumer saw, in order.
#[derive(Default)]
struct Seen {
    results: Vec<Arc<FrameResult>>,
    errors: Vec<(String, String)>,
    warnings: Vec<String>,
    resets: Vec<String>,
    input_ended: bool,
    summary: Option<PipelineSummary>,
}

/// Read events until the pipeline stops; `on_event` may send control requests.
fn consume(
    events: &Receiver<PipelineEvent>,
    mut on_event: impl FnMut(&PipelineEvent, &Seen),
) -> Seen {
    let mut seen = Seen::default();
    loop {
        let event = match events.recv_timeout(PATIENCE) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => {
                panic!("no event for {PATIENCE:?}: the pipeline hangs")
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        on_event(&event, &seen);
        match event {
            PipelineEvent::Frame(r) => seen.results.push(r),
            PipelineEvent::Error { stage, message } => seen.errors.push((stage.into(), message)),
            PipelineEvent::Warning(w) => seen.warnings.push(w),
            PipelineEvent::SessionReset { reason } => seen.resets.push(reason),
            PipelineEvent::InputEnded => seen.input_ended = true,
            PipelineEvent::Paused(_) => {}
            PipelineEvent::Stopped(s) => seen.summary = Some(*s),
        }
    }
    seen
}

fn start(
    source: Box<dyn Source>,
    config: PipelineConfig,
    capacity: usize,
) -> (Pipeline, Receiver<PipelineEvent>) {
    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Lossless, capacity);
    let pipeline = Pipeline::start(source, tiny_model(), config, outputs).unwrap();
    (pipeline, events)
}

/// Run to the end of the input and stop.
fn run_to_end(source: Box<dyn Source>, config: PipelineConfig) -> Seen {
    let (pipeline, events) = start(source, config, 4);
    let control = pipeline.control();
    let seen = consume(&events, |e, _| {
        if matches!(e, PipelineEvent::InputEnded | PipelineEvent::Error { .. }) {
            request(&control, Control::Stop);
        }
    });
    pipeline.join();
    seen
}

fn accounting_holds(s: &PipelineSummary) {
    assert_eq!(
        s.frames_captured,
        s.frames_processed + s.frames_dropped + s.frames_discarded + s.frames_skipped,
        "{s:#?}"
    );
}

#[test]
fn folder_frames_arrive_in_order_with_every_field_filled() {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let seen = run_to_end(
        Box::new(folder),
        PipelineConfig {
            max_frames: Some(12),
            ..PipelineConfig::default()
        },
    );
    let s = seen.summary.expect("a summary at the end");
    assert!(
        seen.input_ended && seen.errors.is_empty(),
        "{:?}",
        seen.errors
    );
    let indices: Vec<u64> = seen.results.iter().map(|r| r.frame).collect();
    assert_eq!(indices, (0..12).collect::<Vec<_>>());
    // gct-tiny: 2 scale frames, then keyframes (the reference's interval for 12 frames is 1).
    let kinds: Vec<FrameType> = seen.results.iter().map(|r| r.frame_type).collect();
    assert_eq!(kinds[..2], [FrameType::Scale, FrameType::Scale]);
    assert!(kinds[2..].iter().all(|k| *k == FrameType::Keyframe));
    for r in &seen.results {
        let (w, h) = (r.intrinsics.width as usize, r.intrinsics.height as usize);
        assert_eq!(
            (w, h),
            (70, 42),
            "courthouse 518×294 → the tiny model's 70×42"
        );
        assert_eq!(r.image.data.len(), w * h * 3);
        assert_eq!(r.depth.len(), w * h);
        assert_eq!(r.confidence.len(), w * h);
        assert!(r.confidence.iter().all(|c| *c >= 1.0));
        assert_eq!(r.points.xyz.len(), r.points.rgb.len());
        assert_eq!(r.points.xyz.len(), r.points.confidence.len());
        let identity = r.camera_from_world * r.world_from_camera;
        assert!(identity.abs_diff_eq(glam::Mat4::IDENTITY, 1e-4));
        // The scale frames share one call, so both see its two commits.
        assert_eq!(r.cache.stats.frames_committed, (r.frame + 1).max(2));
        assert!(!r.cache.page_map.is_empty());
        let stages: Vec<&str> = r.timings.iter().map(|t| t.stage.as_str()).collect();
        for stage in [
            "capture",
            "decode",
            "preprocess",
            "handoff",
            "dino",
            "global_attention",
            "depth_head",
            "unprojection",
        ] {
            assert!(stages.contains(&stage), "{stage} missing from {stages:?}");
        }
        assert!(r.timings.iter().all(|t| t.ms.is_finite() && t.ms >= 0.0));
        assert_eq!(r.dropped_before, 0);
    }
    // The scale call's cache events go with its first frame only.
    assert!(!seen.results[0].cache.events.is_empty());
    assert!(seen.results[1].cache.events.is_empty());
    assert_eq!(s.frames_processed, 12);
    assert_eq!((s.frames_dropped, s.frames_discarded), (0, 0));
    accounting_holds(&s);
}

/// Counts frames taken from the wrapped source, so a test sees how far capture ran ahead.
struct Counting<S> {
    inner: S,
    taken: Arc<AtomicU64>,
}

impl<S: Source> Source for Counting<S> {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        let f = self.inner.next_frame()?;
        if f.is_some() {
            self.taken.fetch_add(1, Ordering::SeqCst);
        }
        Ok(f)
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn remaining_hint(&self) -> Option<u64> {
        self.inner.remaining_hint()
    }
}

#[test]
fn files_apply_back_pressure_and_drop_nothing() {
    let taken = Arc::new(AtomicU64::new(0));
    let source = Counting {
        inner: SyntheticSource::new(small_scene(30)),
        taken: Arc::clone(&taken),
    };
    let (pipeline, events) = start(Box::new(source), PipelineConfig::default(), 1);
    // Nobody reads for a while: everything stalls behind the consumer.
    std::thread::sleep(Duration::from_millis(1500));
    let ahead = taken.load(Ordering::SeqCst);
    // At most: 1 result in the consumer queue + 1 being published, 2 scale frames buffered,
    // 2 queued frames, 1 in the capture thread's hand.
    assert!(
        ahead <= 8,
        "capture ran {ahead} frames ahead of a stalled consumer"
    );
    let control = pipeline.control();
    let seen = consume(&events, |e, _| {
        if matches!(e, PipelineEvent::InputEnded) {
            request(&control, Control::Stop);
        }
    });
    pipeline.join();
    let s = seen.summary.unwrap();
    assert_eq!(s.frames_processed, 30);
    assert_eq!(s.frames_dropped, 0);
    let indices: Vec<u64> = seen.results.iter().map(|r| r.frame).collect();
    assert_eq!(indices, (0..30).collect::<Vec<_>>());
    accounting_holds(&s);
}

#[test]
fn live_sources_keep_the_newest_frame_and_count_drops() {
    // 200 fps is far faster than the CPU model: most frames must be dropped.
    let source = SyntheticSource::live(small_scene(150), 200.0);
    let seen = run_to_end(Box::new(source), PipelineConfig::default());
    let s = seen.summary.unwrap();
    assert!(s.frames_dropped > 0, "{s:#?}");
    accounting_holds(&s);
    // Every gap in the delivered indices is exactly the drops reported before that frame.
    let mut previous: Option<u64> = None;
    for r in &seen.results {
        let expected = match previous {
            None => r.frame,
            Some(p) => r.frame - p - 1,
        };
        assert_eq!(r.dropped_before, expected, "frame {}", r.frame);
        previous = Some(r.frame);
    }
    let reported: u64 = seen.results.iter().map(|r| r.dropped_before).sum();
    // Drops after the last delivered frame have no result to ride on.
    let last = seen.results.last().unwrap().frame;
    assert_eq!(reported + (s.frames_captured - 1 - last), s.frames_dropped);
}

#[test]
fn stop_with_frames_in_flight_loses_no_result() {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let (pipeline, events) = start(Box::new(folder), PipelineConfig::default(), 2);
    let control = pipeline.control();
    let seen = consume(&events, |e, seen| {
        if matches!(e, PipelineEvent::Frame(_)) && seen.results.len() == 4 {
            request(&control, Control::Stop);
        }
    });
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        pipeline.join();
        if done_tx.send(()).is_err() {
            eprintln!("joined after the test stopped waiting (it has failed already)");
        }
    });
    done_rx
        .recv_timeout(PATIENCE)
        .expect("the threads must end after a stop");
    let s = seen.summary.expect("a summary even after a stop");
    assert!(s.frames_processed < 48, "the stop came early: {s:#?}");
    assert_eq!(seen.results.len() as u64, s.frames_processed);
    let indices: Vec<u64> = seen.results.iter().map(|r| r.frame).collect();
    assert_eq!(indices, (0..s.frames_processed).collect::<Vec<_>>());
    assert_eq!(s.frames_dropped, 0);
    accounting_holds(&s);
}

/// A camera that is unplugged after `frames` frames.
struct Unplugged {
    inner: SyntheticSource,
    frames: u64,
}

impl Source for Unplugged {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        if self.frames == 0 {
            return Err(CaptureError::Disconnected {
                device: "webcam:0".into(),
                reason: "No such device (os error 19)".into(),
            });
        }
        self.frames -= 1;
        self.inner.next_frame()
    }
    fn is_live(&self) -> bool {
        // Behaves like a camera, but without pacing so the test is deterministic.
        false
    }
    fn describe(&self) -> String {
        "unplugged camera".into()
    }
}

#[test]
fn an_unplugged_camera_is_an_error_event_and_the_map_is_kept() {
    let source = Unplugged {
        inner: SyntheticSource::new(small_scene(100)),
        frames: 6,
    };
    let (pipeline, events) = start(Box::new(source), PipelineConfig::default(), 4);
    let control = pipeline.control();
    let mut after_error = 0;
    let seen = consume(&events, |e, seen| match e {
        // The session is alive after the error: it still answers control requests.
        PipelineEvent::Error { .. } => {
            request(&control, Control::Pause);
        }
        PipelineEvent::Paused(true) => {
            after_error = seen.errors.len();
            request(&control, Control::Stop);
        }
        _ => {}
    });
    pipeline.join();
    assert_eq!(after_error, 1, "pause was answered after the error");
    assert_eq!(seen.errors.len(), 1, "{:?}", seen.errors);
    let (stage, message) = &seen.errors[0];
    assert_eq!(stage, "capture");
    assert!(
        message.contains("webcam:0") && message.contains("unplugged"),
        "{message}"
    );
    assert!(!seen.input_ended);
    assert_eq!(seen.results.len(), 6, "every captured frame was processed");
    let s = seen.summary.unwrap();
    assert_eq!(s.committed_frames_at_end, 6, "the map so far is kept");
    assert_eq!(s.errors.len(), 1);
    accounting_holds(&s);
}

#[test]
fn reset_applies_pending_settings_and_starts_a_new_session() {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let (pipeline, events) = start(
        Box::new(folder),
        PipelineConfig {
            max_frames: Some(16),
            ..PipelineConfig::default()
        },
        1,
    );
    let control = pipeline.control();
    let seen = consume(&events, |e, seen| match e {
        PipelineEvent::Frame(_) if seen.results.len() == 3 => {
            request(
                &control,
                Control::SetAttention(streamrecon::attention::AttentionLayout::Dense),
            );
            request(
                &control,
                Control::SetKeyframePolicy(KeyframePolicy {
                    rule: KeyframeRule::Fixed { interval: 2 },
                    ..KeyframePolicy::default()
                }),
            );
            request(&control, Control::Reset);
        }
        PipelineEvent::InputEnded => {
            request(&control, Control::Stop);
        }
        _ => {}
    });
    pipeline.join();
    let s = seen.summary.unwrap();
    assert_eq!(seen.resets, vec!["requested".to_owned()]);
    assert_eq!(s.sessions, 2);
    let kinds: Vec<FrameType> = seen.results.iter().map(|r| r.frame_type).collect();
    // Somewhere after the reset, two scale frames again, then keyframes every 2nd frame.
    let second_scale = kinds
        .iter()
        .enumerate()
        .skip(2)
        .find(|(_, k)| **k == FrameType::Scale)
        .map(|(i, _)| i)
        .expect("the new session starts with scale frames");
    assert_eq!(kinds[second_scale + 1], FrameType::Scale);
    let rest = &kinds[second_scale + 2..];
    assert!(rest.len() >= 4, "{kinds:?}");
    for (i, k) in rest.iter().enumerate() {
        let expected = if i % 2 == 0 {
            FrameType::Keyframe
        } else {
            FrameType::NonKeyframe
        };
        assert_eq!(*k, expected, "frame {i} after the new scale frames");
    }
    accounting_holds(&s);
}

#[test]
fn the_keyframe_budget_keeps_a_long_stream_inside_the_rope_table() {
    // gct-tiny's RoPE table holds 64 frames: 80 keyframes would overflow it.
    for (on_budget, sessions) in [(OnBudget::Freeze, 1), (OnBudget::Reset, 2)] {
        let seen = run_to_end(
            Box::new(SyntheticSource::new(small_scene(80))),
            PipelineConfig {
                keyframes: Some(KeyframePolicy {
                    rule: KeyframeRule::Fixed { interval: 1 },
                    view_budget: 320,
                    on_budget,
                }),
                ..PipelineConfig::default()
            },
        );
        assert!(seen.errors.is_empty(), "{:?}", seen.errors);
        let s = seen.summary.unwrap();
        assert_eq!(s.frames_processed, 80);
        assert_eq!(s.sessions, sessions, "{on_budget:?}");
        let committed = seen
            .results
            .iter()
            .map(|r| r.cache.stats.frames_committed)
            .max()
            .unwrap();
        assert_eq!(committed, 63, "{on_budget:?}: budget min(320, 64 − 1)");
        if on_budget == OnBudget::Freeze {
            assert_eq!(s.non_keyframes, 80 - 63);
            assert!(
                seen.results[63..]
                    .iter()
                    .all(|r| r.frame_type == FrameType::NonKeyframe)
            );
        }
    }
}

#[test]
fn pause_holds_back_frames_until_resume() {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let (pipeline, events) = start(
        Box::new(folder),
        PipelineConfig {
            max_frames: Some(8),
            ..PipelineConfig::default()
        },
        1,
    );
    let control = pipeline.control();
    control.send(Control::Pause).unwrap();
    // While paused, no result may come (the scale call may have run before the pause).
    let mut before_resume = 0;
    loop {
        match events.recv_timeout(Duration::from_millis(600)) {
            Ok(PipelineEvent::Frame(_)) => before_resume += 1,
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => panic!("ended while paused"),
        }
        assert!(before_resume <= 2, "results kept coming while paused");
    }
    control.send(Control::Resume).unwrap();
    let seen = consume(&events, |e, _| {
        if matches!(e, PipelineEvent::InputEnded) {
            request(&control, Control::Stop);
        }
    });
    pipeline.join();
    assert_eq!(before_resume + seen.results.len(), 8);
}

#[test]
fn a_stalled_viewer_loses_frames_but_not_events_and_never_blocks() {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let mut outputs = Outputs::default();
    let recorder = outputs.subscribe(Delivery::Lossless, 2);
    // The viewer never reads until the end.
    let viewer = outputs.subscribe(Delivery::Latest, 3);
    let pipeline = Pipeline::start(
        Box::new(folder),
        tiny_model(),
        PipelineConfig {
            max_frames: Some(10),
            ..PipelineConfig::default()
        },
        outputs,
    )
    .unwrap();
    let control = pipeline.control();
    let recorded = consume(&recorder, |e, _| {
        if matches!(e, PipelineEvent::InputEnded) {
            request(&control, Control::Stop);
        }
    });
    pipeline.join();
    assert_eq!(
        recorded.results.len(),
        10,
        "the lossless consumer has every frame"
    );
    let viewed = consume(&viewer, |_, _| {});
    assert_eq!(
        viewed.results.len(),
        3,
        "the viewer kept only what its queue holds"
    );
    assert!(
        viewed.input_ended,
        "non-frame events still reach the viewer"
    );
    assert!(viewed.summary.is_some());
}
