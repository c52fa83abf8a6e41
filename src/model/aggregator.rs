//! The aggregator: DINO patch tokens plus 6 special tokens per frame, through interleaved
//! frame blocks (attention within a frame, 2D RoPE) and global blocks (attention across frames
//! through the KV cache, 3D video RoPE).

use crate::attention::CpuKvCache;

use super::block::{BlockSpec, TransformerBlock};
use super::config::ModelConfig;
use super::dino::DinoBackbone;
use super::error::{ModelError, Result};
use super::ops::attention::{AttentionShape, attend};
use super::ops::rope::{apply_rope_2d, apply_rope_3d, rope_3d_table};
use super::record::{Recorder, put};
use super::spec::{AGGREGATOR_REGISTERS, IMAGENET_MEAN, IMAGENET_STD, SPECIAL_TOKENS};
use super::storage::{Host, Loader, Storage};
use super::timing::{StageTimings, ms_since};
use std::time::Instant;

pub struct Aggregator<S: Storage = Host> {
    pub(crate) dino: DinoBackbone<S>,
    /// `[variant][C]`: variant 0 for the sequence's first frame, 1 otherwise.
    pub(crate) camera_token: S::Full,
    /// `[variant][4][C]`.
    pub(crate) register_token: S::Full,
    /// `[variant][C]`: variant 0 for the scale frames, 1 otherwise.
    pub(crate) scale_token: S::Full,
    pub(crate) frame_blocks: Vec<TransformerBlock<S>>,
    pub(crate) global_blocks: Vec<TransformerBlock<S>>,
    pub(crate) embed: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) patch: usize,
    pub(crate) taps: Vec<usize>,
    pub(crate) max_frame_num: usize,
}

/// Where a call's frames sit in the stream.
pub struct CallPosition {
    /// Frames committed to the cache before this call: the first frame's temporal RoPE index
    /// and its "global frame index" for special-token variants.
    pub committed: u64,
    /// Scale frames of the sequence (`min(scale_frames, total frames)`).
    pub scale_frames: usize,
}

impl<S: Storage> Aggregator<S> {
    pub fn load(store: &mut Loader<S>, cfg: &ModelConfig) -> Result<Self> {
        let c = cfg.embed;
        let spec = BlockSpec {
            dim: c,
            hidden: c * cfg.mlp_ratio,
            heads: cfg.heads,
            eps: 1e-5,
            qk_norm: true,
        };
        let dino = DinoBackbone::load(store, cfg)?;
        let blocks = |store: &mut Loader<S>, kind: &str| {
            (0..cfg.depth)
                .map(|i| TransformerBlock::load(store, &format!("aggregator.{kind}.{i}"), &spec))
                .collect::<Result<Vec<_>>>()
        };
        Ok(Aggregator {
            dino,
            camera_token: store.full("aggregator.camera_token", &[1, 2, 1, c])?,
            register_token: store.full(
                "aggregator.register_token",
                &[1, 2, AGGREGATOR_REGISTERS, c],
            )?,
            scale_token: store.full("aggregator.scale_token", &[1, 2, 1, c])?,
            frame_blocks: blocks(store, "frame_blocks")?,
            global_blocks: blocks(store, "global_blocks")?,
            embed: c,
            heads: cfg.heads,
            head_dim: cfg.head_dim(),
            patch: cfg.patch,
            taps: cfg.taps.clone(),
            max_frame_num: cfg.max_frame_num,
        })
    }

    pub fn dino(&self) -> &DinoBackbone<S> {
        &self.dino
    }
}

impl Aggregator {
    /// Run one call on `frames` images `[S][3][H][W]` in [0, 1]. The caller has begun the cache
    /// step for these frames. Returns the tapped features, each `[S][P][2C]`
    /// (frame block output and global block output side by side).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        images: &[f32],
        frames: usize,
        height: usize,
        width: usize,
        at: &CallPosition,
        cache: &mut CpuKvCache,
        mut rec: Option<&mut Recorder>,
        timings: &mut StageTimings,
    ) -> Result<Vec<Vec<f32>>> {
        let c = self.embed;
        let (ph, pw) = (height / self.patch, width / self.patch);
        let np = ph * pw;
        let p = SPECIAL_TOKENS + np;
        if at.committed as usize + frames > self.max_frame_num {
            return Err(ModelError::BadInput(format!(
                "frames {}..{} exceed the 3D RoPE table of max_frame_num = {}",
                at.committed,
                at.committed as usize + frames,
                self.max_frame_num
            )));
        }

        let clock = Instant::now();
        let normalized = imagenet_normalize(images, frames, height * width);
        let patches = self.dino.forward(&normalized, frames, height, width)?;
        timings.dino_ms += ms_since(clock);
        put(&mut rec, "dino_patch_tokens", vec![frames, np, c], &patches);

        // Tokens per frame: [camera, 4 registers, scale, patches].
        let mut x = vec![0.0f32; frames * p * c];
        for s in 0..frames {
            let global_index = at.committed as usize + s;
            let first = usize::from(global_index != 0);
            let scale_variant = usize::from(global_index >= at.scale_frames);
            let f = &mut x[s * p * c..(s + 1) * p * c];
            f[..c].copy_from_slice(&self.camera_token[first * c..(first + 1) * c]);
            let regs = AGGREGATOR_REGISTERS * c;
            f[c..c + regs].copy_from_slice(&self.register_token[first * regs..(first + 1) * regs]);
            f[c + regs..2 * c + regs]
                .copy_from_slice(&self.scale_token[scale_variant * c..(scale_variant + 1) * c]);
            f[SPECIAL_TOKENS * c..].copy_from_slice(&patches[s * np * c..(s + 1) * np * c]);
        }
        put(&mut rec, "tokens_in", vec![frames, p, c], &x);

        // 2D positions within a frame: specials at (0, 0), patch (r, c) at (r + 1, c + 1).
        let mut pos2d = vec![(0u32, 0u32); SPECIAL_TOKENS];
        for r in 0..ph {
            for col in 0..pw {
                pos2d.push((r as u32 + 1, col as u32 + 1));
            }
        }
        let pos2d_all: Vec<(u32, u32)> = (0..frames).flat_map(|_| pos2d.iter().copied()).collect();
        // 3D positions: special j at (f, j, j), patch (r, c) at (f, 6 + r, 6 + c).
        let mut pos3d = Vec::with_capacity(frames * p);
        for s in 0..frames {
            let f = at.committed + s as u64;
            for j in 0..SPECIAL_TOKENS as u64 {
                pos3d.push((f, j, j));
            }
            for r in 0..ph as u64 {
                for col in 0..pw as u64 {
                    pos3d.push((f, 6 + r, 6 + col));
                }
            }
        }
        let rope3d = rope_3d_table(&pos3d);
        put(
            &mut rec,
            "rope3d_cos",
            vec![1, 1, frames * p, rope3d.pairs],
            &rope3d.cos,
        );
        put(
            &mut rec,
            "rope3d_sin",
            vec![1, 1, frames * p, rope3d.pairs],
            &rope3d.sin,
        );

        let frame_shape = AttentionShape {
            queries: p,
            keys: p,
            heads: self.heads,
            head_dim: self.head_dim,
        };
        let mut taps = vec![Vec::new(); self.taps.len()];
        for (g, (fb, gb)) in self
            .frame_blocks
            .iter()
            .zip(&self.global_blocks)
            .enumerate()
        {
            // Frame block: attention within each frame.
            let clock = Instant::now();
            let mut qkv = fb.qkv(&x, frames * p);
            apply_rope_2d(&mut qkv.q, &pos2d_all, self.heads, self.head_dim);
            apply_rope_2d(&mut qkv.k, &pos2d_all, self.heads, self.head_dim);
            let mut attn = vec![0.0f32; frames * p * c];
            for s in 0..frames {
                let r = s * p * c..(s + 1) * p * c;
                attend(
                    &qkv.q[r.clone()],
                    &qkv.k[r.clone()],
                    &qkv.v[r.clone()],
                    &frame_shape,
                    &mut attn[r],
                );
            }
            fb.finish(&mut x, &attn, frames * p);
            put(
                &mut rec,
                &format!("frame_block.{g}"),
                vec![frames, p, c],
                &x,
            );
            let frame_out = if self.taps.contains(&g) {
                Some(x.clone())
            } else {
                None
            };
            timings.frame_blocks_ms += ms_since(clock);

            // Global block: this call's tokens attend to everything the cache shows.
            let clock = Instant::now();
            let mut qkv = gb.qkv(&x, frames * p);
            apply_rope_3d(&mut qkv.q, &rope3d, self.heads, self.head_dim);
            apply_rope_3d(&mut qkv.k, &rope3d, self.heads, self.head_dim);
            let attention_clock = Instant::now();
            cache.write_layer(g, &qkv.k, &qkv.v)?;
            let mut attn = vec![0.0f32; frames * p * c];
            cache.attend_layer(g, &qkv.q, &mut attn)?;
            timings.global_attention_ms += ms_since(attention_clock);
            gb.finish(&mut x, &attn, frames * p);
            timings.global_blocks_ms += ms_since(clock);
            put(
                &mut rec,
                &format!("global_block.{g}"),
                vec![1, frames * p, c],
                &x,
            );

            if let Some(frame_out) = frame_out {
                let mut both = vec![0.0f32; frames * p * 2 * c];
                for t in 0..frames * p {
                    both[t * 2 * c..t * 2 * c + c].copy_from_slice(&frame_out[t * c..(t + 1) * c]);
                    both[t * 2 * c + c..(t + 1) * 2 * c].copy_from_slice(&x[t * c..(t + 1) * c]);
                }
                for (slot, &tap) in self.taps.iter().enumerate() {
                    if tap == g {
                        taps[slot] = both.clone();
                    }
                }
            }
        }
        Ok(taps)
    }
}

/// `(x − mean) / std` per RGB channel of `[S][3][H·W]` images.
pub fn imagenet_normalize(images: &[f32], frames: usize, plane: usize) -> Vec<f32> {
    let mut out = images[..frames * 3 * plane].to_vec();
    for (i, v) in out.iter_mut().enumerate() {
        let ch = (i / plane) % 3;
        *v = (*v - IMAGENET_MEAN[ch]) / IMAGENET_STD[ch];
    }
    out
}
