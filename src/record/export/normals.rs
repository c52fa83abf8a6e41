//! Normals of the recorded points from their frame's depth map: a point is projected into its
//! frame, and the depth map's neighbours left/right and above/below it, lifted back to 3D,
//! span its surface; the normal is their cross product, turned to face the camera. A point at
//! the map's border or next to a missing depth gets the direction back to the camera instead
//! (it is what the camera saw of it), so every point has a unit normal.

use glam::{Mat4, Vec3};

use crate::frame::Intrinsics;

/// The camera-frame point of pixel (u, v) at its depth; `None` without a usable depth.
fn lift(depth: &[f32], k: &Intrinsics, u: i64, v: i64) -> Option<Vec3> {
    let (w, h) = (i64::from(k.width), i64::from(k.height));
    if u < 0 || v < 0 || u >= w || v >= h {
        return None;
    }
    let z = *depth.get((v * w + u) as usize)?;
    (z.is_finite() && z > 0.0).then(|| {
        Vec3::new(
            (u as f32 - k.cx) / k.fx * z,
            (v as f32 - k.cy) / k.fy * z,
            z,
        )
    })
}

/// World-frame unit normals of `points` (world), seen by a camera with `k` and the pose
/// `camera_from_world`, from its `depth` map (`k.width × k.height`, z depth).
pub fn normals_from_depth(
    points: &[[f32; 3]],
    depth: &[f32],
    k: &Intrinsics,
    camera_from_world: &Mat4,
) -> Vec<[f32; 3]> {
    let world_from_camera = camera_from_world.inverse();
    points
        .iter()
        .map(|p| {
            let c = camera_from_world.transform_point3(Vec3::from(*p));
            let towards_camera = (-c).normalize_or(Vec3::NEG_Z);
            let u = (k.fx * c.x / c.z + k.cx).round() as i64;
            let v = (k.fy * c.y / c.z + k.cy).round() as i64;
            let n = (c.z > 0.0 && k.fx > 0.0 && k.fy > 0.0)
                .then(|| {
                    let dx = lift(depth, k, u + 1, v)? - lift(depth, k, u - 1, v)?;
                    let dy = lift(depth, k, u, v + 1)? - lift(depth, k, u, v - 1)?;
                    let n = dx.cross(dy).try_normalize()?;
                    Some(if n.dot(towards_camera) < 0.0 { -n } else { n })
                })
                .flatten()
                .unwrap_or(towards_camera);
            world_from_camera
                .transform_vector3(n)
                .normalize()
                .to_array()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tilted_plane_gets_its_normal() {
        let k = Intrinsics {
            fx: 50.0,
            fy: 50.0,
            cx: 16.0,
            cy: 12.0,
            width: 32,
            height: 24,
        };
        // The plane z = 2 + 0.5 y (camera frame): normal ∝ (0, -0.5, 1), facing the camera.
        let mut depth = vec![0.0f32; 32 * 24];
        for v in 0..24 {
            for u in 0..32 {
                // z = 2 + 0.5 * (v - cy) / fy * z  →  z = 2 / (1 - 0.5 (v - cy) / fy)
                depth[v * 32 + u] = 2.0 / (1.0 - 0.5 * (v as f32 - 12.0) / 50.0);
            }
        }
        let pose = Mat4::IDENTITY;
        let z = depth[12 * 32 + 16];
        let n = normals_from_depth(&[[0.0, 0.0, z]], &depth, &k, &pose)[0];
        let want = Vec3::new(0.0, 0.5, -1.0).normalize();
        assert!((Vec3::from(n) - want).length() < 1e-3, "{n:?} vs {want}");
        // At the border: the direction back to the camera.
        let edge = [(-16.0 / 50.0) * 2.0, 0.0, 2.0];
        let n = Vec3::from(normals_from_depth(&[edge], &depth, &k, &pose)[0]);
        assert!((n - (-Vec3::from(edge)).normalize()).length() < 1e-5);
    }
}
