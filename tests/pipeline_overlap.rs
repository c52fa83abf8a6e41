//! The product path's overlap without a GPU: a backend that queues calls (the real CPU model
//! behind an asynchronous adapter, as the GPU backend queues its graphs) through the threaded
//! pipeline: results in order and identical to the synchronous run, the calls in flight finished
//! at a stop, a reset or a pause; a paced folder (`--pace`) that drops only what inference
//! misses; the decode pool's order and its accounting of files that do not decode.

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use streamrecon::capture::{CorruptFilePolicy, ImageFolder, Paced, Source};
use streamrecon::frame::{CacheSnapshot, FrameResult};
use streamrecon::model::{GctModel, ModelConfig, ModelError};
use streamrecon::pipeline::{
    CallImages, Control, CpuFrameModel, Delivery, FrameModel, ModelLimits, ModelSession, ModelStep,
    Outputs, Pipeline, PipelineConfig, PipelineEvent, PipelineSummary, PointFilter, SessionOptions,
    Submitted,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/gct-tiny");
const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);
const PATIENCE: Duration = Duration::from_secs(60);

fn cpu_model() -> Arc<CpuFrameModel> {
    let dir = Path::new(FIXTURE);
    let cfg = ModelConfig::from_json_file(&dir.join("kf1/config.json")).unwrap();
    Arc::new(CpuFrameModel::new(
        GctModel::load(cfg, &dir.join("weights.safetensors")).unwrap(),
    ))
}

/// The CPU model as an asynchronous backend: `submit` runs the call and keeps its outputs
/// until `finish`, up to two calls at once, and counts what it was given.
struct Queued {
    inner: Arc<CpuFrameModel>,
    decoded: bool,
    submitted: Arc<AtomicU64>,
    finished: Arc<AtomicU64>,
    /// Largest number of calls held at once.
    deepest: Arc<AtomicU64>,
    /// How long a session's warm-up takes (a GPU's tuning and graph captures).
    warm_up: Duration,
}

struct QueuedSession {
    inner: Box<dyn ModelSession>,
    held: VecDeque<Result<ModelStep, ModelError>>,
    submitted: Arc<AtomicU64>,
    finished: Arc<AtomicU64>,
    deepest: Arc<AtomicU64>,
    warm_up: Duration,
}

impl FrameModel for Queued {
    fn describe(&self) -> String {
        format!("queued {}", self.inner.describe())
    }
    fn limits(&self) -> ModelLimits {
        ModelLimits {
            preprocesses_on_device: self.decoded,
            ..self.inner.limits()
        }
    }
    fn start_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        Ok(Box::new(QueuedSession {
            inner: self.inner.start_session(height, width, options)?,
            held: VecDeque::new(),
            submitted: Arc::clone(&self.submitted),
            finished: Arc::clone(&self.finished),
            deepest: Arc::clone(&self.deepest),
            warm_up: self.warm_up,
        }))
    }
}

impl ModelSession for QueuedSession {
    fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        key: bool,
    ) -> Result<ModelStep, ModelError> {
        self.inner.step(images, frames, key)
    }
    fn submit(
        &mut self,
        images: CallImages<'_>,
        frames: Range<u64>,
        key: bool,
    ) -> Result<Submitted, ModelError> {
        assert!(
            self.held.len() < 2,
            "a third call submitted while two are held"
        );
        let step = match self.inner.submit(images, frames, key)? {
            Submitted::Done(step) => Ok(*step),
            Submitted::Queued => unreachable!("the CPU model runs calls at once"),
        };
        self.held.push_back(step);
        self.submitted.fetch_add(1, Ordering::SeqCst);
        self.deepest
            .fetch_max(self.held.len() as u64, Ordering::SeqCst);
        Ok(Submitted::Queued)
    }
    fn finish(&mut self) -> Result<ModelStep, ModelError> {
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.held.pop_front().expect("finish without a held call")
    }
    fn max_in_flight(&self) -> usize {
        2
    }
    fn warm_up(&mut self) -> Result<(), ModelError> {
        std::thread::sleep(self.warm_up);
        Ok(())
    }
    fn committed_frames(&self) -> u64 {
        self.inner.committed_frames()
    }
    fn cache_snapshot(&self) -> CacheSnapshot {
        self.inner.cache_snapshot()
    }
    fn cache_occupancy(&self) -> (usize, usize) {
        self.inner.cache_occupancy()
    }
    fn set_point_filter(&mut self, filter: PointFilter) {
        self.inner.set_point_filter(filter)
    }
}

fn queued(decoded: bool) -> Arc<Queued> {
    slow_to_start(decoded, Duration::ZERO)
}

fn slow_to_start(decoded: bool, warm_up: Duration) -> Arc<Queued> {
    Arc::new(Queued {
        inner: cpu_model(),
        decoded,
        submitted: Arc::default(),
        finished: Arc::default(),
        deepest: Arc::default(),
        warm_up,
    })
}

#[derive(Default)]
struct Seen {
    results: Vec<Arc<FrameResult>>,
    errors: Vec<String>,
    resets: usize,
    summary: Option<PipelineSummary>,
}

/// Runs `source` through `model`; `on_result(n)` is called after the n-th result and may send
/// control requests. Stops at the end of the input.
fn run(
    source: Box<dyn Source>,
    model: Arc<dyn FrameModel>,
    config: PipelineConfig,
    mut on_result: impl FnMut(usize, &crossbeam_channel::Sender<Control>),
) -> Seen {
    let mut outputs = Outputs::default();
    let events: Receiver<PipelineEvent> = outputs.subscribe(Delivery::Lossless, 4);
    let pipeline = Pipeline::start(source, model, config, outputs).unwrap();
    let control = pipeline.control();
    let mut seen = Seen::default();
    loop {
        match events.recv_timeout(PATIENCE) {
            Ok(PipelineEvent::Frame(r)) => {
                seen.results.push(r);
                on_result(seen.results.len(), &control);
            }
            Ok(PipelineEvent::InputEnded) => {
                let _ = control.send(Control::Stop);
            }
            Ok(PipelineEvent::Error { message, .. }) => {
                seen.errors.push(message);
                let _ = control.send(Control::Stop);
            }
            Ok(PipelineEvent::SessionReset { .. }) => seen.resets += 1,
            Ok(PipelineEvent::Stopped(s)) => seen.summary = Some(*s),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => panic!("no event for {PATIENCE:?}: a hang"),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    pipeline.join();
    seen
}

fn courthouse(frames: u64) -> Box<dyn Source> {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    Box::new(Limited {
        inner: folder,
        left: frames,
    })
}

/// The first `left` frames of a source.
struct Limited<S> {
    inner: S,
    left: u64,
}

impl<S: Source> Source for Limited<S> {
    fn next_frame(
        &mut self,
    ) -> Result<Option<streamrecon::capture::CapturedFrame>, streamrecon::capture::CaptureError>
    {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.inner.next_frame()
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn remaining_hint(&self) -> Option<u64> {
        self.inner.remaining_hint().map(|n| n.min(self.left))
    }
    fn take_warnings(&mut self) -> Vec<String> {
        self.inner.take_warnings()
    }
    fn take_skipped(&mut self) -> u64 {
        self.inner.take_skipped()
    }
    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        self.inner.frame_size_hint()
    }
}

fn accounting_holds(s: &PipelineSummary) {
    assert_eq!(
        s.frames_captured,
        s.frames_processed + s.frames_dropped + s.frames_discarded + s.frames_skipped,
        "{s:#?}"
    );
}

/// Two calls in flight, decoded frames handed to the backend: the same results, in the same
/// order, as the synchronous CPU backend with host preprocessing.
#[test]
fn queued_calls_come_out_in_order_and_equal_the_synchronous_run() {
    let want = run(
        courthouse(10),
        cpu_model(),
        PipelineConfig::default(),
        |_, _| {},
    );
    let model = queued(true);
    let got = run(
        courthouse(10),
        Arc::clone(&model) as Arc<dyn FrameModel>,
        PipelineConfig::default(),
        |_, _| {},
    );
    assert!(got.errors.is_empty(), "{:?}", got.errors);
    assert_eq!(got.results.len(), 10);
    assert!(
        model.deepest.load(Ordering::SeqCst) == 2,
        "the pipeline never had two calls in flight"
    );
    for (g, w) in got.results.iter().zip(&want.results) {
        assert_eq!(g.frame, w.frame);
        assert_eq!(g.frame_type, w.frame_type);
        assert_eq!(
            g.world_from_camera, w.world_from_camera,
            "frame {}",
            g.frame
        );
        assert_eq!(g.image, w.image, "frame {}: model input", g.frame);
        assert_eq!(g.points.xyz, w.points.xyz, "frame {}", g.frame);
    }
    let s = got.summary.expect("summary");
    assert_eq!(s.frames_processed, 10);
    assert!(s.steady_fps > 0.0 && s.first_result_s.is_some());
    accounting_holds(&s);
}

/// A stop, a reset and a pause with calls in flight: each call submitted is finished and its
/// frames published before the stop, the reset or the pause takes effect.
#[test]
fn calls_in_flight_finish_at_stop_reset_and_pause() {
    let model = queued(false);
    let paused = Arc::new(Mutex::new(false));
    let p = Arc::clone(&paused);
    let seen = run(
        courthouse(40),
        Arc::clone(&model) as Arc<dyn FrameModel>,
        PipelineConfig::default(),
        move |n, control| match n {
            4 => {
                let _ = control.send(Control::Reset);
            }
            8 => {
                let _ = control.send(Control::Pause);
                *p.lock().unwrap() = true;
                let resume = control.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(200));
                    let _ = resume.send(Control::Resume);
                });
            }
            14 => {
                let _ = control.send(Control::Stop);
            }
            _ => {}
        },
    );
    assert!(*paused.lock().unwrap());
    assert_eq!(seen.resets, 1);
    let s = seen.summary.expect("summary");
    let calls = model.submitted.load(Ordering::SeqCst);
    assert_eq!(
        calls,
        model.finished.load(Ordering::SeqCst),
        "every call submitted was finished"
    );
    // Results are every frame of every call: none lost in flight.
    assert_eq!(seen.results.len() as u64, s.frames_processed);
    assert!(s.frames_processed >= 14);
    let frames: Vec<u64> = seen.results.iter().map(|r| r.frame).collect();
    assert!(frames.windows(2).all(|w| w[0] < w[1]), "{frames:?}");
    accounting_holds(&s);
}

/// `--pace` on a folder: far faster than inference, frames are dropped and counted; slow enough,
/// nothing is dropped.
#[test]
fn a_paced_folder_drops_only_what_inference_misses() {
    let model = cpu_model();
    let fast = run(
        Box::new(Paced::new(courthouse(40), 400.0)),
        Arc::clone(&model) as Arc<dyn FrameModel>,
        PipelineConfig::default(),
        |_, _| {},
    );
    let s = fast.summary.expect("summary");
    assert!(s.frames_dropped > 0, "{s:#?}");
    // Drops are told with the frame that replaced them (the last ones may have none).
    let reported: u64 = fast.results.iter().map(|r| r.dropped_before).sum();
    assert!(
        reported > 0 && reported <= s.frames_dropped,
        "{reported} of {s:#?}"
    );
    accounting_holds(&s);

    let slow = run(
        Box::new(Paced::new(courthouse(8), 8.0)),
        model as Arc<dyn FrameModel>,
        PipelineConfig::default(),
        |_, _| {},
    );
    let s = slow.summary.expect("summary");
    assert_eq!(s.frames_dropped, 0, "{s:#?}");
    assert_eq!(s.frames_processed, 8);
    accounting_holds(&s);
}

/// The decode pool keeps the folder's order, and a file that does not decode is counted as
/// captured and skipped, with a warning naming it.
#[test]
fn the_decode_pool_keeps_order_and_counts_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<_> = std::fs::read_dir(COURTHOUSE)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    // Names whose natural order differs from their byte order.
    for (i, src) in names.iter().take(9).enumerate() {
        std::fs::copy(src, dir.path().join(format!("f{}.png", i * 5))).unwrap();
    }
    std::fs::write(dir.path().join("f12.png"), b"not a png").unwrap();
    let folder = ImageFolder::open(dir.path(), CorruptFilePolicy::Skip)
        .unwrap()
        .with_workers(4);
    let seen = run(
        Box::new(folder),
        cpu_model(),
        PipelineConfig::default(),
        |_, _| {},
    );
    let s = seen.summary.expect("summary");
    assert_eq!(s.frames_processed, 9);
    assert_eq!(s.frames_skipped, 1, "{s:#?}");
    assert_eq!(s.frames_captured, 10);
    assert!(
        s.warnings.iter().any(|w| w.contains("f12.png")),
        "{:?}",
        s.warnings
    );
    accounting_holds(&s);
    // In order: each result is its file's frame (the same input image as that file alone).
    let cfg = cpu_model().limits().preprocess;
    for (k, r) in seen.results.iter().enumerate() {
        let img =
            streamrecon::capture::folder::decode_rgb8(&dir.path().join(format!("f{}.png", k * 5)))
                .unwrap();
        let pre = streamrecon::model::preprocess::preprocess_rgb8(
            &img.data,
            img.width as usize,
            img.height as usize,
            &cfg,
        )
        .unwrap();
        assert_eq!(r.image, pre.to_rgb8(), "result {k} is not file f{}", k * 5);
    }
}

/// A file that cannot be read (gone since the folder was listed) is skipped like one that does
/// not decode, and counted, instead of ending a lenient run; `--strict` still stops on it.
#[test]
fn an_unreadable_file_is_skipped_unless_strict() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..3 {
        let name = format!("{:06}.png", 2 * i);
        std::fs::copy(Path::new(COURTHOUSE).join(&name), dir.path().join(&name)).unwrap();
    }
    let mut lenient = ImageFolder::open(dir.path(), CorruptFilePolicy::Skip).unwrap();
    let mut strict = ImageFolder::open(dir.path(), CorruptFilePolicy::Stop).unwrap();
    std::fs::remove_file(dir.path().join("000002.png")).unwrap();
    let mut frames = 0;
    while lenient.next_frame().expect("lenient keeps going").is_some() {
        frames += 1;
    }
    assert_eq!(frames, 2);
    assert_eq!(lenient.take_skipped(), 1);
    let warnings = lenient.take_warnings();
    assert!(
        warnings.iter().any(|w| w.contains("000002.png")),
        "{warnings:?}"
    );
    assert!(strict.next_frame().expect("first file").is_some());
    let err = strict.next_frame().expect_err("strict stops");
    assert!(err.to_string().contains("000002.png"), "{err}");
}

/// A live source is read only once the model's session is prepared for its frames: a slow
/// warm-up (the GPU tunes and captures its calls) costs no frames.
#[test]
fn a_live_source_waits_for_the_warm_up() {
    let model = slow_to_start(true, Duration::from_millis(800));
    let seen = run(
        Box::new(Paced::new(courthouse(10), 10.0)),
        model as Arc<dyn FrameModel>,
        PipelineConfig::default(),
        |_, _| {},
    );
    let s = seen.summary.expect("summary");
    assert_eq!((s.frames_processed, s.frames_dropped), (10, 0), "{s:#?}");
    assert!(s.session_start_s >= 0.8, "{s:#?}");
    assert_eq!(s.sessions, 1);
    accounting_holds(&s);
}
