//! `PageTable::plan_pair` (two streaming frames as one step) against the same frames streamed one
//! step each.
//!
//! Two tables follow the same stream: A takes every frame as a one-frame step, B takes frames two
//! at a time with `plan_pair`. Each table writes into a simulated device pool that remembers,
//! for every `(page, slot)`, which token of which frame was last written there. B applies *all*
//! of a pair's writes before either frame attends (as the device does), then each frame's view
//! must read exactly the tokens A's one-frame step for that frame reads. A itself is checked
//! against the plain rules (visible frames' patches and the newest special tokens), so it is a
//! reference, not just a second run of the same code.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use streamrecon::kvcache::{
    CacheConfig, CacheError, CacheEvent, CacheStats, PagePlan, PageState, PageTable, PatchStream,
    SpecialPoolFull, StepKind, StepPlan, TokenRun,
};

const K: StepKind = StepKind::Keyframe;
const N: StepKind = StepKind::NonKeyframe;

/// The simulated device pool: `(page, slot)` -> `(frame, token index within the frame)`.
type Pool = HashMap<(u32, u32), (u64, u32)>;

/// What a view reads, sorted (attention does not depend on the order of its keys). `None`: a
/// slot nothing was ever written to.
type Seen = Vec<Option<(u64, u32)>>;

/// Applies a step's writes: `frames` are the step's frames, in token order.
fn apply(
    pool: &mut Pool,
    writes: &[TokenRun],
    frames: &[u64],
    tpf: usize,
    page_limit: usize,
) -> Result<(), TestCaseError> {
    for run in writes {
        prop_assert!(
            (run.page as usize) < page_limit,
            "write to page {} beyond the pool of {page_limit}",
            run.page
        );
        prop_assert!(run.len > 0, "empty write run {run:?}");
        for t in 0..run.len {
            let src = (run.src_token + t) as usize;
            prop_assert!(
                src < tpf * frames.len(),
                "write of token {src} beyond the step"
            );
            pool.insert(
                (run.page, run.slot + t),
                (frames[src / tpf], (src % tpf) as u32),
            );
        }
    }
    Ok(())
}

/// Checks a view's CSR form and returns what it reads from `pool`.
fn read(
    pool: &Pool,
    view: &PagePlan,
    page_size: usize,
    page_limit: usize,
) -> Result<Seen, TestCaseError> {
    let n = view.indices.len();
    prop_assert_eq!(view.page_lens.len(), n);
    prop_assert_eq!(&view.indptr, &vec![0, n as u32]);
    prop_assert_eq!(
        view.last_page_len,
        view.page_lens.last().copied().unwrap_or(0)
    );
    prop_assert_eq!(view.page_size as usize, page_size);
    let mut ids = view.indices.clone();
    ids.sort_unstable();
    ids.dedup();
    prop_assert_eq!(ids.len(), n, "a page listed twice in {:?}", view);
    let mut seen = Seen::new();
    for (&page, &len) in view.indices.iter().zip(&view.page_lens) {
        prop_assert!((page as usize) < page_limit, "view reads page {page}");
        prop_assert!(len >= 1 && len as usize <= page_size, "page length {len}");
        seen.extend((0..len).map(|s| pool.get(&(page, s)).copied()));
    }
    seen.sort_unstable();
    Ok(seen)
}

/// What "the table is unchanged" compares.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    stats: CacheStats,
    committed: u64,
    resident: Vec<(u64, PatchStream, Vec<u32>)>,
    page_map: Vec<PageState>,
    special_owners: Vec<u64>,
}

fn observe(t: &PageTable) -> Observed {
    Observed {
        stats: t.stats(),
        committed: t.committed_frames(),
        resident: t
            .resident_frames()
            .map(|(f, s, p)| (f, s, p.to_vec()))
            .collect(),
        page_map: t.page_map(),
        special_owners: t.special_owners().to_vec(),
    }
}

/// One frame streamed as a one-frame step.
#[derive(Debug, Clone)]
struct Single {
    frame: u64,
    kind: StepKind,
    committed_before: u64,
    high_water_before: usize,
    /// The step's plan, its events (`events()` after `end_step`) and what it read.
    result: Result<(StepPlan, Vec<CacheEvent>, Seen), CacheError>,
    after: Observed,
}

fn single_step(
    table: &mut PageTable,
    pool: &mut Pool,
    frame: u64,
    kind: StepKind,
) -> Result<Single, TestCaseError> {
    let tpf = table.config().tokens_per_frame();
    let committed_before = table.committed_frames();
    let high_water_before = table.high_water_pages();
    let before = observe(table);
    let result = match table.begin_step(frame..frame + 1, kind) {
        Err(e) => {
            // A refused step leaves the table as it was.
            prop_assert_eq!(&observe(table), &before);
            Err(e)
        }
        Ok(plan) => {
            let plan = plan.clone();
            apply(pool, &plan.writes, &[frame], tpf, table.max_pages())?;
            let seen = read(pool, &plan.plan, table.page_size(), table.max_pages())?;
            table
                .end_step()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok((plan, table.events().to_vec(), seen))
        }
    };
    Ok(Single {
        frame,
        kind,
        committed_before,
        high_water_before,
        result,
        after: observe(table),
    })
}

/// Events without `PoolGrown`: once B has planned pages for a pair it then did not take, its
/// high-water mark is ahead of A's (page ids stay created, by design), so B no longer reports
/// growth A reports.
fn without_growth(events: &[CacheEvent]) -> Vec<CacheEvent> {
    events
        .iter()
        .filter(|e| !matches!(e, CacheEvent::PoolGrown { .. }))
        .cloned()
        .collect()
}

fn check_events(
    got: &[CacheEvent],
    expected: &[CacheEvent],
    exact: bool,
) -> Result<(), TestCaseError> {
    if exact {
        prop_assert_eq!(got, expected);
    } else {
        prop_assert_eq!(without_growth(got), without_growth(expected));
    }
    Ok(())
}

/// B's one-frame step equals A's for the same frame.
fn same_single(b: &Single, a: &Single) -> Result<(), TestCaseError> {
    prop_assert_eq!(b.committed_before, a.committed_before);
    match (&b.result, &a.result) {
        (Ok((bp, be, bs)), Ok((ap, ae, as_))) => {
            prop_assert_eq!(bp, ap);
            check_events(be, ae, b.high_water_before == a.high_water_before)?;
            prop_assert_eq!(bs, as_);
        }
        (Err(be), Err(ae)) => prop_assert_eq!(be, ae),
        (b, a) => prop_assert!(false, "B {:?} but A {:?}", b, a),
    }
    prop_assert_eq!(&b.after, &a.after);
    Ok(())
}

/// The plain rules for what a step reads: every patch of each visible frame, and the newest
/// `special_tokens_visible` special tokens of the committed frames and the step's own frame.
fn expected_seen(cfg: &CacheConfig, plan: &StepPlan, specials_order: &[u64], frame: u64) -> Seen {
    let mut expected = Seen::new();
    for &f in &plan.visible_frames {
        expected.extend((cfg.special_tokens..cfg.tokens_per_frame()).map(|t| Some((f, t as u32))));
    }
    let mut specials: Vec<(u64, u32)> = specials_order
        .iter()
        .flat_map(|&f| (0..cfg.special_tokens).map(move |t| (f, t as u32)))
        .collect();
    // The step's own frame (committed or not) wrote the newest special tokens.
    specials.extend((0..cfg.special_tokens).map(|t| (frame, t as u32)));
    let visible = plan.special_tokens_visible as usize;
    expected.extend(
        specials[specials.len().saturating_sub(visible)..]
            .iter()
            .map(|&t| Some(t)),
    );
    expected.sort_unstable();
    expected
}

/// Pairs by kinds: index `2·(first is N) + (second is N)`, i.e. KK, KN, NK, NN.
fn pair_index(kinds: [StepKind; 2]) -> usize {
    2 * usize::from(kinds[0] == N) + usize::from(kinds[1] == N)
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Counts {
    some: [usize; 4],
    none: [usize; 4],
    /// Frames evicted in the stream (A's steps), to show the stream reached eviction.
    evicted: usize,
    /// The stream stopped at a cache error (A and B alike).
    stopped_at_error: bool,
}

/// Streams `stream` (frame, kind) after a phase-1 keyframe step of the scale frames through A
/// (one-frame steps) and B (pairs), checking B against A after every pair. `None` when phase 1
/// itself is refused.
fn run_stream(
    cfg: &CacheConfig,
    stream: &[(u64, StepKind)],
) -> Result<Option<Counts>, TestCaseError> {
    let tpf = cfg.tokens_per_frame();
    let mut a = PageTable::new(cfg.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut b = PageTable::new(cfg.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (mut pool_a, mut pool_b) = (Pool::new(), Pool::new());
    let scale = cfg.scale_frames as u64;
    let mut specials_order: Vec<u64> = Vec::new();
    if scale > 0 {
        let phase1: Vec<u64> = (0..scale).collect();
        for (table, pool) in [(&mut a, &mut pool_a), (&mut b, &mut pool_b)] {
            let limit = table.max_pages();
            let writes = match table.begin_step(0..scale, K) {
                Ok(plan) => plan.writes.clone(),
                // A special pool smaller than the scale frames: nothing to stream.
                Err(_) => return Ok(None),
            };
            apply(pool, &writes, &phase1, tpf, limit)?;
            table
                .end_step()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        specials_order.extend(&phase1);
    }
    let max_pages = b.max_pages();
    let scratch = b.pair_scratch_pages();
    prop_assert_eq!(max_pages, a.max_pages());

    // A: every frame one step; stop at the first refused step (kept, so B must refuse it too).
    let mut refs: Vec<Single> = Vec::new();
    let mut counts = Counts::default();
    for &(frame, kind) in stream {
        let s = single_step(&mut a, &mut pool_a, frame, kind)?;
        let failed = s.result.is_err();
        if let Ok((plan, _, seen)) = &s.result {
            prop_assert!(seen.iter().all(Option::is_some), "A read an unwritten slot");
            let expected = expected_seen(cfg, plan, &specials_order, frame);
            prop_assert_eq!(
                seen,
                &expected,
                "A's step of frame {} breaks the rules",
                frame
            );
            counts.evicted += plan.evicted_frames.len();
            if kind == K {
                specials_order.push(frame);
            }
        }
        refs.push(s);
        if failed {
            counts.stopped_at_error = true;
            break;
        }
    }

    // B: the same frames, two at a time.
    let mut j = 0;
    while j < refs.len() {
        if j + 1 == refs.len() {
            let s = single_step(&mut b, &mut pool_b, refs[j].frame, refs[j].kind)?;
            same_single(&s, &refs[j])?;
            break;
        }
        let (r0, r1) = (&refs[j], &refs[j + 1]);
        let frames = [r0.frame, r1.frame];
        let kinds = [r0.kind, r1.kind];
        let before = observe(&b);
        let (step_before, events_before) = (b.step().clone(), b.events().to_vec());
        let exact_growth = b.high_water_pages() == r0.high_water_before;
        let planned = b
            .plan_pair(frames, kinds)
            .map_err(|e| TestCaseError::fail(format!("plan_pair {frames:?}: {e}")))?;
        match planned {
            Some(pair) => {
                let (Ok((p0, e0, s0)), Ok((p1, e1, s1))) = (&r0.result, &r1.result) else {
                    return Err(TestCaseError::fail(format!(
                        "pair {frames:?} planned although a one-frame step was refused"
                    )));
                };
                prop_assert_eq!(pair.frames, frames);
                prop_assert_eq!(pair.kinds, kinds);
                prop_assert_eq!(
                    pair.committed_before,
                    [r0.committed_before, r1.committed_before]
                );
                prop_assert_eq!(&pair.steps[0], p0);
                prop_assert_eq!(&pair.steps[1], p1);
                let both: Vec<CacheEvent> = e0.iter().chain(e1).cloned().collect();
                check_events(&pair.events, &both, exact_growth)?;

                // Where the writes land: frame 1 (and a keyframe frame 0) in the pool proper;
                // a non-keyframe frame 0 only in the scratch pages, each of its tokens once.
                let mut first_tokens = Vec::new();
                for run in &pair.writes {
                    let first = (run.src_token as usize) < tpf;
                    let page = run.page as usize;
                    if first && kinds[0] == N {
                        prop_assert!(
                            (max_pages..max_pages + scratch).contains(&page),
                            "non-keyframe {} written to page {page}",
                            frames[0]
                        );
                    } else {
                        prop_assert!(page < max_pages, "write {run:?} in the scratch pages");
                    }
                    if first {
                        first_tokens.extend(run.src_token..run.src_token + run.len);
                    }
                }
                if kinds[0] == N {
                    first_tokens.sort_unstable();
                    prop_assert_eq!(first_tokens, (0..tpf as u32).collect::<Vec<_>>());
                }

                // All writes first, then each frame attends to its view.
                apply(&mut pool_b, &pair.writes, &frames, tpf, max_pages + scratch)?;
                let page_size = b.page_size();
                let seen0 = read(&pool_b, &pair.views[0], page_size, max_pages + scratch)?;
                let seen1 = read(&pool_b, &pair.views[1], page_size, max_pages + scratch)?;
                prop_assert_eq!(
                    &seen0,
                    s0,
                    "frame {} of pair {:?} sees other tokens",
                    frames[0],
                    frames
                );
                prop_assert_eq!(
                    &seen1,
                    s1,
                    "frame {} of pair {:?} sees other tokens",
                    frames[1],
                    frames
                );
                prop_assert_eq!(&observe(&b), &r1.after);
                counts.some[pair_index(kinds)] += 1;
            }
            None => {
                prop_assert_eq!(&observe(&b), &before, "None changed the table");
                prop_assert_eq!(b.step(), &step_before, "None changed the last step's plan");
                prop_assert_eq!(b.events(), &events_before[..], "None changed the events");
                // Only what the module names keeps two frames apart: a refused step or a
                // dropped special page.
                let dropped = [r0, r1].iter().any(|r| match &r.result {
                    Ok((_, events, _)) => events
                        .iter()
                        .any(|e| matches!(e, CacheEvent::SpecialPageDropped { .. })),
                    Err(_) => true,
                });
                prop_assert!(
                    dropped,
                    "pair {:?} {:?} refused with no error and no dropped special page",
                    frames,
                    kinds
                );
                counts.none[pair_index(kinds)] += 1;
                for r in [r0, r1] {
                    let s = single_step(&mut b, &mut pool_b, r.frame, r.kind)?;
                    same_single(&s, r)?;
                    if s.result.is_err() {
                        break;
                    }
                }
            }
        }
        j += 2;
    }
    Ok(Some(counts))
}

/// `frames` after the scale frames with their kinds.
fn stream_of(scale: usize, kinds: &[StepKind]) -> Vec<(u64, StepKind)> {
    kinds
        .iter()
        .enumerate()
        .map(|(i, &k)| (scale as u64 + i as u64, k))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn pairs_see_what_one_frame_steps_see(
        scale in 1usize..4,
        window in 0usize..5,
        patches in 3usize..40,
        page_choice in 0usize..4,
        pad in 1usize..10,
        small in 4usize..6,
        drop_oldest in any::<bool>(),
        small_cap in any::<bool>(),
        cap_extra in 0u64..10,
        keyframes in prop::collection::vec(any::<bool>(), 2..28),
        gaps in prop::collection::vec(1u64..3, 28),
    ) {
        let mut cfg = CacheConfig::new(1, 1, 1, patches, scale, window);
        // Exact pages, padded pages, pages smaller than a frame (and than the 6 specials).
        cfg.page_size = match page_choice {
            0 => None,
            1 => Some(patches + pad),
            2 => Some(small),
            _ => Some(patches.div_ceil(3)),
        };
        cfg.special_pool.on_full = if drop_oldest {
            SpecialPoolFull::DropOldest
        } else {
            SpecialPoolFull::Error
        };
        // A cap of a few frames past the scale frames fills within the stream.
        cfg.special_pool.max_frames = if small_cap { scale as u64 + cap_extra } else { 1 << 20 };
        cfg.special_pool.grow_frames = 2;
        // Frames increase with gaps (a live source drops frames).
        let mut frame = scale as u64;
        let stream: Vec<(u64, StepKind)> = keyframes
            .iter()
            .zip(&gaps)
            .map(|(&key, &gap)| {
                let f = frame;
                frame += gap;
                (f, if key { K } else { N })
            })
            .collect();
        run_stream(&cfg, &stream)?;
    }
}

fn unwrap<T>(r: Result<T, TestCaseError>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// Exact pages, two scale frames, a window of three.
fn exact_config() -> CacheConfig {
    CacheConfig::new(1, 1, 1, 7, 2, 3)
}

#[test]
fn every_kind_of_pair_shares_a_step() {
    // KK, KN, NK, NN four times over: 16 keyframes through a window of 3, so frames are evicted
    // by the pairs (and each kind of pair meets every phase of the special pages).
    let pattern = [K, K, K, N, N, K, N, N];
    let kinds: Vec<StepKind> = pattern.iter().copied().cycle().take(32).collect();
    let layouts = [("exact", None), ("padded", Some(10)), ("split", Some(4))];
    for (name, page_size) in layouts {
        let mut cfg = exact_config();
        cfg.page_size = page_size;
        let counts = unwrap(run_stream(&cfg, &stream_of(cfg.scale_frames, &kinds)))
            .expect("phase 1 fits the default special pool");
        println!(
            "{name}: Some KK/KN/NK/NN {:?}, None {:?}",
            counts.some, counts.none
        );
        assert!(!counts.stopped_at_error, "{name}: {counts:?}");
        assert!(counts.evicted > 0, "{name}: the stream must reach eviction");
        assert_eq!(counts.none, [0; 4], "{name}: common pairs refused");
        assert_eq!(counts.some, [4; 4], "{name}: {counts:?}");
    }
}

/// A table after phase 1 and `keyframes` one-frame keyframe steps; returns the next frame.
fn warmed_up(cfg: &CacheConfig, keyframes: u64) -> (PageTable, u64) {
    let mut t = PageTable::new(cfg.clone()).unwrap();
    let scale = cfg.scale_frames as u64;
    t.begin_step(0..scale, K).unwrap();
    t.end_step().unwrap();
    for f in scale..scale + keyframes {
        t.begin_step(f..f + 1, K).unwrap();
        t.end_step().unwrap();
    }
    (t, scale + keyframes)
}

#[test]
fn a_non_keyframe_first_frame_writes_only_scratch_pages() {
    let cfg = exact_config();
    let tpf = cfg.tokens_per_frame() as u32;
    for second in [K, N] {
        // Past the window, so the non-keyframe's own page would be a recycled one.
        let (mut t, f) = warmed_up(&cfg, 5);
        let (max, scratch) = (t.max_pages() as u32, t.pair_scratch_pages() as u32);
        let pair = t
            .plan_pair([f, f + 1], [N, second])
            .unwrap()
            .expect("a non-keyframe and the next frame share a step");
        let (first, rest): (Vec<TokenRun>, Vec<TokenRun>) =
            pair.writes.iter().partition(|r| r.src_token < tpf);
        assert!(!first.is_empty());
        for r in &first {
            assert!(
                r.page >= max && r.page < max + scratch,
                "frame {f}'s run {r:?} outside the scratch pages {max}..{}",
                max + scratch
            );
        }
        // Frame f + 1 (and only it) writes the pool proper, where frame f's own step wrote.
        assert!(rest.iter().all(|r| r.page < max), "{rest:?}");
        assert_eq!(rest.len(), pair.steps[1].writes.len());
        // Frame f reads its own tokens from the scratch pages it wrote.
        let scratch_read: Vec<u32> = pair.views[0]
            .indices
            .iter()
            .copied()
            .filter(|&p| p >= max)
            .collect();
        let mut scratch_written: Vec<u32> = first.iter().map(|r| r.page).collect();
        scratch_written.sort_unstable();
        scratch_written.dedup();
        assert_eq!(scratch_read, scratch_written);
        // The second frame's view never reads scratch.
        assert!(pair.views[1].indices.iter().all(|&p| p < max));
    }
}

#[test]
fn plan_pair_during_a_step_is_an_error() {
    let cfg = exact_config();
    let (mut t, f) = warmed_up(&cfg, 1);
    t.begin_step(f..f + 1, K).unwrap();
    let during = observe(&t);
    let step = t.step().clone();
    let err = t.plan_pair([f + 1, f + 2], [K, K]).unwrap_err();
    assert_eq!(err, CacheError::StepInProgress(f, f + 1));
    // The step in progress is untouched and still ends normally.
    assert_eq!(observe(&t), during);
    assert_eq!(t.step(), &step);
    assert!(t.step_in_progress());
    t.end_step().unwrap();
    assert_eq!(t.committed_frames(), cfg.scale_frames as u64 + 2);
}

#[test]
fn frames_out_of_order_are_no_pair() {
    let cfg = exact_config();
    let (mut t, f) = warmed_up(&cfg, 4);
    let before = observe(&t);
    let cases = [
        ([f, f], [K, K]),
        ([f + 1, f], [K, N]),
        ([f + 3, f + 2], [N, K]),
        // The first frame is not after the last committed one.
        ([f - 1, f], [K, K]),
        ([f - 1, f], [N, N]),
        // The second frame repeats the first, a keyframe now committed.
        ([f, f], [K, N]),
    ];
    for (frames, kinds) in cases {
        let got = t.plan_pair(frames, kinds).unwrap();
        assert!(got.is_none(), "{frames:?} {kinds:?} planned: {got:?}");
        assert_eq!(
            observe(&t),
            before,
            "{frames:?} {kinds:?} changed the table"
        );
        assert!(!t.step_in_progress());
    }
    // The table still plans the next pair as if nothing had been asked.
    let mut fresh = warmed_up(&cfg, 4).0;
    let pair = t
        .plan_pair([f, f + 1], [K, N])
        .unwrap()
        .expect("an ordered pair");
    for (i, frame) in [f, f + 1].into_iter().enumerate() {
        let kind = pair.kinds[i];
        let plan = fresh.begin_step(frame..frame + 1, kind).unwrap().clone();
        fresh.end_step().unwrap();
        assert_eq!(pair.steps[i], plan);
    }
    assert_eq!(observe(&t), observe(&fresh));
}
