//! `bench attention`: one global-attention layer at the shapes of docs/performance.md (1005
//! queries at 518x378, 1042 at 518x392; 16 heads x 64, keys = live frames x the frame's patches
//! plus 6 specials per frame seen), paged
//! (our kernel over the real `PageTable` plan) against the dense baseline (concatenate the
//! visible K/V at every call, then attend), with the relative error of each against an f64-
//! accumulating host reference on sampled query rows.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;
use serde::Serialize;

use super::BenchError;
use super::cases::{AttentionCase, SCALE_FRAMES, WINDOW};
use crate::attention::{ScoreBound, Softmax, log2_query_scale};
use crate::backend::cuda::kv::cache_attention;
use crate::backend::cuda::registry::Origin;
use crate::backend::cuda::{
    AttentionKernel, AttentionOptions, AttentionWorkspace, CudaDevice, CudaError, DenseBaseline,
    DeviceInfo, DeviceKvCache, KvGeometry,
};
use crate::backend::reference::{
    HostPagedKv, paged_attention_rows, paged_attention_rows_scaled, relative_error,
};
use crate::kvcache::{CacheConfig, PageTable, StepKind, StorageDtype};

/// What to time, and how often.
#[derive(Debug, Clone)]
pub struct AttentionConfig {
    pub cases: Vec<AttentionCase>,
    /// Timed repetitions per measurement (the median is reported); at least 1 is run.
    pub iters: usize,
    /// Untimed repetitions before timing.
    pub warmup: usize,
    /// Forced number of key splits; None: chosen to fill the GPU in one wave.
    pub splits: Option<usize>,
    /// Split counts swept on the 72/72 case.
    pub sweep_splits: Vec<usize>,
    /// Query rows checked against the host reference per case.
    pub check_rows: usize,
    /// Kernel of the paged and dense rows; None: the best this GPU has.
    pub kernel: Option<AttentionKernel>,
    /// Tokens per page; None: exact pages (= patches per frame, 999 at 518x378).
    pub page_size: Option<usize>,
    /// The model's input size, multiples of [`PATCH`]: a frame's queries are its patches plus
    /// the 6 special tokens (518x378: 1005; 518x392, a 4:3 input: 1042).
    pub width: usize,
    pub height: usize,
    /// GPU ordinal.
    pub device: usize,
}

/// What the bench has got to, for a caller that shows progress.
#[derive(Debug)]
pub enum AttentionProgress<'a> {
    /// The device is open; nothing has been timed yet.
    DeviceOpened {
        info: &'a DeviceInfo,
        kernels: &'a [(&'static str, Origin)],
    },
    /// One case is measured.
    CaseDone(&'a CaseResult),
}

// The model's geometry (docs/gct-model.md).
const HEADS: usize = 16;
const HEAD_DIM: usize = 64;
/// Pixels a side of one patch.
pub const PATCH: usize = 14;
const SPECIALS: usize = 6;
/// Uniform data in [-2, 2): logits with a standard deviation near 1.3, a softmax that is neither
/// flat nor one-hot.
const DATA_SCALE: f32 = 2.0;

#[derive(Debug, Serialize)]
pub struct CaseResult {
    pub live_frames: usize,
    pub frames_seen: u64,
    pub lq: usize,
    pub lkv: u32,
    pub heads: usize,
    pub head_dim: usize,
    pub page_size: usize,
    pub visible_pages: usize,
    pub kernel: AttentionKernel,
    pub splits: usize,
    pub paged_ms: f64,
    pub paged_tflops: f64,
    pub dense_concat_ms: f64,
    pub dense_concat_tflops: f64,
    pub dense_attention_only_ms: f64,
    pub dense_attention_only_tflops: f64,
    pub kv_write_ms: f64,
    pub host_upload_us: f64,
    pub paged_rel_err: f64,
    pub dense_rel_err: f64,
    pub checked_rows: usize,
    /// Every kernel this device has, paged, with its default split count.
    pub paged_by_kernel: Vec<KernelTiming>,
    /// The bounded kernel on queries in the log2 domain (multiplied by `log2(e)/8` and rounded
    /// to bf16 once), the form the model's global blocks run; None where the device lacks that
    /// kernel or the data's scores admit no fixed offset.
    pub log2_queries: Option<KernelTiming>,
}

#[derive(Debug, Serialize)]
pub struct KernelTiming {
    pub kernel: AttentionKernel,
    pub splits: usize,
    pub ms: f64,
    pub tflops: f64,
    pub rel_err: f64,
}

#[derive(Debug, Serialize)]
pub struct SweepPoint {
    pub kernel: AttentionKernel,
    pub splits_requested: usize,
    pub splits_used: usize,
    pub paged_ms: f64,
    pub paged_tflops: f64,
}

/// Everything `bench attention` measured (its JSON output).
#[derive(Debug, Serialize)]
pub struct AttentionReport {
    pub device: String,
    pub arch: u32,
    pub sm_count: u32,
    pub kernels: Vec<(String, String)>,
    pub iters: usize,
    pub cases: Vec<CaseResult>,
    pub sweep_72_72: Vec<SweepPoint>,
}

fn tflops(lq: usize, lkv: u32, ms: f64) -> f64 {
    4.0 * lq as f64 * lkv as f64 * (HEADS * HEAD_DIM) as f64 / (ms * 1e-3) / 1e12
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
) -> Result<Vec<f32>, BenchError> {
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

/// Opens GPU `cfg.device` and times every case; `progress` hears of the device once it is open
/// and of each case as it is done.
pub fn run_attention(
    cfg: &AttentionConfig,
    mut progress: impl FnMut(AttentionProgress<'_>),
) -> Result<AttentionReport, BenchError> {
    patches_of(cfg.width, cfg.height)?;
    let dev = CudaDevice::open(cfg.device).map_err(BenchError::AttentionNeedsGpu)?;
    progress(AttentionProgress::DeviceOpened {
        info: &dev.info,
        kernels: dev.kernels.origins(),
    });
    let iters = cfg.iters.max(1);
    let best = AttentionKernel::best_for(&dev);
    let kernels = AttentionKernel::available(&dev);
    let kernel = cfg.kernel.unwrap_or(best);
    if !kernels.contains(&kernel) {
        return Err(BenchError::KernelNeedsHopper {
            kernel,
            arch: dev.info.arch,
        });
    }
    let mut results = Vec::new();
    let mut sweep_points = Vec::new();
    for case in &cfg.cases {
        let (live, seen) = (case.live(), case.seen());
        let sweep_here: &[usize] = if live == 72 && seen == 72 {
            &cfg.sweep_splits
        } else {
            &[]
        };
        let r = attention_case(
            &dev,
            cfg,
            (live, seen),
            iters,
            kernel,
            &kernels,
            sweep_here,
            &mut sweep_points,
        )
        .map_err(|source| BenchError::Case {
            live,
            seen,
            source: Box::new(source),
        })?;
        progress(AttentionProgress::CaseDone(&r));
        results.push(r);
    }
    Ok(AttentionReport {
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
    })
}

/// Patch tokens of one frame of `width` x `height` pixels.
pub fn patches_of(width: usize, height: usize) -> Result<usize, BenchError> {
    if width == 0 || height == 0 || !width.is_multiple_of(PATCH) || !height.is_multiple_of(PATCH) {
        return Err(BenchError::Resolution {
            width,
            height,
            patch: PATCH,
        });
    }
    Ok((width / PATCH) * (height / PATCH))
}

#[allow(clippy::too_many_arguments)]
fn attention_case(
    dev: &CudaDevice,
    bench: &AttentionConfig,
    (live, seen): (usize, u64),
    iters: usize,
    kernel: AttentionKernel,
    kernels: &[AttentionKernel],
    sweep: &[usize],
    sweep_points: &mut Vec<SweepPoint>,
) -> Result<CaseResult, BenchError> {
    // The real bookkeeping: commit seen - 1 keyframes, then plan the step of the last one.
    let patches = patches_of(bench.width, bench.height)?;
    let lq = patches + SPECIALS;
    let mut cfg = CacheConfig::new(1, HEADS, HEAD_DIM, patches, SCALE_FRAMES, WINDOW);
    cfg.page_size = bench.page_size;
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
    let elems = lq * HEADS * HEAD_DIM;
    let mut q = dev.stream.alloc_zeros::<bf16>(elems)?;
    fill_random(dev, &mut q, 2)?;
    let mut k_new = dev.stream.alloc_zeros::<bf16>(elems)?;
    let mut v_new = dev.stream.alloc_zeros::<bf16>(elems)?;
    fill_random(dev, &mut k_new, 3)?;
    fill_random(dev, &mut v_new, 4)?;
    cache.write_layer(dev, 0, &k_new, &v_new, lq)?;

    let kv_write = time_runs(dev, bench.warmup, iters, || {
        cache.write_layer(dev, 0, &k_new, &v_new, lq)
    })?;

    let mut ws = AttentionWorkspace::new(dev, lq, HEADS, 16)?;
    let mut out = dev.stream.alloc_zeros::<bf16>(elems)?;
    // Host copies for the reference on sampled rows, and for the bound on the scores that
    // lets the bounded kernel fix its softmax offset.
    let rows = sample_rows(lq, bench.check_rows);
    let pool_host = dev.stream.clone_dtoh(cache.pool(0)?)?;
    let q_host = dev.stream.clone_dtoh(&q)?;
    // The longest query and pool vector (keys and values, an upper bound of the keys) bound
    // every score.
    let softmax = ScoreBound::from_head_vectors(&q_host, &pool_host, HEAD_DIM).softmax();
    let opts = |k: AttentionKernel, splits: Option<usize>| AttentionOptions {
        splits,
        kernel: Some(k),
        softmax,
    };
    let host_kv = HostPagedKv {
        pool: &pool_host,
        page_size: geometry.page_size,
        heads: HEADS,
        head_dim: HEAD_DIM,
        indices: &step.plan.indices,
        page_lens: &step.plan.page_lens,
    };
    let reference = paged_attention_rows(&q_host, &host_kv, &rows);
    // The model's form of the bounded kernel: the same queries times log2(e)/8, rounded to bf16
    // once, so each product with a key is the softmax's exponent (`2^(q·k)`, i.e. scale ln 2).
    let bounded = AttentionKernel::WgmmaWsM256Bounded;
    let log2_form = match softmax.for_log2_queries() {
        Softmax::Log2Queries { offset } if kernels.contains(&bounded) => {
            let factor = log2_query_scale(HEAD_DIM);
            let q_log2_host: Vec<bf16> = q_host
                .iter()
                .map(|v| bf16::from_f32(v.to_f32() * factor))
                .collect();
            let reference =
                paged_attention_rows_scaled(&q_log2_host, &host_kv, &rows, std::f64::consts::LN_2);
            let q_log2 = dev.stream.clone_htod(&q_log2_host)?;
            Some((q_log2, Softmax::Log2Queries { offset }, reference))
        }
        _ => None,
    };
    drop(pool_host);
    // Poisoned output before every checked run: an unwritten element shows up as NaN.
    let poison = vec![bf16::NAN; elems];
    let check_against = |out: &mut CudaSlice<bf16>, reference: &[f32]| -> Result<f64, BenchError> {
        let host = dev.stream.clone_dtoh(&*out)?;
        let err = relative_error(&to_f32_rows(&host, &rows), reference);
        dev.stream.memcpy_htod(&poison, out)?;
        Ok(err)
    };
    let check = |out: &mut CudaSlice<bf16>| check_against(out, &reference);

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
            lq,
            opts(k, bench.splits),
            &mut ws,
        )?;
        let rel_err = check(&mut out)?;
        let times = time_runs(dev, bench.warmup, iters, || {
            splits_used = cache_attention(
                dev,
                &cache,
                0,
                &q,
                &mut out,
                lq,
                opts(k, bench.splits),
                &mut ws,
            )?;
            Ok(())
        })?;
        let ms = median(times);
        paged_by_kernel.push(KernelTiming {
            kernel: k,
            splits: splits_used,
            ms,
            tflops: tflops(lq, lkv, ms),
            rel_err,
        });
        for &s in sweep {
            let mut used = 0;
            let times = time_runs(dev, bench.warmup, iters, || {
                used =
                    cache_attention(dev, &cache, 0, &q, &mut out, lq, opts(k, Some(s)), &mut ws)?;
                Ok(())
            })?;
            let ms = median(times);
            sweep_points.push(SweepPoint {
                kernel: k,
                splits_requested: s,
                splits_used: used,
                paged_ms: ms,
                paged_tflops: tflops(lq, lkv, ms),
            });
        }
    }
    let log2_queries = match &log2_form {
        Some((q_log2, softmax, reference)) => {
            let opts = AttentionOptions {
                splits: bench.splits,
                kernel: Some(bounded),
                softmax: *softmax,
            };
            dev.stream.memcpy_htod(&poison, &mut out)?;
            let mut splits = cache_attention(dev, &cache, 0, q_log2, &mut out, lq, opts, &mut ws)?;
            let rel_err = check_against(&mut out, reference)?;
            let times = time_runs(dev, bench.warmup, iters, || {
                splits = cache_attention(dev, &cache, 0, q_log2, &mut out, lq, opts, &mut ws)?;
                Ok(())
            })?;
            let ms = median(times);
            Some(KernelTiming {
                kernel: bounded,
                splits,
                ms,
                tflops: tflops(lq, lkv, ms),
                rel_err,
            })
        }
        None => None,
    };
    let chosen = paged_by_kernel
        .iter()
        .find(|t| t.kernel == kernel)
        .ok_or(BenchError::ChosenKernelNotTimed)?;
    let (paged, paged_rel_err, splits_used) = (chosen.ms, chosen.rel_err, chosen.splits);

    let mut dense = DenseBaseline::new(dev, lkv as usize, HEADS)?;
    dev.stream.memcpy_htod(&poison, &mut out)?;
    dense.concat(dev, &cache, 0)?;
    dense.attend(
        dev,
        HEADS,
        &q,
        &mut out,
        lq,
        opts(kernel, bench.splits),
        &mut ws,
    )?;
    let dense_rel_err = check(&mut out)?;
    let dense_concat = time_runs(dev, bench.warmup, iters, || {
        dense.concat(dev, &cache, 0)?;
        dense.attend(
            dev,
            HEADS,
            &q,
            &mut out,
            lq,
            opts(kernel, bench.splits),
            &mut ws,
        )?;
        Ok(())
    })?;
    let dense_only = time_runs(dev, bench.warmup, iters, || {
        dense.attend(
            dev,
            HEADS,
            &q,
            &mut out,
            lq,
            opts(kernel, bench.splits),
            &mut ws,
        )?;
        Ok(())
    })?;

    let (paged_ms, dense_ms, dense_only_ms) = (paged, median(dense_concat), median(dense_only));
    Ok(CaseResult {
        live_frames: live,
        frames_seen: seen,
        lq,
        lkv,
        heads: HEADS,
        head_dim: HEAD_DIM,
        page_size: geometry.page_size,
        visible_pages: step.plan.indices.len(),
        kernel,
        splits: splits_used,
        paged_ms,
        paged_tflops: tflops(lq, lkv, paged_ms),
        dense_concat_ms: dense_ms,
        dense_concat_tflops: tflops(lq, lkv, dense_ms),
        dense_attention_only_ms: dense_only_ms,
        dense_attention_only_tflops: tflops(lq, lkv, dense_only_ms),
        kv_write_ms: median(kv_write),
        host_upload_us,
        paged_rel_err,
        dense_rel_err,
        checked_rows: rows.len(),
        paged_by_kernel,
        log2_queries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_has_its_patches_and_a_bad_size_names_itself() {
        assert_eq!(patches_of(518, 378).unwrap(), 999);
        // A 4:3 input: 37 x 28 patches, 1042 tokens with the 6 specials.
        assert_eq!(patches_of(518, 392).unwrap() + SPECIALS, 1042);
        for (w, h) in [(0, 378), (518, 0), (520, 378), (518, 380)] {
            let e = patches_of(w, h).unwrap_err().to_string();
            assert!(e.contains(&format!("{w}x{h}")), "{e}");
            assert!(e.contains("multiples of the patch size, 14"), "{e}");
        }
    }
}
