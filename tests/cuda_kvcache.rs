//! The device page table and K/V pools follow the host bookkeeping (`kvcache::PageTable`) step by
//! step: writes land in the planned pages and slots, the device table equals the plan, attention
//! over the device pool matches the host reference, and non-keyframe rollbacks leave nothing
//! visible. Skips with a printed reason where there is no GPU (CI).

mod common;

use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::backend::cuda::kv::cache_attention;
use streamrecon::backend::cuda::{
    AttentionOptions, AttentionWorkspace, CudaDevice, DeviceKvCache, KvGeometry,
};
use streamrecon::backend::reference::{HostPagedKv, paged_attention_rows, relative_error};
use streamrecon::kvcache::{CacheConfig, PageTable, StepKind, StepPlan, StorageDtype};

const D: usize = streamrecon::model::spec::HEAD_DIM;

fn device() -> Option<CudaDevice> {
    common::gpu_device()
}

/// Applies a step's writes to a host mirror of the pool (`[page][K|V][heads][page_size][64]`),
/// exactly as the kernel should, from K and V `[tokens][heads][64]`.
fn mirror_writes(mirror: &mut [bf16], g: &KvGeometry, step: &StepPlan, k: &[bf16], v: &[bf16]) {
    let head = g.page_size * D;
    let v_off = g.heads * head;
    for r in &step.writes {
        for t in 0..r.len as usize {
            for h in 0..g.heads {
                let src = ((r.src_token as usize + t) * g.heads + h) * D;
                let dst = r.page as usize * 2 * v_off + h * head + (r.slot as usize + t) * D;
                mirror[dst..dst + D].copy_from_slice(&k[src..src + D]);
                mirror[dst + v_off..dst + v_off + D].copy_from_slice(&v[src..src + D]);
            }
        }
    }
}

/// One frame step on both sides; returns the attention relative error.
fn run_step(
    dev: &CudaDevice,
    table: &mut PageTable,
    cache: &mut DeviceKvCache,
    mirror: &mut [bf16],
    frames: std::ops::Range<u64>,
    kind: StepKind,
    rng: &mut StdRng,
) -> f64 {
    let g = *cache.geometry();
    let tokens_per_frame = table.config().tokens_per_frame();
    let step = table.begin_step(frames.clone(), kind).unwrap().clone();
    let tokens = (frames.end - frames.start) as usize * tokens_per_frame;
    let n = tokens * g.heads * D;
    let k: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-2.0..2.0)))
        .collect();
    let v: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-2.0..2.0)))
        .collect();
    let q: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-2.0..2.0)))
        .collect();

    cache.upload_step(dev, &step).unwrap();
    let (kd, vd, qd) = (
        dev.stream.clone_htod(&k).unwrap(),
        dev.stream.clone_htod(&v).unwrap(),
        dev.stream.clone_htod(&q).unwrap(),
    );
    cache.write_layer(dev, 0, &kd, &vd, tokens).unwrap();
    mirror_writes(mirror, &g, &step, &k, &v);

    // The device table is the plan.
    let (indices, cum) = cache.download_table(dev).unwrap();
    assert_eq!(indices, step.plan.indices, "device page ids != plan");
    let mut expect_cum = vec![0u32];
    for l in &step.plan.page_lens {
        expect_cum.push(expect_cum.last().unwrap() + l);
    }
    assert_eq!(cum, expect_cum, "device prefix sums != plan page lengths");
    let runs = cache.download_runs(dev).unwrap();
    let expect_runs: Vec<u32> = step
        .writes
        .iter()
        .flat_map(|r| [r.src_token, r.page, r.slot, r.len])
        .collect();
    assert_eq!(runs, expect_runs, "device runs != plan writes");

    // Every page the plan shows holds exactly what the mirror holds (valid slots only).
    let pool = dev.stream.clone_dtoh(cache.pool(0).unwrap()).unwrap();
    for (&p, &len) in step.plan.indices.iter().zip(&step.plan.page_lens) {
        for kv in 0..2 {
            for h in 0..g.heads {
                let base = ((p as usize * 2 + kv) * g.heads + h) * g.page_size * D;
                let valid = base..base + len as usize * D;
                assert!(
                    pool[valid.clone()] == mirror[valid],
                    "page {p} ({}, head {h}) differs from the host mirror",
                    if kv == 0 { "K" } else { "V" }
                );
            }
        }
    }

    let mut out = dev.stream.clone_htod(&vec![bf16::NAN; n]).unwrap();
    let mut ws = AttentionWorkspace::new(dev, tokens, g.heads, 4).unwrap();
    cache_attention(
        dev,
        cache,
        0,
        &qd,
        &mut out,
        tokens,
        AttentionOptions::default(),
        &mut ws,
    )
    .unwrap();
    let got = common::bf16_to_host_f32(dev, &out);
    let rows: Vec<usize> = (0..tokens).collect();
    let reference = paged_attention_rows(
        &q,
        &HostPagedKv {
            pool: mirror,
            page_size: g.page_size,
            heads: g.heads,
            head_dim: D,
            indices: &step.plan.indices,
            page_lens: &step.plan.page_lens,
        },
        &rows,
    );
    table.end_step().unwrap();
    relative_error(&got, &reference)
}

fn stream_test(page_size: Option<usize>) {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(11);
    // Tiny geometry: 2 heads, 37 patches per frame, 2 scale frames, a window of 3.
    let mut cfg = CacheConfig::new(1, 2, D, 37, 2, 3);
    cfg.page_size = page_size;
    cfg.dtype = StorageDtype::Bf16;
    let mut table = PageTable::new(cfg).unwrap();
    let g = KvGeometry::for_table(&table);
    let mut cache = DeviceKvCache::new(&dev, g, 8).unwrap();
    let mut mirror = vec![bf16::ZERO; g.layer_elems()];

    // Phase 1: two scale frames in one step; then keyframes and non-keyframes, past the window.
    let mut steps: Vec<(std::ops::Range<u64>, StepKind)> = vec![(0..2, StepKind::Keyframe)];
    let mut next = 2u64;
    for i in 0..12 {
        if i % 3 == 2 {
            steps.push((next..next + 1, StepKind::NonKeyframe));
            next += 1; // the rolled-back frame's index is not reused
        } else {
            steps.push((next..next + 1, StepKind::Keyframe));
            next += 1;
        }
    }
    for (frames, kind) in steps {
        let before = table.committed_frames();
        let err = run_step(
            &dev,
            &mut table,
            &mut cache,
            &mut mirror,
            frames.clone(),
            kind,
            &mut rng,
        );
        eprintln!("step {frames:?} {kind:?}: rel err {err:.2e}");
        assert!(err <= 2e-2, "step {frames:?}: relative error {err}");
        if kind == StepKind::NonKeyframe {
            assert_eq!(
                table.committed_frames(),
                before,
                "a non-keyframe must roll back"
            );
        }
    }
}

#[test]
fn device_cache_follows_page_table_exact_pages() {
    stream_test(None);
}

#[test]
fn device_cache_follows_page_table_padded_pages() {
    stream_test(Some(16));
}
