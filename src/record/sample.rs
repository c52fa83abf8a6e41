//! A small, fully populated `FrameResult` made from a formula: every field set, so round-trip
//! tests notice any field the format forgets. Used by tests and documentation examples.

use glam::{Mat4, Quat, Vec3};

use crate::frame::{
    CacheSnapshot, CaptureTime, FrameOrigin, FramePoints, FrameResult, FrameType, Intrinsics,
    RgbImage, StageTime, TimeBase,
};
use crate::kvcache::{CacheEvent, CacheStats, PageState, PatchStream};

/// Frame `i` of a camera circling the origin at `width`×`height` pixels, looking at a small
/// cloud of `points` points.
pub fn sample_result(i: u64, width: u32, height: u32, points: usize) -> FrameResult {
    let angle = i as f32 * 0.1;
    let world_from_camera = Mat4::from_rotation_translation(
        Quat::from_rotation_y(angle) * Quat::from_rotation_x(0.05 * i as f32),
        Vec3::new(angle.sin() * 2.0, 0.1 * i as f32, -angle.cos() * 2.0),
    );
    let n = (width * height) as usize;
    let data = (0..n * 3)
        .map(|k| {
            let (px, c) = (k / 3, k % 3);
            let (x, y) = ((px % width as usize) as u32, (px / width as usize) as u32);
            // Smooth gradients so JPEG stays close to the source.
            ((x * 255 / width.max(1) + y * 100 / height.max(1) + c as u32 * 40 + i as u32 * 7)
                % 256) as u8
        })
        .collect();
    let xyz: Vec<[f32; 3]> = (0..points)
        .map(|k| {
            let t = k as f32 * 0.37 + i as f32;
            [t.sin(), (t * 0.7).cos(), 1.0 + (k % 13) as f32 * 0.1]
        })
        .collect();
    let rgb = (0..points)
        .map(|k| {
            [
                (k * 37 % 256) as u8,
                (k * 91 % 256) as u8,
                (i * 13 % 256) as u8,
            ]
        })
        .collect();
    let confidence = (0..points).map(|k| 1.0 + (k % 10) as f32 * 0.5).collect();
    let frame_type = match i {
        0 | 1 => FrameType::Scale,
        _ if i.is_multiple_of(3) => FrameType::Keyframe,
        _ => FrameType::NonKeyframe,
    };
    FrameResult {
        frame: i,
        // A TUM-style name and time, as a dataset's frame would carry.
        origin: FrameOrigin {
            name: format!("{}.{:06}.png", 1_700_000_000 + i, (i * 33_333) % 1_000_000),
            time: CaptureTime::new(
                (1_700_000_000 + i as i64) * 1_000_000_000
                    + ((i as i64 * 33_333) % 1_000_000) * 1000,
                TimeBase::FileName,
            ),
            original_size: Some((width * 2, height * 2)),
        },
        frame_type,
        world_from_camera,
        camera_from_world: world_from_camera.inverse(),
        intrinsics: Intrinsics {
            fx: 50.0 + i as f32,
            fy: 51.0,
            cx: width as f32 / 2.0,
            cy: height as f32 / 2.0,
            width,
            height,
        },
        points: FramePoints {
            xyz,
            rgb,
            confidence,
        },
        image: RgbImage {
            width,
            height,
            data,
        },
        depth: (0..n).map(|k| 0.5 + (k % 97) as f32 * 0.03125).collect(),
        confidence: (0..n).map(|k| 1.0 + (k % 7) as f32 * 0.25).collect(),
        cache: CacheSnapshot {
            stats: CacheStats {
                page_size: 16,
                scale_pages: 2,
                window_pages: i as usize % 4,
                special_pages: 1,
                free_pages: 3,
                allocated_pages: 8,
                max_pages: 64,
                bytes_allocated: 8 * 4096,
                bytes_resident: 5 * 4096,
                tokens_visible: 100 + i,
                frames_committed: i / 2,
                live_frames: 3,
                special_tokens: 6 * i,
                special_tokens_dropped: 0,
                frames_evicted: i / 5,
            },
            events: vec![
                CacheEvent::FrameAppended {
                    frame: i,
                    stream: if i < 2 {
                        PatchStream::Scale
                    } else {
                        PatchStream::Window
                    },
                    pages: vec![i as u32 % 8],
                    transient: frame_type == FrameType::NonKeyframe,
                },
                CacheEvent::FrameEvicted {
                    frame: i.saturating_sub(4),
                    pages: vec![1, 2],
                },
                CacheEvent::RolledBack { frames: vec![i] },
                CacheEvent::SpecialPageOpened { page: 7 },
                CacheEvent::PoolGrown {
                    allocated_pages: 8,
                    max_pages: 64,
                },
                CacheEvent::SpecialPageDropped { page: 3, tokens: 6 },
                CacheEvent::Reset,
            ],
            page_map: vec![
                PageState::Free,
                PageState::Scale { frame: 0 },
                PageState::Window { frame: i },
                PageState::Transient { frame: i },
                PageState::Special { tokens: 12 },
            ],
        },
        timings: vec![
            StageTime {
                stage: "model".into(),
                ms: 12.5 + i as f64,
            },
            StageTime {
                stage: "unproject".into(),
                ms: 0.75,
            },
        ],
        dropped_before: i % 2,
    }
}
