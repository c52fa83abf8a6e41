//! Sessions on disk: the file format (versioned header, append-only checksummed records, an
//! index at close), the writer and the reader, the recorder thread that never blocks the
//! pipeline, and the exporters (PLY, TUM, COLMAP, GLB). `docs/recording-format.md` is the
//! byte-level description.
//!
//! * `format`: header, record framing, footer; `codec`: the payload of each record kind;
//!   `cache_codec`: the cache snapshot as stored.
//! * `writer`: `SessionWriter` over any `Write`; `reader`: `SessionReader` (index or scan).
//! * `recorder`: `Recorder`, the thread fed by a bounded queue of `Arc<FrameResult>`.
//! * `replay`: `Player`, the pace of a replay; `export`: other tools' formats; `sample`: a
//!   synthetic result for tests.

pub mod cache_codec;
pub mod codec;
pub mod error;
pub mod export;
pub mod format;
pub mod reader;
pub mod recorder;
pub mod replay;
pub mod sample;
pub mod writer;

pub use codec::Notice;
pub use error::RecordError;
pub use format::RecordKind;
pub use reader::{FrameInfo, IssueKind, Parts, ReadIssue, SessionReader};
pub use recorder::{FlushOnly, Offer, Recorder, RecorderOptions, RecorderStatus, SessionSink};
pub use replay::{Player, ReplayOptions};
pub use writer::SessionWriter;

/// The file name `run --out SESSION` writes inside the session directory.
pub const SESSION_FILE: &str = "session.srec";
