//! The attention kernels (named in `table`), their launch, split-KV sizing, and the kernel-facing
//! views of the keys ([`PagedKv`], [`RawPagedKv`]). The K/V storage (`kv`) builds on these views;
//! nothing here depends on it.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::{CudaDevice, CudaError};
pub use crate::attention::Softmax;
use crate::attention::log2_query_scale;
use crate::model::spec::HEAD_DIM;

mod table;
pub use table::AttentionKernel;

/// The bounded kernel's entry for queries in the log2 domain with offset 0 (loaded beside the
/// table's entries).
const LOG2_QUERIES_ENTRY: &str = "paged_attention_fwd_sm90_ws_m256_log2";

/// Keys per tile, in every kernel.
pub const BLOCK_N: usize = 64;
/// One K or V tile, bf16.
const KV_TILE_BYTES: usize = BLOCK_N * HEAD_DIM * 2;
/// Slack to align wgmma tiles to the 1024-byte swizzle atom.
const ALIGN_SLACK: usize = 1024;
/// K/V ring of the warp-specialised kernels (`Ws<BN>` in their source): 192 KB of K and V tiles
/// in every variant.
const WS_RING_BYTES: usize = 6 * 2 * 2 * KV_TILE_BYTES;

/// How each kernel is launched (its name, entry point and source come from `table`).
impl AttentionKernel {
    /// The warp-specialised wgmma kernels: they merge their key splits themselves and take
    /// several key views in one launch.
    pub fn warp_specialised(self) -> bool {
        !matches!(self, Self::MmaSync)
    }

    /// Consumer warpgroups of a warp-specialised CTA, 64 query rows each (`NC` of its
    /// `WS_ENTRY`); the portable kernel's 4 warps cover 128 rows too.
    fn consumers(self) -> usize {
        if matches!(self, Self::WgmmaWsM256 | Self::WgmmaWsM256Bounded) {
            4
        } else {
            2
        }
    }

    /// Keys per K/V tile (`BN` of the warp-specialised kernels' `WS_ENTRY`).
    fn key_tile(self) -> usize {
        match self {
            Self::MmaSync => BLOCK_N,
            Self::WgmmaWsM256 | Self::WgmmaWsM256Bounded => 64,
            Self::WgmmaWs => 128,
            Self::WgmmaWsN192 => 192,
        }
    }

    /// Query rows per CTA.
    pub fn block_m(self) -> usize {
        self.consumers() * 64
    }

    /// Whether `lq` queries end in a lone query tile: with four consumers, a last tile of at
    /// most 64 rows after at least one full tile (1042 tokens: 18 rows). Its consumer 0 works
    /// alone, its CTAs start after every full tile's, and it takes key splits of its own
    /// ([`tail_splits`]).
    fn lone_last_tile(self, lq: usize) -> bool {
        self.consumers() == 4 && lq > self.block_m() && (lq - 1) % self.block_m() < 64
    }

    /// Query tiles of `lq` rows a launch's key splits are chosen for ([`choose_splits`]): all
    /// of them but a lone last tile, whose splits are its own.
    pub fn split_tiles(self, lq: usize) -> usize {
        if self.lone_last_tile(lq) {
            lq / self.block_m()
        } else {
            lq.div_ceil(self.block_m())
        }
    }

    fn threads(self) -> u32 {
        if self.warp_specialised() {
            (self.consumers() as u32 + 1) * 128
        } else {
            128
        }
    }

    /// Stages of the K/V ring, each with a full and an empty mbarrier (`Ws<BN>::STAGES`: the
    /// ring holds the same bytes whatever the tile).
    fn ws_stages(self) -> usize {
        WS_RING_BYTES / (2 * self.key_tile() * HEAD_DIM * 2)
    }

    /// CTAs resident per SM: the kernels' __launch_bounds__ minimum, which their registers and
    /// shared memory were sized for.
    pub fn ctas_per_sm(self) -> usize {
        if self.warp_specialised() { 1 } else { 2 }
    }

    fn smem_bytes(self) -> u32 {
        let q = self.block_m() * HEAD_DIM * 2;
        let bytes = match self {
            // Two stages of a K and a V tile.
            Self::MmaSync => q + 2 * 2 * KV_TILE_BYTES,
            // The ring (six stages of 128-key K and V tiles, four of 192, twelve of 64) and a
            // full and an empty mbarrier per stage: 209 KB with two consumers' Q, 225 KB with
            // four's (one CTA per SM).
            Self::WgmmaWs | Self::WgmmaWsN192 | Self::WgmmaWsM256 | Self::WgmmaWsM256Bounded => {
                q + WS_RING_BYTES + ALIGN_SLACK + self.ws_stages() * 2 * 8
            }
        };
        bytes as u32
    }

    /// Every kernel this device loaded, the portable one first.
    pub fn available(dev: &CudaDevice) -> Vec<Self> {
        Self::ALL
            .iter()
            .copied()
            .filter(|k| dev.kernels.has(k.entry()))
            .collect()
    }

    /// The entry point a launch with `softmax` runs, the factor it puts on `q·k` to reach the
    /// log2 domain, and its fixed offset: the bounded kernel takes a fixed offset where the
    /// caller has one (its log2-domain entry where the queries come scaled and the offset is 0)
    /// and is [`Self::WgmmaWsM256`] otherwise (the running maximum is right for any scores);
    /// every other kernel runs its online softmax whatever the caller knows, on scaled queries
    /// as on plain ones.
    fn launch_entry(self, softmax: Softmax) -> (&'static str, f32, f32) {
        let plain = log2_query_scale(HEAD_DIM);
        match (self, softmax) {
            (Self::WgmmaWsM256Bounded, Softmax::FixedOffset(offset)) => {
                (self.entry(), plain, offset)
            }
            (Self::WgmmaWsM256Bounded, Softmax::Log2Queries { offset: 0.0 }) => {
                (LOG2_QUERIES_ENTRY, 1.0, 0.0)
            }
            (Self::WgmmaWsM256Bounded, Softmax::Log2Queries { offset }) => {
                (self.entry(), 1.0, offset)
            }
            (Self::WgmmaWsM256Bounded, Softmax::RunningMax) => {
                (Self::WgmmaWsM256.entry(), plain, 0.0)
            }
            (_, Softmax::Log2Queries { .. }) => (self.entry(), 1.0, 0.0),
            _ => (self.entry(), plain, 0.0),
        }
    }

    /// The kernel used by default: the four-consumer wgmma kernel on Hopper, with a fixed
    /// softmax offset where the caller bounds the scores (H200, 72/72: 0.566 ms against 0.658
    /// with the running maximum; the whole model 20.6 ms a frame with log2-domain queries
    /// against 23.3), else mma.sync. The four consumers against WgmmaWsN192's two: 0.671
    /// against 0.703 ms at 72/72.
    pub fn best_for(dev: &CudaDevice) -> Self {
        [Self::WgmmaWsM256Bounded, Self::WgmmaWsM256]
            .into_iter()
            .find(|k| dev.kernels.has(k.entry()))
            .unwrap_or(Self::MmaSync)
    }

    /// The kernel used by default for frame-local attention (1005 queries against their own
    /// 1005 keys): 128-key tiles waste less on the ragged last tile than 192 (H200, whole model:
    /// 24.88 ms per frame against 25.02 with WgmmaWsN192, 25.37 MmaSync).
    pub fn best_local_for(dev: &CudaDevice) -> Self {
        [Self::WgmmaWs]
            .into_iter()
            .find(|k| dev.kernels.has(k.entry()))
            .unwrap_or(Self::MmaSync)
    }
}

/// Tuning knobs of one call; the defaults choose for the device.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionOptions {
    /// Key splits; None: [`choose_splits`].
    pub splits: Option<usize>,
    /// None: [`AttentionKernel::best_for`].
    pub kernel: Option<AttentionKernel>,
    /// What the caller knows of the scores (read by [`AttentionKernel::WgmmaWsM256Bounded`]).
    pub softmax: Softmax,
}

/// How many key splits to use: the largest count that still fits all CTAs in one wave, so a
/// launch of few query tiles (1005 queries x 16 heads is 128 CTAs) fills the GPU without leaving
/// a partial second wave; more splits (up to 16) only where a whole number of waves beats that by
/// more than 5 % (the combine costs a little): 1005 queries in 192-row tiles are 96 CTAs for
/// 132 SMs, and 4 splits run 384 CTAs in 3 waves of a quarter of the keys each (0.75 of one
/// unsplit wave). Never more splits than key tiles.
pub fn choose_splits(
    q_tiles: usize,
    heads: usize,
    kv_tiles: usize,
    sm_count: usize,
    ctas_per_sm: usize,
) -> usize {
    const MAX_WAVE_SPLITS: usize = 16;
    let base = (q_tiles * heads).max(1);
    let slots = (sm_count * ctas_per_sm).max(1);
    let one_wave = (slots / base).max(1);
    // Time of `s` splits in units of one unsplit CTA: waves x 1/s of the keys each.
    let cost = |s: usize| (base * s).div_ceil(slots) as f64 / s as f64;
    let mut best = one_wave;
    for s in one_wave + 1..=MAX_WAVE_SPLITS {
        if cost(s) < 0.95 * cost(best) {
            best = s;
        }
    }
    best.clamp(1, kv_tiles.max(1))
}

/// Most key splits a lone last query tile takes (the GPU model's workspace holds that many).
pub const MAX_TAIL_SPLITS: usize = 8;

/// Key splits of the lone last query tile ([`AttentionKernel::split_tiles`]) of a launch over
/// `n_splits` splits with `tail_ctas` of its CTAs a split (heads x key views): as many as fill
/// the `slots` CTAs the GPU holds at once with the tail's CTAs alone, at most
/// [`MAX_TAIL_SPLITS`], in whole multiples of `n_splits` (the grid gives the tail whole columns
/// of `n_splits` CTAs), and never fewer than `n_splits`. Without a lone tile, `n_splits`.
///
/// Why: a lone tile's CTA has one consumer and its producer copies the split's every key tile,
/// so with the launch's splits it costs most of a full tile's CTA. At 1042 tokens x 16 heads the
/// 64 full tiles run in two splits (one wave of 128 CTAs), and the 16 tails then in eight (one
/// more wave of 128 short CTAs) instead of eight splits for all (five waves).
pub fn tail_splits(
    kernel: AttentionKernel,
    lq: usize,
    n_splits: usize,
    tail_ctas: usize,
    slots: usize,
) -> usize {
    let n_splits = n_splits.max(1);
    if !kernel.lone_last_tile(lq) {
        return n_splits;
    }
    let fill = (slots / tail_ctas.max(1)).clamp(1, MAX_TAIL_SPLITS);
    n_splits * (fill / n_splits).max(1)
}

/// The key splits of one launch: `each` for the full query tiles, `most` for any tile (a lone
/// last tile may take more). Worked out once per launch and handed down, so the workspace
/// checks and the grid agree by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LaunchSplits {
    each: usize,
    most: usize,
}

impl LaunchSplits {
    fn of(
        dev: &CudaDevice,
        kernel: AttentionKernel,
        lq: usize,
        heads: usize,
        views: KeyViews,
        n_splits: usize,
    ) -> Self {
        let each = n_splits.max(1);
        let slots = dev.info.sm_count as usize * kernel.ctas_per_sm();
        Self {
            each,
            most: tail_splits(kernel, lq, each, heads * views.count, slots),
        }
    }
}

/// Scratch for split-KV partial results; grows on demand (size it once up front to keep it fixed).
pub struct AttentionWorkspace {
    part_o: CudaSlice<f32>,
    part_lse: CudaSlice<f32>,
    tickets: CudaSlice<u32>,
}

impl AttentionWorkspace {
    pub fn new(
        dev: &CudaDevice,
        lq: usize,
        heads: usize,
        max_splits: usize,
    ) -> Result<Self, CudaError> {
        let (o, l, t) = RawWorkspace::elems(lq, heads, max_splits);
        Ok(Self {
            part_o: dev.stream.alloc_zeros::<f32>(o)?,
            part_lse: dev.stream.alloc_zeros::<f32>(l)?,
            tickets: dev.stream.alloc_zeros::<u32>(t)?,
        })
    }

    fn reserve(
        &mut self,
        dev: &CudaDevice,
        lq: usize,
        heads: usize,
        splits: usize,
    ) -> Result<(), CudaError> {
        let (_, l, t) = RawWorkspace::elems(lq, heads, splits);
        if self.part_lse.len() < l || self.tickets.len() < t {
            *self = Self::new(dev, lq, heads, splits)?;
        }
        Ok(())
    }
}

/// The keys of one attention call: a pool in `[page][K|V][heads][page_size][64]` layout and its
/// page table (device views).
pub struct PagedKv<'a> {
    pub pool: CudaView<'a, bf16>,
    pub page_size: u32,
    pub indices: CudaView<'a, u32>,
    pub cum: CudaView<'a, u32>,
    /// One u32 on the device: the number of visible pages (read by the kernel, so a captured
    /// graph follows the table as it changes).
    pub n_pages: CudaView<'a, u32>,
    /// Visible keys as the host last uploaded them: sizes the key splits.
    pub kv_len: u32,
}

/// out[lq][heads][64] = softmax(q k^T / sqrt(64)) v over the paged keys. Returns the number of
/// key splits used.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    dev: &CudaDevice,
    q: &CudaSlice<bf16>,
    out: &mut CudaSlice<bf16>,
    kv: &PagedKv<'_>,
    lq: usize,
    heads: usize,
    opts: AttentionOptions,
    ws: &mut AttentionWorkspace,
) -> Result<usize, CudaError> {
    let kernel = opts
        .kernel
        .unwrap_or_else(|| AttentionKernel::best_for(dev));
    let elems = lq * heads * HEAD_DIM;
    if q.len() < elems || out.len() < elems {
        return Err(CudaError::Invalid(format!(
            "q/out hold fewer than {lq} x {heads} x {HEAD_DIM} elements"
        )));
    }
    if lq == 0 {
        return Ok(0);
    }
    if kv.kv_len == 0 {
        // Nothing to attend to: the reference returns zeros.
        dev.stream.memset_zeros(out)?;
        return Ok(0);
    }
    let q_tiles = kernel.split_tiles(lq);
    let kv_tiles = (kv.kv_len as usize).div_ceil(BLOCK_N);
    let n_splits = opts
        .splits
        .unwrap_or_else(|| {
            choose_splits(
                q_tiles,
                heads,
                kv_tiles,
                dev.info.sm_count as usize,
                kernel.ctas_per_sm(),
            )
        })
        .clamp(1, kv_tiles);
    // The kernel sizes the splits from the device's table; a split left without keys writes an
    // empty partial, which the combine ignores. A lone last tile may take more splits.
    let one = KeyViews {
        count: 1,
        stride: 0,
    };
    ws.reserve(
        dev,
        lq,
        heads,
        LaunchSplits::of(dev, kernel, lq, heads, one, n_splits).most,
    )?;
    let raw = RawPagedKv {
        pool: DevPtr::of(&kv.pool),
        page_size: kv.page_size,
        indices: DevPtr::of(&kv.indices),
        cum: DevPtr::of(&kv.cum),
        n_pages: DevPtr::of(&kv.n_pages),
    };
    let raw_ws = RawWorkspace {
        part_o: DevPtr::of(&ws.part_o),
        part_lse: DevPtr::of(&ws.part_lse),
        tickets: DevPtr::of(&ws.tickets),
    };
    paged_attention_raw(
        dev,
        kernel,
        opts.softmax,
        DevPtr::of(q),
        DevPtr::of(&*out),
        &raw,
        lq,
        heads,
        n_splits,
        raw_ws,
    )?;
    Ok(n_splits)
}

/// Keys of one attention call as raw device addresses (the GPU model's form: fixed addresses a
/// CUDA graph can hold). The page count is read on the device.
#[derive(Debug, Clone, Copy)]
pub struct RawPagedKv {
    pub pool: DevPtr<bf16>,
    pub page_size: u32,
    pub indices: DevPtr<u32>,
    pub cum: DevPtr<u32>,
    pub n_pages: DevPtr<u32>,
}

/// Split-KV scratch carved from an arena: the partials `[splits][lq][heads][64]`, their
/// log-sum-exps `[splits][lq][heads]`, and the tickets of the warp-specialised kernels' in-kernel
/// merge (one per head and 16 query rows of a CTA; zero between launches: the merging warp sets
/// its ticket back, so the memory must start zeroed).
#[derive(Debug, Clone, Copy)]
pub struct RawWorkspace {
    pub part_o: DevPtr<f32>,
    pub part_lse: DevPtr<f32>,
    pub tickets: DevPtr<u32>,
}

/// Query rows one merge ticket covers: a consumer warp's 16 rows.
const TICKET_ROWS: usize = 16;
/// The most query rows a CTA of any kernel takes.
const MAX_BLOCK_M: usize = 256;

impl RawWorkspace {
    /// Elements of (partials, log-sum-exps, tickets) for `lq` queries, `heads` heads and up to
    /// `splits` key splits, whatever the kernel.
    pub fn elems(lq: usize, heads: usize, splits: usize) -> (usize, usize, usize) {
        let rows = (lq * heads * splits).max(1);
        // One query tile more than `lq` rows take: the same rows in two views (two frames of a
        // launch, each its own tiles) may start one more tile.
        let tiles = lq.div_ceil(MAX_BLOCK_M) + 1;
        let tickets = (heads * tiles * (MAX_BLOCK_M / TICKET_ROWS)).max(1);
        (rows * HEAD_DIM, rows, tickets)
    }

    /// Tickets one launch of `kernel` uses: one per head and 16 rows of every query tile.
    fn tickets_used(kernel: AttentionKernel, lq: usize, heads: usize) -> usize {
        heads * lq.div_ceil(kernel.block_m()) * (kernel.block_m() / TICKET_ROWS)
    }
}

/// `out[lq][heads][64] = softmax(q kᵀ / 8) v` with `n_splits` key splits fixed by the caller (the
/// kernel sizes each split from the device's table). Launch only: graph-capturable.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_raw(
    dev: &CudaDevice,
    kernel: AttentionKernel,
    softmax: Softmax,
    q: DevPtr<bf16>,
    out: DevPtr<bf16>,
    kv: &RawPagedKv,
    lq: usize,
    heads: usize,
    n_splits: usize,
    ws: RawWorkspace,
) -> Result<(), CudaError> {
    let one = KeyViews {
        count: 1,
        stride: 0,
    };
    paged_attention_views_raw(
        dev, kernel, softmax, q, out, kv, one, lq, heads, n_splits, ws,
    )
}

/// Several sets of queries in one launch, each over its own page table (the two frames of a
/// two-frame step): set v is rows `v * lq ..` of `q` and `out`, and its table lies `stride` u32
/// after `kv`'s (its page count, page ids and prefix sums alike).
#[derive(Debug, Clone, Copy)]
pub struct KeyViews {
    pub count: usize,
    pub stride: u32,
}

/// [`paged_attention_raw`] over `views.count` sets of `lq` queries, each with its own keys, in
/// one launch of a warp-specialised kernel (the portable one takes one view).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_views_raw(
    dev: &CudaDevice,
    kernel: AttentionKernel,
    softmax: Softmax,
    q: DevPtr<bf16>,
    out: DevPtr<bf16>,
    kv: &RawPagedKv,
    views: KeyViews,
    lq: usize,
    heads: usize,
    n_splits: usize,
    ws: RawWorkspace,
) -> Result<(), CudaError> {
    if views.count == 0 || (views.count > 1 && !kernel.warp_specialised()) {
        return Err(CudaError::Invalid(format!(
            "{} key views in one launch of {}",
            views.count,
            kernel.name()
        )));
    }
    let all_rows = views.count * lq;
    let elems = all_rows * heads * HEAD_DIM;
    q.check_len(elems, "attention q")?;
    out.check_len(elems, "attention out")?;
    // The wgmma kernel indexes within a page (K and V) with 32-bit offsets.
    if 2 * kv.page_size as u64 * (heads * HEAD_DIM) as u64 >= 1 << 32 {
        return Err(CudaError::Invalid(format!(
            "a page of {} tokens x {heads} heads exceeds 2^32 elements",
            kv.page_size
        )));
    }
    // A lone last query tile may take more splits than the others (then it has partials and
    // tickets even where the rest has one split).
    let splits = LaunchSplits::of(dev, kernel, lq, heads, views, n_splits);
    let (n_splits, most_splits) = (splits.each, splits.most);
    // The warp-specialised kernels merge their splits themselves; the portable one leaves the
    // partials to attention_combine.
    let merge_in_kernel = most_splits > 1 && kernel.warp_specialised();
    if most_splits > 1 {
        let (o, l, _) = RawWorkspace::elems(all_rows, heads, most_splits);
        ws.part_o.check_len(o, "attention split partials")?;
        ws.part_lse.check_len(l, "attention split LSE")?;
    }
    if merge_in_kernel {
        ws.tickets.check_len(
            views.count * RawWorkspace::tickets_used(kernel, lq, heads),
            "attention merge tickets",
        )?;
    }
    if lq == 0 {
        return Ok(());
    }
    let (entry, scale_log2, offset_log2) = kernel.launch_entry(softmax);
    launch_fwd(
        dev,
        kernel,
        entry,
        scale_log2,
        offset_log2,
        q,
        out,
        kv,
        views,
        lq,
        heads,
        splits,
        ws,
    )?;
    if n_splits > 1 && !merge_in_kernel {
        let combine = dev.kernels.get("attention_combine")?;
        let threads = lq * heads * (HEAD_DIM / 2);
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (lq32, heads32, ns32) = (lq as u32, heads as u32, n_splits as u32);
        let (oa, po, pl) = (out.addr(), ws.part_o.addr(), ws.part_lse.addr());
        let mut b = dev.stream.launch_builder(combine);
        b.arg(&po)
            .arg(&pl)
            .arg(&oa)
            .arg(&lq32)
            .arg(&heads32)
            .arg(&ns32);
        // SAFETY: arguments match attention_combine; the workspace holds n_splits planes.
        unsafe { b.launch(cfg) }?;
    }
    Ok(())
}

/// The entry point of the warp-specialised frame-local kernel that reads a q/k/v GEMM's output.
const QKV_ENTRY: &str = "paged_attention_fwd_sm90_ws_qkv";

/// Whether [`frame_attention_from_qkv`] can run here (the kernel is built for Hopper alone).
pub fn has_frame_attention_from_qkv(dev: &CudaDevice) -> bool {
    dev.kernels.has(QKV_ENTRY)
}

/// Frame-local attention of one frame read straight from a q/k/v GEMM's output
/// `qkv[frames x tokens][q|k|v][heads][64]`, without splitting it first: for q/k/v that need no
/// norm or rotation (DINO). `indices`, `cum` and `n_pages` are the frame's one-page table (one
/// page, the frame's index, keys `[0, tokens)`); the queries are that frame's rows. The kernel is
/// [`AttentionKernel::WgmmaWs`] with another address calculation (the same tiles and rounding).
/// Launch only: graph-capturable.
#[allow(clippy::too_many_arguments)]
pub fn frame_attention_from_qkv(
    dev: &CudaDevice,
    qkv: DevPtr<bf16>,
    frame: usize,
    out: DevPtr<bf16>,
    indices: DevPtr<u32>,
    cum: DevPtr<u32>,
    n_pages: DevPtr<u32>,
    tokens: usize,
    heads: usize,
) -> Result<(), CudaError> {
    let width = heads * HEAD_DIM;
    let frame_elems = tokens * 3 * width;
    qkv.check_len((frame + 1) * frame_elems, "frame attention q/k/v")?;
    out.check_len(tokens * width, "frame attention out")?;
    if frame_elems as u64 >= 1 << 32 {
        return Err(CudaError::Invalid(format!(
            "a frame of {tokens} tokens x {heads} heads of q/k/v exceeds 2^32 elements"
        )));
    }
    if tokens == 0 {
        return Ok(());
    }
    // K of token 0 of frame 0 (the kernel adds the frame's page and V's offset itself).
    let kv = RawPagedKv {
        pool: qkv.slice(width, qkv.len() - width)?,
        page_size: tokens as u32,
        indices,
        cum,
        n_pages,
    };
    let q = qkv.slice(frame * frame_elems, frame_elems)?;
    let unused = RawWorkspace {
        part_o: DevPtr::null(),
        part_lse: DevPtr::null(),
        tickets: DevPtr::null(),
    };
    let one = KeyViews {
        count: 1,
        stride: 0,
    };
    let kernel = AttentionKernel::WgmmaWs;
    launch_fwd(
        dev,
        kernel,
        QKV_ENTRY,
        log2_query_scale(HEAD_DIM),
        0.0,
        q,
        out,
        &kv,
        one,
        tokens,
        heads,
        LaunchSplits::of(dev, kernel, tokens, heads, one, 1),
        unused,
    )
}

/// One launch of an attention kernel's entry `entry` (the kernel's own, or a variant with its
/// launch shape) over `splits` key splits; `scale_log2` takes `q·k` to the log2 domain and
/// `offset_log2` is the fixed softmax offset of the entries that take one (the others ignore it).
#[allow(clippy::too_many_arguments)]
fn launch_fwd(
    dev: &CudaDevice,
    kernel: AttentionKernel,
    entry: &str,
    scale_log2: f32,
    offset_log2: f32,
    q: DevPtr<bf16>,
    out: DevPtr<bf16>,
    kv: &RawPagedKv,
    views: KeyViews,
    lq: usize,
    heads: usize,
    splits: LaunchSplits,
    ws: RawWorkspace,
) -> Result<(), CudaError> {
    let fwd = dev.kernels.get(entry)?;
    // A lone last tile's extra splits are extra grid columns of n_splits CTAs each, after the
    // full tiles' (the kernel's ws_tile maps them).
    let (n_splits, most_splits) = (splits.each, splits.most);
    let columns = if most_splits > n_splits {
        kernel.split_tiles(lq) + most_splits / n_splits
    } else {
        lq.div_ceil(kernel.block_m())
    };
    fwd.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        kernel.smem_bytes() as i32,
    )?;
    let (lq32, heads32, ns32) = (lq as u32, heads as u32, n_splits as u32);
    let (qa, oa, po, pl) = (q.addr(), out.addr(), ws.part_o.addr(), ws.part_lse.addr());
    let (pool, idx, cum, np) = (
        kv.pool.addr(),
        kv.indices.addr(),
        kv.cum.addr(),
        kv.n_pages.addr(),
    );
    let cfg = LaunchConfig {
        grid_dim: (columns as u32, ns32, heads32 * views.count as u32),
        block_dim: (kernel.threads(), 1, 1),
        shared_mem_bytes: kernel.smem_bytes(),
    };
    let mut b = dev.stream.launch_builder(fwd);
    b.arg(&qa)
        .arg(&oa)
        .arg(&po)
        .arg(&pl)
        .arg(&pool)
        .arg(&kv.page_size)
        .arg(&idx)
        .arg(&cum)
        .arg(&np)
        .arg(&lq32)
        .arg(&heads32)
        .arg(&ns32)
        .arg(&scale_log2);
    // The warp-specialised kernels take the softmax offset, the merge tickets (unread with one
    // split; null where the caller has no workspace) and the stride between the key views'
    // tables last.
    let tk = ws.tickets.addr();
    if kernel.warp_specialised() {
        b.arg(&offset_log2).arg(&tk).arg(&views.stride);
    }
    // SAFETY: arguments match the attention kernels' contract; the callers checked the buffer
    // sizes; the table was validated when uploaded.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bounded_kernel_takes_a_fixed_offset() {
        let plain = log2_query_scale(HEAD_DIM);
        let fixed = Softmax::FixedOffset(6.0);
        let bounded = AttentionKernel::WgmmaWsM256Bounded;
        assert_eq!(bounded.launch_entry(fixed), (bounded.entry(), plain, 6.0));
        // Scaled queries: the scale is 1, and offset 0 has its own entry.
        assert_eq!(
            bounded.launch_entry(Softmax::Log2Queries { offset: 6.0 }),
            (bounded.entry(), 1.0, 6.0)
        );
        assert_eq!(
            bounded.launch_entry(Softmax::Log2Queries { offset: 0.0 }),
            (LOG2_QUERIES_ENTRY, 1.0, 0.0)
        );
        // Without a bound it is the four-consumer kernel with the running maximum.
        assert_eq!(
            bounded.launch_entry(Softmax::RunningMax),
            (AttentionKernel::WgmmaWsM256.entry(), plain, 0.0)
        );
        for &kernel in AttentionKernel::ALL.iter().filter(|&&k| k != bounded) {
            assert_eq!(kernel.launch_entry(fixed), (kernel.entry(), plain, 0.0));
            assert_eq!(
                kernel.launch_entry(Softmax::Log2Queries { offset: 0.0 }),
                (kernel.entry(), 1.0, 0.0)
            );
        }
    }

    #[test]
    fn a_lone_last_tile_takes_splits_of_its_own() {
        let m256 = AttentionKernel::WgmmaWsM256Bounded;
        // 1042 tokens: four full tiles and 18 rows; 1005: the last tile holds 237 rows.
        assert_eq!(m256.split_tiles(1042), 4);
        assert_eq!(m256.split_tiles(1005), 4);
        assert_eq!(m256.split_tiles(1024), 4);
        // 64 rows are still one consumer's; 65 are not.
        assert_eq!(m256.split_tiles(1088), 4);
        assert_eq!(m256.split_tiles(1089), 5);
        // A single tile is never lone (it has no full tile to go after).
        assert_eq!(m256.split_tiles(37), 1);
        // The two-consumer kernels have no lone tile.
        assert_eq!(AttentionKernel::WgmmaWs.split_tiles(1042), 9);
        // One view of 16 heads: eight splits fill 132 SMs with 128 tail CTAs, in whole
        // multiples of the launch's splits; two views (32 tail CTAs a split): four.
        assert_eq!(tail_splits(m256, 1042, 2, 16, 132), 8);
        assert_eq!(tail_splits(m256, 1042, 1, 16, 132), 8);
        assert_eq!(tail_splits(m256, 1042, 3, 16, 132), 6);
        assert_eq!(tail_splits(m256, 1042, 5, 16, 132), 5);
        assert_eq!(tail_splits(m256, 1042, 8, 16, 132), 8);
        assert_eq!(tail_splits(m256, 1042, 1, 32, 132), 4);
        assert_eq!(tail_splits(m256, 1042, 16, 16, 132), 16);
        // Never more than the workspace's eight, never fewer than one.
        assert_eq!(tail_splits(m256, 1042, 1, 2, 132), MAX_TAIL_SPLITS);
        assert_eq!(tail_splits(m256, 1042, 1, 200, 132), 1);
        // No lone tile: the launch's splits.
        assert_eq!(tail_splits(m256, 1005, 2, 16, 132), 2);
        assert_eq!(tail_splits(AttentionKernel::WgmmaWs, 1042, 1, 16, 132), 1);
    }

    #[test]
    fn every_kernel_is_defined_in_a_registered_source() {
        use crate::backend::cuda::registry::SOURCES;
        for &kernel in AttentionKernel::ALL {
            let src = SOURCES
                .iter()
                .find(|s| s.name == kernel.source())
                .unwrap_or_else(|| {
                    panic!("{kernel:?}: `{}` is not in the registry", kernel.source())
                });
            assert!(
                src.entry_points().any(|f| f == kernel.entry()),
                "{kernel:?}: the registry does not load `{}`",
                kernel.entry()
            );
            // The .cu file defines it (by a macro in the warp-specialised file: name and paren).
            assert!(
                src.source.contains(&format!("{}(", kernel.entry()))
                    || src.source.contains(&format!("{},", kernel.entry())),
                "{kernel:?}: kernels/{}.cu does not define `{}`",
                kernel.source(),
                kernel.entry()
            );
            // The wgmma kernels are built for sm_90a alone, the portable one everywhere.
            assert_eq!(src.hopper_only, kernel.warp_specialised(), "{kernel:?}");
        }
    }

    /// The arguments of the `WS_ENTRY` line that defines `entry`:
    /// `(NAME, BN, REGS, LAG, QKV, NC, SM)`.
    fn ws_entry_args(source: &'static str, entry: &str) -> Vec<&'static str> {
        let line = source
            .lines()
            .find(|l| l.starts_with(&format!("WS_ENTRY({entry},")))
            .unwrap_or_else(|| panic!("no WS_ENTRY line for {entry}"));
        let args: Vec<&str> = line
            .trim_start_matches("WS_ENTRY(")
            .trim_end_matches(')')
            .split(',')
            .map(str::trim)
            .collect();
        assert_eq!(args.len(), 7, "{line}");
        args
    }

    /// The launch shape the host assumes is the one each `WS_ENTRY` line compiles: its key
    /// tile (the ring's stages, so the shared memory) and its consumer warpgroups (threads and
    /// query rows); and the softmax each entry the host launches runs.
    #[test]
    fn launch_shapes_match_the_kernel_entries() {
        use crate::backend::cuda::registry::SOURCES;
        for &kernel in AttentionKernel::ALL.iter().filter(|k| k.warp_specialised()) {
            let src = SOURCES.iter().find(|s| s.name == kernel.source()).unwrap();
            let mut entries = vec![(kernel.entry(), Softmax::RunningMax)];
            if kernel == AttentionKernel::WgmmaWsM256Bounded {
                // Its other entry launches with the same shape.
                entries = vec![
                    (kernel.entry(), Softmax::FixedOffset(1.0)),
                    (LOG2_QUERIES_ENTRY, Softmax::Log2Queries { offset: 0.0 }),
                ];
            }
            for (entry, softmax) in entries {
                let args = ws_entry_args(src.source, entry);
                assert_eq!(kernel.launch_entry(softmax).0, entry, "{kernel:?}");
                let mode = match softmax {
                    Softmax::RunningMax => "SM_RUNNING",
                    Softmax::FixedOffset(_) => "SM_FIXED",
                    Softmax::Log2Queries { .. } => "SM_LOG2",
                };
                assert_eq!(args[6], mode, "{entry}: softmax");
                assert_eq!(args[1], kernel.key_tile().to_string(), "{entry}: key tile");
                assert_eq!(
                    args[5],
                    kernel.consumers().to_string(),
                    "{entry}: consumers"
                );
            }
            let stages = match kernel.key_tile() {
                64 => 12,
                128 => 6,
                _ => 4,
            };
            assert_eq!(kernel.ws_stages(), stages, "{kernel:?}: Ws<BN>::STAGES");
            assert!(kernel.smem_bytes() <= 227 * 1024, "{kernel:?}: over 227 KB");
        }
    }

    /// A workspace sized by `RawWorkspace::elems` holds the merge tickets of every kernel at
    /// any query count: no launch can be refused for want of them.
    #[test]
    fn workspaces_hold_every_kernels_tickets() {
        for &kernel in AttentionKernel::ALL {
            assert!(MAX_BLOCK_M.is_multiple_of(kernel.block_m()), "{kernel:?}");
            assert!(kernel.block_m().is_multiple_of(TICKET_ROWS), "{kernel:?}");
            for lq in (1..4100).step_by(7).chain([1005, 2010, 8040]) {
                for heads in [1, 2, 16, 17] {
                    let (_, _, tickets) = RawWorkspace::elems(lq, heads, 2);
                    assert!(
                        RawWorkspace::tickets_used(kernel, lq, heads) <= tickets,
                        "{kernel:?} lq {lq} heads {heads}"
                    );
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for &kernel in AttentionKernel::ALL {
            assert_eq!(AttentionKernel::from_name(kernel.name()), Some(kernel));
        }
        assert_eq!(AttentionKernel::from_name("wgmma"), None);
    }
}
