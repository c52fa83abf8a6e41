//! The controls panel (pipeline: pause, reset, paged/dense, window, keyframe interval,
//! recording) and the render settings of the 3D view.

use eframe::egui;

use crate::viewer::control::ViewerControl;
use crate::viewer::raster::RenderPath;

/// What the pipeline controls show; changed by the user, echoed to the pipeline as messages.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlState {
    pub paused: bool,
    /// Paged attention (true) or the dense concatenating baseline.
    pub paged: bool,
    pub sliding_window: usize,
    /// Fixed rule: frames between keyframes. Adaptive rule: the interval it starts from.
    pub keyframe_interval: u32,
    pub adaptive_keyframes: bool,
    pub recording: bool,
    /// `None` when recording is available; otherwise why not (shown on the disabled toggle).
    pub recording_unavailable: Option<String>,
    /// Whether anything listens to the messages (false: controls are shown disabled).
    pub connected: bool,
    /// Replay only: the timeline (`None`: a live stream, no timeline shown).
    pub timeline: Option<TimelineState>,
}

impl Default for ControlState {
    fn default() -> Self {
        Self {
            paused: false,
            paged: true,
            sliding_window: 64,
            keyframe_interval: 1,
            adaptive_keyframes: false,
            recording: false,
            recording_unavailable: Some("recording arrives with the recorder".to_string()),
            connected: false,
            timeline: None,
        }
    }
}

/// The replay timeline: which frames the session holds and where the person wants to be.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineState {
    /// First and last stream frame of the session (as played).
    pub first_frame: u64,
    pub last_frame: u64,
    /// Where the slider stands: follows the newest frame shown unless it is being dragged.
    pub frame: u64,
    /// 1.0 the recorded pace; 0 as fast as possible.
    pub speed: f64,
}

/// The speeds offered, with their labels; 0 is "as fast as possible".
pub const REPLAY_SPEEDS: [(f64, &str); 6] = [
    (0.25, "0.25×"),
    (0.5, "0.5×"),
    (1.0, "1×"),
    (2.0, "2×"),
    (4.0, "4×"),
    (0.0, "max"),
];

/// The replay timeline: play/pause, a slider over the session's frames to scrub, and speed.
/// `newest` is the newest frame on screen (the slider follows it while not dragged).
pub fn replay_timeline_ui(
    ui: &mut egui::Ui,
    state: &mut TimelineState,
    paused: &mut bool,
    newest: Option<u64>,
) -> Vec<ViewerControl> {
    let mut out = Vec::new();
    ui.horizontal(|ui| {
        let label = if *paused { "Play" } else { "Pause" };
        if ui.button(label).clicked() {
            *paused = !*paused;
            out.push(ViewerControl::Pause(*paused));
        }
        ui.label("speed");
        for (speed, label) in REPLAY_SPEEDS {
            if ui
                .selectable_label(state.speed == speed, label)
                .on_hover_text(if speed == 0.0 {
                    "as fast as possible"
                } else {
                    "of the recorded pace"
                })
                .clicked()
                && state.speed != speed
            {
                state.speed = speed;
                out.push(ViewerControl::Speed(speed));
            }
        }
    });
    // As wide as the panel allows: one pixel per frame is what makes scrubbing precise.
    ui.spacing_mut().slider_width = (ui.available_width() - 110.0).max(80.0);
    let slider = ui.add(
        egui::Slider::new(&mut state.frame, state.first_frame..=state.last_frame).text("frame"),
    );
    // Seek once, when the scrub ends: each seek rebuilds the view from the first frame.
    if slider.drag_stopped() || (slider.changed() && !slider.dragged()) {
        out.push(ViewerControl::Seek(state.frame));
    } else if !slider.dragged()
        && let Some(newest) = newest
    {
        state.frame = newest.clamp(state.first_frame, state.last_frame);
    }
    out
}

/// Shows the controls and returns the messages the user's changes call for.
pub fn controls_ui(ui: &mut egui::Ui, state: &mut ControlState) -> Vec<ViewerControl> {
    let mut out = Vec::new();
    ui.add_enabled_ui(state.connected, |ui| {
        ui.horizontal(|ui| {
            let pause_label = if state.paused { "Resume" } else { "Pause" };
            if ui.button(pause_label).clicked() {
                state.paused = !state.paused;
                out.push(ViewerControl::Pause(state.paused));
            }
            if ui
                .button("Reset")
                .on_hover_text("Clear the cache and the cloud")
                .clicked()
            {
                out.push(ViewerControl::Reset);
            }
        });
        ui.horizontal(|ui| {
            ui.label("attention");
            let before = state.paged;
            ui.selectable_value(&mut state.paged, true, "paged");
            ui.selectable_value(&mut state.paged, false, "dense");
            if state.paged != before {
                out.push(ViewerControl::PagedAttention(state.paged));
            }
        });
        let window = ui.add(egui::Slider::new(&mut state.sliding_window, 1..=256).text("window"));
        if window.drag_stopped() || (window.changed() && !window.dragged()) {
            out.push(ViewerControl::SlidingWindow(state.sliding_window));
        }
        let rule_before = state.adaptive_keyframes;
        ui.horizontal(|ui| {
            ui.label("keyframes");
            ui.selectable_value(&mut state.adaptive_keyframes, false, "fixed")
                .on_hover_text("A keyframe every n frames");
            ui.selectable_value(&mut state.adaptive_keyframes, true, "adaptive")
                .on_hover_text(
                    "A keyframe every n frames at first; the interval doubles each time the \
                     remaining keyframe budget halves, so a live stream never runs out",
                );
        });
        let label = if state.adaptive_keyframes {
            "start interval"
        } else {
            "keyframe every"
        };
        let interval = ui.add(egui::Slider::new(&mut state.keyframe_interval, 1..=16).text(label));
        if state.adaptive_keyframes != rule_before
            || interval.drag_stopped()
            || (interval.changed() && !interval.dragged())
        {
            out.push(if state.adaptive_keyframes {
                ViewerControl::AdaptiveKeyframes(state.keyframe_interval)
            } else {
                ViewerControl::KeyframeInterval(state.keyframe_interval)
            });
        }
    });
    let can_record = state.connected && state.recording_unavailable.is_none();
    let record = ui.add_enabled(
        can_record,
        egui::Checkbox::new(&mut state.recording, "record"),
    );
    let record = match &state.recording_unavailable {
        Some(why) => record.on_disabled_hover_text(why.as_str()),
        None => record,
    };
    if record.changed() {
        out.push(ViewerControl::Recording(state.recording));
    }
    if !state.connected {
        ui.weak("No pipeline attached: controls are disabled.");
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColourMode {
    Rgb,
    Confidence,
    FrameAge,
    Depth,
}

impl ColourMode {
    pub const ALL: [Self; 4] = [Self::Rgb, Self::Confidence, Self::FrameAge, Self::Depth];

    /// The value of `colour_mode` in `shaders/common.wgsl`.
    pub fn shader_code(self) -> u32 {
        match self {
            Self::Rgb => 0,
            Self::Confidence => 1,
            Self::FrameAge => 2,
            Self::Depth => 3,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Rgb => "RGB",
            Self::Confidence => "confidence",
            Self::FrameAge => "frame age",
            Self::Depth => "depth",
        }
    }
}

/// How the 3D view draws; applied on the GPU through uniforms, so changes cost no upload.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderSettings {
    pub point_size_px: f32,
    pub confidence_threshold: f32,
    pub colour_mode: ColourMode,
    /// Most sprites drawn per repaint on the sprite path; above it every n-th point is drawn.
    pub point_budget: u64,
    /// Most points drawn per repaint on the compute paths (`None`: every point; they are
    /// built to draw all of them).
    pub compute_point_budget: Option<u64>,
    /// How to draw the points (`None`: the window's own choice, `RenderPath::auto`).
    pub rasteriser: Option<RenderPath>,
    pub show_frustums: bool,
    pub show_trajectory: bool,
    pub show_grid: bool,
    pub follow_camera: bool,
}

impl Default for RenderSettings {
    fn default() -> Self {
        Self {
            point_size_px: 2.0,
            confidence_threshold: 1.0,
            colour_mode: ColourMode::Rgb,
            point_budget: 4_000_000,
            compute_point_budget: None,
            rasteriser: None,
            show_frustums: true,
            show_trajectory: true,
            show_grid: true,
            follow_camera: false,
        }
    }
}

/// What the render settings ask of the camera this frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViewRequests {
    pub reset_view: bool,
    pub top_view: bool,
}

/// `path` is how the view draws: the point budget shown is the one that path uses.
pub fn render_settings_ui(
    ui: &mut egui::Ui,
    settings: &mut RenderSettings,
    path: RenderPath,
) -> ViewRequests {
    let mut requests = ViewRequests::default();
    ui.add(egui::Slider::new(&mut settings.point_size_px, 1.0..=12.0).text("point size (px)"));
    ui.add(
        egui::Slider::new(&mut settings.confidence_threshold, 0.0..=20.0)
            .logarithmic(true)
            .text("min confidence"),
    );
    ui.horizontal_wrapped(|ui| {
        ui.label("rasteriser");
        ui.selectable_value(&mut settings.rasteriser, None, "auto")
            .on_hover_text("the fastest this GPU runs: compute, else compute32, else sprites");
        for p in RenderPath::ALL {
            ui.selectable_value(&mut settings.rasteriser, Some(p), p.name())
                .on_hover_text(p.description());
        }
    });
    ui.horizontal_wrapped(|ui| {
        ui.label("colour");
        for mode in ColourMode::ALL {
            ui.selectable_value(&mut settings.colour_mode, mode, mode.label());
        }
    });
    if path.is_compute() {
        // The compute rasteriser is meant to draw every point; a budget is there if asked for.
        let mut every = settings.compute_point_budget.is_none();
        ui.horizontal(|ui| {
            if ui.checkbox(&mut every, "every point").changed() {
                settings.compute_point_budget = if every { None } else { Some(100_000_000) };
            }
            if let Some(budget) = &mut settings.compute_point_budget {
                let mut millions = *budget as f64 / 1e6;
                if ui
                    .add(
                        egui::Slider::new(&mut millions, 1.0..=2000.0)
                            .logarithmic(true)
                            .text("point budget (M)"),
                    )
                    .changed()
                {
                    *budget = (millions * 1e6) as u64;
                }
            }
        });
    } else {
        let mut millions = settings.point_budget as f64 / 1e6;
        if ui
            .add(
                egui::Slider::new(&mut millions, 0.1..=50.0)
                    .logarithmic(true)
                    .text("point budget (M)"),
            )
            .changed()
        {
            settings.point_budget = (millions * 1e6) as u64;
        }
    }
    ui.horizontal_wrapped(|ui| {
        ui.checkbox(&mut settings.show_frustums, "frustums");
        ui.checkbox(&mut settings.show_trajectory, "trajectory");
        ui.checkbox(&mut settings.show_grid, "grid");
    });
    ui.horizontal_wrapped(|ui| {
        ui.toggle_value(&mut settings.follow_camera, "follow camera");
        requests.reset_view = ui.button("reset view").clicked();
        requests.top_view = ui.button("top view").clicked();
    });
    ui.small("drag: orbit · right-drag / shift-drag: pan · scroll: zoom · ctrl-drag: look · WASD/QE: fly");
    requests
}
