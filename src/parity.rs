//! Parity of the CPU model against the reference: replay a fixture's call schedule through
//! the model and compare every tensor it produces (outputs, intermediates, KV cache state)
//! with the reference's own (`streamrecon parity`, and the fixture tests).
//!
//! Tolerances (see docs/model.md): blocks, poses, cache contents and other intermediates within
//! `1e-4·(1 + |ref|)`; depth, confidence and world points within `1e-3·|ref|` (relative), with a
//! floor of `1e-5·max|ref|` (world coordinates cross zero, where a pure relative bound would
//! demand exactness from the pose's absolute rounding); integer tensors exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::attention::AttentionLayout;
use crate::kvcache::CacheError;
use crate::model::weights::WeightStore;
use crate::model::weights::safetensors_file::read_safetensors_any;
use crate::model::{GctModel, ModelConfig, ModelError, Recorder};

/// Why a parity run could not happen (a tensor out of tolerance is a result, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: call schedule (H, W, calls): {source}")]
    Schedule {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("unknown random-weights preset `{0}` (use full or tiny)")]
    UnknownPreset(String),
    #[error("weights {path}: {source}")]
    Weights {
        path: PathBuf,
        #[source]
        source: ModelError,
    },
    #[error(
        "weights {weights} do not fit the scenario config {config}: the tensors imply {difference}"
    )]
    WeightsDoNotFit {
        weights: PathBuf,
        config: PathBuf,
        difference: String,
    },
    #[error("inputs.safetensors has no `images` tensor")]
    NoImages,
    #[error("`images` has shape {shape:?}, expected [1, S, 3, {height}, {width}]")]
    ImageShape {
        shape: Vec<usize>,
        height: usize,
        width: usize,
    },
    #[error("call {call}: frames {start}..{end} outside the {total} input frames")]
    CallOutOfRange {
        call: usize,
        start: usize,
        end: usize,
        total: usize,
    },
}

/// How a tensor is judged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ToleranceClass {
    /// `|a − r| ≤ 1e-4·(1 + |r|)`.
    Block,
    /// `|a − r| ≤ 1e-3·|r| + 1e-5·max|r|`.
    Dense,
    /// Exactly equal.
    Exact,
}

impl ToleranceClass {
    pub fn for_name(name: &str) -> Self {
        let base = name.rsplit('.').next().unwrap_or(name);
        match base {
            "frame_type" | "total_frames_processed" => ToleranceClass::Exact,
            "depth" | "depth_conf" | "world_points" | "world_points_conf" => ToleranceClass::Dense,
            _ => ToleranceClass::Block,
        }
    }
    fn allowed(self, reference: f64, max_ref: f64) -> f64 {
        match self {
            ToleranceClass::Block => 1e-4 * (1.0 + reference.abs()),
            ToleranceClass::Dense => 1e-3 * reference.abs() + 1e-5 * max_ref,
            ToleranceClass::Exact => 0.0,
        }
    }
}

/// One row of the parity table.
#[derive(Clone, Debug)]
pub struct TensorComparison {
    pub name: String,
    pub shape: Vec<usize>,
    pub class: ToleranceClass,
    pub max_abs: f64,
    /// Largest `|a − r| / |r|` over entries with `|r| ≥ 1e-3·max|r|` (tiny references excluded).
    pub max_rel: f64,
    /// Largest error as a fraction of its allowance (≤ 1 passes).
    pub worst_ratio: f64,
    pub pass: bool,
    /// Set when the shapes differ or the model did not produce the tensor.
    pub problem: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct ParityReport {
    pub rows: Vec<TensorComparison>,
}

impl ParityReport {
    pub fn failures(&self) -> usize {
        self.rows.iter().filter(|r| !r.pass).count()
    }
    pub fn worst(&self) -> Option<&TensorComparison> {
        self.rows
            .iter()
            .max_by(|a, b| a.worst_ratio.total_cmp(&b.worst_ratio))
    }
    pub fn worst_abs(&self) -> Option<&TensorComparison> {
        self.rows
            .iter()
            .max_by(|a, b| a.max_abs.total_cmp(&b.max_abs))
    }
}

/// Where the weights come from.
#[derive(Clone, Debug)]
pub enum WeightsChoice {
    File(PathBuf),
    Hub,
    Random { preset: String, seed: u64 },
}

#[derive(Debug, serde::Deserialize)]
struct CallSpec {
    start: u64,
    end: u64,
    keyframe: bool,
}

#[derive(Debug, serde::Deserialize)]
struct ScenarioSchedule {
    #[serde(rename = "H")]
    height: usize,
    #[serde(rename = "W")]
    width: usize,
    calls: Vec<CallSpec>,
}

type Named = BTreeMap<String, (Vec<usize>, Vec<f64>)>;

fn read_named(path: &Path) -> Result<Named, ParityError> {
    Ok(read_safetensors_any(path)?
        .into_iter()
        .map(|(n, s, d)| (n, (s, d)))
        .collect())
}

pub fn load_weights(choice: &WeightsChoice, cfg: &ModelConfig) -> Result<WeightStore, ModelError> {
    Ok(match choice {
        WeightsChoice::File(p) => WeightStore::load(p)?,
        WeightsChoice::Hub => {
            let path = crate::model::weights::hub::download_default()?;
            WeightStore::load(&path)?
        }
        WeightsChoice::Random { seed, .. } => {
            crate::model::weights::random::random_store(cfg, *seed)?
        }
    })
}

/// Replay a scenario and compare. Errors only when the run itself cannot happen.
pub fn run_parity(
    scenario: &Path,
    weights: &WeightsChoice,
    layout: AttentionLayout,
) -> Result<ParityReport, ParityError> {
    let config_path = scenario.join("config.json");
    let cfg = ModelConfig::from_json_file(&config_path)?;
    let text = std::fs::read_to_string(&config_path).map_err(|source| ParityError::Read {
        path: config_path.clone(),
        source,
    })?;
    let schedule: ScenarioSchedule =
        serde_json::from_str(&text).map_err(|source| ParityError::Schedule {
            path: config_path.clone(),
            source,
        })?;

    let cfg = match weights {
        WeightsChoice::Random { preset, .. } => match preset.as_str() {
            "tiny" => cfg,
            "full" => ModelConfig {
                scale_frames: cfg.scale_frames,
                window: cfg.window,
                ..ModelConfig::default()
            },
            other => return Err(ParityError::UnknownPreset(other.to_owned())),
        },
        _ => cfg,
    };
    let store = load_weights(weights, &cfg)?;
    // Sizes the tensors fix must agree with the scenario's config: say so plainly rather than
    // failing on the first mismatching tensor.
    let inferred = cfg
        .infer_from_weights(&store)
        .map_err(|source| ParityError::Weights {
            path: store.source().to_path_buf(),
            source,
        })?;
    if inferred != cfg {
        return Err(ParityError::WeightsDoNotFit {
            weights: store.source().to_path_buf(),
            config: config_path,
            difference: describe_size_difference(&cfg, &inferred),
        });
    }
    let model = GctModel::from_store(cfg.clone(), store)?;

    let inputs = read_named(&scenario.join("inputs.safetensors"))?;
    let (img_shape, images) = inputs.get("images").ok_or(ParityError::NoImages)?;
    let (h, w) = (schedule.height, schedule.width);
    if img_shape.len() != 5 || img_shape[2] != 3 || img_shape[3] != h || img_shape[4] != w {
        return Err(ParityError::ImageShape {
            shape: img_shape.clone(),
            height: h,
            width: w,
        });
    }
    let total = img_shape[1];
    let images: Vec<f32> = images.iter().map(|&v| v as f32).collect();

    let outputs_ref = read_named(&scenario.join("outputs.safetensors"))?;
    let inter_ref = read_named(&scenario.join("intermediates.safetensors"))?;
    let kv_ref = read_named(&scenario.join("kv_state.safetensors"))?;

    let mut produced: Named = BTreeMap::new();
    let mut state = model.new_stream(h, w, layout)?;
    let plane = h * w;
    let mut pose_enc = Vec::new();
    let mut depth = Vec::new();
    let mut conf = Vec::new();
    let mut extr = Vec::new();
    let mut intr = Vec::new();
    let mut points = Vec::new();
    let mut frame_type = Vec::new();
    for (ci, call) in schedule.calls.iter().enumerate() {
        let (a, b) = (call.start as usize, call.end as usize);
        if b > total || a >= b {
            return Err(ParityError::CallOutOfRange {
                call: ci,
                start: a,
                end: b,
                total,
            });
        }
        let mut rec = Recorder::default();
        let out = model.step(
            &mut state,
            &images[a * 3 * plane..b * 3 * plane],
            call.start..call.end,
            call.keyframe,
            Some(&mut rec),
        )?;
        let prefix = format!("call{ci:02}.");
        for (name, t) in rec.tensors {
            produced.insert(
                format!("{prefix}{name}"),
                (t.shape, t.data.iter().map(|&v| v as f64).collect()),
            );
        }
        // Cache state after the call, for the layers the fixture holds.
        let layers: Vec<usize> = kv_ref
            .keys()
            .filter_map(|n| n.strip_prefix(&prefix))
            .filter_map(|n| n.strip_prefix("k_"))
            .filter_map(|n| n.parse::<usize>().ok())
            .collect();
        for layer in layers {
            let st = state.cache.layer_state(layer)?;
            let (heads, hd) = (cfg.heads, cfg.head_dim());
            let p =
                st.k.len()
                    .checked_div(st.live_frames.len() * heads * hd)
                    .unwrap_or(0);
            let f = st.live_frames.len();
            let to_ref = |src: &[f32], frames: usize, tokens: usize| -> Vec<f64> {
                // [F][T][H][D] → [H][F][T][D]
                let mut out = vec![0.0f64; src.len()];
                for fr in 0..frames {
                    for t in 0..tokens {
                        for hh in 0..heads {
                            for d in 0..hd {
                                out[((hh * frames + fr) * tokens + t) * hd + d] =
                                    src[((fr * tokens + t) * heads + hh) * hd + d] as f64;
                            }
                        }
                    }
                }
                out
            };
            produced.insert(
                format!("{prefix}k_{layer}"),
                (vec![1, heads, f, p, hd], to_ref(&st.k, f, p)),
            );
            produced.insert(
                format!("{prefix}v_{layer}"),
                (vec![1, heads, f, p, hd], to_ref(&st.v, f, p)),
            );
            let e = st.evicted_frames.len();
            if e > 0 {
                let sp = st.special_k.len() / (e * heads * hd);
                produced.insert(
                    format!("{prefix}k_{layer}_special"),
                    (vec![1, heads, e, sp, hd], to_ref(&st.special_k, e, sp)),
                );
                produced.insert(
                    format!("{prefix}v_{layer}_special"),
                    (vec![1, heads, e, sp, hd], to_ref(&st.special_v, e, sp)),
                );
            }
        }
        produced.insert(
            format!("{prefix}total_frames_processed"),
            (vec![1], vec![state.committed_frames() as f64]),
        );
        pose_enc.extend(out.pose_enc.iter().map(|&v| v as f64));
        depth.extend(out.depth.iter().map(|&v| v as f64));
        conf.extend(out.depth_conf.iter().map(|&v| v as f64));
        points.extend(out.world_points.iter().map(|&v| v as f64));
        for cam in &out.cameras {
            extr.extend(cam.world_from_camera.iter().flatten().map(|&v| v as f64));
            intr.extend(cam.intrinsics.iter().flatten().map(|&v| v as f64));
        }
        let kind = if ci == 0 {
            0.0
        } else if call.keyframe {
            1.0
        } else {
            2.0
        };
        frame_type.extend(std::iter::repeat_n(kind, b - a));
    }
    let s = frame_type.len();
    produced.insert("pose_enc".into(), (vec![1, s, 9], pose_enc));
    produced.insert("depth".into(), (vec![1, s, h, w, 1], depth));
    produced.insert("depth_conf".into(), (vec![1, s, h, w], conf.clone()));
    produced.insert("world_points_conf".into(), (vec![1, s, h, w], conf));
    produced.insert("extrinsic_c2w".into(), (vec![1, s, 3, 4], extr));
    produced.insert("intrinsic".into(), (vec![1, s, 3, 3], intr));
    produced.insert("world_points".into(), (vec![1, s, h, w, 3], points));
    produced.insert("frame_type".into(), (vec![s], frame_type));

    let mut report = ParityReport::default();
    for reference in [&outputs_ref, &inter_ref, &kv_ref] {
        for (name, (shape, data)) in reference {
            report
                .rows
                .push(compare(name, shape, data, produced.get(name)));
        }
    }
    Ok(report)
}

fn describe_size_difference(cfg: &ModelConfig, inferred: &ModelConfig) -> String {
    let fields = [
        ("embed", cfg.embed, inferred.embed),
        ("depth", cfg.depth, inferred.depth),
        ("dino_depth", cfg.dino_depth, inferred.dino_depth),
        ("cam_trunk", cfg.cam_trunk, inferred.cam_trunk),
        ("dpt_features", cfg.dpt_features, inferred.dpt_features),
        ("img_size", cfg.img_size, inferred.img_size),
        ("patch", cfg.patch, inferred.patch),
        ("mlp_ratio", cfg.mlp_ratio, inferred.mlp_ratio),
    ];
    let mut parts: Vec<String> = fields
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(n, a, b)| format!("{n} {b} (config: {a})"))
        .collect();
    if cfg.dpt_out != inferred.dpt_out {
        parts.push(format!(
            "dpt_out {:?} (config: {:?})",
            inferred.dpt_out, cfg.dpt_out
        ));
    }
    parts.join(", ")
}

fn compare(
    name: &str,
    shape: &[usize],
    reference: &[f64],
    ours: Option<&(Vec<usize>, Vec<f64>)>,
) -> TensorComparison {
    let class = ToleranceClass::for_name(name);
    let mut row = TensorComparison {
        name: name.to_owned(),
        shape: shape.to_vec(),
        class,
        max_abs: f64::INFINITY,
        max_rel: f64::INFINITY,
        worst_ratio: f64::INFINITY,
        pass: false,
        problem: None,
    };
    let Some((our_shape, ours)) = ours else {
        row.problem = Some("not produced by the model".into());
        return row;
    };
    if our_shape.as_slice() != shape {
        row.problem = Some(format!("shape {our_shape:?}, reference {shape:?}"));
        return row;
    }
    let max_ref = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (mut max_abs, mut max_rel, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &r) in ours.iter().zip(reference) {
        let err = (a - r).abs();
        let err = if err.is_nan() { f64::INFINITY } else { err };
        max_abs = max_abs.max(err);
        if r.abs() >= 1e-3 * max_ref && r != 0.0 {
            max_rel = max_rel.max(err / r.abs());
        }
        let allowed = class.allowed(r, max_ref);
        let ratio = if allowed > 0.0 {
            err / allowed
        } else if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        worst = worst.max(ratio);
    }
    row.max_abs = max_abs;
    row.max_rel = max_rel;
    row.worst_ratio = worst;
    row.pass = worst <= 1.0;
    row
}
