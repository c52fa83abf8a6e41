//! The camera trajectory in the TUM RGB-D format: `timestamp tx ty tz qx qy qz qw`, one line per
//! frame, the camera-to-world pose (camera centre and orientation in the world). The timestamp
//! is seconds since the recording started.

use std::io::{self, Write};
use std::path::Path;

use super::rotation_translation;
use crate::record::{RecordError, SessionReader};

pub fn write_tum(mut w: impl Write, reader: &SessionReader) -> io::Result<usize> {
    writeln!(
        w,
        "# streamrecon trajectory: timestamp tx ty tz qx qy qz qw (camera to world)"
    )?;
    for info in reader.frames() {
        let (q, t) = rotation_translation(&info.world_from_camera);
        writeln!(
            w,
            "{:.6} {:.9} {:.9} {:.9} {:.9} {:.9} {:.9} {:.9}",
            info.t_s, t.x, t.y, t.z, q.x, q.y, q.z, q.w
        )?;
    }
    Ok(reader.frames().len())
}

pub fn export_tum(path: &Path, reader: &SessionReader) -> Result<usize, RecordError> {
    let mut n = 0;
    super::write_file(path, |w| {
        n = write_tum(w, reader)?;
        Ok(())
    })?;
    Ok(n)
}
