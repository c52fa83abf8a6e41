//! Binary little-endian PLY: x y z float, nx ny nz float (with normals), red green blue uchar,
//! confidence float, frame int (a signed 32-bit index: Open3D's tensor reader drops `uint`).

use std::io::{self, Write};
use std::path::Path;

use super::Cloud;
use crate::record::RecordError;

pub fn write_ply(mut w: impl Write, cloud: &Cloud) -> io::Result<()> {
    let normals = !cloud.normal.is_empty();
    if normals && cloud.normal.len() != cloud.len() {
        return Err(io::Error::other("a normal for some points only"));
    }
    write!(
        w,
        "ply\nformat binary_little_endian 1.0\ncomment streamrecon session export\n\
         element vertex {}\n\
         property float x\nproperty float y\nproperty float z\n",
        cloud.len()
    )?;
    if normals {
        write!(
            w,
            "property float nx\nproperty float ny\nproperty float nz\n"
        )?;
    }
    write!(
        w,
        "property uchar red\nproperty uchar green\nproperty uchar blue\n\
         property float confidence\nproperty int frame\nend_header\n"
    )?;
    let mut row = Vec::with_capacity(35);
    for k in 0..cloud.len() {
        row.clear();
        for v in cloud.xyz[k] {
            row.extend_from_slice(&v.to_le_bytes());
        }
        if normals {
            for v in cloud.normal[k] {
                row.extend_from_slice(&v.to_le_bytes());
            }
        }
        row.extend_from_slice(&cloud.rgb[k]);
        row.extend_from_slice(&cloud.confidence[k].to_le_bytes());
        // Past i32 (two years of 30 fps) the index saturates rather than wraps.
        let frame = i32::try_from(cloud.frame[k]).unwrap_or(i32::MAX);
        row.extend_from_slice(&frame.to_le_bytes());
        w.write_all(&row)?;
    }
    Ok(())
}

pub fn export_ply(path: &Path, cloud: &Cloud) -> Result<(), RecordError> {
    super::write_file(path, |w| write_ply(w, cloud))
}
