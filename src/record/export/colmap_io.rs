//! A COLMAP model written in COLMAP's own binary or text layout (`cameras`, `images`,
//! `points3D`), as `colmap model_converter` and `read_write_model.py` read it. All binary
//! numbers are little-endian.
//!
//! - `cameras.bin`: `u64` count; per camera `i32` id, `i32` model (1 = PINHOLE), `u64` width,
//!   `u64` height, `f64` params (fx fy cx cy).
//! - `images.bin`: `u64` count; per image `i32` id, `f64` qw qx qy qz, `f64` tx ty tz
//!   (world to camera), `i32` camera id, the name NUL-terminated, `u64` 2D point count, then
//!   per 2D point `f64` x, `f64` y, `i64` 3D point id (−1: none).
//! - `points3D.bin`: `u64` count; per point `u64` id, `f64` x y z, `u8` r g b, `f64` error,
//!   `u64` track length, then per observation `i32` image id, `i32` index into that image's
//!   2D points.

use std::io::{self, Write};
use std::path::Path;

use super::write_file;
use crate::record::RecordError;

/// COLMAP's id of the PINHOLE camera model.
pub const PINHOLE: i32 = 1;

#[derive(Debug, Clone, PartialEq)]
pub struct Camera {
    pub id: u32,
    pub width: u32,
    pub height: u32,
    /// fx, fy, cx, cy (pixel centres at +0.5).
    pub params: [f64; 4],
}

#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub id: u32,
    /// World-to-camera rotation, w x y z.
    pub qvec: [f64; 4],
    pub tvec: [f64; 3],
    pub camera_id: u32,
    pub name: String,
    /// (x, y) and the id of the 3D point seen there.
    pub points2d: Vec<([f64; 2], u64)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Point3D {
    pub id: u64,
    pub xyz: [f64; 3],
    pub rgb: [u8; 3],
    pub error: f64,
    /// (image id, index into that image's `points2d`).
    pub track: Vec<(u32, u32)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Model {
    pub cameras: Vec<Camera>,
    pub images: Vec<Image>,
    pub points: Vec<Point3D>,
}

fn id32(v: u32) -> io::Result<[u8; 4]> {
    i32::try_from(v)
        .map(i32::to_le_bytes)
        .map_err(|_| io::Error::other(format!("id {v} does not fit COLMAP's 32-bit ids")))
}

fn u64_bytes(n: usize) -> [u8; 8] {
    (n as u64).to_le_bytes()
}

pub fn write_cameras_bin(mut w: impl Write, model: &Model) -> io::Result<()> {
    w.write_all(&u64_bytes(model.cameras.len()))?;
    for c in &model.cameras {
        w.write_all(&id32(c.id)?)?;
        w.write_all(&PINHOLE.to_le_bytes())?;
        w.write_all(&u64::from(c.width).to_le_bytes())?;
        w.write_all(&u64::from(c.height).to_le_bytes())?;
        for p in c.params {
            w.write_all(&p.to_le_bytes())?;
        }
    }
    Ok(())
}

pub fn write_images_bin(mut w: impl Write, model: &Model) -> io::Result<()> {
    w.write_all(&u64_bytes(model.images.len()))?;
    for im in &model.images {
        if im.name.as_bytes().contains(&0) {
            return Err(io::Error::other(format!(
                "image name {:?} holds NUL",
                im.name
            )));
        }
        w.write_all(&id32(im.id)?)?;
        for v in im.qvec.iter().chain(&im.tvec) {
            w.write_all(&v.to_le_bytes())?;
        }
        w.write_all(&id32(im.camera_id)?)?;
        w.write_all(im.name.as_bytes())?;
        w.write_all(&[0])?;
        w.write_all(&u64_bytes(im.points2d.len()))?;
        for ([x, y], id) in &im.points2d {
            w.write_all(&x.to_le_bytes())?;
            w.write_all(&y.to_le_bytes())?;
            w.write_all(&(*id as i64).to_le_bytes())?;
        }
    }
    Ok(())
}

pub fn write_points_bin(mut w: impl Write, model: &Model) -> io::Result<()> {
    w.write_all(&u64_bytes(model.points.len()))?;
    for p in &model.points {
        w.write_all(&p.id.to_le_bytes())?;
        for v in p.xyz {
            w.write_all(&v.to_le_bytes())?;
        }
        w.write_all(&p.rgb)?;
        w.write_all(&p.error.to_le_bytes())?;
        w.write_all(&u64_bytes(p.track.len()))?;
        for (image, idx) in &p.track {
            w.write_all(&id32(*image)?)?;
            w.write_all(&id32(*idx)?)?;
        }
    }
    Ok(())
}

pub fn write_cameras_text(mut w: impl Write, model: &Model) -> io::Result<()> {
    writeln!(w, "# Camera list with one line of data per camera:")?;
    writeln!(w, "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]")?;
    writeln!(w, "# Number of cameras: {}", model.cameras.len())?;
    for c in &model.cameras {
        let [fx, fy, cx, cy] = c.params;
        writeln!(
            w,
            "{} PINHOLE {} {} {fx} {fy} {cx} {cy}",
            c.id, c.width, c.height
        )?;
    }
    Ok(())
}

pub fn write_images_text(mut w: impl Write, model: &Model) -> io::Result<()> {
    writeln!(w, "# Image list with two lines of data per image:")?;
    writeln!(
        w,
        "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME"
    )?;
    writeln!(w, "#   POINTS2D[] as (X, Y, POINT3D_ID)")?;
    for im in &model.images {
        if im.name.chars().any(char::is_whitespace) {
            return Err(io::Error::other(format!(
                "image name {:?} holds whitespace, which COLMAP's text format cannot hold",
                im.name
            )));
        }
        let [qw, qx, qy, qz] = im.qvec;
        let [tx, ty, tz] = im.tvec;
        writeln!(
            w,
            "{} {qw} {qx} {qy} {qz} {tx} {ty} {tz} {} {}",
            im.id, im.camera_id, im.name
        )?;
        let points: Vec<String> = im
            .points2d
            .iter()
            .map(|([x, y], id)| format!("{x} {y} {id}"))
            .collect();
        writeln!(w, "{}", points.join(" "))?;
    }
    Ok(())
}

pub fn write_points_text(mut w: impl Write, model: &Model) -> io::Result<()> {
    writeln!(w, "# 3D point list with one line of data per point:")?;
    writeln!(
        w,
        "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)"
    )?;
    for p in &model.points {
        let [x, y, z] = p.xyz;
        let [r, g, b] = p.rgb;
        write!(w, "{} {x} {y} {z} {r} {g} {b} {}", p.id, p.error)?;
        for (image, idx) in &p.track {
            write!(w, " {image} {idx}")?;
        }
        writeln!(w)?;
    }
    Ok(())
}

/// Writes the three files into `dir`: `.bin` or, with `text`, `.txt`.
pub fn write_model(dir: &Path, model: &Model, text: bool) -> Result<(), RecordError> {
    std::fs::create_dir_all(dir).map_err(|e| RecordError::io(dir, e))?;
    if text {
        write_file(&dir.join("cameras.txt"), |w| write_cameras_text(w, model))?;
        write_file(&dir.join("images.txt"), |w| write_images_text(w, model))?;
        write_file(&dir.join("points3D.txt"), |w| write_points_text(w, model))?;
    } else {
        write_file(&dir.join("cameras.bin"), |w| write_cameras_bin(w, model))?;
        write_file(&dir.join("images.bin"), |w| write_images_bin(w, model))?;
        write_file(&dir.join("points3D.bin"), |w| write_points_bin(w, model))?;
    }
    Ok(())
}
