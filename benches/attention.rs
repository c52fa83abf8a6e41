//! CPU time of one frame step of global attention, paged against dense, as the stream grows.
//!
//! Geometry: the model's 16 heads would make one step take seconds on a laptop CPU, so the
//! bench keeps head_dim 64 and the cache rules (8 scale frames, window 64, 6 special tokens) but
//! uses 2 heads, 4 layers and 134 tokens per frame. Each measured step is a non-keyframe (append,
//! attend on every layer, roll back), so the cache is the same at every iteration.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::attention::{AttentionLayout, CpuKvCache};
use streamrecon::kvcache::{CacheConfig, StepKind};
use streamrecon::model::spec::{HEAD_DIM, frame_tokens};

const LAYERS: usize = 4;
const HEADS: usize = 2;
const PATCHES: usize = 128;

fn config(window: usize) -> CacheConfig {
    CacheConfig::new(LAYERS, HEADS, HEAD_DIM, PATCHES, 8, window)
}

/// A cache that has seen `seen` frames (all keyframes) with random K/V.
fn filled(layout: AttentionLayout, window: usize, seen: u64, kv: &[f32]) -> CpuKvCache {
    let cfg = config(window);
    let tpf = cfg.tokens_per_frame() * HEADS * HEAD_DIM;
    let mut cache = CpuKvCache::new(cfg, layout).expect("bench config is valid");
    let phase1 = 8.min(seen);
    cache
        .begin_step(0..phase1, StepKind::Keyframe)
        .expect("phase 1");
    for layer in 0..LAYERS {
        let n = phase1 as usize * tpf;
        cache.write_layer(layer, &kv[..n], &kv[..n]).expect("write");
    }
    cache.end_step().expect("end");
    for f in phase1..seen {
        cache
            .begin_step(f..f + 1, StepKind::Keyframe)
            .expect("keyframe");
        for layer in 0..LAYERS {
            cache
                .write_layer(layer, &kv[..tpf], &kv[..tpf])
                .expect("write");
        }
        cache.end_step().expect("end");
    }
    cache
}

fn frame_step(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(7);
    let tpf = frame_tokens(PATCHES) * HEADS * HEAD_DIM;
    let kv: Vec<f32> = (0..8 * tpf).map(|_| rng.random_range(-1.0..1.0)).collect();
    let q: Vec<f32> = (0..tpf).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut group = c.benchmark_group("frame_step");
    group.sample_size(10);
    // (live frames, frames seen): the window filling up, then the trajectory memory growing.
    for (live, seen) in [(8usize, 8u64), (24, 24), (72, 72), (72, 1000), (72, 4000)] {
        let window = live.saturating_sub(8).max(1);
        for layout in [AttentionLayout::Paged, AttentionLayout::Dense] {
            let mut cache = filled(layout, window, seen, &kv);
            let mut out = vec![0f32; tpf];
            let mut next = seen;
            group.bench_with_input(
                BenchmarkId::new(layout.to_string(), format!("{live}live_{seen}seen")),
                &live,
                |b, _| {
                    b.iter(|| {
                        cache
                            .begin_step(next..next + 1, StepKind::NonKeyframe)
                            .expect("step");
                        for layer in 0..LAYERS {
                            cache
                                .write_layer(layer, &kv[..tpf], &kv[..tpf])
                                .expect("write");
                            cache.attend_layer(layer, &q, &mut out).expect("attend");
                        }
                        cache.end_step().expect("end");
                        next += 1;
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, frame_step);
criterion_main!(benches);
