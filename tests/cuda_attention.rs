//! GPU paged attention against host references on random data: exact and padded pages, page
//! sizes that tiles straddle, partial last pages, 2 and 16 heads, forced and automatic key
//! splits, the dense baseline. Skips with a printed reason where there is no GPU (CI).

mod common;

use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::attention::{AttentionShape, PagedLayer, paged_attention};
use streamrecon::backend::cuda::attention::{PagedKv, paged_attention as gpu_paged_attention};
use streamrecon::backend::cuda::{
    AttentionKernel, AttentionOptions, AttentionWorkspace, CudaDevice, DenseBaseline,
    DeviceKvCache, KvGeometry, PageTableUpload,
};
use streamrecon::backend::reference::{HostPagedKv, paged_attention_rows, relative_error};
use streamrecon::kvcache::{KvBuf, PagePlan};

const D: usize = 64;
/// bf16 inputs and output, f32 accumulation: the bound.
const TOLERANCE: f64 = 2e-2;

fn device() -> Option<CudaDevice> {
    common::gpu_device()
}

fn random_bf16(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.random_range(-scale..scale)))
        .collect()
}

struct Case {
    heads: usize,
    lq: usize,
    page_size: usize,
    /// (physical page, valid length) in attention order.
    pages: Vec<(u32, u32)>,
    splits: Option<usize>,
}

/// Runs one case on the GPU and checks it against the f64 host reference (all rows), returning
/// the relative error.
/// A device pool `[page][K|V][heads][page_size][64]` rearranged as the host store keeps pages,
/// `[page][K|V][page_size][heads][64]`.
fn token_major(pool: &[bf16], page_size: usize, heads: usize) -> Vec<bf16> {
    let plane = page_size * heads * D;
    let mut out = vec![bf16::ZERO; pool.len()];
    for (p, src) in pool.chunks_exact(plane).enumerate() {
        for h in 0..heads {
            for slot in 0..page_size {
                let from = (h * page_size + slot) * D;
                let to = p * plane + (slot * heads + h) * D;
                out[to..to + D].copy_from_slice(&src[from..from + D]);
            }
        }
    }
    out
}

fn check(dev: &CudaDevice, case: &Case, kernel: AttentionKernel, seed: u64) -> f64 {
    let (got, reference) = run_case(dev, case, kernel, seed);
    relative_error(&got, &reference)
}

/// One case on the GPU: its output and the f64 host reference, `[lq][heads][64]` each.
fn run_case(
    dev: &CudaDevice,
    case: &Case,
    kernel: AttentionKernel,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let max_pages = case
        .pages
        .iter()
        .map(|p| p.0 as usize + 1)
        .max()
        .unwrap_or(1);
    let geometry = KvGeometry {
        layers: 1,
        heads: case.heads,
        head_dim: D,
        page_size: case.page_size,
        max_pages,
    };
    let mut cache = DeviceKvCache::new(dev, geometry, 4).unwrap();
    let indices: Vec<u32> = case.pages.iter().map(|p| p.0).collect();
    let page_lens: Vec<u32> = case.pages.iter().map(|p| p.1).collect();
    cache
        .upload(
            dev,
            PageTableUpload {
                indices: &indices,
                page_lens: &page_lens,
                runs: &[],
            },
        )
        .unwrap();
    let pool = random_bf16(&mut rng, geometry.layer_elems(), 2.0);
    dev.stream
        .memcpy_htod(&pool, cache.pool_mut(0).unwrap())
        .unwrap();
    let n = case.lq * case.heads * D;
    let q_host = random_bf16(&mut rng, n, 2.0);
    let q = dev.stream.clone_htod(&q_host).unwrap();
    // Poison the output: an element the kernel never writes shows up as NaN.
    let mut out = dev.stream.clone_htod(&vec![bf16::NAN; n]).unwrap();
    let mut ws = AttentionWorkspace::new(dev, case.lq, case.heads, 1).unwrap();
    let kv = PagedKv {
        pool: cache.pool(0).unwrap().as_view(),
        page_size: case.page_size as u32,
        indices: cache.indices(),
        cum: cache.cum(),
        n_pages: cache.n_pages_on_device(),
        kv_len: cache.kv_len(),
    };
    gpu_paged_attention(
        dev,
        &q,
        &mut out,
        &kv,
        case.lq,
        case.heads,
        AttentionOptions {
            splits: case.splits,
            kernel: Some(kernel),
        },
        &mut ws,
    )
    .unwrap();
    let got: Vec<f32> = dev
        .stream
        .clone_dtoh(&out)
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();
    let rows: Vec<usize> = (0..case.lq).collect();
    let reference = paged_attention_rows(
        &q_host,
        &HostPagedKv {
            pool: &pool,
            page_size: case.page_size,
            heads: case.heads,
            head_dim: D,
            indices: &indices,
            page_lens: &page_lens,
        },
        &rows,
    );
    (got, reference)
}

#[test]
fn paged_attention_matches_reference() {
    let Some(dev) = device() else { return };
    let full = |ids: &[u32], size: u32| ids.iter().map(|&p| (p, size)).collect::<Vec<_>>();
    let mut cases = vec![
        // Tiny fixture shape: 2 heads, a page size no tile aligns with, partial last page.
        Case {
            heads: 2,
            lq: 37,
            page_size: 13,
            pages: [full(&[4, 0, 7, 2], 13), vec![(5, 6)]].concat(),
            splits: None,
        },
        // One key only.
        Case {
            heads: 2,
            lq: 5,
            page_size: 13,
            pages: vec![(1, 1)],
            splits: None,
        },
        // Padded pages: every patch page ends in masked padding.
        Case {
            heads: 2,
            lq: 130,
            page_size: 64,
            pages: [full(&[3, 1, 0], 50), vec![(2, 17)]].concat(),
            splits: Some(2),
        },
        // The real page size with 16 heads, forced split counts including more splits than SMs want.
        Case {
            heads: 16,
            lq: 300,
            page_size: 999,
            pages: [full(&[2, 0], 999), vec![(1, 18)]].concat(),
            splits: Some(1),
        },
        Case {
            heads: 16,
            lq: 300,
            page_size: 999,
            pages: [full(&[2, 0], 999), vec![(1, 18)]].concat(),
            splits: Some(5),
        },
    ];
    cases.push(Case {
        heads: 16,
        lq: 1005,
        page_size: 999,
        pages: [full(&[3, 1, 0], 999), vec![(2, 24)]].concat(),
        splits: None,
    });
    // A long sequence in shuffled pages with padded slots: the warp-specialised kernel's K/V ring
    // (six stages) wraps many times in every split, and the last split ends mid-tile.
    cases.push(Case {
        heads: 16,
        lq: 300,
        page_size: 1024,
        pages: [
            full(&[9, 2, 11, 0, 5, 7, 1, 10, 3, 6, 8], 999),
            vec![(4, 517)],
        ]
        .concat(),
        splits: Some(3),
    });
    // Every kernel the GPU has (the wgmma ones are Hopper-only).
    // Diagnostic variants (wrong results by design) are for timing only.
    for kernel in AttentionKernel::available(&dev)
        .into_iter()
        .filter(|k| k.exact())
    {
        for (i, case) in cases.iter().enumerate() {
            let err = check(&dev, case, kernel, 100 + i as u64);
            eprintln!(
                "{kernel:?} case {i}: heads {} lq {} page {} pages {} splits {:?}: rel err {err:.2e}",
                case.heads,
                case.lq,
                case.page_size,
                case.pages.len(),
                case.splits
            );
            assert!(
                err <= TOLERANCE,
                "{kernel:?} case {i}: relative error {err} > {TOLERANCE}"
            );
        }
    }
}

/// The GPU agrees with the crate's own CPU paged attention (`streamrecon::attention`), and the
/// dense baseline agrees with the paged kernel.
#[test]
fn matches_cpu_attention_and_dense_baseline() {
    let Some(dev) = device() else { return };
    let mut rng = StdRng::seed_from_u64(7);
    let (heads, lq, page_size) = (16usize, 200usize, 999usize);
    let indices = vec![1u32, 3, 0];
    let page_lens = vec![999u32, 999, 42];
    let geometry = KvGeometry {
        layers: 1,
        heads,
        head_dim: D,
        page_size,
        max_pages: 4,
    };
    let mut cache = DeviceKvCache::new(&dev, geometry, 4).unwrap();
    cache
        .upload(
            &dev,
            PageTableUpload {
                indices: &indices,
                page_lens: &page_lens,
                runs: &[],
            },
        )
        .unwrap();
    let pool = random_bf16(&mut rng, geometry.layer_elems(), 1.5);
    dev.stream
        .memcpy_htod(&pool, cache.pool_mut(0).unwrap())
        .unwrap();
    let q_host = random_bf16(&mut rng, lq * heads * D, 1.5);
    let q = dev.stream.clone_htod(&q_host).unwrap();
    let mut out = dev.stream.alloc_zeros::<bf16>(lq * heads * D).unwrap();
    let mut ws = AttentionWorkspace::new(&dev, lq, heads, 8).unwrap();
    streamrecon::backend::cuda::attention::cache_attention(
        &dev,
        &cache,
        0,
        &q,
        &mut out,
        lq,
        AttentionOptions::default(),
        &mut ws,
    )
    .unwrap();
    let paged: Vec<f32> = dev
        .stream
        .clone_dtoh(&out)
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();

    let plan = PagePlan {
        page_size: page_size as u32,
        indices: indices.clone(),
        indptr: vec![0, indices.len() as u32],
        last_page_len: 42,
        page_lens: page_lens.clone(),
    };
    // The host store keeps a page token-major ([K|V][page_size][heads][64]); the device pool is
    // head-major ([K|V][heads][page_size][64]).
    let data = KvBuf::Bf16(token_major(&pool, page_size, heads));
    let q_f32: Vec<f32> = q_host.iter().map(|x| x.to_f32()).collect();
    let mut cpu = vec![0f32; q_f32.len()];
    paged_attention(
        AttentionShape { heads, head_dim: D },
        &q_f32,
        PagedLayer {
            data: &data,
            page_elems: page_size * heads * D,
        },
        &plan,
        &mut cpu,
    )
    .unwrap();
    let err = relative_error(&paged, &cpu);
    eprintln!("gpu paged vs cpu paged: {err:.2e}");
    assert!(err <= TOLERANCE, "gpu vs cpu attention: {err}");

    let mut dense = DenseBaseline::new(&dev, 999 * 2 + 42, heads).unwrap();
    let mut out_dense = dev
        .stream
        .clone_htod(&vec![bf16::NAN; lq * heads * D])
        .unwrap();
    dense.concat(&dev, &cache, 0).unwrap();
    dense
        .attend(
            &dev,
            heads,
            &q,
            &mut out_dense,
            lq,
            AttentionOptions {
                splits: Some(3),
                kernel: None,
            },
            &mut ws,
        )
        .unwrap();
    let dense_out: Vec<f32> = dev
        .stream
        .clone_dtoh(&out_dense)
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();
    let err = relative_error(&dense_out, &cpu);
    eprintln!("gpu dense vs cpu paged: {err:.2e}");
    assert!(err <= TOLERANCE, "dense baseline vs cpu attention: {err}");
}

/// The tail-split kernel (ws_m192t, always 3 key splits whatever is asked): tail mode (a last
/// query tile of 1..64 rows: 1005 = 5 x 192 + 45, exactly 64, a single tile under 64), normal
/// mode (a last tile of 65 rows, whole tiles), key ranges of 1 to 4 key tiles of 128 (consumers
/// without a tile in tail mode, empty splits in normal mode), ragged pages of 999, and a long
/// sequence where the ring wraps many times. A deadlock (the turn protocol or the one-consumer
/// `empty` barriers) would hang the launch: a watchdog ends the process after 300 s instead.
#[test]
fn m192_tail_split_matches_reference() {
    let Some(dev) = device() else { return };
    // The cp.async tail kernel and its TMA twin (page-aligned tiles: one per page here, often).
    let kernels: Vec<AttentionKernel> = [
        AttentionKernel::WgmmaWsM192Tail,
        AttentionKernel::WgmmaWsM192TailTma,
    ]
    .into_iter()
    .filter(|k| AttentionKernel::available(&dev).contains(k))
    .collect();
    if kernels.is_empty() {
        eprintln!("skipped: the tail-split kernels need sm_90a");
        return;
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..300 {
                std::thread::sleep(std::time::Duration::from_secs(1));
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
            }
            eprintln!("m192_tail_split_matches_reference: no result after 300 s (deadlock?)");
            std::process::exit(101);
        });
    }
    let full = |ids: &[u32], size: u32| ids.iter().map(|&p| (p, size)).collect::<Vec<_>>();
    // Key layouts in pages of 999 (tiles of 128 keys: 1, 1, 2, 2, 3, 4, 4, 12).
    let keys: Vec<Vec<(u32, u32)>> = vec![
        vec![(1, 1)],
        vec![(2, 100)],
        vec![(1, 37), (0, 92)],
        vec![(2, 256)],
        vec![(0, 120), (2, 180)],
        vec![(3, 250), (1, 250)],
        vec![(1, 512)],
        vec![(2, 999), (0, 500)],
    ];
    let mut cases = Vec::new();
    for (i, pages) in keys.iter().enumerate() {
        // 1005 (tail of 45), 256 (tail of 64), 257 (last tile of 65: normal mode), 40 and 1
        // (one tail tile), 384 (whole tiles only), 193 (one full tile and a tail of 1 row; the
        // block index remap puts the tail CTAs first).
        for (j, lq) in [1005usize, 256, 257, 40, 1, 384, 193]
            .into_iter()
            .enumerate()
        {
            cases.push(Case {
                heads: 2,
                lq,
                page_size: 999,
                pages: pages.clone(),
                // Asked-for counts are overridden (3 splits).
                splits: [None, Some(1), Some(4)][(i + j) % 3],
            });
        }
    }
    // The steady-state shape: 16 heads, 1005 queries.
    cases.push(Case {
        heads: 16,
        lq: 1005,
        page_size: 999,
        pages: [full(&[3, 1, 0], 999), vec![(2, 24)]].concat(),
        splits: None,
    });
    cases.push(Case {
        heads: 16,
        lq: 1005,
        page_size: 999,
        pages: vec![(0, 300)],
        splits: Some(1),
    });
    // A long sequence in shuffled padded pages: the ring wraps many times, every third tile per
    // consumer in the tail tile; the last tile ends mid-tile.
    cases.push(Case {
        heads: 2,
        lq: 1005,
        page_size: 1024,
        pages: [
            full(&[9, 2, 11, 0, 5, 7, 1, 10, 3, 6, 8], 999),
            vec![(4, 517)],
        ]
        .concat(),
        splits: None,
    });
    cases.push(Case {
        heads: 16,
        lq: 64,
        page_size: 1024,
        pages: [
            full(&[9, 2, 11, 0, 5, 7, 1, 10, 3, 6, 8], 999),
            vec![(4, 517)],
        ]
        .concat(),
        splits: None,
    });
    for (kernel, (i, case)) in kernels
        .iter()
        .copied()
        .flat_map(|k| cases.iter().enumerate().map(move |c| (k, c)))
    {
        let (got, reference) = run_case(&dev, case, kernel, 500 + i as u64);
        let err = relative_error(&got, &reference);
        // The last query tile on its own too (in tail mode a small share of all rows).
        let tail_from = (case.lq - 1) / 192 * 192 * case.heads * D;
        let tail_err = relative_error(&got[tail_from..], &reference[tail_from..]);
        eprintln!(
            "{kernel:?} tail case {i}: heads {} lq {} page {} keys {} splits {:?}: rel err {err:.2e}, last tile {tail_err:.2e}",
            case.heads,
            case.lq,
            case.page_size,
            case.pages.iter().map(|p| p.1).sum::<u32>(),
            case.splits
        );
        assert!(
            err <= TOLERANCE && tail_err <= TOLERANCE,
            "{kernel:?} tail case {i}: relative error {err}, last tile {tail_err} > {TOLERANCE}"
        );
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
}
