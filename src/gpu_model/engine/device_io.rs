//! Copies between the host and the arena's raw addresses, and the small conversion kernel the
//! step needs: all stream-ordered, none allocating.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, LaunchConfig, PinnedHostSlice, PushKernelArg};
use rayon::prelude::*;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::{CudaDevice, CudaError};

pub(super) fn upload_raw<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    src: &[T],
    dst: DevPtr<T>,
) -> Result<(), CudaError> {
    dst.check_len(src.len(), "upload")?;
    // SAFETY: `dst` holds at least `src.len()` elements (checked); the copy is ordered on the
    // stream and the source is synchronously staged by the driver for pageable memory.
    unsafe {
        cudarc::driver::result::memcpy_htod_async(dst.addr(), src, dev.stream.cu_stream())?;
    }
    Ok(())
}

/// Page-locked staging for the step's images: a pageable upload is copied synchronously by the
/// driver (0.43 ms for one 518x378 frame on the H200 machine), a page-locked one is a DMA the
/// host does not wait for, so the graph launch follows the host-side copy at once.
pub(super) struct ImageStaging {
    pinned: PinnedHostSlice<f32>,
    /// Recorded after each upload: the DMA still reads `pinned` until it completes.
    uploaded: CudaEvent,
}

impl ImageStaging {
    pub(super) fn new(dev: &CudaDevice, len: usize) -> Result<Self, CudaError> {
        // SAFETY: the memory is written (`upload`) before any copy reads it.
        let pinned = unsafe { dev.ctx.alloc_pinned::<f32>(len.max(1)) }?;
        let uploaded = dev
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?;
        Ok(Self { pinned, uploaded })
    }

    /// Copies `images` into the staging memory and enqueues its upload to `dst` on the stream.
    pub(super) fn upload(
        &mut self,
        dev: &CudaDevice,
        images: &[f32],
        dst: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        dst.check_len(images.len(), "image upload")?;
        if images.len() > self.pinned.len() {
            return Err(CudaError::Invalid(format!(
                "{} image values exceed the session's staging of {}",
                images.len(),
                self.pinned.len()
            )));
        }
        // The previous upload (possibly of a step that failed before synchronising) may still
        // be reading the staging memory.
        self.uploaded.synchronize()?;
        let staged = &mut self.pinned.as_mut_slice()?[..images.len()];
        // Write-combined memory takes one thread's stores at about 7 GB/s (0.35 ms a frame on
        // the H200 machine): several threads fill it at memory speed.
        const CHUNK: usize = 1 << 16;
        staged
            .par_chunks_mut(CHUNK)
            .zip(images.par_chunks(CHUNK))
            .for_each(|(dst, src)| dst.copy_from_slice(src));
        // SAFETY: `dst` holds at least `images.len()` elements (checked); `staged` stays alive
        // and unwritten until `uploaded` completes (waited for above, before the next write).
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst.addr(), staged, dev.stream.cu_stream())?;
        }
        self.uploaded.record(&dev.stream)?;
        Ok(())
    }
}

pub(super) fn download_raw<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    src: DevPtr<T>,
    dst: &mut [T],
) -> Result<(), CudaError> {
    src.check_len(dst.len(), "download")?;
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: `src` holds at least `dst.len()` elements (checked); the caller synchronises the
    // stream before reading `dst`.
    unsafe {
        cudarc::driver::result::memcpy_dtoh_async(dst, src.addr(), dev.stream.cu_stream())?;
    }
    Ok(())
}

pub(super) fn copy_dtod<T>(
    dev: &CudaDevice,
    src: DevPtr<T>,
    dst: DevPtr<T>,
) -> Result<(), CudaError> {
    dst.check_len(src.len(), "device copy")?;
    // SAFETY: both ranges are valid device memory of `src.len()` elements (checked).
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(
            dst.addr(),
            src.addr(),
            src.len() * std::mem::size_of::<T>(),
            dev.stream.cu_stream(),
        )?;
    }
    Ok(())
}

pub(super) fn image_to_rgb8(
    dev: &CudaDevice,
    image: DevPtr<f32>,
    rgb: DevPtr<u8>,
    plane: usize,
) -> Result<(), CudaError> {
    image.check_len(3 * plane, "image")?;
    rgb.check_len(3 * plane, "rgb")?;
    let f = dev.kernels.get("image_to_rgb8")?;
    let (i, r, p) = (image.addr(), rgb.addr(), plane as u32);
    let cfg = LaunchConfig {
        grid_dim: (plane.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = dev.stream.launch_builder(f);
    b.arg(&i).arg(&r).arg(&p);
    // SAFETY: arguments match image_to_rgb8; both buffers hold 3 * plane elements (checked).
    unsafe { b.launch(cfg) }?;
    Ok(())
}
