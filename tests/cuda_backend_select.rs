//! Backend selection never panics: without a GPU (CI) `Auto` falls back to the CPU with the reason
//! in words and `Cuda` is an error carrying it; with one, `Auto` picks CUDA.

use streamrecon::backend::load::{
    LoadError, ModelRequest, RandomPreset, Weights, load_frame_model,
};
use streamrecon::backend::{Backend, Preference, probe_cuda};

fn tiny(backend: Preference) -> ModelRequest {
    ModelRequest {
        weights: Weights::Random(RandomPreset::Tiny),
        config: None,
        backend,
        device: 0,
    }
}

#[test]
fn selection_follows_the_probe() {
    let cpu = load_frame_model(&tiny(Preference::Cpu)).expect("the CPU is always available");
    assert_eq!(cpu.backend, Backend::Cpu);
    assert!(cpu.cuda_unavailable.is_none());

    match probe_cuda() {
        Ok(info) => {
            eprintln!(
                "CUDA present: {} (sm_{}, {} SMs)",
                info.name, info.arch, info.sm_count
            );
            assert!(info.sm_count > 0);
            let auto = load_frame_model(&tiny(Preference::Auto)).expect("auto");
            assert_eq!(auto.backend, Backend::Cuda);
            assert!(auto.model.describe().starts_with("CUDA"));
            let cuda = load_frame_model(&tiny(Preference::Cuda)).expect("cuda");
            assert_eq!(cuda.backend, Backend::Cuda);
        }
        Err(reason) => {
            let reason = reason.to_string();
            eprintln!("no CUDA here: {reason}");
            assert!(!reason.is_empty());
            let auto = load_frame_model(&tiny(Preference::Auto)).expect("auto falls back");
            assert_eq!(auto.backend, Backend::Cpu);
            assert_eq!(auto.cuda_unavailable.as_deref(), Some(reason.as_str()));
            match load_frame_model(&tiny(Preference::Cuda)) {
                Err(LoadError::CudaUnavailable(why)) => assert_eq!(why, reason),
                Err(e) => panic!("--backend cuda without CUDA: unexpected error {e}"),
                Ok(_) => panic!("--backend cuda without CUDA must be an error"),
            }
        }
    }
}

#[test]
fn opening_a_device_without_cuda_is_an_error_not_a_panic() {
    if probe_cuda().is_ok() {
        eprintln!("skipped: this machine has CUDA");
        return;
    }
    let err = streamrecon::backend::cuda::CudaDevice::open(0)
        .err()
        .expect("no device without CUDA");
    eprintln!("{err}");
    assert!(err.to_string().contains("unavailable"));
}

/// The GPU-only commands say why they cannot run, fast, instead of building a model first; and
/// `--backend cuda` refuses plainly where `auto` would fall back.
#[test]
fn gpu_commands_without_a_gpu_say_why() {
    if probe_cuda().is_ok() {
        eprintln!("skipped: this machine has CUDA");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_streamrecon");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .output()
            .expect("streamrecon runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let clock = std::time::Instant::now();
    let (code, stderr) = run(&["bench", "e2e", "--frames", "2"]);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("needs a CUDA GPU"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Full-size random weights are never built for it.
    assert!(clock.elapsed().as_secs() < 20, "took {:?}", clock.elapsed());

    let dir = std::env::temp_dir().join(format!("streamrecon-nogpu-{}", std::process::id()));
    let (code, stderr) = run(&[
        "run",
        "--headless",
        "--backend",
        "cuda",
        "--random-weights",
        "tiny",
        "--input",
        "synthetic",
        "--synthetic-frames",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    // The run must have failed before writing anything; a leftover folder would only be litter.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("remove the test's session folder");
    }
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("--backend cuda"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
