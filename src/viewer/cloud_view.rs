//! The 3D view: owns the camera, the bookkeeping of the GPU point chunks and the line list,
//! turns input into camera moves, and adds the paint callback that draws it all.

use std::time::Instant;

use eframe::egui::{self, Key, PointerButton, Sense};
use eframe::egui_wgpu::{self, RenderState};
use glam::{Vec2, Vec3};

use super::camera::OrbitCamera;
use super::chunks::{ChunkBook, DEFAULT_CHUNK_POINTS};
use super::history::StreamHistory;
use super::panels::{GpuPointStats, RenderSettings, controls::ViewRequests};
use super::point_format::POINT_BYTES;
use super::raster::RenderPath;
use super::render::{SceneFrame, SceneRenderer};
use super::scene;
use crate::frame::FrameResult;

pub struct CloudView {
    pub camera: OrbitCamera,
    pub settings: RenderSettings,
    book: ChunkBook,
    render_state: Option<RenderState>,
    lines_dirty: bool,
    /// The camera has not been placed on the scene yet (first frames arriving).
    auto_framed: bool,
    last_input: Option<Instant>,
    staging: Vec<u8>,
    /// How the points are drawn: `settings.rasteriser`, or `auto_path`, where the device
    /// runs it (else the sprites).
    path: RenderPath,
    /// The fastest path the device runs (`RenderPath::auto`).
    auto_path: RenderPath,
    /// What `path` was last chosen from (a change of the setting chooses again).
    requested: Option<RenderPath>,
}

impl CloudView {
    /// `render_state` is the window's wgpu state; without one (tests without a GPU) the view
    /// keeps its bookkeeping and shows a placeholder.
    pub fn new(render_state: Option<RenderState>) -> Self {
        Self::with_chunk_points(render_state, DEFAULT_CHUNK_POINTS)
    }

    pub fn with_chunk_points(render_state: Option<RenderState>, chunk_points: u32) -> Self {
        let mut path = RenderPath::Sprites;
        if let Some(rs) = &render_state {
            let downlevel = rs.adapter.get_downlevel_capabilities().flags;
            let renderer =
                SceneRenderer::new(&rs.device, rs.target_format, chunk_points, downlevel);
            path = RenderPath::auto(rs.device.features(), downlevel);
            if !renderer.supports(path) {
                path = RenderPath::Sprites;
            }
            rs.renderer.write().callback_resources.insert(renderer);
        }
        Self {
            camera: OrbitCamera::default(),
            settings: RenderSettings::default(),
            // No cap of its own: the store grows until the GPU refuses a chunk.
            book: ChunkBook::new(chunk_points, u64::MAX),
            render_state,
            lines_dirty: true,
            auto_framed: false,
            last_input: None,
            staging: Vec::new(),
            path,
            auto_path: path,
            requested: None,
        }
    }

    /// The path the window takes by itself on this device.
    pub fn auto_path(&self) -> RenderPath {
        self.auto_path
    }

    /// How the points are drawn.
    pub fn path(&self) -> RenderPath {
        self.path
    }

    /// Chooses how the points are drawn (the sprites where the device cannot run `path`).
    pub fn set_path(&mut self, path: RenderPath) {
        let supported = self.render_state.as_ref().is_some_and(|rs| {
            rs.renderer
                .read()
                .callback_resources
                .get::<SceneRenderer>()
                .is_some_and(|r| r.supports(path))
        });
        self.path = if supported { path } else { RenderPath::Sprites };
    }

    /// Points drawn per repaint at the current settings and path.
    pub fn points_drawn(&self) -> u64 {
        let stride = self.stride();
        self.book
            .draw_counts(stride)
            .map(|(_, n)| u64::from(n))
            .sum()
    }

    fn stride(&self) -> u32 {
        self.book
            .stride_for_budget(scene::budget_for(&self.settings, self.path))
    }

    pub fn has_gpu(&self) -> bool {
        self.render_state.is_some()
    }

    pub fn book(&self) -> &ChunkBook {
        &self.book
    }

    pub fn gpu_stats(&self) -> GpuPointStats {
        let points = self.book.total_points();
        GpuPointStats {
            points,
            bytes: points * POINT_BYTES,
            chunks: self.book.chunk_count(),
            stride: self.stride(),
            refused: self.book.refused_points(),
            path: self.path,
        }
    }

    /// Clears the cloud (the pipeline was reset). GPU chunks are kept and overwritten.
    pub fn clear(&mut self) {
        self.book.clear();
        self.lines_dirty = true;
        self.auto_framed = false;
    }

    /// Places the frame's points in the chunks and uploads them, once.
    pub fn ingest(&mut self, result: &FrameResult) {
        let n = scene::point_count(result);
        self.lines_dirty = true;
        let Some(rs) = &self.render_state else {
            self.book.append(n);
            return;
        };
        let mut renderer = rs.renderer.write();
        let Some(store) = renderer.callback_resources.get_mut::<SceneRenderer>() else {
            return;
        };
        scene::append_result(
            store,
            &mut self.book,
            &rs.device,
            &rs.queue,
            result,
            &mut self.staging,
        );
    }

    fn rebuild_lines(&mut self, history: &StreamHistory) {
        if !self.lines_dirty {
            return;
        }
        self.lines_dirty = false;
        let Some(rs) = &self.render_state else {
            return;
        };
        let lines = scene::scene_lines(&self.settings, history);
        let mut renderer = rs.renderer.write();
        if let Some(scene) = renderer.callback_resources.get_mut::<SceneRenderer>() {
            scene.upload_lines(&rs.device, &rs.queue, &lines.vertices);
        }
    }

    /// Frames the scene once enough of it has arrived, follows the camera if asked, and applies
    /// the reset/top buttons.
    pub fn update_camera(&mut self, history: &StreamHistory, requests: ViewRequests) {
        let bounds = history.bounds;
        let (centre, radius) = bounds.map_or((Vec3::new(0.0, 0.0, 1.0), 1.0), |b| {
            (b.centre(), b.radius())
        });
        if requests.reset_view || (!self.auto_framed && history.poses.len() >= 2) {
            self.camera = OrbitCamera::reset_view(centre, radius);
            self.auto_framed = true;
            if requests.reset_view {
                self.settings.follow_camera = false;
            }
        }
        if requests.top_view {
            self.camera = OrbitCamera::top_view(centre, radius);
            self.settings.follow_camera = false;
        }
        if self.settings.follow_camera
            && let Some(pose) = history.poses.last()
        {
            self.camera
                .follow(pose.world_from_camera, (radius * 0.25).max(0.2));
        }
    }

    /// The 3D view: input, then the paint callback over `ui`'s remaining space.
    pub fn ui(&mut self, ui: &mut egui::Ui, history: &StreamHistory) {
        if self.settings.rasteriser != self.requested {
            self.requested = self.settings.rasteriser;
            self.set_path(self.requested.unwrap_or(self.auto_path));
        }
        let rect = ui.available_rect_before_wrap();
        let response = ui.allocate_rect(rect, Sense::click_and_drag());
        self.handle_input(ui, &response, history);
        self.rebuild_lines(history);

        if self.render_state.is_none() {
            ui.painter()
                .rect_filled(rect, 0.0, egui::Color32::from_rgb(9, 10, 14));
            ui.painter().text(
                rect.center(),
                egui::Align2::CENTER_CENTER,
                format!(
                    "3D view needs wgpu ({} points stored)",
                    self.book.total_points()
                ),
                egui::FontId::proportional(14.0),
                egui::Color32::GRAY,
            );
            return;
        }
        let ppp = ui.ctx().pixels_per_point();
        let size_px = [
            (rect.width() * ppp).round().max(1.0) as u32,
            (rect.height() * ppp).round().max(1.0) as u32,
        ];
        let frame = self.scene_frame(history, size_px);
        ui.painter()
            .add(egui_wgpu::Callback::new_paint_callback(rect, frame));
    }

    fn scene_frame(&self, history: &StreamHistory, size_px: [u32; 2]) -> SceneFrame {
        scene::scene_frame(
            &self.camera,
            &self.settings,
            &self.book,
            history,
            size_px,
            self.path,
        )
    }

    fn handle_input(&mut self, ui: &egui::Ui, response: &egui::Response, history: &StreamHistory) {
        let now = Instant::now();
        let dt = self
            .last_input
            .map_or(0.0, |t| now.duration_since(t).as_secs_f32().min(0.1));
        self.last_input = Some(now);
        let mut moved = false;
        let (modifiers, drag) = ui.input(|i| (i.modifiers, i.pointer.delta()));
        let drag = Vec2::new(drag.x, drag.y);
        if response.dragged_by(PointerButton::Primary) {
            if modifiers.shift {
                self.camera.pan(drag, response.rect.height());
            } else if modifiers.ctrl || modifiers.command {
                self.camera.look_around(drag);
            } else {
                self.camera.orbit(drag);
            }
            moved = true;
        } else if response.dragged_by(PointerButton::Secondary) {
            self.camera.pan(drag, response.rect.height());
            moved = true;
        } else if response.dragged_by(PointerButton::Middle) {
            self.camera.look_around(drag);
            moved = true;
        }
        if response.hovered() {
            let scroll = ui.input(|i| i.smooth_scroll_delta.y);
            if scroll != 0.0 {
                self.camera.zoom(scroll / 50.0);
                moved = true;
            }
            let speed = history.bounds.map_or(1.0, |b| b.radius()) * 0.6 * dt;
            let fly = ui.input(|i| {
                let axis = |pos: Key, neg: Key| {
                    f32::from(u8::from(i.key_down(pos))) - f32::from(u8::from(i.key_down(neg)))
                };
                Vec3::new(
                    axis(Key::D, Key::A),
                    axis(Key::E, Key::Q),
                    axis(Key::W, Key::S),
                )
            });
            if fly != Vec3::ZERO {
                self.camera.fly(fly * speed);
                moved = true;
                ui.ctx().request_repaint();
            }
        }
        if response.double_clicked() {
            self.update_camera(
                history,
                ViewRequests {
                    reset_view: true,
                    top_view: false,
                },
            );
        }
        if moved {
            // Taking the camera by hand ends following.
            self.settings.follow_camera = false;
        }
    }
}
