//! The GCT streaming model (LingBot-Map architecture) on the CPU, in f32.
//!
//! Layout: `config` (sizes), `weights` (checkpoint reading), `ops` (the small set of CPU kernels
//! everything is written over), the network pieces (`dino`, `block`, `aggregator`,
//! `camera_head`, `dpt_head`), `pose` (decoding and unprojection), `preprocess` (image loading
//! as the reference does it) and `stream` (phase 1 / phase 2 driver with the KV caches).
//! See docs/model.md.

pub mod config;
pub mod error;
pub mod ops;
pub mod tensor;
pub mod timing;
pub mod weights;

pub use config::ModelConfig;
pub use error::ModelError;
pub use tensor::Tensor;

pub mod aggregator;
pub mod block;
pub mod camera_head;
pub mod dino;
pub mod dpt_head;
pub mod loading;
pub mod pose;
pub mod preprocess;
pub mod record;
pub mod spec;
pub mod storage;
pub mod stream;

pub use record::Recorder;
pub use stream::{Call, FrameFeeder, GctModel, StepOutput, StreamState, streaming_schedule};
