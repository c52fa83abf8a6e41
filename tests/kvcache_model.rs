//! The page table against a naive model of the cache rules (gct-model.md §5), over arbitrary
//! scale frames, windows, keyframe intervals, frame counts and page sizes.

use std::collections::VecDeque;

use proptest::prelude::*;
use streamrecon::kvcache::sim::{SimConfig, StepLine, simulate};
use streamrecon::kvcache::{CacheConfig, PageTable, SpecialPoolFull, StepKind};

const SPECIALS: u64 = 6;

/// The rules written as plainly as possible: lists of frame indices, no pages.
fn naive_lines(
    frames: u64,
    scale: usize,
    window: usize,
    interval: u64,
    patches: u64,
    page: u64,
) -> Vec<StepLine> {
    let per_frame_pages = patches.div_ceil(page);
    let last_patch_page = patches - (per_frame_pages - 1) * page;
    let mut scale_frames: Vec<u64> = Vec::new();
    let mut window_frames: VecDeque<u64> = VecDeque::new();
    let mut committed = 0u64;
    let phase1 = (scale as u64).min(frames);
    for f in 0..phase1 {
        if scale_frames.len() < scale {
            scale_frames.push(f);
        } else {
            window_frames.push_back(f);
        }
        committed += 1;
        while window_frames.len() > window {
            window_frames.pop_front();
        }
    }
    let mut lines = Vec::new();
    for f in phase1..frames {
        let keyframe = interval <= 1 || (f - phase1).is_multiple_of(interval);
        let mut scale_now = scale_frames.clone();
        let mut window_now = window_frames.clone();
        if scale_now.len() < scale {
            scale_now.push(f);
        } else {
            window_now.push_back(f);
        }
        let mut evicted = Vec::new();
        if keyframe {
            while window_now.len() > window {
                evicted.extend(window_now.pop_front());
            }
        }
        let special_frames = committed + 1;
        let visible: Vec<u64> = scale_now
            .iter()
            .copied()
            .chain(window_now.iter().copied())
            .collect();
        let special_tokens = special_frames * SPECIALS;
        let special_pages = special_tokens.div_ceil(page);
        let last_page_len = if special_tokens > 0 {
            match special_tokens % page {
                0 => page,
                r => r,
            }
        } else {
            last_patch_page
        };
        lines.push(StepLine {
            frame: f,
            keyframe,
            kv_tokens: visible.len() as u64 * patches + special_tokens,
            pages_in_use: (visible.len() as u64 * per_frame_pages + special_pages) as usize,
            visible_frames: visible,
            special_frames,
            last_page_len: last_page_len as u32,
            evicted,
        });
        if keyframe {
            scale_frames = scale_now;
            window_frames = window_now;
            committed += 1;
        }
    }
    lines
}

fn sim_args(
    frames: u64,
    scale: usize,
    window: usize,
    interval: u64,
    patches: usize,
    page: Option<usize>,
) -> SimConfig {
    SimConfig {
        frames,
        scale_frames: scale,
        sliding_window: window,
        keyframe_interval: interval,
        patches_per_frame: patches,
        page_size: page,
        special_max_frames: 1 << 20,
        on_special_full: SpecialPoolFull::Error,
        layers: 2,
        heads: 2,
        head_dim: 4,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn page_table_follows_the_rules(
        frames in 0u64..90,
        scale in 0usize..6,
        window in 0usize..9,
        interval in 0u64..5,
        patches in 1usize..40,
        page_choice in 0usize..4,
        page_any in 1usize..70,
    ) {
        // Exact pages, padded pages, pages smaller than a frame, and anything at all.
        let page = match page_choice {
            0 => None,
            1 => Some(patches.next_power_of_two()),
            2 => Some(patches.div_ceil(3).max(1)),
            _ => Some(page_any),
        };
        let mut got = Vec::new();
        simulate(&sim_args(frames, scale, window, interval, patches, page), |l| {
            got.push(l);
            std::ops::ControlFlow::Continue(())
        }).unwrap();
        let expected = naive_lines(frames, scale, window, interval, patches as u64, page.unwrap_or(patches) as u64);
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn plans_are_consistent(
        frames in 1u64..60,
        scale in 0usize..5,
        window in 0usize..7,
        interval in 0u64..4,
        patches in 1usize..30,
        page in 1usize..40,
    ) {
        let mut cfg = CacheConfig::new(1, 1, 1, patches, scale, window);
        cfg.page_size = Some(page);
        let mut table = PageTable::new(cfg.clone()).unwrap();
        let tpf = cfg.tokens_per_frame();
        let phase1 = (scale as u64).min(frames);
        let mut first = true;
        let mut f = 0;
        while f < frames {
            let (range, kind) = if first && phase1 > 0 {
                (0..phase1, StepKind::Keyframe)
            } else if interval <= 1 || (f - phase1).is_multiple_of(interval) {
                (f..f + 1, StepKind::Keyframe)
            } else {
                (f..f + 1, StepKind::NonKeyframe)
            };
            first = false;
            let before = table.stats();
            let step = table.begin_step(range.clone(), kind).unwrap().clone();
            let plan = &step.plan;
            // Every visible page is distinct and inside the pool; lengths describe it exactly.
            let mut ids = plan.indices.clone();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), plan.indices.len());
            prop_assert!(plan.indices.iter().all(|&p| (p as usize) < table.max_pages()));
            prop_assert!(plan.page_lens.iter().all(|&l| l >= 1 && l as usize <= page));
            prop_assert_eq!(plan.indptr.clone(), vec![0, plan.indices.len() as u32]);
            prop_assert_eq!(plan.last_page_len, *plan.page_lens.last().unwrap());
            // Writes cover each of the step's tokens at most once, each slot once, and only
            // pages the plan shows (frames evicted inside their own step excepted).
            let mut slots = std::collections::HashSet::new();
            let mut tokens = std::collections::HashSet::new();
            for run in &step.writes {
                let pos = plan.indices.iter().position(|&p| p == run.page);
                prop_assert!(pos.is_some(), "write to a page outside the plan");
                let len = plan.page_lens[pos.unwrap()];
                prop_assert!(run.slot + run.len <= len);
                for t in 0..run.len {
                    prop_assert!(slots.insert((run.page, run.slot + t)));
                    prop_assert!(tokens.insert(run.src_token + t));
                }
            }
            prop_assert!(tokens.iter().all(|&t| (t as usize) < tpf * (range.end - range.start) as usize));
            table.end_step().unwrap();
            if kind == StepKind::NonKeyframe {
                // Nothing of a non-keyframe stays.
                let after = table.stats();
                prop_assert_eq!(before.scale_pages, after.scale_pages);
                prop_assert_eq!(before.window_pages, after.window_pages);
                prop_assert_eq!(before.special_pages, after.special_pages);
                prop_assert_eq!(before.special_tokens, after.special_tokens);
                prop_assert_eq!(before.frames_committed, after.frames_committed);
            }
            f = range.end;
        }
    }
}
