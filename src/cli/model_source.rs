//! Building the model from the command line's `--weights` / `--random-weights` / `--model-config`
//! (shared by `run` and `view`, which differ only in what they do when nothing is given).

use std::path::Path;

use anyhow::{Context, bail};

use crate::model::weights::WeightStore;
use crate::model::{GctModel, ModelConfig};

/// `--model-config FILE`, when given.
pub fn config_file(path: Option<&Path>) -> anyhow::Result<Option<ModelConfig>> {
    Ok(path.map(ModelConfig::from_json_file).transpose()?)
}

/// Seeded random weights of `preset` (`full` or `tiny`), or of the given config's sizes.
pub fn random_model(preset: &str, config: Option<ModelConfig>) -> anyhow::Result<GctModel> {
    let cfg = match (preset, config) {
        (_, Some(c)) => c,
        ("tiny", None) => ModelConfig::tiny(),
        ("full", None) => ModelConfig::default(),
        (other, None) => bail!("unknown --random-weights preset `{other}` (use full or tiny)"),
    };
    let store = crate::model::weights::random::random_store(&cfg, 0)?;
    Ok(GctModel::from_store(cfg, store)?)
}

/// A checkpoint file; without a config every size the tensors fix comes from the weights.
pub fn checkpoint_model(path: &Path, config: Option<ModelConfig>) -> anyhow::Result<GctModel> {
    let store = WeightStore::load(path).with_context(|| format!("loading {}", path.display()))?;
    let cfg = match config {
        Some(c) => c,
        None => ModelConfig::default().infer_from_weights(&store)?,
    };
    Ok(GctModel::from_store(cfg, store)?)
}
