//! Benchmarks of the GPU engine (`streamrecon bench`), each returning a report the caller prints.
//!
//! - [`attention`]: one global-attention layer at the shapes of docs/performance.md, paged (our
//!   kernel over the real `PageTable` plan) against the dense baseline (concatenate, then
//!   attend), every kernel the GPU has, with the error of each against a host reference.
//! - [`e2e`]: the whole model on the GPU frame by frame (random weights, synthetic images):
//!   per-frame wall, GPU and host time, percentiles, a per-stage breakdown and device memory.
//!
//! - [`viewer`]: the window's 3D view offscreen on a headless wgpu device (sprites and the
//!   compute rasteriser), per-frame GPU time at growing point counts.
//!
//! The first two need a CUDA GPU, the viewer bench any wgpu adapter; each says so when there is
//! none. Timings belong here and in `benches/`,
//! never in tests: a test that asserts a speed fails on a loaded or different machine.

pub mod attention;
pub mod cases;
pub mod e2e;
mod error;
pub mod viewer;

pub use error::BenchError;
