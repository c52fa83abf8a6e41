//! Probing for CUDA, and the device handle (context, stream, kernels) everything else uses.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys::CUdevice_attribute};

use super::CudaError;
use super::registry::KernelRegistry;

/// What the probe found.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability as major * 10 + minor (90 for Hopper).
    pub arch: u32,
    pub sm_count: u32,
    pub total_mem: usize,
}

/// Checks, without panicking, that the driver library loads, a device `ordinal` exists and a
/// context can be made on it. The error ([`CudaError::Unavailable`]) is a sentence for a person.
pub fn probe(ordinal: usize) -> Result<DeviceInfo, CudaError> {
    let unavailable = CudaError::Unavailable;
    // SAFETY: only tries to dlopen the driver library; nothing is called through it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(unavailable(
            "the NVIDIA driver library (libcuda.so) was not found: no GPU driver on this machine"
                .into(),
        ));
    }
    let count = CudaContext::device_count()
        .map_err(|e| unavailable(format!("the CUDA driver did not initialise: {e}")))?;
    if count <= 0 {
        return Err(unavailable("the CUDA driver found no GPU".into()));
    }
    if ordinal >= count as usize {
        return Err(unavailable(format!(
            "GPU {ordinal} requested but only {count} present"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| {
        unavailable(format!(
            "could not create a CUDA context on GPU {ordinal}: {e}"
        ))
    })?;
    info_of(&ctx).map_err(|e| unavailable(format!("could not query GPU {ordinal}: {e}")))
}

/// Starts (`true`) or stops the CUDA profiler's collection on the current context: a profiler
/// started with collection off (`ncu --profile-from-start off`) sees only the kernels launched
/// in between. Without a profiler attached it does nothing.
pub fn profiler_range(start: bool) -> Result<(), CudaError> {
    // SAFETY: plain driver calls without arguments; the caller runs them on a thread with the
    // session's context current (the session binds it at every submission).
    let result = unsafe {
        if start {
            cudarc::driver::sys::cuProfilerStart()
        } else {
            cudarc::driver::sys::cuProfilerStop()
        }
    };
    result.result()?;
    Ok(())
}

fn info_of(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, CudaError> {
    let (major, minor) = ctx.compute_capability()?;
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        arch: (major * 10 + minor) as u32,
        sm_count: ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32,
        total_mem: ctx.total_mem()?,
    })
}

/// One GPU: its context, the stream all work is queued on, and the loaded kernels.
pub struct CudaDevice {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: DeviceInfo,
    pub kernels: KernelRegistry,
}

impl CudaDevice {
    /// Opens GPU `ordinal` and loads every kernel (prebuilt CUBIN or NVRTC). Errors, never panics,
    /// when the driver or the GPU is missing.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        probe(ordinal)?;
        let ctx = CudaContext::new(ordinal)?;
        let info = info_of(&ctx)?;
        ctx.bind_to_thread()?;
        let stream = ctx.new_stream_with_priority(stream_priorities()?.greatest)?;
        let kernels = KernelRegistry::load(&ctx, info.arch)?;
        Ok(Self {
            ctx,
            stream,
            info,
            kernels,
        })
    }

    /// The same GPU, context and kernels with a second stream at the first one's (the highest)
    /// priority, for work that may overlap the first stream's (order the two with events).
    pub fn with_new_stream(&self) -> Result<Self, CudaError> {
        self.with_stream_priority(stream_priorities()?.greatest)
    }

    /// As [`Self::with_new_stream`], at the lowest priority: its kernels take the SMs the other
    /// streams leave idle, and theirs go first wherever both are ready. Graphs launched on it
    /// run at its priority.
    pub fn with_background_stream(&self) -> Result<Self, CudaError> {
        self.with_stream_priority(stream_priorities()?.least)
    }

    fn with_stream_priority(&self, priority: i32) -> Result<Self, CudaError> {
        self.ctx.bind_to_thread()?;
        Ok(Self {
            ctx: self.ctx.clone(),
            stream: self.ctx.new_stream_with_priority(priority)?,
            info: self.info.clone(),
            kernels: self.kernels.clone(),
        })
    }
}

/// The device's stream priorities (numerically smaller is more urgent; both 0 on a device
/// without priorities).
struct StreamPriorities {
    least: i32,
    greatest: i32,
}

fn stream_priorities() -> Result<StreamPriorities, CudaError> {
    let (least, greatest) = cudarc::driver::result::stream::get_priority_range()?;
    Ok(StreamPriorities { least, greatest })
}
