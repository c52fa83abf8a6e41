//! A nerfstudio dataset: `DIR/transforms.json` and `DIR/images/`, as `ns-train nerfacto --data
//! DIR` (its `nerfstudio-data` parser) reads it. The images and cameras are the COLMAP
//! export's (same names, same sizes, same intrinsics: nerfstudio also puts pixel centres at
//! +0.5); each frame carries its own `fl_x fl_y cx cy w h`, since the model predicts
//! intrinsics per frame. `transform_matrix` is camera-to-world in nerfstudio's (OpenGL)
//! camera convention, x right, y up, z backwards: the OpenCV-like camera's y and z negated.
//! The world is the export's ([`super::Up`]); no other re-centring or scaling is applied
//! (`"applied_transform"` is the identity), so the dataset overlays the other exports.

use std::ops::Range;
use std::path::Path;

use glam::{DMat4, DQuat, DVec3, DVec4};
use serde_json::json;

use super::Cloud;
use super::colmap::{self, ColmapOptions, ColmapReport, ImageMode};
use crate::record::{RecordError, SessionReader};

/// Camera-to-world (OpenGL camera axes) of a COLMAP image's world-to-camera pose.
fn transform_matrix(q: [f64; 4], t: [f64; 3]) -> [[f64; 4]; 4] {
    let camera_from_world =
        DMat4::from_rotation_translation(DQuat::from_xyzw(q[1], q[2], q[3], q[0]), DVec3::from(t));
    let gl = DMat4::from_diagonal(DVec4::new(1.0, -1.0, -1.0, 1.0));
    let m = camera_from_world.inverse() * gl;
    let c = m.to_cols_array_2d();
    // Row-major, as nerfstudio reads it.
    std::array::from_fn(|r| std::array::from_fn(|k| c[k][r]))
}

pub fn export_nerfstudio(
    dir: &Path,
    reader: &SessionReader,
    frames: Range<usize>,
    options: &ColmapOptions,
) -> Result<ColmapReport, RecordError> {
    let mut plan = super::OutputPlan::new(&[reader.path()], true);
    plan.claim("nerfstudio folder", dir, super::OutputKind::NerfstudioDir)?;
    let originals = match &options.images {
        ImageMode::Original(from) => Some(colmap::original_files(reader, frames.clone(), from)?),
        _ => None,
    };
    super::output::write_dir(dir, |built| {
        let mut report = ColmapReport::default();
        // The COLMAP model's cameras and poses; no points (a dataset has none).
        let no_points = ColmapOptions {
            max_points: 0,
            ..options.clone()
        };
        let (model, kept) = colmap::build_model(
            reader,
            frames.clone(),
            &Cloud::default(),
            &no_points,
            &mut report,
        );
        let entries: Vec<serde_json::Value> = model
            .images
            .iter()
            .zip(&model.cameras)
            .zip(&kept)
            .map(|((image, camera), &i)| {
                let [fx, fy, cx, cy] = camera.params;
                let info = &reader.frames()[i];
                json!({
                    "file_path": format!("images/{}", image.name),
                    "transform_matrix": transform_matrix(image.qvec, image.tvec),
                    "fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy,
                    "w": camera.width, "h": camera.height,
                    "frame": info.frame,
                    "capture_time": info.origin.time.seconds_text(),
                })
            })
            .collect();
        let transforms = json!({
            "camera_model": "OPENCV",
            "applied_transform": [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]],
            "frames": entries,
        });
        let path = built.join("transforms.json");
        super::write_file(&path, |w| {
            serde_json::to_writer_pretty(&mut *w, &transforms).map_err(std::io::Error::other)
        })?;
        colmap::place_images(
            &built.join("images"),
            reader,
            &model,
            &kept,
            &options.images,
            originals.as_deref().map(|files| (frames.start, files)),
            &mut report,
        )?;
        Ok(report)
    })
}
