//! Binary little-endian PLY: x y z float, red green blue uchar, confidence float, frame uint.

use std::io::{self, Write};
use std::path::Path;

use super::Cloud;
use crate::record::RecordError;

pub fn write_ply(mut w: impl Write, cloud: &Cloud) -> io::Result<()> {
    write!(
        w,
        "ply\nformat binary_little_endian 1.0\ncomment streamrecon session export\n\
         element vertex {}\n\
         property float x\nproperty float y\nproperty float z\n\
         property uchar red\nproperty uchar green\nproperty uchar blue\n\
         property float confidence\nproperty uint frame\nend_header\n",
        cloud.len()
    )?;
    let mut row = [0u8; 23];
    for k in 0..cloud.len() {
        for (d, v) in cloud.xyz[k].iter().enumerate() {
            row[d * 4..d * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        row[12..15].copy_from_slice(&cloud.rgb[k]);
        row[15..19].copy_from_slice(&cloud.confidence[k].to_le_bytes());
        row[19..23].copy_from_slice(&cloud.frame[k].to_le_bytes());
        w.write_all(&row)?;
    }
    Ok(())
}

pub fn export_ply(path: &Path, cloud: &Cloud) -> Result<(), RecordError> {
    super::write_file(path, |w| write_ply(w, cloud))
}
