//! A COLMAP model of a session, laid out as 3D Gaussian Splatting, gsplat and nerfstudio read
//! it: `DIR/sparse/0/{cameras,images,points3D}.bin` (or `.txt`) and the images in `DIR/images/`.
//!
//! - One PINHOLE camera per image (the model predicts intrinsics per frame), at the frame's
//!   size as captured with the model's resize and crop undone ([`camera_geometry`]), or at the
//!   model's input size when the images are the model's input (or the captured size is not
//!   recorded: a version-1 session).
//! - Images under their source names; the images themselves are the user's own frames
//!   (linked, else copied), the recorded model input, or none ([`ImageMode`]).
//! - At most `max_points` points, the most confident first; each is seen by the frame whose
//!   depth it came from, at its projection there, and that image's 2D point names it back, so
//!   bundle adjustment and 3DGS's initialisation have a track for every point.
//!
//! The model's camera is OpenCV-like (x right, y down, z forward), as COLMAP's is; the world is
//! the export's ([`super::Up`]).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};

use glam::{DMat4, DQuat, DVec3};

use super::camera_geometry::{self, PinholeCamera};
use super::colmap_io::{self, Camera, Image, Model, Point3D};
use super::{Cloud, rotation_translation};
use crate::record::{RecordError, SessionReader};

/// Where the images of the model come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageMode {
    /// The user's frames, from this folder (the one the session read), linked or copied into
    /// `images/`; the cameras are at the captured size.
    Original(PathBuf),
    /// The model's input as recorded (JPEG); the cameras are at the model's input size.
    Model,
    /// No images: the user brings the frames; the cameras are at the captured size.
    None,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColmapOptions {
    /// `.txt` instead of `.bin`.
    pub text: bool,
    pub images: ImageMode,
    /// Cap on `points3D` (the most confident are kept).
    pub max_points: usize,
    /// The export's world frame; the cloud given must be in it already ([`super::Up::cloud`]).
    pub up: super::Up,
}

impl Default for ColmapOptions {
    fn default() -> Self {
        Self {
            text: false,
            images: ImageMode::Model,
            max_points: 100_000,
            up: super::Up::default(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColmapReport {
    pub images: usize,
    /// Model images with no recorded JPEG (`ImageMode::Model`).
    pub images_without_jpeg: usize,
    /// Images hard-linked / copied from the user's folder (`ImageMode::Original`).
    pub images_linked: usize,
    pub images_copied: usize,
    /// Frames with no intrinsics record (damaged): left out of the model.
    pub frames_skipped: usize,
    /// Cameras left at the model's input size because the captured size is not recorded.
    pub cameras_at_input_size: usize,
    /// Cameras whose captured size the model's preprocessing does not give: mapped by a plain
    /// per-axis scale.
    pub cameras_plain_scale: usize,
    pub points: usize,
    /// Points beyond `max_points`, left out.
    pub points_over_cap: usize,
    /// Points whose frame is not in the model or that project outside it, left out.
    pub points_unseen: usize,
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
    format!("{}.jpg", safe_name(stem))
}

fn safe_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        format!("frame{safe}")
    } else {
        safe
    }
}

/// Whether a source name is a file's name (an image folder's frame), not a stream's frame.
pub fn is_file_name(source_name: &str) -> bool {
    !source_name.is_empty()
        && !source_name.starts_with('.')
        && !source_name.contains(['#', '/', '\\'])
        && !source_name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
}

/// `names` with every repeat (two sources that sanitise alike) made unique by `_2`, `_3`, ...
/// before the extension.
fn unique(names: impl Iterator<Item = String>) -> Vec<String> {
    let mut seen = HashSet::new();
    names
        .map(|base| {
            let (stem, ext) = match base.rfind('.') {
                Some(dot) if dot > 0 => (&base[..dot], &base[dot..]),
                _ => (base.as_str(), ""),
            };
            let mut name = base.clone();
            let mut n = 1;
            while !seen.insert(name.clone()) {
                n += 1;
                name = format!("{stem}_{n}{ext}");
            }
            name
        })
        .collect()
}

/// The image name of every frame of `reader`, in order, for the model's input images (`.jpg`).
pub fn image_names(reader: &SessionReader) -> Vec<String> {
    unique(reader.frames().iter().map(|f| image_name(&f.origin.name)))
}

/// The names of `frames` for `mode`: the source's own file name for the user's frames (and
/// for none, where the source is a file), the model-input name otherwise.
fn names_for(reader: &SessionReader, frames: Range<usize>, mode: &ImageMode) -> Vec<String> {
    let infos = &reader.frames()[frames];
    unique(infos.iter().map(|f| {
        let name = &f.origin.name;
        match mode {
            ImageMode::Model => image_name(name),
            ImageMode::Original(_) | ImageMode::None if is_file_name(name) => name.clone(),
            _ => safe_name(name),
        }
    }))
}

/// The folder the session's frames were read from, as the recording's header names it and
/// as it exists here: `input_path` (absolute, written by `run` for an image folder), else
/// `input` when it is a folder (older sessions; relative to where the export runs).
pub fn recorded_input_folder(reader: &SessionReader) -> Option<PathBuf> {
    let config = reader.config();
    ["input_path", "input"]
        .iter()
        .filter_map(|key| config[*key].as_str())
        .map(PathBuf::from)
        .find(|p| p.is_dir())
}

/// Checks that every frame of `frames` is a file in `dir` at the size the session recorded,
/// and returns those files. The error names the first frame that is not.
pub fn original_files(
    reader: &SessionReader,
    frames: Range<usize>,
    dir: &Path,
) -> Result<Vec<PathBuf>, RecordError> {
    let refuse = |what: String| RecordError::Export {
        path: dir.to_path_buf(),
        what,
    };
    if !dir.is_dir() {
        return Err(refuse(
            "is not a folder: the original frames are looked for there (give --images-from DIR, \
             or --colmap-images model|none)"
                .into(),
        ));
    }
    let infos = &reader.frames()[frames];
    // Every frame's name and size first: a stream's frames are refused as such, not as a
    // missing file.
    for info in infos {
        let name = &info.origin.name;
        if !is_file_name(name) {
            return Err(refuse(format!(
                "frame {} came from `{name}`, not from an image file: only an image folder's \
                 frames can be copied (use --colmap-images model or none)",
                info.frame
            )));
        }
        if info.origin.original_size.is_none() {
            return Err(refuse(format!(
                "frame {} (`{name}`) has no recorded size as captured (a version-1 session?): \
                 use --colmap-images model",
                info.frame
            )));
        }
    }
    let mut files = Vec::new();
    for info in infos {
        let name = &info.origin.name;
        let size = info.origin.original_size.unwrap_or_default();
        let path = dir.join(name);
        let found = image::image_dimensions(&path).map_err(|e| {
            refuse(format!(
                "frame {}'s original `{name}` cannot be read there: {e}",
                info.frame
            ))
        })?;
        if found != size && (found.1, found.0) != size {
            return Err(refuse(format!(
                "`{name}` is {}×{}, the session recorded frame {} as {}×{}: not the same frames",
                found.0, found.1, info.frame, size.0, size.1
            )));
        }
        files.push(path);
    }
    Ok(files)
}

/// One posed image of the model, before its points are known.
struct Posed {
    frame: u64,
    camera: PinholeCamera,
    camera_from_world: DMat4,
}

/// Builds the model of `frames` (a model session's range of the reader's frames).
pub fn build_model(
    reader: &SessionReader,
    frames: Range<usize>,
    cloud: &Cloud,
    options: &ColmapOptions,
    report: &mut ColmapReport,
) -> (Model, Vec<usize>) {
    let names = names_for(reader, frames.clone(), &options.images);
    let mut model = Model::default();
    let mut posed = Vec::new();
    let mut kept = Vec::new();
    for (n, i) in frames.enumerate() {
        let info = &reader.frames()[i];
        let Some(k) = info.intrinsics else {
            report.frames_skipped += 1;
            continue;
        };
        let camera = match (&options.images, info.origin.original_size) {
            (ImageMode::Model, _) => camera_geometry::model_input_camera(&k),
            (_, Some(size)) => {
                let (camera, mapping) = camera_geometry::captured_camera(&k, size);
                if !mapping.preprocessing_matched {
                    report.cameras_plain_scale += 1;
                }
                camera
            }
            (_, None) => {
                report.cameras_at_input_size += 1;
                camera_geometry::model_input_camera(&k)
            }
        };
        let id = model.images.len() as u32 + 1;
        let world = glam::Mat4::from_mat3(options.up.rotation());
        let (q, t) = rotation_translation(&(info.camera_from_world * world.transpose()));
        model.cameras.push(Camera {
            id,
            width: camera.width,
            height: camera.height,
            params: [camera.fx, camera.fy, camera.cx, camera.cy],
        });
        model.images.push(Image {
            id,
            qvec: [q.w, q.x, q.y, q.z].map(f64::from),
            tvec: [t.x, t.y, t.z].map(f64::from),
            camera_id: id,
            name: names[n].clone(),
            points2d: Vec::new(),
        });
        // Points are projected through the pose as written (the rotation re-orthonormalised),
        // so a reader's projection of a point lands exactly on its 2D point.
        let camera_from_world = DMat4::from_rotation_translation(
            DQuat::from_xyzw(q.x.into(), q.y.into(), q.z.into(), q.w.into()),
            DVec3::new(t.x.into(), t.y.into(), t.z.into()),
        );
        posed.push(Posed {
            frame: info.frame,
            camera,
            camera_from_world,
        });
        kept.push(i);
    }
    report.images = model.images.len();
    add_points(&mut model, &posed, cloud, options.max_points, report);
    (model, kept)
}

/// The most confident `max_points` points of `cloud` (ties: session order), each observed once.
fn add_points(
    model: &mut Model,
    posed: &[Posed],
    cloud: &Cloud,
    max_points: usize,
    report: &mut ColmapReport,
) {
    let by_frame: HashMap<u64, usize> = posed
        .iter()
        .enumerate()
        .map(|(k, p)| (p.frame, k))
        .collect();
    let mut order: Vec<usize> = (0..cloud.len()).collect();
    order.sort_by(|&a, &b| cloud.confidence[b].total_cmp(&cloud.confidence[a]));
    for &k in &order {
        if model.points.len() == max_points {
            report.points_over_cap += 1;
            continue;
        }
        let Some(&image) = by_frame.get(&u64::from(cloud.frame[k])) else {
            report.points_unseen += 1;
            continue;
        };
        let p = &posed[image];
        let world = DVec3::from(cloud.xyz[k].map(f64::from));
        let c = p.camera_from_world.transform_point3(world);
        let Some(xy) = p
            .camera
            .project(c.to_array())
            .filter(|xy| p.camera.contains(*xy))
        else {
            report.points_unseen += 1;
            continue;
        };
        let id = model.points.len() as u64 + 1;
        let seen_by = &mut model.images[image];
        seen_by.points2d.push((xy, id));
        let track = vec![(seen_by.id, (seen_by.points2d.len() - 1) as u32)];
        model.points.push(Point3D {
            id,
            xyz: world.to_array(),
            rgb: cloud.rgb[k],
            // The observation is the point's own projection: no reprojection error.
            error: 0.0,
            track,
        });
    }
    report.points = model.points.len();
}

/// Writes the model of `frames` into `dir`, built aside and swapped in whole: an older model
/// there (which the caller's [`OutputPlan`](super::OutputPlan) let through) leaves no stale
/// image behind.
pub fn export_colmap(
    dir: &Path,
    reader: &SessionReader,
    frames: Range<usize>,
    cloud: &Cloud,
    options: &ColmapOptions,
) -> Result<ColmapReport, RecordError> {
    // The same refusal as the plan's, for callers that bring no plan: a folder that holds
    // anything a COLMAP export does not write is never swapped away.
    let mut plan = super::OutputPlan::new(&[reader.path()], true);
    plan.claim("COLMAP folder", dir, super::OutputKind::ColmapDir)?;
    // The user's frames are checked before anything is built.
    let originals = match &options.images {
        ImageMode::Original(from) => Some(original_files(reader, frames.clone(), from)?),
        _ => None,
    };
    super::output::write_dir(dir, |built| {
        let mut report = ColmapReport::default();
        let (model, kept) = build_model(reader, frames.clone(), cloud, options, &mut report);
        colmap_io::write_model(&built.join("sparse").join("0"), &model, options.text)?;
        place_images(
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

/// Puts the model's images into `images_dir`: the user's frames (`originals`: the first
/// frame's index and the files, from [`original_files`]) linked or copied, or the recorded
/// model input; nothing for [`ImageMode::None`]. `kept[k]` is image `k`'s frame.
pub(crate) fn place_images(
    images_dir: &Path,
    reader: &SessionReader,
    model: &Model,
    kept: &[usize],
    mode: &ImageMode,
    originals: Option<(usize, &[PathBuf])>,
    report: &mut ColmapReport,
) -> Result<(), RecordError> {
    if *mode == ImageMode::None {
        return Ok(());
    }
    std::fs::create_dir_all(images_dir).map_err(|e| RecordError::io(images_dir, e))?;
    for (image, &i) in model.images.iter().zip(kept) {
        let target = images_dir.join(&image.name);
        match (mode, originals) {
            (ImageMode::Original(_), Some((first, files))) => {
                let source = &files[i - first];
                if std::fs::hard_link(source, &target).is_ok() {
                    report.images_linked += 1;
                } else {
                    // Another file system: a copy.
                    std::fs::copy(source, &target).map_err(|e| RecordError::io(source, e))?;
                    report.images_copied += 1;
                }
            }
            (ImageMode::Model, _) => match reader.image_jpeg(i)? {
                Some((_, _, jpeg)) => {
                    std::fs::write(&target, jpeg).map_err(|e| RecordError::io(&target, e))?
                }
                None => report.images_without_jpeg += 1,
            },
            _ => {}
        }
    }
    Ok(())
}
