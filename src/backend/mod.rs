//! Compute backends: the CPU reference path and CUDA.
//!
//! Selection never panics: CUDA is probed (driver library present, a device, a context) and, when
//! anything is missing, [`load::load_frame_model`] (the one place that chooses) falls back to
//! [`Backend::Cpu`] with the reason in words, or refuses when CUDA was asked for.

pub mod cuda;
pub mod load;
pub mod reference;

/// Where the model's heavy work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
}

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preference {
    /// CUDA when it works, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda,
}

/// Whether CUDA can be used on this machine, and if not, why (a sentence for a person).
pub fn probe_cuda() -> Result<cuda::DeviceInfo, cuda::CudaError> {
    cuda::probe(0)
}
