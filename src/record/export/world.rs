//! The one world frame every export writes in. By default it is the model's own (OpenCV-like:
//! x right, y down, z forward, from the first frame's camera), so the PLY, TUM, COLMAP, GLB
//! and nerfstudio files of one session hold the same numbers for the same point. `--up` turns
//! the world (a rotation about x, nothing else) for tools that want another axis up:
//!
//! | `--up` | export (x, y, z) from the model's (x, y, z) | up is |
//! |---|---|---|
//! | `-y` (default) | (x, y, z) | −y, as the model's first camera sees it |
//! | `y` | (x, −y, −z) | +y (glTF, three.js, nerfstudio's viewer) |
//! | `z` | (x, z, −y) | +z (Blender, Open3D's and most GIS tools' habit) |

use glam::{Mat3, Mat4, Vec3};

use super::Cloud;
use crate::record::FrameInfo;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Up {
    /// The model's frame as it is.
    #[default]
    NegY,
    Y,
    Z,
}

impl Up {
    /// Export world from model world.
    pub fn rotation(self) -> Mat3 {
        match self {
            Up::NegY => Mat3::IDENTITY,
            Up::Y => Mat3::from_diagonal(Vec3::new(1.0, -1.0, -1.0)),
            // Columns: where the model's x, y, z go.
            Up::Z => Mat3::from_cols(Vec3::X, Vec3::new(0.0, 0.0, -1.0), Vec3::Y),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Up::NegY => "-y",
            Up::Y => "y",
            Up::Z => "z",
        }
    }

    /// The frames with their poses in the export world.
    pub fn frames(self, frames: &[FrameInfo]) -> Vec<FrameInfo> {
        let r = Mat4::from_mat3(self.rotation());
        frames
            .iter()
            .map(|f| {
                let mut f = f.clone();
                f.world_from_camera = r * f.world_from_camera;
                f.camera_from_world *= r.transpose();
                f
            })
            .collect()
    }

    /// The cloud (points and normals) in the export world.
    pub fn cloud(self, cloud: &mut Cloud) {
        if self == Up::NegY {
            return;
        }
        let r = self.rotation();
        for p in cloud.xyz.iter_mut().chain(cloud.normal.iter_mut()) {
            *p = (r * Vec3::from(*p)).to_array();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_up_is_a_proper_rotation_putting_the_models_up_there() {
        let model_up = Vec3::new(0.0, -1.0, 0.0);
        for (up, want) in [(Up::NegY, model_up), (Up::Y, Vec3::Y), (Up::Z, Vec3::Z)] {
            let r = up.rotation();
            assert!((r.determinant() - 1.0).abs() < 1e-6);
            assert!((r * model_up - want).length() < 1e-6, "{up:?}");
            assert!((r * Vec3::X - Vec3::X).length() < 1e-6, "x stays");
        }
    }
}
