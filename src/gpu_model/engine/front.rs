//! The front of a call, its images and DINO, on a stream of its own at the lowest priority.
//!
//! DINO reads nothing but the call's images, so the next frame's DINO need not wait for this
//! frame's heads: with two calls in flight it runs beside them (the small-m camera head and the
//! depth head leave SMs idle), and the main stream's kernels go first wherever both are ready.
//! The main stream waits for the front's outputs, copies them into its own buffers at once and,
//! after its aggregator, records the event the front's next call waits for
//! ([`Front::may_start_after`]).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice};
use half::bf16;

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::gemm::{Epilogue, Gemm, SharedChoices, TuneRecord, Tuning};
use crate::backend::cuda::ops::{self, LnOut, Rope};
use crate::backend::cuda::storage::{DeviceLinear, DeviceModel};
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::model::preprocess::PreprocessConfig;
use crate::model::spec::{DINO_REGISTERS, SPECIAL_TOKENS};

use super::super::preprocess::DevicePreprocess;
use super::super::transformer::{
    Attend, AttentionSetup, BlockScratch, Chain, GeluMode, block_forward,
};
use super::device_io::{ImageStaging, image_to_rgb8};
use super::{STREAMING_CALL_FRAMES, Shape, StepGraph, StepImages, capture_graph};

/// The front's device buffers (carved from the session's arena).
#[derive(Debug, Clone, Copy)]
pub(super) struct FrontBuffers {
    /// The model's input, `[S][3][H][W]` in [0, 1].
    pub image: DevPtr<f32>,
    /// The same as 8-bit RGB, `[S][3][H][W]` (the points' colours, the result's image).
    pub rgb: DevPtr<u8>,
    pub patches: DevPtr<bf16>,
    pub patch_emb: DevPtr<bf16>,
    pub dino_x: DevPtr<f32>,
    pub dino_pos: DevPtr<f32>,
    pub scratch: BlockScratch,
    pub dino_tables: DevPtr<u32>,
    /// DINO's normalised patch tokens in the aggregator's layout, `[S][6 + patches][C]`: one
    /// copy moves them into the aggregator's stream (its special rows are filled there).
    pub tokens: DevPtr<f32>,
}

/// What the front queued for one call.
pub(super) struct FrontCall {
    /// Around the device preprocessing (equal when the images came preprocessed).
    pub preprocess_start: CudaEvent,
    pub start: CudaEvent,
    /// After DINO: the main stream waits for it.
    pub done: CudaEvent,
    pub image_upload_ms: f64,
    pub graph: bool,
}

/// The front stream, its GEMM handle, buffers, graph and image uploads.
pub(super) struct Front {
    pub dev: CudaDevice,
    gemm: Gemm,
    pub bufs: FrontBuffers,
    /// DINO's patch embedding `[C][row_len]`: the model's `[C][3 * 14 * 14]` weight with its
    /// rows padded by zeros as `ops::patch_row_len` says (the patches are padded alike).
    patch_weight: CudaSlice<bf16>,
    /// DINO of a streaming call of one frame and of two (`[s - 1]`), each captured after one
    /// eager run of its size (its GEMM shapes are tuned by then).
    graphs: [Option<StepGraph>; STREAMING_CALL_FRAMES],
    warmed: [bool; STREAMING_CALL_FRAMES],
    image_staging: ImageStaging,
    preprocess: DevicePreprocess,
    /// Recorded on the main stream after the last call's aggregator (its outputs were copied
    /// long before).
    start_after: Option<CudaEvent>,
}

impl Front {
    pub(super) fn new(
        main: &CudaDevice,
        bufs: FrontBuffers,
        shape: &Shape,
        patch_proj: &DeviceLinear,
        tuning: Tuning,
        choices: &SharedChoices,
    ) -> Result<Self, CudaError> {
        let dev = main.with_background_stream()?;
        let patch_weight = padded_patch_weight(&dev, patch_proj, shape)?;
        let mut gemm = Gemm::new(&dev)?;
        gemm.set_tuning(tuning, choices);
        let image_staging = ImageStaging::new(&dev, shape.max_call * 3 * shape.plane())?;
        let preprocess = DevicePreprocess::new(
            &dev,
            PreprocessConfig {
                width: shape.width,
                patch: shape.patch,
            },
            shape.height,
            shape.width,
        )?;
        Ok(Self {
            dev,
            gemm,
            bufs,
            patch_weight,
            graphs: Default::default(),
            warmed: [false; STREAMING_CALL_FRAMES],
            image_staging,
            preprocess,
            start_after: None,
        })
    }

    pub(super) fn tune_records(&self) -> &[TuneRecord] {
        self.gemm.tune_records()
    }

    /// The front's next call starts once `event` (recorded on the main stream after it has
    /// taken the front's outputs) completes.
    pub(super) fn may_start_after(&mut self, event: CudaEvent) {
        self.start_after = Some(event);
    }

    /// Queues the call's image upload (or device preprocessing), its 8-bit copy and DINO on the
    /// front stream. `graphable`: a streaming call (one frame or two) may replay the captured
    /// DINO graph of its size.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &mut self,
        images: StepImages<'_>,
        s: usize,
        shape: &Shape,
        model: &DeviceModel,
        setup: AttentionSetup,
        gelu: GeluMode,
        graphable: bool,
    ) -> Result<FrontCall, CudaError> {
        let plane = shape.plane();
        if let Some(event) = &self.start_after {
            self.dev.stream.wait(event)?;
        }
        let timed = |dev: &CudaDevice| {
            dev.stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        };
        let image_clock = Instant::now();
        let preprocess_start = timed(&self.dev)?;
        match images {
            StepImages::Model(values) => {
                self.image_staging
                    .upload(&self.dev, values, self.bufs.image)?
            }
            StepImages::Rgb8(decoded) => {
                self.preprocess
                    .run(&self.dev, decoded, self.bufs.image.slice(0, s * 3 * plane)?)?
            }
        }
        let image_upload_ms = image_clock.elapsed().as_secs_f64() * 1e3;
        let start = timed(&self.dev)?;
        let graphable = graphable && (1..=STREAMING_CALL_FRAMES).contains(&s);
        let size = s.clamp(1, STREAMING_CALL_FRAMES) - 1;
        if graphable && self.graphs[size].is_none() && self.warmed[size] {
            let stream = Arc::clone(&self.dev.stream);
            self.graphs[size] =
                capture_graph(&stream, || self.forward(s, shape, model, setup, gelu))?;
        }
        let graph = match &self.graphs[size] {
            Some(g) if graphable => {
                g.0.launch()?;
                true
            }
            _ => {
                self.forward(s, shape, model, setup, gelu)?;
                self.warmed[size] |= graphable;
                false
            }
        };
        let done = timed(&self.dev)?;
        Ok(FrontCall {
            preprocess_start,
            start,
            done,
            image_upload_ms,
            graph,
        })
    }

    /// The 8-bit copy of the images and DINO (patch embedding, token assembly, 24 blocks within
    /// each frame, the final norm into `tokens`): launches only, captured as the front's graph.
    fn forward(
        &mut self,
        s: usize,
        sh: &Shape,
        model: &DeviceModel,
        setup: AttentionSetup,
        gelu: GeluMode,
    ) -> Result<(), CudaError> {
        let dev = &self.dev;
        let b = self.bufs;
        let w = model.aggregator();
        let c = sh.embed;
        let plane = sh.plane();
        let patch_len = ops::patch_row_len(sh.patch);
        for f in 0..s {
            let image = b.image.slice(f * 3 * plane, 3 * plane)?;
            image_to_rgb8(dev, image, b.rgb.slice(f * 3 * plane, 3 * plane)?, plane)?;
            ops::patchify_normalized(
                dev,
                image,
                sh.height,
                sh.width,
                b.patches
                    .slice(f * sh.patches * patch_len, sh.patches * patch_len)?,
                patch_len,
            )?;
        }
        let proj = &w.dino.patch_proj;
        self.gemm.linear(
            dev,
            b.patches,
            DevPtr::of(&self.patch_weight),
            proj.bias_ptr(),
            b.patch_emb,
            s * sh.patches,
            c,
            patch_len,
            Epilogue::Bias,
        )?;
        for f in 0..s {
            ops::dino_assemble(
                dev,
                b.patch_emb.slice(f * sh.patches * c, sh.patches * c)?,
                DevPtr::of(&w.dino.cls_token),
                DevPtr::of(&w.dino.register_tokens),
                b.dino_pos,
                b.dino_x.slice(f * sh.dino_tokens * c, sh.dino_tokens * c)?,
                sh.patches,
                c,
            )?;
        }
        let dino_x = b.dino_x.slice(0, s * sh.dino_tokens * c)?;
        for (i, block) in w.dino.blocks.iter().enumerate() {
            block_forward(
                dev,
                &mut self.gemm,
                block,
                dino_x,
                s * sh.dino_tokens,
                &b.scratch,
                Attend::WithinFrames {
                    frames: s,
                    tokens: sh.dino_tokens,
                    tables: b.dino_tables,
                    rope: Rope::None,
                },
                setup,
                gelu,
                Chain::link(&w.dino.blocks, i, |b| &b.norm1),
            )?;
        }
        let norm = &w.dino.norm;
        for f in 0..s {
            ops::layer_norm(
                dev,
                b.dino_x.slice(
                    (f * sh.dino_tokens + 1 + DINO_REGISTERS) * c,
                    sh.patches * c,
                )?,
                sh.patches,
                c,
                norm.weight_ptr(),
                norm.bias_ptr(),
                norm.eps,
                LnOut::F32(
                    b.tokens
                        .slice((f * sh.tokens + SPECIAL_TOKENS) * c, sh.patches * c)?,
                ),
            )?;
        }
        Ok(())
    }
}

/// `patch_proj`'s weight `[C][3 * p * p]` with each row padded by zeros to
/// `ops::patch_row_len(p)`: read back once when the session is made (1.2 MB at full size).
fn padded_patch_weight(
    dev: &crate::backend::cuda::CudaDevice,
    patch_proj: &DeviceLinear,
    shape: &Shape,
) -> Result<CudaSlice<bf16>, CudaError> {
    let cols = 3 * shape.patch * shape.patch;
    let row_len = ops::patch_row_len(shape.patch);
    let weight = dev.stream.clone_dtoh(&patch_proj.weight)?;
    if weight.len() != shape.embed * cols {
        return Err(CudaError::Invalid(format!(
            "patch embedding weight: {} values, expected {} x {cols}",
            weight.len(),
            shape.embed
        )));
    }
    let mut padded = vec![bf16::ZERO; shape.embed * row_len];
    for (dst, src) in padded
        .chunks_exact_mut(row_len)
        .zip(weight.chunks_exact(cols))
    {
        dst[..cols].copy_from_slice(src);
    }
    Ok(dev.stream.clone_htod(&padded)?)
}
