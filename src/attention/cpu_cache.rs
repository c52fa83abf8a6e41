//! `CpuKvCache`: the page table plus host storage in the paged or the dense layout.

use std::ops::Range;

use crate::kvcache::{
    CacheConfig, CacheError, CacheEvent, CacheStats, HostKvStore, PageTable, StepKind, StepPlan,
};

use super::{AttentionShape, DenseKvStore, PagedLayer, dense_attention, paged_attention};

/// How K/V are kept between frame steps.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum AttentionLayout {
    /// Pages written once, read in place through the step's page plan.
    Paged,
    /// Per-frame K/V concatenated at every call (the reference's SDPA path).
    Dense,
}

impl std::str::FromStr for AttentionLayout {
    type Err = CacheError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "paged" => Ok(AttentionLayout::Paged),
            "dense" => Ok(AttentionLayout::Dense),
            _ => Err(CacheError::InvalidConfig {
                field: "attention",
                value: s.to_string(),
                expected: "paged or dense",
            }),
        }
    }
}

impl std::fmt::Display for AttentionLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttentionLayout::Paged => "paged",
            AttentionLayout::Dense => "dense",
        })
    }
}

/// One layer's cache as the reference lays it out, for comparing against fixtures.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerKvState {
    /// Frames held in full (scale frames, then the window oldest first).
    pub live_frames: Vec<u64>,
    /// `[F][P][heads][head_dim]`, each frame's special tokens first.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Frames whose special tokens alone remain, oldest first.
    pub evicted_frames: Vec<u64>,
    /// `[E][special][heads][head_dim]`.
    pub special_k: Vec<f32>,
    pub special_v: Vec<f32>,
}

enum Storage {
    Paged(HostKvStore),
    Dense(DenseKvStore),
}

/// The KV cache of every global-attention layer on the CPU.
///
/// Per frame step: `begin_step` once, then for each layer `write_layer` and `attend_layer`,
/// then `end_step` (which rolls a non-keyframe back).
pub struct CpuKvCache {
    table: PageTable,
    storage: Storage,
    shape: AttentionShape,
    written: Vec<bool>,
    step_frames: Option<Range<u64>>,
}

impl CpuKvCache {
    pub fn new(cfg: CacheConfig, layout: AttentionLayout) -> Result<Self, CacheError> {
        let table = PageTable::new(cfg.clone())?;
        let storage = match layout {
            AttentionLayout::Paged => Storage::Paged(HostKvStore::new(&cfg)),
            AttentionLayout::Dense => Storage::Dense(DenseKvStore::new(&cfg)),
        };
        Ok(Self {
            table,
            storage,
            shape: AttentionShape {
                heads: cfg.heads,
                head_dim: cfg.head_dim,
            },
            written: vec![false; cfg.layers],
            step_frames: None,
        })
    }

    pub fn layout(&self) -> AttentionLayout {
        match self.storage {
            Storage::Paged(_) => AttentionLayout::Paged,
            Storage::Dense(_) => AttentionLayout::Dense,
        }
    }

    pub fn config(&self) -> &CacheConfig {
        self.table.config()
    }

    pub fn table(&self) -> &PageTable {
        &self.table
    }

    /// Appends the step's frames to the bookkeeping (and evicts, for keyframes).
    pub fn begin_step(
        &mut self,
        frames: Range<u64>,
        kind: StepKind,
    ) -> Result<&StepPlan, CacheError> {
        self.table.begin_step(frames.clone(), kind)?;
        if let Storage::Paged(store) = &mut self.storage {
            store.ensure_pages(self.table.high_water_pages());
        }
        self.written.fill(false);
        self.step_frames = Some(frames);
        Ok(self.table.step())
    }

    fn layer_index(&self, layer: usize) -> Result<usize, CacheError> {
        if layer < self.written.len() {
            Ok(layer)
        } else {
            Err(CacheError::LayerOutOfRange {
                layer,
                layers: self.written.len(),
            })
        }
    }

    /// Stores one layer's K and V of the step: `[S·P][heads][head_dim]`, frame-major, each
    /// frame's special tokens first. Post-qk-norm, post-RoPE.
    pub fn write_layer(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), CacheError> {
        let layer = self.layer_index(layer)?;
        let Some(frames) = self.step_frames.clone() else {
            return Err(CacheError::NoStep("write_layer"));
        };
        let cfg = self.table.config();
        let expected = (frames.end - frames.start) as usize
            * cfg.tokens_per_frame()
            * cfg.heads
            * cfg.head_dim;
        for (what, len) in [("K of the step", k.len()), ("V of the step", v.len())] {
            if len != expected {
                return Err(CacheError::WrongSize {
                    what,
                    expected,
                    found: len,
                });
            }
        }
        let step = self.table.step();
        match &mut self.storage {
            Storage::Paged(store) => store.write_runs(layer, &step.writes, k, v)?,
            Storage::Dense(store) => {
                if self.written[layer] {
                    // Writing twice would append the frames twice; start the layer over.
                    return Err(CacheError::InvalidConfig {
                        field: "write_layer",
                        value: format!("layer {layer} written twice in one step"),
                        expected: "one write per layer per step",
                    });
                }
                store.write_step(layer, frames, &step.evicted_frames, k, v)?
            }
        }
        self.written[layer] = true;
        Ok(())
    }

    /// Attention of `q` (`[tokens][heads][head_dim]`) over everything the step makes visible.
    pub fn attend_layer(&self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<(), CacheError> {
        let layer = self.layer_index(layer)?;
        if self.step_frames.is_none() {
            return Err(CacheError::NoStep("attend_layer"));
        }
        if !self.written[layer] {
            return Err(CacheError::LayerNotWritten { layer });
        }
        match &self.storage {
            Storage::Paged(store) => {
                let view = PagedLayer {
                    data: store.layer(layer)?,
                    page_elems: self.table.config().page_elems(),
                };
                paged_attention(self.shape, q, view, &self.table.step().plan, out)
            }
            Storage::Dense(store) => {
                let (k, v) = store.concatenated(layer)?;
                dense_attention(self.shape, q, &k, &v, out)
            }
        }
    }

    /// Ends the step; a non-keyframe is rolled back and nothing of it stays.
    pub fn end_step(&mut self) -> Result<(), CacheError> {
        let keyframe = self.table.step().keyframe;
        self.table.end_step()?;
        if let Storage::Dense(store) = &mut self.storage {
            if keyframe {
                store.commit_step();
            } else {
                store.undo_step();
            }
        }
        self.step_frames = None;
        Ok(())
    }

    /// Undoes the step in progress, keyframe or not (see `PageTable::abort_step`).
    pub fn abort_step(&mut self) -> Result<(), CacheError> {
        self.table.abort_step()?;
        if let Storage::Dense(store) = &mut self.storage {
            store.undo_step();
        }
        self.step_frames = None;
        Ok(())
    }

    pub fn reset(&mut self) {
        self.table.reset();
        if let Storage::Dense(store) = &mut self.storage {
            store.reset();
        }
        self.step_frames = None;
        self.written.fill(false);
    }

    /// Frames committed so far: the 3D RoPE temporal index of the next frame.
    pub fn committed_frames(&self) -> u64 {
        self.table.committed_frames()
    }

    pub fn stats(&self) -> CacheStats {
        let mut stats = self.table.stats();
        if let Storage::Dense(store) = &self.storage {
            // The dense layout holds exactly what is resident, in per-frame buffers.
            stats.bytes_allocated = dense_bytes(store, self.table.config());
            stats.bytes_resident = stats.bytes_allocated;
        }
        stats
    }

    pub fn events(&self) -> &[CacheEvent] {
        self.table.events()
    }

    /// One layer's cache in the reference's layout (live frames in full, evicted frames'
    /// special tokens), as f32.
    pub fn layer_state(&self, layer: usize) -> Result<LayerKvState, CacheError> {
        let layer = self.layer_index(layer)?;
        match &self.storage {
            Storage::Dense(store) => Ok(dense_state(store, layer)?),
            Storage::Paged(store) => paged_state(&self.table, store, layer),
        }
    }
}

fn dense_bytes(store: &DenseKvStore, cfg: &CacheConfig) -> u64 {
    (0..cfg.layers)
        .filter_map(|l| store.layer(l).ok())
        .map(|layer| {
            let elems = layer.special_k.len() * 2
                + layer.frames.iter().map(|f| f.k.len() * 2).sum::<usize>();
            (elems * cfg.dtype.bytes()) as u64
        })
        .sum()
}

fn dense_state(store: &DenseKvStore, layer: usize) -> Result<LayerKvState, CacheError> {
    let entry = store.layer(layer)?;
    let mut state = LayerKvState {
        live_frames: entry.frames.iter().map(|f| f.frame).collect(),
        k: Vec::new(),
        v: Vec::new(),
        evicted_frames: entry.special_frames.clone(),
        special_k: vec![0.0; entry.special_k.len()],
        special_v: vec![0.0; entry.special_v.len()],
    };
    for frame in &entry.frames {
        let start = state.k.len();
        state.k.resize(start + frame.k.len(), 0.0);
        state.v.resize(start + frame.v.len(), 0.0);
        frame.k.read(0, &mut state.k[start..]);
        frame.v.read(0, &mut state.v[start..]);
    }
    entry.special_k.read(0, &mut state.special_k);
    entry.special_v.read(0, &mut state.special_v);
    Ok(state)
}

fn paged_state(
    table: &PageTable,
    store: &HostKvStore,
    layer: usize,
) -> Result<LayerKvState, CacheError> {
    let cfg = table.config();
    let te = cfg.heads * cfg.head_dim;
    let specials = cfg.special_tokens;
    let page_size = table.page_size();
    let data = store.layer(layer)?;
    let owners = table.special_owners();
    let read_special_group = |group: usize, k: &mut Vec<f32>, v: &mut Vec<f32>| -> bool {
        let mut token_k = vec![0f32; te];
        let mut token_v = vec![0f32; te];
        for j in 0..specials {
            let Some((page, slot)) = table.special_token_location((group * specials + j) as u64)
            else {
                return false;
            };
            data.read(store.offset(page, 0, slot), &mut token_k);
            data.read(store.offset(page, 1, slot), &mut token_v);
            k.extend_from_slice(&token_k);
            v.extend_from_slice(&token_v);
        }
        true
    };
    let mut state = LayerKvState {
        live_frames: Vec::new(),
        k: Vec::new(),
        v: Vec::new(),
        evicted_frames: Vec::new(),
        special_k: Vec::new(),
        special_v: Vec::new(),
    };
    let mut token = vec![0f32; te];
    for (frame, _, pages) in table.resident_frames() {
        let Some(group) = owners.iter().rposition(|&f| f == frame) else {
            continue;
        };
        state.live_frames.push(frame);
        if !read_special_group(group, &mut state.k, &mut state.v) {
            // Dropped trajectory memory: show zeros rather than inventing values.
            state.k.resize(state.k.len() + specials * te, 0.0);
            state.v.resize(state.v.len() + specials * te, 0.0);
        }
        for p in 0..cfg.patches_per_frame {
            let page = pages[p / page_size];
            let slot = p % page_size;
            data.read(store.offset(page, 0, slot), &mut token);
            state.k.extend_from_slice(&token);
            data.read(store.offset(page, 1, slot), &mut token);
            state.v.extend_from_slice(&token);
        }
    }
    for (group, &frame) in owners.iter().enumerate() {
        if state.live_frames.contains(&frame) {
            continue;
        }
        let (mut k, mut v) = (Vec::new(), Vec::new());
        if read_special_group(group, &mut k, &mut v) {
            state.evicted_frames.push(frame);
            state.special_k.extend_from_slice(&k);
            state.special_v.extend_from_slice(&v);
        }
    }
    Ok(state)
}
