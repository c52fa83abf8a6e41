//! The GPU engine behind the pipeline's [`FrameModel`] trait, so `run`, `view` and the recorder
//! use it exactly as they use the CPU model.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::attention::AttentionLayout;
use crate::frame::{CacheSnapshot, FramePoints, RgbImage, StageTime};
use crate::model::weights::WeightStore;
use crate::model::{ModelConfig, ModelError};
use crate::pipeline::frame::PointFilter;
use crate::pipeline::model::{
    CallImages, FrameModel, ModelLimits, ModelSession, ModelStep, PairCall, PairSubmitted,
    SessionOptions, Submitted,
};

use super::engine::{
    GpuModel, GpuSession, GpuStepOutput, MAX_IN_FLIGHT, SessionConfig, StepImages,
};

pub struct GpuFrameModel {
    model: Arc<GpuModel>,
    /// Sessions share the device; one of them steps at a time.
    lock: Arc<Mutex<()>>,
}

impl GpuFrameModel {
    /// Streams `store`'s tensors to GPU `ordinal` (see [`GpuModel::load`]). Errors (never
    /// panics) without a usable GPU.
    pub fn load(cfg: ModelConfig, store: WeightStore, ordinal: usize) -> Result<Self, ModelError> {
        Ok(Self::from_model(GpuModel::load(cfg, store, ordinal)?))
    }

    pub fn from_model(model: GpuModel) -> Self {
        Self {
            model: Arc::new(model),
            lock: Arc::new(Mutex::new(())),
        }
    }
}

impl FrameModel for GpuFrameModel {
    fn describe(&self) -> String {
        let c = self.model.config();
        format!(
            "CUDA bf16 GCT on {} (embed {}, depth {}, input width {})",
            self.model.device().info.name,
            c.embed,
            c.depth,
            c.img_size
        )
    }

    fn limits(&self) -> ModelLimits {
        ModelLimits {
            // Frames go up decoded; the resize runs on the device (gpu_model::preprocess).
            preprocesses_on_device: true,
            ..ModelLimits::of(self.model.config())
        }
    }

    fn start_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        self.open_session(height, width, options, false)
    }

    fn start_pair_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        self.open_session(height, width, options, true)
    }
}

impl GpuFrameModel {
    /// A session; `pair_steps`: its warm-up also tunes and captures the two-frame steps, so the
    /// first pairs of the stream do not pay for them.
    fn open_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
        pair_steps: bool,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        let mut sc = SessionConfig::new(height, width);
        sc.pair_steps = pair_steps;
        sc.window = options.window;
        // A stream can never commit more frames than the 3D RoPE table is long, so the special
        // pool and the camera cache need no more: about 7.4 GiB of KV at 518x378 for 1024 frames
        // instead of about 16 GiB for the engine's 16,384-frame default (desktop GPUs fit it).
        sc.max_frames = self.model.config().max_frame_num;
        sc.dense = options.layout == AttentionLayout::Dense;
        let session = self.model.start(sc)?;
        Ok(Box::new(GpuModelSession {
            session,
            lock: Arc::clone(&self.lock),
        }))
    }
}

struct GpuModelSession {
    session: GpuSession,
    lock: Arc<Mutex<()>>,
}

impl GpuModelSession {
    /// The engine's outputs as the pipeline's step.
    fn model_step(&self, out: GpuStepOutput) -> ModelStep {
        let t = &out.timing;
        let (height, width) = self.session.size();
        let stage = |name: &str, ms: f64| StageTime {
            stage: name.to_owned(),
            ms,
        };
        let mut stages = Vec::with_capacity(5);
        if t.preprocess_ms > 0.0 {
            stages.push(stage("gpu_preprocess", t.preprocess_ms));
        }
        stages.push(stage(if t.graph { "gpu_graph" } else { "gpu" }, t.gpu_ms));
        // Host work, and host time blocked on the device, reported apart.
        stages.push(stage("gpu_submit", t.host_ms));
        stages.push(stage("gpu_wait", t.wait_ms));
        stages.push(stage("gpu_collect", t.collect_ms));
        let model_rgb = out
            .model_rgb
            .into_iter()
            .map(|data| RgbImage {
                width: width as u32,
                height: height as u32,
                data,
            })
            .collect();
        ModelStep {
            frames: out.frames,
            height,
            width,
            depth: out.depth,
            depth_conf: out.depth_conf,
            cameras: out.cameras,
            stages,
            points: Some(
                out.points
                    .into_iter()
                    .map(|p| FramePoints {
                        xyz: p.xyz,
                        rgb: p.rgb,
                        confidence: p.confidence,
                    })
                    .collect(),
            ),
            model_rgb: Some(model_rgb),
        }
    }
}

impl ModelSession for GpuModelSession {
    fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<ModelStep, ModelError> {
        let out = {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.session.step(images, frames, keyframe)?
        };
        Ok(self.model_step(out))
    }

    fn submit(
        &mut self,
        images: CallImages<'_>,
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<Submitted, ModelError> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let images = match images {
            CallImages::Preprocessed(values) => StepImages::Model(values),
            CallImages::Decoded(decoded) => StepImages::Rgb8(decoded),
        };
        self.session.submit(images, frames, keyframe)?;
        Ok(Submitted::Queued)
    }

    fn submit_pair(
        &mut self,
        images: CallImages<'_>,
        frames: [u64; 2],
        keyframes: [bool; 2],
    ) -> PairSubmitted {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let images = match images {
            CallImages::Preprocessed(values) => StepImages::Model(values),
            CallImages::Decoded(decoded) => StepImages::Rgb8(decoded),
        };
        let queued = |submitted| PairCall {
            submitted,
            cache: None,
        };
        let before = self.session.in_flight();
        match self.session.submit_pair(images, frames, keyframes) {
            Ok(1) => PairSubmitted::Together(queued(Ok(Submitted::Queued))),
            Ok(2) => {
                PairSubmitted::Apart([queued(Ok(Submitted::Queued)), queued(Ok(Submitted::Queued))])
            }
            // The engine queues 1 or 2 calls; any other count is its bug, reported as an error
            // rather than guessed at.
            Ok(calls) => PairSubmitted::Together(queued(Err(ModelError::BadInput(format!(
                "the engine queued {calls} calls for a two-frame step, expected 1 or 2"
            ))))),
            // A fallback whose second call failed leaves the first queued: its frame has its
            // outputs coming, only the second frame failed.
            Err(e) if self.session.in_flight() == before + 1 => {
                PairSubmitted::Apart([queued(Ok(Submitted::Queued)), queued(Err(e.into()))])
            }
            Err(e) => PairSubmitted::Together(queued(Err(e.into()))),
        }
    }

    fn finish(&mut self) -> Result<ModelStep, ModelError> {
        let out = {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.session.finish()?
        };
        Ok(self.model_step(out))
    }

    fn max_in_flight(&self) -> usize {
        MAX_IN_FLIGHT
    }

    fn warm_up(&mut self) -> Result<(), ModelError> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        Ok(self.session.warm_up()?)
    }

    fn set_point_filter(&mut self, filter: PointFilter) {
        self.session
            .set_point_filter(filter.min_confidence, filter.stride.max(1) as u32);
    }

    fn committed_frames(&self) -> u64 {
        self.session.committed_frames()
    }

    fn cache_snapshot(&self) -> CacheSnapshot {
        let table = self.session.table();
        CacheSnapshot {
            stats: table.stats(),
            events: table.events().to_vec(),
            page_map: table.page_map(),
        }
    }

    fn cache_occupancy(&self) -> (usize, usize) {
        let s = self.session.table().stats();
        (s.allocated_pages - s.free_pages, s.max_pages)
    }
}
