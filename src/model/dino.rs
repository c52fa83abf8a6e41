//! The DINOv2 ViT (with 4 registers) that turns each frame into patch tokens. Frames are
//! independent here; only the aggregator mixes them.

use super::block::{BlockSpec, TransformerBlock};
use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::loading::{MatLinear, Norm, layer_norm};
use super::ops::attention::{AttentionShape, attend};
use super::ops::conv::FeatureMap;
use super::ops::linear::Linear;
use super::ops::resize::resize_bicubic_aa;
use super::spec::DINO_REGISTERS;
use super::storage::{Host, Loader, Storage};

pub struct DinoBackbone<S: Storage = Host> {
    /// The 14×14 stride-14 patch convolution as a linear map over flattened `[3][14][14]` patches.
    pub(crate) patch_proj: MatLinear<S>,
    pub(crate) cls_token: S::Full,
    /// `[1 + grid²][C]`: the cls entry, then the square training grid row-major. Kept on the
    /// host by every storage: it is resized on the CPU once per input size.
    pub(crate) pos_embed: Vec<f32>,
    pub(crate) register_tokens: S::Full,
    pub(crate) blocks: Vec<TransformerBlock<S>>,
    pub(crate) norm: Norm<S>,
    pub(crate) embed: usize,
    pub(crate) patch: usize,
    pub(crate) grid: usize,
}

impl<S: Storage> DinoBackbone<S> {
    pub fn load(store: &mut Loader<S>, cfg: &ModelConfig) -> Result<Self> {
        let c = cfg.embed;
        let p = cfg.patch;
        let grid = cfg.pos_grid();
        let pre = "aggregator.patch_embed";
        let patch_proj = Linear {
            weight: store.matrix(&format!("{pre}.patch_embed.proj.weight"), &[c, 3, p, p])?,
            bias: Some(store.bias(&format!("{pre}.patch_embed.proj.bias"), &[c])?),
            in_features: 3 * p * p,
            out_features: c,
        };
        let spec = BlockSpec {
            dim: c,
            hidden: c * cfg.mlp_ratio,
            heads: cfg.heads,
            eps: 1e-6,
            qk_norm: false,
        };
        let blocks = (0..cfg.dino_depth)
            .map(|i| TransformerBlock::load(store, &format!("{pre}.blocks.{i}"), &spec))
            .collect::<Result<Vec<_>>>()?;
        // Unused at inference (masked-image training only); claimed so it is not "extra".
        store.claim(&format!("{pre}.mask_token"), &[1, c])?;
        Ok(DinoBackbone {
            patch_proj,
            cls_token: store.full(&format!("{pre}.cls_token"), &[1, 1, c])?,
            pos_embed: store.host(&format!("{pre}.pos_embed"), &[1, 1 + grid * grid, c])?,
            register_tokens: store
                .full(&format!("{pre}.register_tokens"), &[1, DINO_REGISTERS, c])?,
            blocks,
            norm: layer_norm(store, &format!("{pre}.norm"), c, 1e-6)?,
            embed: c,
            patch: p,
            grid,
        })
    }

    /// The position table for a `ph × pw` patch grid, `[1 + ph·pw][C]`: the stored grid resized
    /// with antialiased bicubic (PyTorch `interpolate(mode="bicubic", antialias=True)` with an
    /// explicit size), the cls entry unchanged.
    pub fn position_table(&self, ph: usize, pw: usize) -> Vec<f32> {
        let c = self.embed;
        let g = self.grid;
        let mut out = Vec::with_capacity((1 + ph * pw) * c);
        out.extend_from_slice(&self.pos_embed[..c]);
        if ph == g && pw == g {
            out.extend_from_slice(&self.pos_embed[c..]);
            return out;
        }
        // [grid²][C] → [C][grid][grid], resize, back to [ph·pw][C].
        let mut planes = FeatureMap::zeros(c, g, g);
        for t in 0..g * g {
            for ch in 0..c {
                planes.data[ch * g * g + t] = self.pos_embed[(1 + t) * c + ch];
            }
        }
        let resized = resize_bicubic_aa(&planes, ph, pw, false);
        let np = ph * pw;
        let start = out.len();
        out.resize(start + np * c, 0.0);
        for t in 0..np {
            for ch in 0..c {
                out[start + t * c + ch] = resized.data[ch * np + t];
            }
        }
        out
    }
}

impl DinoBackbone {
    /// Normalised patch tokens `[S][Np][C]` of ImageNet-normalised images `[S][3][H][W]`.
    pub fn forward(
        &self,
        images: &[f32],
        frames: usize,
        height: usize,
        width: usize,
    ) -> Result<Vec<f32>> {
        let (c, p) = (self.embed, self.patch);
        if !height.is_multiple_of(p) || !width.is_multiple_of(p) {
            return Err(ModelError::BadInput(format!(
                "image {width}×{height} is not a multiple of the patch size {p}"
            )));
        }
        let (ph, pw) = (height / p, width / p);
        let np = ph * pw;
        let patch_len = 3 * p * p;
        // Flatten every patch as [channel][ky][kx], matching the conv weight layout.
        let mut patches = vec![0.0f32; frames * np * patch_len];
        for s in 0..frames {
            let img = &images[s * 3 * height * width..(s + 1) * 3 * height * width];
            for r in 0..ph {
                for col in 0..pw {
                    let dst = &mut patches[((s * np) + r * pw + col) * patch_len..][..patch_len];
                    for ch in 0..3 {
                        for ky in 0..p {
                            let src = &img[(ch * height + r * p + ky) * width + col * p..][..p];
                            dst[(ch * p + ky) * p..][..p].copy_from_slice(src);
                        }
                    }
                }
            }
        }
        let embedded = self.patch_proj.forward(&patches, frames * np);
        let pos = self.position_table(ph, pw);
        // Sequence per frame: [cls + pos0, registers (no position), patches + pos].
        let seq = 1 + DINO_REGISTERS + np;
        let mut x = vec![0.0f32; frames * seq * c];
        for s in 0..frames {
            let f = &mut x[s * seq * c..(s + 1) * seq * c];
            for i in 0..c {
                f[i] = self.cls_token[i] + pos[i];
            }
            f[c..(1 + DINO_REGISTERS) * c].copy_from_slice(&self.register_tokens);
            for t in 0..np {
                let dst = &mut f[(1 + DINO_REGISTERS + t) * c..][..c];
                let src = &embedded[(s * np + t) * c..][..c];
                let pe = &pos[(1 + t) * c..][..c];
                for i in 0..c {
                    dst[i] = src[i] + pe[i];
                }
            }
        }
        let shape = AttentionShape {
            queries: seq,
            keys: seq,
            heads: self.blocks.first().map_or(1, |b| b.heads),
            head_dim: self.blocks.first().map_or(c, |b| b.head_dim),
        };
        for block in &self.blocks {
            let qkv = block.qkv(&x, frames * seq);
            let mut attn = vec![0.0f32; frames * seq * c];
            for s in 0..frames {
                let r = s * seq * c..(s + 1) * seq * c;
                attend(
                    &qkv.q[r.clone()],
                    &qkv.k[r.clone()],
                    &qkv.v[r.clone()],
                    &shape,
                    &mut attn[r],
                );
            }
            block.finish(&mut x, &attn, frames * seq);
        }
        self.norm.forward_in_place(&mut x);
        let mut out = Vec::with_capacity(frames * np * c);
        for s in 0..frames {
            out.extend_from_slice(&x[(s * seq + 1 + DINO_REGISTERS) * c..(s + 1) * seq * c]);
        }
        Ok(out)
    }
}
