//! The capture side of a frame, per frame and in throughput: what the capture thread did for the
//! GPU before the product-path work (decode + the CPU bicubic preprocessing, one frame at a time)
//! against what it does now (decode on a pool, the size check only: the resize runs on the GPU),
//! on 1280×720 JPEGs (a webcam's size) made here from the synthetic room; and the synthetic room
//! rendered on one thread against the pool; and a 720p H.264 video of the room on its decode
//! thread. A bench: it times and prints, asserting nothing.
//! Run with `cargo bench --bench capture_path`.

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use image::ImageEncoder;
use streamrecon::capture::decode_pool::default_workers;
use streamrecon::capture::folder::decode_rgb8;
use streamrecon::capture::{
    CorruptFilePolicy, ImageFolder, Source, SyntheticScene, SyntheticSource, VideoCut, VideoFile,
    write_video,
};
use streamrecon::model::preprocess::{PreprocessConfig, preprocess_rgb8, target_size};

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 720;
const FILES: u64 = 24;

fn webcam_scene(frames: u64) -> SyntheticScene {
    SyntheticScene {
        width: WIDTH,
        height: HEIGHT,
        frames: Some(frames),
        ..SyntheticScene::default()
    }
}

/// `FILES` 720p JPEGs of the room in `dir`.
fn write_jpegs(dir: &Path) {
    let scene = webcam_scene(FILES);
    for i in 0..FILES {
        let view = scene.render(i);
        let mut bytes = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90)
            .write_image(
                &view.image.data,
                WIDTH,
                HEIGHT,
                image::ExtendedColorType::Rgb8,
            )
            .expect("encode");
        std::fs::write(dir.join(format!("{i:06}.jpg")), bytes).expect("write");
    }
}

fn per_frame(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_jpegs(dir.path());
    let file = dir.path().join("000003.jpg");
    let cfg = PreprocessConfig::default();
    let mut g = c.benchmark_group("capture thread, one 1280x720 JPEG");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    g.bench_function("before: decode + CPU preprocess", |b| {
        b.iter(|| {
            let img = decode_rgb8(&file).expect("decodes");
            preprocess_rgb8(&img.data, WIDTH as usize, HEIGHT as usize, &cfg).expect("preprocess")
        })
    });
    g.bench_function("now (GPU backend): decode + size check", |b| {
        b.iter(|| {
            let img = decode_rgb8(&file).expect("decodes");
            target_size(img.width as usize, img.height as usize, &cfg).expect("size")
        })
    });
    g.finish();
}

/// Frames per second a source delivers, read to its end.
fn drain(mut source: Box<dyn Source>) -> f64 {
    let clock = Instant::now();
    let mut n = 0u64;
    while source.next_frame().expect("frame").is_some() {
        n += 1;
    }
    n as f64 / clock.elapsed().as_secs_f64()
}

fn throughput(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_jpegs(dir.path());
    // One thread against the default pool (the same on a machine with few cores: once).
    let mut counts = vec![1, default_workers()];
    counts.dedup();
    let mut g = c.benchmark_group("sources, frames delivered");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(6))
        .throughput(Throughput::Elements(FILES));
    for &w in &counts {
        g.bench_function(format!("folder of 720p JPEGs, {w} decode threads"), |b| {
            b.iter(|| {
                drain(Box::new(
                    ImageFolder::open(dir.path(), CorruptFilePolicy::Skip)
                        .expect("folder")
                        .with_workers(w),
                ))
            })
        });
    }
    let video = dir.path().join("room-720p.mp4");
    let scene = webcam_scene(FILES);
    write_video(&video, 30, (0..FILES).map(|i| scene.render(i).image)).expect("video");
    g.bench_function("H.264 video 1280x720, its decode thread", |b| {
        b.iter(|| {
            drain(Box::new(
                VideoFile::open(&video, VideoCut::default()).expect("video"),
            ))
        })
    });
    for &w in &counts {
        g.bench_function(format!("synthetic room 640x480, {w} render threads"), |b| {
            b.iter(|| {
                drain(Box::new(
                    SyntheticSource::new(SyntheticScene {
                        frames: Some(FILES),
                        ..SyntheticScene::default()
                    })
                    .with_workers(w),
                ))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, per_frame, throughput);
criterion_main!(benches);
