//! What every executor of the GCT model must agree on, written once: the token layout of a
//! frame, the fixed token counts, the head width the attention kernels are built for, the
//! position-embedding constants and the input normalisation. Sizes that vary between
//! checkpoints (width, depth, taps, head counts) live in [`super::ModelConfig`].
//!
//! The CPU model (the oracle) and the GPU engine read these constants, and the CUDA kernels get
//! them through [`cuda_header`]: `build.rs` compiles this very file (`#[path]`) to write
//! `spec.cuh` for nvcc, and the NVRTC path hands the same text to the compiler. So this file
//! must not import anything from the crate.

/// Head width of every attention layer on the GPU (the kernels are specialised for it).
pub const HEAD_DIM: usize = 64;

/// Patch size of the DINOv2 ViT-L/14 backbone (the default of `ModelConfig::patch`).
pub const PATCH: usize = 14;

/// DINOv2 register tokens, placed after its cls token.
pub const DINO_REGISTERS: usize = 4;
/// DINO tokens before the patches: cls, then the registers.
pub const DINO_PREFIX_TOKENS: usize = 1 + DINO_REGISTERS;

/// Aggregator register tokens per frame (tokens 1..=4 of the special block).
pub const AGGREGATOR_REGISTERS: usize = 4;
/// Special tokens per frame ahead of its patches: camera, the registers, scale.
pub const SPECIAL_TOKENS: usize = 1 + AGGREGATOR_REGISTERS + 1;

/// Pose encoding length: translation (3), quaternion xyzw (4), field of view h, w (2).
pub const POSE_ENC_LEN: usize = 9;

/// 2D RoPE (frame blocks): frequency base, rotate-half convention.
pub const ROPE2D_BASE: f32 = 100.0;
/// 2D RoPE frequencies per axis for [`HEAD_DIM`]: each half of a head is one axis.
pub const ROPE2D_FREQS: usize = HEAD_DIM / 4;
/// 3D RoPE (global blocks): theta, and the head-dim split (temporal, row, column) in dimensions.
pub const ROPE3D_THETA: f64 = 10000.0;
pub const ROPE3D_SPLIT: [usize; 3] = [20, 22, 22];
// The kernels rotate row and column with one pair count.
const _: () = assert!(ROPE3D_SPLIT[1] == ROPE3D_SPLIT[2]);

/// ImageNet normalisation DINO expects (RGB in [0, 1]).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Tokens of one aggregator frame with `patches` patch tokens.
pub const fn frame_tokens(patches: usize) -> usize {
    SPECIAL_TOKENS + patches
}

/// Tokens of one DINO frame with `patches` patch tokens.
pub const fn dino_tokens(patches: usize) -> usize {
    DINO_PREFIX_TOKENS + patches
}

/// The constants above as a CUDA header (`spec.cuh`), so no kernel restates them.
pub fn cuda_header() -> String {
    let float3 = |v: [f32; 3]| format!("{{{:?}f, {:?}f, {:?}f}}", v[0], v[1], v[2]);
    let mut h = String::from(
        "// Generated from src/model/spec.rs by spec::cuda_header(); do not edit.\n#pragma once\n",
    );
    let defines: [(&str, String); 10] = [
        ("SPEC_HEAD_DIM", HEAD_DIM.to_string()),
        ("SPEC_DINO_REGISTERS", DINO_REGISTERS.to_string()),
        ("SPEC_DINO_PREFIX_TOKENS", DINO_PREFIX_TOKENS.to_string()),
        (
            "SPEC_AGGREGATOR_REGISTERS",
            AGGREGATOR_REGISTERS.to_string(),
        ),
        ("SPEC_SPECIAL_TOKENS", SPECIAL_TOKENS.to_string()),
        ("SPEC_POSE_ENC_LEN", POSE_ENC_LEN.to_string()),
        ("SPEC_ROPE2D_FREQS", ROPE2D_FREQS.to_string()),
        ("SPEC_ROPE3D_T_PAIRS", (ROPE3D_SPLIT[0] / 2).to_string()),
        ("SPEC_ROPE3D_HW_PAIRS", (ROPE3D_SPLIT[1] / 2).to_string()),
        ("SPEC_IMAGENET_MEAN", float3(IMAGENET_MEAN)),
    ];
    for (name, value) in defines {
        h.push_str(&format!("#define {name} {value}\n"));
    }
    h.push_str(&format!(
        "#define SPEC_IMAGENET_STD {}\n",
        float3(IMAGENET_STD)
    ));
    h
}
