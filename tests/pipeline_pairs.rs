//! Two frames a step (`PipelineConfig::frames_per_step`, `run --frames-per-step 2`) on the CPU
//! with the gct-tiny fixture: every frame's results must be the ones one frame a step gives
//! (poses, depth, points, kinds, indices, order, counts), with odd frame counts (the last frame
//! held, then run alone) and keyframe intervals that make keyframe/non-keyframe pairs. Besides
//! the CPU model itself (whose `submit_pair` is the trait's default: two calls), an asynchronous
//! adapter runs pairs the ways a GPU does: as one call of two frames, or falling back to two
//! calls, within the backend's calls in flight. Live sources are refused, in the library and on
//! the command line.

mod common;

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use streamrecon::capture::{CorruptFilePolicy, ImageFolder, Paced, Source};
use streamrecon::frame::{CacheSnapshot, FrameResult, FrameType};
use streamrecon::model::{GctModel, ModelConfig, ModelError};
use streamrecon::pipeline::{
    CallImages, Control, CpuFrameModel, Delivery, FrameModel, FramesPerStep, KeyframePolicy,
    KeyframeRule, ModelLimits, ModelSession, ModelStep, OnBudget, Outputs, PairCall, PairSubmitted,
    Pipeline, PipelineConfig, PipelineError, PipelineEvent, PipelineSummary, PointFilter,
    SessionOptions, Submitted,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/gct-tiny");
const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);
const PATIENCE: Duration = Duration::from_secs(120);

/// One CPU model for every test of this file (loading it is most of a small run).
fn cpu_model() -> Arc<CpuFrameModel> {
    static MODEL: OnceLock<Arc<CpuFrameModel>> = OnceLock::new();
    Arc::clone(MODEL.get_or_init(|| {
        let dir = Path::new(FIXTURE);
        let cfg = ModelConfig::from_json_file(&dir.join("kf1/config.json")).unwrap();
        Arc::new(CpuFrameModel::new(
            GctModel::load(cfg, &dir.join("weights.safetensors")).unwrap(),
        ))
    }))
}

fn courthouse() -> Box<dyn Source> {
    Box::new(ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap())
}

fn config(frames: u64, interval: u64, per_step: FramesPerStep) -> PipelineConfig {
    PipelineConfig {
        max_frames: Some(frames),
        keyframes: Some(KeyframePolicy {
            rule: KeyframeRule::Fixed { interval },
            view_budget: 320,
            on_budget: OnBudget::Freeze,
        }),
        frames_per_step: per_step,
        ..PipelineConfig::default()
    }
}

struct Seen {
    results: Vec<Arc<FrameResult>>,
    summary: PipelineSummary,
}

/// Runs `source` to its end and stops.
fn run(source: Box<dyn Source>, model: Arc<dyn FrameModel>, config: PipelineConfig) -> Seen {
    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Lossless, 4);
    let pipeline = Pipeline::start(source, model, config, outputs).unwrap();
    let control = pipeline.control();
    let mut results = Vec::new();
    let mut summary = None;
    loop {
        match events.recv_timeout(PATIENCE) {
            Ok(PipelineEvent::Frame(r)) => results.push(r),
            Ok(PipelineEvent::InputEnded) => {
                // The pipeline may have stopped already; what it did is in its events.
                control.send(Control::Stop).ok();
            }
            Ok(PipelineEvent::Error { stage, message }) => panic!("{stage}: {message}"),
            Ok(PipelineEvent::Stopped(s)) => summary = Some(*s),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => panic!("no event for {PATIENCE:?}: a hang"),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    pipeline.join();
    Seen {
        results,
        summary: summary.expect("a summary at the end"),
    }
}

/// Every frame's results equal, field by field (not the timings, which are measured).
/// `cache`: the cache snapshots too (a backend that queues calls takes them at another time).
fn assert_same_frames(label: &str, single: &Seen, paired: &Seen, cache: bool) {
    let indices = |s: &Seen| s.results.iter().map(|r| r.frame).collect::<Vec<_>>();
    assert_eq!(indices(paired), indices(single), "{label}: frames or order");
    for (a, b) in single.results.iter().zip(&paired.results) {
        let at = format!("{label}, frame {}", a.frame);
        assert_eq!(b.frame_type, a.frame_type, "{at}: kind");
        assert_eq!(b.world_from_camera, a.world_from_camera, "{at}: pose");
        assert_eq!(b.camera_from_world, a.camera_from_world, "{at}: pose");
        assert_eq!(b.intrinsics, a.intrinsics, "{at}: intrinsics");
        assert_eq!(b.depth, a.depth, "{at}: depth");
        assert_eq!(b.confidence, a.confidence, "{at}: confidence");
        assert_eq!(b.points, a.points, "{at}: points");
        assert_eq!(b.image, a.image, "{at}: image");
        assert_eq!(b.origin, a.origin, "{at}: origin");
        assert_eq!(b.dropped_before, a.dropped_before, "{at}: drops");
        if cache {
            assert_eq!(b.cache, a.cache, "{at}: cache snapshot");
        }
    }
    let counts = |s: &PipelineSummary| {
        (
            s.frames_captured,
            s.frames_processed,
            s.frames_dropped,
            s.frames_discarded,
            s.frames_skipped,
            s.scale_frames,
            s.keyframes,
            s.non_keyframes,
            s.sessions,
            s.committed_frames_at_end,
            s.errors.clone(),
        )
    };
    assert_eq!(
        counts(&paired.summary),
        counts(&single.summary),
        "{label}: summary"
    );
}

fn kinds(seen: &Seen) -> Vec<FrameType> {
    seen.results.iter().map(|r| r.frame_type).collect()
}

#[test]
fn cpu_pairs_give_the_single_frame_results() {
    let model = cpu_model();
    // 2 scale frames, then pairs; odd counts leave the last frame to run alone.
    for (frames, interval) in [(9, 1), (10, 2), (11, 3)] {
        let label = format!("{frames} frames, keyframe interval {interval}");
        let single = run(
            courthouse(),
            model.clone(),
            config(frames, interval, FramesPerStep::One),
        );
        let paired = run(
            courthouse(),
            model.clone(),
            config(frames, interval, FramesPerStep::Two),
        );
        assert_eq!(single.results.len() as u64, frames, "{label}");
        assert_same_frames(&label, &single, &paired, true);
        if interval == 3 {
            // The pairs are (K, N), (N, K), (N, N), (K, N): every mixed kind occurs.
            let k = kinds(&paired);
            assert_eq!(
                k[2..6],
                [
                    FrameType::Keyframe,
                    FrameType::NonKeyframe,
                    FrameType::NonKeyframe,
                    FrameType::Keyframe
                ]
            );
        }
    }
}

/// How the adapter runs a two-frame step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PairMode {
    /// The trait's default: two one-frame calls.
    Default,
    /// One call of both frames, as the GPU's two-frame step.
    Together,
    /// One call, except every other step, which falls back to two calls (as the GPU does when
    /// its page table cannot plan the two together).
    SometimesApart,
}

#[derive(Default)]
struct Watch {
    /// Most calls held at once.
    deepest: AtomicUsize,
    /// A pair was submitted with the backend's calls in flight at their limit, or a call past
    /// its slots.
    over_limit: AtomicBool,
    together: AtomicUsize,
    apart: AtomicUsize,
}

/// The CPU model as an asynchronous backend (the GPU's contract without a GPU): calls run at
/// `submit` and their outputs wait for `finish`, two in flight, a third slot only for a
/// two-frame step's fallback.
struct Async {
    inner: Arc<CpuFrameModel>,
    decoded: bool,
    mode: PairMode,
    watch: Arc<Watch>,
}

struct AsyncSession {
    inner: Box<dyn ModelSession>,
    mode: PairMode,
    held: VecDeque<ModelStep>,
    watch: Arc<Watch>,
    pairs: usize,
}

const IN_FLIGHT: usize = 2;

impl FrameModel for Async {
    fn describe(&self) -> String {
        format!("async {}", self.inner.describe())
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
        Ok(Box::new(AsyncSession {
            inner: self.inner.start_session(height, width, options)?,
            mode: self.mode,
            held: VecDeque::new(),
            watch: Arc::clone(&self.watch),
            pairs: 0,
        }))
    }
}

impl AsyncSession {
    /// Runs a call on the CPU now and keeps its outputs for `finish`.
    fn run(
        &mut self,
        images: CallImages<'_>,
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<ModelStep, ModelError> {
        match self.inner.submit(images, frames, keyframe)? {
            Submitted::Done(step) => Ok(*step),
            Submitted::Queued => Err(ModelError::BadInput("the CPU model queued a call".into())),
        }
    }

    fn hold(&mut self, step: ModelStep) -> Submitted {
        if self.held.len() > IN_FLIGHT {
            self.watch.over_limit.store(true, Ordering::SeqCst);
        }
        self.held.push_back(step);
        self.watch
            .deepest
            .fetch_max(self.held.len(), Ordering::SeqCst);
        Submitted::Queued
    }

    fn queued(&mut self, step: Result<ModelStep, ModelError>) -> PairCall {
        PairCall {
            submitted: step.map(|s| self.hold(s)),
            cache: None,
        }
    }
}

/// Two one-frame steps' outputs as one two-frame step's.
fn joined(a: ModelStep, b: ModelStep) -> ModelStep {
    let cat = |x: Vec<f32>, y: Vec<f32>| [x, y].concat();
    ModelStep {
        frames: a.frames + b.frames,
        height: a.height,
        width: a.width,
        depth: cat(a.depth, b.depth),
        depth_conf: cat(a.depth_conf, b.depth_conf),
        cameras: [a.cameras, b.cameras].concat(),
        stages: a.stages,
        points: a.points.zip(b.points).map(|(x, y)| [x, y].concat()),
        model_rgb: a.model_rgb.zip(b.model_rgb).map(|(x, y)| [x, y].concat()),
    }
}

impl ModelSession for AsyncSession {
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
        // A call past the spare slot is caught in `hold`; whether a one-frame call took the
        // spare slot shows in `deepest`.
        let step = self.run(images, frames, key)?;
        Ok(self.hold(step))
    }
    fn submit_pair(
        &mut self,
        images: CallImages<'_>,
        frames: [u64; 2],
        keyframes: [bool; 2],
    ) -> PairSubmitted {
        if self.held.len() >= IN_FLIGHT {
            self.watch.over_limit.store(true, Ordering::SeqCst);
        }
        self.pairs += 1;
        let apart = match self.mode {
            PairMode::Default => return TraitDefault(self).submit_pair(images, frames, keyframes),
            PairMode::Together => false,
            PairMode::SometimesApart => self.pairs.is_multiple_of(2),
        };
        let [first, second] = match images.split_pair() {
            Ok(halves) => halves,
            Err(e) => {
                return PairSubmitted::Together(PairCall {
                    submitted: Err(e),
                    cache: None,
                });
            }
        };
        let a = self.run(first, frames[0]..frames[0] + 1, keyframes[0]);
        let b = self.run(second, frames[1]..frames[1] + 1, keyframes[1]);
        if apart {
            self.watch.apart.fetch_add(1, Ordering::SeqCst);
            PairSubmitted::Apart([self.queued(a), self.queued(b)])
        } else {
            self.watch.together.fetch_add(1, Ordering::SeqCst);
            let both = a.and_then(|a| Ok(joined(a, b?)));
            PairSubmitted::Together(self.queued(both))
        }
    }
    fn finish(&mut self) -> Result<ModelStep, ModelError> {
        self.held
            .pop_front()
            .ok_or_else(|| ModelError::BadInput("finish without a call held".into()))
    }
    fn max_in_flight(&self) -> usize {
        IN_FLIGHT
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

/// An adapter session seen through the trait's default `submit_pair`.
struct TraitDefault<'a>(&'a mut AsyncSession);

impl ModelSession for TraitDefault<'_> {
    fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        key: bool,
    ) -> Result<ModelStep, ModelError> {
        self.0.step(images, frames, key)
    }
    fn submit(
        &mut self,
        images: CallImages<'_>,
        frames: Range<u64>,
        key: bool,
    ) -> Result<Submitted, ModelError> {
        self.0.submit(images, frames, key)
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

#[test]
fn queued_pairs_together_or_apart_give_the_single_frame_results() {
    let single = run(courthouse(), cpu_model(), config(11, 3, FramesPerStep::One));
    for decoded in [false, true] {
        for mode in [
            PairMode::Default,
            PairMode::Together,
            PairMode::SometimesApart,
        ] {
            let watch = Arc::new(Watch::default());
            let model = Arc::new(Async {
                inner: cpu_model(),
                decoded,
                mode,
                watch: Arc::clone(&watch),
            });
            let paired = run(courthouse(), model, config(11, 3, FramesPerStep::Two));
            let label = format!("{mode:?}, decoded {decoded}");
            // Decoded frames are resized by the backend (here the host's own resize): the
            // same pixels.
            assert_same_frames(&label, &single, &paired, false);
            assert!(
                !watch.over_limit.load(Ordering::SeqCst),
                "{label}: a call past the backend's calls in flight"
            );
            // 9 streaming frames: four pairs, the last frame alone.
            let (together, apart) = (
                watch.together.load(Ordering::SeqCst),
                watch.apart.load(Ordering::SeqCst),
            );
            match mode {
                PairMode::Default => assert_eq!((together, apart), (0, 0), "{label}"),
                PairMode::Together => assert_eq!((together, apart), (4, 0), "{label}"),
                PairMode::SometimesApart => assert_eq!((together, apart), (2, 2), "{label}"),
            }
            // Two calls for a pair may pass the limit by one (the spare slot), never more; one
            // call of two frames stays within it.
            let deepest = watch.deepest.load(Ordering::SeqCst);
            let limit = match mode {
                PairMode::Together => IN_FLIGHT,
                PairMode::Default | PairMode::SometimesApart => IN_FLIGHT + 1,
            };
            assert_eq!(deepest, limit, "{label}: calls held at once");
        }
    }
}

#[test]
fn live_sources_refuse_two_frames_a_step() {
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let paced = Box::new(Paced::new(Box::new(folder), 30.0));
    let config = config(5, 1, FramesPerStep::Two);
    let err = match Pipeline::start(paced, cpu_model(), config, Outputs::default()) {
        Err(e) => e,
        Ok(_) => panic!("a paced folder ran two frames a step"),
    };
    assert!(
        matches!(err, PipelineError::PairsNeedFileSource(_)),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("file sources") && text.contains("latency") && text.contains("30 fps"),
        "{text}"
    );
    // One frame a step is as it was.
    let folder = ImageFolder::open(Path::new(COURTHOUSE), CorruptFilePolicy::Skip).unwrap();
    let paced = Box::new(Paced::new(Box::new(folder), 30.0));
    assert!(config_allows(paced, FramesPerStep::One));
    // An unpaced folder takes two.
    assert!(config_allows(courthouse(), FramesPerStep::Two));
}

fn config_allows(source: Box<dyn Source>, per_step: FramesPerStep) -> bool {
    config(5, 1, per_step).check_source(source.as_ref()).is_ok()
}

#[test]
fn cli_refuses_three_frames_a_step_and_pairs_on_a_paced_folder() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("session");
    let three = common::tiny_run(Path::new(COURTHOUSE), &out, &["--frames-per-step", "3"]);
    let stderr = common::text(&three.stderr);
    assert!(!three.status.success(), "{stderr}");
    assert!(
        stderr.contains("--frames-per-step") && stderr.contains("3") && stderr.contains("1..=2"),
        "{stderr}"
    );
    let paced = common::tiny_run(
        Path::new(COURTHOUSE),
        &out,
        &["--frames-per-step", "2", "--pace", "30"],
    );
    let stderr = common::text(&paced.stderr);
    assert!(!paced.status.success(), "{stderr}");
    assert!(
        stderr.contains("--frames-per-step 2")
            && stderr.contains("file sources")
            && stderr.contains("is live")
            && stderr.contains("latency"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Refused before anything was written.
    assert!(!out.exists(), "the refused run wrote {}", out.display());
}

/// `run --headless --frames-per-step 2` writes the session one frame a step writes: the same
/// trajectory and cloud (both from the recording) and the same per-frame records.
#[test]
fn cli_two_frames_a_step_records_the_same_session() {
    let dir = tempfile::tempdir().unwrap();
    let session = |per_step: &str| {
        let out = dir.path().join(format!("per-step-{per_step}"));
        let run = common::tiny_run(
            Path::new(COURTHOUSE),
            &out,
            &[
                "--max-frames",
                "9",
                "--keyframe-interval",
                "2",
                "--frames-per-step",
                per_step,
            ],
        );
        let (stdout, stderr) = (common::text(&run.stdout), common::text(&run.stderr));
        assert!(run.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stdout.contains("9 processed of 9 captured"), "{stdout}");
        out
    };
    let (one, two) = (session("1"), session("2"));
    for file in ["trajectory.tum", "points.ply"] {
        let a = std::fs::read(one.join(file)).unwrap();
        let b = std::fs::read(two.join(file)).unwrap();
        assert!(a == b, "{file} differs between one and two frames a step");
    }
    let recorded = |dir: &Path| {
        let reader = streamrecon::record::SessionReader::open(dir.join("session.srec")).unwrap();
        assert!(reader.indexed(), "{:?}", reader.issues());
        let header = reader.config()["frames_per_step"].clone();
        let frames: Vec<_> = reader
            .frames()
            .iter()
            .map(|f| (f.frame, f.frame_type, f.world_from_camera))
            .collect();
        (header, frames)
    };
    let (header_one, frames_one) = recorded(&one);
    let (header_two, frames_two) = recorded(&two);
    assert_eq!((header_one, header_two), (1.into(), 2.into()));
    assert_eq!(frames_two, frames_one);
    assert_eq!(frames_one.len(), 9);
}
