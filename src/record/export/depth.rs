//! The recorded depth and confidence maps, one pair of 16-bit grayscale PNGs per frame
//! (`NAME.depth.png`, `NAME.confidence.png`, NAME as the COLMAP model-input image without
//! `.jpg`), and `depth.json` beside them with each map's scale: value = PNG level × scale
//! (level 0 = no value: a missing, non-finite or non-positive depth). Scales are per frame,
//! `max / 65535`, so a map keeps 16 bits over its own range. The maps are at the model's
//! input size; `depth.json` also gives that frame's intrinsics on it (pixel centres at
//! integers, as the session records them) and its camera-to-world pose in the export's world.
//! [`DepthFormat::Npy`] writes float32 `.npy` files instead, values as recorded.

use std::ops::Range;
use std::path::Path;

use serde_json::json;

use crate::frame::camera::row_major;
use crate::record::{FrameInfo, Parts, RecordError, SessionReader};

/// How the maps are stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DepthFormat {
    /// 16-bit grayscale PNG with the scale in `depth.json`.
    #[default]
    Png16,
    /// NumPy `.npy`, little-endian float32 `(height, width)`, the values as recorded (f16
    /// widened); a missing value is NaN. No scale (`depth_scale` is 1).
    Npy,
}

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

/// A NumPy 1.0 `.npy` of `values` as `<f4` with shape (height, width): the magic, the header
/// dict padded with spaces to a 64-byte boundary and ended by a newline, then the data.
fn npy(width: u32, height: u32, values: &[f32]) -> Vec<u8> {
    let dict =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({height}, {width}), }}");
    let unpadded = 10 + dict.len() + 1;
    let pad = unpadded.next_multiple_of(64) - unpadded;
    let header = format!("{dict}{}\n", " ".repeat(pad));
    let mut out = Vec::with_capacity(10 + header.len() + values.len() * 4);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        let v = if v.is_finite() { *v } else { f32::NAN };
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Writes one map as `format`, returning its file name and scale.
fn save_map(
    dir: &Path,
    stem: &str,
    kind: &str,
    k: &crate::frame::Intrinsics,
    values: &[f32],
    format: DepthFormat,
) -> Result<(String, f64), RecordError> {
    match format {
        DepthFormat::Png16 => {
            let name = format!("{stem}.{kind}.png");
            let (levels, scale) = quantise(values);
            save_png(&dir.join(&name), k.width, k.height, levels)?;
            Ok((name, scale))
        }
        DepthFormat::Npy => {
            let name = format!("{stem}.{kind}.npy");
            let path = dir.join(&name);
            let bytes = npy(k.width, k.height, values);
            super::write_file(&path, |w| std::io::Write::write_all(w, &bytes))?;
            Ok((name, 1.0))
        }
    }
}

/// Writes the maps of `frames` into `dir` (built aside, swapped in whole). `posed` are those
/// frames with their poses in the export world ([`super::Up::frames`]).
pub fn export_depth(
    dir: &Path,
    reader: &SessionReader,
    frames: Range<usize>,
    posed: &[FrameInfo],
    format: DepthFormat,
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
            let (depth_file, depth_scale) =
                save_map(built, &stem, "depth", &k, &maps.depth, format)?;
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
                let (conf_file, conf_scale) =
                    save_map(built, &stem, "confidence", &k, &maps.confidence, format)?;
                entry["confidence"] = conf_file.into();
                entry["confidence_scale"] = conf_scale.into();
            }
            entries.push(entry);
            report.frames += 1;
        }
        let doc = json!({
            "format": match format {
                DepthFormat::Png16 => "value = 16-bit PNG level × scale; level 0: no value",
                DepthFormat::Npy => "float32 .npy (height, width) as recorded; NaN: no value",
            },
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
