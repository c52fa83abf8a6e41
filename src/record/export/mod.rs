//! Exports a session to formats other tools read: a binary PLY cloud, a TUM trajectory, a
//! COLMAP text model, a GLB scene. All read the session through `SessionReader`.

pub mod camera_geometry;
pub mod cloud;
pub mod colmap;
pub mod colmap_io;
pub mod depth;
pub mod glb;
pub mod nerfstudio;
pub mod normals;
pub mod output;
pub mod ply;
pub mod sessions;
pub mod tum;
pub mod voxel;
pub mod world;

use glam::{Mat4, Quat, Vec3};

pub use cloud::{Cloud, CloudOptions, gather_cloud, gather_cloud_in};
pub use output::{OutputKind, OutputPlan};
pub(crate) use output::{write_file, write_file_unsynced};
pub use world::Up;

/// Rotation and translation of a rigid transform. The model's poses are rigid up to float
/// noise; the rotation is re-orthonormalised through the quaternion.
pub fn rotation_translation(m: &Mat4) -> (Quat, Vec3) {
    let (_, rotation, translation) = m.to_scale_rotation_translation();
    (rotation.normalize(), translation)
}
