//! The camera head on the GPU, with its own K/V cache (spec §5.3, §6).
//!
//! The head sees one token per frame (the camera token of the last aggregator tap), runs
//! `iterations` refinements of a small transformer trunk over the camera tokens of every committed
//! frame, and accumulates the pose encoding. Weights are bf16 for matrices and f32 for norms,
//! biases, LayerScale and the two tiny 9-wide layers (`embed_pose`, the pose branch's last layer).
//! Activations and the residual stream are f32; matrix-product inputs bf16.
//!
//! Every matrix product has one row per frame (m = 1 in streaming), so none goes through cuBLASLt:
//! the small-m linear layer (`backend::cuda::small_m`, kernels/camera_head.cu's `cam_linear_*`)
//! streams the bf16 weights over all SMs, one warp per output column, and fuses what surrounds
//! each layer: the LayerNorm before it (prologue), the
//! bias, GELU, residual, modulation, K/V cache append or the pose branch's last layer after it
//! (epilogue). A call launches `1 + iterations x (2 + 5 x blocks)` kernels (89 at full size).
//!
//! The cache `[iteration][layer][capacity][heads][head_dim]` (K and V, bf16) is allocated once in
//! [`GpuCameraHead::new`] and never evicted. The number of committed frames is a device `u32`
//! the caller uploads before each step: everything here may be captured into a CUDA graph (no
//! allocation, no host sync, no per-frame launch scalar; the kernels' completion counters reset
//! themselves).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::small_m::{
    EPI_BF16, EPI_BF16_GELU, EPI_BRANCH, EPI_MODULATE, EPI_RESID, LIN_MAX_TILE, LIN_SMEM_LIMIT,
    LIN_WARPS, LinArgs, LinResident, PRO_EMBED, PRO_LN, SWEEP_ENTRIES, launch_linear, lin_name,
    lin_resident_ctas, lin_tile, u32_of,
};
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::model::camera_head::CameraHead;
use crate::model::spec::POSE_ENC_LEN;

use crate::backend::cuda::storage::{Device, DeviceLinear, DeviceNorm};
use crate::model::block::TransformerBlock;

/// Threads of `cam_token_norm` for widths up to 2048 (8 values per thread, in registers).
const TOKEN_NORM_THREADS: usize = 256;
/// Values per thread of `cam_token_norm` (its `TN_PER_THREAD`).
const TOKEN_NORM_PER_THREAD: usize = 8;
/// Threads of `cam_attention_partial` (4 warps; the kernel's `ATT_THREADS`).
const ATTENTION_THREADS: u32 = 128;
/// Largest head_dim the attention kernel handles (one thread per dimension in its final merge).
const MAX_HEAD_DIM: usize = 128;
/// Upper bound of key splits per (query, head); the partial-result buffers are sized for it.
const MAX_SPLITS: usize = 64;
/// Fewest keys a split is given when the cache is small (below that, splitting costs more than
/// it saves).
const MIN_KEYS_PER_SPLIT: usize = 4;

/// Floats per CTA in the pose branch's partial sums (8 rows x 9 outputs).
const BRANCH_PART: usize = LIN_MAX_TILE * POSE_ENC_LEN;

/// Per-call activations, sized for `max_frames` rows.
struct Scratch {
    /// token_norm(camera token), the trunk's base `x`.
    x: CudaSlice<f32>,
    /// LN(x) without affine: the adaptive modulation's input.
    x_normed: CudaSlice<f32>,
    /// The residual stream.
    h: CudaSlice<f32>,
    /// The accumulated pose encoding before the FoV ReLU.
    raw: CudaSlice<f32>,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    /// GELU(fc1) of the MLP.
    hidden: CudaSlice<bf16>,
    /// Per split: normalised partial attention outputs `[frames][heads][splits][head_dim]`
    /// and their log2-sum-exp `[frames][heads][splits]`.
    part_o: CudaSlice<f32>,
    part_lse: CudaSlice<f32>,
    /// Finished splits per (frame, head); the merging split resets its counter to 0.
    att_counters: CudaSlice<u32>,
    /// Pose branch partial sums `[row tile][CTA][8][9]` and finished CTAs per row tile.
    branch_part: CudaSlice<f32>,
    branch_counters: CudaSlice<u32>,
}

/// A session's camera head on one GPU: its K/V cache, scratch and launch shapes (the weights
/// are the model's [`CameraHead<Device>`], uploaded once with it and passed to each call).
pub struct GpuCameraHead {
    width: usize,
    heads: usize,
    head_dim: usize,
    iterations: usize,
    layers: usize,
    max_frames: usize,
    capacity: usize,
    splits: usize,
    /// Resident CTAs of the linear kernel's entry points on the whole GPU.
    lin_resident: LinResident,

    cache_k: CudaSlice<bf16>,
    cache_v: CudaSlice<bf16>,
    scratch: Scratch,
}

fn invalid(msg: impl Into<String>) -> CudaError {
    CudaError::Invalid(msg.into())
}

fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &CudaDevice,
    len: usize,
) -> Result<CudaSlice<T>, CudaError> {
    Ok(dev.stream.alloc_zeros::<T>(len.max(1))?)
}

/// Key splits per (query, head): enough CTAs for about eight per SM in streaming (one query; a
/// warp keeps one 32-byte K/V load per lane in flight, so it takes many warps to cover the
/// memory latency), never more than the keys the cache can hold warrant.
fn default_splits(sm_count: usize, heads: usize, max_keys: usize) -> usize {
    let wave = (8 * sm_count.max(1)).div_ceil(heads.max(1));
    max_keys
        .div_ceil(MIN_KEYS_PER_SPLIT)
        .min(wave)
        .clamp(1, MAX_SPLITS)
}

/// Which rows of a call write their K/V to the cache, and whether each row has its own cache
/// length (the two frames of a two-frame step) or all rows follow `*cache_len`.
#[derive(Debug, Clone, Copy)]
struct CallRows {
    /// Bit r: row r's K/V go to the cache.
    append: u32,
    own_lens: bool,
}

/// A kernel argument: device addresses travel as u64.
enum Arg {
    U64(u64),
    U32(u32),
    F32(f32),
}

fn ptr<T>(s: &CudaSlice<T>) -> u64 {
    DevPtr::of(s).addr()
}

fn opt_ptr<T>(s: &Option<CudaSlice<T>>) -> u64 {
    s.as_ref().map_or(0, ptr)
}

/// Launches `name` with `args` in order.
///
/// # Safety
/// `args` must match the kernel's parameter list in kernels/camera_head.cu (count, order, and
/// width), and every address must point at a live buffer as large as the launch reads or writes.
unsafe fn launch(
    dev: &CudaDevice,
    name: &str,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<(), CudaError> {
    let f = dev.kernels.get(name)?;
    let mut b = dev.stream.launch_builder(f);
    for a in args {
        match a {
            Arg::U64(v) => b.arg(v),
            Arg::U32(v) => b.arg(v),
            Arg::F32(v) => b.arg(v),
        };
    }
    // SAFETY: the caller guarantees the argument list and buffer sizes (see above).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

impl GpuCameraHead {
    /// Allocates the scratch for up to `max_frames_per_call` frames and the K/V cache for
    /// `cache_capacity_frames` committed frames (bf16, `[iteration][layer][capacity][heads]
    /// [head_dim]`), all once, for the head `weights` (checked here against what the kernels
    /// take).
    pub fn new(
        dev: &CudaDevice,
        weights: &CameraHead<Device>,
        max_frames_per_call: usize,
        cache_capacity_frames: usize,
    ) -> Result<Self, CudaError> {
        let head = weights;
        let width = head.width;
        let layers = head.trunk.len();
        let iterations = head.iterations;
        if max_frames_per_call == 0 {
            return Err(invalid(
                "camera head: max_frames_per_call must be at least 1",
            ));
        }
        if iterations == 0 {
            return Err(invalid("camera head: zero iterations"));
        }
        let (heads, head_dim) = match head.trunk.first() {
            Some(b) => (b.heads, b.head_dim),
            None => (1, width),
        };
        if layers > 0
            && (heads * head_dim != width
                || !head_dim.is_power_of_two()
                || !(8..=MAX_HEAD_DIM).contains(&head_dim))
        {
            return Err(invalid(format!(
                "camera head: {heads} heads x {head_dim} for width {width}; the attention kernel \
                 needs heads x head_dim = width and head_dim a power of two in 8..={MAX_HEAD_DIM}"
            )));
        }
        if head
            .trunk
            .iter()
            .any(|b| b.heads != heads || b.head_dim != head_dim || b.dim != width)
        {
            return Err(invalid("camera head: trunk blocks differ in shape"));
        }
        if let Some(j) = head.trunk.iter().position(|b| b.qk_norm.is_some()) {
            return Err(invalid(format!(
                "camera head trunk block {j} has qk-norm, which the camera head never uses"
            )));
        }
        if width == 0 || !width.is_multiple_of(8) {
            return Err(invalid(format!(
                "camera head: width {width} must be a multiple of 8"
            )));
        }
        if width > TOKEN_NORM_PER_THREAD * 1024 || width * 2 > LIN_SMEM_LIMIT {
            return Err(invalid(format!(
                "camera head: width {width} above the kernels' {} (a row in shared memory)",
                LIN_SMEM_LIMIT / 2
            )));
        }
        if head.adaptive_norm.weight.is_some() || head.adaptive_norm.bias.is_some() {
            return Err(invalid(
                "camera head: the adaptive norm is expected without affine parameters",
            ));
        }
        let mlp_hidden = head.trunk.first().map_or(4 * width, |b| b.fc1.out_features);
        let branch_hidden = width / 2;
        // Largest row counts, for u32 kernel arguments.
        u32_of(
            max_frames_per_call * mlp_hidden.max(3 * width),
            "scratch elements",
        )?;
        u32_of(cache_capacity_frames + max_frames_per_call, "cache frames")?;

        let splits = default_splits(
            dev.info.sm_count as usize,
            heads,
            cache_capacity_frames + max_frames_per_call,
        );
        let m = max_frames_per_call;
        let cache_elems = iterations * layers * cache_capacity_frames * width;

        // Resident CTAs of each linear entry point (with the largest prologue tile it gets).
        let mut general = [[0usize; 4]; 2];
        for (nc, row) in general.iter_mut().enumerate() {
            for (t, r) in row.iter_mut().enumerate() {
                let tile = 1usize << t;
                *r = lin_resident_ctas(dev, lin_name(nc == 1, tile), tile * width * 2)?;
            }
        }
        let mut sweep = [[0usize; 2]; 2];
        for (t, (tile, entries)) in sweep.iter_mut().zip(SWEEP_ENTRIES).enumerate() {
            let rows = t + 1;
            for (r, (_, name)) in tile.iter_mut().zip(entries) {
                *r = lin_resident_ctas(dev, name, rows * width * 2)?;
            }
        }
        let lin_resident = LinResident { general, sweep };
        // Row tiles of a call and the pose branch's CTAs (partial sums per tile and CTA).
        let max_tiles = (1..=m)
            .map(|rows| lin_tile(rows, width, true).map(|t| rows.div_ceil(t)))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .max()
            .unwrap_or(1);
        let branch_ctas = branch_hidden.div_ceil(LIN_WARPS);

        let scratch = Scratch {
            x: zeros(dev, m * width)?,
            x_normed: zeros(dev, m * width)?,
            h: zeros(dev, m * width)?,
            raw: zeros(dev, m * POSE_ENC_LEN)?,
            qkv: zeros(dev, m * 3 * width)?,
            attn: zeros(dev, m * width)?,
            hidden: zeros(dev, m * mlp_hidden)?,
            part_o: zeros(dev, m * heads * MAX_SPLITS * head_dim)?,
            part_lse: zeros(dev, m * heads * MAX_SPLITS)?,
            att_counters: zeros(dev, m * heads)?,
            branch_part: zeros(dev, max_tiles * branch_ctas * BRANCH_PART)?,
            branch_counters: zeros(dev, max_tiles)?,
        };
        Ok(Self {
            width,
            heads,
            head_dim,
            iterations,
            max_frames: max_frames_per_call,
            capacity: cache_capacity_frames,
            splits,
            lin_resident,
            layers,
            cache_k: zeros(dev, cache_elems)?,
            cache_v: zeros(dev, cache_elems)?,
            scratch,
        })
    }

    /// Bytes of the K/V cache (both halves, all iterations and layers).
    pub fn cache_bytes(&self) -> usize {
        2 * self.iterations * self.layers * self.capacity * self.width * size_of::<bf16>()
    }

    /// Committed frames the cache can hold.
    pub fn cache_capacity_frames(&self) -> usize {
        self.capacity
    }

    /// Key splits per (query, head) of the attention.
    pub fn attention_splits(&self) -> usize {
        self.splits
    }

    /// A copy of the whole K and V cache on the host, `[iteration][layer][capacity][width]` each.
    /// Synchronises the stream: for tests and debugging, never inside a frame step.
    pub fn read_cache(&self, dev: &CudaDevice) -> Result<(Vec<bf16>, Vec<bf16>), CudaError> {
        Ok((
            dev.stream.clone_dtoh(&self.cache_k)?,
            dev.stream.clone_dtoh(&self.cache_v)?,
        ))
    }

    /// Overrides the key split count (clamped to 1..=64); tests use it to exercise the combine.
    pub fn set_attention_splits(&mut self, splits: usize) {
        self.splits = splits.clamp(1, MAX_SPLITS);
    }

    /// Pose encodings `[frames][9]` (`[t(3), quat(4), relu fov(2)]`, the last iteration's) from
    /// the camera tokens at `tokens + f * token_stride` (2 x embed f32 each). The frames attend to
    /// the first `*cache_len` committed frames of the cache plus themselves (bidirectionally);
    /// with `append` their K/V are written at slots `cache_len .. cache_len + frames` (the caller
    /// advances `cache_len` and guarantees the capacity). Launches only: graph-capturable.
    /// `weights` must be the head this state was made for ([`Self::new`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        dev: &CudaDevice,
        weights: &CameraHead<Device>,
        tokens: DevPtr<f32>,
        token_stride: usize,
        frames: usize,
        cache_len: DevPtr<u32>,
        append: bool,
        pose_enc_out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        if frames > 32 {
            return Err(invalid(format!(
                "camera head: {frames} frames in a call, at most 32"
            )));
        }
        let rows = CallRows {
            append: if append { (1u32 << frames) - 1 } else { 0 },
            own_lens: false,
        };
        self.forward_rows(
            dev,
            weights,
            tokens,
            token_stride,
            frames,
            cache_len,
            rows,
            pose_enc_out,
        )
    }

    /// The two frames of a two-frame step in one call, each as if streamed alone: frame f
    /// attends to the first `cache_lens[f]` frames of the cache and itself (not to the other
    /// frame), and a keyframe's K/V go to slot `cache_lens[f]`. The caller's lengths make the
    /// second frame see the first one's slot when the first is a keyframe (`cache_lens[1] =
    /// cache_lens[0] + 1`). One read of the weights serves both rows.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_pair(
        &mut self,
        dev: &CudaDevice,
        weights: &CameraHead<Device>,
        tokens: DevPtr<f32>,
        token_stride: usize,
        cache_lens: DevPtr<u32>,
        keyframes: [bool; 2],
        pose_enc_out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        cache_lens.check_len(2, "camera head cache lengths")?;
        let rows = CallRows {
            append: u32::from(keyframes[0]) | (u32::from(keyframes[1]) << 1),
            own_lens: true,
        };
        self.forward_rows(
            dev,
            weights,
            tokens,
            token_stride,
            2,
            cache_lens,
            rows,
            pose_enc_out,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_rows(
        &mut self,
        dev: &CudaDevice,
        weights: &CameraHead<Device>,
        tokens: DevPtr<f32>,
        token_stride: usize,
        frames: usize,
        cache_len: DevPtr<u32>,
        rows: CallRows,
        pose_enc_out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        let w = self.width;
        if weights.width != w || weights.trunk.len() != self.layers {
            return Err(invalid(
                "camera head: weights differ from the head this state was made for",
            ));
        }
        if frames == 0 || frames > self.max_frames {
            return Err(invalid(format!(
                "camera head: {frames} frames in a call, 1..={} allowed",
                self.max_frames
            )));
        }
        if frames > 1 && token_stride < w {
            return Err(invalid(format!(
                "camera head: token stride {token_stride} is narrower than a token ({w})"
            )));
        }
        tokens.check_len((frames - 1) * token_stride + w, "camera head tokens")?;
        cache_len.check_len(1, "camera head cache_len")?;
        pose_enc_out.check_len(frames * POSE_ENC_LEN, "camera head pose_enc_out")?;

        let s = &self.scratch;
        let threads = w
            .div_ceil(TOKEN_NORM_PER_THREAD)
            .next_multiple_of(32)
            .max(TOKEN_NORM_THREADS) as u32;
        // x = token_norm(token); x_normed = LN(x) without affine.
        // SAFETY: matches cam_token_norm; x, x_normed hold max_frames rows; tokens checked above;
        // width <= 8 x threads (checked at upload: width <= 8192).
        unsafe {
            launch(
                dev,
                "cam_token_norm",
                LaunchConfig {
                    grid_dim: (frames as u32, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    Arg::U64(tokens.addr()),
                    Arg::U64(token_stride as u64),
                    Arg::U64(opt_ptr(&weights.token_norm.weight)),
                    Arg::U64(opt_ptr(&weights.token_norm.bias)),
                    Arg::F32(weights.token_norm.eps),
                    Arg::F32(weights.adaptive_norm.eps),
                    Arg::U64(ptr(&s.x)),
                    Arg::U64(ptr(&s.x_normed)),
                    Arg::U32(w as u32),
                ],
            )?;
        }

        for it in 0..self.iterations {
            self.modulated_input(dev, weights, it, frames)?;
            for (j, block) in weights.trunk.iter().enumerate() {
                self.block(dev, block, it, j, frames, cache_len, rows)?;
            }
            self.pose_branch(dev, weights, it, frames, pose_enc_out)?;
        }
        Ok(())
    }

    /// Launches the linear kernel with this head's occupancy table.
    ///
    /// # Safety
    /// As [`launch_linear`].
    unsafe fn linear(&self, dev: &CudaDevice, a: LinArgs, nc3: bool) -> Result<(), CudaError> {
        // SAFETY: forwarded to the caller.
        unsafe { launch_linear(dev, a, nc3, Some(&self.lin_resident)) }
    }

    /// The arguments common to a layer `l` over `frames` rows.
    fn lin_args(l: &DeviceLinear, frames: usize) -> LinArgs {
        LinArgs {
            w: ptr(&l.weight),
            // The head's kernels add f32 biases.
            bias: l.bias.as_ref().map_or(0, |b| ptr(&b.f32)),
            rows: frames as u32,
            n: l.out_features as u32,
            k: l.in_features as u32,
            x_stride: l.in_features as u32,
            ..LinArgs::default()
        }
    }

    /// `x = bf16(norm(h))` as a linear layer's prologue.
    fn with_ln(&self, mut a: LinArgs, norm: &DeviceNorm) -> LinArgs {
        a.prologue = PRO_LN;
        a.src = ptr(&self.scratch.h);
        a.nw = opt_ptr(&norm.weight);
        a.nb = opt_ptr(&norm.bias);
        a.eps = norm.eps;
        a
    }

    /// `h = gate * (x_normed * (1 + scale) + shift) + x` with `[shift, scale, gate]` the
    /// modulation of SiLU(embed_pose(pose)), pose = the empty pose first, then the raw sum: one
    /// launch (the embedding is the prologue, the modulation the epilogue).
    fn modulated_input(
        &self,
        dev: &CudaDevice,
        weights: &CameraHead<Device>,
        it: usize,
        frames: usize,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        let (pose, stride) = if it == 0 {
            (ptr(&weights.empty_pose), 0u32)
        } else {
            (ptr(&s.raw), POSE_ENC_LEN as u32)
        };
        let a = LinArgs {
            prologue: PRO_EMBED,
            pose,
            pose_stride: stride,
            ew: ptr(&weights.embed_pose.weight),
            eb: opt_ptr(&weights.embed_pose.bias),
            epilogue: EPI_MODULATE,
            h: ptr(&s.h),
            mx: ptr(&s.x),
            mxn: ptr(&s.x_normed),
            ..Self::lin_args(&weights.modulation, frames)
        };
        // SAFETY: the modulation is 3W x W (checked at upload); h, x, x_normed hold max_frames
        // rows of W; the pose source holds 9 values (stride 0) or frames x 9; embed_pose is
        // W x 9 (checked at upload).
        unsafe { self.linear(dev, a, true) }
    }

    /// Trunk block `j` of iteration `it`: five launches (qkv with LN1 and the cache append,
    /// attention, proj with the residual, fc1 with LN2 and GELU, fc2 with the residual).
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        dev: &CudaDevice,
        b: &TransformerBlock<Device>,
        it: usize,
        j: usize,
        frames: usize,
        cache_len: DevPtr<u32>,
        rows: CallRows,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        let w = self.width;

        // This (iteration, layer)'s cache plane.
        let plane_len = self.capacity * w;
        let plane = (it * self.layers + j) * plane_len;
        let (cache_k, cache_v) = if plane_len == 0 {
            (0, 0)
        } else {
            (
                DevPtr::of(&self.cache_k).slice(plane, plane_len)?.addr(),
                DevPtr::of(&self.cache_v).slice(plane, plane_len)?.addr(),
            )
        };

        let a = LinArgs {
            epilogue: EPI_BF16,
            out_bf16: ptr(&s.qkv),
            append: if plane_len > 0 { rows.append } else { 0 },
            own_lens: u32::from(rows.own_lens),
            cache_k,
            cache_v,
            cache_len: cache_len.addr(),
            capacity: self.capacity as u32,
            width: w as u32,
            ..self.with_ln(Self::lin_args(&b.qkv, frames), &b.norm1)
        };
        // SAFETY: qkv is 3W x W; h holds max_frames rows of W, qkv 3W; the cache planes hold
        // capacity x W (the kernel drops slots at or past the capacity).
        unsafe { self.linear(dev, a, false)? };

        self.attention(dev, cache_k, cache_v, cache_len, rows.own_lens, frames)?;

        let a = LinArgs {
            x: ptr(&s.attn),
            epilogue: EPI_RESID,
            h: ptr(&s.h),
            gamma: ptr(&b.ls1),
            ..Self::lin_args(&b.proj, frames)
        };
        // SAFETY: proj is W x W; attn and h hold max_frames rows of W; ls1 W values.
        unsafe { self.linear(dev, a, false)? };

        let a = LinArgs {
            epilogue: EPI_BF16_GELU,
            out_bf16: ptr(&s.hidden),
            ..self.with_ln(Self::lin_args(&b.fc1, frames), &b.norm2)
        };
        // SAFETY: fc1 is mlp x W; h holds max_frames rows of W, hidden of mlp_hidden.
        unsafe { self.linear(dev, a, false)? };

        let a = LinArgs {
            x: ptr(&s.hidden),
            epilogue: EPI_RESID,
            h: ptr(&s.h),
            gamma: ptr(&b.ls2),
            ..Self::lin_args(&b.fc2, frames)
        };
        // SAFETY: fc2 is W x mlp; hidden holds max_frames rows of mlp_hidden, h of W.
        unsafe { self.linear(dev, a, false) }
    }

    /// `attn = softmax(q kᵀ / sqrt(d)) v` over cache[0 .. *cache_len) ∪ the current frames,
    /// split over `splits` CTAs per (query, head), merged by log-sum-exp in the same launch.
    fn attention(
        &self,
        dev: &CudaDevice,
        cache_k: u64,
        cache_v: u64,
        cache_len: DevPtr<u32>,
        own_lens: bool,
        frames: usize,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        let splits = self.splits.clamp(1, MAX_SPLITS) as u32;
        let (heads, hd) = (self.heads as u32, self.head_dim as u32);
        let scale_log2 = std::f32::consts::LOG2_E / (self.head_dim as f32).sqrt();
        let cfg = LaunchConfig {
            grid_dim: (splits, heads, frames as u32),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches cam_attention_partial; qkv holds frames x 3 x width, the cache planes
        // capacity x width (the kernel clamps cache_len to the capacity), part_o/part_lse
        // max_frames x heads x MAX_SPLITS (x head_dim), the counters max_frames x heads, attn
        // max_frames x width.
        unsafe {
            launch(
                dev,
                "cam_attention_partial",
                cfg,
                &[
                    Arg::U64(ptr(&s.qkv)),
                    Arg::U64(cache_k),
                    Arg::U64(cache_v),
                    Arg::U64(cache_len.addr()),
                    Arg::U32(u32::from(own_lens)),
                    Arg::U32(self.capacity as u32),
                    Arg::U32(frames as u32),
                    Arg::U32(self.width as u32),
                    Arg::U32(hd),
                    Arg::U32(splits),
                    Arg::F32(scale_log2),
                    Arg::U64(ptr(&s.part_o)),
                    Arg::U64(ptr(&s.part_lse)),
                    Arg::U64(ptr(&s.att_counters)),
                    Arg::U64(ptr(&s.attn)),
                ],
            )
        }
    }

    /// `delta = fc2(GELU(fc1(trunk_norm(h))))`; raw = delta or raw + delta; `pose_enc_out` = raw
    /// with ReLU on the field of view: one launch (trunk_norm is fc1's prologue; the 9-wide fc2
    /// and the accumulation its epilogue, finished by the last CTA).
    fn pose_branch(
        &self,
        dev: &CudaDevice,
        weights: &CameraHead<Device>,
        it: usize,
        frames: usize,
        pose_enc_out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        let a = LinArgs {
            epilogue: EPI_BRANCH,
            bw: ptr(&weights.branch_fc2.weight),
            bb: opt_ptr(&weights.branch_fc2.bias),
            part: ptr(&s.branch_part),
            counter: ptr(&s.branch_counters),
            raw: ptr(&s.raw),
            pose_out: pose_enc_out.addr(),
            first: u32::from(it == 0),
            ..self.with_ln(
                Self::lin_args(&weights.branch_fc1, frames),
                &weights.trunk_norm,
            )
        };
        // SAFETY: fc1 is branch_hidden x W, fc2 9 x branch_hidden (checked at upload); h holds
        // max_frames rows; raw and pose_enc_out frames x 9; branch_part holds the row tiles x
        // branch_hidden / 8 CTAs (the most the grid has) x 72, the counters one per row tile.
        unsafe { self.linear(dev, a, false) }
    }
}
