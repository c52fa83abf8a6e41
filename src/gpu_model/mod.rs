//! The whole GCT model on one NVIDIA GPU: bf16 weights and activations with f32 accumulation,
//! the paged KV cache on the device, a static memory plan fixed at session start, and the
//! streaming frame step captured as a CUDA graph (one graph per step kind) after warm-up.
//!
//! - the weights: `GctModel<Device>` (backend::cuda::storage), the same tree as the CPU model's,
//!   streamed from the checkpoint to the device once per model.
//! - [`transformer`]: one pre-norm block on the device (DINO, frame and global blocks).
//! - [`engine`]: a stream's session: buffers, page table, phase 1 / phase 2, graphs, outputs.
//! - [`frame_model`]: the pipeline's `FrameModel` on top of the engine.
//! - [`preprocess`]: the model's input made on the device from decoded 8-bit frames.
//! - [`camera_head`], [`dpt_head`], [`unproject`]: the heads and the point output.
//!
//! See docs/gpu-model.md.

pub mod camera_head;
pub mod dpt_head;
pub mod engine;
pub mod frame_model;
pub mod preprocess;
pub mod transformer;
pub mod unproject;
