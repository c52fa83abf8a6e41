//! The camera trajectory in the TUM RGB-D format: `timestamp tx ty tz qx qy qz qw`, one line per
//! frame, the camera-to-world pose (camera centre and orientation in the world). The timestamp
//! is the frame's capture time, with every digit it has (see `CaptureTime::seconds_text`): a
//! camera's Unix time, a video's presentation time from the stream's start, the time a
//! TUM-style file name carries, or a nominal time; a version-1 session has only the seconds
//! since its recording started. A second comment line says which, so a reader comparing with
//! ground truth knows what the numbers are.

use std::io::{self, Write};
use std::path::Path;

use super::rotation_translation;
use crate::frame::TimeBase;
use crate::record::{FrameInfo, RecordError};

/// What the timestamps of a trajectory are, for its header.
pub fn time_base_text(base: TimeBase) -> &'static str {
    match base {
        TimeBase::Unix => "capture time, seconds since the Unix epoch",
        TimeBase::Stream => "video presentation time, seconds from the stream's start",
        TimeBase::FileName => "capture time from the file names",
        TimeBase::Nominal => "nominal time (no capture time known: --fps spacing or the index)",
        TimeBase::Recording => {
            "seconds since the recording started (a version-1 session records no capture time)"
        }
    }
}

pub fn write_tum(mut w: impl Write, frames: &[FrameInfo]) -> io::Result<usize> {
    writeln!(
        w,
        "# streamrecon trajectory: timestamp tx ty tz qx qy qz qw (camera to world)"
    )?;
    let mut bases: Vec<TimeBase> = Vec::new();
    for info in frames {
        if !bases.contains(&info.origin.time.base) {
            bases.push(info.origin.time.base);
        }
    }
    if !bases.is_empty() {
        let texts: Vec<&str> = bases.iter().map(|b| time_base_text(*b)).collect();
        writeln!(w, "# timestamps: {}", texts.join("; "))?;
    }
    for info in frames {
        let (q, t) = rotation_translation(&info.world_from_camera);
        writeln!(
            w,
            "{} {:.9} {:.9} {:.9} {:.9} {:.9} {:.9} {:.9}",
            info.origin.time.seconds_text(),
            t.x,
            t.y,
            t.z,
            q.x,
            q.y,
            q.z,
            q.w
        )?;
    }
    Ok(frames.len())
}

pub fn export_tum(path: &Path, frames: &[FrameInfo]) -> Result<usize, RecordError> {
    let mut n = 0;
    super::write_file(path, |w| {
        n = write_tum(w, frames)?;
        Ok(())
    })?;
    Ok(n)
}
