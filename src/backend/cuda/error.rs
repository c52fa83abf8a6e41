//! Errors of the CUDA backend.

/// Everything that can go wrong on the CUDA path. Missing libraries are reported here, never by a
/// panic inside cudarc: every entry point probes first.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is unavailable: {0}")]
    Unavailable(String),
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("NVRTC is unavailable: {0}")]
    NvrtcUnavailable(String),
    #[error("NVRTC could not compile {kernel}.cu for {target}:\n{log}")]
    Compile {
        kernel: String,
        target: String,
        log: String,
    },
    #[error("no CUDA kernel named `{0}` is registered")]
    UnknownKernel(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
}
