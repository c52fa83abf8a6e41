//! `bench viewer`: the window's 3D view rendered offscreen on a headless wgpu device, with the
//! window's own chunk store, shaders, camera and line overlays, at growing point counts.
//!
//! The store is filled once, in stages (e.g. 4 M, then 20 M, then 100 M points); at each stage
//! every asked-for path and budget renders the same orbit of the scene, timed per frame on the
//! GPU (timestamp queries where the adapter has them, else submit-to-completion wall time), and
//! the compute paths' first picture is compared with the sprites'. Appending is timed per frame
//! of points as they arrive. Speeds are reported, never judged.

mod source;
mod timer;

use std::time::Instant;

use eframe::egui_wgpu::wgpu;
use serde::Serialize;

use source::Frames;
pub use source::PointSource;
use timer::FrameTimer;

use crate::viewer::camera::OrbitCamera;
use crate::viewer::chunks::{ChunkBook, DEFAULT_CHUNK_POINTS};
use crate::viewer::gpu::{HeadlessError, HeadlessGpu};
use crate::viewer::history::StreamHistory;
use crate::viewer::panels::RenderSettings;
use crate::viewer::picture::{self, PictureDiff};
use crate::viewer::point_format::POINT_BYTES;
use crate::viewer::raster::RenderPath;
use crate::viewer::render::SceneRenderer;
use crate::viewer::scene;

/// The offscreen target's format (what the bench reads back; the window uses egui's).
pub const TARGET_FORMAT: wgpu::TextureFormat = wgpu::TextureFormat::Rgba8Unorm;
/// The 3D view's clear colour in [`TARGET_FORMAT`] (render.rs `CLEAR`, rounded).
pub const BACKGROUND_RGBA: [u8; 4] = [9, 10, 14, 255];

/// A source that gives this many frames in a row without a point has none to give.
const MAX_EMPTY_FRAMES: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum ViewerBenchError {
    #[error("bench viewer needs a GPU adapter: {0}")]
    NoAdapter(#[from] HeadlessError),
    #[error("{}: {source}", path.display())]
    Session {
        path: std::path::PathBuf,
        #[source]
        source: crate::record::RecordError,
    },
    #[error("{0}")]
    Config(String),
    #[error("the {path} path is not available on {adapter} (it needs {needs})")]
    PathUnavailable {
        path: &'static str,
        adapter: String,
        needs: &'static str,
    },
    #[error("the GPU: {0}")]
    Gpu(String),
}

/// Which point budget a case draws with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// No level-of-detail stride: every stored point.
    EveryPoint,
    /// The window's default for the path (4 M sprites; every point on the compute paths).
    Default,
}

/// A path as asked for on the command line: `auto` is what the window would take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathChoice {
    Auto,
    Path(RenderPath),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ViewerBenchConfig {
    pub width: u32,
    pub height: u32,
    /// Stages: point counts at which every case is rendered, ascending.
    pub points: Vec<u64>,
    pub source: PointSource,
    /// Camera positions on the orbit, each rendered and timed once per case.
    pub frames: usize,
    /// Untimed frames before each case.
    pub warmup: usize,
    pub paths: Vec<PathChoice>,
    pub budgets: Vec<Budget>,
    pub point_size_px: f32,
    /// Compare each compute path's first picture with the sprites' at every stage.
    pub compare: bool,
    /// Points per chunk of the store.
    pub chunk_points: u32,
    /// Write each case's first picture here as PNG (`POINTS-PATH-BUDGET.png`).
    pub save_pictures: Option<std::path::PathBuf>,
}

impl Default for ViewerBenchConfig {
    fn default() -> Self {
        Self {
            width: 1920,
            height: 1080,
            points: vec![4_000_000],
            source: PointSource::SyntheticRoom {
                width: 640,
                height: 480,
            },
            frames: 120,
            warmup: 5,
            paths: vec![PathChoice::Auto],
            budgets: vec![Budget::Default],
            point_size_px: RenderSettings::default().point_size_px,
            compare: true,
            chunk_points: DEFAULT_CHUNK_POINTS,
            save_pictures: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ViewerBenchReport {
    pub adapter: String,
    pub backend: String,
    pub device_type: String,
    pub has_timestamp_query: bool,
    pub has_int64_atomic_min_max: bool,
    pub max_buffer_size: u64,
    pub max_storage_buffer_binding_size: u64,
    /// `timestamp_query` or `submit_to_completion_wall`.
    pub timing: &'static str,
    /// What `auto` chose (the window's path on this adapter).
    pub auto_path: RenderPath,
    pub width: u32,
    pub height: u32,
    pub source: String,
    pub point_bytes: u64,
    pub chunk_points: u32,
    pub append: AppendReport,
    pub cases: Vec<CaseReport>,
    pub agreement: Vec<AgreementReport>,
}

/// Appending arriving frames' points to the store (convert, reserve chunks, write, wait).
#[derive(Debug, Clone, Serialize, Default)]
pub struct AppendReport {
    pub frames: usize,
    pub points: u64,
    pub points_per_frame_median: u64,
    pub ms_median: f64,
    pub ms_p95: f64,
    /// Points the store refused (the GPU gave no more memory).
    pub refused_points: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    pub points_stored: u64,
    pub path: RenderPath,
    pub budget: Budget,
    pub stride: u32,
    pub points_drawn: u64,
    pub frames: usize,
    pub gpu_ms_median: f64,
    pub gpu_ms_p95: f64,
    pub gpu_ms_min: f64,
    pub gpu_ms_max: f64,
    /// Submit to completion, per frame (includes the read of the timestamps).
    pub wall_ms_median: f64,
    /// 1000 / gpu_ms_median.
    pub fps_gpu: f64,
    /// Bytes of point chunks on the GPU.
    pub point_memory_bytes: u64,
    /// Bytes of the compute path's visibility buffers at this size (0 for sprites).
    pub raster_target_bytes: u64,
    /// Pixels showing a point in the first frame.
    pub covered_pixels: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AgreementReport {
    pub points_stored: u64,
    pub path: RenderPath,
    pub budget: Budget,
    pub against: RenderPath,
    pub diff: PictureDiff,
    pub differing_fraction: f64,
    pub within_tolerance: bool,
}

/// What the bench tells its caller as it goes.
#[derive(Debug)]
pub enum ViewerProgress<'a> {
    Opened { adapter: &'a str, timing: &'a str },
    Filled { points: u64, seconds: f64 },
    CaseDone(&'a CaseReport),
    Agreement(&'a AgreementReport),
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Runs the bench: opens a headless device, fills the store stage by stage, renders each case.
pub fn run_viewer_bench(
    cfg: &ViewerBenchConfig,
    mut progress: impl FnMut(ViewerProgress<'_>),
) -> Result<ViewerBenchReport, ViewerBenchError> {
    if cfg.width == 0 || cfg.height == 0 {
        return Err(ViewerBenchError::Config(format!(
            "--size {}x{} has no pixels",
            cfg.width, cfg.height
        )));
    }
    if cfg.points.is_empty() || cfg.points.windows(2).any(|w| w[0] > w[1]) {
        return Err(ViewerBenchError::Config(format!(
            "point counts must be given in ascending order, got {:?}",
            cfg.points
        )));
    }
    if cfg.frames == 0 {
        return Err(ViewerBenchError::Config(
            "--frames must be at least 1".into(),
        ));
    }
    let gpu = HeadlessGpu::open()?;
    let adapter_name = gpu.adapter_name();
    let info = gpu.adapter.get_info();
    let downlevel = gpu.adapter.get_downlevel_capabilities().flags;
    let features = gpu.device.features();
    let limits = gpu.device.limits();
    let max_dim = limits.max_texture_dimension_2d;
    if cfg.width > max_dim || cfg.height > max_dim {
        return Err(ViewerBenchError::Config(format!(
            "--size {}x{} is larger than this adapter's {max_dim}-pixel textures",
            cfg.width, cfg.height
        )));
    }
    let auto_path = RenderPath::auto(features, downlevel);
    let mut paths: Vec<RenderPath> = Vec::new();
    for choice in &cfg.paths {
        let path = match *choice {
            PathChoice::Auto => auto_path,
            PathChoice::Path(p) => p,
        };
        if !path.supported(features, downlevel) {
            return Err(ViewerBenchError::PathUnavailable {
                path: path.name(),
                adapter: adapter_name.clone(),
                needs: match path {
                    RenderPath::Compute => "SHADER_INT64_ATOMIC_MIN_MAX and compute shaders",
                    _ => "compute shaders",
                },
            });
        }
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    // Sprites first: the compute paths' pictures are compared with theirs.
    paths.sort_by_key(|p| RenderPath::ALL.iter().position(|q| q == p));
    let mut timer = FrameTimer::new(&gpu.device, &gpu.queue);
    progress(ViewerProgress::Opened {
        adapter: &adapter_name,
        timing: timer.method(),
    });

    let mut renderer = SceneRenderer::new(&gpu.device, TARGET_FORMAT, cfg.chunk_points, downlevel);
    let mut book = ChunkBook::new(cfg.chunk_points, u64::MAX);
    let mut history = StreamHistory::default();
    let mut frames = Frames::open(&cfg.source)?;
    let mut staging: Vec<u8> = Vec::new();
    let mut append_ms = Vec::new();
    let mut append_points = Vec::new();
    let base_settings = RenderSettings {
        point_size_px: cfg.point_size_px,
        ..RenderSettings::default()
    };
    let mut report = ViewerBenchReport {
        adapter: adapter_name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        has_timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        has_int64_atomic_min_max: features.contains(wgpu::Features::SHADER_INT64_ATOMIC_MIN_MAX),
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        timing: timer.method(),
        auto_path,
        width: cfg.width,
        height: cfg.height,
        source: cfg.source.describe(),
        point_bytes: POINT_BYTES,
        chunk_points: cfg.chunk_points,
        append: AppendReport::default(),
        cases: Vec::new(),
        agreement: Vec::new(),
    };

    for &target in &cfg.points {
        let fill_start = Instant::now();
        // Fill to the stage's count: whole frames, the last one cut to size.
        let mut empty_in_a_row = 0;
        while book.total_points() < target && book.refused_points() == 0 {
            let mut result = frames.next_result()?;
            if scene::point_count(&result) == 0 {
                empty_in_a_row += 1;
                if empty_in_a_row > MAX_EMPTY_FRAMES {
                    return Err(ViewerBenchError::Config(format!(
                        "{} gave {MAX_EMPTY_FRAMES} frames in a row without points",
                        cfg.source.describe()
                    )));
                }
                continue;
            }
            empty_in_a_row = 0;
            let room = (target - book.total_points()) as usize;
            truncate_points(&mut result, room);
            history.ingest(&result);
            let t = Instant::now();
            let n = scene::point_count(&result);
            scene::append_result(
                &mut renderer,
                &mut book,
                &gpu.device,
                &gpu.queue,
                &result,
                &mut staging,
            );
            gpu.queue.submit([]);
            gpu.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| ViewerBenchError::Gpu(e.to_string()))?;
            append_ms.push(t.elapsed().as_secs_f64() * 1e3);
            append_points.push(n as u64);
        }
        progress(ViewerProgress::Filled {
            points: book.total_points(),
            seconds: fill_start.elapsed().as_secs_f64(),
        });
        let lines = scene::scene_lines(&base_settings, &history);
        renderer.upload_lines(&gpu.device, &gpu.queue, &lines.vertices);
        let (centre, radius) = history
            .bounds
            .map_or((glam::Vec3::new(0.0, 0.0, 1.0), 1.0), |b| {
                (b.centre(), b.radius())
            });

        for &budget in &cfg.budgets {
            let mut sprites_picture: Option<(picture::Picture, u32)> = None;
            for &path in &paths {
                let mut settings = base_settings.clone();
                if budget == Budget::EveryPoint {
                    settings.point_budget = u64::MAX;
                    settings.compute_point_budget = None;
                }
                let mut gpu_ms = Vec::with_capacity(cfg.frames);
                let mut wall_ms = Vec::with_capacity(cfg.frames);
                let mut first_picture = None;
                let mut drawn = 0;
                let mut stride = 1;
                for i in 0..cfg.warmup + cfg.frames {
                    let k = i.saturating_sub(cfg.warmup);
                    let mut camera = OrbitCamera::reset_view(centre, radius);
                    camera.yaw = std::f32::consts::TAU * k as f32 / cfg.frames as f32;
                    let frame = scene::scene_frame(
                        &camera,
                        &settings,
                        &book,
                        &history,
                        [cfg.width, cfg.height],
                        path,
                    );
                    if renderer.drawn_path(&frame) != path {
                        return Err(ViewerBenchError::PathUnavailable {
                            path: path.name(),
                            adapter: adapter_name.clone(),
                            needs: if renderer.supports(path) {
                                "a visibility buffer (8 bytes a pixel) within one storage binding"
                            } else {
                                "its compute pipelines, which this driver could not build"
                            },
                        });
                    }
                    stride = frame.uniforms.stride;
                    drawn = frame.draws.iter().map(|&(_, n)| u64::from(n)).sum();
                    let timing = timer
                        .time(&gpu.device, &gpu.queue, |encoder, queries| {
                            renderer.encode_scene(&gpu.device, &gpu.queue, encoder, &frame, queries)
                        })
                        .map_err(ViewerBenchError::Gpu)?;
                    if i >= cfg.warmup {
                        gpu_ms.push(timing.gpu_ms);
                        wall_ms.push(timing.wall_ms);
                        if k == 0 {
                            let texture = renderer.colour_texture().ok_or_else(|| {
                                ViewerBenchError::Gpu("nothing was rendered".into())
                            })?;
                            first_picture = Some(
                                picture::read_texture(&gpu.device, &gpu.queue, texture)
                                    .map_err(ViewerBenchError::Gpu)?,
                            );
                        }
                    }
                }
                let gpu_sorted = sorted(gpu_ms);
                let wall_sorted = sorted(wall_ms);
                if let (Some(dir), Some(p)) = (&cfg.save_pictures, &first_picture) {
                    let file = dir.join(format!(
                        "{}-{}-{}.png",
                        book.total_points(),
                        path.name(),
                        match budget {
                            Budget::EveryPoint => "every",
                            Budget::Default => "default",
                        }
                    ));
                    image::save_buffer(&file, &p.rgba, p.width, p.height, image::ColorType::Rgba8)
                        .map_err(|e| {
                            ViewerBenchError::Config(format!("{}: {e}", file.display()))
                        })?;
                }
                let covered = first_picture
                    .as_ref()
                    .map_or(0, |p| p.covered_pixels(BACKGROUND_RGBA));
                let case = CaseReport {
                    points_stored: book.total_points(),
                    path,
                    budget,
                    stride,
                    points_drawn: drawn,
                    frames: cfg.frames,
                    gpu_ms_median: percentile(&gpu_sorted, 0.5),
                    gpu_ms_p95: percentile(&gpu_sorted, 0.95),
                    gpu_ms_min: gpu_sorted.first().copied().unwrap_or(f64::NAN),
                    gpu_ms_max: gpu_sorted.last().copied().unwrap_or(f64::NAN),
                    wall_ms_median: percentile(&wall_sorted, 0.5),
                    fps_gpu: 1e3 / percentile(&gpu_sorted, 0.5),
                    point_memory_bytes: renderer.point_bytes(),
                    raster_target_bytes: if path.is_compute() {
                        renderer.raster_target_bytes()
                    } else {
                        0
                    },
                    covered_pixels: covered,
                };
                progress(ViewerProgress::CaseDone(&case));
                report.cases.push(case);
                if cfg.compare {
                    match (path, &sprites_picture, first_picture) {
                        (RenderPath::Sprites, _, Some(p)) => sprites_picture = Some((p, stride)),
                        // Only the same points drawn are comparable (a budget may differ).
                        (_, Some((reference, sprite_stride)), Some(p))
                            if *sprite_stride == stride =>
                        {
                            if let Some(diff) = p.diff(reference, BACKGROUND_RGBA) {
                                let agreement = AgreementReport {
                                    points_stored: book.total_points(),
                                    path,
                                    budget,
                                    against: RenderPath::Sprites,
                                    differing_fraction: diff.differing_fraction(),
                                    within_tolerance: diff.within_tolerance(),
                                    diff,
                                };
                                progress(ViewerProgress::Agreement(&agreement));
                                report.agreement.push(agreement);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    let points_sorted = {
        let mut p = append_points.clone();
        p.sort_unstable();
        p
    };
    let append_sorted = sorted(append_ms);
    report.append = AppendReport {
        frames: append_sorted.len(),
        points: book.total_points(),
        points_per_frame_median: points_sorted
            .get(points_sorted.len() / 2)
            .copied()
            .unwrap_or(0),
        ms_median: percentile(&append_sorted, 0.5),
        ms_p95: percentile(&append_sorted, 0.95),
        refused_points: book.refused_points(),
    };
    Ok(report)
}

/// Keeps at most `n` of the result's points.
fn truncate_points(result: &mut crate::frame::FrameResult, n: usize) {
    let p = &mut result.points;
    p.xyz.truncate(n);
    p.rgb.truncate(n);
    p.confidence.truncate(n);
}
