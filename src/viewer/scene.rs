//! What the 3D view draws, apart from egui: a frame's points as stored on the GPU, the line
//! overlays, and the per-repaint `SceneFrame`. The window (`cloud_view`) and `bench viewer`
//! both build their frames here, so the bench draws exactly what the window draws.

use eframe::egui_wgpu::wgpu;
use glam::Vec3;

use super::camera::OrbitCamera;
use super::chunks::ChunkBook;
use super::history::StreamHistory;
use super::lines::{LineList, frustum_colour, frustum_indices};
use super::panels::RenderSettings;
use super::point_format;
use super::raster::RenderPath;
use super::render::{SceneFrame, SceneRenderer, ViewUniforms};
use crate::frame::FrameResult;

/// Frustums drawn: the newest ones, and every n-th before them.
const RECENT_FRUSTUMS: usize = 30;
const FRUSTUM_EVERY: usize = 10;

/// Points of a result that are complete (xyz, rgb and confidence all present).
pub fn point_count(result: &FrameResult) -> usize {
    let p = &result.points;
    p.xyz.len().min(p.rgb.len()).min(p.confidence.len())
}

/// Appends a result's points to the store: chunks first (the renderer creates what is
/// missing, within its budget and what the GPU gives), then the book places the points (and
/// refuses and counts what found no chunk), then they are written once. Returns how many
/// points were stored.
pub fn append_result(
    store: &mut SceneRenderer,
    book: &mut ChunkBook,
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    result: &FrameResult,
    staging: &mut Vec<u8>,
) -> usize {
    let n = point_count(result);
    let wanted = book.chunks_after(n);
    let got = store.reserve_chunks(device, wanted);
    if got < wanted {
        book.limit_to_chunks(got);
    }
    let placements = book.append_frame(n, result.frame);
    if placements.is_empty() {
        return 0;
    }
    let stored: usize = placements.iter().map(|p| p.source.len()).sum();
    point_format::encode_points(result, stored, staging);
    store.upload_points(device, queue, &placements, staging);
    store.sync_frames(device, queue, book);
    stored
}

/// The line overlays the settings ask for: ground grid, trajectory, camera frustums.
pub fn scene_lines(settings: &RenderSettings, history: &StreamHistory) -> LineList {
    let radius = history.bounds.map_or(1.0, |b| b.radius());
    let mut lines = LineList::default();
    if settings.show_grid {
        let (centre, half) = match history.bounds {
            // Under the scene: world up is -y, so the floor is at the largest y.
            Some(b) => (Vec3::new(b.centre().x, b.max.y, b.centre().z), radius),
            None => (Vec3::new(0.0, 1.0, 1.0), 2.0),
        };
        lines.grid(centre, half, 20);
    }
    if settings.show_trajectory {
        lines.trajectory(&history.poses);
    }
    if settings.show_frustums {
        let count = history.poses.len();
        let depth = (radius * 0.06).clamp(0.02, 1.0);
        for i in frustum_indices(count, RECENT_FRUSTUMS, FRUSTUM_EVERY) {
            let pose = &history.poses[i];
            lines.frustum(pose, depth, frustum_colour(pose.frame_type, i + 1 == count));
        }
    }
    lines
}

/// The point budget that applies to `path`: the sprite budget for sprites; for the compute
/// paths their own (none by default: every point).
pub fn budget_for(settings: &RenderSettings, path: RenderPath) -> u64 {
    if path.is_compute() {
        settings.compute_point_budget.unwrap_or(u64::MAX)
    } else {
        settings.point_budget
    }
}

/// One repaint of the 3D view of `book`'s points from `camera`, `size_px` pixels.
pub fn scene_frame(
    camera: &OrbitCamera,
    settings: &RenderSettings,
    book: &ChunkBook,
    history: &StreamHistory,
    size_px: [u32; 2],
    path: RenderPath,
) -> SceneFrame {
    let aspect = size_px[0] as f32 / size_px[1].max(1) as f32;
    let stride = book.stride_for_budget(budget_for(settings, path));
    let log_conf = history.log_confidence_range.unwrap_or((0.0, 3.0));
    let uniforms = ViewUniforms {
        clip_from_world: camera.clip_from_world(aspect).to_cols_array_2d(),
        view_from_world: camera.view_from_world().to_cols_array_2d(),
        viewport_px: [size_px[0] as f32, size_px[1] as f32],
        point_size_px: settings.point_size_px,
        confidence_threshold: settings.confidence_threshold,
        colour_mode: settings.colour_mode.shader_code(),
        stride,
        newest_frame: history.latest_frame().unwrap_or(0) as u32,
        age_span_frames: (history.poses.len() as f32).max(1.0),
        depth_range: [0.0, history.max_depth.max(0.1) + camera.distance],
        log_confidence_range: [log_conf.0, log_conf.1.max(log_conf.0 + 1e-3)],
        chunk_points: book.chunk_points(),
        frame_count: book.frames().len() as u32,
        threshold_code: u32::from(point_format::confidence_code(settings.confidence_threshold)),
        pad: 0,
    };
    SceneFrame {
        uniforms,
        size_px,
        draws: book.draw_counts(stride).collect(),
        draw_lines: settings.show_grid || settings.show_frustums || settings.show_trajectory,
        path,
    }
}
