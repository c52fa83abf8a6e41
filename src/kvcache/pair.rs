//! Two streaming frames in one step, each seeing exactly what it sees when streamed alone.
//!
//! A step of two frames doubles the rows of every product of the model (measured on the H200:
//! the GEMMs of 2004 rows take 1.61x the time of 1005), but the global attention must stay that
//! of two one-frame steps: frame t sees the cache after its own step, frame t + 1 the cache after
//! its own. Both are planned here one after the other on the table, exactly as two one-frame
//! steps, and then checked to be able to share the device's pools for one step: frame t + 1
//! writes no slot frame t reads, and no slot is written twice.
//!
//! That holds by construction when frame t is a keyframe: frame t + 1 writes only pages that were
//! free after frame t (its eviction included, which frame t no longer sees) and special slots past
//! frame t's. A non-keyframe t is rolled back before t + 1 is planned, so t + 1 would take its
//! page and special slots: its tokens go to scratch pages past the table's `max_pages` instead
//! (`pair_scratch_pages` of them), and its view reads them there. Whatever still overlaps (a
//! dropped special page, a cache error in either step) is no pair: `plan_pair` returns `None`
//! with the table untouched, and the caller runs the two frames one step each.

use std::collections::HashMap;

use super::{CacheError, CacheEvent, PagePlan, PageTable, StepKind, StepPlan, TokenRun};

/// The plan of a two-frame step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairPlan {
    pub frames: [u64; 2],
    pub kinds: [StepKind; 2],
    /// Each frame's step as the table planned it alone (its own writes, visible frames,
    /// evictions), for the cache panels and the recorder.
    pub steps: [StepPlan; 2],
    /// What each frame's queries attend to.
    pub views: [PagePlan; 2],
    /// Both frames' writes; `src_token` counts from the step's first token (frame t + 1's
    /// tokens follow frame t's).
    pub writes: Vec<TokenRun>,
    /// Frames committed before each frame: its 3D RoPE frame index and the camera head's cache
    /// length it sees.
    pub committed_before: [u64; 2],
    /// Both steps' events, in order.
    pub events: Vec<CacheEvent>,
}

impl PageTable {
    /// Page ids a two-frame step may use past [`PageTable::max_pages`]: a non-keyframe first
    /// frame's patch pages, then its special tokens' pages. A device pool for pair steps holds
    /// `max_pages() + pair_scratch_pages()` pages.
    pub fn pair_scratch_pages(&self) -> usize {
        let cfg = self.config();
        cfg.pages_per_frame() + cfg.special_tokens.div_ceil(self.page_size())
    }

    /// Plans frames `frames[0]` then `frames[1]` (increasing) as one step of two; on `Some` the
    /// table is where two one-frame steps would leave it. `None`: the two cannot share a step
    /// (see the module's text), and the table is exactly as it was. Errors only for misuse (a
    /// step in progress).
    pub fn plan_pair(
        &mut self,
        frames: [u64; 2],
        kinds: [StepKind; 2],
    ) -> Result<Option<PairPlan>, CacheError> {
        let Some(before) = self.snapshot() else {
            let p = self.step();
            return Err(CacheError::StepInProgress(
                p.first_frame,
                p.first_frame + p.frames,
            ));
        };
        if frames[1] <= frames[0] {
            return Ok(None);
        }
        let mut steps = Vec::with_capacity(2);
        let mut committed_before = [0; 2];
        let mut events = Vec::new();
        for (i, (&frame, &kind)) in frames.iter().zip(&kinds).enumerate() {
            committed_before[i] = self.committed_frames();
            let planned = self.begin_step(frame..frame + 1, kind).cloned();
            let plan = match planned {
                Ok(plan) => plan,
                Err(_) => {
                    // The one-frame steps the caller falls back to report it.
                    self.restore_snapshot(before);
                    return Ok(None);
                }
            };
            if let Err(e) = self.end_step() {
                self.restore_snapshot(before);
                return Err(e);
            }
            // The step's events, those of its end included.
            events.extend_from_slice(self.events());
            steps.push(plan);
        }
        let Ok(steps) = <[StepPlan; 2]>::try_from(steps) else {
            unreachable!("two steps were planned above")
        };

        let (first_writes, first_view) = if kinds[0] == StepKind::NonKeyframe {
            match self.move_to_scratch(&steps[0]) {
                Some(moved) => moved,
                None => {
                    self.restore_snapshot(before);
                    return Ok(None);
                }
            }
        } else {
            (steps[0].writes.clone(), steps[0].plan.clone())
        };
        let tokens_per_frame = self.config().tokens_per_frame() as u32;
        let second_writes: Vec<TokenRun> = steps[1]
            .writes
            .iter()
            .map(|r| TokenRun {
                src_token: r.src_token + tokens_per_frame,
                ..*r
            })
            .collect();
        let second_view = steps[1].plan.clone();
        // Frame t + 1 reading frame t's writes is what it must do (a keyframe t is in its cache;
        // a non-keyframe t wrote only scratch pages, which it never reads): only frame t + 1
        // writing what frame t reads, or both writing one slot, keeps them apart.
        let clash =
            touches(&second_writes, &first_view) || writes_overlap(&first_writes, &second_writes);
        if clash {
            self.restore_snapshot(before);
            return Ok(None);
        }
        let mut writes = first_writes;
        writes.extend(second_writes);
        Ok(Some(PairPlan {
            frames,
            kinds,
            steps,
            views: [first_view, second_view],
            writes,
            committed_before,
            events,
        }))
    }

    /// A non-keyframe's one-frame step with its tokens moved to the scratch pages: its writes
    /// there, and its view with the slots it wrote in the pool taken out and the scratch pages
    /// added. None when its writes are not what such a step writes (a suffix of each page it
    /// writes, within the frame's tokens).
    fn move_to_scratch(&self, step: &StepPlan) -> Option<(Vec<TokenRun>, PagePlan)> {
        let cfg = self.config();
        let page_size = self.page_size();
        let specials = cfg.special_tokens;
        let first_patch_page = self.max_pages();
        let first_special_page = first_patch_page + cfg.pages_per_frame();
        let mut writes = Vec::with_capacity(step.writes.len() + 1);
        // The first pool slot the frame wrote in each page: everything from there on is its.
        let mut written_from: HashMap<u32, (u32, u32)> = HashMap::new();
        for r in &step.writes {
            let end = r.slot + r.len;
            let span = written_from.entry(r.page).or_insert((r.slot, end));
            span.0 = span.0.min(r.slot);
            span.1 = span.1.max(end);
            let src = r.src_token as usize;
            if src + r.len as usize > cfg.tokens_per_frame() {
                return None;
            }
            if src < specials {
                // Special token k of the frame goes to slot k of the special scratch pages.
                let mut done = 0;
                while done < r.len as usize {
                    let k = src + done;
                    let (page, slot) = (k / page_size, k % page_size);
                    let len = (r.len as usize - done).min(page_size - slot);
                    writes.push(TokenRun {
                        src_token: (k) as u32,
                        page: (first_special_page + page) as u32,
                        slot: slot as u32,
                        len: len as u32,
                    });
                    done += len;
                }
            } else {
                // Patch p of the frame sits at page p / page_size, slot p % page_size.
                let p = src - specials;
                if p % page_size != r.slot as usize {
                    return None;
                }
                writes.push(TokenRun {
                    page: (first_patch_page + p / page_size) as u32,
                    ..*r
                });
            }
        }
        let mut view = PagePlan {
            page_size: step.plan.page_size,
            ..PagePlan::default()
        };
        for (&page, &len) in step.plan.indices.iter().zip(&step.plan.page_lens) {
            let kept = match written_from.get(&page) {
                // The frame's slots must be the page's visible tail.
                Some(&(from, to)) if to == len => from,
                Some(_) => return None,
                None => len,
            };
            if kept > 0 {
                view.indices.push(page);
                view.page_lens.push(kept);
            }
        }
        let mut scratch_lens: Vec<(u32, u32)> = Vec::new();
        for r in &writes {
            let end = r.slot + r.len;
            match scratch_lens.iter_mut().find(|(p, _)| *p == r.page) {
                Some((_, len)) => *len = (*len).max(end),
                None => scratch_lens.push((r.page, end)),
            }
        }
        scratch_lens.sort_unstable();
        for (page, len) in scratch_lens {
            view.indices.push(page);
            view.page_lens.push(len);
        }
        view.indptr = vec![0, view.indices.len() as u32];
        view.last_page_len = view.page_lens.last().copied().unwrap_or(0);
        Some((writes, view))
    }
}

/// Whether any of `writes` lands in a slot `view` reads.
fn touches(writes: &[TokenRun], view: &PagePlan) -> bool {
    writes.iter().any(|r| {
        view.indices
            .iter()
            .zip(&view.page_lens)
            .any(|(&page, &len)| page == r.page && r.slot < len && r.len > 0)
    })
}

/// Whether two sets of writes share a slot.
fn writes_overlap(a: &[TokenRun], b: &[TokenRun]) -> bool {
    a.iter().any(|x| {
        b.iter()
            .any(|y| x.page == y.page && x.slot < y.slot + y.len && y.slot < x.slot + x.len)
    })
}
