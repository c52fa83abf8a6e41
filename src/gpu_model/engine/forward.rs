//! The main stream's work of one call (the aggregator, the heads, the points; DINO runs on the
//! front stream, `front.rs`): launches only, so the same code runs eagerly and is captured as a
//! streaming step's CUDA graph.

use super::device_io::copy_dtod;
use super::*;
use crate::backend::cuda::FrameScalar;
use crate::backend::cuda::ops::RowCopy;
use crate::gpu_model::dpt_head::Taps;

/// The two halves of the main stream's work, each its own graph: the front's next call may wait
/// for the end of the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// Special tokens and the 24 frame + 24 global blocks, into the taps.
    Aggregator,
    /// The camera head (side stream), the depth head and the points.
    Heads,
}

impl GpuSession {
    /// One part of the main stream's work of a call whose DINO tokens are in `x` already
    /// (launches only; captured as a graph for streaming steps).
    pub(super) fn forward(
        &mut self,
        part: Part,
        step: PartStep,
        profile: Option<&mut Vec<(String, f64)>>,
    ) -> Result<(), CudaError> {
        let dev = Arc::clone(&self.dev);
        let timed = profile.is_some();
        let mut marks: Vec<(&'static str, CudaEvent)> = Vec::new();
        let mark = |name: &'static str, marks: &mut Vec<(&'static str, CudaEvent)>| {
            if timed {
                let ev = dev
                    .stream
                    .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                marks.push((name, ev));
            }
            Ok::<(), CudaError>(())
        };
        mark("start", &mut marks)?;
        match part {
            Part::Aggregator => self.aggregate(step, &mut |name| mark(name, &mut marks))?,
            Part::Heads => self.heads(step, &mut |name| mark(name, &mut marks))?,
        }
        if let Some(stages) = profile {
            // Stages that repeat (one per block) are summed.
            for pair in marks.windows(2) {
                let ms = pair[0].1.elapsed_ms(&pair[1].1)? as f64;
                match stages.iter_mut().find(|(n, _)| n == pair[1].0) {
                    Some((_, total)) => *total += ms,
                    None => stages.push((pair[1].0.to_owned(), ms)),
                }
            }
        }
        Ok(())
    }

    /// The special tokens and the aggregator's blocks; `mark` ends a stage.
    fn aggregate(
        &mut self,
        step: PartStep,
        mark: &mut dyn FnMut(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let PartStep {
            s,
            committed,
            scale_frames,
            ..
        } = step;
        let dev = Arc::clone(&self.dev);
        let dev = &*dev;
        let sh = self.shape;
        let model = Arc::clone(&self.weights);
        let w = model.aggregator();
        let b = &self.bufs;
        let c = sh.embed;
        let cfg = model.config().clone();

        // Special tokens: the first frame of the stream and the scale frames have their own
        // variants (fixed for graph-captured steps, which are always "later" frames; so are both
        // frames of a two-frame step, whatever their kinds).
        for f in 0..s {
            let global = committed as usize + f;
            let first = usize::from(global != 0);
            let scale_variant = usize::from(global >= scale_frames);
            let row = b.x.slice(f * sh.tokens * c, SPECIAL_TOKENS * c)?;
            copy_dtod(
                dev,
                DevPtr::of(&w.camera_token).slice(first * c, c)?,
                row.slice(0, c)?,
            )?;
            copy_dtod(
                dev,
                DevPtr::of(&w.register_token).slice(first * 4 * c, 4 * c)?,
                row.slice(c, 4 * c)?,
            )?;
            copy_dtod(
                dev,
                DevPtr::of(&w.scale_token).slice(scale_variant * c, c)?,
                row.slice(5 * c, c)?,
            )?;
        }

        // Aggregator: frame block g, then global block g over the paged cache.
        let n = s * sh.tokens;
        let x = b.x.slice(0, n * c)?;
        let rope_frames = self.kv.frame_scalars_ptr(FrameScalar::RopeFrame)?;
        // A two-frame step attends each frame to its own view of the cache.
        let views = if step.pair { 2 } else { 1 };
        for (g, (fb, gb)) in w.frame_blocks.iter().zip(&w.global_blocks).enumerate() {
            // A tap is cat(frame block g's x, global block g's x) per token, [n][2C]: each half
            // is written by the last residual kernel of its block.
            let taps: Vec<usize> = (0..cfg.taps.len()).filter(|&i| cfg.taps[i] == g).collect();
            let half_of = |t: usize, half: usize| -> Result<RowCopy, CudaError> {
                Ok(RowCopy {
                    dst: b.taps[t].slice(half * c, n * 2 * c - half * c)?,
                    stride: 2 * c,
                })
            };
            // The first tap of the block comes from the block's kernels, any other by a copy.
            let fused_tap = taps.first().copied();
            block_forward(
                dev,
                &mut self.gemm,
                fb,
                x,
                n,
                &b.scratch,
                Attend::WithinFrames {
                    frames: s,
                    tokens: sh.tokens,
                    tables: b.frame_tables,
                    rope: Rope::Axial2d {
                        tables: &self.rope,
                        tokens_per_frame: sh.tokens,
                        grid_w: sh.grid_w,
                    },
                },
                self.local_setup,
                self.sc.gelu,
                // Frame block g's norm1 came with global block g - 1's last residual.
                Chain {
                    normed_in: g > 0,
                    next_norm1: Some(&gb.norm1),
                    copy_out: fused_tap.map(|t| half_of(t, 0)).transpose()?,
                },
            )?;
            for &t in taps.iter().skip(1) {
                let h = half_of(t, 0)?;
                ops::copy_rows(dev, x, c, h.dst, h.stride, n, c)?;
            }
            mark("frame_blocks")?;
            block_forward(
                dev,
                &mut self.gemm,
                gb,
                x,
                n,
                &b.scratch,
                Attend::Cache {
                    cache: &self.kv,
                    layer: g,
                    views,
                    rope: Rope::Video3d {
                        tables: &self.rope,
                        tokens_per_frame: sh.tokens,
                        grid_w: sh.grid_w,
                        frame_index: rope_frames,
                    },
                    dense: self.dense,
                    attention: &self.global_attention[g],
                },
                self.setup,
                self.sc.gelu,
                Chain {
                    normed_in: true,
                    next_norm1: w.frame_blocks.get(g + 1).map(|b| &b.norm1),
                    copy_out: fused_tap.map(|t| half_of(t, 1)).transpose()?,
                },
            )?;
            for &t in taps.iter().skip(1) {
                let h = half_of(t, 1)?;
                ops::copy_rows(dev, x, c, h.dst, h.stride, n, c)?;
            }
            mark("global_blocks")?;
        }
        Ok(())
    }

    /// The camera head (side stream) and the depth head on the taps, then the points; `mark`
    /// ends a stage.
    fn heads(
        &mut self,
        step: PartStep,
        mark: &mut dyn FnMut(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let s = step.s;
        let dev = Arc::clone(&self.dev);
        let dev = &*dev;
        let sh = self.shape;
        let model = Arc::clone(&self.weights);
        let b = &self.bufs;
        let c = sh.embed;
        let plane = sh.plane();

        // Camera head on the last tap's camera tokens, with its own cache, on the side stream
        // (it only needs the aggregator's output) while the depth head runs on the main one.
        let last_tap = *b
            .taps
            .last()
            .ok_or_else(|| CudaError::Invalid("the model has no taps".into()))?;
        let aggregated = dev.stream.record_event(None)?;
        self.side.stream.wait(&aggregated)?;
        let camera_lens = self.kv.frame_scalars_ptr(FrameScalar::CameraLen)?;
        if step.pair {
            // The two frames of a two-frame step in one call, each with its own cache length
            // (each sees the cache as it was streamed alone, not the other frame).
            self.camera.forward_pair(
                &self.side,
                model.camera_head(),
                last_tap,
                sh.tokens * 2 * c,
                camera_lens.slice(0, 2)?,
                step.keyframes,
                b.pose.slice(0, 2 * POSE_ENC_LEN)?,
            )?;
        } else {
            self.camera.forward(
                &self.side,
                model.camera_head(),
                last_tap,
                sh.tokens * 2 * c,
                s,
                camera_lens.slice(0, 1)?,
                step.keyframes[0],
                b.pose.slice(0, s * POSE_ENC_LEN)?,
            )?;
        }
        let posed = self.side.stream.record_event(None)?;
        if self.sc.profile_stages {
            // Timed one after the other when profiling, so each head has its own time.
            dev.stream.wait(&posed)?;
            mark("camera_head")?;
        }

        // Depth head: a call's frames in batches (both frames of a two-frame step at once).
        let batch = self.dpt.batch();
        let frame_stride = sh.tokens * 2 * c;
        for f0 in (0..s).step_by(batch) {
            let n = batch.min(s - f0);
            let first: Vec<DevPtr<f32>> = b
                .taps
                .iter()
                .map(|t| t.slice(f0 * frame_stride, n * frame_stride))
                .collect::<Result<_, _>>()?;
            let first: [DevPtr<f32>; 4] = first
                .try_into()
                .map_err(|_| CudaError::Invalid("the depth head takes exactly 4 taps".into()))?;
            self.dpt.forward(
                dev,
                &mut self.gemm,
                model.depth_head(),
                n,
                Taps {
                    first,
                    row_stride: 2 * c,
                    frame_stride,
                },
                b.depth.slice(f0 * plane, n * plane)?,
                b.conf.slice(f0 * plane, n * plane)?,
            )?;
        }
        // The points need the poses: join the side stream back.
        dev.stream.wait(&posed)?;
        mark("depth_head")?;

        // Points: unprojected with the device's pose, filtered and compacted; only they go back.
        for f in 0..s {
            self.compactor.run(
                dev,
                b.depth.slice(f * plane, plane)?,
                b.conf.slice(f * plane, plane)?,
                b.pose.slice(f * POSE_ENC_LEN, POSE_ENC_LEN)?,
                b.rgb.slice(f * 3 * plane, 3 * plane)?,
                self.sc.min_confidence,
                self.sc.point_stride,
                b.xyz.slice(f * 3 * plane, 3 * plane)?,
                b.point_rgb.slice(f * 3 * plane, 3 * plane)?,
                b.point_conf.slice(f * plane, plane)?,
                b.counts.slice(f, 1)?,
            )?;
        }
        mark("points")?;
        Ok(())
    }
}
