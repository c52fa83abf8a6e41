//! Every kernel in `kernels/*.cu` must compile with NVRTC (compile only: no GPU needed), so a
//! kernel that does not compile cannot land. Needs libnvrtc.so.13 on LD_LIBRARY_PATH (CI: eval
//! "$(tools/cuda-toolchain)"); without it the test prints why and skips.

use streamrecon::backend::cuda::{nvrtc, registry};

/// Architectures the kernels must build for: Hopper (the target) and Ampere (the mma.sync path
/// for other NVIDIA GPUs), plus `CUDA_COMPUTE_CAP` when set.
fn arches() -> Vec<u32> {
    let mut a = vec![80, 90];
    if let Some(cap) = std::env::var("CUDA_COMPUTE_CAP")
        .ok()
        .and_then(|v| v.parse().ok())
        && !a.contains(&cap)
    {
        a.push(cap);
    }
    a
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    if let Err(why) = nvrtc::available() {
        if std::env::var_os("STREAMRECON_REQUIRE_NVRTC").is_some() {
            panic!("STREAMRECON_REQUIRE_NVRTC is set but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let (major, minor) = nvrtc::version().expect("nvrtc version");
    for src in registry::SOURCES {
        for arch in arches() {
            // Hopper-only sources (wgmma) are built for sm_90a alone.
            let Some(target) = src.target(arch) else {
                continue;
            };
            let cubin = nvrtc::compile_cubin(src.name, src.source, &target)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(!cubin.is_empty(), "{}: empty CUBIN for {target}", src.name);
            // Every registered entry point is in the image (names are stored verbatim in ELF).
            for f in src.entry_points() {
                assert!(
                    cubin.windows(f.len()).any(|w| w == f.as_bytes()),
                    "{}: entry point {f} missing for {target}",
                    src.name
                );
            }
            eprintln!(
                "nvrtc {major}.{minor}: {}.cu -> {target}, {} bytes",
                src.name,
                cubin.len()
            );
        }
    }
}
