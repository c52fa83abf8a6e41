//! The model as the inference thread sees it: a small trait, so the pipeline does not care
//! which backend runs. The CPU [`GctModel`] implements it here; a GPU model implements the
//! same two traits.

use std::ops::Range;
use std::sync::Arc;

use crate::attention::{AttentionLayout, CpuKvCache};
use crate::model::pose::Camera;
use crate::model::preprocess::{PreprocessConfig, preprocess_rgb8};
use crate::model::{GctModel, ModelConfig, ModelError, StreamState};

use super::frame::PointFilter;
use crate::frame::{CacheSnapshot, FramePoints, RgbImage, StageTime};

/// What a session is created with. Changing any of these needs a new session (a reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    pub layout: AttentionLayout,
    /// Keyframes kept in full after the scale frames.
    pub window: usize,
}

/// Streaming limits and input size of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLimits {
    /// How frames are resized for this model.
    pub preprocess: PreprocessConfig,
    /// Frames of the first call (kept forever as the anchor).
    pub scale_frames: usize,
    /// Length of the 3D RoPE temporal table: committed frames + frames in a call must fit.
    pub max_frame_num: usize,
    pub default_window: usize,
    pub default_keyframe_interval: usize,
    /// The backend takes decoded frames and preprocesses them itself ([`CallImages::Decoded`]):
    /// the capture thread then only decodes.
    pub preprocesses_on_device: bool,
}

impl ModelLimits {
    /// The limits a model configuration implies (the same on every backend).
    pub fn of(c: &ModelConfig) -> Self {
        ModelLimits {
            preprocess: PreprocessConfig {
                width: c.img_size,
                patch: c.patch,
            },
            scale_frames: c.scale_frames,
            max_frame_num: c.max_frame_num,
            default_window: c.window,
            default_keyframe_interval: c.keyframe_interval,
            preprocesses_on_device: false,
        }
    }
}

/// The outputs of one call, per frame of the call.
#[derive(Debug, Clone)]
pub struct ModelStep {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// `[S][H][W]`.
    pub depth: Vec<f32>,
    /// `[S][H][W]`, ≥ 1.
    pub depth_conf: Vec<f32>,
    pub cameras: Vec<Camera>,
    /// The call's stages as the backend measures them (for the whole call).
    pub stages: Vec<StageTime>,
    /// Each frame's kept points when the backend filters them itself (the GPU model does, so
    /// only they cross to the host); None: the pipeline unprojects and filters the depth maps.
    pub points: Option<Vec<FramePoints>>,
    /// Each frame's model input as 8-bit RGB when the backend preprocessed it.
    pub model_rgb: Option<Vec<RgbImage>>,
}

/// The images of one call, as the capture thread prepared them.
#[derive(Debug, Clone, Copy)]
pub enum CallImages<'a> {
    /// `[S][3][H][W]` in [0, 1], preprocessed on the host.
    Preprocessed(&'a [f32]),
    /// Decoded frames for a backend that preprocesses ([`ModelLimits::preprocesses_on_device`]).
    Decoded(&'a [&'a RgbImage]),
}

impl<'a> CallImages<'a> {
    /// The images of a two-frame step as two one-frame calls' images.
    pub fn split_pair(self) -> Result<[CallImages<'a>; 2], ModelError> {
        match self {
            CallImages::Preprocessed(values) => {
                // Two frames of one size: the halves are the frames.
                if values.is_empty() || !values.len().is_multiple_of(2) {
                    return Err(ModelError::BadInput(format!(
                        "a two-frame step needs two images of equal size, got {} values",
                        values.len()
                    )));
                }
                let (first, second) = values.split_at(values.len() / 2);
                Ok([
                    CallImages::Preprocessed(first),
                    CallImages::Preprocessed(second),
                ])
            }
            CallImages::Decoded(frames) => match frames {
                [first, second] => Ok([
                    CallImages::Decoded(std::slice::from_ref(first)),
                    CallImages::Decoded(std::slice::from_ref(second)),
                ]),
                _ => Err(ModelError::BadInput(format!(
                    "a two-frame step needs two images, got {}",
                    frames.len()
                ))),
            },
        }
    }
}

/// What [`ModelSession::submit`] did with a call.
#[derive(Debug)]
pub enum Submitted {
    /// Ran it to the end (a backend without asynchronous calls).
    Done(Box<ModelStep>),
    /// Queued it; its outputs come from [`ModelSession::finish`], in order.
    Queued,
}

/// One call of a two-frame step ([`ModelSession::submit_pair`]).
#[derive(Debug)]
pub struct PairCall {
    /// What became of the call: its error is the error of the frames it holds.
    pub submitted: Result<Submitted, ModelError>,
    /// The cache as this call left it, taken when the call was submitted. A two-frame step that
    /// runs as two calls returns after both, so the first frame's view of the cache would be
    /// gone by the time its results are built. None: the pipeline takes it when the call
    /// finishes, as for any call.
    pub cache: Option<Box<CacheSnapshot>>,
}

/// What [`ModelSession::submit_pair`] did with its two frames.
#[derive(Debug)]
pub enum PairSubmitted {
    /// One call holding both frames: one result (or one [`ModelSession::finish`]) gives both.
    Together(PairCall),
    /// Two one-frame calls, the first frame's first (the backend could not, or does not, run the
    /// two as one step); each is finished on its own.
    Apart([PairCall; 2]),
}

/// A loaded model of any backend.
pub trait FrameModel: Send + Sync {
    /// Backend and size, for logs and the summary.
    fn describe(&self) -> String;
    fn limits(&self) -> ModelLimits;
    /// A fresh stream of `height × width` inputs.
    fn start_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError>;

    /// A fresh stream whose streaming frames will come two a step
    /// ([`ModelSession::submit_pair`]). A backend that prepares each kind of call before the
    /// stream (the GPU tunes and captures its graphs in [`ModelSession::warm_up`]) prepares the
    /// two-frame calls too; the default opens an ordinary session, whose `submit_pair` runs the
    /// frames as two calls.
    fn start_pair_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        self.start_session(height, width, options)
    }
}

/// One stream's caches on some backend.
pub trait ModelSession: Send {
    /// One call of the streaming schedule: `images` are `[S][3][H][W]` in [0, 1].
    fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<ModelStep, ModelError>;
    /// Frames committed so far (the 3D RoPE temporal index of the next frame).
    fn committed_frames(&self) -> u64;
    /// The cache as the last step left it.
    fn cache_snapshot(&self) -> CacheSnapshot;
    /// Occupied and total pages, for progress displays.
    fn cache_occupancy(&self) -> (usize, usize);
    /// How points are kept, for backends that filter on their own (see [`ModelStep::points`]).
    fn set_point_filter(&mut self, _filter: PointFilter) {}

    /// Starts one call. A backend that can run calls asynchronously queues it (the host then
    /// prepares the next call while the device runs this one); the default runs it now.
    fn submit(
        &mut self,
        images: CallImages<'_>,
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<Submitted, ModelError> {
        let step = match images {
            CallImages::Preprocessed(pixels) => self.step(pixels, frames, keyframe)?,
            CallImages::Decoded(decoded) => {
                let (pixels, model_rgb) = host_preprocess(decoded, &self.preprocess_config())?;
                let mut step = self.step(&pixels, frames, keyframe)?;
                step.model_rgb = Some(model_rgb);
                step
            }
        };
        Ok(Submitted::Done(Box::new(step)))
    }

    /// Starts two consecutive streaming frames as one step: `images` holds both (as
    /// [`Self::submit`] takes one call's), `frames` their increasing indices and `keyframes`
    /// each frame's kind as the keyframe policy decided it frame by frame. Each frame must come
    /// out as it would streamed alone. The default submits the frames as two one-frame calls
    /// (so a backend without a two-frame step gives exactly its one-frame results); a backend
    /// that runs both in one call returns [`PairSubmitted::Together`]. Counts as one call in
    /// flight: the pipeline submits it with fewer than [`Self::max_in_flight`] calls in flight,
    /// so two calls (the default's, or a fallback's) may pass that limit by one. A backend that
    /// queues calls and keeps this default must take that one call more, as the GPU's spare
    /// slot does.
    fn submit_pair(
        &mut self,
        images: CallImages<'_>,
        frames: [u64; 2],
        keyframes: [bool; 2],
    ) -> PairSubmitted {
        let [first, second] = match images.split_pair() {
            Ok(halves) => halves,
            Err(e) => {
                return PairSubmitted::Together(PairCall {
                    submitted: Err(e),
                    cache: None,
                });
            }
        };
        let mut call = |images: CallImages<'_>, i: usize| {
            let submitted = self.submit(images, frames[i]..frames[i] + 1, keyframes[i]);
            // Taken now: the second call moves the cache on before the first one's results
            // are built.
            let cache = submitted.is_ok().then(|| Box::new(self.cache_snapshot()));
            PairCall { submitted, cache }
        };
        let first = call(first, 0);
        let second = call(second, 1);
        PairSubmitted::Apart([first, second])
    }

    /// The outputs of the oldest queued call (waits for it).
    fn finish(&mut self) -> Result<ModelStep, ModelError> {
        Err(ModelError::BadInput(
            "this backend queues no calls: there is nothing to finish".into(),
        ))
    }

    /// Prepares the session for a stream before its first frame (the GPU tunes and captures its
    /// calls); the session is as new afterwards. The default does nothing.
    fn warm_up(&mut self) -> Result<(), ModelError> {
        Ok(())
    }

    /// Calls that may be queued at once ([`Self::submit`] returning `Queued`).
    fn max_in_flight(&self) -> usize {
        1
    }

    /// How decoded frames given to the default [`Self::submit`] are preprocessed.
    fn preprocess_config(&self) -> PreprocessConfig {
        PreprocessConfig::default()
    }
}

/// Decoded frames preprocessed on the host: `[S][3][H][W]` back to back, and each as 8-bit RGB.
fn host_preprocess(
    frames: &[&RgbImage],
    cfg: &PreprocessConfig,
) -> Result<(Vec<f32>, Vec<RgbImage>), ModelError> {
    let mut pixels = Vec::new();
    let mut rgb = Vec::with_capacity(frames.len());
    for f in frames {
        let pre = preprocess_rgb8(&f.data, f.width as usize, f.height as usize, cfg)?;
        rgb.push(pre.to_rgb8());
        pixels.extend_from_slice(&pre.data);
    }
    Ok((pixels, rgb))
}

/// The CPU model behind the trait.
pub struct CpuFrameModel {
    model: Arc<GctModel>,
}

impl CpuFrameModel {
    pub fn new(model: GctModel) -> Self {
        CpuFrameModel {
            model: Arc::new(model),
        }
    }

    pub fn from_shared(model: Arc<GctModel>) -> Self {
        CpuFrameModel { model }
    }
}

impl FrameModel for CpuFrameModel {
    fn describe(&self) -> String {
        let c = self.model.config();
        format!(
            "CPU f32 GCT (embed {}, depth {}, input width {})",
            c.embed, c.depth, c.img_size
        )
    }

    fn limits(&self) -> ModelLimits {
        ModelLimits::of(self.model.config())
    }

    fn start_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        let mut state = self.model.new_stream(height, width, options.layout)?;
        if options.window != state.cache.config().sliding_window {
            let mut cfg = state.cache.config().clone();
            cfg.sliding_window = options.window;
            state.cache = CpuKvCache::new(cfg, options.layout)?;
        }
        Ok(Box::new(CpuSession {
            model: Arc::clone(&self.model),
            state,
            preprocess: self.limits().preprocess,
        }))
    }
}

struct CpuSession {
    model: Arc<GctModel>,
    state: StreamState,
    preprocess: PreprocessConfig,
}

impl ModelSession for CpuSession {
    fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<ModelStep, ModelError> {
        let out = self
            .model
            .step(&mut self.state, images, frames, keyframe, None)?;
        let t = out.timings;
        let named = [
            ("dino", t.dino_ms),
            ("frame_blocks", t.frame_blocks_ms),
            // Global blocks without their cache attention, so the stages add up.
            ("global_blocks", t.global_blocks_ms - t.global_attention_ms),
            ("global_attention", t.global_attention_ms),
            ("camera_head", t.camera_head_ms),
            ("depth_head", t.depth_head_ms),
        ];
        let accounted: f64 = named.iter().map(|(_, ms)| ms).sum();
        let mut stages: Vec<StageTime> = named
            .into_iter()
            .map(|(stage, ms)| StageTime {
                stage: stage.to_owned(),
                ms,
            })
            .collect();
        // Decoding poses and the model's own unprojection.
        stages.push(StageTime {
            stage: "model_other".to_owned(),
            ms: (t.total_ms - accounted).max(0.0),
        });
        Ok(ModelStep {
            frames: out.frames,
            height: out.height,
            width: out.width,
            depth: out.depth,
            depth_conf: out.depth_conf,
            cameras: out.cameras,
            stages,
            points: None,
            model_rgb: None,
        })
    }

    fn preprocess_config(&self) -> PreprocessConfig {
        self.preprocess.clone()
    }

    fn committed_frames(&self) -> u64 {
        self.state.committed_frames()
    }

    fn cache_snapshot(&self) -> CacheSnapshot {
        CacheSnapshot {
            stats: self.state.cache.stats(),
            events: self.state.cache.events().to_vec(),
            page_map: self.state.cache.table().page_map(),
        }
    }

    fn cache_occupancy(&self) -> (usize, usize) {
        let s = self.state.cache.stats();
        (s.allocated_pages - s.free_pages, s.max_pages)
    }
}
