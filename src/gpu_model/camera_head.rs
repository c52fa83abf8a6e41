//! The camera head on the GPU, with its own K/V cache (spec §5.3, §6).
//!
//! The head sees one token per frame (the camera token of the last aggregator tap), runs
//! `iterations` refinements of a small transformer trunk over the camera tokens of every committed
//! frame, and accumulates the pose encoding. Weights are bf16 for matrices and f32 for norms,
//! LayerScale and the two tiny 9-wide layers (`embed_pose`, the pose branch's last layer, which
//! are computed by their own kernels: a 9-element row is not a shape for cuBLASLt). Activations
//! and the residual stream are f32; GEMM inputs bf16.
//!
//! The cache `[iteration][layer][capacity][heads][head_dim]` (K and V, bf16) is allocated once in
//! [`GpuCameraHead::upload`] and never evicted. The number of committed frames is a device `u32`
//! the caller uploads before each step: everything here may be captured into a CUDA graph (no
//! allocation, no host sync, no per-frame launch scalar).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::gemm::{Epilogue, Gemm};
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::model::block::TransformerBlock;
use crate::model::camera_head::CameraHead;
use crate::model::config::POSE_ENC_LEN;
use crate::model::ops::linear::Linear;
use crate::model::ops::norm::LayerNorm;

/// Threads of the row kernels (one CTA per frame).
const ROW_THREADS: u32 = 256;
/// Threads of the elementwise kernels' CTAs.
const ELEMENTWISE_THREADS: u32 = 256;
/// Threads of `cam_attention_partial` (4 warps; the kernel's `ATT_THREADS`).
const ATTENTION_THREADS: u32 = 128;
/// Largest head_dim the attention kernel handles (one thread per dimension in its final merge).
const MAX_HEAD_DIM: usize = 128;
/// Upper bound of key splits per (query, head); the partial-result buffers are sized for it.
const MAX_SPLITS: usize = 64;
/// Fewest keys a split is given when the cache is small (below that, splitting costs more than
/// it saves).
const MIN_KEYS_PER_SPLIT: usize = 4;

/// A LayerNorm's affine parameters on the device (either may be absent).
struct DevNorm {
    weight: Option<CudaSlice<f32>>,
    bias: Option<CudaSlice<f32>>,
    eps: f32,
}

/// A linear layer whose GEMM writes bf16 (bias bf16).
struct DevLinearBf16 {
    weight: CudaSlice<bf16>,
    bias: Option<CudaSlice<bf16>>,
    out_features: usize,
    in_features: usize,
}

/// A linear layer whose GEMM writes f32 (bias f32).
struct DevLinearF32 {
    weight: CudaSlice<bf16>,
    bias: Option<CudaSlice<f32>>,
    out_features: usize,
    in_features: usize,
}

/// One trunk block (pre-norm, no qk-norm, no RoPE, LayerScale).
struct DevBlock {
    norm1: DevNorm,
    qkv: DevLinearBf16,
    proj: DevLinearF32,
    ls1: CudaSlice<f32>,
    norm2: DevNorm,
    fc1: DevLinearBf16,
    fc2: DevLinearF32,
    ls2: CudaSlice<f32>,
}

/// Per-call activations, sized for `max_frames` rows.
struct Scratch {
    /// token_norm(camera token), the trunk's base `x`.
    x: CudaSlice<f32>,
    /// LN(x) without affine: the adaptive modulation's input.
    x_normed: CudaSlice<f32>,
    /// The residual stream.
    h: CudaSlice<f32>,
    /// Outputs of the f32 GEMMs (proj, fc2) before the residual add.
    tmp: CudaSlice<f32>,
    /// [shift | scale | gate] per frame.
    mods: CudaSlice<f32>,
    /// The accumulated pose encoding before the FoV ReLU.
    raw: CudaSlice<f32>,
    /// SiLU(embed_pose(pose)).
    embedded: CudaSlice<bf16>,
    /// The current LayerNorm output (GEMM input).
    normed: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    /// MLP hidden layer (also the pose branch's hidden layer).
    hidden: CudaSlice<bf16>,
    /// Per split: normalised partial attention outputs `[frames][heads][splits][head_dim]`
    /// and their log2-sum-exp `[frames][heads][splits]`.
    part_o: CudaSlice<f32>,
    part_lse: CudaSlice<f32>,
}

/// The camera head's weights, cache and scratch on one GPU.
pub struct GpuCameraHead {
    width: usize,
    heads: usize,
    head_dim: usize,
    mlp_hidden: usize,
    branch_hidden: usize,
    iterations: usize,
    max_frames: usize,
    capacity: usize,
    splits: usize,

    token_norm: DevNorm,
    adaptive_eps: f32,
    empty_pose: CudaSlice<f32>,
    embed_weight: CudaSlice<f32>,
    embed_bias: Option<CudaSlice<f32>>,
    modulation: DevLinearF32,
    trunk: Vec<DevBlock>,
    trunk_norm: DevNorm,
    branch_fc1: DevLinearBf16,
    branch_fc2_weight: CudaSlice<f32>,
    branch_fc2_bias: Option<CudaSlice<f32>>,

    cache_k: CudaSlice<bf16>,
    cache_v: CudaSlice<bf16>,
    scratch: Scratch,
}

fn invalid(msg: impl Into<String>) -> CudaError {
    CudaError::Invalid(msg.into())
}

fn upload_f32(dev: &CudaDevice, v: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
    if v.is_empty() {
        return Ok(dev.stream.alloc_zeros::<f32>(1)?);
    }
    Ok(dev.stream.clone_htod(v)?)
}

fn upload_bf16(dev: &CudaDevice, v: &[f32]) -> Result<CudaSlice<bf16>, CudaError> {
    let host: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
    if host.is_empty() {
        return Ok(dev.stream.alloc_zeros::<bf16>(1)?);
    }
    Ok(dev.stream.clone_htod(&host)?)
}

fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &CudaDevice,
    len: usize,
) -> Result<CudaSlice<T>, CudaError> {
    Ok(dev.stream.alloc_zeros::<T>(len.max(1))?)
}

fn check_vec(v: &[f32], len: usize, what: &str) -> Result<(), CudaError> {
    if v.len() != len {
        return Err(invalid(format!(
            "camera head {what}: {} values, expected {len}",
            v.len()
        )));
    }
    Ok(())
}

fn upload_norm(
    dev: &CudaDevice,
    n: &LayerNorm,
    dim: usize,
    what: &str,
) -> Result<DevNorm, CudaError> {
    if n.dim != dim {
        return Err(invalid(format!(
            "camera head {what}: normalises {} values, expected {dim}",
            n.dim
        )));
    }
    let weight = match &n.weight {
        Some(w) => {
            check_vec(w, dim, what)?;
            Some(upload_f32(dev, w)?)
        }
        None => None,
    };
    let bias = match &n.bias {
        Some(b) => {
            check_vec(b, dim, what)?;
            Some(upload_f32(dev, b)?)
        }
        None => None,
    };
    Ok(DevNorm {
        weight,
        bias,
        eps: n.eps,
    })
}

fn check_linear(l: &Linear, out: usize, inp: usize, what: &str) -> Result<(), CudaError> {
    if l.out_features != out || l.in_features != inp || l.weight.len() != out * inp {
        return Err(invalid(format!(
            "camera head {what}: {}x{} ({} weights), expected {out}x{inp}",
            l.out_features,
            l.in_features,
            l.weight.len()
        )));
    }
    if let Some(b) = &l.bias {
        check_vec(b, out, what)?;
    }
    Ok(())
}

fn upload_linear_bf16(
    dev: &CudaDevice,
    l: &Linear,
    out: usize,
    inp: usize,
    what: &str,
) -> Result<DevLinearBf16, CudaError> {
    check_linear(l, out, inp, what)?;
    Ok(DevLinearBf16 {
        weight: upload_bf16(dev, &l.weight)?,
        bias: l.bias.as_deref().map(|b| upload_bf16(dev, b)).transpose()?,
        out_features: out,
        in_features: inp,
    })
}

fn upload_linear_f32(
    dev: &CudaDevice,
    l: &Linear,
    out: usize,
    inp: usize,
    what: &str,
) -> Result<DevLinearF32, CudaError> {
    check_linear(l, out, inp, what)?;
    Ok(DevLinearF32 {
        weight: upload_bf16(dev, &l.weight)?,
        bias: l.bias.as_deref().map(|b| upload_f32(dev, b)).transpose()?,
        out_features: out,
        in_features: inp,
    })
}

fn upload_block(
    dev: &CudaDevice,
    b: &TransformerBlock,
    width: usize,
    hidden: usize,
    j: usize,
) -> Result<DevBlock, CudaError> {
    if b.qk_norm.is_some() {
        return Err(invalid(format!(
            "camera head trunk block {j} has qk-norm, which the camera head never uses"
        )));
    }
    check_vec(&b.ls1, width, "ls1")?;
    check_vec(&b.ls2, width, "ls2")?;
    let name = |part: &str| format!("trunk.{j}.{part}");
    Ok(DevBlock {
        norm1: upload_norm(dev, &b.norm1, width, &name("norm1"))?,
        qkv: upload_linear_bf16(dev, &b.qkv, 3 * width, width, &name("qkv"))?,
        proj: upload_linear_f32(dev, &b.proj, width, width, &name("proj"))?,
        ls1: upload_f32(dev, &b.ls1)?,
        norm2: upload_norm(dev, &b.norm2, width, &name("norm2"))?,
        fc1: upload_linear_bf16(dev, &b.fc1, hidden, width, &name("fc1"))?,
        fc2: upload_linear_f32(dev, &b.fc2, width, hidden, &name("fc2"))?,
        ls2: upload_f32(dev, &b.ls2)?,
    })
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

fn u32_of(v: usize, what: &str) -> Result<u32, CudaError> {
    u32::try_from(v).map_err(|_| invalid(format!("camera head: {what} = {v} exceeds u32")))
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

fn rows_cfg(frames: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (frames as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn elementwise_cfg(n: usize) -> LaunchConfig {
    // Grid-stride kernels: a few thousand CTAs at most are plenty for these sizes.
    let blocks = n.div_ceil(ELEMENTWISE_THREADS as usize).clamp(1, 4096) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (ELEMENTWISE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl GpuCameraHead {
    /// Uploads `cpu`'s weights (matrices as bf16) and allocates the scratch for up to
    /// `max_frames_per_call` frames and the K/V cache for `cache_capacity_frames` committed frames
    /// (bf16, `[iteration][layer][capacity][heads][head_dim]`), all once.
    pub fn upload(
        dev: &CudaDevice,
        cpu: &CameraHead,
        max_frames_per_call: usize,
        cache_capacity_frames: usize,
    ) -> Result<Self, CudaError> {
        let width = cpu.width;
        let layers = cpu.trunk.len();
        let iterations = cpu.iterations;
        if max_frames_per_call == 0 {
            return Err(invalid(
                "camera head: max_frames_per_call must be at least 1",
            ));
        }
        if iterations == 0 {
            return Err(invalid("camera head: zero iterations"));
        }
        let (heads, head_dim) = match cpu.trunk.first() {
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
        if cpu
            .trunk
            .iter()
            .any(|b| b.heads != heads || b.head_dim != head_dim || b.dim != width)
        {
            return Err(invalid("camera head: trunk blocks differ in shape"));
        }
        if width == 0 || !width.is_multiple_of(8) {
            return Err(invalid(format!(
                "camera head: width {width} must be a multiple of 8"
            )));
        }
        if cpu.adaptive_norm.weight.is_some() || cpu.adaptive_norm.bias.is_some() {
            return Err(invalid(
                "camera head: the adaptive norm is expected without affine parameters",
            ));
        }
        let mlp_hidden = cpu.trunk.first().map_or(4 * width, |b| b.fc1.out_features);
        let branch_hidden = width / 2;
        check_vec(&cpu.empty_pose, POSE_ENC_LEN, "empty_pose_tokens")?;
        check_linear(&cpu.embed_pose, width, POSE_ENC_LEN, "embed_pose")?;
        check_linear(
            &cpu.branch_fc2,
            POSE_ENC_LEN,
            branch_hidden,
            "pose_branch.fc2",
        )?;
        // Largest row counts, for u32 kernel arguments.
        u32_of(
            max_frames_per_call * mlp_hidden.max(3 * width),
            "scratch elements",
        )?;
        u32_of(cache_capacity_frames + max_frames_per_call, "cache frames")?;

        let trunk = cpu
            .trunk
            .iter()
            .enumerate()
            .map(|(j, b)| upload_block(dev, b, width, mlp_hidden, j))
            .collect::<Result<Vec<_>, _>>()?;
        let splits = default_splits(
            dev.info.sm_count as usize,
            heads,
            cache_capacity_frames + max_frames_per_call,
        );
        let m = max_frames_per_call;
        let cache_elems = iterations * layers * cache_capacity_frames * width;
        let scratch = Scratch {
            x: zeros(dev, m * width)?,
            x_normed: zeros(dev, m * width)?,
            h: zeros(dev, m * width)?,
            tmp: zeros(dev, m * width)?,
            mods: zeros(dev, m * 3 * width)?,
            raw: zeros(dev, m * POSE_ENC_LEN)?,
            embedded: zeros(dev, m * width)?,
            normed: zeros(dev, m * width)?,
            qkv: zeros(dev, m * 3 * width)?,
            attn: zeros(dev, m * width)?,
            hidden: zeros(dev, m * mlp_hidden.max(branch_hidden))?,
            part_o: zeros(dev, m * heads * MAX_SPLITS * head_dim)?,
            part_lse: zeros(dev, m * heads * MAX_SPLITS)?,
        };
        Ok(Self {
            width,
            heads,
            head_dim,
            mlp_hidden,
            branch_hidden,
            iterations,
            max_frames: max_frames_per_call,
            capacity: cache_capacity_frames,
            splits,
            token_norm: upload_norm(dev, &cpu.token_norm, width, "token_norm")?,
            adaptive_eps: cpu.adaptive_norm.eps,
            empty_pose: upload_f32(dev, &cpu.empty_pose)?,
            embed_weight: upload_f32(dev, &cpu.embed_pose.weight)?,
            embed_bias: cpu
                .embed_pose
                .bias
                .as_deref()
                .map(|b| upload_f32(dev, b))
                .transpose()?,
            modulation: upload_linear_f32(dev, &cpu.modulation, 3 * width, width, "modulation")?,
            trunk,
            trunk_norm: upload_norm(dev, &cpu.trunk_norm, width, "trunk_norm")?,
            branch_fc1: upload_linear_bf16(
                dev,
                &cpu.branch_fc1,
                branch_hidden,
                width,
                "pose_branch.fc1",
            )?,
            branch_fc2_weight: upload_f32(dev, &cpu.branch_fc2.weight)?,
            branch_fc2_bias: cpu
                .branch_fc2
                .bias
                .as_deref()
                .map(|b| upload_f32(dev, b))
                .transpose()?,
            cache_k: zeros(dev, cache_elems)?,
            cache_v: zeros(dev, cache_elems)?,
            scratch,
        })
    }

    /// Bytes of the K/V cache (both halves, all iterations and layers).
    pub fn cache_bytes(&self) -> usize {
        2 * self.iterations * self.trunk.len() * self.capacity * self.width * size_of::<bf16>()
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
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        tokens: DevPtr<f32>,
        token_stride: usize,
        frames: usize,
        cache_len: DevPtr<u32>,
        append: bool,
        pose_enc_out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        let w = self.width;
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

        // x = token_norm(token); x_normed = LN(x) without affine.
        // SAFETY: matches cam_token_norm; x, x_normed hold max_frames rows; tokens checked above.
        unsafe {
            launch(
                dev,
                "cam_token_norm",
                rows_cfg(frames, ROW_THREADS),
                &[
                    Arg::U64(tokens.addr()),
                    Arg::U64(token_stride as u64),
                    Arg::U64(opt_ptr(&self.token_norm.weight)),
                    Arg::U64(opt_ptr(&self.token_norm.bias)),
                    Arg::F32(self.token_norm.eps),
                    Arg::F32(self.adaptive_eps),
                    Arg::U64(ptr(&s.x)),
                    Arg::U64(ptr(&s.x_normed)),
                    Arg::U32(w as u32),
                ],
            )?;
        }

        for it in 0..self.iterations {
            self.modulated_input(dev, gemm, it, frames)?;
            // LN1 of the first block (or the final norm when the trunk is empty).
            let first_norm = self.trunk.first().map_or(&self.trunk_norm, |b| &b.norm1);
            self.residual_ln(dev, None, None, first_norm, frames)?;
            for j in 0..self.trunk.len() {
                self.block(dev, gemm, it, j, frames, cache_len, append)?;
            }
            self.pose_branch(dev, gemm, it, frames, pose_enc_out)?;
        }
        Ok(())
    }

    /// `h = gate * (x_normed * (1 + scale) + shift) + x` with `[shift, scale, gate]` from the
    /// modulation of SiLU(embed_pose(pose)), pose = the empty pose first, then the raw sum.
    fn modulated_input(
        &self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        it: usize,
        frames: usize,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        let w = self.width;
        let (pose, stride) = if it == 0 {
            (ptr(&self.empty_pose), 0u32)
        } else {
            (ptr(&s.raw), POSE_ENC_LEN as u32)
        };
        // SAFETY: matches cam_embed_pose_silu; embedded holds max_frames rows of width; the pose
        // source holds 9 values (stride 0) or frames x 9.
        unsafe {
            launch(
                dev,
                "cam_embed_pose_silu",
                elementwise_cfg(frames * w),
                &[
                    Arg::U64(pose),
                    Arg::U32(stride),
                    Arg::U64(ptr(&self.embed_weight)),
                    Arg::U64(opt_ptr(&self.embed_bias)),
                    Arg::U64(ptr(&s.embedded)),
                    Arg::U32(w as u32),
                    Arg::U32(frames as u32),
                ],
            )?;
        }
        linear_f32(
            dev,
            gemm,
            &self.modulation,
            DevPtr::of(&s.embedded),
            DevPtr::of(&s.mods),
            frames,
        )?;
        // SAFETY: matches cam_modulate; all buffers hold max_frames rows (mods 3 x width).
        unsafe {
            launch(
                dev,
                "cam_modulate",
                elementwise_cfg(frames * w),
                &[
                    Arg::U64(ptr(&s.x)),
                    Arg::U64(ptr(&s.x_normed)),
                    Arg::U64(ptr(&s.mods)),
                    Arg::U64(ptr(&s.h)),
                    Arg::U32(w as u32),
                    Arg::U32(frames as u32),
                ],
            )
        }
    }

    /// `h += gamma * y` when `y` is given, then `normed = bf16(norm(h))`.
    fn residual_ln(
        &self,
        dev: &CudaDevice,
        y: Option<&CudaSlice<f32>>,
        gamma: Option<&CudaSlice<f32>>,
        norm: &DevNorm,
        frames: usize,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        // SAFETY: matches cam_residual_ln; h, y (tmp) and normed hold max_frames rows of width;
        // gamma and the norm's vectors hold width values (checked at upload).
        unsafe {
            launch(
                dev,
                "cam_residual_ln",
                rows_cfg(frames, ROW_THREADS),
                &[
                    Arg::U64(ptr(&s.h)),
                    Arg::U64(y.map_or(0, ptr)),
                    Arg::U64(gamma.map_or(0, ptr)),
                    Arg::U64(opt_ptr(&norm.weight)),
                    Arg::U64(opt_ptr(&norm.bias)),
                    Arg::F32(norm.eps),
                    Arg::U64(ptr(&s.normed)),
                    Arg::U32(self.width as u32),
                ],
            )
        }
    }

    /// Trunk block `j` of iteration `it`; on entry `normed` holds LN1(h), on exit the next
    /// norm's output (LN1 of block j + 1, or trunk_norm after the last block).
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        it: usize,
        j: usize,
        frames: usize,
        cache_len: DevPtr<u32>,
        append: bool,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        let b = &self.trunk[j];
        let w = self.width;
        linear_bf16(
            dev,
            gemm,
            &b.qkv,
            DevPtr::of(&s.normed),
            DevPtr::of(&s.qkv),
            frames,
        )?;

        // This (iteration, layer)'s cache plane.
        let plane_len = self.capacity * w;
        let plane = (it * self.trunk.len() + j) * plane_len;
        let cache_k = DevPtr::of(&self.cache_k).slice(plane, plane_len)?.addr();
        let cache_v = DevPtr::of(&self.cache_v).slice(plane, plane_len)?.addr();
        let capacity = self.capacity as u32;
        if append {
            // SAFETY: matches cam_cache_append; the kernel drops slots at or past the capacity.
            unsafe {
                launch(
                    dev,
                    "cam_cache_append",
                    elementwise_cfg(frames * w),
                    &[
                        Arg::U64(ptr(&s.qkv)),
                        Arg::U64(cache_k),
                        Arg::U64(cache_v),
                        Arg::U64(cache_len.addr()),
                        Arg::U32(capacity),
                        Arg::U32(w as u32),
                        Arg::U32(frames as u32),
                    ],
                )?;
            }
        }
        self.attention(dev, cache_k, cache_v, cache_len, frames)?;

        linear_f32(
            dev,
            gemm,
            &b.proj,
            DevPtr::of(&s.attn),
            DevPtr::of(&s.tmp),
            frames,
        )?;
        self.residual_ln(dev, Some(&s.tmp), Some(&b.ls1), &b.norm2, frames)?;
        linear_bf16(
            dev,
            gemm,
            &b.fc1,
            DevPtr::of(&s.normed),
            DevPtr::of(&s.hidden),
            frames,
        )?;
        let n_hidden = frames * self.mlp_hidden;
        // SAFETY: matches cam_gelu_bf16; hidden holds max_frames x mlp_hidden values.
        unsafe {
            launch(
                dev,
                "cam_gelu_bf16",
                elementwise_cfg(n_hidden),
                &[Arg::U64(ptr(&s.hidden)), Arg::U64(n_hidden as u64)],
            )?;
        }
        linear_f32(
            dev,
            gemm,
            &b.fc2,
            DevPtr::of(&s.hidden),
            DevPtr::of(&s.tmp),
            frames,
        )?;
        let next_norm = self.trunk.get(j + 1).map_or(&self.trunk_norm, |n| &n.norm1);
        self.residual_ln(dev, Some(&s.tmp), Some(&b.ls2), next_norm, frames)
    }

    /// `attn = softmax(q kᵀ / sqrt(d)) v` over cache[0 .. *cache_len) ∪ the current frames,
    /// split over `splits` CTAs per (query, head), merged by log-sum-exp.
    fn attention(
        &self,
        dev: &CudaDevice,
        cache_k: u64,
        cache_v: u64,
        cache_len: DevPtr<u32>,
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
        // max_frames x heads x MAX_SPLITS (x head_dim).
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
                    Arg::U32(self.capacity as u32),
                    Arg::U32(frames as u32),
                    Arg::U32(self.width as u32),
                    Arg::U32(hd),
                    Arg::U32(splits),
                    Arg::F32(scale_log2),
                    Arg::U64(ptr(&s.part_o)),
                    Arg::U64(ptr(&s.part_lse)),
                ],
            )?;
        }
        let cfg = LaunchConfig {
            grid_dim: (heads, frames as u32, 1),
            block_dim: (hd, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches cam_attention_combine; attn holds max_frames x width.
        unsafe {
            launch(
                dev,
                "cam_attention_combine",
                cfg,
                &[
                    Arg::U64(ptr(&s.part_o)),
                    Arg::U64(ptr(&s.part_lse)),
                    Arg::U64(ptr(&s.attn)),
                    Arg::U32(self.width as u32),
                    Arg::U32(hd),
                    Arg::U32(splits),
                ],
            )
        }
    }

    /// `delta = fc2(GELU(fc1(normed)))` (normed = trunk_norm(h)); raw = delta or raw + delta;
    /// `pose_enc_out` = raw with ReLU on the field of view.
    fn pose_branch(
        &self,
        dev: &CudaDevice,
        gemm: &mut Gemm,
        it: usize,
        frames: usize,
        pose_enc_out: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        let s = &self.scratch;
        linear_bf16(
            dev,
            gemm,
            &self.branch_fc1,
            DevPtr::of(&s.normed),
            DevPtr::of(&s.hidden),
            frames,
        )?;
        // SAFETY: matches cam_pose_branch_out (9 warps, one per output); hidden holds frames x
        // branch_hidden, the fc2 weight 9 x branch_hidden, raw and pose_enc_out frames x 9.
        unsafe {
            launch(
                dev,
                "cam_pose_branch_out",
                rows_cfg(frames, 32 * POSE_ENC_LEN as u32),
                &[
                    Arg::U64(ptr(&s.hidden)),
                    Arg::U64(ptr(&self.branch_fc2_weight)),
                    Arg::U64(opt_ptr(&self.branch_fc2_bias)),
                    Arg::U64(ptr(&s.raw)),
                    Arg::U64(pose_enc_out.addr()),
                    Arg::U32(self.branch_hidden as u32),
                    Arg::U32(u32::from(it == 0)),
                ],
            )
        }
    }
}

/// `y = x · wᵀ (+ b)` into bf16.
fn linear_bf16(
    dev: &CudaDevice,
    gemm: &mut Gemm,
    l: &DevLinearBf16,
    x: DevPtr<bf16>,
    y: DevPtr<bf16>,
    rows: usize,
) -> Result<(), CudaError> {
    let bias = l.bias.as_ref().map(DevPtr::of);
    let epilogue = if bias.is_some() {
        Epilogue::Bias
    } else {
        Epilogue::None
    };
    gemm.linear(
        dev,
        x,
        DevPtr::of(&l.weight),
        bias,
        y,
        rows,
        l.out_features,
        l.in_features,
        epilogue,
    )
}

/// `y = x · wᵀ (+ b)` into f32.
fn linear_f32(
    dev: &CudaDevice,
    gemm: &mut Gemm,
    l: &DevLinearF32,
    x: DevPtr<bf16>,
    y: DevPtr<f32>,
    rows: usize,
) -> Result<(), CudaError> {
    gemm.linear_f32out(
        dev,
        x,
        DevPtr::of(&l.weight),
        l.bias.as_ref().map(DevPtr::of),
        y,
        rows,
        l.out_features,
        l.in_features,
    )
}
