//! A stream on the GPU: the static memory plan, the phase 1 / phase 2 steps, and the CUDA graphs.
//!
//! Everything a session needs is allocated in [`GpuModel::start`]: the KV pools for the page
//! table's `max_pages`, the camera head's cache for `max_frames`, and one activation arena for
//! the session's resolution and the largest call (the scale frames). A frame step then only
//! launches work. Streaming steps (one frame, all special tokens in their "later frame" variant)
//! are captured into a CUDA graph after one eager warm-up step of their kind (keyframe and
//! non-keyframe each have their own graph); from then on a frame costs the host one image upload,
//! one page-table upload (which also carries the per-frame scalars the kernels read on the
//! device), one graph launch and the download of the kept points.
//!
//! A streaming step may also hold two frames ([`GpuSession::submit_pair`]): every product runs on
//! both frames' rows, while each frame's global attention reads its own view of the cache (both
//! views in one launch) and each camera-head row its own cache length, so each frame gets what
//! it gets streamed alone (`kvcache::PairPlan`). Each kind of pair has its own graphs.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph};
use half::bf16;

use crate::backend::cuda::arena::{Arena, ArenaPlan, DevPtr};
use crate::backend::cuda::attention::{AttentionKernel, Softmax};
use crate::backend::cuda::gemm::{Gemm, SharedChoices, TuneRecord, Tuning};
use crate::backend::cuda::ops::{self, Rope, RopeTables};
use crate::backend::cuda::storage::{DeviceModel, DevicePlacement};
use crate::backend::cuda::{CudaDevice, CudaError, DeviceKvCache, FrameScalar, KvGeometry};
use crate::frame::RgbImage;
use crate::kvcache::{
    CacheConfig, PageTable, PairPlan, SpecialPoolConfig, StepKind, TableSnapshot,
};
use crate::model::pose::{Camera, decode_pose};
use crate::model::spec::{DINO_REGISTERS, POSE_ENC_LEN, SPECIAL_TOKENS};
use crate::model::weights::WeightStore;
use crate::model::{ModelConfig, ModelError};

use super::camera_head::GpuCameraHead;
use super::dpt_head::GpuDptHead;
use super::transformer::{
    Attend, AttentionSetup, BlockScratch, CacheAttention, Chain, DenseScratch, GeluMode,
    LOCAL_TABLE_WORDS, block_forward, local_tables,
};
use super::unproject::PointCompactor;

mod device_io;
mod forward;
mod front;
mod outputs;

use device_io::{copy_dtod, upload_raw};
use forward::Part;
use front::{Front, FrontBuffers};
use outputs::{OutputSlot, PendingCall};

/// Calls a stream keeps submitted but not finished: one running, one queued behind it.
pub const MAX_IN_FLIGHT: usize = 2;

/// Calls a session can hold at once (its output slots): one more than [`MAX_IN_FLIGHT`], for a
/// two-frame step that falls back to two one-frame calls behind a call in flight.
pub const CALL_SLOTS: usize = MAX_IN_FLIGHT + 1;

/// Frames of the largest streaming call ([`GpuSession::submit_pair`]).
pub const STREAMING_CALL_FRAMES: usize = 2;

/// Kinds of streaming call, each with its own graphs: one frame (non-keyframe, keyframe), then
/// two frames by their kinds (see [`call_shape`]).
const CALL_SHAPES: usize = 6;

/// The graph slot of a streaming call of frames of these kinds (one or two).
fn call_shape(keyframes: &[bool]) -> usize {
    match *keyframes {
        [k] => usize::from(k),
        [k0, k1] => 2 + 2 * usize::from(k0) + usize::from(k1),
        _ => 0,
    }
}

/// The model's weights on one GPU (every part, heads included, uploaded once), shared by its
/// sessions.
pub struct GpuModel {
    dev: Arc<CudaDevice>,
    weights: Arc<DeviceModel>,
    weight_bytes: usize,
    /// GEMM algorithms measured by any session of this model.
    gemm_choices: SharedChoices,
}

/// Choices fixed for a session.
#[derive(Debug, Clone, Copy)]
pub struct SessionConfig {
    pub height: usize,
    pub width: usize,
    /// Keyframes kept in full after the scale frames.
    pub window: usize,
    /// Frames the stream may commit (sizes the camera cache and the special-token pool).
    pub max_frames: usize,
    /// None: the best kernel for the GPU.
    pub kernel: Option<AttentionKernel>,
    /// The kernel of the frame-local attention (DINO and frame blocks: 1005 keys); None: as
    /// `kernel` when that is given, else the best frame-local kernel for the GPU.
    pub local_kernel: Option<AttentionKernel>,
    pub gelu: GeluMode,
    /// Capture streaming steps into CUDA graphs (off: every step runs eagerly).
    pub graphs: bool,
    /// Keep points with confidence above this, then every `point_stride`-th.
    pub min_confidence: f32,
    pub point_stride: u32,
    /// Download the depth and confidence maps too (the viewer's panels; the bench leaves them).
    pub download_maps: bool,
    /// Time each stage with CUDA events (eager steps only; graphs are timed whole).
    pub profile_stages: bool,
    /// The dense baseline: every global layer first concatenates its visible keys into one
    /// contiguous buffer (as `torch.cat` of per-frame tensors), then attends to it.
    pub dense: bool,
    /// How each GEMM shape picks its cuBLASLt algorithm (measured once, in the first eager step).
    pub gemm_tuning: Tuning,
    /// Streaming frames will come two a step ([`GpuSession::submit_pair`]): `warm_up` also
    /// tunes and captures those steps.
    pub pair_steps: bool,
}

impl SessionConfig {
    pub fn new(height: usize, width: usize) -> Self {
        Self {
            height,
            width,
            window: 64,
            max_frames: 16384,
            kernel: None,
            local_kernel: None,
            gelu: GeluMode::Fused,
            graphs: true,
            min_confidence: 1.5,
            point_stride: 10,
            download_maps: true,
            profile_stages: false,
            dense: false,
            gemm_tuning: Tuning::Measure,
            pair_steps: false,
        }
    }
}

/// A frame's kept points (as `filter_points` keeps them).
#[derive(Debug, Clone, Default)]
pub struct GpuPoints {
    pub xyz: Vec<[f32; 3]>,
    pub rgb: Vec<[u8; 3]>,
    pub confidence: Vec<f32>,
}

/// How one step ran.
#[derive(Debug, Clone, Default)]
pub struct StepTiming {
    /// Host wall time from the call's submission to the end of its `finish` (for `step`: the
    /// whole call, uploads, launch, downloads and synchronisation).
    pub wall_ms: f64,
    /// GPU time between the events around the frame's work (preprocessing not included).
    pub gpu_ms: f64,
    /// GPU time of the device preprocessing (0 when the images came preprocessed).
    pub preprocess_ms: f64,
    /// Host time of the submission (plan, page-table upload, image staging, launches).
    pub host_ms: f64,
    /// Of which the image upload (staging and its enqueueing).
    pub image_upload_ms: f64,
    /// Host time `finish` waited for the device (the call's work and copies).
    pub wait_ms: f64,
    /// Host time `finish` spent turning the copied outputs into the result.
    pub collect_ms: f64,
    /// Whether the step replayed a CUDA graph.
    pub graph: bool,
    /// Per-stage GPU times when profiling an eager step: (stage, ms).
    pub stages: Vec<(String, f64)>,
    /// GPU time of the call's DINO (on the front stream, beside the previous call's heads).
    pub dino_ms: f64,
    /// GPU time of the call's aggregator (special tokens, frame and global blocks).
    pub aggregator_ms: f64,
    /// From the end of the aggregator to the end of the heads and points.
    pub heads_ms: f64,
    /// From the previous finished call's aggregator end to this call's aggregator start: what
    /// the frame period pays beside the aggregator (the heads, the next DINO, the copies).
    /// None for the first call of a session or after a reset.
    pub between_aggregators_ms: Option<f64>,
}

/// Everything one call produces.
#[derive(Debug, Clone)]
pub struct GpuStepOutput {
    pub frames: usize,
    pub pose_enc: Vec<[f32; POSE_ENC_LEN]>,
    pub cameras: Vec<Camera>,
    pub points: Vec<GpuPoints>,
    /// Each frame's model input as 8-bit RGB, `[H][W][3]` (the result's image; the points'
    /// colours).
    pub model_rgb: Vec<Vec<u8>>,
    /// `[S][H][W]` when the session downloads maps, else empty.
    pub depth: Vec<f32>,
    pub depth_conf: Vec<f32>,
    pub timing: StepTiming,
}

impl GpuModel {
    /// Streams every tensor of `store` to GPU `ordinal` as it is read (bf16 matrices and
    /// filters, f32 parameters): no host copy of the model is kept, and at most one tensor is
    /// in host memory at a time.
    pub fn load(cfg: ModelConfig, store: WeightStore, ordinal: usize) -> Result<Self, ModelError> {
        let dev = Arc::new(CudaDevice::open(ordinal)?);
        // One stream orders everything; per-buffer events would also end up inside graphs.
        // SAFETY: all of the model's work runs on `dev.stream`.
        unsafe { dev.ctx.disable_event_tracking() };
        let mut place = DevicePlacement::new(&dev);
        let weights = Arc::new(DeviceModel::load_placed(cfg, store, &mut place)?);
        dev.stream.synchronize().map_err(CudaError::from)?;
        Ok(Self {
            dev,
            weights,
            weight_bytes: place.bytes(),
            gemm_choices: SharedChoices::default(),
        })
    }

    /// The weights on the device.
    pub fn weights(&self) -> &Arc<DeviceModel> {
        &self.weights
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    pub fn config(&self) -> &ModelConfig {
        self.weights.config()
    }

    /// Device bytes of all the model's weights.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Device memory in use on the GPU right now (all processes), from the driver.
    pub fn device_memory_used(&self) -> Option<usize> {
        self.dev.ctx.bind_to_thread().ok()?;
        let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
        Some(total - free)
    }

    pub fn start(&self, sc: SessionConfig) -> Result<GpuSession, CudaError> {
        GpuSession::new(self, sc)
    }
}

/// The main stream's fixed device buffers (all in the arena; the front's are
/// [`FrontBuffers`]).
struct Buffers {
    /// The call's model input as 8-bit RGB, copied from the front's.
    rgb: DevPtr<u8>,
    x: DevPtr<f32>,
    taps: Vec<DevPtr<f32>>,
    scratch: BlockScratch,
    frame_tables: DevPtr<u32>,
    pose: DevPtr<f32>,
    depth: DevPtr<f32>,
    conf: DevPtr<f32>,
    xyz: DevPtr<f32>,
    point_rgb: DevPtr<u8>,
    point_conf: DevPtr<f32>,
    counts: DevPtr<u32>,
}

/// Sizes of a session.
#[derive(Debug, Clone, Copy)]
struct Shape {
    height: usize,
    width: usize,
    patch: usize,
    grid_w: usize,
    patches: usize,
    /// Aggregator tokens per frame (6 + patches).
    tokens: usize,
    /// DINO tokens per frame (cls + 4 registers + patches).
    dino_tokens: usize,
    embed: usize,
    hidden: usize,
    heads: usize,
    /// Frames of the largest call (the scale frames).
    max_call: usize,
}

impl Shape {
    fn plane(&self) -> usize {
        self.height * self.width
    }
}

pub struct GpuSession {
    dev: Arc<CudaDevice>,
    /// A second stream: the camera head (small, latency-bound GEMVs) runs there, overlapping the
    /// depth head on the main stream.
    side: CudaDevice,
    /// The images and DINO on a low-priority stream of their own (`front.rs`).
    front: Front,
    weights: Arc<DeviceModel>,
    weight_bytes: usize,
    sc: SessionConfig,
    shape: Shape,
    gemm: Gemm,
    rope: RopeTables,
    table: PageTable,
    kv: DeviceKvCache,
    camera: GpuCameraHead,
    dpt: GpuDptHead,
    compactor: PointCompactor,
    // Owns the memory every `DevPtr` in `bufs` points into.
    _arena: Arena,
    _dino_pos: cudarc::driver::CudaSlice<f32>,
    bufs: Buffers,
    dense: Option<DenseScratch>,
    setup: AttentionSetup,
    /// Each global block's softmax (a fixed offset where its qk-norm bounds the scores) and,
    /// with it, its queries' scaled norm.
    global_attention: Vec<CacheAttention>,
    /// The frame-local attention's kernel and splits.
    local_setup: AttentionSetup,
    scale_frames: Option<usize>,
    /// Graphs of the streaming calls: [aggregator, heads][`call_shape`], and eager warm-ups done
    /// per shape.
    graphs: [[Option<StepGraph>; CALL_SHAPES]; 2],
    warmed: [bool; CALL_SHAPES],
    arena_bytes: usize,
    /// Page-locked outputs of the calls in flight (one per call, in turn).
    slots: Vec<OutputSlot>,
    /// Submitted calls in order; the front is the next `finish`.
    pending: VecDeque<PendingCall>,
    next_slot: usize,
    /// The last finished call's aggregator end, for the time between two aggregators.
    last_aggregator_end: Option<CudaEvent>,
}

/// The images of one call.
#[derive(Debug, Clone, Copy)]
pub enum StepImages<'a> {
    /// `[S][3][H][W]` in [0, 1], already the session's size.
    Model(&'a [f32]),
    /// Decoded 8-bit frames of any size that preprocesses to the session's size: resized,
    /// cropped and scaled on the device exactly as `preprocess_rgb8` does on the host.
    Rgb8(&'a [&'a RgbImage]),
}

/// The two frames of a two-frame call's images, each as a one-frame call takes it.
fn split_images(images: StepImages<'_>, plane: usize) -> Result<[StepImages<'_>; 2], CudaError> {
    match images {
        StepImages::Model(values) => {
            if values.len() != 2 * 3 * plane {
                return Err(CudaError::Invalid(format!(
                    "a two-frame step takes 2 x {} model input values, got {}",
                    3 * plane,
                    values.len()
                )));
            }
            let (first, second) = values.split_at(3 * plane);
            Ok([StepImages::Model(first), StepImages::Model(second)])
        }
        StepImages::Rgb8(decoded) => match decoded {
            [first, second] => Ok([
                StepImages::Rgb8(std::slice::from_ref(first)),
                StepImages::Rgb8(std::slice::from_ref(second)),
            ]),
            _ => Err(CudaError::Invalid(format!(
                "a two-frame step takes 2 images, got {}",
                decoded.len()
            ))),
        },
    }
}

/// A captured part of a frame step.
struct StepGraph(CudaGraph);

/// Captures the launches `work` queues on `stream` into a graph (None: nothing was captured).
/// The capture is ended even when `work` fails, so the stream is usable again; `work`'s error
/// is the one reported.
fn capture_graph(
    stream: &Arc<cudarc::driver::CudaStream>,
    work: impl FnOnce() -> Result<(), CudaError>,
) -> Result<Option<StepGraph>, CudaError> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = work();
    let graph = stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    captured?;
    Ok(graph?.map(StepGraph))
}

/// What a part of a call needs to know about it.
#[derive(Debug, Clone, Copy)]
struct PartStep {
    s: usize,
    committed: u64,
    scale_frames: usize,
    /// Whether each frame is a keyframe (a call of more than two frames is the scale frames,
    /// all committed: `[true, true]`).
    keyframes: [bool; 2],
    /// A two-frame step: each frame attends to its own view of the cache.
    pair: bool,
    /// A streaming step: may replay (or capture) its part's graph.
    graphable: bool,
}

impl PartStep {
    /// The frames' kinds as a slice (one entry for a one-frame call).
    fn kinds(&self) -> &[bool] {
        if self.pair {
            &self.keyframes
        } else {
            &self.keyframes[..1]
        }
    }
}

/// What the page table planned for a call.
enum CallPlan {
    /// Frames `frames` in one step of the table: the scale frames, or one streaming frame.
    Step { frames: Range<u64>, keyframe: bool },
    /// Two streaming frames, each seeing what it would see alone (`PageTable::plan_pair`, done).
    Pair(Box<PairPlan>, TableSnapshot),
}

// SAFETY: an instantiated graph is launched on the session's stream with its context bound
// first (`step` binds it); CUDA allows that from any thread, one at a time, which `&mut self`
// guarantees.
unsafe impl Send for StepGraph {}

fn cache_err(e: crate::kvcache::CacheError) -> CudaError {
    CudaError::Invalid(format!("KV cache: {e}"))
}

impl GpuSession {
    fn new(model: &GpuModel, sc: SessionConfig) -> Result<Self, CudaError> {
        let dev = Arc::clone(&model.dev);
        dev.ctx.bind_to_thread()?;
        let cfg = model.config().clone();
        let p = cfg.patch;
        if sc.height == 0
            || sc.width == 0
            || !sc.height.is_multiple_of(p)
            || !sc.width.is_multiple_of(p)
        {
            return Err(CudaError::Invalid(format!(
                "image {}x{} must be a positive multiple of the patch size {p}",
                sc.width, sc.height
            )));
        }
        let (grid_h, grid_w) = (sc.height / p, sc.width / p);
        let patches = grid_h * grid_w;
        let shape = Shape {
            height: sc.height,
            width: sc.width,
            patch: p,
            grid_w,
            patches,
            tokens: SPECIAL_TOKENS + patches,
            dino_tokens: 1 + DINO_REGISTERS + patches,
            embed: cfg.embed,
            hidden: cfg.embed * cfg.mlp_ratio,
            heads: cfg.heads,
            // The scale frames, or a two-frame streaming step.
            max_call: cfg.scale_frames.max(STREAMING_CALL_FRAMES),
        };

        let mut cache_cfg = CacheConfig::new(
            cfg.depth,
            cfg.heads,
            cfg.head_dim(),
            patches,
            cfg.scale_frames,
            sc.window,
        );
        cache_cfg.special_pool = SpecialPoolConfig {
            max_frames: sc.max_frames as u64,
            ..cache_cfg.special_pool
        };
        let table = PageTable::new(cache_cfg).map_err(cache_err)?;
        // The pools also hold the scratch pages of a two-frame step's non-keyframe first frame.
        let geometry = KvGeometry {
            max_pages: table.max_pages() + table.pair_scratch_pages(),
            ..KvGeometry::for_table(&table)
        };
        // Enough write runs for the largest call: each frame's patches and specials may straddle
        // a page boundary.
        let call_frames = shape.max_call.max(STREAMING_CALL_FRAMES);
        let mut kv =
            DeviceKvCache::with_call_frames(&dev, geometry, 4 * call_frames + 8, call_frames)?;
        kv.freeze();

        let mut gemm = Gemm::new(&dev)?;
        gemm.set_tuning(sc.gemm_tuning, &model.gemm_choices);
        let side = dev.with_new_stream()?;
        let rope = RopeTables::new(&dev, cfg.max_frame_num, grid_h, grid_w)?;
        let camera = GpuCameraHead::new(
            &dev,
            model.weights.camera_head(),
            shape.max_call,
            sc.max_frames,
        )?;
        // Batches of a two-frame step's frames (larger calls, the scale frames, go in turn).
        let dpt = GpuDptHead::new(
            &dev,
            model.weights.depth_head(),
            sc.height,
            sc.width,
            STREAMING_CALL_FRAMES,
        )?;
        let compactor = PointCompactor::new(&dev, sc.height, sc.width)?;
        let dino_pos_host = model
            .weights
            .aggregator()
            .dino()
            .position_table(grid_h, grid_w);
        let dino_pos = dev.stream.clone_htod(&dino_pos_host)?;

        // The dense baseline's buffer holds every key the page table can show.
        let dense_capacity = sc.dense.then(|| geometry.max_pages * geometry.page_size);
        let (arena, bufs, front_bufs, dense) =
            Self::plan_buffers(&dev, &shape, &cfg, &dino_pos, dense_capacity)?;
        let arena_bytes = arena.capacity_bytes();

        // Frame-local attention tables: frame f is page f of `tokens` slots.
        upload_raw(
            &dev,
            &local_tables(shape.max_call, shape.dino_tokens),
            front_bufs.dino_tables,
        )?;
        upload_raw(
            &dev,
            &local_tables(shape.max_call, shape.tokens),
            bufs.frame_tables,
        )?;

        let kernel = sc.kernel.unwrap_or_else(|| AttentionKernel::best_for(&dev));
        let setup = AttentionSetup {
            kernel,
            sm_count: dev.info.sm_count as usize,
        };
        let global_attention = model
            .weights
            .aggregator()
            .global_blocks
            .iter()
            .map(|b| CacheAttention::for_block(&dev, b, kernel))
            .collect::<Result<Vec<_>, _>>()?;
        let fixed = global_attention
            .iter()
            .filter(|a| a.softmax != Softmax::RunningMax)
            .count();
        tracing::info!(
            "global attention: {} with a fixed softmax offset in {fixed} of {} layers",
            kernel.name(),
            global_attention.len()
        );
        let local_setup = AttentionSetup {
            kernel: match (sc.local_kernel, sc.kernel) {
                (Some(local), _) => local,
                (None, Some(chosen)) => chosen,
                (None, None) => AttentionKernel::best_local_for(&dev),
            },
            ..setup
        };
        let front = Front::new(
            &dev,
            front_bufs,
            &shape,
            &model.weights.aggregator().dino.patch_proj,
            sc.gemm_tuning,
            &model.gemm_choices,
        )?;
        let slots = (0..CALL_SLOTS)
            .map(|_| OutputSlot::new(&dev, shape.max_call, shape.plane(), sc.download_maps))
            .collect::<Result<Vec<_>, _>>()?;
        dev.stream.synchronize()?;
        side.stream.synchronize()?;
        front.dev.stream.synchronize()?;
        Ok(Self {
            dev,
            side,
            front,
            weights: Arc::clone(&model.weights),
            weight_bytes: model.weight_bytes,
            sc,
            shape,
            gemm,
            rope,
            table,
            kv,
            camera,
            dpt,
            compactor,
            _arena: arena,
            _dino_pos: dino_pos,
            bufs,
            dense,
            setup,
            global_attention,
            local_setup,
            scale_frames: None,
            graphs: Default::default(),
            warmed: [false; CALL_SHAPES],
            arena_bytes,
            slots,
            pending: VecDeque::new(),
            next_slot: 0,
            last_aggregator_end: None,
        })
    }

    fn plan_buffers(
        dev: &CudaDevice,
        s: &Shape,
        cfg: &ModelConfig,
        dino_pos: &cudarc::driver::CudaSlice<f32>,
        dense_capacity: Option<usize>,
    ) -> Result<(Arena, Buffers, FrontBuffers, Option<DenseScratch>), CudaError> {
        let m = s.max_call;
        let c = s.embed;
        let plane = s.plane();
        let patch_len = ops::patch_row_len(cfg.patch);
        // The front (DINO) and the main stream run at the same time: each has its own scratch.
        let tokens = m * s.tokens;
        let dino_tokens = m * s.dino_tokens;
        let taps = cfg.taps.len();
        let mut plan = ArenaPlan::default();
        plan.add::<f32>(m * 3 * plane);
        plan.add::<u8>(m * 3 * plane);
        plan.add::<bf16>(m * s.patches * patch_len);
        plan.add::<bf16>(m * s.patches * c);
        plan.add::<f32>(dino_tokens * c);
        BlockScratch::plan(&mut plan, dino_tokens, c, s.hidden, s.heads);
        plan.add::<u32>(LOCAL_TABLE_WORDS * m);
        plan.add::<f32>(tokens * c);
        plan.add::<u8>(m * 3 * plane);
        plan.add::<f32>(tokens * c);
        for _ in 0..taps {
            plan.add::<f32>(m * s.tokens * 2 * c);
        }
        BlockScratch::plan(&mut plan, tokens, c, s.hidden, s.heads);
        plan.add::<u32>(LOCAL_TABLE_WORDS * m);
        plan.add::<f32>(m * POSE_ENC_LEN);
        plan.add::<f32>(m * plane);
        plan.add::<f32>(m * plane);
        plan.add::<f32>(m * plane * 3);
        plan.add::<u8>(m * plane * 3);
        plan.add::<f32>(m * plane);
        plan.add::<u32>(m);
        if let Some(cap) = dense_capacity {
            plan.add::<bf16>(2 * cap * c);
            plan.add::<u32>(4);
        }
        let mut arena = Arena::new(dev, plan.bytes())?;
        let front = FrontBuffers {
            image: arena.alloc(m * 3 * plane)?,
            rgb: arena.alloc(m * 3 * plane)?,
            patches: arena.alloc(m * s.patches * patch_len)?,
            patch_emb: arena.alloc(m * s.patches * c)?,
            dino_x: arena.alloc(dino_tokens * c)?,
            dino_pos: DevPtr::of(dino_pos),
            scratch: BlockScratch::carve(&mut arena, dino_tokens, c, s.hidden, s.heads)?,
            dino_tables: arena.alloc(LOCAL_TABLE_WORDS * m)?,
            tokens: arena.alloc(tokens * c)?,
        };
        let bufs = Buffers {
            rgb: arena.alloc(m * 3 * plane)?,
            x: arena.alloc(tokens * c)?,
            taps: (0..taps)
                .map(|_| arena.alloc(m * s.tokens * 2 * c))
                .collect::<Result<_, _>>()?,
            scratch: BlockScratch::carve(&mut arena, tokens, c, s.hidden, s.heads)?,
            frame_tables: arena.alloc(LOCAL_TABLE_WORDS * m)?,
            pose: arena.alloc(m * POSE_ENC_LEN)?,
            depth: arena.alloc(m * plane)?,
            conf: arena.alloc(m * plane)?,
            xyz: arena.alloc(m * plane * 3)?,
            point_rgb: arena.alloc(m * plane * 3)?,
            point_conf: arena.alloc(m * plane)?,
            counts: arena.alloc(m)?,
        };
        let dense = match dense_capacity {
            Some(capacity) => Some(DenseScratch {
                kv: arena.alloc(2 * capacity * c)?,
                capacity,
                table: arena.alloc(4)?,
            }),
            None => None,
        };
        Ok((arena, bufs, front, dense))
    }

    /// Memory of the session: KV pools + table, activation arena, the model's weights, the
    /// camera head's cache, and the page-locked output slots on the host.
    pub fn device_memory(&self) -> DeviceMemory {
        DeviceMemory {
            kv_bytes: self.kv.device_bytes(),
            arena_bytes: self.arena_bytes,
            weight_bytes: self.weight_bytes,
            camera_cache_bytes: self.camera.cache_bytes(),
            output_pinned_bytes: self.slots.iter().map(OutputSlot::bytes).sum(),
        }
    }

    /// What GEMM tuning chose, DINO's (the front stream) first; the camera head has no GEMMs.
    pub fn gemm_tune_records(&self) -> Vec<TuneRecord> {
        let mut records = self.front.tune_records().to_vec();
        records.extend_from_slice(self.gemm.tune_records());
        records
    }

    pub fn committed_frames(&self) -> u64 {
        self.table.committed_frames()
    }

    /// (height, width) of the session's input.
    pub fn size(&self) -> (usize, usize) {
        (self.shape.height, self.shape.width)
    }

    pub fn table(&self) -> &PageTable {
        &self.table
    }

    pub fn kernel(&self) -> AttentionKernel {
        self.setup.kernel
    }

    /// The frame-local attention's kernel.
    pub fn local_kernel(&self) -> AttentionKernel {
        self.local_setup.kernel
    }

    /// How points are kept. The values are baked into captured graphs, so a change drops them
    /// (the next steps capture again).
    pub fn set_point_filter(&mut self, min_confidence: f32, stride: u32) {
        if self.sc.min_confidence != min_confidence || self.sc.point_stride != stride {
            // A graph in flight is not dropped under the device's feet.
            if let Err(e) = self.drain_device() {
                tracing::warn!("waiting for the calls in flight: {e}");
            }
            self.sc.min_confidence = min_confidence;
            self.sc.point_stride = stride.max(1);
            self.graphs = Default::default();
            self.warmed = [false; CALL_SHAPES];
        }
    }

    /// Graphs on or off, and event timing of each stage (eager steps only).
    pub fn set_mode(&mut self, graphs: bool, profile_stages: bool) {
        self.sc.graphs = graphs;
        self.sc.profile_stages = profile_stages;
    }

    /// Runs a stream's first calls on a grey image and forgets them: the scale call, then a
    /// keyframe and a non-keyframe twice each, so every GEMM shape is tuned and both streaming
    /// graphs are captured before a real frame arrives (on the H200 the first real frames would
    /// otherwise take about 1.3 s, which a 30 fps camera pays in dropped frames). The page table
    /// starts afresh afterwards: the real stream sees no trace of it.
    pub fn warm_up(&mut self) -> Result<(), CudaError> {
        if !self.pending.is_empty() {
            return Err(CudaError::Invalid(
                "warm_up needs a session with no calls in flight".into(),
            ));
        }
        let plane = self.shape.plane();
        let scale = self.weights.config().scale_frames.max(1);
        let grey = vec![0.5f32; scale.max(STREAMING_CALL_FRAMES) * 3 * plane];
        self.step(&grey[..scale * 3 * plane], 0..scale as u64, true)?;
        let mut frame = scale as u64;
        for keyframe in [true, true, false, false] {
            self.step(&grey[..3 * plane], frame..frame + 1, keyframe)?;
            frame += 1;
        }
        if self.sc.pair_steps {
            // Each kind of pair twice: an eager run, then its capture.
            for keyframes in [[true, true], [true, false], [false, true], [false, false]] {
                for _ in 0..2 {
                    let images = StepImages::Model(&grey[..2 * 3 * plane]);
                    let calls = self.submit_pair(images, [frame, frame + 1], keyframes)?;
                    for _ in 0..calls {
                        self.finish()?;
                    }
                    frame += 2;
                }
            }
        }
        let cfg = self.table.config().clone();
        self.table = PageTable::new(cfg).map_err(cache_err)?;
        self.scale_frames = None;
        self.last_aggregator_end = None;
        Ok(())
    }

    /// Forget the stream (a new scale phase follows). Graphs stay valid: addresses are unchanged.
    pub fn reset(&mut self) {
        self.last_aggregator_end = None;
        self.table.reset();
        self.scale_frames = None;
    }

    /// One call of the streaming schedule, run to completion: `images` `[S][3][H][W]` in [0, 1].
    pub fn step(
        &mut self,
        images: &[f32],
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<GpuStepOutput, CudaError> {
        if !self.pending.is_empty() {
            return Err(CudaError::Invalid(
                "step runs one call to completion; finish the submitted calls first".into(),
            ));
        }
        self.submit(StepImages::Model(images), frames, keyframe)?;
        self.finish()
    }

    /// Calls submitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Queues one call of the streaming schedule on the device and returns without waiting for
    /// it: its outputs come from [`Self::finish`], in submission order. At most
    /// [`MAX_IN_FLIGHT`] calls may be pending, so the host can prepare (and queue) the next call
    /// while the device runs this one. The page table moves on at once: the next call's plan
    /// follows this one's.
    pub fn submit(
        &mut self,
        images: StepImages<'_>,
        frames: Range<u64>,
        keyframe: bool,
    ) -> Result<(), CudaError> {
        self.submit_call(images, CallPlan::Step { frames, keyframe }, MAX_IN_FLIGHT)
    }

    /// Queues two streaming frames (`images` holds both) as one step of two: every product of
    /// the model runs on both frames' rows at once, while each frame's global attention and
    /// camera head see exactly what they would see if the frames were submitted one by one
    /// (`kvcache::PairPlan`). The first frame's result waits for the second: a frame period of
    /// latency for fewer, fuller launches. When the page table cannot plan the two together (a
    /// dropped special page, a cache error), the two go as two one-frame calls. Returns the
    /// calls queued (1 or 2), each finished by its own [`Self::finish`]. Counts as one call in
    /// flight (at most [`MAX_IN_FLIGHT`]); its fallback may take the session's spare slot.
    pub fn submit_pair(
        &mut self,
        images: StepImages<'_>,
        frames: [u64; 2],
        keyframes: [bool; 2],
    ) -> Result<usize, CudaError> {
        if self.pending.len() >= MAX_IN_FLIGHT {
            return Err(CudaError::Invalid(format!(
                "{MAX_IN_FLIGHT} calls are in flight already; finish one first"
            )));
        }
        if self.scale_frames.is_none() {
            return Err(CudaError::Invalid(
                "the first call of a stream is phase 1 (the scale frames), not a two-frame step"
                    .into(),
            ));
        }
        let plane = self.shape.plane();
        let [first, second] = split_images(images, plane)?;
        let kind = |k: bool| {
            if k {
                StepKind::Keyframe
            } else {
                StepKind::NonKeyframe
            }
        };
        let before = self
            .table
            .snapshot()
            .ok_or_else(|| CudaError::Invalid("a page-table step is in progress".into()))?;
        match self
            .table
            .plan_pair(frames, keyframes.map(kind))
            .map_err(cache_err)?
        {
            Some(plan) => {
                let call = CallPlan::Pair(Box::new(plan), before);
                self.submit_call(images, call, MAX_IN_FLIGHT)?;
                Ok(1)
            }
            None => {
                let frames = frames.iter().zip(keyframes);
                for (images, (frame, keyframe)) in [first, second].into_iter().zip(frames) {
                    let call = CallPlan::Step {
                        frames: *frame..*frame + 1,
                        keyframe,
                    };
                    self.submit_call(images, call, CALL_SLOTS)?;
                }
                Ok(2)
            }
        }
    }

    /// Plans (a `Step`; a `Pair` comes planned), uploads and queues a call, with fewer than
    /// `limit` calls in flight before it.
    fn submit_call(
        &mut self,
        images: StepImages<'_>,
        call: CallPlan,
        limit: usize,
    ) -> Result<(), CudaError> {
        let submitted = Instant::now();
        self.dev.ctx.bind_to_thread()?;
        let (s, keyframes, pair) = match &call {
            CallPlan::Step { frames, keyframe } => (
                frames.end.saturating_sub(frames.start) as usize,
                [*keyframe; 2],
                false,
            ),
            CallPlan::Pair(plan, _) => (2, plan.kinds.map(|k| k == StepKind::Keyframe), true),
        };
        let result = self.check_call(images, &call, s, limit);
        let (committed, scale_frames) = match result {
            Ok(checked) => checked,
            Err(e) => {
                if let CallPlan::Pair(_, before) = call {
                    self.table.restore_snapshot(before);
                }
                return Err(e);
            }
        };
        // The per-frame scalars the kernels read on the device: each frame's 3D RoPE index and
        // the camera cache length it sees (the frames committed before it).
        let (rope, camera): (Vec<u32>, Vec<u32>) = match &call {
            CallPlan::Step { .. } => (
                (0..s).map(|f| (committed as usize + f) as u32).collect(),
                vec![committed as u32],
            ),
            CallPlan::Pair(plan, _) => {
                let before = plan.committed_before.map(|c| c as u32);
                (before.to_vec(), before.to_vec())
            }
        };
        let mut uploaded = self
            .kv
            .set_frame_scalars(FrameScalar::RopeFrame, &rope)
            .and_then(|_| self.kv.set_frame_scalars(FrameScalar::CameraLen, &camera));
        if let Err(e) = uploaded {
            if let CallPlan::Pair(_, before) = call {
                self.table.restore_snapshot(before);
            }
            return Err(e);
        }
        uploaded = match &call {
            CallPlan::Step { frames, keyframe } => {
                let kind = if *keyframe {
                    StepKind::Keyframe
                } else {
                    StepKind::NonKeyframe
                };
                // The plan is borrowed from the table, not copied: the upload is the only
                // reader. The upload is stream-ordered, so a call still running keeps the table
                // it was given.
                let plan = self
                    .table
                    .begin_step(frames.clone(), kind)
                    .map_err(cache_err)?;
                self.kv.upload_step(&self.dev, plan)
            }
            CallPlan::Pair(plan, _) => self.kv.upload_pair(&self.dev, plan),
        };
        if let Err(e) = uploaded {
            // The upload's error is the one to report.
            self.roll_back(&call);
            return Err(e);
        }
        let slot = self.next_slot;
        let step = PartStep {
            s,
            committed,
            scale_frames,
            keyframes,
            pair,
            // Streaming steps (one frame or a pair, the "later frame" token variants) replay a
            // graph.
            graphable: self.sc.graphs
                && s <= STREAMING_CALL_FRAMES
                && committed >= 1
                && committed as usize >= scale_frames,
        };
        let result = self.launch_call(images, step, slot, submitted);
        match result {
            Ok(mut pending) => {
                if let CallPlan::Step { .. } = call {
                    self.table.end_step().map_err(cache_err)?;
                }
                pending.host_ms = submitted.elapsed().as_secs_f64() * 1e3;
                self.next_slot = (slot + 1) % CALL_SLOTS;
                self.pending.push_back(pending);
                Ok(())
            }
            Err(e) => {
                // Leave the stream as it was before the call; the step's error is the one to
                // report.
                self.roll_back(&call);
                Err(e)
            }
        }
    }

    /// Undoes the page table's plan of a call that failed; a failed rollback is only logged.
    fn roll_back(&mut self, call: &CallPlan) {
        match call {
            CallPlan::Step { .. } => {
                if let Err(abort) = self.table.abort_step() {
                    tracing::warn!("rolling back the failed step: {abort}");
                }
            }
            CallPlan::Pair(_, before) => self.table.restore_snapshot(before.clone()),
        }
    }

    /// Checks a call against the session before anything is planned or queued: returns the
    /// frames committed before it and the stream's scale frames.
    fn check_call(
        &mut self,
        images: StepImages<'_>,
        call: &CallPlan,
        s: usize,
        limit: usize,
    ) -> Result<(u64, usize), CudaError> {
        let sh = self.shape;
        let plane = sh.plane();
        if self.pending.len() >= limit.min(CALL_SLOTS) {
            return Err(CudaError::Invalid(format!(
                "{limit} calls are in flight already; finish one first"
            )));
        }
        let given = match images {
            StepImages::Model(values) => {
                if values.len() != s * 3 * plane {
                    return Err(CudaError::Invalid(format!(
                        "expected {s} images of 3x{}x{} ({} values), got {} values",
                        sh.height,
                        sh.width,
                        s * 3 * plane,
                        values.len()
                    )));
                }
                s
            }
            StepImages::Rgb8(decoded) => decoded.len(),
        };
        let (first, last_committed) = match call {
            CallPlan::Step { frames, keyframe } => {
                if !keyframe && s != 1 {
                    return Err(CudaError::Invalid(
                        "a non-keyframe call holds exactly one frame".into(),
                    ));
                }
                if self.scale_frames.is_none() && !keyframe {
                    return Err(CudaError::Invalid(
                        "the first call of a stream is phase 1 (the scale frames) and must be a keyframe call"
                            .into(),
                    ));
                }
                let committed = self.table.committed_frames();
                (frames.start, committed + s as u64)
            }
            // The table has planned the pair already: its frames are (or were) committed.
            CallPlan::Pair(plan, _) => (plan.frames[0], plan.committed_before[1] + 1),
        };
        if s == 0 || given != s {
            return Err(CudaError::Invalid(format!(
                "a call of frames {first}..{} needs {s} images, got {given}",
                first + s as u64
            )));
        }
        if s > sh.max_call {
            return Err(CudaError::Invalid(format!(
                "a call of {s} frames exceeds the session's largest call ({} scale frames)",
                sh.max_call
            )));
        }
        let cfg = self.weights.config();
        let scale_frames = *self.scale_frames.get_or_insert(s.min(cfg.scale_frames));
        if last_committed as usize > cfg.max_frame_num {
            return Err(CudaError::Invalid(format!(
                "frames up to {last_committed} exceed the 3D RoPE table of max_frame_num = {} (raise the keyframe interval)",
                cfg.max_frame_num
            )));
        }
        if last_committed as usize > self.sc.max_frames {
            return Err(CudaError::Invalid(format!(
                "the session was sized for {} committed frames; frame {last_committed} would exceed it",
                self.sc.max_frames,
            )));
        }
        let committed = match call {
            CallPlan::Step { .. } => self.table.committed_frames(),
            CallPlan::Pair(plan, _) => plan.committed_before[0],
        };
        Ok((committed, scale_frames))
    }

    /// Queues a planned call: the front (images, DINO), the aggregator, the heads and the
    /// downloads into output slot `slot`.
    fn launch_call(
        &mut self,
        images: StepImages<'_>,
        step: PartStep,
        slot: usize,
        submitted: Instant,
    ) -> Result<PendingCall, CudaError> {
        let sh = self.shape;
        let s = step.s;
        let plane = sh.plane();
        let front = self.front.run(
            images,
            s,
            &sh,
            &self.weights,
            self.local_setup,
            self.sc.gelu,
            self.sc.graphs && s <= STREAMING_CALL_FRAMES && self.scale_frames.is_some(),
        )?;
        // The main stream takes the front's outputs into its own buffers at once: the
        // front's next call may overwrite them as soon as the aggregator is done.
        let c = sh.embed;
        self.dev.stream.wait(&front.done)?;
        copy_dtod(
            &self.dev,
            self.front.bufs.tokens.slice(0, s * sh.tokens * c)?,
            self.bufs.x.slice(0, s * sh.tokens * c)?,
        )?;
        copy_dtod(
            &self.dev,
            self.front.bufs.rgb.slice(0, s * 3 * plane)?,
            self.bufs.rgb.slice(0, s * 3 * plane)?,
        )?;
        let mut stages = Vec::new();
        if self.sc.profile_stages {
            // The front's time alone: nothing else ran beside it (the profiled steps run
            // one at a time).
            let ms = front.start.elapsed_ms(&front.done)? as f64;
            stages.push(("dino".to_owned(), ms));
        }
        let aggregator_start = self.event()?;
        let aggregated = self.run_part(Part::Aggregator, step, &mut stages)?;
        let aggregator_end = self.event()?;
        // The next frame's DINO starts here, beside this frame's heads (measured on the
        // H200: 0.19 ms a frame better than after the heads; starting at once, beside the
        // aggregator, gains nothing: docs/gpu-model.md).
        self.front.may_start_after(
            self.dev
                .stream
                .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
        );
        let heads = self.run_part(Part::Heads, step, &mut stages)?;
        if step.graphable {
            self.warmed[call_shape(step.kinds())] = true;
        }
        let graph = aggregated && heads;
        let end = self.event()?;
        self.queue_downloads(slot, s)?;
        let copied = self.event()?;
        Ok(PendingCall {
            slot,
            frames: s,
            submitted,
            host_ms: 0.0,
            image_upload_ms: front.image_upload_ms,
            graph: graph && front.graph,
            stages,
            preprocess_start: front.preprocess_start,
            start: front.start,
            dino_end: front.done,
            aggregator_start,
            aggregator_end,
            end,
            copied,
        })
    }

    /// Waits for the oldest submitted call and returns its outputs.
    pub fn finish(&mut self) -> Result<GpuStepOutput, CudaError> {
        let call = self
            .pending
            .pop_front()
            .ok_or_else(|| CudaError::Invalid("finish without a submitted call".into()))?;
        let wait = Instant::now();
        call.copied.synchronize()?;
        let wait_ms = wait.elapsed().as_secs_f64() * 1e3;
        let collect = Instant::now();
        let mut out = self.read_slot(call.slot, call.frames)?;
        out.timing = StepTiming {
            wall_ms: call.submitted.elapsed().as_secs_f64() * 1e3,
            gpu_ms: call.start.elapsed_ms(&call.end)? as f64,
            preprocess_ms: call.preprocess_start.elapsed_ms(&call.start)? as f64,
            host_ms: call.host_ms,
            image_upload_ms: call.image_upload_ms,
            wait_ms,
            collect_ms: collect.elapsed().as_secs_f64() * 1e3,
            graph: call.graph,
            stages: call.stages,
            dino_ms: call.start.elapsed_ms(&call.dino_end)? as f64,
            aggregator_ms: call.aggregator_start.elapsed_ms(&call.aggregator_end)? as f64,
            heads_ms: call.aggregator_end.elapsed_ms(&call.end)? as f64,
            between_aggregators_ms: match &self.last_aggregator_end {
                Some(last) => Some(last.elapsed_ms(&call.aggregator_start)? as f64),
                None => None,
            },
        };
        self.last_aggregator_end = Some(call.aggregator_end);
        Ok(out)
    }

    /// Waits for every call in flight (their outputs stay to be finished); before anything that
    /// must not run under them.
    fn drain_device(&self) -> Result<(), CudaError> {
        if let Some(last) = self.pending.back() {
            last.copied.synchronize()?;
        }
        Ok(())
    }

    /// Runs one part of a call: replays its graph, captures it (a streaming step whose kind ran
    /// eagerly once), or runs it eagerly (timing its stages when profiling). True: a graph ran.
    fn run_part(
        &mut self,
        part: Part,
        step: PartStep,
        stages: &mut Vec<(String, f64)>,
    ) -> Result<bool, CudaError> {
        let (part_ix, shape_ix) = (part as usize, call_shape(step.kinds()));
        if step.graphable && self.graphs[part_ix][shape_ix].is_none() && self.warmed[shape_ix] {
            let stream = Arc::clone(&self.dev.stream);
            self.graphs[part_ix][shape_ix] =
                capture_graph(&stream, || self.forward(part, step, None))?;
        }
        match &self.graphs[part_ix][shape_ix] {
            Some(g) if step.graphable => {
                g.0.launch()?;
                Ok(true)
            }
            _ => {
                let profile = self.sc.profile_stages.then_some(stages);
                self.forward(part, step, profile)?;
                Ok(false)
            }
        }
    }

    fn event(&self) -> Result<CudaEvent, CudaError> {
        Ok(self
            .dev
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
    }
}

impl Drop for GpuSession {
    /// Copies in flight write into the session's page-locked memory: they end before it is freed.
    fn drop(&mut self) {
        if let Err(e) = self.drain_device() {
            tracing::warn!("waiting for the calls in flight of a closing session: {e}");
        }
    }
}

/// Device memory of a session, by owner.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DeviceMemory {
    pub kv_bytes: usize,
    pub arena_bytes: usize,
    /// All the model's weights (shared by the model's sessions).
    pub weight_bytes: usize,
    pub camera_cache_bytes: usize,
    /// Page-locked host memory the outputs of the calls in flight are copied into.
    pub output_pinned_bytes: usize,
}
