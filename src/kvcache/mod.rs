//! The two-stream paged KV cache of the global attention layers.
//!
//! * `config`: geometry and residency rules.
//! * `table`: the bookkeeping (one plan per frame step for every layer; backend-free).
//! * `plan`: what a step writes and what its attention reads (CSR page table).
//! * `pair`: two streaming frames planned as one step, each with its own view.
//! * `storage`: host pages `[layer][page][K|V][page_size][heads][head_dim]`.
//! * `events`: events and stats for the UI and the recorder.
//! * `sim`: the table driven over a stream without a model (`cache-sim`).

mod config;
mod error;
mod events;
mod pair;
mod plan;
pub mod sim;
mod storage;
mod table;

pub use config::{
    CacheConfig, SpecialPoolConfig, SpecialPoolFull, StorageDtype, UnknownPoolPolicy,
};
pub use error::CacheError;
pub use events::{CacheEvent, CacheStats, PageState, PatchStream};
pub use pair::PairPlan;
pub use plan::{PagePlan, StepPlan, TokenRun};
pub use storage::{HostKvStore, KvBuf, KvElem};
pub use table::{PageTable, StepKind, TableSnapshot};
