//! Run-time compilation of `kernels/*.cu` with NVRTC, straight to CUBIN for the GPU's
//! architecture, cached on disk keyed by a hash of (source, headers, architecture, options, NVRTC
//! version), so a kernel is compiled once per machine and not at every start.

use std::ffi::{CString, c_char, c_int};
use std::path::PathBuf;

use cudarc::nvrtc::{result, sys};

use super::CudaError;
use crate::model::spec;

/// The headers every kernel file may include, by the name it includes them with: the shared
/// helpers, the mma.sync helpers, the Hopper (wgmma, mbarrier) helpers, and the model's
/// constants rendered as build.rs renders them for nvcc.
fn headers() -> [(&'static str, String); 4] {
    [
        (
            "common.cuh",
            include_str!("../../../kernels/common.cuh").to_owned(),
        ),
        (
            "mma.cuh",
            include_str!("../../../kernels/mma.cuh").to_owned(),
        ),
        (
            "sm90.cuh",
            include_str!("../../../kernels/sm90.cuh").to_owned(),
        ),
        ("spec.cuh", spec::cuda_header()),
    ]
}

/// Options every kernel is compiled with (also part of the cache key).
const OPTIONS: &[&str] = &["-std=c++17", "-default-device"];

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn available() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NvrtcUnavailable("libnvrtc.so was not found: put CUDA's lib directory on LD_LIBRARY_PATH (e.g. eval \"$(tools/cuda-toolchain)\")".into()))
    }
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), CudaError> {
    available()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two out-pointers to live locals.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    rc.result()
        .map_err(|e| CudaError::NvrtcUnavailable(format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles `source` (file stem `name`) to a CUBIN for `target` (`sm_90a`, `sm_80`, ...); no cache.
pub fn compile_cubin(name: &str, source: &str, target: &str) -> Result<Vec<u8>, CudaError> {
    available()?;
    let fail = |log: String| CudaError::Compile {
        kernel: name.to_owned(),
        target: target.to_owned(),
        log,
    };
    let src = CString::new(source).map_err(|_| fail("source contains a NUL byte".into()))?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| fail("bad name".into()))?;
    let mut texts = Vec::new();
    let mut names = Vec::new();
    for (include, text) in headers() {
        texts.push(CString::new(text).map_err(|_| fail(format!("{include} contains a NUL byte")))?);
        names.push(CString::new(include).map_err(|_| fail("bad header name".into()))?);
    }
    let text_ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut prog = std::mem::MaybeUninit::<sys::nvrtcProgram>::uninit();
    // cudarc's result::create_program passes no headers, so the program is created here.
    // SAFETY: every pointer refers to a NUL-terminated string alive until after the call (NVRTC
    // copies them); the two arrays have the length passed; `prog` is written on success only.
    let rc = unsafe {
        sys::nvrtcCreateProgram(
            prog.as_mut_ptr(),
            src.as_ptr(),
            file.as_ptr(),
            text_ptrs.len() as c_int,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    };
    rc.result()
        .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: nvrtcCreateProgram succeeded, so it wrote the handle.
    let prog = unsafe { prog.assume_init() };
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={target}"));
    // SAFETY: `prog` is live until destroy_program below; the options outlive the call.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let outcome = match compiled {
        Ok(()) => cubin_of(prog).map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}"))),
        Err(e) => {
            // SAFETY: `prog` is live.
            let log = unsafe { result::get_program_log(prog) }
                .map(|raw| c_chars_to_string(&raw))
                .unwrap_or_default();
            Err(fail(format!("{e:?}\n{log}")))
        }
    };
    // SAFETY: created above, destroyed once. Ignored: the CUBIN (or the error) is already in
    // hand, and a failed destroy can only leak the program's host memory.
    let _ = unsafe { result::destroy_program(prog) };
    outcome
}

fn cubin_of(prog: sys::nvrtcProgram) -> Result<Vec<u8>, sys::nvrtcResult> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; the buffer has the size NVRTC reported.
    unsafe {
        let rc = sys::nvrtcGetCUBINSize(prog, &mut size);
        if rc != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(rc);
        }
        let mut buf = vec![0u8; size];
        let rc = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char);
        if rc != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(rc);
        }
        Ok(buf)
    }
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles with the on-disk cache: `$STREAMRECON_KERNEL_CACHE`, else `$XDG_CACHE_HOME` or
/// `~/.cache`, under `streamrecon/kernels/`. A cache that cannot be read or written is skipped,
/// never fatal.
pub fn compile_cached(name: &str, source: &str, target: &str) -> Result<Vec<u8>, CudaError> {
    let (major, minor) = version()?;
    let headers = headers();
    let key = fnv1a64(
        [
            source.as_bytes(),
            headers[0].1.as_bytes(),
            headers[1].1.as_bytes(),
            target.as_bytes(),
            OPTIONS.join(" ").as_bytes(),
            &major.to_le_bytes(),
            &minor.to_le_bytes(),
        ]
        .into_iter(),
    );
    let path = cache_dir().map(|d| d.join(format!("{name}-{target}-{key:016x}.cubin")));
    if let Some(p) = &path
        && let Ok(bytes) = std::fs::read(p)
        && !bytes.is_empty()
    {
        return Ok(bytes);
    }
    let cubin = compile_cubin(name, source, target)?;
    if let Some(p) = &path {
        // Write then rename, so a concurrent reader never sees half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if p.parent()
            .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, &cubin).is_ok()
        {
            // The cache is optional (module doc): a failed rename costs a compile next time, and
            // the stray temporary is removed, best effort for the same reason.
            if std::fs::rename(&tmp, p).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
    Ok(cubin)
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("STREAMRECON_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("streamrecon").join("kernels"))
}

/// FNV-1a, 64 bit: a hash that is stable across Rust releases (std's DefaultHasher is not).
fn fnv1a64<'a>(parts: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
