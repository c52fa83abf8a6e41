//! Compute backends: the CPU reference path and CUDA.
//!
//! Selection never panics: CUDA is probed (driver library present, a device, a context) and, when
//! anything is missing, the caller gets [`Backend::Cpu`] together with the reason in words.

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

/// The outcome of [`select`]: the backend to use and, when CUDA was not chosen, why.
#[derive(Debug, Clone)]
pub struct Selection {
    pub backend: Backend,
    pub cuda_unavailable: Option<String>,
}

/// Whether CUDA can be used on this machine, and if not, why (a sentence for a person).
pub fn probe_cuda() -> Result<cuda::DeviceInfo, String> {
    cuda::probe(0)
}

/// Picks a backend. `Preference::Cuda` on a machine without CUDA is an error carrying the reason;
/// `Auto` falls back to the CPU and reports the reason.
pub fn select(preference: Preference) -> Result<Selection, String> {
    match preference {
        Preference::Cpu => Ok(Selection {
            backend: Backend::Cpu,
            cuda_unavailable: None,
        }),
        Preference::Cuda => probe_cuda().map(|_| Selection {
            backend: Backend::Cuda,
            cuda_unavailable: None,
        }),
        Preference::Auto => Ok(match probe_cuda() {
            Ok(_) => Selection {
                backend: Backend::Cuda,
                cuda_unavailable: None,
            },
            Err(reason) => Selection {
                backend: Backend::Cpu,
                cuda_unavailable: Some(reason),
            },
        }),
    }
}
