//! Exports a session to formats other tools read: a binary PLY cloud, a TUM trajectory, a
//! COLMAP text model, a GLB scene. All read the session through `SessionReader`.

pub mod cloud;
pub mod colmap;
pub mod glb;
pub mod ply;
pub mod tum;
pub mod voxel;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use glam::{Mat4, Quat, Vec3};

use crate::record::RecordError;
pub use cloud::{Cloud, CloudOptions, gather_cloud};

/// Creates `path`, hands a buffered writer to `body`, flushes; every I/O error names the file.
pub(crate) fn write_file(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), RecordError> {
    let file = File::create(path).map_err(|e| RecordError::io(path, e))?;
    let mut w = BufWriter::new(file);
    body(&mut w)
        .and_then(|()| w.flush())
        .map_err(|e| RecordError::io(path, e))
}

/// Rotation and translation of a rigid transform. The model's poses are rigid up to float
/// noise; the rotation is re-orthonormalised through the quaternion.
pub fn rotation_translation(m: &Mat4) -> (Quat, Vec3) {
    let (_, rotation, translation) = m.to_scale_rotation_translation();
    (rotation.normalize(), translation)
}
