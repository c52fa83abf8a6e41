//! Model configuration. `Default` is the released checkpoint (`lingbot-map-long.pt`); every size
//! is a field so the tiny parity configuration and the real one run through the same code.
//!
//! The JSON form uses the same keys as the parity fixtures' `config.json` (`embed`, `heads`,
//! `depth`, `taps`, ...), so those files load as they are; unknown keys (the call schedule, the
//! parameter list) are ignored and missing keys take the released checkpoint's value.
//! Sizes that tensor shapes determine can be re-derived from a weights file with
//! [`ModelConfig::infer_from_weights`]; head counts cannot and always come from the config.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{ModelError, Result};
use super::spec::{AGGREGATOR_REGISTERS, DINO_REGISTERS, PATCH, POSE_ENC_LEN};
use super::weights::WeightStore;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Square image size the DINO position table was trained at; also the default input width.
    pub img_size: usize,
    /// Patch size in pixels.
    pub patch: usize,
    /// Token width `C` of DINO and the aggregator.
    pub embed: usize,
    /// Attention heads of DINO and of the aggregator blocks.
    pub heads: usize,
    /// Aggregator depth: number of frame blocks (= number of global blocks).
    pub depth: usize,
    /// Aggregator block indices whose outputs feed the heads (4 of them).
    pub taps: Vec<usize>,
    /// DINO transformer blocks.
    pub dino_depth: usize,
    /// Camera head attention heads (its width is `2 * embed`).
    pub cam_heads: usize,
    /// Camera head trunk blocks.
    pub cam_trunk: usize,
    /// Camera head refinement iterations.
    pub cam_iters: usize,
    /// DPT fusion width.
    pub dpt_features: usize,
    /// DPT per-tap projection widths.
    pub dpt_out: Vec<usize>,
    /// MLP hidden width as a multiple of the block width (all transformer blocks).
    pub mlp_ratio: usize,
    /// Scale (anchor) frames of phase 1, kept in the cache forever.
    pub scale_frames: usize,
    /// Sliding window of keyframes kept in full in the cache.
    pub window: usize,
    /// Length of the 3D RoPE temporal table: committed frames + frames in a call must fit.
    pub max_frame_num: usize,
    /// Every `keyframe_interval`-th streaming frame after the scale frames is a keyframe.
    pub keyframe_interval: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            img_size: 518,
            patch: PATCH,
            embed: 1024,
            heads: 16,
            depth: 24,
            taps: vec![4, 11, 17, 23],
            dino_depth: 24,
            cam_heads: 16,
            cam_trunk: 4,
            cam_iters: 4,
            dpt_features: 256,
            dpt_out: vec![256, 512, 1024, 1024],
            mlp_ratio: 4,
            scale_frames: 8,
            window: 64,
            max_frame_num: 1024,
            keyframe_interval: 1,
        }
    }
}

impl ModelConfig {
    /// The parity fixtures' tiny configuration (`gct-tiny`), also used for `--random-weights tiny`.
    pub fn tiny() -> Self {
        ModelConfig {
            img_size: 70,
            patch: PATCH,
            embed: 128,
            heads: 2,
            depth: 6,
            taps: vec![1, 3, 4, 5],
            dino_depth: 2,
            cam_heads: 4,
            cam_trunk: 2,
            cam_iters: 4,
            dpt_features: 32,
            dpt_out: vec![16, 32, 64, 64],
            mlp_ratio: 4,
            scale_frames: 2,
            window: 3,
            max_frame_num: 64,
            keyframe_interval: 1,
        }
    }

    pub fn from_json_str(text: &str, source_name: &str) -> Result<Self> {
        let bad = |reason: String| ModelError::BadConfig {
            source_name: source_name.to_owned(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        // serde reads a struct from an array too (fields by position): a config is an object.
        if !value.is_object() {
            return Err(bad(format!(
                "expected a JSON object of model settings (\"embed\": …), found {}",
                json_kind(&value)
            )));
        }
        let cfg: ModelConfig = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        cfg.validate(source_name)?;
        Ok(cfg)
    }

    pub fn from_json_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn head_dim(&self) -> usize {
        self.embed / self.heads.max(1)
    }
    /// Width of the heads' input: frame and global block outputs concatenated.
    pub fn head_input_dim(&self) -> usize {
        2 * self.embed
    }
    pub fn cam_head_dim(&self) -> usize {
        self.head_input_dim() / self.cam_heads.max(1)
    }
    /// Side of the square DINO position grid stored in the weights.
    pub fn pos_grid(&self) -> usize {
        self.img_size / self.patch.max(1)
    }

    /// Check the relations the model relies on; every failure names the field.
    pub fn validate(&self, source_name: &str) -> Result<()> {
        let bad = |reason: String| {
            Err(ModelError::BadConfig {
                source_name: source_name.to_owned(),
                reason,
            })
        };
        let positive = [
            ("img_size", self.img_size),
            ("patch", self.patch),
            ("embed", self.embed),
            ("heads", self.heads),
            ("depth", self.depth),
            ("dino_depth", self.dino_depth),
            ("cam_heads", self.cam_heads),
            ("cam_trunk", self.cam_trunk),
            ("cam_iters", self.cam_iters),
            ("dpt_features", self.dpt_features),
            ("mlp_ratio", self.mlp_ratio),
            ("scale_frames", self.scale_frames),
            ("max_frame_num", self.max_frame_num),
            ("keyframe_interval", self.keyframe_interval),
        ];
        for (name, v) in positive {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        if !self.embed.is_multiple_of(self.heads) {
            return bad(format!(
                "`embed` {} is not divisible by `heads` {}",
                self.embed, self.heads
            ));
        }
        if self.head_dim() != 64 {
            return bad(format!(
                "head dim embed/heads = {} but the 3D RoPE split (20/22/22) needs 64",
                self.head_dim()
            ));
        }
        if !self.head_input_dim().is_multiple_of(self.cam_heads) {
            return bad(format!(
                "camera head width {} is not divisible by `cam_heads` {}",
                self.head_input_dim(),
                self.cam_heads
            ));
        }
        if self.taps.len() != 4 || self.taps.iter().any(|&t| t >= self.depth) {
            return bad(format!(
                "`taps` must be 4 block indices below depth {}, got {:?}",
                self.depth, self.taps
            ));
        }
        if self.dpt_out.len() != 4 || self.dpt_out.iter().any(|&c| c == 0 || !c.is_multiple_of(4)) {
            return bad(format!(
                "`dpt_out` must be 4 positive multiples of 4, got {:?}",
                self.dpt_out
            ));
        }
        if !self.dpt_features.is_multiple_of(8) {
            return bad("`dpt_features` must be a multiple of 8".into());
        }
        if !self.img_size.is_multiple_of(self.patch) {
            return bad(format!(
                "`img_size` {} is not a multiple of `patch` {}",
                self.img_size, self.patch
            ));
        }
        Ok(())
    }

    /// Re-derive every size that tensor shapes fix (width, depths, DPT widths, patch, position
    /// grid) from a weights store; head counts, taps and streaming settings are kept. The
    /// result is not validated (see [`ModelConfig::validate`]).
    pub fn infer_from_weights(&self, store: &WeightStore) -> Result<Self> {
        let src = store.source().display().to_string();
        let need = |name: &str| -> Result<Vec<usize>> {
            store
                .shape(name)
                .map(<[usize]>::to_vec)
                .ok_or_else(|| ModelError::MissingTensor {
                    path: store.source().to_owned(),
                    name: name.to_owned(),
                })
        };
        let count_blocks = |prefix: &str| {
            let mut n = 0;
            while store.shape(&format!("{prefix}.{n}.norm1.weight")).is_some() {
                n += 1;
            }
            n
        };
        let mut cfg = self.clone();
        let cam = need("aggregator.camera_token")?;
        cfg.embed = *cam.last().unwrap_or(&0);
        let proj = need("aggregator.patch_embed.patch_embed.proj.weight")?;
        cfg.patch = proj.get(2).copied().unwrap_or(0);
        let pos = need("aggregator.patch_embed.pos_embed")?;
        let grid_tokens = pos.get(1).copied().unwrap_or(0).saturating_sub(1);
        let side = (grid_tokens as f64).sqrt().round() as usize;
        if side * side != grid_tokens {
            return Err(ModelError::BadConfig {
                source_name: src,
                reason: format!("pos_embed holds {grid_tokens} grid tokens, not a square"),
            });
        }
        cfg.img_size = side * cfg.patch;
        cfg.depth = count_blocks("aggregator.frame_blocks");
        cfg.dino_depth = count_blocks("aggregator.patch_embed.blocks");
        cfg.cam_trunk = count_blocks("camera_head.trunk");
        cfg.dpt_features = need("depth_head.scratch.layer1_rn.weight")?[0];
        for (i, slot) in cfg.dpt_out.iter_mut().enumerate() {
            *slot = need(&format!("depth_head.projects.{i}.weight"))?[0];
        }
        let fc1 = need("aggregator.frame_blocks.0.mlp.fc1.weight")?;
        if let Some(ratio) = fc1[0].checked_div(cfg.embed) {
            cfg.mlp_ratio = ratio;
        }
        // Not validated here: the caller compares first (a mismatch is the clearer message)
        // and the model validates when it is built.
        Ok(cfg)
    }

    /// Every parameter the model reads, with its shape, in checkpoint order. Used to make
    /// random weights and to describe what a checkpoint must contain.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let c = self.embed;
        let hid = c * self.mlp_ratio;
        let hd = self.head_dim();
        let grid = self.pos_grid();
        let mut p: Vec<(String, Vec<usize>)> = Vec::new();
        let mut push = |name: String, shape: Vec<usize>| p.push((name, shape));
        push("aggregator.camera_token".into(), vec![1, 2, 1, c]);
        push(
            "aggregator.register_token".into(),
            vec![1, 2, AGGREGATOR_REGISTERS, c],
        );
        push("aggregator.scale_token".into(), vec![1, 2, 1, c]);
        let d = "aggregator.patch_embed";
        push(format!("{d}.cls_token"), vec![1, 1, c]);
        push(format!("{d}.pos_embed"), vec![1, 1 + grid * grid, c]);
        push(format!("{d}.register_tokens"), vec![1, DINO_REGISTERS, c]);
        push(format!("{d}.mask_token"), vec![1, c]);
        push(
            format!("{d}.patch_embed.proj.weight"),
            vec![c, 3, self.patch, self.patch],
        );
        push(format!("{d}.patch_embed.proj.bias"), vec![c]);
        let block = |push: &mut dyn FnMut(String, Vec<usize>), pre: String, qk_norm: bool| {
            push(format!("{pre}.norm1.weight"), vec![c]);
            push(format!("{pre}.norm1.bias"), vec![c]);
            push(format!("{pre}.attn.qkv.weight"), vec![3 * c, c]);
            push(format!("{pre}.attn.qkv.bias"), vec![3 * c]);
            if qk_norm {
                for n in ["q_norm", "k_norm"] {
                    push(format!("{pre}.attn.{n}.weight"), vec![hd]);
                    push(format!("{pre}.attn.{n}.bias"), vec![hd]);
                }
            }
            push(format!("{pre}.attn.proj.weight"), vec![c, c]);
            push(format!("{pre}.attn.proj.bias"), vec![c]);
            push(format!("{pre}.ls1.gamma"), vec![c]);
            push(format!("{pre}.norm2.weight"), vec![c]);
            push(format!("{pre}.norm2.bias"), vec![c]);
            push(format!("{pre}.mlp.fc1.weight"), vec![hid, c]);
            push(format!("{pre}.mlp.fc1.bias"), vec![hid]);
            push(format!("{pre}.mlp.fc2.weight"), vec![c, hid]);
            push(format!("{pre}.mlp.fc2.bias"), vec![c]);
            push(format!("{pre}.ls2.gamma"), vec![c]);
        };
        for i in 0..self.dino_depth {
            block(&mut push, format!("{d}.blocks.{i}"), false);
        }
        push(format!("{d}.norm.weight"), vec![c]);
        push(format!("{d}.norm.bias"), vec![c]);
        for kind in ["frame_blocks", "global_blocks"] {
            for i in 0..self.depth {
                block(&mut push, format!("aggregator.{kind}.{i}"), true);
            }
        }
        let w = self.head_input_dim();
        let whid = w * self.mlp_ratio;
        push(
            "camera_head.empty_pose_tokens".into(),
            vec![1, 1, POSE_ENC_LEN],
        );
        for j in 0..self.cam_trunk {
            let pre = format!("camera_head.trunk.{j}");
            push(format!("{pre}.norm1.weight"), vec![w]);
            push(format!("{pre}.norm1.bias"), vec![w]);
            push(format!("{pre}.attn.qkv.weight"), vec![3 * w, w]);
            push(format!("{pre}.attn.qkv.bias"), vec![3 * w]);
            push(format!("{pre}.attn.proj.weight"), vec![w, w]);
            push(format!("{pre}.attn.proj.bias"), vec![w]);
            push(format!("{pre}.ls1.gamma"), vec![w]);
            push(format!("{pre}.norm2.weight"), vec![w]);
            push(format!("{pre}.norm2.bias"), vec![w]);
            push(format!("{pre}.mlp.fc1.weight"), vec![whid, w]);
            push(format!("{pre}.mlp.fc1.bias"), vec![whid]);
            push(format!("{pre}.mlp.fc2.weight"), vec![w, whid]);
            push(format!("{pre}.mlp.fc2.bias"), vec![w]);
            push(format!("{pre}.ls2.gamma"), vec![w]);
        }
        for n in ["token_norm", "trunk_norm"] {
            push(format!("camera_head.{n}.weight"), vec![w]);
            push(format!("camera_head.{n}.bias"), vec![w]);
        }
        push(
            "camera_head.embed_pose.weight".into(),
            vec![w, POSE_ENC_LEN],
        );
        push("camera_head.embed_pose.bias".into(), vec![w]);
        push(
            "camera_head.poseLN_modulation.1.weight".into(),
            vec![3 * w, w],
        );
        push("camera_head.poseLN_modulation.1.bias".into(), vec![3 * w]);
        push("camera_head.pose_branch.fc1.weight".into(), vec![w / 2, w]);
        push("camera_head.pose_branch.fc1.bias".into(), vec![w / 2]);
        push(
            "camera_head.pose_branch.fc2.weight".into(),
            vec![POSE_ENC_LEN, w / 2],
        );
        push(
            "camera_head.pose_branch.fc2.bias".into(),
            vec![POSE_ENC_LEN],
        );
        let f = self.dpt_features;
        let o = &self.dpt_out;
        push("depth_head.norm.weight".into(), vec![w]);
        push("depth_head.norm.bias".into(), vec![w]);
        for (i, &oc) in o.iter().enumerate() {
            push(format!("depth_head.projects.{i}.weight"), vec![oc, w, 1, 1]);
            push(format!("depth_head.projects.{i}.bias"), vec![oc]);
        }
        push(
            "depth_head.resize_layers.0.weight".into(),
            vec![o[0], o[0], 4, 4],
        );
        push("depth_head.resize_layers.0.bias".into(), vec![o[0]]);
        push(
            "depth_head.resize_layers.1.weight".into(),
            vec![o[1], o[1], 2, 2],
        );
        push("depth_head.resize_layers.1.bias".into(), vec![o[1]]);
        push(
            "depth_head.resize_layers.3.weight".into(),
            vec![o[3], o[3], 3, 3],
        );
        push("depth_head.resize_layers.3.bias".into(), vec![o[3]]);
        for (i, &oc) in o.iter().enumerate() {
            push(
                format!("depth_head.scratch.layer{}_rn.weight", i + 1),
                vec![f, oc, 3, 3],
            );
        }
        for r in 1..=4 {
            let pre = format!("depth_head.scratch.refinenet{r}");
            push(format!("{pre}.out_conv.weight"), vec![f, f, 1, 1]);
            push(format!("{pre}.out_conv.bias"), vec![f]);
            let units: &[usize] = if r == 4 { &[2] } else { &[1, 2] };
            for u in units {
                for cv in 1..=2 {
                    push(
                        format!("{pre}.resConfUnit{u}.conv{cv}.weight"),
                        vec![f, f, 3, 3],
                    );
                    push(format!("{pre}.resConfUnit{u}.conv{cv}.bias"), vec![f]);
                }
            }
        }
        push(
            "depth_head.scratch.output_conv1.weight".into(),
            vec![f / 2, f, 3, 3],
        );
        push("depth_head.scratch.output_conv1.bias".into(), vec![f / 2]);
        push(
            "depth_head.scratch.output_conv2.0.weight".into(),
            vec![32, f / 2, 3, 3],
        );
        push("depth_head.scratch.output_conv2.0.bias".into(), vec![32]);
        push(
            "depth_head.scratch.output_conv2.2.weight".into(),
            vec![2, 32, 1, 1],
        );
        push("depth_head.scratch.output_conv2.2.bias".into(), vec![2]);
        p
    }
}

/// What a JSON value is, for a message.
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_checkpoint_parameter_count() {
        let shapes = ModelConfig::default().parameter_shapes();
        assert_eq!(shapes.len(), 1342);
        let total: usize = shapes
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        assert_eq!(total, 1_157_943_540);
    }

    #[test]
    fn rejects_inconsistent_heads() {
        let text = r#"{"embed": 128, "heads": 3}"#;
        assert!(ModelConfig::from_json_str(text, "test").is_err());
    }
}
