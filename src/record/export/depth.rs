//! The recorded depth and confidence maps, one pair of 16-bit grayscale PNGs per frame
//! (`NAME.depth.png`, `NAME.confidence.png`, NAME as the COLMAP model-input image without
//! `.jpg`), and `depth.json` beside them with each map's scale: value = PNG level × scale
//! (level 0 = no value: a missing, non-finite or non-positive depth). Scales are per frame,
//! `max / 65535`, so a map keeps 16 bits over its own range. The maps are at the model's
//! input size; `depth.json` also gives that frame's intrinsics on it (pixel centres at
//! integers, as the session records them) and its camera-to-world pose in the export's world.

use std::ops::Range;
use std::path::Path;

use serde_json::json;

use crate::frame::camera::row_major;
use crate::record::{FrameInfo, Parts, RecordError, SessionReader};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DepthReport {
    pub frames: usize,
    /// Frames with no depth map recorded (or a damaged one): left out.
    pub frames_without_depth: usize,
}

/// 16-bit levels of `values` and the scale back (`value = level × scale`).
fn quantise(values: &[f32]) -> (Vec<u16>, f64) {
    let max = values
        .iter()
        .filter(|v| v.is_finite() && **v > 0.0)
        .fold(0.0f32, |m, v| m.max(*v));
    if max <= 0.0 {
        return (vec![0; values.len()], 0.0);
    }
    let scale = f64::from(max) / 65535.0;
    let levels = values
        .iter()
        .map(|&v| {
            if v.is_finite() && v > 0.0 {
                // At least 1: a tiny positive value is still a value, not "none".
                ((f64::from(v) / scale).round() as u16).max(1)
            } else {
                0
            }
        })
        .collect();
    (levels, scale)
}

fn save_png(path: &Path, width: u32, height: u32, levels: Vec<u16>) -> Result<(), RecordError> {
    let img = image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::from_raw(width, height, levels)
        .ok_or_else(|| RecordError::Export {
            path: path.to_path_buf(),
            what: "map size does not match its frame".into(),
        })?;
    img.save(path).map_err(|e| RecordError::Export {
        path: path.to_path_buf(),
        what: e.to_string(),
    })
}

/// Writes the maps of `frames` into `dir` (built aside, swapped in whole). `posed` are those
/// frames with their poses in the export world ([`super::Up::frames`]).
pub fn export_depth(
    dir: &Path,
    reader: &SessionReader,
    frames: Range<usize>,
    posed: &[FrameInfo],
) -> Result<DepthReport, RecordError> {
    let mut plan = super::OutputPlan::new(&[reader.path()], true);
    plan.claim("depth folder", dir, super::OutputKind::DepthDir)?;
    let names = super::colmap::image_names(reader);
    super::output::write_dir(dir, |built| {
        let mut report = DepthReport::default();
        let mut entries = Vec::new();
        for (i, info) in frames.clone().zip(posed) {
            let Some(k) = info.intrinsics else {
                report.frames_without_depth += 1;
                continue;
            };
            let maps = reader.read_frame(
                i,
                Parts {
                    image: false,
                    maps: true,
                },
            )?;
            let n = (k.width * k.height) as usize;
            if maps.depth.len() != n {
                report.frames_without_depth += 1;
                continue;
            }
            let stem = names[i].trim_end_matches(".jpg").to_string();
            let (depth, depth_scale) = quantise(&maps.depth);
            let depth_file = format!("{stem}.depth.png");
            save_png(&built.join(&depth_file), k.width, k.height, depth)?;
            let mut entry = json!({
                "frame": info.frame,
                "source": info.origin.name,
                "width": k.width,
                "height": k.height,
                "depth": depth_file,
                "depth_scale": depth_scale,
                "fx": k.fx, "fy": k.fy, "cx": k.cx, "cy": k.cy,
                "world_from_camera": row_major(&info.world_from_camera),
            });
            if maps.confidence.len() == n {
                let (conf, conf_scale) = quantise(&maps.confidence);
                let conf_file = format!("{stem}.confidence.png");
                save_png(&built.join(&conf_file), k.width, k.height, conf)?;
                entry["confidence"] = conf_file.into();
                entry["confidence_scale"] = conf_scale.into();
            }
            entries.push(entry);
            report.frames += 1;
        }
        let doc = json!({
            "format": "value = 16-bit PNG level × scale; level 0: no value",
            "depth": "z depth along the camera's optical axis, in the session's scene units",
            "intrinsics": "model input pixels, pixel centres at integer coordinates",
            "frames": entries,
        });
        super::write_file(&built.join("depth.json"), |w| {
            serde_json::to_writer_pretty(&mut *w, &doc).map_err(std::io::Error::other)
        })?;
        Ok(report)
    })
}
