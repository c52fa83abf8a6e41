//! Helpers shared by the integration tests. Each test file is a crate of its own and takes this
//! in with `mod common;`.

// Each test crate uses only some of these helpers; the rest would be reported as unused there.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use cudarc::driver::CudaSlice;
use half::bf16;
use streamrecon::backend::cuda::CudaDevice;

/// Says why a GPU test does not run here (no GPU, no driver, CUDA unusable), so it skips
/// visibly on machines without one, as CI is. A machine that has a GPU and must run every GPU
/// test (scripts/gpu/run.sh on the GPU machine) sets `STREAMRECON_REQUIRE_GPU`: there the test
/// fails instead, so a broken driver or library cannot pass for a green run.
pub fn skip_without_gpu(why: impl std::fmt::Display) {
    assert!(
        std::env::var_os("STREAMRECON_REQUIRE_GPU").is_none(),
        "STREAMRECON_REQUIRE_GPU is set, but the GPU is unusable: {why}"
    );
    eprintln!("skipped: {why}");
}

/// The first GPU, or `None` with the reason printed ([`skip_without_gpu`]).
pub fn gpu_device() -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            skip_without_gpu(e);
            None
        }
    }
}

/// A bf16 device buffer copied back as f32, to compare against a host reference.
pub fn bf16_to_host_f32(dev: &CudaDevice, buf: &CudaSlice<bf16>) -> Vec<f32> {
    dev.stream
        .clone_dtoh(buf)
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect()
}

/// The gct-tiny parity fixtures, when `marker` (a file inside them) is present.
///
/// `STREAMRECON_FIXTURES` points elsewhere (the GPU machine gets them carried beside the binary).
/// A machine that must have them (CI) sets `STREAMRECON_REQUIRE_FIXTURES`: a missing fixture
/// there fails the test instead of skipping it silently.
pub fn gct_tiny_fixtures(marker: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("STREAMRECON_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../shared/fixtures/gct-tiny"
            ))
        });
    let wanted = dir.join(marker);
    if wanted.exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("STREAMRECON_REQUIRE_FIXTURES").is_none(),
        "fixtures required but missing: {}",
        wanted.display()
    );
    eprintln!("skipping: fixture {} not found", wanted.display());
    None
}

/// The `streamrecon` binary run from the project root with `args`.
pub fn streamrecon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// `run --headless` of `input` into `out` with the gct-tiny model (kf1 config), plus `extra`.
pub fn tiny_run(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--headless",
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--weights",
        "../shared/fixtures/gct-tiny/weights.safetensors",
        "--model-config",
        "../shared/fixtures/gct-tiny/kf1/config.json",
    ];
    args.extend_from_slice(extra);
    streamrecon(&args)
}

/// A process's output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits for `child` to exit; past `limit` it is killed and the test fails naming `what`: a hang
/// is a failure, not a stuck CI job.
pub fn wait_or_kill(child: &mut Child, limit: Duration, what: &str) {
    let start = Instant::now();
    while child.try_wait().expect("waiting for the child").is_none() {
        if start.elapsed() > limit {
            // Killing a child that has just exited fails harmlessly; the test fails here.
            child.kill().ok();
            panic!("{what} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
