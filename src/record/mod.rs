//! Sessions on disk: the file format (versioned header, append-only checksummed records, an
//! index at close), the writer and the reader, the recorder thread that never blocks the
//! pipeline, and the exporters (PLY, TUM, COLMAP, GLB). `docs/recording-format.md` is the
//! byte-level description.
//!
//! * `format`: header, record framing, footer; `codec`: the payload of each record kind;
//!   `cache_codec`: the cache snapshot as stored.
//! * `writer`: `SessionWriter` over any `Write`; `reader`: `SessionReader` (index or scan).
//! * `recorder`: `SessionRecorder`, the thread fed by a bounded queue of `Arc<FrameResult>`.
//! * `relay`: which pipeline events a recording keeps, and `RecordingRelay`, which starts and
//!   stops recordings while a pipeline runs; `session_name`: timestamped file names.
//! * `replay`: `Player`, the pace of a replay; `export`: other tools' formats; `sample`: a
//!   synthetic result for tests.

pub mod cache_codec;
pub mod codec;
pub mod error;
pub mod export;
pub mod format;
pub mod reader;
pub mod recorder;
pub mod relay;
pub mod replay;
pub mod sample;
pub mod session_dir;
pub mod session_name;
pub mod writer;

pub use codec::Notice;
pub use error::RecordError;
pub use format::RecordKind;
pub use reader::{FrameInfo, IssueKind, Parts, ReadIssue, SessionReader};
pub use recorder::{
    FlushOnly, Offer, RecorderOptions, RecorderStatus, SessionRecorder, SessionSink,
};
pub use relay::{RecordingRelay, record_event, recorder_note, recording_summary};
pub use replay::{Player, ReplayOptions};
pub use session_dir::SessionDir;
pub use session_name::new_session_path;
pub use writer::SessionWriter;

/// The file name `run --out SESSION` writes inside the session directory.
pub const SESSION_FILE: &str = "session.srec";
