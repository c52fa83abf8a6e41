//! What the cache stores and attends: contents survive eviction and rollback exactly, paged and
//! dense attention agree, misuse is an error.

use proptest::prelude::*;
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::attention::{AttentionLayout, CpuKvCache};
use streamrecon::kvcache::{
    CacheConfig, CacheError, CacheEvent, SpecialPoolFull, StepKind, StorageDtype,
};

/// A value that says where it came from: frame, token, layer, element.
fn marker(frame: u64, token: usize, layer: usize, elem: usize, kv: usize) -> f32 {
    (frame as f32) * 1000.0
        + token as f32
        + layer as f32 * 0.25
        + elem as f32 * 0.001
        + kv as f32 * 0.5
}

fn step_kv(cfg: &CacheConfig, frames: std::ops::Range<u64>, layer: usize) -> (Vec<f32>, Vec<f32>) {
    let te = cfg.heads * cfg.head_dim;
    let tpf = cfg.tokens_per_frame();
    let mut k = Vec::new();
    let mut v = Vec::new();
    for f in frames {
        for t in 0..tpf {
            for e in 0..te {
                k.push(marker(f, t, layer, e, 0));
                v.push(marker(f, t, layer, e, 1));
            }
        }
    }
    (k, v)
}

/// Runs a stream through the cache, writing marked K/V and attending with random queries.
fn run_stream(
    cfg: &CacheConfig,
    layout: AttentionLayout,
    frames: u64,
    interval: u64,
) -> CpuKvCache {
    let mut cache = CpuKvCache::new(cfg.clone(), layout).unwrap();
    let phase1 = (cfg.scale_frames as u64).min(frames);
    let te = cfg.heads * cfg.head_dim;
    let mut f = 0;
    while f < frames {
        let (range, kind) = if f == 0 && phase1 > 0 {
            (0..phase1, StepKind::Keyframe)
        } else if interval <= 1 || (f - phase1).is_multiple_of(interval) {
            (f..f + 1, StepKind::Keyframe)
        } else {
            (f..f + 1, StepKind::NonKeyframe)
        };
        cache.begin_step(range.clone(), kind).unwrap();
        let lq = (range.end - range.start) as usize * cfg.tokens_per_frame();
        for layer in 0..cfg.layers {
            let (k, v) = step_kv(cfg, range.clone(), layer);
            cache.write_layer(layer, &k, &v).unwrap();
            let q = vec![0.01; lq * te];
            let mut out = vec![0.0; lq * te];
            cache.attend_layer(layer, &q, &mut out).unwrap();
        }
        cache.end_step().unwrap();
        f = range.end;
    }
    cache
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// After any stream, each layer holds exactly the scale frames and the window in full and
    /// the special tokens of every evicted keyframe, with the values that were written, in
    /// both layouts.
    #[test]
    fn contents_survive_eviction_and_rollback(
        frames in 1u64..40,
        scale in 0usize..4,
        window in 0usize..5,
        interval in 0u64..4,
        patches in 1usize..12,
        page in proptest::option::of(1usize..20),
    ) {
        let mut cfg = CacheConfig::new(2, 2, 4, patches, scale, window);
        cfg.page_size = page;
        let paged = run_stream(&cfg, AttentionLayout::Paged, frames, interval);
        let dense = run_stream(&cfg, AttentionLayout::Dense, frames, interval);
        let te = cfg.heads * cfg.head_dim;
        let tpf = cfg.tokens_per_frame();
        for layer in 0..cfg.layers {
            let p = paged.layer_state(layer).unwrap();
            let d = dense.layer_state(layer).unwrap();
            prop_assert_eq!(&p, &d);
            let mut expected_k = Vec::new();
            for &f in &p.live_frames {
                for t in 0..tpf {
                    for e in 0..te {
                        expected_k.push(marker(f, t, layer, e, 0));
                    }
                }
            }
            prop_assert_eq!(&p.k, &expected_k);
            let mut expected_special = Vec::new();
            for &f in &p.evicted_frames {
                for t in 0..cfg.special_tokens {
                    for e in 0..te {
                        expected_special.push(marker(f, t, layer, e, 1));
                    }
                }
            }
            prop_assert_eq!(&p.special_v, &expected_special);
            // Every committed frame is either live or remembered by its special tokens.
            prop_assert_eq!(
                (p.live_frames.len() + p.evicted_frames.len()) as u64,
                paged.committed_frames()
            );
        }
    }
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn max_relative_difference(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// Paged and dense attention over the same random stream, at every step and layer.
fn compare_layouts(cfg: CacheConfig, frames: u64, interval: u64, seed: u64) -> f32 {
    let mut paged = CpuKvCache::new(cfg.clone(), AttentionLayout::Paged).unwrap();
    let mut dense = CpuKvCache::new(cfg.clone(), AttentionLayout::Dense).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let te = cfg.heads * cfg.head_dim;
    let phase1 = (cfg.scale_frames as u64).min(frames);
    let mut worst = 0f32;
    let mut f = 0;
    while f < frames {
        let (range, kind) = if f == 0 && phase1 > 0 {
            (0..phase1, StepKind::Keyframe)
        } else if interval <= 1 || (f - phase1).is_multiple_of(interval) {
            (f..f + 1, StepKind::Keyframe)
        } else {
            (f..f + 1, StepKind::NonKeyframe)
        };
        paged.begin_step(range.clone(), kind).unwrap();
        dense.begin_step(range.clone(), kind).unwrap();
        let lq = (range.end - range.start) as usize * cfg.tokens_per_frame();
        for layer in 0..cfg.layers {
            // Scaled keys give peaked softmax rows, the case where online rescaling matters.
            let k: Vec<f32> = random(&mut rng, lq * te).iter().map(|x| x * 6.0).collect();
            let v = random(&mut rng, lq * te);
            let q = random(&mut rng, lq * te);
            paged.write_layer(layer, &k, &v).unwrap();
            dense.write_layer(layer, &k, &v).unwrap();
            let mut out_paged = vec![0.0; lq * te];
            let mut out_dense = vec![0.0; lq * te];
            paged.attend_layer(layer, &q, &mut out_paged).unwrap();
            dense.attend_layer(layer, &q, &mut out_dense).unwrap();
            worst = worst.max(max_relative_difference(&out_paged, &out_dense));
        }
        paged.end_step().unwrap();
        dense.end_step().unwrap();
        f = range.end;
    }
    worst
}

#[test]
fn paged_matches_dense_f32_exact_pages() {
    let cfg = CacheConfig::new(2, 2, 64, 37, 2, 3);
    let worst = compare_layouts(cfg, 14, 2, 1);
    assert!(worst <= 1e-5, "paged vs dense relative difference {worst}");
}

#[test]
fn paged_matches_dense_bf16_storage() {
    let mut cfg = CacheConfig::new(2, 4, 64, 50, 3, 4);
    cfg.dtype = StorageDtype::Bf16;
    let worst = compare_layouts(cfg, 16, 3, 2);
    assert!(worst <= 1e-5, "paged vs dense relative difference {worst}");
}

#[test]
fn padding_is_masked_out_of_attention() {
    // 37 patches in 64-token pages: 27 padded slots per frame that must not be attended.
    let mut cfg = CacheConfig::new(1, 2, 64, 37, 2, 3);
    cfg.page_size = Some(64);
    let worst = compare_layouts(cfg, 10, 1, 3);
    assert!(
        worst <= 1e-5,
        "paged (padded) vs dense relative difference {worst}"
    );
}

#[test]
fn frames_split_over_small_pages() {
    let mut cfg = CacheConfig::new(1, 2, 32, 37, 2, 3);
    cfg.page_size = Some(16);
    let worst = compare_layouts(cfg, 10, 2, 4);
    assert!(
        worst <= 1e-5,
        "paged (16-token pages) vs dense relative difference {worst}"
    );
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let cfg = CacheConfig::new(2, 2, 4, 5, 1, 2);
    for layout in [AttentionLayout::Paged, AttentionLayout::Dense] {
        let mut cache = CpuKvCache::new(cfg.clone(), layout).unwrap();
        let q = vec![0.0; 11 * 8];
        let mut out = vec![0.0; 11 * 8];
        assert!(matches!(
            cache.attend_layer(0, &q, &mut out),
            Err(CacheError::NoStep(_))
        ));
        assert!(matches!(
            cache.write_layer(0, &q, &q),
            Err(CacheError::NoStep(_))
        ));
        assert!(matches!(cache.end_step(), Err(CacheError::NoStep(_))));
        cache.begin_step(0..1, StepKind::Keyframe).unwrap();
        assert!(matches!(
            cache.attend_layer(0, &q, &mut out),
            Err(CacheError::LayerNotWritten { layer: 0 })
        ));
        let short = vec![0.0; 10 * 8];
        assert!(matches!(
            cache.write_layer(0, &short, &short),
            Err(CacheError::WrongSize {
                expected: 88,
                found: 80,
                ..
            })
        ));
        assert!(matches!(
            cache.write_layer(2, &q, &q),
            Err(CacheError::LayerOutOfRange {
                layer: 2,
                layers: 2
            })
        ));
        cache.write_layer(0, &q, &q).unwrap();
        let mut wrong_out = vec![0.0; 3];
        assert!(matches!(
            cache.attend_layer(0, &q, &mut wrong_out),
            Err(CacheError::WrongSize { .. })
        ));
        assert!(matches!(
            cache.begin_step(1..2, StepKind::Keyframe),
            Err(CacheError::StepInProgress(0, 1))
        ));
        cache.end_step().unwrap();
        assert!(matches!(
            cache.begin_step(0..1, StepKind::Keyframe),
            Err(CacheError::FrameOrder { frame: 0, last: 0 })
        ));
        assert!(matches!(
            cache.begin_step(1..3, StepKind::NonKeyframe),
            Err(CacheError::NonKeyframeStep(2))
        ));
        assert!(matches!(
            cache.begin_step(5..5, StepKind::Keyframe),
            Err(CacheError::EmptyStep)
        ));
    }
    let mut bad = cfg.clone();
    bad.heads = 0;
    assert!(matches!(
        CpuKvCache::new(bad, AttentionLayout::Paged),
        Err(CacheError::InvalidConfig { field: "heads", .. })
    ));
}

#[test]
fn special_pool_cap_error_leaves_the_cache_untouched() {
    let mut cfg = CacheConfig::new(1, 1, 4, 3, 1, 1);
    cfg.page_size = Some(12); // two frames' special tokens per page
    cfg.special_pool.max_frames = 4;
    cfg.special_pool.grow_frames = 2;
    let mut cache = CpuKvCache::new(cfg.clone(), AttentionLayout::Paged).unwrap();
    for f in 0..4 {
        cache.begin_step(f..f + 1, StepKind::Keyframe).unwrap();
        cache.end_step().unwrap();
    }
    let before = cache.stats();
    let err = cache.begin_step(4..5, StepKind::Keyframe).unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::SpecialPoolFull {
                cap_frames: 4,
                cap_pages: 2
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("drop-oldest"));
    assert_eq!(cache.stats(), before);
    // A non-keyframe borrows the reserve and gives it back.
    cache.begin_step(4..5, StepKind::NonKeyframe).unwrap();
    cache.end_step().unwrap();
    assert_eq!(cache.stats(), before);
}

#[test]
fn special_pool_drop_oldest_keeps_going() {
    let mut cfg = CacheConfig::new(1, 1, 4, 3, 1, 1);
    cfg.page_size = Some(12);
    cfg.special_pool.max_frames = 4;
    cfg.special_pool.on_full = SpecialPoolFull::DropOldest;
    let mut cache = CpuKvCache::new(cfg, AttentionLayout::Paged).unwrap();
    let mut dropped = 0;
    for f in 0..50u64 {
        cache.begin_step(f..f + 1, StepKind::Keyframe).unwrap();
        dropped += cache
            .events()
            .iter()
            .filter(|e| matches!(e, CacheEvent::SpecialPageDropped { .. }))
            .count();
        cache.end_step().unwrap();
        assert!(cache.stats().special_pages <= 2);
    }
    assert!(dropped >= 20, "dropped {dropped} pages");
    assert_eq!(cache.stats().special_tokens_dropped, dropped as u64 * 12);
}

#[test]
fn aborting_a_keyframe_restores_everything() {
    let cfg = CacheConfig::new(1, 1, 4, 3, 1, 2);
    for layout in [AttentionLayout::Paged, AttentionLayout::Dense] {
        let mut cache = run_stream(&cfg, layout, 6, 1);
        let stats = cache.stats();
        let state = cache.layer_state(0).unwrap();
        cache.begin_step(6..7, StepKind::Keyframe).unwrap();
        let (k, v) = step_kv(&cfg, 6..7, 0);
        cache.write_layer(0, &k, &v).unwrap();
        assert_ne!(cache.layer_state(0).unwrap(), state);
        cache.abort_step().unwrap();
        assert_eq!(cache.stats(), stats, "{layout}");
        assert_eq!(cache.layer_state(0).unwrap(), state, "{layout}");
    }
}

/// Softmax attention in f64 over every key, written as plainly as possible.
fn naive_attention(q: &[f32], k: &[f32], v: &[f32], heads: usize, d: usize) -> Vec<f32> {
    let te = heads * d;
    let (nq, nk) = (q.len() / te, k.len() / te);
    let mut out = vec![0f32; q.len()];
    for i in 0..nq {
        for h in 0..heads {
            let logits: Vec<f64> = (0..nk)
                .map(|t| {
                    (0..d)
                        .map(|j| q[i * te + h * d + j] as f64 * k[t * te + h * d + j] as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for j in 0..d {
                let acc: f64 = (0..nk)
                    .map(|t| weights[t] * v[t * te + h * d + j] as f64)
                    .sum();
                out[i * te + h * d + j] = (acc / total) as f32;
            }
        }
    }
    out
}

#[test]
fn both_layouts_match_a_naive_reference() {
    // 3 frames of 300 patches: several key tiles per page, and a partial last tile.
    let cfg = CacheConfig::new(1, 2, 64, 300, 3, 2);
    let mut rng = StdRng::seed_from_u64(9);
    let te = cfg.heads * cfg.head_dim;
    let tokens = 3 * cfg.tokens_per_frame();
    let k: Vec<f32> = random(&mut rng, tokens * te)
        .iter()
        .map(|x| x * 5.0)
        .collect();
    let v = random(&mut rng, tokens * te);
    let q = random(&mut rng, 70 * te);
    let expected = naive_attention(&q, &k, &v, cfg.heads, cfg.head_dim);
    for layout in [AttentionLayout::Paged, AttentionLayout::Dense] {
        let mut cache = CpuKvCache::new(cfg.clone(), layout).unwrap();
        cache.begin_step(0..3, StepKind::Keyframe).unwrap();
        cache.write_layer(0, &k, &v).unwrap();
        let mut out = vec![0f32; q.len()];
        cache.attend_layer(0, &q, &mut out).unwrap();
        let err = max_relative_difference(&out, &expected);
        assert!(
            err <= 1e-5,
            "{layout}: relative error {err} against the f64 reference"
        );
    }
}

#[test]
fn host_storage_holds_only_pages_in_use_at_the_peak() {
    // The released geometry's cache rules with a tiny head size: 8 scale frames, window 64.
    let cfg = CacheConfig::new(2, 1, 4, 999, 8, 64);
    let mut cache = CpuKvCache::new(cfg.clone(), AttentionLayout::Paged).unwrap();
    cache.begin_step(0..8, StepKind::Keyframe).unwrap();
    cache.end_step().unwrap();
    // 8 patch pages and one special page, not the 73-page patch pool.
    assert_eq!(cache.stats().allocated_pages, 9);
    for f in 8..200u64 {
        cache.begin_step(f..f + 1, StepKind::Keyframe).unwrap();
        cache.end_step().unwrap();
    }
    let stats = cache.stats();
    // 72 live frames + 1 borrowed before eviction, and ceil(200·6/999) = 2 special pages.
    assert_eq!(stats.allocated_pages, 75);
    assert_eq!(stats.scale_pages + stats.window_pages, 72);
    assert_eq!(stats.special_pages, 2);
    assert!(stats.allocated_pages <= cfg.max_pages());
}
