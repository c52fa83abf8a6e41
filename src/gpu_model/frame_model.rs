//! The GPU engine behind the pipeline's [`FrameModel`] trait, so `run`, `view` and the recorder
//! use it exactly as they use the CPU model.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::attention::AttentionLayout;
use crate::frame::{CacheSnapshot, FramePoints, StageTime};
use crate::model::weights::WeightStore;
use crate::model::{ModelConfig, ModelError};
use crate::pipeline::frame::PointFilter;
use crate::pipeline::model::{FrameModel, ModelLimits, ModelSession, ModelStep, SessionOptions};

use super::engine::{GpuModel, GpuSession, SessionConfig};

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
        ModelLimits::of(self.model.config())
    }

    fn start_session(
        &self,
        height: usize,
        width: usize,
        options: SessionOptions,
    ) -> Result<Box<dyn ModelSession>, ModelError> {
        let mut sc = SessionConfig::new(height, width);
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

impl ModelSession for GpuModelSession {
    fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<ModelStep, ModelError> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let out = self.session.step(images, frames, keyframe)?;
        let t = &out.timing;
        let mut stages = vec![StageTime {
            stage: if t.graph { "gpu_graph" } else { "gpu" }.to_owned(),
            ms: t.gpu_ms,
        }];
        stages.push(StageTime {
            stage: "gpu_host".to_owned(),
            ms: (t.wall_ms - t.gpu_ms).max(0.0),
        });
        Ok(ModelStep {
            frames: out.frames,
            height: self.session.size().0,
            width: self.session.size().1,
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
        })
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
