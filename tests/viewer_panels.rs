//! The viewer's panels under egui_kittest: the UI tree and controls everywhere, and image
//! snapshots (panels and the 3D view) where a wgpu adapter exists — in CI that is Mesa's
//! software Vulkan (lavapipe, `mesa-vulkan-drivers`); without one the image checks are skipped
//! with a printed reason.
//!
//! Regenerate snapshots with `UPDATE_SNAPSHOTS=1 cargo test --test viewer_panels`.

use std::sync::Arc;

use eframe::egui;
use egui_kittest::kittest::{NodeT as _, Queryable as _};
use egui_kittest::wgpu::{WgpuTestRenderer, create_render_state, default_wgpu_setup};
use egui_kittest::{Harness, SnapshotOptions};
use streamrecon::frame::FrameResult;
use streamrecon::viewer::ViewerControl;
use streamrecon::viewer::cloud_view::CloudView;
use streamrecon::viewer::demo::{DemoConfig, DemoStream};
use streamrecon::viewer::history::StreamHistory;
use streamrecon::viewer::panels::{
    self, ColourMode, ControlState, InputThumbnails, RenderSettings, controls::ViewRequests,
};
use streamrecon::viewer::point_format::POINT_BYTES;
use streamrecon::viewer::raster::RenderPath;
use streamrecon::viewer::render::SceneRenderer;

fn demo_results(frames: usize) -> Vec<Arc<FrameResult>> {
    let mut stream = DemoStream::new(DemoConfig::default());
    (0..frames)
        .map(|_| Arc::new(stream.next_result()))
        .collect()
}

fn demo_history(results: &[Arc<FrameResult>]) -> StreamHistory {
    let mut history = StreamHistory::default();
    for r in results {
        history.ingest(r);
    }
    history
}

/// Why no wgpu render state could be made here: the reason a rendering test skips.
#[derive(Debug)]
struct NoAdapter(String);

impl std::fmt::Display for NoAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A wgpu render state on whatever adapter exists (a software one in CI), or why not.
fn render_state() -> Result<eframe::egui_wgpu::RenderState, NoAdapter> {
    // kittest panics when no adapter is found; turn that into a skip.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let made = std::panic::catch_unwind(|| {
        create_render_state(
            default_wgpu_setup(),
            eframe::egui_wgpu::RendererOptions::PREDICTABLE,
        )
    });
    std::panic::set_hook(previous);
    made.map_err(|e| {
        NoAdapter(
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "no wgpu adapter".to_string()),
        )
    })
}

/// A render state made as the window makes it (the 3D view's device descriptor: 64-bit atomics
/// where the adapter has them), on whatever adapter exists, or why not.
fn window_render_state() -> Result<eframe::egui_wgpu::RenderState, NoAdapter> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let made = std::panic::catch_unwind(|| {
        let mut setup = default_wgpu_setup();
        if let eframe::egui_wgpu::WgpuSetup::CreateNew(new) = &mut setup {
            new.device_descriptor = Arc::new(streamrecon::viewer::gpu::device_descriptor);
        }
        create_render_state(setup, eframe::egui_wgpu::RendererOptions::PREDICTABLE)
    });
    std::panic::set_hook(previous);
    made.map_err(|_| NoAdapter("no wgpu adapter".to_string()))
}

fn snapshot_options() -> SnapshotOptions {
    // Software rasterisers differ a little between Mesa versions; text and layout must match.
    SnapshotOptions::new().threshold(2.0).max_failed_pixels(200)
}

fn all_panels_ui(ui: &mut egui::Ui, history: &StreamHistory, thumbs: &InputThumbnails) {
    ui.heading("KV page map");
    panels::page_map_ui(ui, &history.page_map);
    ui.heading("Eviction timeline");
    panels::eviction_timeline_ui(ui, history);
    ui.heading("Latency");
    panels::latency_ui(ui, history);
    ui.heading("Memory");
    panels::memory_ui(ui, &history.stats, &Default::default());
    ui.heading("Input");
    panels::input_ui(ui, thumbs);
}

fn panels_harness(frames: usize) -> Harness<'static> {
    let results = demo_results(frames);
    let history = demo_history(&results);
    let newest = results.last().cloned();
    let mut thumbs = InputThumbnails::default();
    Harness::builder()
        .with_size(egui::vec2(440.0, 900.0))
        .with_accessibility_check(false)
        .build_ui(move |ui| {
            if let Some(result) = &newest
                && thumbs.frame != Some(result.frame)
            {
                thumbs.update(ui.ctx(), result);
            }
            all_panels_ui(ui, &history, &thumbs);
        })
}

#[test]
fn panels_show_the_stream() {
    let mut harness = panels_harness(40);
    harness.run();
    harness.get_by_label_contains("frames evicted");
    harness.get_by_label_contains("ms (");
    harness.get_by_label_contains("resident of");
    harness.get_by_label("frame 39");
}

#[test]
fn empty_panels_say_so() {
    let history = StreamHistory::default();
    let thumbs = InputThumbnails::default();
    let mut harness = Harness::builder()
        .with_size(egui::vec2(440.0, 600.0))
        .with_accessibility_check(false)
        .build_ui(move |ui| all_panels_ui(ui, &history, &thumbs));
    harness.run();
    harness.get_by_label_contains("page map fills");
    harness.get_by_label("No frame yet.");
}

#[test]
fn controls_send_messages() {
    let mut harness = Harness::builder()
        .with_size(egui::vec2(300.0, 300.0))
        .with_accessibility_check(false)
        .build_ui_state(
            |ui, (state, sent): &mut (ControlState, Vec<ViewerControl>)| {
                let messages = panels::controls_ui(ui, state);
                sent.extend(messages);
            },
            (
                ControlState {
                    connected: true,
                    ..ControlState::default()
                },
                Vec::new(),
            ),
        );
    harness.run();
    harness.get_by_label("Pause").click();
    harness.run();
    harness.get_by_label("Reset").click();
    harness.run();
    harness.get_by_label("dense").click();
    harness.run();
    harness.get_by_label("adaptive").click();
    harness.run();
    // The slider now sets where the adaptive interval starts.
    assert!(
        harness
            .query_all_by_label_contains("start interval")
            .count()
            > 0
    );
    harness.get_by_label("fixed").click();
    harness.run();
    let (state, sent) = harness.state();
    assert!(state.paused);
    assert!(!state.paged);
    assert!(!state.adaptive_keyframes);
    assert_eq!(
        sent,
        &vec![
            ViewerControl::Pause(true),
            ViewerControl::Reset,
            ViewerControl::PagedAttention(false),
            ViewerControl::AdaptiveKeyframes(1),
            ViewerControl::KeyframeInterval(1),
        ]
    );
    // Recording is not offered until a recorder exists.
    assert!(
        harness
            .get_by_label("record")
            .accesskit_node()
            .is_disabled()
    );
}

#[test]
fn disconnected_controls_are_disabled() {
    let mut harness = Harness::builder()
        .with_accessibility_check(false)
        .build_ui_state(
            |ui, state: &mut ControlState| {
                panels::controls_ui(ui, state);
            },
            ControlState::default(),
        );
    harness.run();
    assert!(harness.get_by_label("Pause").accesskit_node().is_disabled());
    harness.get_by_label_contains("No pipeline attached");
}

#[test]
fn snapshot_panels() {
    if let Err(reason) = render_state() {
        println!("skipping the panel snapshot: no wgpu adapter ({reason})");
        return;
    }
    let mut harness = panels_harness(40);
    harness.run();
    harness.snapshot_options("viewer_panels", &snapshot_options());
}

#[test]
fn snapshot_cloud_view() {
    let rs = match render_state() {
        Ok(rs) => rs,
        Err(reason) => {
            println!("skipping the 3D view snapshot: no wgpu adapter ({reason})");
            return;
        }
    };
    let results = demo_results(30);
    let history = demo_history(&results);
    let mut view = CloudView::new(Some(rs.clone()));
    // The snapshot is the sprites' (the compute paths are held to it in their own test).
    view.set_path(RenderPath::Sprites);
    assert_eq!(view.path(), RenderPath::Sprites);
    let uploads = rs.clone();
    for r in &results {
        view.ingest(r);
    }
    assert_eq!(
        view.book().total_points(),
        results.iter().map(|r| r.points.len() as u64).sum::<u64>()
    );
    view.update_camera(
        &history,
        ViewRequests {
            reset_view: false,
            top_view: true,
        },
    );
    let mut harness = Harness::builder()
        .with_size(egui::vec2(480.0, 320.0))
        .with_accessibility_check(false)
        .renderer(WgpuTestRenderer::from_render_state(rs))
        .build_ui(move |ui| view.ui(ui, &history));
    harness.run();
    harness.snapshot_options("viewer_cloud_top", &snapshot_options());
    // Every point went to the GPU exactly once, however many repaints happened.
    let points: u64 = results.iter().map(|r| r.points.len() as u64).sum();
    let renderer = uploads.renderer.read();
    let scene = renderer
        .callback_resources
        .get::<SceneRenderer>()
        .expect("the view registered its renderer");
    assert_eq!(scene.bytes_uploaded(), points * POINT_BYTES);
}

/// The demo's top view through the window's own `CloudView` on `rs`: it must take `expected`
/// by itself, draw every point, match the sprites' snapshot within the ties' tolerance, and
/// name its path in the memory panel.
fn window_draws_with(rs: eframe::egui_wgpu::RenderState, expected: RenderPath) {
    let results = demo_results(30);
    let history = demo_history(&results);
    let mut view = CloudView::new(Some(rs.clone()));
    assert_eq!(view.path(), expected);
    assert_eq!(view.gpu_stats().path, expected);
    for r in &results {
        view.ingest(r);
    }
    // Every point drawn on the compute paths, where the sprites have their budget.
    assert_eq!(view.gpu_stats().stride, 1);
    view.update_camera(
        &history,
        ViewRequests {
            reset_view: false,
            top_view: true,
        },
    );
    let stats = view.gpu_stats();
    let mut harness = Harness::builder()
        .with_size(egui::vec2(480.0, 320.0))
        .with_accessibility_check(false)
        .renderer(WgpuTestRenderer::from_render_state(rs))
        .build_ui(move |ui| view.ui(ui, &history));
    harness.run();
    // The compute paths draw the sprites' snapshot, but for points at equal depths, where
    // the paths break ties differently (docs/viewer.md: the tolerance): a few hundred
    // scattered pixels of the 150 k at checker edges.
    harness.snapshot_options(
        "viewer_cloud_top",
        &SnapshotOptions::new()
            .threshold(2.0)
            .max_failed_pixels(1000),
    );
    let cache = streamrecon::kvcache::CacheStats::default();
    let mut panel = Harness::builder()
        .with_size(egui::vec2(480.0, 240.0))
        .build_ui(move |ui| panels::memory_ui(ui, &cache, &stats));
    panel.run();
    panel.get_by_label_contains(expected.description());
}

#[test]
fn the_window_draws_with_the_compute_path_where_the_device_has_it() {
    let rs = match window_render_state() {
        Ok(rs) => rs,
        Err(reason) => {
            println!("skipping the window's path choice: no wgpu adapter ({reason})");
            return;
        }
    };
    let downlevel = rs.adapter.get_downlevel_capabilities().flags;
    let expected = RenderPath::auto(rs.device.features(), downlevel);
    if expected != RenderPath::Compute {
        println!(
            "{} has no 64-bit atomics: the window takes {}",
            rs.adapter.get_info().name,
            expected.name()
        );
        return;
    }
    window_draws_with(rs, expected);
}

#[test]
fn a_device_without_64_bit_atomics_takes_the_32_bit_compute_path() {
    // kittest's own device asks for no optional features: as an adapter without them would be.
    let rs = match render_state() {
        Ok(rs) => rs,
        Err(reason) => {
            println!("skipping the 32-bit window path: no wgpu adapter ({reason})");
            return;
        }
    };
    assert!(
        !rs.device
            .features()
            .contains(eframe::wgpu::Features::SHADER_INT64_ATOMIC_MIN_MAX)
    );
    let downlevel = rs.adapter.get_downlevel_capabilities().flags;
    if !downlevel.contains(eframe::wgpu::DownlevelFlags::COMPUTE_SHADERS) {
        println!("skipping: this adapter runs no compute shaders (the window keeps the sprites)");
        return;
    }
    window_draws_with(rs, RenderPath::Compute32);
}

#[test]
fn the_rasteriser_setting_chooses_the_path_where_the_device_runs_it() {
    let rs = match render_state() {
        Ok(rs) => rs,
        Err(reason) => {
            println!("skipping the rasteriser setting: no wgpu adapter ({reason})");
            return;
        }
    };
    let results = demo_results(3);
    let history = demo_history(&results);
    let mut view = CloudView::new(Some(rs.clone()));
    for r in &results {
        view.ingest(r);
    }
    let auto = view.auto_path();
    let mut harness = Harness::builder()
        .with_size(egui::vec2(320.0, 200.0))
        .with_accessibility_check(false)
        .renderer(WgpuTestRenderer::from_render_state(rs.clone()))
        .build_ui_state(move |ui, view: &mut CloudView| view.ui(ui, &history), view);
    harness.run();
    assert_eq!(harness.state().path(), auto);
    let supported = |p: RenderPath| {
        p.supported(
            rs.device.features(),
            rs.adapter.get_downlevel_capabilities().flags,
        )
    };
    for path in RenderPath::ALL {
        harness.state_mut().settings.rasteriser = Some(path);
        harness.run();
        // A path the device cannot run leaves the sprites.
        let expected = if supported(path) {
            path
        } else {
            RenderPath::Sprites
        };
        assert_eq!(
            harness.state().path(),
            expected,
            "asked for {}",
            path.name()
        );
        assert_eq!(harness.state().gpu_stats().path, expected);
    }
    harness.state_mut().settings.rasteriser = None;
    harness.run();
    assert_eq!(harness.state().path(), auto);
}

#[test]
fn the_view_panel_offers_the_rasteriser_and_the_paths_budget() {
    let mut harness = Harness::builder()
        .with_size(egui::vec2(420.0, 320.0))
        .build_ui_state(
            |ui, settings: &mut RenderSettings| {
                panels::render_settings_ui(ui, settings, RenderPath::Compute);
            },
            RenderSettings::default(),
        );
    harness.run();
    // On a compute path every point is drawn unless asked otherwise.
    harness.get_by_label("every point");
    harness.get_by_label("compute32").click();
    harness.run();
    assert_eq!(harness.state().rasteriser, Some(RenderPath::Compute32));
    harness.get_by_label("auto").click();
    harness.run();
    assert_eq!(harness.state().rasteriser, None);
    harness.get_by_label("every point").click();
    harness.run();
    assert!(harness.state().compute_point_budget.is_some());
}

#[test]
fn page_map_hover_names_the_page() {
    let results = demo_results(20);
    let history = demo_history(&results);
    let mut harness = Harness::builder()
        .with_size(egui::vec2(300.0, 120.0))
        .with_accessibility_check(false)
        .build_ui(move |ui| panels::page_map_ui(ui, &history.page_map));
    harness.run();
    // Somewhere over the first cells (the panel's margin is a few points).
    harness.hover_at(egui::pos2(14.0, 14.0));
    harness.run();
    harness.get_by_label_contains("page ");
}

#[test]
fn colour_modes_and_threshold_change_the_picture_on_the_gpu() {
    let rs = match render_state() {
        Ok(rs) => rs,
        Err(reason) => {
            println!("skipping the colour mode renders: no wgpu adapter ({reason})");
            return;
        }
    };
    let results = demo_results(12);
    let history = demo_history(&results);
    let mut view = CloudView::new(Some(rs.clone()));
    for r in &results {
        view.ingest(r);
    }
    view.update_camera(
        &history,
        ViewRequests {
            reset_view: true,
            top_view: false,
        },
    );
    view.settings.show_grid = false;
    view.settings.show_frustums = false;
    view.settings.show_trajectory = false;
    let mut harness = Harness::builder()
        .with_size(egui::vec2(240.0, 160.0))
        .with_accessibility_check(false)
        .renderer(WgpuTestRenderer::from_render_state(rs))
        .build_ui_state(
            move |ui, settings: &mut RenderSettings| {
                view.settings = settings.clone();
                view.ui(ui, &history);
            },
            RenderSettings {
                show_grid: false,
                show_frustums: false,
                show_trajectory: false,
                ..RenderSettings::default()
            },
        );
    let mut images = Vec::new();
    for mode in ColourMode::ALL {
        harness.state_mut().colour_mode = mode;
        harness.run();
        images.push(harness.render().expect("render"));
    }
    for (i, a) in images.iter().enumerate() {
        for b in &images[i + 1..] {
            assert_ne!(
                a.as_raw(),
                b.as_raw(),
                "two colour modes drew the same picture"
            );
        }
    }
    // Above every point's confidence: only the background is left.
    harness.state_mut().colour_mode = ColourMode::Rgb;
    harness.state_mut().confidence_threshold = 1e6;
    harness.run();
    let empty = harness.render().expect("render");
    let background = *empty.get_pixel(120, 80);
    // Inside the 3D view (the harness's panel margin around it has egui's colour).
    let inside = || (20..220).flat_map(|x| (20..140).map(move |y| (x, y)));
    let survivors = inside()
        .filter(|&(x, y)| *empty.get_pixel(x, y) != background)
        .count();
    assert_eq!(survivors, 0, "points survived the threshold");
    // And the RGB picture did have points there.
    let drawn = inside()
        .filter(|&(x, y)| *images[0].get_pixel(x, y) != background)
        .count();
    assert!(drawn > 1000, "only {drawn} pixels of points");
}
