//! The streaming driver: the whole model, and one call of the reference's streaming schedule
//! at a time. Phase 1 runs the scale frames together as one keyframe step (bidirectional among
//! themselves); phase 2 runs one frame per step, keyframes committing to both caches and
//! non-keyframes leaving nothing behind.

use std::ops::Range;
use std::path::Path;

use crate::attention::{AttentionLayout, CpuKvCache};
use crate::kvcache::{CacheConfig, StepKind};

use super::aggregator::{Aggregator, CallPosition};
use super::camera_head::{CameraCache, CameraHead};
use super::config::ModelConfig;
use super::dpt_head::DptHead;
use super::error::{ModelError, Result};
use super::pose::{Camera, decode_pose, unproject_to_world};
use super::record::{Recorder, put};
use super::spec::{POSE_ENC_LEN, SPECIAL_TOKENS};
use super::storage::{Host, HostPlacement, Loader, Placement, Storage};
use super::timing::{StageTimings, ms_since};
use super::weights::WeightStore;
use std::time::Instant;

/// The whole model: its configuration and one weight tree in storage `S` (the CPU model is
/// `GctModel<Host>`; the GPU engine loads `GctModel<Device>` through the same code).
pub struct GctModel<S: Storage = Host> {
    cfg: ModelConfig,
    pub(crate) aggregator: Aggregator<S>,
    pub(crate) camera_head: CameraHead<S>,
    pub(crate) depth_head: DptHead<S>,
}

/// Everything one call produces, per frame of the call.
#[derive(Clone, Debug)]
pub struct StepOutput {
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// `[S][9]`.
    pub pose_enc: Vec<f32>,
    /// `[S][H][W]`.
    pub depth: Vec<f32>,
    /// `[S][H][W]`, always ≥ 1.
    pub depth_conf: Vec<f32>,
    pub cameras: Vec<Camera>,
    /// `[S][H][W][3]`.
    pub world_points: Vec<f32>,
    pub timings: StageTimings,
}

/// Caches and counters of one stream.
pub struct StreamState {
    pub cache: CpuKvCache,
    pub camera: CameraCache,
    pub height: usize,
    pub width: usize,
    /// Scale frames of the sequence (`min(scale_frames, total)`), fixed by the first call.
    scale_frames: Option<usize>,
}

impl StreamState {
    pub fn committed_frames(&self) -> u64 {
        self.cache.committed_frames()
    }
    pub fn reset(&mut self) {
        self.cache.reset();
        self.camera.reset();
        self.scale_frames = None;
    }
}

/// One forward call of the streaming schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub frames: Range<u64>,
    pub keyframe: bool,
}

/// The reference's schedule for `total` frames: the scale frames in one call, then one call
/// per frame; frame `scale + k·interval` is a keyframe.
pub fn streaming_schedule(total: u64, scale_frames: usize, keyframe_interval: usize) -> Vec<Call> {
    let scale = (scale_frames as u64).min(total);
    let mut calls = Vec::new();
    if scale > 0 {
        calls.push(Call {
            frames: 0..scale,
            keyframe: true,
        });
    }
    for i in scale..total {
        let keyframe =
            keyframe_interval <= 1 || (i - scale).is_multiple_of(keyframe_interval as u64);
        calls.push(Call {
            frames: i..i + 1,
            keyframe,
        });
    }
    calls
}

impl<S: Storage> GctModel<S> {
    /// Build the model from a weights store, each tensor going through `place` as it is read
    /// (so at most one tensor is ever in host memory on its way elsewhere); unused tensors are a
    /// warning (see [`WeightStore::finish`]).
    pub fn load_placed(
        cfg: ModelConfig,
        mut store: WeightStore,
        place: &mut dyn Placement<S>,
    ) -> Result<Self> {
        cfg.validate(&store.source().display().to_string())?;
        let mut loader = Loader::new(&mut store, place);
        let aggregator = Aggregator::load(&mut loader, &cfg)?;
        let camera_head = CameraHead::load(&mut loader, &cfg)?;
        let depth_head = DptHead::load(&mut loader, &cfg)?;
        store.finish(false)?;
        Ok(GctModel {
            cfg,
            aggregator,
            camera_head,
            depth_head,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn aggregator(&self) -> &Aggregator<S> {
        &self.aggregator
    }

    pub fn camera_head(&self) -> &CameraHead<S> {
        &self.camera_head
    }

    pub fn depth_head(&self) -> &DptHead<S> {
        &self.depth_head
    }
}

impl GctModel {
    /// The CPU model from a weights store.
    pub fn from_store(cfg: ModelConfig, store: WeightStore) -> Result<Self> {
        Self::load_placed(cfg, store, &mut HostPlacement)
    }

    pub fn load(cfg: ModelConfig, path: &Path) -> Result<Self> {
        Self::from_store(cfg, WeightStore::load(path)?)
    }

    /// A fresh stream for `height × width` images with the given KV layout.
    pub fn new_stream(
        &self,
        height: usize,
        width: usize,
        layout: AttentionLayout,
    ) -> Result<StreamState> {
        let p = self.cfg.patch;
        if height == 0 || width == 0 || !height.is_multiple_of(p) || !width.is_multiple_of(p) {
            return Err(ModelError::BadInput(format!(
                "image {width}×{height} must be a positive multiple of the patch size {p}"
            )));
        }
        let patches = (height / p) * (width / p);
        let cache_cfg = CacheConfig::new(
            self.cfg.depth,
            self.cfg.heads,
            self.cfg.head_dim(),
            patches,
            self.cfg.scale_frames,
            self.cfg.window,
        );
        Ok(StreamState {
            cache: CpuKvCache::new(cache_cfg, layout)?,
            camera: CameraCache::default(),
            height,
            width,
            scale_frames: None,
        })
    }

    /// Run one call: `images` are `[S][3][H][W]` in [0, 1] for stream frames `frames`.
    /// The first call of a stream is phase 1 (its frames are the scale frames).
    pub fn step(
        &self,
        state: &mut StreamState,
        images: &[f32],
        frames: Range<u64>,
        keyframe: bool,
        mut rec: Option<&mut Recorder>,
    ) -> Result<StepOutput> {
        let s = frames.end.saturating_sub(frames.start) as usize;
        let (h, w) = (state.height, state.width);
        if s == 0 || images.len() != s * 3 * h * w {
            return Err(ModelError::BadInput(format!(
                "expected {s} images of 3×{h}×{w} ({} values), got {} values",
                s * 3 * h * w,
                images.len()
            )));
        }
        if !keyframe && s != 1 {
            return Err(ModelError::BadInput(
                "a non-keyframe call holds exactly one frame".into(),
            ));
        }
        if state.scale_frames.is_none() && !keyframe {
            return Err(ModelError::BadInput(
                "the first call of a stream is phase 1 (the scale frames) and must be a keyframe call"
                    .into(),
            ));
        }
        let scale_frames = *state
            .scale_frames
            .get_or_insert(s.min(self.cfg.scale_frames));
        let at = CallPosition {
            committed: state.cache.committed_frames(),
            scale_frames,
        };
        let kind = if keyframe {
            StepKind::Keyframe
        } else {
            StepKind::NonKeyframe
        };
        let start = Instant::now();
        let mut timings = StageTimings::default();
        state.cache.begin_step(frames.clone(), kind)?;
        let taps = match self.aggregator.forward(
            images,
            s,
            h,
            w,
            &at,
            &mut state.cache,
            rec.as_deref_mut(),
            &mut timings,
        ) {
            Ok(t) => t,
            Err(e) => {
                // Leave the cache as it was before the call. The call's own error is the one to
                // report; a failed rollback on top of it is only logged.
                if let Err(abort) = state.cache.abort_step() {
                    tracing::warn!("rolling back the failed step: {abort}");
                }
                return Err(e);
            }
        };
        state.cache.end_step()?;

        let np = (h / self.cfg.patch) * (w / self.cfg.patch);
        let p = SPECIAL_TOKENS + np;
        let width2 = self.cfg.head_input_dim();
        let last = taps
            .last()
            .ok_or_else(|| ModelError::BadInput("model has no taps".into()))?;
        let camera_tokens: Vec<f32> = (0..s)
            .flat_map(|f| {
                last[f * p * width2..f * p * width2 + width2]
                    .iter()
                    .copied()
            })
            .collect();
        let clock = Instant::now();
        let pose_enc = self.camera_head.forward(
            &camera_tokens,
            s,
            &mut state.camera,
            keyframe,
            rec.as_deref_mut(),
        )?;

        timings.camera_head_ms = ms_since(clock);
        let clock = Instant::now();
        let raw = self.depth_head.forward(&taps, s, h, w);
        timings.depth_head_ms = ms_since(clock);
        put(&mut rec, "dpt_raw", vec![s, 2, h, w], &raw);
        let plane = h * w;
        let mut depth = Vec::with_capacity(s * plane);
        let mut depth_conf = Vec::with_capacity(s * plane);
        for f in 0..s {
            depth.extend(
                raw[(2 * f) * plane..(2 * f + 1) * plane]
                    .iter()
                    .map(|v| v.exp()),
            );
            depth_conf.extend(
                raw[(2 * f + 1) * plane..(2 * f + 2) * plane]
                    .iter()
                    .map(|v| 1.0 + v.exp()),
            );
        }
        let mut cameras = Vec::with_capacity(s);
        let mut world_points = Vec::with_capacity(s * plane * 3);
        for f in 0..s {
            let mut enc = [0.0f32; POSE_ENC_LEN];
            enc.copy_from_slice(&pose_enc[f * POSE_ENC_LEN..(f + 1) * POSE_ENC_LEN]);
            let cam = decode_pose(&enc, h, w);
            world_points.extend(unproject_to_world(
                &depth[f * plane..(f + 1) * plane],
                h,
                w,
                &cam,
            ));
            cameras.push(cam);
        }
        Ok(StepOutput {
            frames: s,
            height: h,
            width: w,
            pose_enc,
            depth,
            depth_conf,
            cameras,
            world_points,
            timings: StageTimings {
                total_ms: ms_since(start),
                ..timings
            },
        })
    }
}

/// Feeds a stream one frame at a time with the reference's schedule: the first
/// `scale_frames` frames are buffered and run together (phase 1), then each frame runs alone,
/// every `keyframe_interval`-th one as a keyframe. For live sources, which deliver frames
/// singly.
pub struct FrameFeeder {
    scale_frames: usize,
    keyframe_interval: usize,
    /// Images of phase 1 waiting for the last scale frame, `[n][3][H][W]`.
    buffered: Vec<f32>,
    buffered_frames: usize,
    phase1_done: bool,
    next_frame: u64,
}

impl FrameFeeder {
    pub fn new(scale_frames: usize, keyframe_interval: usize) -> Self {
        FrameFeeder {
            scale_frames: scale_frames.max(1),
            keyframe_interval: keyframe_interval.max(1),
            buffered: Vec::new(),
            buffered_frames: 0,
            phase1_done: false,
            next_frame: 0,
        }
    }

    /// Stream index of the next frame to be pushed.
    pub fn next_frame(&self) -> u64 {
        self.next_frame
    }

    /// Whether the frame with stream index `i` (after phase 1) is a keyframe.
    pub fn is_keyframe(&self, i: u64) -> bool {
        let scale = self.scale_frames as u64;
        i < scale || (i - scale).is_multiple_of(self.keyframe_interval as u64)
    }

    /// Push one `[3][H][W]` image. Returns the call's output when a call ran: `None` while
    /// phase 1 is still collecting its frames, then all scale frames at once, then one frame.
    pub fn push(
        &mut self,
        model: &GctModel,
        state: &mut StreamState,
        image: &[f32],
    ) -> Result<Option<StepOutput>> {
        let frame_len = 3 * state.height * state.width;
        if image.len() != frame_len {
            return Err(ModelError::BadInput(format!(
                "expected one 3×{}×{} image ({frame_len} values), got {} values",
                state.height,
                state.width,
                image.len()
            )));
        }
        if !self.phase1_done {
            self.buffered.extend_from_slice(image);
            self.buffered_frames += 1;
            self.next_frame += 1;
            if self.buffered_frames < self.scale_frames {
                return Ok(None);
            }
            return self.run_phase1(model, state).map(Some);
        }
        let i = self.next_frame;
        let keyframe = self.is_keyframe(i);
        let out = model.step(state, image, i..i + 1, keyframe, None)?;
        self.next_frame += 1;
        Ok(Some(out))
    }

    /// End of stream: runs phase 1 on the frames collected so far if the stream was shorter
    /// than the scale frames.
    pub fn finish(
        &mut self,
        model: &GctModel,
        state: &mut StreamState,
    ) -> Result<Option<StepOutput>> {
        if self.phase1_done || self.buffered_frames == 0 {
            return Ok(None);
        }
        self.run_phase1(model, state).map(Some)
    }

    fn run_phase1(&mut self, model: &GctModel, state: &mut StreamState) -> Result<StepOutput> {
        let n = self.buffered_frames as u64;
        let out = model.step(state, &self.buffered, 0..n, true, None)?;
        self.buffered.clear();
        self.buffered_frames = 0;
        self.phase1_done = true;
        Ok(out)
    }
}
