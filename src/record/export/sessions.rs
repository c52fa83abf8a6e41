//! The model sessions of a recording. A reset (asked for, or the keyframe budget spent) starts
//! a new model session whose world frame and scale are its own: its points and poses are not
//! aligned with the session before, so an export never merges two.
//!
//! A new session starts where the recorder noted `session reset: …`, and where a scale frame
//! (a new session's first frames are scale frames) follows a frame that is not one (a notice
//! the recorder could not write does not merge sessions).

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::frame::FrameType;
use crate::record::SessionReader;

/// The prefix of the recorder's notice for a reset (`record::relay`).
pub const RESET_NOTICE: &str = "session reset";

/// The reader's frames split into model sessions, in order; one range for a recording without
/// a reset, none for an empty one.
pub fn model_sessions(reader: &SessionReader) -> Vec<Range<usize>> {
    let frames = reader.frames();
    let mut starts: Vec<usize> = reader
        .notices()
        .iter()
        .zip(reader.notice_frames())
        .filter(|(n, _)| n.message.starts_with(RESET_NOTICE))
        .map(|(_, &at)| at)
        .collect();
    for i in 1..frames.len() {
        if frames[i].frame_type == FrameType::Scale && frames[i - 1].frame_type != FrameType::Scale
        {
            starts.push(i);
        }
    }
    starts.retain(|&s| s > 0 && s < frames.len());
    starts.sort_unstable();
    starts.dedup();
    let mut out = Vec::new();
    let mut begin = 0;
    for s in starts.into_iter().chain([frames.len()]) {
        if s > begin {
            out.push(begin..s);
        }
        begin = s;
    }
    out
}

/// `path` with `-session-N` before its extension (`cloud.ply` → `cloud-session-2.ply`,
/// `colmap` → `colmap-session-2`): session N's output when each session gets its own.
pub fn suffixed(path: &Path, n: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-session-{n}.{}", ext.to_string_lossy()),
        None => format!("{stem}-session-{n}"),
    };
    path.with_file_name(name)
}
