//! From the camera head's pose encoding to cameras and world points.
//!
//! Convention (as the reference): the decoded `[R | t]` is world-from-camera (camera-to-world),
//! so a point in camera space maps to the world as `R · p + t`.

use super::spec::POSE_ENC_LEN;

/// A decoded camera.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Camera {
    /// `[R | t]`, row-major 3×4, world-from-camera.
    pub world_from_camera: [[f32; 4]; 3],
    /// Pinhole intrinsics, row-major 3×3.
    pub intrinsics: [[f32; 3]; 3],
}

/// Decode `[t(3), q xyzw (4), fov_h, fov_w]` for an image of `height × width` pixels. The
/// quaternion need not be unit length (`2/|q|²` normalises it), as in the reference.
pub fn decode_pose(enc: &[f32; POSE_ENC_LEN], height: usize, width: usize) -> Camera {
    let [tx, ty, tz, i, j, k, r, fov_h, fov_w] = *enc;
    let two_s = 2.0 / (i * i + j * j + k * k + r * r);
    let rot = [
        [
            1.0 - two_s * (j * j + k * k),
            two_s * (i * j - k * r),
            two_s * (i * k + j * r),
        ],
        [
            two_s * (i * j + k * r),
            1.0 - two_s * (i * i + k * k),
            two_s * (j * k - i * r),
        ],
        [
            two_s * (i * k - j * r),
            two_s * (j * k + i * r),
            1.0 - two_s * (i * i + j * j),
        ],
    ];
    let t = [tx, ty, tz];
    let mut world_from_camera = [[0.0f32; 4]; 3];
    for row in 0..3 {
        world_from_camera[row][..3].copy_from_slice(&rot[row]);
        world_from_camera[row][3] = t[row];
    }
    let (h, w) = (height as f32, width as f32);
    let fy = (h / 2.0) / (fov_h / 2.0).tan();
    let fx = (w / 2.0) / (fov_w / 2.0).tan();
    Camera {
        world_from_camera,
        intrinsics: [[fx, 0.0, w / 2.0], [0.0, fy, h / 2.0], [0.0, 0.0, 1.0]],
    }
}

/// World points `[H][W][3]` of a depth map `[H][W]`: pixel (u = column, v = row), no half-pixel
/// offset, `p_cam = ((u − cx) d / fx, (v − cy) d / fy, d)`, then `R p_cam + t`.
pub fn unproject_to_world(depth: &[f32], height: usize, width: usize, cam: &Camera) -> Vec<f32> {
    let k = cam.intrinsics;
    let (fx, fy, cx, cy) = (k[0][0], k[1][1], k[0][2], k[1][2]);
    let m = cam.world_from_camera;
    let mut out = Vec::with_capacity(height * width * 3);
    for v in 0..height {
        for u in 0..width {
            let d = depth[v * width + u];
            let pc = [(u as f32 - cx) * d / fx, (v as f32 - cy) * d / fy, d];
            for row in m.iter() {
                out.push(row[0] * pc[0] + row[1] * pc[1] + row[2] * pc[2] + row[3]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_quaternion_and_square_fov() {
        let half_pi = std::f32::consts::FRAC_PI_2;
        let cam = decode_pose(
            &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 2.0, half_pi, half_pi],
            10,
            20,
        );
        assert_eq!(cam.world_from_camera[0], [1.0, 0.0, 0.0, 1.0]);
        assert_eq!(cam.world_from_camera[2], [0.0, 0.0, 1.0, 3.0]);
        assert!((cam.intrinsics[0][0] - 10.0).abs() < 1e-5);
        assert!((cam.intrinsics[1][1] - 5.0).abs() < 1e-5);
        let pts = unproject_to_world(&[2.0; 200], 10, 20, &cam);
        // Pixel (u=10, v=5) is the principal point: straight ahead.
        let at = (5 * 20 + 10) * 3;
        assert_eq!(&pts[at..at + 3], &[1.0, 2.0, 5.0]);
    }
}
