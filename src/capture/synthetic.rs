//! A synthetic scene with exact ground truth: a textured box-shaped room seen from a camera
//! that drifts and looks around along a known path. Every frame comes with its depth map,
//! its `world_from_camera` pose and its intrinsics, so geometry can be tested against truth.
//!
//! It is the default input where no camera exists and the generator of the bundled sample in
//! `assets/synthetic/`. Conventions are the model's: camera x right, y down, z forward; pixel
//! (u, v) looks along `((u − cx)/fx, (v − cy)/fy, 1)` (no half-pixel offset); depth is the
//! camera-space z.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use glam::{Mat3, Mat4, Vec3};

use super::decode_pool::{OrderedPool, default_workers};
use super::error::CaptureError;
use super::paced::Pacer;
use super::timestamps::nominal_time;
use super::{CapturedFrame, Source, ms_since};
use crate::frame::{FrameOrigin, Intrinsics, RgbImage};

/// The rate of the room's clock when it is not paced: a camera's usual 30 fps.
pub const NOMINAL_FPS: f64 = 30.0;

/// Half extents of the room in metres: it spans `[-x, x] × [-y, y] × [-z, z]`.
pub const ROOM_HALF_EXTENTS: Vec3 = Vec3::new(3.0, 1.5, 4.0);

/// The room and the camera path.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticScene {
    pub width: u32,
    pub height: u32,
    /// Frames before the source ends; `None` runs forever (a stand-in for a camera).
    pub frames: Option<u64>,
    /// Focal length as a fraction of the image width.
    pub focal_per_width: f32,
}

impl Default for SyntheticScene {
    fn default() -> Self {
        SyntheticScene {
            width: 640,
            height: 480,
            frames: Some(120),
            focal_per_width: 0.8,
        }
    }
}

/// Frames of the bundled sample in `assets/synthetic/`.
pub const SAMPLE_FRAMES: u64 = 8;

/// The scene of the bundled sample: small, so the repository stays light.
pub fn sample_scene() -> SyntheticScene {
    SyntheticScene {
        width: 128,
        height: 96,
        frames: Some(SAMPLE_FRAMES),
        ..SyntheticScene::default()
    }
}

/// The bundled sample's video: the room at 320×240, three seconds at 30 fps.
pub const SAMPLE_VIDEO_FPS: u32 = 30;
pub const SAMPLE_VIDEO_FILE: &str = "room.mp4";

pub fn sample_video_scene() -> SyntheticScene {
    SyntheticScene {
        width: 320,
        height: 240,
        frames: Some(90),
        ..SyntheticScene::default()
    }
}

/// Renders [`sample_video_scene`] into a video at `path` (the sample's `room.mp4`): made by the
/// program rather than kept in the repository, so it is always the generator's own output.
pub fn write_sample_video(path: &Path) -> Result<super::VideoWritten, CaptureError> {
    let scene = sample_video_scene();
    let frames = scene.frames.unwrap_or(0);
    super::write_video(
        path,
        SAMPLE_VIDEO_FPS,
        (0..frames).map(|i| scene.render(i).image),
    )
}

/// One rendered frame and its ground truth.
#[derive(Debug, Clone)]
pub struct SyntheticView {
    pub index: u64,
    pub image: RgbImage,
    /// Camera-space z per pixel, row-major.
    pub depth: Vec<f32>,
    pub world_from_camera: Mat4,
    pub intrinsics: Intrinsics,
}

impl SyntheticScene {
    pub fn intrinsics(&self) -> Intrinsics {
        let f = self.focal_per_width * self.width as f32;
        Intrinsics {
            fx: f,
            fy: f,
            cx: self.width as f32 / 2.0,
            cy: self.height as f32 / 2.0,
            width: self.width,
            height: self.height,
        }
    }

    /// The camera path: a slow loop inside the room, yawing and pitching a little, so
    /// consecutive frames overlap and the walls are seen from several places.
    pub fn world_from_camera(&self, index: u64) -> Mat4 {
        let t = index as f32 * 0.06;
        let centre = Vec3::new(
            1.0 * t.sin(),
            0.25 * (2.0 * t).sin(),
            -1.0 + 0.8 * (1.0 - t.cos()),
        );
        let yaw = 0.5 * (0.7 * t).sin();
        let pitch = 0.12 * (1.3 * t).sin();
        let rotation = Mat3::from_rotation_y(yaw) * Mat3::from_rotation_x(pitch);
        Mat4::from_cols(
            rotation.x_axis.extend(0.0),
            rotation.y_axis.extend(0.0),
            rotation.z_axis.extend(0.0),
            centre.extend(1.0),
        )
    }

    /// Render frame `index`.
    pub fn render(&self, index: u64) -> SyntheticView {
        let k = self.intrinsics();
        let world_from_camera = self.world_from_camera(index);
        let rotation = Mat3::from_mat4(world_from_camera);
        let origin = world_from_camera.w_axis.truncate();
        let (w, h) = (self.width as usize, self.height as usize);
        let mut data = Vec::with_capacity(w * h * 3);
        let mut depth = Vec::with_capacity(w * h);
        for v in 0..h {
            for u in 0..w {
                let ray_camera = Vec3::new((u as f32 - k.cx) / k.fx, (v as f32 - k.cy) / k.fy, 1.0);
                let ray_world = rotation * ray_camera;
                // Camera-space z of the ray is 1, so the hit distance along it is the depth.
                let t = exit_distance(origin, ray_world);
                let hit = origin + ray_world * t;
                data.extend_from_slice(&wall_colour(hit));
                depth.push(t);
            }
        }
        SyntheticView {
            index,
            image: RgbImage {
                width: self.width,
                height: self.height,
                data,
            },
            depth,
            world_from_camera,
            intrinsics: k,
        }
    }

    /// Write `frames` views as PNGs, 16-bit depth PNGs in millimetres under `depth/`, and
    /// `ground_truth.json` (intrinsics and row-major `world_from_camera` per frame).
    pub fn write_sample(&self, dir: &Path, frames: u64) -> Result<(), CaptureError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| CaptureError::Io { path, source }
        };
        let depth_dir = dir.join("depth");
        std::fs::create_dir_all(&depth_dir).map_err(io(&depth_dir))?;
        let mut poses = Vec::new();
        for i in 0..frames {
            let view = self.render(i);
            let name = format!("{i:06}.png");
            let path = dir.join(&name);
            image::save_buffer(
                &path,
                &view.image.data,
                self.width,
                self.height,
                image::ExtendedColorType::Rgb8,
            )
            .map_err(|e| CaptureError::Decode {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let depth_mm: Vec<u16> = view
                .depth
                .iter()
                .map(|d| (d * 1000.0).round().clamp(0.0, u16::MAX as f32) as u16)
                .collect();
            let depth_path = depth_dir.join(&name);
            let depth_img = image::ImageBuffer::<image::Luma<u16>, _>::from_raw(
                self.width,
                self.height,
                depth_mm,
            )
            .ok_or_else(|| CaptureError::Decode {
                path: depth_path.clone(),
                reason: "depth buffer size".into(),
            })?;
            depth_img
                .save(&depth_path)
                .map_err(|e| CaptureError::Decode {
                    path: depth_path.clone(),
                    reason: e.to_string(),
                })?;
            poses.push(serde_json::json!({
                "image": name,
                "depth_mm": format!("depth/{name}"),
                "world_from_camera": crate::frame::camera::row_major(&view.world_from_camera),
            }));
        }
        let k = self.intrinsics();
        let truth = serde_json::json!({
            "generator": "streamrecon synthetic room (src/capture/synthetic.rs)",
            "room_half_extents_m": ROOM_HALF_EXTENTS.to_array(),
            "intrinsics": k,
            "convention": "world_from_camera maps camera (x right, y down, z forward) to world; depth is camera z",
            "frames": poses,
        });
        let path = dir.join("ground_truth.json");
        let text = serde_json::to_string_pretty(&truth).unwrap_or_default();
        std::fs::write(&path, text).map_err(io(&path))?;
        Ok(())
    }
}

/// Distance along `dir` from `origin` (inside the room) to the wall it exits through.
fn exit_distance(origin: Vec3, dir: Vec3) -> f32 {
    let mut best = f32::INFINITY;
    for axis in 0..3 {
        let d = dir[axis];
        if d.abs() > 1e-12 {
            let bound = ROOM_HALF_EXTENTS[axis].copysign(d);
            let t = (bound - origin[axis]) / d;
            if t > 0.0 && t < best {
                best = t;
            }
        }
    }
    best
}

/// A colour per wall, a coarse checker (large structure for pose) and value noise (fine
/// texture for matching).
fn wall_colour(hit: Vec3) -> [u8; 3] {
    let rel = hit / ROOM_HALF_EXTENTS;
    let axis = if rel.x.abs() >= rel.y.abs() && rel.x.abs() >= rel.z.abs() {
        0
    } else if rel.y.abs() >= rel.z.abs() {
        1
    } else {
        2
    };
    let positive = hit[axis] > 0.0;
    let (a, b) = match axis {
        0 => (hit.z, hit.y),
        1 => (hit.x, hit.z),
        _ => (hit.x, hit.y),
    };
    const BASE: [[f32; 3]; 6] = [
        [0.85, 0.35, 0.30],
        [0.30, 0.75, 0.40],
        [0.90, 0.85, 0.70],
        [0.35, 0.35, 0.40],
        [0.30, 0.45, 0.85],
        [0.80, 0.60, 0.25],
    ];
    let base = BASE[axis * 2 + positive as usize];
    let checker = ((a / 0.5).floor() + (b / 0.5).floor()).rem_euclid(2.0);
    let fine = value_noise(a * 6.0 + axis as f32 * 17.0, b * 6.0);
    let finer = value_noise(a * 23.0, b * 23.0 + f32::from(u8::from(positive)) * 31.0);
    let shade = 0.35 + 0.3 * checker + 0.25 * fine + 0.1 * finer;
    base.map(|c| (c * shade * 255.0).round().clamp(0.0, 255.0) as u8)
}

fn lattice(x: i32, y: i32) -> f32 {
    let mut h = (x as u32).wrapping_mul(0x8da6_b343) ^ (y as u32).wrapping_mul(0xd816_3841);
    h ^= h >> 13;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 16;
    (h & 0xffff) as f32 / 65535.0
}

/// Smooth value noise in [0, 1].
fn value_noise(x: f32, y: f32) -> f32 {
    let (x0, y0) = (x.floor(), y.floor());
    let (fx, fy) = (x - x0, y - y0);
    let (sx, sy) = (fx * fx * (3.0 - 2.0 * fx), fy * fy * (3.0 - 2.0 * fy));
    let (ix, iy) = (x0 as i32, y0 as i32);
    let top = lattice(ix, iy) * (1.0 - sx) + lattice(ix + 1, iy) * sx;
    let bottom = lattice(ix, iy + 1) * (1.0 - sx) + lattice(ix + 1, iy + 1) * sx;
    top * (1.0 - sy) + bottom * sy
}

/// The scene as a [`Source`]. Frames are rendered ahead on a small ordered pool (one 640×480
/// frame is 37.7 ms of ray casting on one of the H200 machine's cores, too slow to feed a GPU
/// from one thread). Live mode paces them at a fixed rate, like a camera (then the pipeline drops
/// what inference cannot keep up with); otherwise frames come as fast as they are taken.
pub struct SyntheticSource {
    scene: Arc<SyntheticScene>,
    /// Next frame to render, and next to deliver.
    next_render: u64,
    next: u64,
    pacer: Option<Pacer>,
    /// Started at the first frame.
    pool: Option<OrderedPool<u64, Rendered>>,
    workers: usize,
}

/// A rendered frame and how long it took.
struct Rendered {
    index: u64,
    image: RgbImage,
    render_ms: f64,
}

impl SyntheticSource {
    pub fn new(scene: SyntheticScene) -> Self {
        SyntheticSource {
            scene: Arc::new(scene),
            next_render: 0,
            next: 0,
            pacer: None,
            pool: None,
            workers: default_workers(),
        }
    }

    /// Deliver frames at `fps` as a camera would.
    pub fn live(scene: SyntheticScene, fps: f64) -> Self {
        let mut s = Self::new(scene);
        s.pacer = Some(Pacer::new(fps));
        s
    }

    /// Render on this many worker threads (default: [`default_workers`]).
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    pub fn scene(&self) -> &SyntheticScene {
        &self.scene
    }

    fn ended(&self, index: u64) -> bool {
        self.scene.frames.is_some_and(|n| index >= n)
    }

    /// Keeps the pool's queue full with the next frames.
    fn fill_pool(&mut self) -> Result<(), CaptureError> {
        if self.pool.is_none() {
            let scene = Arc::clone(&self.scene);
            let pool = OrderedPool::new("render", self.workers, 2 * self.workers, move |i| {
                let clock = Instant::now();
                let view = scene.render(i);
                Rendered {
                    index: view.index,
                    image: view.image,
                    render_ms: ms_since(clock),
                }
            })
            .map_err(|e| CaptureError::Worker(format!("starting the render threads: {e}")))?;
            self.pool = Some(pool);
        }
        let Some(pool) = self.pool.as_mut() else {
            return Ok(());
        };
        let (frames, next_render) = (self.scene.frames, &mut self.next_render);
        pool.fill(|| {
            let index = *next_render;
            if frames.is_some_and(|n| index >= n) {
                return None;
            }
            *next_render += 1;
            Some(index)
        })
        .map_err(|e| CaptureError::Worker(e.to_string()))
    }
}

impl Source for SyntheticSource {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        if self.ended(self.next) {
            return Ok(None);
        }
        let clock = Instant::now();
        self.fill_pool()?;
        let Some(next) = self.pool.as_mut().and_then(|p| p.next_result()) else {
            return Ok(None);
        };
        let rendered = next.map_err(|e| CaptureError::Worker(e.to_string()))?;
        // The room's clock: frame k is k / fps into the stream, paced or not, so two runs
        // give the same times.
        let fps = match self.pacer.as_mut() {
            Some(pacer) => {
                pacer.wait();
                pacer.fps()
            }
            None => NOMINAL_FPS,
        };
        self.next += 1;
        let origin = FrameOrigin {
            name: format!("synthetic#frame_{:06}", rendered.index),
            time: nominal_time(rendered.index, Some(fps)),
            original_size: Some((rendered.image.width, rendered.image.height)),
        };
        Ok(Some(CapturedFrame {
            index: rendered.index,
            image: rendered.image,
            origin,
            captured_at: Instant::now(),
            // Waiting for the frame (its render, its time on a live clock), less the render.
            capture_ms: (ms_since(clock) - rendered.render_ms).max(0.0),
            decode_ms: rendered.render_ms,
        }))
    }

    fn is_live(&self) -> bool {
        self.pacer.is_some()
    }

    fn describe(&self) -> String {
        format!(
            "synthetic room {}×{}{}",
            self.scene.width,
            self.scene.height,
            match &self.pacer {
                Some(p) => format!(" live at {} fps", p.fps()),
                None => String::new(),
            }
        )
    }

    fn remaining_hint(&self) -> Option<u64> {
        self.scene.frames.map(|n| n.saturating_sub(self.next))
    }

    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        Some((self.scene.width, self.scene.height))
    }
}
