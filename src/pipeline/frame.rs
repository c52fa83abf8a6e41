//! From one model call to the `FrameResult`s of its frames: poses as matrices, unprojection,
//! the confidence filter and the per-stage timings.

use std::time::Instant;

use glam::Mat4;

use crate::model::pose::{Camera, unproject_to_world};

use super::capture_thread::{FramePixels, InputFrame};
use super::model::ModelStep;
use crate::frame::{
    CacheSnapshot, FramePoints, FrameResult, FrameType, Intrinsics, RgbImage, StageTime,
};

/// Which points of a depth map make it into the result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PointFilter {
    /// Keep points with confidence above this (the demo's default is 1.5; confidence ≥ 1).
    pub min_confidence: f32,
    /// Keep every n-th point that passed (the demo keeps every 10th).
    pub stride: usize,
}

impl Default for PointFilter {
    fn default() -> Self {
        PointFilter {
            min_confidence: 1.5,
            stride: 10,
        }
    }
}

/// `world_from_camera` as a 4×4 from the model's row-major `[R | t]`.
pub fn world_from_camera(camera: &Camera) -> Mat4 {
    let m = camera.world_from_camera;
    Mat4::from_cols_array_2d(&[
        [m[0][0], m[1][0], m[2][0], 0.0],
        [m[0][1], m[1][1], m[2][1], 0.0],
        [m[0][2], m[1][2], m[2][2], 0.0],
        [m[0][3], m[1][3], m[2][3], 1.0],
    ])
}

/// The inverse of a rigid `world_from_camera`: `[Rᵀ | −Rᵀ t]`.
pub fn camera_from_world(world_from_camera: Mat4) -> Mat4 {
    let rotation = glam::Mat3::from_mat4(world_from_camera);
    let t = world_from_camera.w_axis.truncate();
    let rt = rotation.transpose();
    Mat4::from_cols(
        rt.x_axis.extend(0.0),
        rt.y_axis.extend(0.0),
        rt.z_axis.extend(0.0),
        (-(rt * t)).extend(1.0),
    )
}

pub(crate) struct CallContext<'a> {
    pub step: &'a ModelStep,
    /// Each frame's kind: a two-frame step may hold a keyframe and a non-keyframe.
    pub frame_types: &'a [FrameType],
    pub cache: CacheSnapshot,
    pub filter: PointFilter,
    /// The frames' model input as 8-bit RGB, when the backend preprocessed them.
    pub model_rgb: Option<Vec<RgbImage>>,
}

/// Results of every frame of a call, in order. A multi-frame call (the scale frames, a
/// two-frame step) shares its model time equally among its frames, and its cache events go with
/// its first frame.
pub(crate) fn build_results(
    ctx: CallContext<'_>,
    inputs: Vec<InputFrame>,
    received_at: &[Instant],
) -> Vec<FrameResult> {
    let step = ctx.step;
    let (h, w) = (step.height, step.width);
    let plane = h * w;
    let share = 1.0 / step.frames.max(1) as f64;
    let mut out = Vec::with_capacity(inputs.len());
    let mut device_rgb = ctx.model_rgb.map(|v| v.into_iter());
    for (f, input) in inputs.into_iter().enumerate() {
        let image = match input.pixels {
            FramePixels::Host { model_rgb, .. } => model_rgb,
            // A backend that preprocessed returns one image per frame (checked by the caller).
            FramePixels::Decoded(_) => device_rgb
                .as_mut()
                .and_then(|it| it.next())
                .unwrap_or_default(),
        };
        let camera = &step.cameras[f];
        let depth = step.depth[f * plane..(f + 1) * plane].to_vec();
        let confidence = step.depth_conf[f * plane..(f + 1) * plane].to_vec();

        let clock = Instant::now();
        // The backend's own points when it kept them (GPU), else unproject and filter here.
        let backend_points = step.points.as_ref().and_then(|p| p.get(f)).cloned();
        let world = match backend_points {
            Some(_) => Vec::new(),
            None => unproject_to_world(&depth, h, w, camera),
        };
        let unprojection_ms = clock.elapsed().as_secs_f64() * 1e3;

        let clock = Instant::now();
        let points = match backend_points {
            Some(p) => p,
            None => filter_points(&world, &confidence, &image.data, ctx.filter),
        };
        let k = camera.intrinsics;
        let world_from_camera = world_from_camera(camera);
        let mut timings = vec![
            stage("capture", input.capture_ms),
            stage("decode", input.decode_ms),
            stage("preprocess", input.preprocess_ms),
            stage(
                "handoff",
                received_at[f]
                    .saturating_duration_since(input.sent_at)
                    .as_secs_f64()
                    * 1e3,
            ),
        ];
        timings.extend(step.stages.iter().map(|s| stage(&s.stage, s.ms * share)));
        timings.push(stage("unprojection", unprojection_ms));
        let mut cache = ctx.cache.clone();
        if f > 0 {
            cache.events.clear();
        }
        timings.push(stage("points", clock.elapsed().as_secs_f64() * 1e3));
        out.push(FrameResult {
            frame: input.index,
            origin: input.origin,
            frame_type: ctx.frame_types[f],
            world_from_camera,
            camera_from_world: camera_from_world(world_from_camera),
            intrinsics: Intrinsics {
                fx: k[0][0],
                fy: k[1][1],
                cx: k[0][2],
                cy: k[1][2],
                width: w as u32,
                height: h as u32,
            },
            points,
            image,
            depth,
            confidence,
            cache,
            timings,
            dropped_before: input.dropped_before,
        });
    }
    out
}

fn stage(name: &str, ms: f64) -> StageTime {
    StageTime {
        stage: name.to_owned(),
        ms,
    }
}

/// Finite points above the confidence threshold, every `stride`-th of them.
pub fn filter_points(
    world_xyz: &[f32],
    confidence: &[f32],
    rgb: &[u8],
    filter: PointFilter,
) -> FramePoints {
    let mut points = FramePoints::default();
    let stride = filter.stride.max(1);
    let mut passed = 0usize;
    for (i, &conf) in confidence.iter().enumerate() {
        let p = [world_xyz[3 * i], world_xyz[3 * i + 1], world_xyz[3 * i + 2]];
        // NaN confidence fails the comparison and is dropped too.
        let confident = conf > filter.min_confidence;
        if !confident || !p.iter().all(|v| v.is_finite()) {
            continue;
        }
        passed += 1;
        if !(passed - 1).is_multiple_of(stride) {
            continue;
        }
        points.xyz.push(p);
        points
            .rgb
            .push([rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2]]);
        points.confidence.push(conf);
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rigid_inverse_round_trips() {
        let m = Mat4::from_rotation_translation(
            glam::Quat::from_euler(glam::EulerRot::YXZ, 0.3, -0.2, 0.1),
            glam::Vec3::new(1.0, -2.0, 0.5),
        );
        let prod = camera_from_world(m) * m;
        assert!(prod.abs_diff_eq(Mat4::IDENTITY, 1e-5), "{prod}");
    }

    #[test]
    fn filter_keeps_confident_finite_points_with_stride() {
        let xyz = vec![
            0.0,
            0.0,
            1.0, //
            f32::NAN,
            0.0,
            1.0, //
            1.0,
            0.0,
            1.0, //
            2.0,
            0.0,
            1.0, //
            3.0,
            0.0,
            1.0,
        ];
        let conf = vec![2.0, 2.0, 1.2, 2.0, 2.0];
        let rgb: Vec<u8> = (0..15).collect();
        let p = filter_points(
            &xyz,
            &conf,
            &rgb,
            PointFilter {
                min_confidence: 1.5,
                stride: 2,
            },
        );
        // Passing: points 0, 3, 4; stride 2 keeps the 1st and 3rd of them.
        assert_eq!(p.xyz, vec![[0.0, 0.0, 1.0], [3.0, 0.0, 1.0]]);
        assert_eq!(p.rgb, vec![[0, 1, 2], [12, 13, 14]]);
    }
}
