//! CPU speed of the whole model with random weights, and of its largest linear layer. A bench,
//! not a test: it times and prints, asserting nothing. Run with `cargo bench --bench model_speed`;
//! environment knobs: `SPEED_PRESET` (`tiny`, `full` or `both`, default `tiny`: the full model
//! takes minutes per frame on a small machine), `SPEED_FRAMES` (streaming frames after phase 1,
//! default 2), `SPEED_SCALE` (scale frames, default 2), `SPEED_W`/`SPEED_H` (default 518×378).
//! Peak memory: wrap the command in `/usr/bin/time -v`.

use std::time::Instant;

use streamrecon::attention::AttentionLayout;
use streamrecon::model::weights::random::random_store;
use streamrecon::model::{GctModel, ModelConfig};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn time_preset(name: &str, mut cfg: ModelConfig) {
    let (w, h) = (env_usize("SPEED_W", 518), env_usize("SPEED_H", 378));
    let scale = env_usize("SPEED_SCALE", 2);
    let frames = env_usize("SPEED_FRAMES", 2);
    cfg.scale_frames = scale;
    let t0 = Instant::now();
    let model = GctModel::from_store(cfg.clone(), random_store(&cfg, 42).expect("random weights"))
        .expect("model builds");
    let build = t0.elapsed();
    let mut stream = model
        .new_stream(h, w, AttentionLayout::Paged)
        .expect("stream");
    // Smooth synthetic images in [0, 1].
    let image = |f: usize| -> Vec<f32> {
        (0..3 * h * w)
            .map(|i| 0.5 + 0.4 * ((i % w) as f32 * 0.05 + (i / w) as f32 * 0.03 + f as f32).sin())
            .collect()
    };
    let phase1: Vec<f32> = (0..scale).flat_map(image).collect();
    let t = Instant::now();
    model
        .step(&mut stream, &phase1, 0..scale as u64, true, None)
        .expect("phase 1");
    let p1 = t.elapsed();
    let mut per_frame = Vec::new();
    let mut last = None;
    for i in 0..frames {
        let f = (scale + i) as u64;
        let t = Instant::now();
        let out = model
            .step(&mut stream, &image(scale + i), f..f + 1, true, None)
            .expect("phase 2");
        last = Some(out.timings);
        per_frame.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mean = per_frame.iter().sum::<f64>() / per_frame.len().max(1) as f64;
    println!(
        "speed {name}: {w}x{h}, {} threads, weights {:.1}s, phase 1 ({scale} frames) {:.0} ms ({:.0} ms/frame), \
         streaming frames {per_frame:.0?} ms, mean {mean:.0} ms/frame",
        rayon::current_num_threads(),
        build.as_secs_f64(),
        p1.as_secs_f64() * 1e3,
        p1.as_secs_f64() * 1e3 / scale as f64,
    );
    if let Some(t) = last {
        println!("  last frame by stage (ms): {t:.0?}");
    }
}

fn main() {
    cpu_speed();
    linear_throughput();
}

fn cpu_speed() {
    let preset = std::env::var("SPEED_PRESET").unwrap_or_else(|_| "tiny".into());
    if preset == "tiny" || preset == "both" {
        time_preset("tiny", ModelConfig::tiny());
    }
    if preset == "full" || preset == "both" {
        time_preset("full", ModelConfig::default());
    }
}

fn linear_throughput() {
    use streamrecon::model::ops::linear::Linear;
    let (rows, k, n) = (1005, 1024, 4096);
    let lin = Linear {
        weight: (0..n * k)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
            .collect(),
        bias: Some(vec![0.0; n]),
        in_features: k,
        out_features: n,
    };
    let x: Vec<f32> = (0..rows * k)
        .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
        .collect();
    // One call first, so the timed ones find the thread pool started and the pages touched.
    std::hint::black_box(lin.forward(&x, rows));
    let t = Instant::now();
    let reps = 10;
    for _ in 0..reps {
        std::hint::black_box(lin.forward(&x, rows));
    }
    let secs = t.elapsed().as_secs_f64() / reps as f64;
    let gflops = 2.0 * (rows * k * n) as f64 / secs / 1e9;
    println!(
        "linear {rows}x{k} -> {n}: {:.1} ms, {gflops:.0} GFLOP/s on {} threads",
        secs * 1e3,
        rayon::current_num_threads()
    );
}
