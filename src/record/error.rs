//! Errors of the session format: every one names the file and, where there is one, the byte
//! offset, so a person can find the damage with a hex viewer.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A write (or sync) failed: a full disk, a removed drive. Recording stops here.
    #[error("{path} at byte {offset}: writing the session failed: {source}")]
    Write {
        path: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a streamrecon session (no session magic at byte 0)")]
    NotASession { path: PathBuf },
    #[error("{path}: session format version {found}; this build reads up to version {supported}")]
    Version {
        path: PathBuf,
        found: u16,
        supported: u16,
    },
    /// Damaged bytes: a checksum mismatch or a payload that does not decode.
    #[error("{path} at byte {offset}: {what}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// Something the writer was given cannot be stored (e.g. an image whose size does not match
    /// its pixels).
    #[error("{path}: cannot record frame {frame}: {what}")]
    Encode {
        path: PathBuf,
        frame: u64,
        what: String,
    },
    #[error("{path}: {what}")]
    Export { path: PathBuf, what: String },
    /// An export output that would destroy an input or an existing file.
    #[error("{flag} {path}: {what}")]
    Output {
        flag: String,
        path: PathBuf,
        what: String,
    },
    #[error("{path} already holds files; choose a new session directory")]
    NotEmpty { path: PathBuf },
    #[error("{dir}: too many sessions named session-{stamp}")]
    NoFreeName { dir: PathBuf, stamp: String },
    #[error("starting a recording thread: {0}")]
    Spawn(#[source] io::Error),
}

/// Whether an I/O error means the disk (or the user's quota) has no room left.
pub fn is_disk_full_io(e: &io::Error) -> bool {
    #[cfg(unix)]
    const FULL: [i32; 2] = [28, 122]; // ENOSPC, EDQUOT
    #[cfg(not(unix))]
    const FULL: [i32; 0] = [];
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || e.raw_os_error().is_some_and(|n| FULL.contains(&n))
}

impl RecordError {
    /// A write failed because the disk is full: said as such, with what was kept.
    pub fn is_disk_full(&self) -> bool {
        match self {
            RecordError::Io { source, .. } | RecordError::Write { source, .. } => {
                is_disk_full_io(source)
            }
            _ => false,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
