//! A COLMAP text model: `cameras.txt` (one PINHOLE camera per frame, since the model predicts
//! intrinsics per frame), `images.txt` (world-to-camera pose as COLMAP stores it: QW QX QY QZ
//! TX TY TZ, with an empty 2D-point line), `points3D.txt` (no tracks: the points come from
//! depth, not from matched features), and the frames' JPEGs under `images/`, named after
//! their sources (see [`image_names`]).
//!
//! The model's camera is OpenCV-like (x right, y down, z forward), as COLMAP's is; COLMAP puts
//! the centre of the top-left pixel at (0.5, 0.5) where the model puts it at (0, 0), so the
//! principal point moves by half a pixel.

use std::io::Write;
use std::path::Path;

use super::{Cloud, rotation_translation, write_file};
use crate::record::{RecordError, SessionReader};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColmapReport {
    pub images: usize,
    pub images_without_jpeg: usize,
    /// Frames with no intrinsics record (damaged): left out of the model.
    pub frames_skipped: usize,
    pub points: usize,
}

/// Name of an exported image for a frame whose source is `source_name`: the source's name
/// without its image extension, with anything but letters, digits, `.`, `-` and `_` made `_`
/// (so `clip.mp4#frame_000012` becomes `clip.mp4_frame_000012`), and `.jpg` (the stored image
/// is the model's input as JPEG). A version-1 session's frames are named `frame_NNNNNN`.
pub fn image_name(source_name: &str) -> String {
    let lower = source_name.to_ascii_lowercase();
    let stem = [".png", ".jpg", ".jpeg"]
        .iter()
        .find(|ext| lower.ends_with(*ext) && lower.len() > ext.len())
        .map_or(source_name, |ext| {
            &source_name[..source_name.len() - ext.len()]
        });
    let safe: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let safe = if safe.is_empty() || safe.starts_with('.') {
        format!("frame{safe}")
    } else {
        safe
    };
    format!("{safe}.jpg")
}

/// The image name of every frame of `reader`, in order; a name met before (two sources that
/// sanitise alike, a name repeated across a session reset) gets `_2`, `_3`, ... before `.jpg`.
pub fn image_names(reader: &SessionReader) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    reader
        .frames()
        .iter()
        .map(|info| {
            let base = image_name(&info.origin.name);
            let mut name = base.clone();
            let mut n = 1;
            while !seen.insert(name.clone()) {
                n += 1;
                name = format!("{}_{n}.jpg", base.trim_end_matches(".jpg"));
            }
            name
        })
        .collect()
}

/// Writes the model into `dir`, built aside and swapped in whole: an older model there (which
/// the caller's [`OutputPlan`](super::OutputPlan) let through) leaves no stale image behind.
pub fn export_colmap(
    dir: &Path,
    reader: &SessionReader,
    cloud: &Cloud,
) -> Result<ColmapReport, RecordError> {
    // The same refusal as the plan's, for callers that bring no plan: a folder that holds
    // anything a COLMAP export does not write is never swapped away.
    let mut plan = super::OutputPlan::new(&[reader.path()], true);
    plan.claim("COLMAP folder", dir, super::OutputKind::ColmapDir)?;
    super::output::write_dir(dir, |built| write_model(built, reader, cloud))
}

fn write_model(
    dir: &Path,
    reader: &SessionReader,
    cloud: &Cloud,
) -> Result<ColmapReport, RecordError> {
    let images_dir = dir.join("images");
    std::fs::create_dir_all(&images_dir).map_err(|e| RecordError::io(&images_dir, e))?;
    let mut report = ColmapReport::default();
    let mut cameras = String::from(
        "# Camera list with one line of data per camera:\n\
         #   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n",
    );
    let mut images = String::from(
        "# Image list with two lines of data per image:\n\
         #   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n\
         #   POINTS2D[] as (X, Y, POINT3D_ID)\n",
    );
    let names = image_names(reader);
    for (i, info) in reader.frames().iter().enumerate() {
        let Some(k) = info.intrinsics else {
            report.frames_skipped += 1;
            continue;
        };
        let id = report.images + 1;
        cameras.push_str(&format!(
            "{id} PINHOLE {} {} {} {} {} {}\n",
            k.width,
            k.height,
            k.fx,
            k.fy,
            k.cx + 0.5,
            k.cy + 0.5
        ));
        let (q, t) = rotation_translation(&info.camera_from_world);
        let name = &names[i];
        images.push_str(&format!(
            "{id} {} {} {} {} {} {} {} {id} {name}\n\n",
            q.w, q.x, q.y, q.z, t.x, t.y, t.z
        ));
        match reader.image_jpeg(i)? {
            Some((_, _, jpeg)) => {
                let path = images_dir.join(name);
                std::fs::write(&path, jpeg).map_err(|e| RecordError::io(&path, e))?;
            }
            None => report.images_without_jpeg += 1,
        }
        report.images += 1;
    }
    write_file(&dir.join("cameras.txt"), |w| {
        w.write_all(cameras.as_bytes())
    })?;
    write_file(&dir.join("images.txt"), |w| w.write_all(images.as_bytes()))?;
    write_file(&dir.join("points3D.txt"), |w| {
        writeln!(w, "# 3D point list with one line of data per point:")?;
        writeln!(
            w,
            "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)"
        )?;
        for k in 0..cloud.len() {
            let [x, y, z] = cloud.xyz[k];
            let [r, g, b] = cloud.rgb[k];
            // -1: no reprojection error was computed (COLMAP's own "unknown").
            writeln!(w, "{} {x} {y} {z} {r} {g} {b} -1", k + 1)?;
        }
        Ok(())
    })?;
    report.points = cloud.len();
    Ok(report)
}
