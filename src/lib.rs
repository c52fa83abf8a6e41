//! streamrecon: a real-time 3D reconstruction viewer around the GCT streaming transformer.
//!
//! The library holds everything; `main.rs` only parses the command line. See `docs/` for the
//! architecture and `README.md` for how to run it.

pub mod attention;
pub mod backend;
pub mod bench;
pub mod capture;
pub mod cli;
pub mod error_chain;
pub mod frame;
pub mod gpu_model;
pub mod kvcache;
pub mod model;
pub mod parity;
pub mod pipeline;
pub mod record;
pub mod viewer;
