//! The kernels of `kernels/*.cu`, loaded into a context: CUBIN that build.rs made with nvcc when
//! it matches the GPU's architecture, else NVRTC at run time (cached on disk).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::attention::AttentionKernel;
use super::{CudaError, nvrtc};

mod prebuilt {
    include!(concat!(env!("OUT_DIR"), "/prebuilt_kernels.rs"));
}

/// One kernel source file and the entry points it defines.
pub struct KernelSource {
    /// File stem in `kernels/`.
    pub name: &'static str,
    pub source: &'static str,
    /// Entry points other than the attention kernels (those are named in the attention table:
    /// read [`Self::entry_points`]).
    pub functions: &'static [&'static str],
    /// Uses sm_90a-only instructions (wgmma): built for Hopper alone, as `sm_90a`.
    pub hopper_only: bool,
}

impl KernelSource {
    /// Every entry point this file defines: its listed functions, then the attention kernels the
    /// attention table places in it.
    pub fn entry_points(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.functions
            .iter()
            .copied()
            .chain(AttentionKernel::entries_in(self.name))
    }

    /// The NVRTC/nvcc target for a GPU of compute capability `arch`, or None when this source
    /// does not apply to it.
    pub fn target(&self, arch: u32) -> Option<String> {
        match (self.hopper_only, arch) {
            (true, 90) => Some("sm_90a".into()),
            (true, _) => None,
            (false, a) => Some(format!("sm_{a}")),
        }
    }
}

/// Every kernel file of the crate. The NVRTC test compiles each of them.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "paged_attention",
        source: include_str!("../../../kernels/paged_attention.cu"),
        functions: &["attention_combine"],
        hopper_only: false,
    },
    KernelSource {
        name: "kv_cache",
        source: include_str!("../../../kernels/kv_cache.cu"),
        functions: &["kv_write_tokens", "kv_gather_dense"],
        hopper_only: false,
    },
    KernelSource {
        name: "util",
        source: include_str!("../../../kernels/util.cu"),
        functions: &["fill_random_bf16"],
        hopper_only: false,
    },
    KernelSource {
        name: "gpu_model",
        source: include_str!("../../../kernels/gpu_model.cu"),
        functions: &["image_to_rgb8"],
        hopper_only: false,
    },
    KernelSource {
        name: "preprocess",
        source: include_str!("../../../kernels/preprocess.cu"),
        functions: &["preprocess_resize_rows", "preprocess_resize_cols"],
        hopper_only: false,
    },
    KernelSource {
        name: "transformer",
        source: include_str!("../../../kernels/transformer.cu"),
        functions: &[
            "layer_norm_rows",
            "layer_norm_rows_1024",
            "residual_add_scaled",
            "residual_add_scaled_x4",
            "residual_layer_norm_1024",
            "residual_layer_norm_copy_1024",
            "gelu_erf_bf16",
            "gelu_erf_bf16_x4",
            "add_bias_gelu_erf_bf16",
            "add_bias_gelu_erf_bf16_x4",
            "qkv_split_norm_rope",
            "patchify_normalized",
            "dino_assemble",
            "copy_rows_f32",
            "f32_to_bf16_kernel",
        ],
        hopper_only: false,
    },
    KernelSource {
        name: "dpt",
        source: include_str!("../../../kernels/dpt.cu"),
        functions: &[
            "dpt_layernorm_rows",
            "dpt_add_uv",
            "dpt_im2col3x3",
            "dpt_pixel_shuffle",
            "dpt_bilinear",
            "dpt_add",
            "dpt_output_head",
            "dpt_output_conv_head_c128",
            "dpt_output_conv_head_c16",
            "dpt_decode_pose",
            "dpt_points_count",
            "dpt_points_scan",
            "dpt_points_write",
        ],
        hopper_only: false,
    },
    KernelSource {
        name: "camera_head",
        source: include_str!("../../../kernels/camera_head.cu"),
        functions: &[
            "cam_token_norm",
            "cam_linear_m1",
            "cam_linear_m2",
            "cam_linear_m4",
            "cam_linear_m8",
            "cam_linear3_m1",
            "cam_linear3_m2",
            "cam_linear3_m4",
            "cam_linear3_m8",
            "cam_sweep_k2048",
            "cam_sweep_k8192",
            "cam_sweep2_k2048",
            "cam_sweep2_k8192",
            "cam_attention_partial",
        ],
        hopper_only: false,
    },
    KernelSource {
        name: "conv_sm90",
        source: include_str!("../../../kernels/conv_sm90.cu"),
        functions: &["dpt_conv3x3_sm90_n256", "dpt_conv3x3_sm90_n128"],
        hopper_only: true,
    },
    KernelSource {
        name: "paged_attention_sm90_ws",
        source: include_str!("../../../kernels/paged_attention_sm90_ws.cu"),
        // Beside the kernels of the attention table: the frame-local one reading q/k/v rows, and
        // the bounded kernel's form for log2-domain queries.
        functions: &[
            "paged_attention_fwd_sm90_ws_qkv",
            "paged_attention_fwd_sm90_ws_m256_log2",
        ],
        hopper_only: true,
    },
];

/// How a module got its machine code (reported by `bench`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Nvcc,
    Nvrtc,
}

/// The prebuilt CUBIN of `name` for `arch`, if build.rs made one.
pub fn prebuilt(name: &str, arch: u32) -> Option<&'static [u8]> {
    prebuilt::PREBUILT
        .iter()
        .find(|(n, a, _)| *n == name && *a == arch)
        .map(|(_, _, bytes)| *bytes)
}

/// Loaded kernels by entry-point name.
#[derive(Clone)]
pub struct KernelRegistry {
    functions: HashMap<&'static str, CudaFunction>,
    origins: Vec<(&'static str, Origin)>,
    _modules: Vec<Arc<CudaModule>>,
}

impl KernelRegistry {
    pub fn load(ctx: &Arc<CudaContext>, arch: u32) -> Result<Self, CudaError> {
        let mut functions = HashMap::new();
        let mut origins = Vec::new();
        let mut modules = Vec::new();
        // STREAMRECON_FORCE_NVRTC: ignore the embedded CUBIN (to exercise the run-time path).
        let force_nvrtc = std::env::var_os("STREAMRECON_FORCE_NVRTC").is_some();
        for src in SOURCES {
            let Some(target) = src.target(arch) else {
                continue;
            };
            let embedded = prebuilt(src.name, arch).filter(|_| !force_nvrtc);
            let (cubin, origin) = match embedded {
                Some(bytes) => (bytes.to_vec(), Origin::Nvcc),
                None => (
                    nvrtc::compile_cached(src.name, src.source, &target)?,
                    Origin::Nvrtc,
                ),
            };
            let module = ctx.load_module(Ptx::from_binary(cubin))?;
            for f in src.entry_points() {
                functions.insert(f, module.load_function(f)?);
            }
            origins.push((src.name, origin));
            modules.push(module);
        }
        Ok(Self {
            functions,
            origins,
            _modules: modules,
        })
    }

    /// Whether an entry point was loaded (Hopper-only kernels are absent elsewhere).
    pub fn has(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions
            .get(name)
            .ok_or_else(|| CudaError::UnknownKernel(name.to_owned()))
    }

    pub fn origins(&self) -> &[(&'static str, Origin)] {
        &self.origins
    }
}

#[cfg(test)]
mod tests {
    use super::SOURCES;
    use std::collections::BTreeSet;

    /// `src` without comments, macro continuations joined into one line.
    fn code_lines(src: &str) -> Vec<String> {
        let mut code = String::with_capacity(src.len());
        let mut rest = src;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("//") {
                rest = after.find('\n').map_or("", |i| &after[i..]);
            } else if let Some(after) = rest.strip_prefix("/*") {
                rest = after.find("*/").map_or("", |i| &after[i + 2..]);
            } else {
                let c = rest.chars().next().unwrap_or_default();
                code.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        code.replace("\\\n", " ")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The name an `extern "C" __global__` definition in `text` gives its kernel: the identifier
    /// after `void` and an optional `__launch_bounds__(…)`.
    fn kernel_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        for (at, _) in text.match_indices("extern \"C\" __global__") {
            let mut t = text[at..]["extern \"C\" __global__".len()..].trim_start();
            t = t.strip_prefix("void").unwrap_or(t).trim_start();
            if let Some(after) = t.strip_prefix("__launch_bounds__") {
                let mut depth = 0;
                let end = after
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth == 0 && c == ')'
                    })
                    .map_or(after.len(), |(i, _)| i + 1);
                t = after[end..].trim_start();
            }
            let name: String = t
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.push(name);
        }
        names
    }

    /// Arguments of a macro invocation `NAME(a, b(c, d), e)`, split at the top level.
    fn macro_args(call: &str) -> Vec<String> {
        let inner = call.split_once('(').map_or("", |(_, r)| r);
        let (mut depth, mut arg, mut args) = (0, String::new(), Vec::new());
        for c in inner.chars() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => break,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    args.push(arg.trim().to_owned());
                    arg.clear();
                    continue;
                }
                _ => {}
            }
            arg.push(c);
        }
        args.push(arg.trim().to_owned());
        args
    }

    /// Every kernel a source file defines, written out or through a macro whose parameter
    /// names it.
    fn defined_kernels(src: &str) -> BTreeSet<String> {
        let lines = code_lines(src);
        let mut defined = BTreeSet::new();
        // Macros that define a kernel: name -> index of the parameter that names it.
        let mut makers = Vec::new();
        // Written-out definitions may span lines: searched in the code without directives.
        let plain: Vec<&str> = lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect();
        defined.extend(kernel_names(&plain.join("\n")));
        for line in &lines {
            let Some(def) = line.trim_start().strip_prefix("#define ") else {
                continue;
            };
            let (head, body) = def.split_once(')').unwrap_or((def, ""));
            let Some((macro_name, params)) = head.split_once('(') else {
                continue;
            };
            let params: Vec<&str> = params.split(',').map(str::trim).collect();
            for kernel in kernel_names(body) {
                if let Some(i) = params.iter().position(|p| *p == kernel) {
                    makers.push((macro_name.trim().to_owned(), i));
                }
            }
        }
        for line in &lines {
            let line = line.trim_start();
            for (maker, i) in &makers {
                if line.starts_with(&format!("{maker}(")) {
                    defined.insert(macro_args(line)[*i].clone());
                }
            }
        }
        defined
    }

    /// An entry point the registry does not list fails only on the GPU, at its first launch;
    /// one it lists that the source lacks fails every load. Both are caught here, without a GPU.
    #[test]
    fn every_kernel_defined_is_registered_and_every_registered_one_defined() {
        for src in SOURCES {
            let defined = defined_kernels(src.source);
            let registered: BTreeSet<String> = src.entry_points().map(str::to_owned).collect();
            assert!(!defined.is_empty(), "{}: no kernels found", src.name);
            assert_eq!(
                defined, registered,
                "{}.cu: kernels defined (left) against entry points registered (right)",
                src.name
            );
        }
    }

    #[test]
    fn a_kernel_made_by_a_macro_is_found_by_its_naming_parameter() {
        let src = "#define MAKE(A, name) \\\n extern \"C\" __global__ void \
                   __launch_bounds__(f(1), 2) name(int x) { body<A>(x); }\n\
                   // MAKE(commented, out)\n\
                   MAKE(8, made_one)\n\
                   extern \"C\" __global__ void plain(int y) {}\n";
        let found: Vec<String> = defined_kernels(src).into_iter().collect();
        assert_eq!(found, ["made_one", "plain"]);
    }
}
