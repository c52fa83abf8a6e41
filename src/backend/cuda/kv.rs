//! Device K/V storage for the paged cache, driven by the host's page bookkeeping.
//!
//! Per layer one pool `[page][K|V][heads][page_size][64]` bf16 (head-major: one head's slots of a
//! page are contiguous, so an attention tile of one head is one contiguous read), allocated once
//! (sized by the page table's `max_pages`). The page table of the current frame step lives in one small device buffer
//! of u32, shared by all layers and refreshed by exactly one host-to-device copy per step:
//!
//! ```text
//! [ header ][ n_pages ][ indices: max_pages ][ cum: max_pages + 1 ]      view 0
//!           [ n_pages ][ indices: max_pages ][ cum: max_pages + 1 ]      view 1 (two-frame steps)
//!           [ runs: 4 * run_capacity ]
//! ```
//! The views are the same size, so one stride ([`DeviceKvCache::view_stride`]) leads from each
//! of view 0's three parts to view 1's: the attention kernels take both views in one launch.
//! `indices` are the visible pages in attention order, `cum` the prefix sums of their valid
//! lengths (so padded slots are never attended), `runs` the step's writes
//! `{src_token, page, slot, len}`. A one-frame (or scale) step has one view; a two-frame step
//! (`kvcache::PairPlan`) has one per frame. The header holds the sizes and per-frame scalars of
//! the call (see [`DeviceKvCache::header_len`]).

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use half::bf16;

use super::arena::DevPtr;
use super::attention::{
    AttentionOptions, AttentionWorkspace, PagedKv, RawPagedKv, paged_attention,
};
use super::ops::PagedKvDest;
use super::{CudaDevice, CudaError};
use crate::kvcache::{PagePlan, PageTable, PairPlan, StepPlan, TokenRun};

use crate::model::spec::HEAD_DIM;

/// Shape of the device pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub max_pages: usize,
}

impl KvGeometry {
    /// Pools for every page id the table can hand out (its `max_pages`), bf16.
    pub fn for_table(table: &PageTable) -> Self {
        let cfg = table.config();
        Self {
            layers: cfg.layers,
            heads: cfg.heads,
            head_dim: cfg.head_dim,
            page_size: table.page_size(),
            max_pages: table.max_pages(),
        }
    }

    /// Elements of one page (K and V).
    pub fn page_elems(&self) -> usize {
        2 * self.page_size * self.heads * self.head_dim
    }

    /// Elements of one layer's pool.
    pub fn layer_elems(&self) -> usize {
        self.max_pages * self.page_elems()
    }

    fn validate(&self) -> Result<(), CudaError> {
        if self.head_dim != HEAD_DIM {
            return Err(CudaError::Invalid(format!(
                "the CUDA kernels support head_dim {HEAD_DIM}, not {}",
                self.head_dim
            )));
        }
        if self.layers == 0 || self.heads == 0 || self.page_size == 0 || self.max_pages == 0 {
            return Err(CudaError::Invalid(format!("empty KV geometry: {self:?}")));
        }
        // Kernels index slots and tokens with u32 and elements with u64.
        if self.page_size > u32::MAX as usize / 2 || self.max_pages > u32::MAX as usize / 2 {
            return Err(CudaError::Invalid(format!(
                "KV geometry too large: {self:?}"
            )));
        }
        Ok(())
    }
}

/// One step's page table as the host bookkeeping produces it (`kvcache::StepPlan`).
#[derive(Debug, Clone, Copy)]
pub struct PageTableUpload<'a> {
    /// Visible page ids in attention order.
    pub indices: &'a [u32],
    /// Valid tokens of each visible page (padding masked).
    pub page_lens: &'a [u32],
    /// The step's writes: `{src_token, page, slot, len}`.
    pub runs: &'a [[u32; 4]],
}

/// The paged K/V pools of all layers and the device page table.
pub struct DeviceKvCache {
    geometry: KvGeometry,
    pools: Vec<CudaSlice<bf16>>,
    table: CudaSlice<u32>,
    host_table: Vec<u32>,
    /// Reused to flatten a StepPlan's writes without allocating per step.
    run_scratch: Vec<[u32; 4]>,
    run_capacity: usize,
    /// Frames a call may hold: the per-frame scalars of the header.
    call_frames: usize,
    /// Visible pages and keys of each view of the last upload.
    n_pages: [usize; VIEWS],
    kv_len: [u32; VIEWS],
    n_views: usize,
    n_runs: usize,
    /// Per-frame scalars a model step reads on the device, sent with the next upload:
    /// `[kind][frame of the call]` (see [`FrameScalar`]).
    frame_scalars: Vec<u32>,
    /// A CUDA graph captured the table's addresses: it must not be reallocated any more.
    frozen: bool,
}

/// Attention views a step can have: one per frame of a two-frame step.
pub const VIEWS: usize = 2;

/// u32 slots of the header before the per-frame scalars: `[unused, n_runs, unused, unused]`.
/// Kernels read the run count from here (and each view's page count from the view), and the
/// model its per-frame scalars, so one small copy per step carries everything that changes and
/// a captured graph stays valid.
const HEADER_SIZES: usize = 4;

/// The per-frame scalars of the header, each `call_frames` u32 (one per frame of the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameScalar {
    /// The 3D RoPE temporal index of the frame (the frames committed before it).
    RopeFrame = 0,
    /// The camera head's cache length the frame sees (the frames committed before it).
    CameraLen = 1,
}
const FRAME_SCALAR_KINDS: usize = 2;

impl DeviceKvCache {
    /// Allocates the pools (zeroed) and the page table. `run_capacity` bounds the writes of one
    /// step; it grows on demand, but sizing it up front keeps the table buffer fixed (graphs).
    pub fn new(
        dev: &CudaDevice,
        geometry: KvGeometry,
        run_capacity: usize,
    ) -> Result<Self, CudaError> {
        Self::with_call_frames(dev, geometry, run_capacity, 1)
    }

    /// As [`Self::new`], with per-frame scalars for calls of up to `call_frames` frames.
    pub fn with_call_frames(
        dev: &CudaDevice,
        geometry: KvGeometry,
        run_capacity: usize,
        call_frames: usize,
    ) -> Result<Self, CudaError> {
        geometry.validate()?;
        let pools = (0..geometry.layers)
            .map(|_| dev.stream.alloc_zeros::<bf16>(geometry.layer_elems()))
            .collect::<Result<Vec<_>, _>>()?;
        let run_capacity = run_capacity.max(1);
        let call_frames = call_frames.max(1);
        let len = Self::table_len(geometry.max_pages, run_capacity, call_frames);
        Ok(Self {
            geometry,
            pools,
            table: dev.stream.alloc_zeros::<u32>(len)?,
            host_table: vec![0; len],
            run_scratch: Vec::with_capacity(run_capacity),
            run_capacity,
            call_frames,
            n_pages: [0; VIEWS],
            kv_len: [0; VIEWS],
            n_views: 1,
            n_runs: 0,
            frame_scalars: vec![0; FRAME_SCALAR_KINDS * call_frames],
            frozen: false,
        })
    }

    /// u32 slots before the first view: the sizes and the per-frame scalars.
    fn header_len(call_frames: usize) -> usize {
        HEADER_SIZES + FRAME_SCALAR_KINDS * call_frames
    }

    /// u32 slots of one view (n_pages, indices and cum).
    fn view_len(max_pages: usize) -> usize {
        2 * max_pages + 2
    }

    /// u32 slots from one view's table to the next (each of its parts).
    pub fn view_stride(&self) -> u32 {
        Self::view_len(self.geometry.max_pages) as u32
    }

    /// Where view `v` starts.
    fn view_start(&self, v: usize) -> usize {
        Self::header_len(self.call_frames) + v * Self::view_len(self.geometry.max_pages)
    }

    /// Where the runs start.
    fn runs_start(&self) -> usize {
        self.view_start(VIEWS)
    }

    fn table_len(max_pages: usize, run_capacity: usize, call_frames: usize) -> usize {
        Self::header_len(call_frames) + VIEWS * Self::view_len(max_pages) + 4 * run_capacity
    }

    /// Slot of view `v`'s page count.
    fn n_pages_slot(&self, v: usize) -> usize {
        self.view_start(v)
    }

    /// The device u32 holding the number of visible pages (view 0).
    pub fn n_pages_on_device(&self) -> CudaView<'_, u32> {
        let slot = self.n_pages_slot(0);
        self.table.slice(slot..slot + 1)
    }

    /// Scalar `kind` of every frame of a call on the device (`call_frames` u32), as a raw
    /// pointer for the model's kernels.
    pub fn frame_scalars_ptr(&self, kind: FrameScalar) -> Result<DevPtr<u32>, CudaError> {
        DevPtr::of(&self.table).slice(
            HEADER_SIZES + kind as usize * self.call_frames,
            self.call_frames,
        )
    }

    /// Sets the per-frame scalars sent with the next upload: `values[f]` for frame f of the
    /// call (the rest zero).
    pub fn set_frame_scalars(
        &mut self,
        kind: FrameScalar,
        values: &[u32],
    ) -> Result<(), CudaError> {
        if values.len() > self.call_frames {
            return Err(CudaError::Invalid(format!(
                "{} frames' scalars, the table holds {}",
                values.len(),
                self.call_frames
            )));
        }
        let row = &mut self.frame_scalars
            [kind as usize * self.call_frames..(kind as usize + 1) * self.call_frames];
        row.fill(0);
        row[..values.len()].copy_from_slice(values);
        Ok(())
    }

    /// From now on the table keeps its addresses (a CUDA graph holds them): a step that needs more
    /// write runs than allocated is an error instead of a reallocation.
    pub fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Write runs the table holds (the grid size of the K/V write kernel).
    pub fn run_capacity(&self) -> usize {
        self.run_capacity
    }

    pub fn geometry(&self) -> &KvGeometry {
        &self.geometry
    }

    /// Keys visible to this step's attention (view 0).
    pub fn kv_len(&self) -> u32 {
        self.kv_len[0]
    }

    pub fn n_pages(&self) -> usize {
        self.n_pages[0]
    }

    /// Attention views of the last upload (two for a two-frame step).
    pub fn views(&self) -> usize {
        self.n_views
    }

    pub fn pool(&self, layer: usize) -> Result<&CudaSlice<bf16>, CudaError> {
        self.pools
            .get(layer)
            .ok_or_else(|| CudaError::Invalid(format!("layer {layer} out of range")))
    }

    pub fn pool_mut(&mut self, layer: usize) -> Result<&mut CudaSlice<bf16>, CudaError> {
        self.pools
            .get_mut(layer)
            .ok_or_else(|| CudaError::Invalid(format!("layer {layer} out of range")))
    }

    /// Device view of the visible page ids (view 0).
    pub fn indices(&self) -> CudaView<'_, u32> {
        let start = self.view_start(0) + 1;
        self.table.slice(start..start + self.geometry.max_pages)
    }

    /// Device view of the prefix sums of the visible pages' lengths (`n_pages + 1` used; view 0).
    pub fn cum(&self) -> CudaView<'_, u32> {
        let start = self.view_start(0) + 1 + self.geometry.max_pages;
        self.table.slice(start..start + self.geometry.max_pages + 1)
    }

    fn runs(&self) -> CudaView<'_, u32> {
        self.table.slice(self.runs_start()..)
    }

    /// Validates a step's table against the geometry and copies it to the device in one
    /// host-to-device copy.
    pub fn upload(&mut self, dev: &CudaDevice, step: PageTableUpload<'_>) -> Result<(), CudaError> {
        self.upload_views(dev, &[(step.indices, step.page_lens)], step.runs)
    }

    /// As [`Self::upload`] with one attention view `(page ids, page lengths)` per frame of a
    /// two-frame step (or one).
    fn upload_views(
        &mut self,
        dev: &CudaDevice,
        views: &[(&[u32], &[u32])],
        runs: &[[u32; 4]],
    ) -> Result<(), CudaError> {
        let g = self.geometry;
        if views.is_empty() || views.len() > VIEWS {
            return Err(CudaError::Invalid(format!(
                "{} attention views, 1..={VIEWS} allowed",
                views.len()
            )));
        }
        for (indices, page_lens) in views {
            if indices.len() != page_lens.len() {
                return Err(CudaError::Invalid(format!(
                    "{} page ids but {} page lengths",
                    indices.len(),
                    page_lens.len()
                )));
            }
            if indices.len() > g.max_pages {
                return Err(CudaError::Invalid(format!(
                    "{} visible pages exceed the pool's {} pages",
                    indices.len(),
                    g.max_pages
                )));
            }
            if let Some(&p) = indices.iter().find(|&&p| p as usize >= g.max_pages) {
                return Err(CudaError::Invalid(format!(
                    "page id {p} >= max_pages {}",
                    g.max_pages
                )));
            }
            if let Some(&l) = page_lens.iter().find(|&&l| l as usize > g.page_size) {
                return Err(CudaError::Invalid(format!(
                    "page length {l} > page size {}",
                    g.page_size
                )));
            }
        }
        for r in runs {
            let [_, page, slot, len] = *r;
            if page as usize >= g.max_pages || slot as usize + len as usize > g.page_size {
                return Err(CudaError::Invalid(format!(
                    "write run {r:?} outside the pool"
                )));
            }
        }
        if runs.len() > self.run_capacity {
            if self.frozen {
                return Err(CudaError::Invalid(format!(
                    "{} write runs in one step, the captured table holds {}",
                    runs.len(),
                    self.run_capacity
                )));
            }
            self.run_capacity = runs.len().next_power_of_two();
            let len = Self::table_len(g.max_pages, self.run_capacity, self.call_frames);
            self.table = dev.stream.alloc_zeros::<u32>(len)?;
            self.host_table = vec![0; len];
        }

        let m = g.max_pages;
        let mut n_pages = [0; VIEWS];
        let mut kv_len = [0; VIEWS];
        for (v, (indices, page_lens)) in views.iter().enumerate() {
            // Past the view's page count.
            let start = self.view_start(v) + 1;
            let t = &mut self.host_table[start..start + Self::view_len(m) - 1];
            t[..indices.len()].copy_from_slice(indices);
            let mut total: u64 = 0;
            t[m] = 0;
            for (i, &l) in page_lens.iter().enumerate() {
                total += l as u64;
                t[m + 1 + i] = total as u32;
            }
            if total > u32::MAX as u64 {
                return Err(CudaError::Invalid(format!(
                    "{total} visible keys overflow u32"
                )));
            }
            n_pages[v] = indices.len();
            kv_len[v] = total as u32;
        }
        for (v, &n) in n_pages.iter().enumerate() {
            let slot = self.n_pages_slot(v);
            self.host_table[slot] = n as u32;
        }
        self.host_table[1] = runs.len() as u32;
        let scalars = HEADER_SIZES..Self::header_len(self.call_frames);
        self.host_table[scalars].copy_from_slice(&self.frame_scalars);
        let first_run = self.runs_start();
        for (i, r) in runs.iter().enumerate() {
            self.host_table[first_run + 4 * i..first_run + 4 * i + 4].copy_from_slice(r);
        }
        dev.stream.memcpy_htod(&self.host_table, &mut self.table)?;
        self.n_pages = n_pages;
        self.n_runs = runs.len();
        self.kv_len = kv_len;
        self.n_views = views.len();
        Ok(())
    }

    /// Uploads the page table of a `kvcache` frame step (its writes and attention plan).
    pub fn upload_step(&mut self, dev: &CudaDevice, step: &StepPlan) -> Result<(), CudaError> {
        self.upload_planned(dev, &step.writes, &[&step.plan])
    }

    /// Uploads the page table of a two-frame step: both frames' writes, one view per frame.
    pub fn upload_pair(&mut self, dev: &CudaDevice, pair: &PairPlan) -> Result<(), CudaError> {
        self.upload_planned(dev, &pair.writes, &[&pair.views[0], &pair.views[1]])
    }

    fn upload_planned(
        &mut self,
        dev: &CudaDevice,
        writes: &[TokenRun],
        views: &[&PagePlan],
    ) -> Result<(), CudaError> {
        if let Some(plan) = views
            .iter()
            .find(|p| p.page_size as usize != self.geometry.page_size)
        {
            return Err(CudaError::Invalid(format!(
                "plan page size {} but the pools were made for {}",
                plan.page_size, self.geometry.page_size
            )));
        }
        let mut runs = std::mem::take(&mut self.run_scratch);
        runs.clear();
        runs.extend(writes.iter().map(|r| [r.src_token, r.page, r.slot, r.len]));
        let views: Vec<(&[u32], &[u32])> = views
            .iter()
            .map(|p| (p.indices.as_slice(), p.page_lens.as_slice()))
            .collect();
        let result = self.upload_views(dev, &views, &runs);
        self.run_scratch = runs;
        result
    }

    /// Writes this step's K and V (`[tokens][heads][64]` bf16) of `layer` into their pages, per the
    /// runs of the last upload. `tokens` is the number of rows in `k`/`v`.
    pub fn write_layer(
        &self,
        dev: &CudaDevice,
        layer: usize,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
        tokens: usize,
    ) -> Result<(), CudaError> {
        self.write_layer_raw(dev, layer, DevPtr::of(k), DevPtr::of(v), tokens)
    }

    /// The table and pool of `layer` as raw addresses (the GPU model's graph-capturable form).
    pub fn raw_keys(&self, layer: usize) -> Result<RawPagedKv, CudaError> {
        self.raw_keys_view(layer, 0)
    }

    /// As [`Self::raw_keys`] for attention view `view` (frame `view` of a two-frame step).
    pub fn raw_keys_view(&self, layer: usize, view: usize) -> Result<RawPagedKv, CudaError> {
        if view >= VIEWS {
            return Err(CudaError::Invalid(format!(
                "attention view {view}, the table has {VIEWS}"
            )));
        }
        let g = self.geometry;
        let table = DevPtr::of(&self.table);
        let start = self.view_start(view);
        Ok(RawPagedKv {
            pool: DevPtr::of(self.pool(layer)?),
            page_size: g.page_size as u32,
            indices: table.slice(start + 1, g.max_pages)?,
            cum: table.slice(start + 1 + g.max_pages, g.max_pages + 1)?,
            n_pages: table.slice(start, 1)?,
        })
    }

    /// Writes a step's K and V (`[tokens][heads][64]` each, raw addresses) into `layer`'s pages
    /// by the uploaded runs. The grid covers `tokens` and the table's run capacity, and the kernel
    /// reads the run count on the device, so a captured graph fits every step of `tokens` tokens.
    /// Where layer `layer`'s K/V of this step's `tokens` go (the pool and the step's write runs,
    /// as device addresses), for `kv_write_tokens` and `ops::qkv_split_norm_rope_to_pages`; errors
    /// when a run reads past `tokens`.
    pub fn page_writer(&self, layer: usize, tokens: usize) -> Result<PagedKvDest, CudaError> {
        let first_run = self.runs_start();
        let host_runs = &self.host_table[first_run..first_run + 4 * self.n_runs];
        if let Some(r) = host_runs
            .chunks(4)
            .find(|r| r[0] as usize + r[3] as usize > tokens)
        {
            return Err(CudaError::Invalid(format!(
                "write run {r:?} reads past {tokens} tokens"
            )));
        }
        let table = DevPtr::of(&self.table);
        Ok(PagedKvDest {
            pool: DevPtr::of(self.pool(layer)?).addr(),
            runs: table.slice(first_run, 4 * self.run_capacity)?.addr(),
            n_runs: table.slice(1, 1)?.addr(),
            page_size: self.geometry.page_size as u32,
        })
    }

    pub fn write_layer_raw(
        &self,
        dev: &CudaDevice,
        layer: usize,
        k: DevPtr<bf16>,
        v: DevPtr<bf16>,
        tokens: usize,
    ) -> Result<(), CudaError> {
        let g = self.geometry;
        let row = g.heads * g.head_dim;
        k.check_len(tokens * row, "K to write")?;
        v.check_len(tokens * row, "V to write")?;
        let dest = self.page_writer(layer, tokens)?;
        let chunks = (tokens * row / 8).max(1);
        let threads = 256u32;
        let blocks = chunks.div_ceil(threads as usize).clamp(1, 8192) as u32;
        let (page_size, heads) = (g.page_size as u32, g.heads as u32);
        let tokens_u32 = tokens as u32;
        let f = dev.kernels.get("kv_write_tokens")?;
        let (pool, runs, n_runs) = (dest.pool, dest.runs, dest.n_runs);
        let (ka, va) = (k.addr(), v.addr());
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = dev.stream.launch_builder(f);
        b.arg(&ka)
            .arg(&va)
            .arg(&pool)
            .arg(&runs)
            .arg(&n_runs)
            .arg(&tokens_u32)
            .arg(&page_size)
            .arg(&heads);
        // SAFETY: arguments match kv_write_tokens; runs were validated against the pool on upload
        // and against `tokens` above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The dense baseline in graph-capturable form: copies `layer`'s visible keys, in attention
    /// order, into `dense` (`[K|V][heads][capacity][64]`) and writes the one-page table `[1, 0, 0,
    /// kv_len]` into `dense_table`. Returns the keys to attend to.
    pub fn gather_dense_raw(
        &self,
        dev: &CudaDevice,
        layer: usize,
        dense: DevPtr<bf16>,
        capacity: usize,
        dense_table: DevPtr<u32>,
    ) -> Result<RawPagedKv, CudaError> {
        let g = self.geometry;
        let row = g.heads * g.head_dim;
        dense.check_len(2 * capacity * row, "dense K/V buffer")?;
        dense_table.check_len(4, "dense table")?;
        if self.views() > 1 {
            return Err(CudaError::Invalid(
                "the dense baseline attends one view; a two-frame step has two".into(),
            ));
        }
        if self.kv_len[0] as usize > capacity {
            return Err(CudaError::Invalid(format!(
                "{} visible keys exceed the dense buffer's {capacity}",
                self.kv_len[0]
            )));
        }
        let keys = self.raw_keys(layer)?;
        let f = dev.kernels.get("kv_gather_dense")?;
        let chunks_per_page = g.page_size * row / 8;
        let cfg = LaunchConfig {
            grid_dim: (
                chunks_per_page.div_ceil(256).clamp(1, 1024) as u32,
                g.max_pages as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (pool, d, idx, cum, np, tab) = (
            keys.pool.addr(),
            dense.addr(),
            keys.indices.addr(),
            keys.cum.addr(),
            keys.n_pages.addr(),
            dense_table.addr(),
        );
        let (page_size, heads, cap) = (g.page_size as u32, g.heads as u32, capacity as u32);
        let mut b = dev.stream.launch_builder(f);
        b.arg(&pool)
            .arg(&d)
            .arg(&idx)
            .arg(&cum)
            .arg(&np)
            .arg(&page_size)
            .arg(&heads)
            .arg(&cap)
            .arg(&tab);
        // SAFETY: arguments match kv_gather_dense; the buffer holds `capacity` tokens of K
        // and of V (checked) and the kernel skips pages past it.
        unsafe { b.launch(cfg) }?;
        Ok(RawPagedKv {
            pool: dense,
            page_size: capacity as u32,
            indices: dense_table.slice(1, 1)?,
            cum: dense_table.slice(2, 2)?,
            n_pages: dense_table.slice(0, 1)?,
        })
    }

    /// Device bytes of the pools and the table.
    pub fn device_bytes(&self) -> usize {
        self.pools.len() * self.geometry.layer_elems() * 2 + self.table.len() * 4
    }

    pub fn download_runs(&self, dev: &CudaDevice) -> Result<Vec<u32>, CudaError> {
        let all = dev.stream.clone_dtoh(&self.runs())?;
        Ok(all[..4 * self.n_runs].to_vec())
    }

    /// The visible page ids and prefix sums of the last upload, as the device sees them (tests).
    pub fn download_table(&self, dev: &CudaDevice) -> Result<(Vec<u32>, Vec<u32>), CudaError> {
        let idx = dev.stream.clone_dtoh(&self.indices())?;
        let cum = dev.stream.clone_dtoh(&self.cum())?;
        Ok((
            idx[..self.n_pages[0]].to_vec(),
            cum[..self.n_pages[0] + 1].to_vec(),
        ))
    }
}

/// Paged attention over `layer` of a [`DeviceKvCache`] with the page table of its last upload.
#[allow(clippy::too_many_arguments)]
pub fn cache_attention(
    dev: &CudaDevice,
    cache: &DeviceKvCache,
    layer: usize,
    q: &CudaSlice<bf16>,
    out: &mut CudaSlice<bf16>,
    lq: usize,
    opts: AttentionOptions,
    ws: &mut AttentionWorkspace,
) -> Result<usize, CudaError> {
    let g = cache.geometry();
    let kv = PagedKv {
        pool: cache.pool(layer)?.as_view(),
        page_size: g.page_size as u32,
        indices: cache.indices(),
        cum: cache.cum(),
        n_pages: cache.n_pages_on_device(),
        kv_len: cache.kv_len(),
    };
    paged_attention(dev, q, out, &kv, lq, g.heads, opts, ws)
}

/// The dense baseline: at every call the visible keys are concatenated into one contiguous
/// `[K|V][heads][kv_len][64]` buffer (one gather kernel, like `torch.cat` of the per-frame
/// tensors), then attended as a single page.
pub struct DenseBaseline {
    /// `[K|V][heads][capacity][64]`: the contiguous buffer as one page of `capacity` slots.
    buf: CudaSlice<bf16>,
    capacity: usize,
    /// `[n_pages 1][index 0][cum 0, kv_len]`, written by the gather on the device.
    table: CudaSlice<u32>,
    /// Visible keys of the last concatenation (sizes the key splits).
    kv_len: u32,
}

impl DenseBaseline {
    pub fn new(dev: &CudaDevice, max_tokens: usize, heads: usize) -> Result<Self, CudaError> {
        Ok(Self {
            buf: dev
                .stream
                .alloc_zeros::<bf16>((2 * max_tokens * heads * HEAD_DIM).max(1))?,
            capacity: max_tokens,
            table: dev.stream.alloc_zeros::<u32>(4)?,
            kv_len: 0,
        })
    }

    /// Concatenates `layer`'s visible keys into the contiguous buffer (the same gather the GPU
    /// model's dense layout runs inside its graph).
    pub fn concat(
        &mut self,
        dev: &CudaDevice,
        cache: &DeviceKvCache,
        layer: usize,
    ) -> Result<(), CudaError> {
        cache.gather_dense_raw(
            dev,
            layer,
            DevPtr::of(&self.buf),
            self.capacity,
            DevPtr::of(&self.table),
        )?;
        self.kv_len = cache.kv_len();
        Ok(())
    }

    /// Attention over the concatenated buffer (call [`Self::concat`] first).
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        dev: &CudaDevice,
        heads: usize,
        q: &CudaSlice<bf16>,
        out: &mut CudaSlice<bf16>,
        lq: usize,
        opts: AttentionOptions,
        ws: &mut AttentionWorkspace,
    ) -> Result<usize, CudaError> {
        let kv = PagedKv {
            pool: self.buf.as_view(),
            page_size: self.capacity as u32,
            indices: self.table.slice(1..2),
            cum: self.table.slice(2..4),
            n_pages: self.table.slice(0..1),
            kv_len: self.kv_len,
        };
        paged_attention(dev, q, out, &kv, lq, heads, opts, ws)
    }
}
