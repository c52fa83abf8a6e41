//! Compiles `kernels/*.cu` to CUBIN with nvcc when nvcc is present, so the binary carries machine
//! code for one architecture (`CUDA_COMPUTE_CAP`, default 90). Without nvcc nothing is compiled and
//! the kernels are built at run time by NVRTC instead (src/backend/cuda/registry.rs); the build
//! stays fast and never fails because CUDA is missing.
//!
//! Output: `$OUT_DIR/prebuilt_kernels.rs`, a table `(name, arch, cubin bytes)` that the registry
//! includes, and `$OUT_DIR/spec.cuh`, the model's shared constants for the kernels
//! (`kernels/common.cuh` includes it; the NVRTC path renders the same text at run time).

use std::path::{Path, PathBuf};
use std::process::Command;

// The very file the crate compiles as `model::spec` (it imports nothing from the crate), so the
// kernels are built against the constants the Rust code uses. Only `cuda_header` is called here.
#[path = "src/model/spec.rs"]
#[allow(dead_code)]
mod spec;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=src/model/spec.rs");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=STREAMRECON_NVCC");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch: u32 = std::env::var("CUDA_COMPUTE_CAP")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(90);

    // Written whether or not nvcc is here: `spec.cuh` is cheap and keeps the build's output the
    // same either way.
    std::fs::write(out_dir.join("spec.cuh"), spec::cuda_header()).expect("write spec.cuh");

    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "cu"))
                .collect()
        })
        .unwrap_or_default();
    sources.sort();
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
    }

    let mut entries = Vec::new();
    match find_nvcc() {
        Some(nvcc) => {
            for src in &sources {
                let name = src.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
                // `*_sm90*.cu` use wgmma: Hopper only, built as sm_90a (the registry agrees).
                let target = match (name.contains("_sm90"), arch) {
                    (true, 90) => "90a".to_owned(),
                    (true, _) => continue,
                    (false, a) => a.to_string(),
                };
                let cubin = out_dir.join(format!("{name}.sm_{target}.cubin"));
                match compile(&nvcc, src, &cubin, &target, &out_dir) {
                    Ok(()) => entries.push((name.to_owned(), cubin)),
                    // A kernel that nvcc rejects must not land: fail the build loudly.
                    Err(msg) => panic!("nvcc failed on {}: {msg}", src.display()),
                }
            }
        }
        None => println!(
            "cargo:warning=nvcc not found (set CUDA_HOME or put nvcc on PATH): CUDA kernels will be compiled at run time by NVRTC"
        ),
    }

    let mut table = String::from(
        "/// Kernels compiled by build.rs with nvcc: (file stem, SM architecture, CUBIN).\n\
         pub const PREBUILT: &[(&str, u32, &[u8])] = &[\n",
    );
    for (name, path) in &entries {
        table.push_str(&format!(
            "    ({name:?}, {arch}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    table.push_str("];\n");
    std::fs::write(out_dir.join("prebuilt_kernels.rs"), table).expect("write prebuilt_kernels.rs");
}

/// nvcc from `STREAMRECON_NVCC`, `$CUDA_HOME/bin`, or PATH, in that order; None when absent.
fn find_nvcc() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("STREAMRECON_NVCC") {
        return Some(PathBuf::from(p));
    }
    if let Ok(home) = std::env::var("CUDA_HOME") {
        let p = Path::new(&home).join("bin/nvcc");
        if p.is_file() {
            return Some(p);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("nvcc"))
        .find(|p| p.is_file())
}

/// One kernel file to CUBIN; `include` holds the generated `spec.cuh` (`kernels/` the shared
/// `common.cuh`).
fn compile(
    nvcc: &Path,
    src: &Path,
    cubin: &Path,
    target: &str,
    include: &Path,
) -> Result<(), String> {
    let out = Command::new(nvcc)
        .arg("-cubin")
        .arg(format!("-gencode=arch=compute_{target},code=sm_{target}"))
        .args(["-O3", "-std=c++17", "-I", "kernels", "-I"])
        .arg(include)
        .arg("-o")
        .arg(cubin)
        .arg(src)
        .output()
        .map_err(|e| format!("could not run {}: {e}", nvcc.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}
