//! The CUDA backend over cudarc with dynamic loading: the binary builds and runs without CUDA, and
//! every entry point probes for the libraries before touching them (cudarc panics otherwise).
//!
//! - [`device`]: probing, the context and its stream, launch helpers.
//! - [`registry`]: `kernels/*.cu`, as CUBIN built by build.rs or compiled by [`nvrtc`] at run time.
//! - [`attention`]: the attention kernels, split-KV, and the views of the keys they read.
//! - [`kv`]: the paged K/V pools and the device page table, driven by the host's page plan;
//!   attention over a cache layer and the dense (concatenating) baseline. It depends on
//!   [`attention`], never the other way.
//! - [`small_m`]: the linear layer for a few rows (the camera head's products).
//! - [`storage`]: the model's weight tree on the device (`GctModel<Device>`) and its placement.

pub mod arena;
pub mod attention;
pub mod conv;
pub mod conv_sm90;
pub mod device;
mod error;
pub mod gemm;
pub mod kv;
pub mod nvrtc;
pub mod ops;
pub mod output_conv;
pub mod registry;
pub mod small_m;
pub mod storage;

pub use attention::{AttentionKernel, AttentionOptions, AttentionWorkspace, choose_splits};
pub use device::{CudaDevice, DeviceInfo, probe, profiler_range};
pub use error::CudaError;
pub use kv::{DenseBaseline, DeviceKvCache, FrameScalar, KvGeometry, PageTableUpload};
