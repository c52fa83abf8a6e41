//! The model's input made on the device from decoded 8-bit frames (`kernels/preprocess.cu`).
//!
//! On the CPU path the capture thread resizes every frame (17.9 ms a 1280×720 frame on the H200
//! machine's cores). Here the frame goes up as it was decoded, once, through page-locked staging,
//! and two small kernels resize, crop and scale it into the session's input buffer, stream-ordered
//! before the frame's graph. The resampling weights are the host's own (`aa_bicubic_weights`),
//! made once per source size, so the result is bit-identical to `preprocess_rgb8`.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, LaunchConfig, PinnedHostSlice, PushKernelArg};
use rayon::prelude::*;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::frame::RgbImage;
use crate::model::ops::resize::aa_bicubic_weights;
use crate::model::preprocess::{PreprocessConfig, target_size};

/// Source sizes whose weights are kept (a folder of mixed sizes alternates between a few).
const PLANS_KEPT: usize = 4;
const THREADS: u32 = 256;

/// One axis's taps on the device, as the kernels' `AxisTaps` reads them.
struct DeviceTaps {
    start: CudaSlice<i32>,
    count: CudaSlice<i32>,
    weight: CudaSlice<f64>,
    per_output: u32,
}

impl DeviceTaps {
    fn upload(dev: &CudaDevice, taps: &[(usize, Vec<f64>)]) -> Result<Self, CudaError> {
        let per_output = taps.iter().map(|(_, w)| w.len()).max().unwrap_or(1).max(1);
        let mut weight = vec![0f64; taps.len() * per_output];
        for (o, (_, w)) in taps.iter().enumerate() {
            weight[o * per_output..o * per_output + w.len()].copy_from_slice(w);
        }
        let start: Vec<i32> = taps.iter().map(|(s, _)| *s as i32).collect();
        let count: Vec<i32> = taps.iter().map(|(_, w)| w.len() as i32).collect();
        Ok(Self {
            start: dev.stream.clone_htod(&start)?,
            count: dev.stream.clone_htod(&count)?,
            weight: dev.stream.clone_htod(&weight)?,
            per_output: per_output as u32,
        })
    }
}

/// How one source size becomes the session's input.
struct ResizePlan {
    src: (u32, u32),
    out_w: u32,
    /// Rows kept after the centre crop, from row `top` of the resized image.
    out_h: u32,
    top: u32,
    /// Source rows the kept rows read: `row0 .. row0 + rows`.
    row0: u32,
    rows: u32,
    x: DeviceTaps,
    y: DeviceTaps,
}

impl ResizePlan {
    fn new(
        dev: &CudaDevice,
        src: (u32, u32),
        cfg: &PreprocessConfig,
        session: (usize, usize),
    ) -> Result<Self, CudaError> {
        let (src_w, src_h) = (src.0 as usize, src.1 as usize);
        let (w, resized_h, final_h) =
            target_size(src_w, src_h, cfg).map_err(|e| CudaError::Invalid(e.to_string()))?;
        if (final_h, w) != session {
            return Err(CudaError::Invalid(format!(
                "a {src_w}×{src_h} frame preprocesses to {w}×{final_h}, the session runs at {}×{}",
                session.1, session.0
            )));
        }
        let top = (resized_h - final_h) / 2;
        let x = aa_bicubic_weights(src_w, w);
        let y = aa_bicubic_weights(src_h, resized_h);
        let kept = &y[top..top + final_h];
        let row0 = kept.iter().map(|(s, _)| *s).min().unwrap_or(0);
        let row_end = kept
            .iter()
            .map(|(s, w)| s + w.len())
            .max()
            .unwrap_or(row0)
            .max(row0 + 1);
        Ok(Self {
            src,
            out_w: w as u32,
            out_h: final_h as u32,
            top: top as u32,
            row0: row0 as u32,
            rows: (row_end - row0) as u32,
            x: DeviceTaps::upload(dev, &x)?,
            y: DeviceTaps::upload(dev, &y)?,
        })
    }
}

/// Device preprocessing of one session: staging, the frame's device copy, the weights per size.
pub struct DevicePreprocess {
    cfg: PreprocessConfig,
    session: (usize, usize),
    plans: Vec<ResizePlan>,
    /// The call's decoded frames, back to back (page-locked: the copy is a DMA the host does not
    /// wait for).
    staging: Option<PinnedHostSlice<u8>>,
    /// Recorded after the call's last upload: the DMA reads `staging` until then.
    uploaded: CudaEvent,
    /// One frame on the device; frames of a call are uploaded and resized in turn, stream-ordered.
    raw: Option<CudaSlice<u8>>,
    /// The width pass's output.
    tmp: Option<CudaSlice<u8>>,
}

impl DevicePreprocess {
    /// For a session of `height × width` inputs made the way `cfg` says.
    pub fn new(
        dev: &CudaDevice,
        cfg: PreprocessConfig,
        height: usize,
        width: usize,
    ) -> Result<Self, CudaError> {
        Ok(Self {
            cfg,
            session: (height, width),
            plans: Vec::new(),
            staging: None,
            uploaded: dev
                .ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            raw: None,
            tmp: None,
        })
    }

    /// Enqueues the upload and preprocessing of `frames` into `dst`, `[S][3][H][W]` in [0, 1].
    /// Returns once the frames are in page-locked memory; the device work follows on the stream.
    pub fn run(
        &mut self,
        dev: &CudaDevice,
        frames: &[&RgbImage],
        dst: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        let plane = self.session.0 * self.session.1;
        dst.check_len(frames.len() * 3 * plane, "preprocessed images")?;
        for f in frames {
            let expected = f.width as usize * f.height as usize * 3;
            if f.data.len() != expected {
                return Err(CudaError::Invalid(format!(
                    "an RGB frame of {}×{} holds {} bytes, expected {expected}",
                    f.width,
                    f.height,
                    f.data.len()
                )));
            }
        }
        let total: usize = frames.iter().map(|f| f.data.len()).sum();
        let largest = frames.iter().map(|f| f.data.len()).max().unwrap_or(0);
        // The previous call's DMA may still read the staging memory.
        self.uploaded.synchronize()?;
        self.stage(dev, frames, total)?;
        let raw = grown(dev, &mut self.raw, largest)?;
        let mut offset = 0;
        for (i, frame) in frames.iter().enumerate() {
            self.plan_for(dev, (frame.width, frame.height))?;
            let plan = self
                .plans
                .last()
                .ok_or_else(|| CudaError::Invalid("no resize plan after planning".into()))?;
            let staging = self.staging.as_ref().ok_or_else(|| {
                CudaError::Invalid("preprocess staging missing after staging".into())
            })?;
            let len = frame.data.len();
            // SAFETY: `staging` holds `total` staged bytes and stays unwritten until `uploaded`
            // completes (waited for above, before the next `stage`); `raw` holds `largest` bytes.
            unsafe {
                let host = std::slice::from_raw_parts(staging.as_ptr()?.add(offset), len);
                cudarc::driver::result::memcpy_htod_async(
                    raw.addr(),
                    host,
                    dev.stream.cu_stream(),
                )?;
            }
            offset += len;
            let tmp = grown(
                dev,
                &mut self.tmp,
                plan.rows as usize * plan.out_w as usize * 3,
            )?;
            launch_rows(dev, plan, raw, tmp)?;
            launch_cols(dev, plan, tmp, dst.slice(i * 3 * plane, 3 * plane)?)?;
        }
        self.uploaded.record(&dev.stream)?;
        Ok(())
    }

    /// [`Self::run`] into a buffer of its own, waited for and copied back: `[S][3][H][W]` (for
    /// tests and benchmarks).
    pub fn run_to_host(
        &mut self,
        dev: &CudaDevice,
        frames: &[&RgbImage],
    ) -> Result<Vec<f32>, CudaError> {
        let len = frames.len() * 3 * self.session.0 * self.session.1;
        let out = dev.stream.alloc_zeros::<f32>(len.max(1))?;
        self.run(dev, frames, DevPtr::of(&out).slice(0, len)?)?;
        Ok(dev.stream.clone_dtoh(&out)?[..len].to_vec())
    }

    /// Copies the frames into page-locked memory (grown when a call needs more).
    fn stage(
        &mut self,
        dev: &CudaDevice,
        frames: &[&RgbImage],
        total: usize,
    ) -> Result<(), CudaError> {
        if self.staging.as_ref().is_none_or(|s| s.len() < total) {
            self.staging = None;
            // Plain page-locked memory (not write-combined): it is also read back in tests.
            // SAFETY: the memory is written below before any copy reads it.
            self.staging = Some(unsafe { dev.ctx.alloc_pinned_with_flags::<u8>(total.max(1), 0) }?);
        }
        let staging = self
            .staging
            .as_mut()
            .ok_or_else(|| CudaError::Invalid("preprocess staging missing".into()))?;
        let mut rest = &mut staging.as_mut_slice()?[..total];
        for f in frames {
            let (head, tail) = rest.split_at_mut(f.data.len());
            // A 1280×720 frame is 2.8 MB: several threads copy it at memory speed.
            const CHUNK: usize = 1 << 18;
            head.par_chunks_mut(CHUNK)
                .zip(f.data.par_chunks(CHUNK))
                .for_each(|(d, s)| d.copy_from_slice(s));
            rest = tail;
        }
        Ok(())
    }

    /// Makes the plan of a source size the last of `plans` (made at first use, then kept).
    fn plan_for(&mut self, dev: &CudaDevice, src: (u32, u32)) -> Result<(), CudaError> {
        if let Some(i) = self.plans.iter().position(|p| p.src == src) {
            let plan = self.plans.remove(i);
            self.plans.push(plan);
            return Ok(());
        }
        let plan = ResizePlan::new(dev, src, &self.cfg, self.session)?;
        if self.plans.len() >= PLANS_KEPT {
            self.plans.remove(0);
        }
        self.plans.push(plan);
        Ok(())
    }
}

/// `buf` with room for at least `len` bytes (reallocated when smaller: stream-ordered, so work
/// already queued on the old buffer is unaffected).
fn grown(
    dev: &CudaDevice,
    buf: &mut Option<CudaSlice<u8>>,
    len: usize,
) -> Result<DevPtr<u8>, CudaError> {
    if buf.as_ref().is_none_or(|b| b.len() < len) {
        *buf = Some(dev.stream.alloc_zeros::<u8>(len.max(1))?);
    }
    let b = buf
        .as_ref()
        .ok_or_else(|| CudaError::Invalid("device buffer missing after allocation".into()))?;
    DevPtr::of(b).slice(0, len)
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(THREADS as usize).clamp(1, 1 << 16) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn launch_rows(
    dev: &CudaDevice,
    plan: &ResizePlan,
    raw: DevPtr<u8>,
    tmp: DevPtr<u8>,
) -> Result<(), CudaError> {
    let f = dev.kernels.get("preprocess_resize_rows")?;
    let (src, out) = (raw.addr(), tmp.addr());
    let x = &plan.x;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&src)
        .arg(&plan.src.0)
        .arg(&plan.row0)
        .arg(&plan.rows)
        .arg(&plan.out_w)
        .arg(&x.start)
        .arg(&x.count)
        .arg(&x.weight)
        .arg(&x.per_output)
        .arg(&out);
    // SAFETY: arguments match preprocess_resize_rows; `raw` holds the whole source frame (its
    // rows row0..row0+rows lie inside it by construction), `tmp` rows × out_w × 3 bytes.
    unsafe { b.launch(grid(plan.rows as usize * plan.out_w as usize)) }?;
    Ok(())
}

fn launch_cols(
    dev: &CudaDevice,
    plan: &ResizePlan,
    tmp: DevPtr<u8>,
    image: DevPtr<f32>,
) -> Result<(), CudaError> {
    let f = dev.kernels.get("preprocess_resize_cols")?;
    let (src, out) = (tmp.addr(), image.addr());
    let y = &plan.y;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&src)
        .arg(&plan.row0)
        .arg(&plan.top)
        .arg(&plan.out_h)
        .arg(&plan.out_w)
        .arg(&y.start)
        .arg(&y.count)
        .arg(&y.weight)
        .arg(&y.per_output)
        .arg(&out);
    // SAFETY: arguments match preprocess_resize_cols; the taps of rows top..top+out_h read only
    // source rows row0..row0+rows (how the plan chose them); `image` holds 3 × out_h × out_w.
    unsafe { b.launch(grid(plan.out_h as usize * plan.out_w as usize)) }?;
    Ok(())
}
