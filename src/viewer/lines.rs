//! Line geometry of the 3D view: the ground grid, the camera trajectory and camera frustums,
//! built on the CPU as one line list (small: a few vertices per frame).

use bytemuck::{Pod, Zeroable};
use glam::{Mat4, Vec3};

use crate::frame::{FrameType, Intrinsics};

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
pub struct LineVertex {
    pub position: [f32; 3],
    /// RGBA, 8 bits each (read as unorm8x4).
    pub colour: [u8; 4],
}

/// A posed camera of the stream, as much as the 3D view draws of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CameraPose {
    pub frame: u64,
    pub frame_type: FrameType,
    pub world_from_camera: Mat4,
    pub intrinsics: Intrinsics,
}

impl CameraPose {
    pub fn position(&self) -> Vec3 {
        self.world_from_camera.w_axis.truncate()
    }
}

#[derive(Debug, Default, Clone)]
pub struct LineList {
    pub vertices: Vec<LineVertex>,
}

impl LineList {
    pub fn segment(&mut self, a: Vec3, b: Vec3, colour: [u8; 4]) {
        self.vertices.push(LineVertex {
            position: a.to_array(),
            colour,
        });
        self.vertices.push(LineVertex {
            position: b.to_array(),
            colour,
        });
    }

    /// A square grid on the plane through `centre` perpendicular to world up (-y).
    pub fn grid(&mut self, centre: Vec3, half_extent: f32, cells: u32) {
        let colour = [70, 70, 80, 255];
        let step = 2.0 * half_extent / cells.max(1) as f32;
        for i in 0..=cells {
            let t = -half_extent + step * i as f32;
            self.segment(
                centre + Vec3::new(t, 0.0, -half_extent),
                centre + Vec3::new(t, 0.0, half_extent),
                colour,
            );
            self.segment(
                centre + Vec3::new(-half_extent, 0.0, t),
                centre + Vec3::new(half_extent, 0.0, t),
                colour,
            );
        }
    }

    /// The path through all camera centres.
    pub fn trajectory(&mut self, poses: &[CameraPose]) {
        for pair in poses.windows(2) {
            self.segment(pair[0].position(), pair[1].position(), [255, 170, 40, 255]);
        }
    }

    /// A pyramid from the camera centre to its image plane at `depth`: four edges, the image
    /// rectangle, and a tick marking the image's top edge.
    pub fn frustum(&mut self, pose: &CameraPose, depth: f32, colour: [u8; 4]) {
        let k = pose.intrinsics;
        let (w, h) = (k.width.max(1) as f32, k.height.max(1) as f32);
        let (fx, fy) = (k.fx.max(1e-3), k.fy.max(1e-3));
        let at = |u: f32, v: f32| {
            let in_camera = Vec3::new((u - k.cx) / fx * depth, (v - k.cy) / fy * depth, depth);
            pose.world_from_camera.transform_point3(in_camera)
        };
        let centre = pose.position();
        let corners = [at(0.0, 0.0), at(w, 0.0), at(w, h), at(0.0, h)];
        for (i, &c) in corners.iter().enumerate() {
            self.segment(centre, c, colour);
            self.segment(c, corners[(i + 1) % 4], colour);
        }
        let tip = at(w * 0.5, -h * 0.15);
        self.segment(corners[0], tip, colour);
        self.segment(tip, corners[1], colour);
    }
}

/// Frustum colour by how the model used the frame; the newest camera stands out.
pub fn frustum_colour(frame_type: FrameType, newest: bool) -> [u8; 4] {
    if newest {
        return [255, 255, 255, 255];
    }
    match frame_type {
        FrameType::Scale => [220, 90, 220, 255],
        FrameType::Keyframe => [90, 200, 255, 255],
        FrameType::NonKeyframe => [120, 120, 140, 255],
    }
}

/// Which poses get a frustum: the most recent `recent` and every `every`-th before them, so
/// thousands of frames do not bury the cloud in wireframe.
pub fn frustum_indices(count: usize, recent: usize, every: usize) -> impl Iterator<Item = usize> {
    let every = every.max(1);
    let recent_start = count.saturating_sub(recent);
    (0..count).filter(move |&i| i >= recent_start || i % every == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pose(z: f32) -> CameraPose {
        CameraPose {
            frame: 0,
            frame_type: FrameType::Keyframe,
            world_from_camera: Mat4::from_translation(Vec3::new(0.0, 0.0, z)),
            intrinsics: Intrinsics {
                fx: 100.0,
                fy: 100.0,
                cx: 50.0,
                cy: 40.0,
                width: 100,
                height: 80,
            },
        }
    }

    #[test]
    fn frustum_reaches_the_image_plane() {
        let mut lines = LineList::default();
        lines.frustum(&pose(1.0), 0.5, [255; 4]);
        assert_eq!(lines.vertices.len() % 2, 0);
        // The image plane sits at camera z + depth.
        assert!(
            lines
                .vertices
                .iter()
                .any(|v| (v.position[2] - 1.5).abs() < 1e-5)
        );
        // The corner (0, 0) maps to x = -cx/fx·depth.
        assert!(
            lines
                .vertices
                .iter()
                .any(|v| (v.position[0] + 0.25).abs() < 1e-5)
        );
    }

    #[test]
    fn trajectory_joins_consecutive_centres() {
        let mut lines = LineList::default();
        lines.trajectory(&[pose(0.0), pose(1.0), pose(2.0)]);
        assert_eq!(lines.vertices.len(), 4);
    }

    #[test]
    fn frustum_selection_keeps_recent_and_sparse_history() {
        let picked: Vec<_> = frustum_indices(25, 3, 10).collect();
        assert_eq!(picked, vec![0, 10, 20, 22, 23, 24]);
        assert_eq!(frustum_indices(0, 3, 10).count(), 0);
    }
}
