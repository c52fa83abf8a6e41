//! The compute rasteriser against the sprites, and the point store's growth and reset, on a
//! real wgpu device (in CI Mesa's lavapipe, a CPU Vulkan driver that has 64-bit atomics). Where
//! no adapter exists the tests print why and pass. Sizes are small: lavapipe is slow.

use streamrecon::viewer::camera::OrbitCamera;
use streamrecon::viewer::chunks::ChunkBook;
use streamrecon::viewer::demo::{DemoConfig, DemoStream};
use streamrecon::viewer::gpu::HeadlessGpu;
use streamrecon::viewer::history::StreamHistory;
use streamrecon::viewer::panels::{ColourMode, RenderSettings};
use streamrecon::viewer::picture::{self, Picture};
use streamrecon::viewer::point_format::POINT_BYTES;
use streamrecon::viewer::raster::RenderPath;
use streamrecon::viewer::render::SceneRenderer;
use streamrecon::viewer::scene;

use streamrecon::bench::viewer::{BACKGROUND_RGBA, TARGET_FORMAT};

const SIZE: [u32; 2] = [320, 180];

fn gpu_or_skip(test: &str) -> Option<HeadlessGpu> {
    match HeadlessGpu::open() {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            println!("skipping {test}: {e}");
            None
        }
    }
}

/// A store holding `frames` demo frames, with the history the window would have.
struct Scene {
    renderer: SceneRenderer,
    book: ChunkBook,
    history: StreamHistory,
}

fn scene_with(gpu: &HeadlessGpu, chunk_points: u32, frames: usize) -> Scene {
    let downlevel = gpu.adapter.get_downlevel_capabilities().flags;
    let mut s = Scene {
        renderer: SceneRenderer::new(&gpu.device, TARGET_FORMAT, chunk_points, downlevel),
        book: ChunkBook::new(chunk_points, u64::MAX),
        history: StreamHistory::default(),
    };
    let mut stream = DemoStream::new(DemoConfig::default());
    let mut staging = Vec::new();
    for _ in 0..frames {
        let r = stream.next_result();
        s.history.ingest(&r);
        scene::append_result(
            &mut s.renderer,
            &mut s.book,
            &gpu.device,
            &gpu.queue,
            &r,
            &mut staging,
        );
    }
    s
}

fn render(
    gpu: &HeadlessGpu,
    s: &mut Scene,
    settings: &RenderSettings,
    path: RenderPath,
) -> Picture {
    let (centre, radius) = s
        .history
        .bounds
        .map(|b| (b.centre(), b.radius()))
        .expect("frames arrived");
    let mut camera = OrbitCamera::reset_view(centre, radius);
    camera.yaw = 0.7;
    let frame = scene::scene_frame(&camera, settings, &s.book, &s.history, SIZE, path);
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    s.renderer
        .encode_scene(&gpu.device, &gpu.queue, &mut encoder, &frame, None);
    gpu.queue.submit([encoder.finish()]);
    let texture = s.renderer.colour_texture().expect("rendered");
    picture::read_texture(&gpu.device, &gpu.queue, texture).expect("read back")
}

fn compute_paths(s: &Scene) -> Vec<RenderPath> {
    [RenderPath::Compute, RenderPath::Compute32]
        .into_iter()
        .filter(|&p| s.renderer.supports(p))
        .collect()
}

/// Within the documented tolerance; in colours where neighbours on a surface look alike
/// (RGB, depth) also within 1 % (ties between equal depths show there only at colour edges).
fn check_agreement(label: &str, picture: &Picture, sprites: &Picture, alike_neighbours: bool) {
    let diff = picture.diff(sprites, BACKGROUND_RGBA).expect("same size");
    println!(
        "{label}: {:.3} % of {} covered pixels differ in colour, {:.3} % in coverage",
        diff.differing_fraction() * 100.0,
        diff.covered,
        diff.coverage_differing_fraction() * 100.0
    );
    assert!(
        diff.covered > 500,
        "{label}: only {} pixels show points",
        diff.covered
    );
    assert!(diff.within_tolerance(), "{label}: {diff:?}");
    if alike_neighbours {
        assert!(diff.differing_fraction() <= 0.01, "{label}: {diff:?}");
    }
}

#[test]
fn compute_paths_draw_what_the_sprites_draw() {
    let Some(gpu) = gpu_or_skip("the compute/sprites comparison") else {
        return;
    };
    // 30 frames of the demo room: about 200 k points in several chunks.
    let mut s = scene_with(&gpu, 1 << 16, 30);
    assert!(s.book.chunk_count() > 1);
    let paths = compute_paths(&s);
    if paths.is_empty() {
        println!("skipping the comparison: this adapter runs no compute shaders");
        return;
    }
    println!("adapter {}, compute paths {paths:?}", gpu.adapter_name());
    let mut cases: Vec<(String, RenderSettings)> = Vec::new();
    for mode in ColourMode::ALL {
        cases.push((
            format!("{} at 2 px", mode.label()),
            RenderSettings {
                colour_mode: mode,
                ..RenderSettings::default()
            },
        ));
    }
    for size in [1.0, 5.0] {
        cases.push((
            format!("RGB at {size} px"),
            RenderSettings {
                point_size_px: size,
                ..RenderSettings::default()
            },
        ));
    }
    // A stride (budget) and a confidence threshold that drops part of the cloud.
    cases.push((
        "budget of 50 k".into(),
        RenderSettings {
            point_budget: 50_000,
            compute_point_budget: Some(50_000),
            ..RenderSettings::default()
        },
    ));
    let threshold = RenderSettings {
        confidence_threshold: 5.0,
        ..RenderSettings::default()
    };
    cases.push(("confidence above 5".into(), threshold.clone()));
    for (label, settings) in &cases {
        let sprites = render(&gpu, &mut s, settings, RenderPath::Sprites);
        for &path in &paths {
            let picture = render(&gpu, &mut s, settings, path);
            let alike = matches!(settings.colour_mode, ColourMode::Rgb | ColourMode::Depth);
            check_agreement(
                &format!("{} / {label}", path.name()),
                &picture,
                &sprites,
                alike,
            );
        }
    }
    // The threshold really drops points on the compute path, as on the sprites.
    let all = render(&gpu, &mut s, &RenderSettings::default(), paths[0]);
    let fewer = render(&gpu, &mut s, &threshold, paths[0]);
    assert!(
        fewer.covered_pixels(BACKGROUND_RGBA) < all.covered_pixels(BACKGROUND_RGBA) * 9 / 10,
        "the threshold left the picture as it was"
    );
    // And the colour modes change the compute path's picture.
    let depth = render(
        &gpu,
        &mut s,
        &RenderSettings {
            colour_mode: ColourMode::Depth,
            ..RenderSettings::default()
        },
        paths[0],
    );
    let d = depth.diff(&all, BACKGROUND_RGBA).expect("same size");
    assert!(
        d.differing_fraction() > 0.05,
        "depth colours look like RGB: {d:?}"
    );
}

#[test]
fn the_store_grows_by_chunks_until_its_budget_then_counts_the_rest() {
    let Some(gpu) = gpu_or_skip("the point store's growth") else {
        return;
    };
    let chunk = 4096u32;
    let downlevel = gpu.adapter.get_downlevel_capabilities().flags;
    let mut store = SceneRenderer::new(&gpu.device, TARGET_FORMAT, chunk, downlevel);
    let chunk_bytes = u64::from(chunk) * POINT_BYTES;
    store.set_max_point_bytes(Some(3 * chunk_bytes));
    let mut book = ChunkBook::new(chunk, u64::MAX);
    // Nothing is allocated before points arrive.
    assert_eq!(store.chunk_count(), 0);
    assert_eq!(store.point_bytes(), 0);
    let mut stream = DemoStream::new(DemoConfig::default());
    let mut staging = Vec::new();
    let r = stream.next_result();
    let n = scene::point_count(&r) as u64;
    assert!(
        n > u64::from(chunk),
        "a demo frame spans chunks ({n} points)"
    );
    let stored = scene::append_result(
        &mut store,
        &mut book,
        &gpu.device,
        &gpu.queue,
        &r,
        &mut staging,
    );
    assert_eq!(stored as u64, n);
    assert_eq!(store.chunk_count() as u64, n.div_ceil(u64::from(chunk)));
    assert_eq!(
        store.point_bytes(),
        store.chunk_count() as u64 * chunk_bytes
    );
    // More frames: the store stops at its three chunks and counts what it refused.
    let mut offered = n;
    for _ in 0..3 {
        let r = stream.next_result();
        offered += scene::point_count(&r) as u64;
        scene::append_result(
            &mut store,
            &mut book,
            &gpu.device,
            &gpu.queue,
            &r,
            &mut staging,
        );
    }
    assert_eq!(store.chunk_count(), 3);
    assert_eq!(book.total_points(), 3 * u64::from(chunk));
    assert_eq!(book.refused_points(), offered - 3 * u64::from(chunk));
}

#[test]
fn a_reset_reuses_the_chunks_and_shows_only_new_points() {
    let Some(gpu) = gpu_or_skip("the point store's reset") else {
        return;
    };
    let chunk = 1 << 14;
    // One store that saw 12 frames, then a reset, then 3 frames of a fresh stream...
    let mut reused = scene_with(&gpu, chunk, 12);
    let chunks_before = reused.renderer.chunk_count();
    reused.book.clear();
    reused.history.clear_scene();
    let mut stream = DemoStream::new(DemoConfig::default());
    let mut staging = Vec::new();
    for _ in 0..3 {
        let r = stream.next_result();
        reused.history.ingest(&r);
        scene::append_result(
            &mut reused.renderer,
            &mut reused.book,
            &gpu.device,
            &gpu.queue,
            &r,
            &mut staging,
        );
    }
    // ...creates no chunk and draws what a fresh store of those 3 frames draws.
    assert_eq!(reused.renderer.chunk_count(), chunks_before);
    let mut fresh = scene_with(&gpu, chunk, 3);
    assert_eq!(reused.book.total_points(), fresh.book.total_points());
    assert_eq!(reused.book.frames(), fresh.book.frames());
    // Frame-age colours read the frame table, which the reset rewrote.
    let settings = RenderSettings {
        colour_mode: ColourMode::FrameAge,
        ..RenderSettings::default()
    };
    let a = render(&gpu, &mut reused, &settings, RenderPath::Sprites);
    let b = render(&gpu, &mut fresh, &settings, RenderPath::Sprites);
    assert!(a == b, "old points still show after the reset");
    for path in compute_paths(&fresh) {
        let a = render(&gpu, &mut reused, &settings, path);
        let b = render(&gpu, &mut fresh, &settings, path);
        assert!(
            a == b,
            "{}: old points still show after the reset",
            path.name()
        );
    }
}

#[test]
fn a_chunk_the_device_cannot_make_stops_the_store_without_a_panic() {
    let Some(gpu) = gpu_or_skip("a refused chunk") else {
        return;
    };
    // Chunks larger than the device's largest buffer: the first is refused by validation.
    let too_many = u32::try_from(gpu.device.limits().max_buffer_size / 16 + 1).unwrap_or(u32::MAX);
    let downlevel = gpu.adapter.get_downlevel_capabilities().flags;
    let mut store = SceneRenderer::new(&gpu.device, TARGET_FORMAT, too_many, downlevel);
    let mut book = ChunkBook::new(too_many, u64::MAX);
    let mut stream = DemoStream::new(DemoConfig::default());
    let r = stream.next_result();
    let mut staging = Vec::new();
    let stored = scene::append_result(
        &mut store,
        &mut book,
        &gpu.device,
        &gpu.queue,
        &r,
        &mut staging,
    );
    assert_eq!(stored, 0);
    assert_eq!(store.chunk_count(), 0);
    assert_eq!(book.refused_points(), scene::point_count(&r) as u64);
    // And it stays stopped: later frames are counted, not retried chunk by chunk.
    let r = stream.next_result();
    scene::append_result(
        &mut store,
        &mut book,
        &gpu.device,
        &gpu.queue,
        &r,
        &mut staging,
    );
    assert_eq!(store.chunk_count(), 0);
}
