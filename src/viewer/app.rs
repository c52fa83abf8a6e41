//! The eframe app: drains results from the pipeline's channel, feeds the 3D view and the panel
//! history, lays out the window, and (for headless checks) takes a screenshot and exits after a
//! given number of processed frames.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use eframe::egui::{self, Color32, RichText};

use super::cloud_view::CloudView;
use super::control::{ViewerControl, ViewerEvent};
use super::fps::FpsMeter;
use super::history::StreamHistory;
use super::panels::{self, ControlState, InputThumbnails, TimelineState};
use crate::frame::FrameResult;
use crate::kvcache::CacheEvent;
use crate::pipeline::KeyframeRule;
use crate::record::RecorderStatus;

/// Results ingested per repaint at most, so a burst from a file source cannot stall the UI.
const MAX_RESULTS_PER_REPAINT: usize = 32;
/// Points uploaded per repaint at most (about 50 MB), for the same reason.
const MAX_POINTS_PER_REPAINT: u64 = 2_000_000;
/// Repaints between the last needed frame arriving and the screenshot, so it is on screen.
/// Also the repaints the closing frame-rate figure covers with every point loaded.
const SETTLE_REPAINTS: u32 = 10;
/// How often an idle window looks whether it was asked to close.
const CLOSE_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ViewerError {
    #[error("could not open the viewer window: {0}")]
    Window(String),
    #[error("could not save the screenshot to {path}: {reason}")]
    Screenshot { path: PathBuf, reason: String },
    #[error("starting the {0} thread: {1}")]
    Spawn(&'static str, #[source] std::io::Error),
}

/// When to take a screenshot and close on its own (headless checks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExitPlan {
    /// Close after this many processed frames (results received).
    pub exit_after: Option<u64>,
    /// Save the window as PNG just before closing.
    pub screenshot: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct ViewerOptions {
    /// What the stream is, for the status bar ("synthetic scene", "camera 0", a folder).
    pub source_label: String,
    /// Persistent notices shown on top of the 3D view (e.g. random weights).
    pub notices: Vec<String>,
    pub exit: ExitPlan,
    /// Recording is offered only when something records.
    pub recording_available: bool,
    /// Most point sprites drawn per repaint (`None`: the default budget).
    pub point_budget: Option<u64>,
    /// A replay: the timeline to show (scrub, play/pause, speed).
    pub timeline: Option<TimelineState>,
    /// Set from outside (a signal: Ctrl-C, SIGTERM, SIGHUP) to close the window the way its
    /// close button does, so the feed stops and a recording gets its index.
    pub close_requested: Option<Arc<AtomicBool>>,
}

/// What a run of the viewer did, for the command line to print.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ViewerReport {
    pub frames_processed: u64,
    pub repaints: u64,
    pub seconds: f64,
    pub points_on_gpu: u64,
    /// Frame rate over the last repaints before closing (all points loaded).
    pub fps_at_end: f64,
    /// Points drawn per repaint at the end (after the point budget).
    pub sprites_drawn: u64,
    /// How the points were drawn (`None`: no GPU).
    pub render_path: Option<crate::viewer::raster::RenderPath>,
    pub screenshot: Option<PathBuf>,
    pub error: Option<String>,
    /// The notices that were on screen (random weights, failures).
    pub notices: Vec<String>,
}

impl ViewerReport {
    pub fn mean_fps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.repaints as f64 / self.seconds
        } else {
            0.0
        }
    }
}

#[derive(Debug, Default)]
enum ExitState {
    #[default]
    Running,
    Settling(u32),
    WaitingForScreenshot,
    Closing,
}

pub struct ViewerApp {
    events: Receiver<ViewerEvent>,
    control: Option<Sender<ViewerControl>>,
    options: ViewerOptions,
    /// The latest status line from the stream (warnings, resets, loading).
    status: Option<String>,
    pub history: StreamHistory,
    pub cloud: CloudView,
    thumbnails: InputThumbnails,
    pub controls: ControlState,
    fps: FpsMeter,
    source_ended: bool,
    exit_state: ExitState,
    screenshot: Arc<Mutex<Option<Arc<egui::ColorImage>>>>,
    report: Arc<Mutex<ViewerReport>>,
    /// The newest result not yet turned into thumbnails (only the newest is shown).
    pending_thumbnail: Option<Arc<FrameResult>>,
    /// The recording in progress, as last reported by the feeder.
    pub recording: Option<RecorderStatus>,
}

impl ViewerApp {
    pub fn new(
        cc: &eframe::CreationContext<'_>,
        events: Receiver<ViewerEvent>,
        control: Option<Sender<ViewerControl>>,
        options: ViewerOptions,
    ) -> Self {
        Self::with_render_state(cc.wgpu_render_state.clone(), events, control, options)
    }

    /// For tests and embedding: `render_state` may be `None` (no 3D drawing).
    pub fn with_render_state(
        render_state: Option<eframe::egui_wgpu::RenderState>,
        events: Receiver<ViewerEvent>,
        control: Option<Sender<ViewerControl>>,
        options: ViewerOptions,
    ) -> Self {
        let controls = ControlState {
            connected: control.is_some(),
            recording_unavailable: (!options.recording_available)
                .then(|| "nothing to record here (the demo stream or a replay)".to_string()),
            timeline: options.timeline.clone(),
            ..ControlState::default()
        };
        let mut cloud = CloudView::new(render_state);
        if let Some(budget) = options.point_budget {
            // Asked for explicitly: it limits whichever path draws.
            cloud.settings.point_budget = budget;
            cloud.settings.compute_point_budget = Some(budget);
        }
        Self {
            events,
            control,
            options,
            status: None,
            history: StreamHistory::default(),
            cloud,
            thumbnails: InputThumbnails::default(),
            controls,
            fps: FpsMeter::default(),
            source_ended: false,
            exit_state: ExitState::Running,
            screenshot: Arc::default(),
            report: Arc::default(),
            pending_thumbnail: None,
            recording: None,
        }
    }

    /// Shared with the caller of `run_viewer`, filled in as the app runs.
    pub fn report_handle(&self) -> Arc<Mutex<ViewerReport>> {
        Arc::clone(&self.report)
    }

    /// Takes what arrived on the channel (bounded per repaint).
    pub fn drain_events(&mut self) {
        let points_before = self.cloud.book().total_points();
        for _ in 0..MAX_RESULTS_PER_REPAINT {
            // Saturating: a reset in the middle of the batch empties the cloud.
            if self
                .cloud
                .book()
                .total_points()
                .saturating_sub(points_before)
                >= MAX_POINTS_PER_REPAINT
            {
                // The rest waits for the next repaint (upload cost bounds the frame time).
                break;
            }
            match self.events.try_recv() {
                Ok(event) => self.handle_event(event),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.source_ended = true;
                    break;
                }
            }
        }
    }

    pub fn handle_event(&mut self, event: ViewerEvent) {
        match event {
            ViewerEvent::Frame(result) => {
                // A replay that was at its end and seeks back has frames again (and needs
                // repaints again).
                self.source_ended = false;
                self.ingest(result);
            }
            ViewerEvent::Notice(notice) => {
                if !self.options.notices.contains(&notice) {
                    self.options.notices.push(notice);
                }
            }
            ViewerEvent::Status(status) => self.status = Some(status),
            ViewerEvent::Paused(paused) => self.controls.paused = paused,
            ViewerEvent::Settings(settings) => {
                self.controls.paged = settings.paged;
                self.controls.sliding_window = settings.sliding_window;
                let (adaptive, interval) = match settings.keyframe_rule {
                    KeyframeRule::Fixed { interval } => (false, interval),
                    KeyframeRule::Adaptive { base_interval } => (true, base_interval),
                };
                self.controls.adaptive_keyframes = adaptive;
                self.controls.keyframe_interval = u32::try_from(interval).unwrap_or(u32::MAX);
            }
            ViewerEvent::SessionReset(reason) => {
                self.cloud.clear();
                self.history.session_reset();
                self.status = Some(format!("new session: {reason}"));
            }
            ViewerEvent::InputEnded => self.source_ended = true,
            ViewerEvent::Recording(status) => {
                // The toggle follows the truth (e.g. a recording that could not start).
                self.controls.recording = status.is_some();
                self.recording = status;
            }
        }
    }

    pub fn ingest(&mut self, result: Arc<FrameResult>) {
        if result
            .cache
            .events
            .iter()
            .any(|e| matches!(e, CacheEvent::Reset))
        {
            self.cloud.clear();
        }
        self.history.ingest(&result);
        self.cloud.ingest(&result);
        self.pending_thumbnail = Some(result);
    }

    fn send(&mut self, messages: Vec<ViewerControl>) {
        let Some(tx) = &self.control else {
            return;
        };
        for message in messages {
            if tx.send(message).is_err() {
                // The pipeline has gone; the controls can no longer do anything.
                self.controls.connected = false;
                self.control = None;
                break;
            }
        }
    }

    fn status_bar_ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.strong("streamrecon");
            ui.separator();
            ui.label(&self.options.source_label);
            ui.separator();
            ui.label(format!("{} frames", self.history.frames_received));
            if let Some(frame) = self.history.latest_frame() {
                ui.label(format!("(newest #{frame})"));
            }
            ui.separator();
            ui.label(format!("{} points", self.cloud.book().total_points()));
            ui.separator();
            let fps = self.fps.rolling();
            // Software rendering runs below 10 FPS: keep a decimal there.
            ui.label(if fps < 10.0 {
                format!("{fps:.1} FPS")
            } else {
                format!("{fps:.0} FPS")
            });
            if self.source_ended {
                ui.separator();
                ui.colored_label(Color32::YELLOW, "input ended");
            }
            if let Some(status) = &self.status {
                ui.separator();
                ui.label(status);
            }
            if self.controls.paused {
                ui.separator();
                ui.colored_label(Color32::YELLOW, "paused");
            }
            if let Some(recording) = &self.recording {
                ui.separator();
                // A stopped recording is red: the live view goes on, the file does not.
                let colour = if recording.error.is_some() {
                    Color32::RED
                } else {
                    Color32::LIGHT_RED
                };
                ui.colored_label(colour, recording_line(recording));
            }
        });
    }

    fn side_panel_ui(&mut self, ui: &mut egui::Ui) {
        egui::ScrollArea::vertical().show(ui, |ui| {
            egui::CollapsingHeader::new("KV page map")
                .default_open(true)
                .show(ui, |ui| {
                    panels::page_map_ui(ui, &self.history.page_map);
                });
            egui::CollapsingHeader::new("Eviction timeline")
                .default_open(true)
                .show(ui, |ui| {
                    panels::eviction_timeline_ui(ui, &self.history);
                });
            egui::CollapsingHeader::new("Latency per frame")
                .default_open(true)
                .show(ui, |ui| {
                    panels::latency_ui(ui, &self.history);
                });
            egui::CollapsingHeader::new("Memory")
                .default_open(true)
                .show(ui, |ui| {
                    panels::memory_ui(ui, &self.history.stats, &self.cloud.gpu_stats());
                });
            egui::CollapsingHeader::new("Input")
                .default_open(true)
                .show(ui, |ui| {
                    panels::input_ui(ui, &self.thumbnails);
                });
        });
    }

    fn left_panel_ui(&mut self, ui: &mut egui::Ui) {
        egui::ScrollArea::vertical().show(ui, |ui| {
            if let Some(timeline) = &mut self.controls.timeline {
                ui.heading("Replay");
                let newest = self.history.latest_frame();
                let messages = ui
                    .add_enabled_ui(self.controls.connected, |ui| {
                        panels::replay_timeline_ui(ui, timeline, &mut self.controls.paused, newest)
                    })
                    .inner;
                self.send(messages);
                ui.separator();
            }
            ui.heading("Pipeline");
            let messages = panels::controls_ui(ui, &mut self.controls);
            self.send(messages);
            ui.separator();
            ui.heading("View");
            let path = self.cloud.path();
            let requests = panels::render_settings_ui(ui, &mut self.cloud.settings, path);
            self.cloud.update_camera(&self.history, requests);
        });
    }

    fn notices_ui(&self, ui: &egui::Ui, rect: egui::Rect) {
        if self.options.notices.is_empty() {
            return;
        }
        egui::Area::new(egui::Id::unique("notices"))
            .fixed_pos(rect.left_top() + egui::vec2(8.0, 8.0))
            .order(egui::Order::Foreground)
            .show(ui.ctx(), |ui| {
                egui::Frame::popup(ui.style())
                    .fill(Color32::from_rgb(90, 20, 20))
                    .show(ui, |ui| {
                        ui.set_max_width(rect.width() - 32.0);
                        for notice in &self.options.notices {
                            ui.label(RichText::new(notice).color(Color32::WHITE).strong());
                        }
                    });
            });
    }

    /// The headless plan: wait for N frames, let them reach the screen, screenshot, close.
    fn advance_exit_plan(&mut self, ctx: &egui::Context) {
        let Some(target) = self.options.exit.exit_after else {
            return;
        };
        match self.exit_state {
            ExitState::Running => {
                if self.history.frames_received >= target || self.source_ended {
                    self.exit_state = ExitState::Settling(SETTLE_REPAINTS);
                }
            }
            ExitState::Settling(0) => {
                if self.options.exit.screenshot.is_some() {
                    let slot = Arc::clone(&self.screenshot);
                    let repaint = ctx.clone();
                    ctx.request_screenshot(move |image| {
                        if let Ok(mut slot) = slot.lock() {
                            *slot = Some(image);
                        }
                        repaint.request_repaint();
                    });
                    self.exit_state = ExitState::WaitingForScreenshot;
                } else {
                    self.exit_state = ExitState::Closing;
                }
            }
            ExitState::Settling(n) => self.exit_state = ExitState::Settling(n - 1),
            ExitState::WaitingForScreenshot => {
                let image = self.screenshot.lock().ok().and_then(|mut s| s.take());
                if let (Some(image), Some(path)) = (image, self.options.exit.screenshot.clone()) {
                    let saved = save_png(&image, &path);
                    if let Ok(mut report) = self.report.lock() {
                        match saved {
                            Ok(()) => report.screenshot = Some(path),
                            Err(e) => report.error = Some(e.to_string()),
                        }
                    }
                    self.exit_state = ExitState::Closing;
                }
            }
            ExitState::Closing => {}
        }
        if matches!(self.exit_state, ExitState::Closing) {
            self.update_report();
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
    }

    fn update_report(&self) {
        let (repaints, seconds) = self.fps.totals(Instant::now());
        if let Ok(mut report) = self.report.lock() {
            report.frames_processed = self.history.frames_received;
            report.repaints = repaints;
            report.seconds = seconds;
            report.points_on_gpu = self.cloud.book().total_points();
            report.notices.clone_from(&self.options.notices);
            report.fps_at_end = self.fps.rolling();
            report.sprites_drawn = self.cloud.points_drawn();
            report.render_path = Some(self.cloud.path());
        }
    }
}

impl eframe::App for ViewerApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.fps.tick(Instant::now());
        self.drain_events();
        if let Some(result) = self.pending_thumbnail.take() {
            self.thumbnails.update(&ctx, &result);
        }

        egui::Panel::top("status").show(ui, |ui| self.status_bar_ui(ui));
        egui::Panel::left("controls")
            .default_size(250.0)
            .show(ui, |ui| self.left_panel_ui(ui));
        egui::Panel::right("cache_panels")
            .default_size(430.0)
            .show(ui, |ui| self.side_panel_ui(ui));
        egui::CentralPanel::no_frame().show(ui, |ui| {
            let rect = ui.available_rect_before_wrap();
            self.cloud.ui(ui, &self.history);
            self.notices_ui(ui, rect);
        });

        self.advance_exit_plan(&ctx);
        self.update_report();
        if let Some(close) = &self.options.close_requested {
            if close.load(Ordering::SeqCst) {
                ctx.send_viewport_cmd(egui::ViewportCommand::Close);
            }
            // An idle window repaints only on input: look at the flag a few times a second.
            ctx.request_repaint_after(CLOSE_POLL);
        }
        // A live stream: repaint continuously while frames may still come.
        if !self.source_ended || self.options.exit.exit_after.is_some() {
            ctx.request_repaint();
        }
    }
}

/// The status bar's words for a recording: where, how much, what was lost, why it stopped
/// (plain "REC": egui's default fonts have no record dot).
pub fn recording_line(s: &RecorderStatus) -> String {
    let mut line = format!(
        "REC {}: {} frames, {:.1} MB",
        s.path.display(),
        s.frames_recorded,
        s.bytes_written as f64 / 1e6
    );
    if s.results_not_recorded > 0 {
        line.push_str(&format!(
            ", fell behind: {} not recorded",
            s.results_not_recorded
        ));
    }
    if let Some(e) = &s.error {
        line.push_str(&format!(" \u{2014} {e}"));
    }
    line
}

fn save_png(image: &egui::ColorImage, path: &std::path::Path) -> Result<(), ViewerError> {
    let err = |reason: String| ViewerError::Screenshot {
        path: path.to_path_buf(),
        reason,
    };
    let [w, h] = image.size;
    let bytes: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    let buffer = image::RgbaImage::from_raw(w as u32, h as u32, bytes)
        .ok_or_else(|| err("image size does not match its pixels".to_string()))?;
    let mut png = std::io::Cursor::new(Vec::new());
    buffer
        .write_to(&mut png, image::ImageFormat::Png)
        .map_err(|e| err(e.to_string()))?;
    // Through a temporary file renamed into place: never half a PNG.
    crate::record::export::write_file(path, |w| std::io::Write::write_all(w, png.get_ref()))
        .map_err(|e| err(e.to_string()))
}

/// Opens the window and runs until it is closed (or the exit plan closes it).
pub fn run_viewer(
    events: Receiver<ViewerEvent>,
    control: Option<Sender<ViewerControl>>,
    options: ViewerOptions,
) -> Result<ViewerReport, ViewerError> {
    let report: Arc<Mutex<ViewerReport>> = Arc::default();
    let report_out = Arc::clone(&report);
    let native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("streamrecon")
            .with_inner_size([1600.0, 960.0]),
        wgpu_options: super::gpu::window_wgpu_options(),
        ..Default::default()
    };
    eframe::run_native(
        "streamrecon",
        native,
        Box::new(move |cc| {
            let mut app = ViewerApp::new(cc, events, control, options);
            app.report = report;
            Ok(Box::new(app))
        }),
    )
    .map_err(|e| ViewerError::Window(e.to_string()))?;
    let out = report_out.lock().map(|r| r.clone()).unwrap_or_default();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::viewer::control::StreamSettings;
    use crate::viewer::demo::{DemoConfig, DemoStream};

    fn app() -> (ViewerApp, Sender<ViewerEvent>, Receiver<ViewerControl>) {
        let (events_tx, events_rx) = crossbeam_channel::unbounded();
        let (control_tx, control_rx) = crossbeam_channel::unbounded();
        let app = ViewerApp::with_render_state(
            None,
            events_rx,
            Some(control_tx),
            ViewerOptions::default(),
        );
        (app, events_tx, control_rx)
    }

    #[test]
    fn frames_fill_history_and_cloud_and_reset_clears_them() {
        let (mut app, tx, _rx) = app();
        let mut stream = DemoStream::new(DemoConfig::default());
        let mut points = 0;
        for _ in 0..5 {
            let r = stream.next_result();
            points += r.points.len() as u64;
            tx.send(ViewerEvent::Frame(Arc::new(r))).expect("open");
        }
        app.drain_events();
        assert_eq!(app.history.frames_received, 5);
        assert_eq!(app.cloud.book().total_points(), points);
        tx.send(ViewerEvent::SessionReset("test".into()))
            .expect("open");
        app.drain_events();
        assert_eq!(app.cloud.book().total_points(), 0);
        assert!(app.history.poses.is_empty());
    }

    #[test]
    fn settings_notices_and_end_of_input_reach_the_state() {
        let (mut app, tx, _rx) = app();
        tx.send(ViewerEvent::Settings(StreamSettings {
            paged: false,
            sliding_window: 7,
            keyframe_rule: KeyframeRule::Fixed { interval: 3 },
        }))
        .expect("open");
        tx.send(ViewerEvent::Notice("random weights".into()))
            .expect("open");
        tx.send(ViewerEvent::Notice("random weights".into()))
            .expect("open");
        tx.send(ViewerEvent::InputEnded).expect("open");
        app.drain_events();
        assert!(!app.controls.paged);
        assert_eq!(app.controls.sliding_window, 7);
        assert_eq!(app.controls.keyframe_interval, 3);
        assert!(!app.controls.adaptive_keyframes);
        tx.send(ViewerEvent::Settings(StreamSettings {
            paged: true,
            sliding_window: 7,
            keyframe_rule: KeyframeRule::Adaptive { base_interval: 2 },
        }))
        .expect("open");
        app.drain_events();
        assert!(app.controls.adaptive_keyframes);
        assert_eq!(app.controls.keyframe_interval, 2);
        assert_eq!(app.options.notices, vec!["random weights".to_string()]);
        assert!(app.source_ended);
    }

    #[test]
    fn recording_status_ticks_the_toggle_and_reads_in_the_status_bar() {
        let (mut app, tx, _rx) = app();
        let status = RecorderStatus {
            path: PathBuf::from("sessions/a.srec"),
            frames_recorded: 12,
            results_not_recorded: 3,
            bytes_written: 2_500_000,
            error: Some("recording stopped: disk full".into()),
            disk_full: true,
        };
        tx.send(ViewerEvent::Recording(Some(status.clone())))
            .expect("open");
        app.drain_events();
        assert!(app.controls.recording);
        let line = recording_line(&status);
        assert!(line.contains("sessions/a.srec"), "{line}");
        assert!(line.contains("12 frames"), "{line}");
        assert!(line.contains("fell behind: 3 not recorded"), "{line}");
        assert!(line.contains("disk full"), "{line}");
        let fine = RecorderStatus {
            results_not_recorded: 0,
            error: None,
            ..status
        };
        assert!(!recording_line(&fine).contains("fell behind"));
        tx.send(ViewerEvent::Recording(None)).expect("open");
        app.drain_events();
        assert!(!app.controls.recording && app.recording.is_none());
    }

    #[test]
    fn a_closed_stream_ends_the_input_and_a_gone_pipeline_disables_controls() {
        let (mut app, tx, rx) = app();
        drop(tx);
        app.drain_events();
        assert!(app.source_ended);
        drop(rx);
        app.send(vec![ViewerControl::Reset]);
        assert!(!app.controls.connected);
    }
}
