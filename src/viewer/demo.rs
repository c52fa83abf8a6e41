//! A self-contained stream of well-formed `FrameResult`s for tests, snapshots and a demo input:
//! a camera moving through a box-shaped room (points are real unprojections of a ray-cast depth
//! map), and a real `PageTable` stepped frame by frame for the cache panels.

use glam::{Mat4, Quat, Vec3};

use crate::frame::{
    CacheSnapshot, FramePoints, FrameResult, FrameType, Intrinsics, RgbImage, StageTime,
};
use crate::kvcache::{CacheConfig, CacheEvent, PageTable, StepKind};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoConfig {
    pub width: u32,
    pub height: u32,
    pub scale_frames: usize,
    pub sliding_window: usize,
    /// Every n-th frame after the scale frames is a keyframe.
    pub keyframe_interval: u64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            width: 96,
            height: 72,
            scale_frames: 4,
            sliding_window: 12,
            keyframe_interval: 2,
        }
    }
}

/// Half extents of the room; the first camera stands near its centre.
const ROOM_MIN: Vec3 = Vec3::new(-2.5, -1.2, -2.0);
const ROOM_MAX: Vec3 = Vec3::new(2.5, 1.0, 3.5);

pub struct DemoStream {
    cfg: DemoConfig,
    table: PageTable,
    next_frame: u64,
    /// A reset happened since the last result: its event goes out with the next one.
    reset_pending: bool,
}

impl DemoStream {
    pub fn new(cfg: DemoConfig) -> Self {
        let cache = CacheConfig::new(24, 16, 64, 999, cfg.scale_frames, cfg.sliding_window);
        // The geometry above is the released model's and always valid.
        let table = PageTable::new(cache).unwrap_or_else(|e| panic!("demo cache config: {e}"));
        Self {
            cfg,
            table,
            next_frame: 0,
            reset_pending: false,
        }
    }

    /// Starts over (empty cache, frame 0), as a pipeline reset does.
    pub fn reset(&mut self) {
        self.table.reset();
        self.next_frame = 0;
        self.reset_pending = true;
    }

    pub fn config(&self) -> DemoConfig {
        self.cfg
    }

    /// The camera of frame `frame`: frame 0 is the world's origin, then a slow loop around
    /// the room that turns to look at every wall.
    pub fn world_from_camera(frame: u64) -> Mat4 {
        let t = frame as f32 * 0.04;
        let position = Vec3::new(0.8 * t.sin(), 0.1 * (2.0 * t).sin(), 0.8 * (1.0 - t.cos()));
        let rotation =
            Quat::from_rotation_y(t * 1.3) * Quat::from_rotation_x(0.15 * (0.7 * t).sin());
        Mat4::from_rotation_translation(rotation, position)
    }

    pub fn intrinsics(&self) -> Intrinsics {
        let (w, h) = (self.cfg.width as f32, self.cfg.height as f32);
        Intrinsics {
            fx: 0.8 * w,
            fy: 0.8 * w,
            cx: w * 0.5,
            cy: h * 0.5,
            width: self.cfg.width,
            height: self.cfg.height,
        }
    }

    pub fn next_result(&mut self) -> FrameResult {
        let frame = self.next_frame;
        self.next_frame += 1;
        let frame_type = if (frame as usize) < self.cfg.scale_frames {
            FrameType::Scale
        } else if (frame - self.cfg.scale_frames as u64)
            .is_multiple_of(self.cfg.keyframe_interval.max(1))
        {
            FrameType::Keyframe
        } else {
            FrameType::NonKeyframe
        };
        let cache = self.step_cache(frame, frame_type);
        let world_from_camera = Self::world_from_camera(frame);
        let intrinsics = self.intrinsics();
        let (points, image, depth, confidence) = self.render(frame, world_from_camera, intrinsics);
        FrameResult {
            frame,
            origin: crate::frame::FrameOrigin {
                name: format!("demo#frame_{frame:06}"),
                time: crate::capture::timestamps::nominal_time(frame, Some(30.0)),
                original_size: Some((image.width, image.height)),
            },
            frame_type,
            world_from_camera,
            camera_from_world: world_from_camera.inverse(),
            intrinsics,
            points,
            image,
            depth,
            confidence,
            cache,
            timings: demo_timings(frame, frame_type),
            dropped_before: 0,
        }
    }

    fn step_cache(&mut self, frame: u64, frame_type: FrameType) -> CacheSnapshot {
        let kind = if frame_type == FrameType::NonKeyframe {
            StepKind::NonKeyframe
        } else {
            StepKind::Keyframe
        };
        if self.table.begin_step(frame..frame + 1, kind).is_err() {
            return CacheSnapshot::default();
        }
        // Taken mid-step, as the pipeline does after attention, so transient pages show.
        let page_map = self.table.page_map();
        if self.table.end_step().is_err() {
            return CacheSnapshot::default();
        }
        let mut events = Vec::new();
        if std::mem::take(&mut self.reset_pending) {
            events.push(CacheEvent::Reset);
        }
        events.extend_from_slice(self.table.events());
        CacheSnapshot {
            stats: self.table.stats(),
            events,
            page_map,
        }
    }

    fn render(
        &self,
        frame: u64,
        world_from_camera: Mat4,
        k: Intrinsics,
    ) -> (FramePoints, RgbImage, Vec<f32>, Vec<f32>) {
        let (w, h) = (k.width as usize, k.height as usize);
        let origin = world_from_camera.w_axis.truncate();
        let mut points = FramePoints::default();
        let mut image = RgbImage {
            width: k.width,
            height: k.height,
            data: vec![0; w * h * 3],
        };
        let mut depth = vec![0.0; w * h];
        let mut confidence = vec![0.0; w * h];
        for v in 0..h {
            for u in 0..w {
                let in_camera = Vec3::new(
                    (u as f32 + 0.5 - k.cx) / k.fx,
                    (v as f32 + 0.5 - k.cy) / k.fy,
                    1.0,
                );
                let dir = world_from_camera.transform_vector3(in_camera);
                let Some((t, normal_axis)) = ray_to_room(origin, dir) else {
                    continue;
                };
                let hit = origin + dir * t;
                let rgb = room_colour(hit, normal_axis);
                // Far and grazing pixels are less certain, as a real model's would be.
                let grazing = (1.0 - (in_camera.x.abs() + in_camera.y.abs()) * 0.5).max(0.0);
                let conf = 1.0
                    + 8.0 * grazing / (1.0 + 0.3 * t)
                    + 0.5 * ((u * 7 + v * 13 + frame as usize) % 5) as f32 / 5.0;
                let i = v * w + u;
                depth[i] = t;
                confidence[i] = conf;
                image.data[i * 3..i * 3 + 3].copy_from_slice(&rgb);
                points.xyz.push(hit.to_array());
                points.rgb.push(rgb);
                points.confidence.push(conf);
            }
        }
        (points, image, depth, confidence)
    }
}

/// Distance along `dir` (camera-space z = 1 scaled) to the room's inside wall, and the axis of
/// the wall's normal.
fn ray_to_room(origin: Vec3, dir: Vec3) -> Option<(f32, usize)> {
    let mut best: Option<(f32, usize)> = None;
    for axis in 0..3 {
        let d = dir[axis];
        if d.abs() < 1e-6 {
            continue;
        }
        let wall = if d > 0.0 {
            ROOM_MAX[axis]
        } else {
            ROOM_MIN[axis]
        };
        let t = (wall - origin[axis]) / d;
        if t > 0.0 && best.is_none_or(|(b, _)| t < b) {
            best = Some((t, axis));
        }
    }
    best
}

/// Walls get a colour per side and a checker pattern, so motion and depth read clearly.
fn room_colour(p: Vec3, normal_axis: usize) -> [u8; 3] {
    let base: [f32; 3] = match normal_axis {
        0 => [0.85, 0.45, 0.35],
        1 if p.y > 0.0 => [0.55, 0.5, 0.45],
        1 => [0.9, 0.9, 0.85],
        _ => [0.35, 0.55, 0.85],
    };
    let (a, b) = match normal_axis {
        0 => (p.y, p.z),
        1 => (p.x, p.z),
        _ => (p.x, p.y),
    };
    let checker = ((a * 2.0).floor() as i32 + (b * 2.0).floor() as i32).rem_euclid(2);
    let shade = if checker == 0 { 1.0 } else { 0.7 };
    base.map(|c| (c * shade * 255.0) as u8)
}

fn demo_timings(frame: u64, frame_type: FrameType) -> Vec<StageTime> {
    // Deterministic jitter so plots and percentiles have something to show.
    let jitter = |salt: u64| {
        ((frame.wrapping_mul(2654435761).wrapping_add(salt * 97)) % 1000) as f64 / 1000.0
    };
    let attention = if frame_type == FrameType::NonKeyframe {
        9.0
    } else {
        12.0
    };
    [
        ("capture", 1.0 + jitter(1)),
        ("preprocess", 1.5 + 0.5 * jitter(2)),
        ("dino", 6.0 + jitter(3)),
        ("aggregator", attention + 3.0 * jitter(4)),
        ("heads", 4.0 + jitter(5)),
        ("unproject", 0.5 + 0.2 * jitter(6)),
    ]
    .into_iter()
    .map(|(stage, ms)| StageTime {
        stage: stage.to_string(),
        ms,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_well_formed() {
        let mut stream = DemoStream::new(DemoConfig::default());
        for _ in 0..20 {
            let r = stream.next_result();
            let n = (r.intrinsics.width * r.intrinsics.height) as usize;
            assert_eq!(r.depth.len(), n);
            assert_eq!(r.confidence.len(), n);
            assert_eq!(r.image.data.len(), n * 3);
            assert_eq!(r.points.xyz.len(), r.points.rgb.len());
            assert_eq!(r.points.xyz.len(), r.points.confidence.len());
            assert!(r.points.len() > n / 2, "the room surrounds the camera");
            assert!(!r.cache.page_map.is_empty());
        }
    }

    #[test]
    fn reset_starts_over_and_says_so() {
        let mut stream = DemoStream::new(DemoConfig::default());
        for _ in 0..5 {
            stream.next_result();
        }
        stream.reset();
        let r = stream.next_result();
        assert_eq!(r.frame, 0);
        assert_eq!(r.cache.events.first(), Some(&CacheEvent::Reset));
        assert_eq!(r.cache.stats.frames_committed, 1);
    }

    #[test]
    fn first_camera_is_the_world_origin() {
        assert!(DemoStream::world_from_camera(0).abs_diff_eq(Mat4::IDENTITY, 1e-6));
    }
}
