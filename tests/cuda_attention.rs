//! GPU paged attention against host references on random data: exact and padded pages, page
//! sizes that tiles straddle, partial last pages, 2 and 16 heads, forced and automatic key
//! splits, the dense baseline. Skips with a printed reason where there is no GPU (CI).

mod common;

use half::bf16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use streamrecon::attention::{AttentionShape, PagedLayer, ScoreBound, Softmax, paged_attention};
use streamrecon::backend::cuda::attention::{PagedKv, paged_attention as gpu_paged_attention};
use streamrecon::backend::cuda::{
    AttentionKernel, AttentionOptions, AttentionWorkspace, CudaDevice, DenseBaseline,
    DeviceKvCache, KvGeometry, PageTableUpload,
};
use streamrecon::backend::reference::{
    HostPagedKv, paged_attention_rows, paged_attention_rows_scaled, relative_error,
};
use streamrecon::kvcache::{KvBuf, PagePlan};

const D: usize = streamrecon::model::spec::HEAD_DIM;
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
    run_rounds(
        dev,
        case,
        kernel,
        seed,
        DATA_SCALE,
        &Queries::Plain,
        &[case.splits],
    )
    .pop()
    .map(|r| (r.got, r.reference))
    .unwrap()
}

/// One launch's output, its f64 host reference (`[lq][heads][64]` each) and the softmax it ran.
struct Round {
    got: Vec<f32>,
    reference: Vec<f32>,
    softmax: Softmax,
}

/// What the queries of a run are, and so which softmax it asks for.
enum Queries {
    /// Plain queries: the softmax their data's bound allows (`data_softmax`).
    Plain,
    /// Queries already in the log2 domain (the reference takes `q·k · ln 2`), with this softmax.
    Log2(Softmax),
}

/// Queries, keys and values uniform in `[-DATA_SCALE, DATA_SCALE)`.
const DATA_SCALE: f32 = 2.0;

/// The softmax a launch over these queries and this pool may use: the longest query and the
/// longest pool vector (keys and values, a bound of the keys) bound every score, as a layer's
/// qk-norm does in the model.
fn data_softmax(q: &[bf16], pool: &[bf16]) -> Softmax {
    ScoreBound::from_head_vectors(q, pool, D).softmax()
}

/// Three pages of 999 slots out of order, the last one partial: 2,405 keys, `lq` queries.
fn three_pages(lq: usize) -> Case {
    Case {
        heads: 16,
        lq,
        page_size: 999,
        pages: vec![(2, 999), (0, 999), (1, 407)],
        splits: None,
    }
}

/// One launch per entry of `rounds` (its split count), each with new random queries, against
/// the same keys, output buffer and workspace.
fn run_rounds(
    dev: &CudaDevice,
    case: &Case,
    kernel: AttentionKernel,
    seed: u64,
    data_scale: f32,
    queries: &Queries,
    rounds: &[Option<usize>],
) -> Vec<Round> {
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
    let pool = random_bf16(&mut rng, geometry.layer_elems(), data_scale);
    dev.stream
        .memcpy_htod(&pool, cache.pool_mut(0).unwrap())
        .unwrap();
    let n = case.lq * case.heads * D;
    let mut ws = AttentionWorkspace::new(dev, case.lq, case.heads, 1).unwrap();
    // Poison the output: an element the kernel never writes shows up as NaN.
    let mut out = dev.stream.clone_htod(&vec![bf16::NAN; n]).unwrap();
    let mut results = Vec::new();
    for &splits in rounds {
        let q_host = random_bf16(&mut rng, n, data_scale);
        let q = dev.stream.clone_htod(&q_host).unwrap();
        let (softmax, ref_scale) = match queries {
            Queries::Plain => (data_softmax(&q_host, &pool), 1.0 / (D as f64).sqrt()),
            Queries::Log2(softmax) => (*softmax, std::f64::consts::LN_2),
        };
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
                splits,
                kernel: Some(kernel),
                softmax,
            },
            &mut ws,
        )
        .unwrap();
        let got = common::bf16_to_host_f32(dev, &out);
        let rows: Vec<usize> = (0..case.lq).collect();
        let reference = paged_attention_rows_scaled(
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
            ref_scale,
        );
        results.push(Round {
            got,
            reference,
            softmax,
        });
    }
    results
}

/// The warp-specialised kernels merge their key splits themselves: the last split to finish a
/// warp's rows takes the last ticket and writes them, then sets the ticket back to zero. Launches
/// one after another on the same workspace, with new queries and changing split counts, must
/// each be right: a ticket left over would make no split (or the wrong one) merge, and the rows
/// would keep the previous launch's output.
#[test]
fn split_merges_are_right_launch_after_launch() {
    let Some(dev) = device() else { return };
    let case = three_pages(1005);
    let rounds = [Some(2), Some(2), Some(3), Some(1), Some(4), Some(2)];
    for kernel in AttentionKernel::available(&dev) {
        for (i, r) in run_rounds(&dev, &case, kernel, 7, DATA_SCALE, &Queries::Plain, &rounds)
            .iter()
            .enumerate()
        {
            let err = relative_error(&r.got, &r.reference);
            eprintln!(
                "{kernel:?} round {i} ({:?} splits): rel err {err:.2e}",
                rounds[i]
            );
            assert!(
                err <= TOLERANCE,
                "{kernel:?} round {i} ({:?} splits): relative error {err} > {TOLERANCE}",
                rounds[i]
            );
        }
    }
}

/// The bounded kernel's fixed softmax offset across the range a bound allows: scores near zero
/// (offset 0), and queries and keys long enough that the bound is close to its limit (offset
/// about 18, rows' largest scores near 25): as accurate as the running maximum on the same data.
#[test]
fn fixed_softmax_offset_is_as_accurate_as_the_running_maximum() {
    let Some(dev) = device() else { return };
    let available = AttentionKernel::available(&dev);
    if !available.contains(&AttentionKernel::WgmmaWsM256Bounded) {
        eprintln!("skipping: the bounded kernel is built for Hopper (sm_90a) alone");
        return;
    }
    let case = three_pages(300);
    for (scale, seed) in [(DATA_SCALE, 11), (3.0, 12), (3.6, 13)] {
        // Both kernels see the same data (the same seed); the bounded one must have been given
        // a fixed offset by the data's bound, or this would test the running maximum twice.
        let run = |kernel| {
            run_rounds(&dev, &case, kernel, seed, scale, &Queries::Plain, &[None])
                .pop()
                .unwrap()
        };
        let (online, bounded) = (
            run(AttentionKernel::WgmmaWsM256),
            run(AttentionKernel::WgmmaWsM256Bounded),
        );
        let softmax = bounded.softmax;
        assert!(
            matches!(softmax, Softmax::FixedOffset(_)),
            "data scale {scale}: {softmax:?}, the bound admits no fixed offset"
        );
        let online = relative_error(&online.got, &online.reference);
        let fixed = relative_error(&bounded.got, &bounded.reference);
        eprintln!(
            "data scale {scale}: {softmax:?}, rel err {fixed:.2e} (running maximum {online:.2e})"
        );
        assert!(
            fixed <= (1.5 * online).max(3e-3),
            "data scale {scale} ({softmax:?}): rel err {fixed} against {online} with the running maximum"
        );
    }
}

/// Queries already in the log2 domain (the model folds log2(e)/8 into the global blocks'
/// q-norm): the bounded kernel's own entry for offset 0, its fixed-offset entry with an offset,
/// and every other kernel (their online softmax with the scale 1) against the f64 softmax of
/// `2^(q·k)`, with one key split and several.
#[test]
fn log2_domain_queries_match_the_reference() {
    let Some(dev) = device() else { return };
    let case = three_pages(300);
    // Values in [-1, 1): vectors of 64 are shorter than 8, so |q·k| < 64, the exponents an
    // offset of 0 allows (here the scores are the exponents).
    let scale = 1.0;
    for kernel in AttentionKernel::available(&dev) {
        let offsets: &[f32] = if kernel == AttentionKernel::WgmmaWsM256Bounded {
            &[0.0, 6.0]
        } else {
            &[0.0]
        };
        for &offset in offsets {
            let queries = Queries::Log2(Softmax::Log2Queries { offset });
            for (i, r) in run_rounds(&dev, &case, kernel, 21, scale, &queries, &[None, Some(3)])
                .iter()
                .enumerate()
            {
                let err = relative_error(&r.got, &r.reference);
                eprintln!("{kernel:?} log2 queries, offset {offset}, round {i}: rel err {err:.2e}");
                assert!(
                    err <= 3e-3,
                    "{kernel:?} log2 queries, offset {offset}, round {i}: relative error {err}"
                );
            }
        }
    }
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
    // A 4:3 frame's 1042 tokens (518x392): the four-consumer kernel's fifth query tile holds 18
    // rows, so three of its consumers have no rows and leave, and its CTAs run after every full
    // tile's (ws_tile's order, with the output tickets by query tile); eight key splits merge in
    // the kernel with the tail tile's lone consumer among them.
    cases.push(Case {
        heads: 16,
        lq: 1042,
        page_size: 1042,
        pages: [full(&[3, 1, 0], 1042), vec![(2, 60)]].concat(),
        splits: Some(8),
    });
    // The same as the GPU model runs it: the full tiles in the chooser's two splits, the lone
    // tail tile in eight of its own (extra grid columns after the full tiles'). The cases of 300
    // queries above have a lone tail of 44 rows too: with one split (the full tile writes bf16,
    // the tail merges eight), five and three (the tail in five and six).
    cases.push(Case {
        heads: 16,
        lq: 1042,
        page_size: 1042,
        pages: [full(&[3, 1, 0], 1042), vec![(2, 60)]].concat(),
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
    for kernel in AttentionKernel::available(&dev) {
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
    streamrecon::backend::cuda::kv::cache_attention(
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
    let paged = common::bf16_to_host_f32(&dev, &out);

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
                softmax: Softmax::RunningMax,
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

/// DINO's frame-local attention read straight from the q/k/v GEMM's output
/// (`frame_attention_from_qkv`) gives the bits of the split-then-attend path: the same kernel
/// over K/V copied into a pool, per frame, and matches the host reference.
#[test]
fn frame_attention_from_qkv_equals_the_split_path() {
    use streamrecon::backend::cuda::arena::DevPtr;
    use streamrecon::backend::cuda::attention::{
        frame_attention_from_qkv, has_frame_attention_from_qkv,
    };
    use streamrecon::gpu_model::transformer::local_tables;
    let Some(dev) = device() else { return };
    if !has_frame_attention_from_qkv(&dev) {
        eprintln!("skipping: the q/k/v-reading kernel is built for Hopper (sm_90a) alone");
        return;
    }
    let (frames, tokens, heads) = (2usize, 1005usize, 16usize);
    let width = heads * D;
    let mut rng = StdRng::seed_from_u64(31);
    let qkv_host = random_bf16(&mut rng, frames * tokens * 3 * width, 2.0);
    let qkv = dev.stream.clone_htod(&qkv_host).unwrap();
    let tables = dev
        .stream
        .clone_htod(&local_tables(frames, tokens))
        .unwrap();
    let out = dev
        .stream
        .clone_htod(&vec![bf16::NAN; frames * tokens * width])
        .unwrap();
    let words = tables.len() / frames;
    for f in 0..frames {
        let table = DevPtr::of(&tables).slice(words * f, words).unwrap();
        frame_attention_from_qkv(
            &dev,
            DevPtr::of(&qkv),
            f,
            DevPtr::of(&out)
                .slice(f * tokens * width, tokens * width)
                .unwrap(),
            table.slice(2, 1).unwrap(),
            table.slice(3, 2).unwrap(),
            table.slice(0, 1).unwrap(),
            tokens,
            heads,
        )
        .unwrap();
    }
    let got = dev.stream.clone_dtoh(&out).unwrap();

    // The split path: each frame's K/V as one page of a pool, its q rows, the same kernel.
    let geometry = KvGeometry {
        layers: 1,
        heads,
        head_dim: D,
        page_size: tokens,
        max_pages: 1,
    };
    for f in 0..frames {
        let row = |t: usize| &qkv_host[(f * tokens + t) * 3 * width..][..3 * width];
        let q_host: Vec<bf16> = (0..tokens).flat_map(|t| row(t)[..width].to_vec()).collect();
        let mut pool = vec![bf16::ZERO; geometry.layer_elems()];
        for (part, base) in [(0usize, width), (1, 2 * width)] {
            for h in 0..heads {
                for t in 0..tokens {
                    let to = ((part * heads + h) * tokens + t) * D;
                    pool[to..to + D].copy_from_slice(&row(t)[base + h * D..][..D]);
                }
            }
        }
        let mut cache = DeviceKvCache::new(&dev, geometry, 1).unwrap();
        cache
            .upload(
                &dev,
                PageTableUpload {
                    indices: &[0],
                    page_lens: &[tokens as u32],
                    runs: &[],
                },
            )
            .unwrap();
        dev.stream
            .memcpy_htod(&pool, cache.pool_mut(0).unwrap())
            .unwrap();
        let q = dev.stream.clone_htod(&q_host).unwrap();
        let mut split_out = dev.stream.alloc_zeros::<bf16>(tokens * width).unwrap();
        let mut ws = AttentionWorkspace::new(&dev, tokens, heads, 1).unwrap();
        let kv = PagedKv {
            pool: cache.pool(0).unwrap().as_view(),
            page_size: tokens as u32,
            indices: cache.indices(),
            cum: cache.cum(),
            n_pages: cache.n_pages_on_device(),
            kv_len: cache.kv_len(),
        };
        gpu_paged_attention(
            &dev,
            &q,
            &mut split_out,
            &kv,
            tokens,
            heads,
            AttentionOptions {
                splits: Some(1),
                kernel: Some(AttentionKernel::WgmmaWs),
                softmax: Softmax::RunningMax,
            },
            &mut ws,
        )
        .unwrap();
        let split_out = dev.stream.clone_dtoh(&split_out).unwrap();
        let mine = &got[f * tokens * width..][..tokens * width];
        assert!(
            mine.iter()
                .zip(&split_out)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "frame {f}: the q/k/v-reading kernel and the split path differ"
        );
        let reference = paged_attention_rows(
            &q_host,
            &HostPagedKv {
                pool: &pool,
                page_size: tokens,
                heads,
                head_dim: D,
                indices: &[0],
                page_lens: &[tokens as u32],
            },
            &(0..tokens).collect::<Vec<_>>(),
        );
        let mine: Vec<f32> = mine.iter().map(|x| x.to_f32()).collect();
        let err = relative_error(&mine, &reference);
        eprintln!("frame {f}: q/k/v-reading kernel rel err {err:.2e}, bit-equal to the split path");
        assert!(err <= TOLERANCE, "frame {f}: relative error {err}");
    }
}

/// Two sets of queries in one launch, each over its own page table (the two frames of a
/// two-frame step: `DeviceKvCache::upload_pair`, `paged_attention_views_raw`): every
/// warp-specialised kernel, one key split and several (the second view's partials and merge
/// tickets follow the first's; with four consumers the 44-row last tile of each view takes four
/// or three splits of its own), each view against the f64 reference over its own keys only.
/// Launches repeat on one workspace, so a ticket left behind by either view would show.
#[test]
fn two_key_views_in_one_launch_each_see_their_own_keys() {
    use streamrecon::backend::cuda::arena::DevPtr;
    use streamrecon::backend::cuda::attention::{
        KeyViews, RawWorkspace, paged_attention_views_raw,
    };
    use streamrecon::kvcache::{PairPlan, StepKind, StepPlan};
    let Some(dev) = device() else { return };
    let (heads, lq, page_size) = (16usize, 300usize, 256usize);
    // View 1 sees one page more than view 0 (the first frame's), less one (an eviction), and a
    // longer last page (the special tokens the first frame added).
    let views: [Vec<(u32, u32)>; 2] = [
        vec![(0, 256), (2, 256), (4, 256), (5, 40)],
        vec![(2, 256), (4, 256), (6, 256), (5, 46)],
    ];
    let geometry = KvGeometry {
        layers: 1,
        heads,
        head_dim: D,
        page_size,
        max_pages: 8,
    };
    let mut cache = DeviceKvCache::new(&dev, geometry, 4).unwrap();
    let plan_of = |pages: &[(u32, u32)]| PagePlan {
        page_size: page_size as u32,
        indices: pages.iter().map(|p| p.0).collect(),
        indptr: vec![0, pages.len() as u32],
        last_page_len: pages.last().map_or(0, |p| p.1),
        page_lens: pages.iter().map(|p| p.1).collect(),
    };
    let pair = PairPlan {
        frames: [0, 1],
        kinds: [StepKind::Keyframe; 2],
        steps: [StepPlan::default(), StepPlan::default()],
        views: [plan_of(&views[0]), plan_of(&views[1])],
        writes: Vec::new(),
        committed_before: [0, 1],
        events: Vec::new(),
    };
    cache.upload_pair(&dev, &pair).unwrap();
    let mut rng = StdRng::seed_from_u64(41);
    let pool = random_bf16(&mut rng, geometry.layer_elems(), DATA_SCALE);
    dev.stream
        .memcpy_htod(&pool, cache.pool_mut(0).unwrap())
        .unwrap();
    let n = 2 * lq * heads * D;
    let (o, l, t) = RawWorkspace::elems(2 * lq, heads, 4);
    let part_o = dev.stream.alloc_zeros::<f32>(o).unwrap();
    let part_lse = dev.stream.alloc_zeros::<f32>(l).unwrap();
    let tickets = dev.stream.alloc_zeros::<u32>(t).unwrap();
    let ws = RawWorkspace {
        part_o: DevPtr::of(&part_o),
        part_lse: DevPtr::of(&part_lse),
        tickets: DevPtr::of(&tickets),
    };
    let out = dev.stream.clone_htod(&vec![bf16::NAN; n]).unwrap();
    let kernels: Vec<AttentionKernel> = AttentionKernel::available(&dev)
        .into_iter()
        .filter(|k| k.warp_specialised())
        .collect();
    if kernels.is_empty() {
        eprintln!("skipping: the warp-specialised kernels are built for Hopper (sm_90a) alone");
        return;
    }
    for kernel in kernels {
        for splits in [1usize, 2, 3, 1] {
            let q_host = random_bf16(&mut rng, n, DATA_SCALE);
            let q = dev.stream.clone_htod(&q_host).unwrap();
            paged_attention_views_raw(
                &dev,
                kernel,
                data_softmax(&q_host, &pool),
                DevPtr::of(&q),
                DevPtr::of(&out),
                &cache.raw_keys(0).unwrap(),
                KeyViews {
                    count: 2,
                    stride: cache.view_stride(),
                },
                lq,
                heads,
                splits,
                ws,
            )
            .unwrap();
            let got = common::bf16_to_host_f32(&dev, &out);
            for (v, pages) in views.iter().enumerate() {
                let indices: Vec<u32> = pages.iter().map(|p| p.0).collect();
                let page_lens: Vec<u32> = pages.iter().map(|p| p.1).collect();
                let rows = lq * heads * D;
                let reference = paged_attention_rows(
                    &q_host[v * rows..(v + 1) * rows],
                    &HostPagedKv {
                        pool: &pool,
                        page_size,
                        heads,
                        head_dim: D,
                        indices: &indices,
                        page_lens: &page_lens,
                    },
                    &(0..lq).collect::<Vec<_>>(),
                );
                let err = relative_error(&got[v * rows..(v + 1) * rows], &reference);
                eprintln!("{kernel:?}, {splits} split(s), view {v}: rel err {err:.2e}");
                assert!(
                    err <= TOLERANCE,
                    "{kernel:?}, {splits} split(s), view {v}: relative error {err}"
                );
            }
        }
    }
}
