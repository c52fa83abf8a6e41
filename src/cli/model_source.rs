//! `--weights` / `--random-weights` / `--model-config` / `--backend` turned into the library's
//! [`ModelRequest`] (shared by `run` and `view`, which differ only in what they do when nothing
//! is given), and the model loaded with the reason for a CPU fallback said once on stderr.

use std::path::Path;

use crate::backend::load::{LoadError, ModelRequest, RandomPreset, Weights, load_frame_model};
use crate::model::{ModelConfig, ModelError};
use crate::pipeline::FrameModel;
use std::sync::Arc;

use super::backend_choice::BackendArg;

/// The released checkpoint from the hub's cache, downloaded if missing: a progress bar on the
/// terminal (when it is one) and each report also handed to `status` (the window's status bar).
pub fn hub_checkpoint(status: &dyn Fn(String)) -> anyhow::Result<std::path::PathBuf> {
    use crate::model::weights::hub::{self, DownloadStage};
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    let path = hub::download_reporting(&hub::HubRequest::default(), &mut |p| {
        match p.stage {
            DownloadStage::Receiving { done, total } => {
                bar.set_message(format!("downloading {}", p.file));
                bar.set_length(total);
                bar.set_position(done);
            }
            DownloadStage::Verifying { .. } => bar.set_message(format!("checking {}", p.file)),
        }
        status(p.to_string());
    });
    bar.finish_and_clear();
    Ok(path?)
}

/// `--model-config FILE`, when given.
pub fn config_file(path: Option<&Path>) -> anyhow::Result<Option<ModelConfig>> {
    Ok(path.map(ModelConfig::from_json_file).transpose()?)
}

/// Seeded random weights of `preset` (`full` or `tiny`), or of the given config's sizes.
pub fn random(
    preset: &str,
    config: Option<ModelConfig>,
    backend: BackendArg,
) -> anyhow::Result<ModelRequest> {
    Ok(ModelRequest {
        weights: Weights::Random(RandomPreset::parse(preset)?),
        config,
        backend: backend.into(),
        device: 0,
    })
}

/// A checkpoint file; without a config every size the tensors fix comes from the weights.
pub fn checkpoint(path: &Path, config: Option<ModelConfig>, backend: BackendArg) -> ModelRequest {
    ModelRequest {
        weights: Weights::File(path.to_owned()),
        config,
        backend: backend.into(),
        device: 0,
    }
}

/// Loads `req`, saying on stderr why the GPU is not used when `auto` fell back to the CPU.
pub fn load(req: &ModelRequest) -> anyhow::Result<Arc<dyn FrameModel>> {
    let loaded = load_frame_model(req).map_err(|e| {
        // Sizes derived from a checkpoint that is not the released model's (the tiny
        // fixture, say) fail on the released head counts: the fix is a config, not the file.
        if let (LoadError::Model(ModelError::BadConfig { reason, .. }), Weights::File(path), None) =
            (&e, &req.weights, &req.config)
        {
            return anyhow::anyhow!(
                "{}: the model sizes derived from these weights, with the released model's head \
                 counts, are not a valid model ({reason}); a checkpoint of other sizes needs its \
                 config: pass --model-config CONFIG.json",
                path.display()
            );
        }
        let context = match (&e, &req.weights) {
            (LoadError::CudaUnavailable(_), _) => "--backend cuda".to_owned(),
            (_, Weights::File(path)) => format!("loading {}", path.display()),
            (_, Weights::Random(_)) => "random weights".to_owned(),
        };
        anyhow::Error::new(e).context(context)
    })?;
    if let Some(why) = &loaded.cuda_unavailable {
        eprintln!("{why}; running the model on the CPU");
    }
    Ok(loaded.model)
}
