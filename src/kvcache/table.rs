//! Page bookkeeping: which page holds what, decided once per frame step for every layer.
//!
//! Pure Rust and backend-free. The CPU store and the CUDA pools both follow the `StepPlan` it
//! produces, so all layers hold the same page ids by construction.

use std::collections::VecDeque;
use std::ops::Range;

use super::{
    CacheConfig, CacheError, CacheEvent, CacheStats, PagePlan, PageState, PatchStream,
    SpecialPoolFull, StepPlan, TokenRun,
};

/// Whether a step's frames stay in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Scale frames (phase 1) and keyframes: appended, then the window is trimmed.
    Keyframe,
    /// Appended, attended, then rolled back at `end_step`: nothing of it stays.
    NonKeyframe,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ResidentFrame {
    frame: u64,
    pages: Vec<u32>,
}

/// The bookkeeping that a rollback restores. Small: a few hundred page ids at most.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Residency {
    /// Free page ids of either stream, popped from the back. One id space keeps host storage
    /// as small as the most pages in use at once.
    free: Vec<u32>,
    /// Page ids created so far (`0..allocated`); a new id is made when `free` is empty.
    allocated: usize,
    scale: VecDeque<ResidentFrame>,
    window: VecDeque<ResidentFrame>,
    /// Special pages in write order; the front is the oldest trajectory memory.
    special_pages: VecDeque<u32>,
    /// Special tokens ever written, including dropped ones.
    special_tokens: u64,
    /// Special tokens forgotten by the drop-oldest policy (whole pages, from the front).
    special_dropped: u64,
    committed: u64,
    last_committed_frame: Option<u64>,
    frames_evicted: u64,
}

/// The table between two steps (`PageTable::snapshot`): only the table it came from can go
/// back to it.
#[derive(Debug, Clone)]
pub struct TableSnapshot {
    /// Boxed, like the step: a snapshot travels inside the engine's call plans, which stay small.
    state: Box<Residency>,
    special_owner_len: usize,
    /// The last step's plan and events, which `step` and `events` go on reporting.
    step: Box<StepPlan>,
    events: Vec<CacheEvent>,
}

#[derive(Debug)]
struct PendingStep {
    kind: StepKind,
    frames: Range<u64>,
    before: Residency,
    special_owner_len: usize,
    /// Pages freed and reused inside the step: their old contents are gone.
    reused_freed_page: bool,
}

/// The paged cache's bookkeeping: two streams (patch pages, special pages) in one page id space.
#[derive(Debug)]
pub struct PageTable {
    cfg: CacheConfig,
    page_size: usize,
    patch_pool: usize,
    special_cap: usize,
    special_reserve: usize,
    state: Residency,
    /// Frame of each group of special tokens, in stream order (for exporting the cache).
    special_owner: Vec<u64>,
    /// Most page ids ever created: what host storage must hold.
    high_water: usize,
    pending: Option<PendingStep>,
    freed_in_step: Vec<u32>,
    reused_in_step: bool,
    step: StepPlan,
    events: Vec<CacheEvent>,
}

impl PageTable {
    pub fn new(cfg: CacheConfig) -> Result<Self, CacheError> {
        cfg.validate()?;
        let page_size = cfg.resolved_page_size();
        let patch_pool = cfg.patch_pool_pages();
        let special_cap = cfg.special_cap_pages();
        let special_reserve = cfg.special_reserve_pages();
        let state = Self::empty_residency();
        Ok(Self {
            cfg,
            page_size,
            patch_pool,
            special_cap,
            special_reserve,
            state,
            special_owner: Vec::new(),
            high_water: 0,
            pending: None,
            freed_in_step: Vec::new(),
            reused_in_step: false,
            step: StepPlan::default(),
            events: Vec::new(),
        })
    }

    fn empty_residency() -> Residency {
        Residency {
            free: Vec::new(),
            allocated: 0,
            scale: VecDeque::new(),
            window: VecDeque::new(),
            special_pages: VecDeque::new(),
            special_tokens: 0,
            special_dropped: 0,
            committed: 0,
            last_committed_frame: None,
            frames_evicted: 0,
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Every page id is below this (the size of a statically planned pool).
    pub fn max_pages(&self) -> usize {
        self.patch_pool + self.special_cap + self.special_reserve
    }

    /// Page ids ever handed out are below this: what host storage must hold so far.
    pub fn high_water_pages(&self) -> usize {
        self.high_water
    }

    /// Frames committed so far (scale frames and keyframes). The 3D RoPE temporal index of the
    /// next frame.
    pub fn committed_frames(&self) -> u64 {
        self.state.committed
    }

    pub fn step_in_progress(&self) -> bool {
        self.pending.is_some()
    }

    /// The plan of the current (or last) step.
    pub fn step(&self) -> &StepPlan {
        &self.step
    }

    /// Events since the last `begin_step` (including those of `end_step`, `abort_step`, `reset`).
    pub fn events(&self) -> &[CacheEvent] {
        &self.events
    }

    /// Appends `frames` and decides the step's writes and attention plan.
    ///
    /// Keyframe steps append each frame and then trim the window (as the reference does, frame
    /// by frame); a non-keyframe appends one frame and evicts nothing. On error the table is left
    /// exactly as it was.
    pub fn begin_step(
        &mut self,
        frames: Range<u64>,
        kind: StepKind,
    ) -> Result<&StepPlan, CacheError> {
        if let Some(p) = &self.pending {
            return Err(CacheError::StepInProgress(p.frames.start, p.frames.end));
        }
        let count = frames.end.saturating_sub(frames.start);
        if count == 0 {
            return Err(CacheError::EmptyStep);
        }
        if kind == StepKind::NonKeyframe && count != 1 {
            return Err(CacheError::NonKeyframeStep(count as usize));
        }
        if let Some(last) = self.state.last_committed_frame
            && frames.start <= last
        {
            return Err(CacheError::FrameOrder {
                frame: frames.start,
                last,
            });
        }
        let before = self.state.clone();
        let special_owner_len = self.special_owner.len();
        self.events.clear();
        self.freed_in_step.clear();
        self.step = StepPlan {
            first_frame: frames.start,
            frames: count,
            keyframe: kind == StepKind::Keyframe,
            ..StepPlan::default()
        };
        self.reused_in_step = false;
        let appended = self.append_all(frames.clone(), kind);
        if let Err(err) = appended {
            self.state = before;
            self.special_owner.truncate(special_owner_len);
            self.events.clear();
            self.step = StepPlan::default();
            return Err(err);
        }
        self.build_plan();
        self.pending = Some(PendingStep {
            kind,
            frames,
            before,
            special_owner_len,
            reused_freed_page: self.reused_in_step,
        });
        Ok(&self.step)
    }

    fn append_all(&mut self, frames: Range<u64>, kind: StepKind) -> Result<(), CacheError> {
        let count = (frames.end - frames.start) as usize;
        let transient = kind == StepKind::NonKeyframe;
        for (index, frame) in frames.enumerate() {
            self.append_frame(index, frame, count, transient)?;
            if !transient {
                self.evict_beyond_window();
            }
        }
        Ok(())
    }

    fn append_frame(
        &mut self,
        index_in_step: usize,
        frame: u64,
        frames_in_step: usize,
        transient: bool,
    ) -> Result<(), CacheError> {
        let tokens_per_frame = self.cfg.tokens_per_frame();
        let base = index_in_step * tokens_per_frame;
        self.append_specials(base as u32, transient)?;
        self.special_owner.push(frame);

        let per_frame = self.cfg.pages_per_frame();
        let patch_pages_in_use = (self.state.scale.len() + self.state.window.len()) * per_frame;
        if patch_pages_in_use + per_frame > self.patch_pool {
            return Err(CacheError::PatchPoolExhausted {
                frame,
                frames: frames_in_step,
                pool: self.patch_pool,
            });
        }
        let mut pages = Vec::with_capacity(per_frame);
        for j in 0..per_frame {
            let page = self.take_page();
            let slot_start = j * self.page_size;
            let len = self.page_size.min(self.cfg.patches_per_frame - slot_start);
            self.step.writes.push(TokenRun {
                src_token: (base + self.cfg.special_tokens + slot_start) as u32,
                page,
                slot: 0,
                len: len as u32,
            });
            pages.push(page);
        }
        let stream = if self.state.scale.len() < self.cfg.scale_frames {
            PatchStream::Scale
        } else {
            PatchStream::Window
        };
        self.events.push(CacheEvent::FrameAppended {
            frame,
            stream,
            pages: pages.clone(),
            transient,
        });
        let resident = ResidentFrame { frame, pages };
        match stream {
            PatchStream::Scale => self.state.scale.push_back(resident),
            PatchStream::Window => self.state.window.push_back(resident),
        }
        if !transient {
            self.state.committed += 1;
            self.state.last_committed_frame = Some(frame);
        }
        Ok(())
    }

    fn append_specials(&mut self, mut src_token: u32, transient: bool) -> Result<(), CacheError> {
        let mut remaining = self.cfg.special_tokens;
        while remaining > 0 {
            let offset = (self.state.special_tokens % self.page_size as u64) as usize;
            if offset == 0 {
                self.open_special_page(transient)?;
            }
            let Some(&tail) = self.state.special_pages.back() else {
                unreachable!("a special page was opened above")
            };
            let len = remaining.min(self.page_size - offset);
            self.step.writes.push(TokenRun {
                src_token,
                page: tail,
                slot: offset as u32,
                len: len as u32,
            });
            self.state.special_tokens += len as u64;
            src_token += len as u32;
            remaining -= len;
        }
        Ok(())
    }

    fn open_special_page(&mut self, transient: bool) -> Result<(), CacheError> {
        let live = self.state.special_pages.len();
        let limit = if transient {
            self.special_cap + self.special_reserve
        } else {
            self.special_cap
        };
        let page = if live >= limit {
            let can_drop =
                !transient && self.cfg.special_pool.on_full == SpecialPoolFull::DropOldest;
            match self.state.special_pages.pop_front() {
                Some(oldest) if can_drop => {
                    // Only full pages precede a page being opened, so a whole page is forgotten.
                    self.state.special_dropped += self.page_size as u64;
                    self.events.push(CacheEvent::SpecialPageDropped {
                        page: oldest,
                        tokens: self.page_size as u32,
                    });
                    // Its old contents are overwritten by this step: no rollback past it.
                    self.reused_in_step = true;
                    oldest
                }
                popped => {
                    if let Some(page) = popped {
                        self.state.special_pages.push_front(page);
                    }
                    return Err(CacheError::SpecialPoolFull {
                        cap_frames: self.cfg.special_pool.max_frames,
                        cap_pages: self.special_cap,
                    });
                }
            }
        } else {
            self.take_page()
        };
        self.state.special_pages.push_back(page);
        self.events.push(CacheEvent::SpecialPageOpened { page });
        Ok(())
    }

    /// A free page id, or a new one. The callers' counting keeps ids below `max_pages`.
    fn take_page(&mut self) -> u32 {
        let page = match self.state.free.pop() {
            Some(page) => page,
            None => {
                let page = self.state.allocated as u32;
                self.state.allocated += 1;
                if self.state.allocated > self.high_water {
                    self.high_water = self.state.allocated;
                    self.events.push(CacheEvent::PoolGrown {
                        allocated_pages: self.high_water,
                        max_pages: self.max_pages(),
                    });
                }
                page
            }
        };
        if self.freed_in_step.contains(&page) {
            self.reused_in_step = true;
        }
        page
    }

    fn evict_beyond_window(&mut self) {
        while self.state.window.len() > self.cfg.sliding_window {
            let Some(oldest) = self.state.window.pop_front() else {
                break;
            };
            // A frame of this very step evicted before attention: its patch writes must not
            // land in pages that may be handed out again.
            // (The page is freed only now, so every run to it so far was this frame's.)
            self.step
                .writes
                .retain(|run| !oldest.pages.contains(&run.page));
            self.state.free.extend(oldest.pages.iter().copied());
            self.freed_in_step.extend(oldest.pages.iter().copied());
            self.state.frames_evicted += 1;
            self.step.evicted_frames.push(oldest.frame);
            self.events.push(CacheEvent::FrameEvicted {
                frame: oldest.frame,
                pages: oldest.pages,
            });
        }
    }

    fn live_special_tokens(&self) -> u64 {
        self.state.special_tokens - self.state.special_dropped
    }

    fn build_plan(&mut self) {
        let mut plan = PagePlan {
            page_size: self.page_size as u32,
            ..PagePlan::default()
        };
        let mut visible_frames = Vec::new();
        for resident in self.state.scale.iter().chain(self.state.window.iter()) {
            visible_frames.push(resident.frame);
            for (j, &page) in resident.pages.iter().enumerate() {
                let len = self
                    .page_size
                    .min(self.cfg.patches_per_frame - j * self.page_size);
                plan.indices.push(page);
                plan.page_lens.push(len as u32);
            }
        }
        let live = self.live_special_tokens();
        for (k, &page) in self.state.special_pages.iter().enumerate() {
            let start = k as u64 * self.page_size as u64;
            let len = (live - start).min(self.page_size as u64);
            plan.indices.push(page);
            plan.page_lens.push(len as u32);
        }
        plan.indptr = vec![0, plan.indices.len() as u32];
        plan.last_page_len = plan.page_lens.last().copied().unwrap_or(0);
        self.step.plan = plan;
        self.step.visible_frames = visible_frames;
        self.step.special_tokens_visible = live;
    }

    /// Ends the step: a keyframe step stays; a non-keyframe is rolled back so nothing of it
    /// stays (the page lists, free lists and special tail are restored exactly).
    pub fn end_step(&mut self) -> Result<(), CacheError> {
        let Some(pending) = self.pending.take() else {
            return Err(CacheError::NoStep("end_step"));
        };
        if pending.kind == StepKind::NonKeyframe {
            self.restore(pending);
        }
        Ok(())
    }

    /// Undoes the step in progress, keyframe or not. Refused when the step reused a page it had
    /// freed (a multi-frame step that evicted one of its own pages, or a dropped special page),
    /// because that page's old contents are gone.
    pub fn abort_step(&mut self) -> Result<(), CacheError> {
        match &self.pending {
            None => Err(CacheError::NoStep("abort_step")),
            Some(p) if p.reused_freed_page => Err(CacheError::CannotRollback),
            Some(_) => {
                if let Some(pending) = self.pending.take() {
                    self.restore(pending);
                }
                Ok(())
            }
        }
    }

    fn restore(&mut self, pending: PendingStep) {
        self.state = pending.before;
        self.special_owner.truncate(pending.special_owner_len);
        self.events.push(CacheEvent::RolledBack {
            frames: pending.frames.collect(),
        });
    }

    /// The bookkeeping as it is between steps, to go back to when a group of steps planned
    /// together cannot run together (`pair`). None while a step is in progress.
    pub fn snapshot(&self) -> Option<TableSnapshot> {
        if self.pending.is_some() {
            return None;
        }
        Some(TableSnapshot {
            state: Box::new(self.state.clone()),
            special_owner_len: self.special_owner.len(),
            step: Box::new(self.step.clone()),
            events: self.events.clone(),
        })
    }

    /// Goes back to `snapshot` (taken from this table, with only whole steps since): the steps
    /// planned after it are forgotten, and `step` and `events` report the last step before it
    /// again. Their page ids stay allocated (host storage only grows).
    pub fn restore_snapshot(&mut self, snapshot: TableSnapshot) {
        self.state = *snapshot.state;
        self.special_owner.truncate(snapshot.special_owner_len);
        self.pending = None;
        self.freed_in_step.clear();
        self.step = *snapshot.step;
        self.events = snapshot.events;
    }

    /// Forgets everything: all pages free, counters zero. Storage is kept for reuse.
    pub fn reset(&mut self) {
        self.state = Self::empty_residency();
        self.special_owner.clear();
        self.pending = None;
        self.freed_in_step.clear();
        self.step = StepPlan::default();
        self.events.clear();
        self.events.push(CacheEvent::Reset);
    }

    /// Resident frames with their patch pages, scale frames first, then the window oldest first.
    pub fn resident_frames(&self) -> impl Iterator<Item = (u64, PatchStream, &[u32])> {
        let scale = self
            .state
            .scale
            .iter()
            .map(|r| (r.frame, PatchStream::Scale, r.pages.as_slice()));
        let window = self
            .state
            .window
            .iter()
            .map(|r| (r.frame, PatchStream::Window, r.pages.as_slice()));
        scale.chain(window)
    }

    /// Where the special tokens of frame group `g` (in stream order) live: `(page, slot)` of its
    /// first token, or `None` once dropped. Tokens of a group may continue on the next page.
    pub fn special_token_location(&self, token: u64) -> Option<(u32, usize)> {
        let live_start = self.state.special_dropped;
        if token < live_start || token >= self.state.special_tokens {
            return None;
        }
        let rel = token - live_start;
        let page_index = (rel / self.page_size as u64) as usize;
        let page = *self.state.special_pages.get(page_index)?;
        Some((page, (rel % self.page_size as u64) as usize))
    }

    /// Frame of each special-token group in stream order (index `g` owns tokens `[6g, 6g+6)`).
    pub fn special_owners(&self) -> &[u64] {
        &self.special_owner
    }

    pub fn stats(&self) -> CacheStats {
        let per_frame = self.cfg.pages_per_frame();
        let scale_pages = self.state.scale.len() * per_frame;
        let window_pages = self.state.window.len() * per_frame;
        let special_pages = self.state.special_pages.len();
        let allocated_pages = self.state.allocated;
        let page_bytes = self.cfg.page_bytes_all_layers();
        let used = scale_pages + window_pages + special_pages;
        CacheStats {
            page_size: self.page_size,
            scale_pages,
            window_pages,
            special_pages,
            free_pages: allocated_pages - used,
            allocated_pages,
            max_pages: self.max_pages(),
            bytes_allocated: allocated_pages as u64 * page_bytes,
            bytes_resident: used as u64 * page_bytes,
            tokens_visible: (scale_pages + window_pages) as u64 / per_frame as u64
                * self.cfg.patches_per_frame as u64
                + self.live_special_tokens(),
            frames_committed: self.state.committed,
            live_frames: self.state.scale.len() + self.state.window.len(),
            special_tokens: self.live_special_tokens(),
            special_tokens_dropped: self.state.special_dropped,
            frames_evicted: self.state.frames_evicted,
        }
    }

    /// The state of every allocated page id, for the page map panel.
    pub fn page_map(&self) -> Vec<PageState> {
        let mut map = vec![PageState::Free; self.state.allocated];
        let transient = self
            .pending
            .as_ref()
            .filter(|p| p.kind == StepKind::NonKeyframe)
            .map(|p| p.frames.start);
        for (frame, stream, pages) in self.resident_frames() {
            for &page in pages {
                map[page as usize] = match (stream, transient) {
                    (_, Some(t)) if t == frame => PageState::Transient { frame },
                    (PatchStream::Scale, _) => PageState::Scale { frame },
                    (PatchStream::Window, _) => PageState::Window { frame },
                };
            }
        }
        let live = self.live_special_tokens();
        for (k, &page) in self.state.special_pages.iter().enumerate() {
            let start = k as u64 * self.page_size as u64;
            let tokens = (live - start).min(self.page_size as u64) as u32;
            map[page as usize] = PageState::Special { tokens };
        }
        map
    }
}
