//! `streamrecon bench`: timing runs that print JSON and a short table.
//!
//! `bench attention` times one global-attention layer at the shapes of docs/performance.md
//! (1005 queries, 16 heads x 64, keys = live frames x 999 patches + 6 specials per frame seen),
//! paged (our kernel over the real `PageTable` plan) against the dense baseline (concatenate the
//! visible K/V at every call, then attend), with the relative error of each against an f64-
//! accumulating host reference on sampled query rows. Needs a CUDA GPU; without one it says why
//! and fails.

use std::path::PathBuf;

use anyhow::{Context, bail};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;
use serde::Serialize;

use crate::attention::AttentionLayout;
use crate::backend::cuda::kv::cache_attention;
use crate::backend::cuda::{
    AttentionKernel, AttentionOptions, AttentionWorkspace, CudaDevice, CudaError, DenseBaseline,
    DeviceKvCache, KvGeometry,
};
use crate::backend::reference::{HostPagedKv, paged_attention_rows, relative_error};
use crate::kvcache::{CacheConfig, PageTable, StepKind, StorageDtype};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchWhat {
    /// One global-attention layer, paged vs dense, at the performance.md shapes.
    Attention,
    /// The whole model on the GPU, frame by frame (random weights, synthetic images).
    E2e,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to time.
    #[arg(value_enum)]
    pub what: BenchWhat,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Cases as live/seen frame counts, comma separated.
    #[arg(long, default_value = "8/8,24/24,72/72,72/1000,72/10000")]
    pub cases: String,
    /// Timed repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Untimed repetitions before timing.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Force the number of key splits (default: chosen to fill the GPU in one wave).
    #[arg(long)]
    pub splits: Option<usize>,
    /// Split counts to sweep on the 72/72 case (comma separated; empty for none).
    #[arg(long, default_value = "1,2,3,4")]
    pub sweep_splits: String,
    /// Query rows checked against the host reference per case.
    #[arg(long, default_value_t = 24)]
    pub check_rows: usize,
    /// Attention kernel for the paged and dense rows: auto (ws-n192 on Hopper, else mma), mma,
    /// ws, ws-n192. Every other kernel the GPU has is also timed, paged, in its own column.
    #[arg(long, default_value = "auto")]
    pub kernel: String,
    /// Tokens per page; default exact pages (= patches per frame, 999).
    #[arg(long)]
    pub page_size: Option<usize>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// e2e: random weights of this preset (full or tiny).
    #[arg(long, default_value = "full")]
    pub random_weights: String,
    /// e2e: input size as WIDTHxHEIGHT (multiples of 14).
    #[arg(long, default_value = "518x378")]
    pub resolution: String,
    /// e2e: streaming frames after the scale frames.
    #[arg(long, default_value_t = 200)]
    pub frames: usize,
    /// e2e: attention layout of the global blocks.
    #[arg(long, value_enum, default_value_t = AttentionLayout::Paged)]
    pub attention: AttentionLayout,
    /// e2e: every k-th streaming frame is a keyframe.
    #[arg(long, default_value_t = 1)]
    pub keyframe_interval: usize,
    /// e2e: run every step eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    pub no_graphs: bool,
    /// e2e: frames run eagerly after the timed run to time each stage.
    #[arg(long, default_value_t = 10)]
    pub profile_frames: usize,
    /// e2e: the kernel of the frame-local attention (DINO and frame blocks); default as --kernel.
    #[arg(long)]
    pub local_kernel: Option<String>,
    /// e2e: take cuBLASLt's first guess for every GEMM shape instead of timing its candidates.
    #[arg(long)]
    pub gemm_heuristic: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Attention => attention(&args),
        BenchWhat::E2e => {
            let kernel = match args.kernel.as_str() {
                "auto" => None,
                name => Some(parse_kernel_name(name)?),
            };
            super::bench_e2e::run(&super::bench_e2e::E2eArgs {
                preset: args.random_weights.clone(),
                resolution: args.resolution.clone(),
                frames: args.frames,
                attention: args.attention,
                keyframe_interval: args.keyframe_interval,
                graphs: !args.no_graphs,
                kernel,
                local_kernel: args
                    .local_kernel
                    .as_deref()
                    .map(parse_kernel_name)
                    .transpose()?,
                profile_frames: args.profile_frames,
                gemm_heuristic: args.gemm_heuristic,
                json: args.json.clone(),
                device: args.device,
            })
        }
    }
}

// The model's geometry at 518x378 (docs/gct-model.md).
const HEADS: usize = 16;
const HEAD_DIM: usize = 64;
const PATCHES: usize = 999;
const SPECIALS: usize = 6;
const SCALE_FRAMES: usize = 8;
const WINDOW: usize = 64;
const LQ: usize = PATCHES + SPECIALS;
/// Uniform data in [-2, 2): logits with a standard deviation near 1.3, a softmax that is neither
/// flat nor one-hot.
const DATA_SCALE: f32 = 2.0;

#[derive(Debug, Serialize)]
struct CaseResult {
    live_frames: usize,
    frames_seen: u64,
    lq: usize,
    lkv: u32,
    heads: usize,
    head_dim: usize,
    page_size: usize,
    visible_pages: usize,
    kernel: AttentionKernel,
    splits: usize,
    paged_ms: f64,
    paged_tflops: f64,
    dense_concat_ms: f64,
    dense_concat_tflops: f64,
    dense_attention_only_ms: f64,
    dense_attention_only_tflops: f64,
    kv_write_ms: f64,
    host_upload_us: f64,
    paged_rel_err: f64,
    dense_rel_err: f64,
    checked_rows: usize,
    /// Every kernel this device has, paged, with its default split count.
    paged_by_kernel: Vec<KernelTiming>,
}

#[derive(Debug, Serialize)]
struct KernelTiming {
    kernel: AttentionKernel,
    splits: usize,
    ms: f64,
    tflops: f64,
    rel_err: f64,
}

#[derive(Debug, Serialize)]
struct SweepPoint {
    kernel: AttentionKernel,
    splits_requested: usize,
    splits_used: usize,
    paged_ms: f64,
    paged_tflops: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    device: String,
    arch: u32,
    sm_count: u32,
    kernels: Vec<(String, String)>,
    iters: usize,
    cases: Vec<CaseResult>,
    sweep_72_72: Vec<SweepPoint>,
}

fn parse_cases(s: &str) -> anyhow::Result<Vec<(usize, u64)>> {
    s.split(',')
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            let (l, f) = c
                .trim()
                .split_once('/')
                .with_context(|| format!("case `{c}` is not live/seen"))?;
            let live: usize = l.parse().with_context(|| format!("bad live count in `{c}`"))?;
            let seen: u64 = f.parse().with_context(|| format!("bad seen count in `{c}`"))?;
            if seen == 0 || live as u64 > seen || live > SCALE_FRAMES + WINDOW {
                bail!("case `{c}`: need 0 < live <= seen and live <= {}", SCALE_FRAMES + WINDOW);
            }
            if live as u64 != seen.min((SCALE_FRAMES + WINDOW) as u64) {
                bail!(
                    "case `{c}`: with {SCALE_FRAMES} scale frames and a window of {WINDOW}, {seen} frames seen leave {} live",
                    seen.min((SCALE_FRAMES + WINDOW) as u64)
                );
            }
            Ok((live, seen))
        })
        .collect()
}

fn parse_list(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            c.trim()
                .parse()
                .with_context(|| format!("bad number `{c}`"))
        })
        .collect()
}

fn tflops(lkv: u32, ms: f64) -> f64 {
    4.0 * LQ as f64 * lkv as f64 * (HEADS * HEAD_DIM) as f64 / (ms * 1e-3) / 1e12
}

fn median(mut v: Vec<f32>) -> f64 {
    v.sort_by(f32::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f32::NAN) as f64
}

/// Runs `f` `warmup` times, then `iters` times back to back with an event between runs (no host
/// sync in between, so launch gaps stay hidden); returns each run's milliseconds.
fn time_runs(
    dev: &CudaDevice,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> anyhow::Result<Vec<f32>> {
    for _ in 0..warmup {
        f()?;
    }
    let events = (0..=iters)
        .map(|_| dev.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<Result<Vec<_>, _>>()?;
    events[0].record(&dev.stream)?;
    for e in &events[1..] {
        f()?;
        e.record(&dev.stream)?;
    }
    dev.stream.synchronize()?;
    events
        .windows(2)
        .map(|w| Ok(w[0].elapsed_ms(&w[1])?))
        .collect()
}

fn fill_random(dev: &CudaDevice, buf: &mut CudaSlice<bf16>, seed: u64) -> Result<(), CudaError> {
    let f = dev.kernels.get("fill_random_bf16")?;
    let n = buf.len() as u64;
    let cfg = LaunchConfig {
        grid_dim: (dev.info.sm_count * 8, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream.launch_builder(f);
    b.arg(&mut *buf).arg(&n).arg(&seed).arg(&DATA_SCALE);
    // SAFETY: arguments match fill_random_bf16; n is the buffer's length.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

/// Query rows to check: evenly spaced, always including the first and the last.
fn sample_rows(n: usize, count: usize) -> Vec<usize> {
    let count = count.clamp(1, n);
    let mut rows: Vec<usize> = (0..count)
        .map(|i| {
            if count == 1 {
                0
            } else {
                i * (n - 1) / (count - 1)
            }
        })
        .collect();
    rows.dedup();
    rows
}

fn to_f32_rows(out: &[bf16], rows: &[usize]) -> Vec<f32> {
    let row = HEADS * HEAD_DIM;
    rows.iter()
        .flat_map(|&r| out[r * row..(r + 1) * row].iter().map(|x| x.to_f32()))
        .collect()
}

fn attention(args: &BenchArgs) -> anyhow::Result<()> {
    let cases = parse_cases(&args.cases)?;
    let sweep = parse_list(&args.sweep_splits)?;
    let dev = CudaDevice::open(args.device).context("`bench attention` needs a CUDA GPU")?;
    eprintln!(
        "device: {} (sm_{}, {} SMs); kernels: {:?}",
        dev.info.name,
        dev.info.arch,
        dev.info.sm_count,
        dev.kernels.origins()
    );
    let iters = args.iters.max(1);
    let best = AttentionKernel::best_for(&dev);
    let kernels = AttentionKernel::available(&dev);
    let kernel = match args.kernel.as_str() {
        "auto" => best,
        name => parse_kernel_name(name)?,
    };
    if !kernels.contains(&kernel) {
        bail!(
            "the {kernel:?} kernel needs a Hopper GPU (sm_90); this is sm_{}",
            dev.info.arch
        );
    }
    let mut results = Vec::new();
    let mut sweep_points = Vec::new();
    for &(live, seen) in &cases {
        let sweep_here: &[usize] = if live == 72 && seen == 72 {
            &sweep
        } else {
            &[]
        };
        let r = attention_case(
            &dev,
            args,
            (live, seen),
            iters,
            kernel,
            &kernels,
            sweep_here,
            &mut sweep_points,
        )
        .with_context(|| format!("case {live}/{seen}"))?;
        eprintln!("{}", serde_json::to_string(&r)?);
        results.push(r);
    }
    let report = Report {
        device: dev.info.name.clone(),
        arch: dev.info.arch,
        sm_count: dev.info.sm_count,
        kernels: dev
            .kernels
            .origins()
            .iter()
            .map(|(n, o)| (n.to_string(), format!("{o:?}")))
            .collect(),
        iters,
        cases: results,
        sweep_72_72: sweep_points,
    };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &args.json {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{json}");
    print_table(&report);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn attention_case(
    dev: &CudaDevice,
    args: &BenchArgs,
    (live, seen): (usize, u64),
    iters: usize,
    kernel: AttentionKernel,
    kernels: &[AttentionKernel],
    sweep: &[usize],
    sweep_points: &mut Vec<SweepPoint>,
) -> anyhow::Result<CaseResult> {
    // The real bookkeeping: commit seen - 1 keyframes, then plan the step of the last one.
    let mut cfg = CacheConfig::new(1, HEADS, HEAD_DIM, PATCHES, SCALE_FRAMES, WINDOW);
    cfg.page_size = args.page_size;
    cfg.dtype = StorageDtype::Bf16;
    cfg.special_pool.max_frames = cfg.special_pool.max_frames.max(seen);
    let mut table = PageTable::new(cfg)?;
    for f in 0..seen - 1 {
        table.begin_step(f..f + 1, StepKind::Keyframe)?;
        table.end_step()?;
    }
    let step = table
        .begin_step(seen - 1..seen, StepKind::Keyframe)?
        .clone();
    let geometry = KvGeometry::for_table(&table);
    let mut cache = DeviceKvCache::new(dev, geometry, 16)?;

    let t = std::time::Instant::now();
    let uploads = 20;
    for _ in 0..uploads {
        cache.upload_step(dev, &step)?;
    }
    dev.stream.synchronize()?;
    let host_upload_us = t.elapsed().as_secs_f64() * 1e6 / uploads as f64;
    let lkv = cache.kv_len();

    // Random pool, queries and this step's K/V.
    fill_random(dev, cache.pool_mut(0)?, 1)?;
    let elems = LQ * HEADS * HEAD_DIM;
    let mut q = dev.stream.alloc_zeros::<bf16>(elems)?;
    fill_random(dev, &mut q, 2)?;
    let mut k_new = dev.stream.alloc_zeros::<bf16>(elems)?;
    let mut v_new = dev.stream.alloc_zeros::<bf16>(elems)?;
    fill_random(dev, &mut k_new, 3)?;
    fill_random(dev, &mut v_new, 4)?;
    cache.write_layer(dev, 0, &k_new, &v_new, LQ)?;

    let kv_write = time_runs(dev, args.warmup, iters, || {
        cache.write_layer(dev, 0, &k_new, &v_new, LQ)
    })?;

    let mut ws = AttentionWorkspace::new(dev, LQ, HEADS, 16)?;
    let mut out = dev.stream.alloc_zeros::<bf16>(elems)?;
    let opts = |k: AttentionKernel, splits: Option<usize>| AttentionOptions {
        splits,
        kernel: Some(k),
    };

    // Host copies for the reference on sampled rows.
    let rows = sample_rows(LQ, args.check_rows);
    let pool_host = dev.stream.clone_dtoh(cache.pool(0)?)?;
    let q_host = dev.stream.clone_dtoh(&q)?;
    let reference = paged_attention_rows(
        &q_host,
        &HostPagedKv {
            pool: &pool_host,
            page_size: geometry.page_size,
            heads: HEADS,
            head_dim: HEAD_DIM,
            indices: &step.plan.indices,
            page_lens: &step.plan.page_lens,
        },
        &rows,
    );
    drop(pool_host);
    // Poisoned output before every checked run: an unwritten element shows up as NaN.
    let poison = vec![bf16::NAN; elems];
    let check = |out: &mut CudaSlice<bf16>| -> anyhow::Result<f64> {
        let host = dev.stream.clone_dtoh(&*out)?;
        let err = relative_error(&to_f32_rows(&host, &rows), &reference);
        dev.stream.memcpy_htod(&poison, out)?;
        Ok(err)
    };

    let mut paged_by_kernel = Vec::new();
    for &k in kernels {
        let mut splits_used = 0;
        dev.stream.memcpy_htod(&poison, &mut out)?;
        cache_attention(
            dev,
            &cache,
            0,
            &q,
            &mut out,
            LQ,
            opts(k, args.splits),
            &mut ws,
        )?;
        let rel_err = check(&mut out)?;
        let times = time_runs(dev, args.warmup, iters, || {
            splits_used = cache_attention(
                dev,
                &cache,
                0,
                &q,
                &mut out,
                LQ,
                opts(k, args.splits),
                &mut ws,
            )?;
            Ok(())
        })?;
        let ms = median(times);
        paged_by_kernel.push(KernelTiming {
            kernel: k,
            splits: splits_used,
            ms,
            tflops: tflops(lkv, ms),
            rel_err,
        });
        for &s in sweep {
            let mut used = 0;
            let times = time_runs(dev, args.warmup, iters, || {
                used =
                    cache_attention(dev, &cache, 0, &q, &mut out, LQ, opts(k, Some(s)), &mut ws)?;
                Ok(())
            })?;
            let ms = median(times);
            sweep_points.push(SweepPoint {
                kernel: k,
                splits_requested: s,
                splits_used: used,
                paged_ms: ms,
                paged_tflops: tflops(lkv, ms),
            });
        }
    }
    let chosen = paged_by_kernel
        .iter()
        .find(|t| t.kernel == kernel)
        .context("the chosen kernel was not timed")?;
    let (paged, paged_rel_err, splits_used) = (chosen.ms, chosen.rel_err, chosen.splits);

    let mut dense = DenseBaseline::new(dev, lkv as usize, HEADS)?;
    dev.stream.memcpy_htod(&poison, &mut out)?;
    dense.concat(dev, &cache, 0)?;
    dense.attend(
        dev,
        HEADS,
        &q,
        &mut out,
        LQ,
        opts(kernel, args.splits),
        &mut ws,
    )?;
    let dense_rel_err = check(&mut out)?;
    let dense_concat = time_runs(dev, args.warmup, iters, || {
        dense.concat(dev, &cache, 0)?;
        dense.attend(
            dev,
            HEADS,
            &q,
            &mut out,
            LQ,
            opts(kernel, args.splits),
            &mut ws,
        )?;
        Ok(())
    })?;
    let dense_only = time_runs(dev, args.warmup, iters, || {
        dense.attend(
            dev,
            HEADS,
            &q,
            &mut out,
            LQ,
            opts(kernel, args.splits),
            &mut ws,
        )?;
        Ok(())
    })?;

    let (paged_ms, dense_ms, dense_only_ms) = (paged, median(dense_concat), median(dense_only));
    Ok(CaseResult {
        live_frames: live,
        frames_seen: seen,
        lq: LQ,
        lkv,
        heads: HEADS,
        head_dim: HEAD_DIM,
        page_size: geometry.page_size,
        visible_pages: step.plan.indices.len(),
        kernel,
        splits: splits_used,
        paged_ms,
        paged_tflops: tflops(lkv, paged_ms),
        dense_concat_ms: dense_ms,
        dense_concat_tflops: tflops(lkv, dense_ms),
        dense_attention_only_ms: dense_only_ms,
        dense_attention_only_tflops: tflops(lkv, dense_only_ms),
        kv_write_ms: median(kv_write),
        host_upload_us,
        paged_rel_err,
        dense_rel_err,
        checked_rows: rows.len(),
        paged_by_kernel,
    })
}

fn print_table(r: &Report) {
    println!(
        "\nattention, {} (sm_{}), median of {} runs; TFLOP/s = 4*Lq*Lkv*heads*head_dim/t; err = ||out-ref||/||ref||",
        r.device, r.arch, r.iters
    );
    println!(
        "{:>10} {:>7} {:>13} {:>3} {:>16} {:>20} {:>19} {:>8} {:>8}  other kernels (paged)",
        "live/seen",
        "Lkv",
        "kernel",
        "spl",
        "paged ms (TF/s)",
        "dense+concat ms (TF)",
        "dense only ms (TF)",
        "err pg",
        "err dn"
    );
    for c in &r.cases {
        let others: Vec<String> = c
            .paged_by_kernel
            .iter()
            .filter(|t| t.kernel != c.kernel)
            .map(|t| {
                format!(
                    "{:?} {:.3} ({:.0}) err {:.1e}",
                    t.kernel, t.ms, t.tflops, t.rel_err
                )
            })
            .collect();
        println!(
            "{:>10} {:>7} {:>13} {:>3} {:>8.3} ({:>5.0}) {:>12.3} ({:>5.0}) {:>11.3} ({:>5.0}) {:>8.1e} {:>8.1e}  {}",
            format!("{}/{}", c.live_frames, c.frames_seen),
            c.lkv,
            format!("{:?}", c.kernel),
            c.splits,
            c.paged_ms,
            c.paged_tflops,
            c.dense_concat_ms,
            c.dense_concat_tflops,
            c.dense_attention_only_ms,
            c.dense_attention_only_tflops,
            c.paged_rel_err,
            c.dense_rel_err,
            others.join("; ")
        );
    }
    if !r.sweep_72_72.is_empty() {
        let line: Vec<String> = r
            .sweep_72_72
            .iter()
            .map(|p| {
                format!(
                    "{:?}/{}: {:.3} ({:.0})",
                    p.kernel, p.splits_used, p.paged_ms, p.paged_tflops
                )
            })
            .collect();
        println!(
            "72/72 split sweep (kernel/splits: ms (TF/s)): {}",
            line.join(", ")
        );
    }
}

/// `--kernel` (the attention kernel of every layer): a name from the attention table.
fn parse_kernel_name(name: &str) -> anyhow::Result<AttentionKernel> {
    AttentionKernel::from_name(name).with_context(|| {
        let names: Vec<&str> = AttentionKernel::ALL.iter().map(|k| k.name()).collect();
        format!("unknown --kernel `{name}` (auto, {})", names.join(", "))
    })
}
