//! Downloading the released checkpoint from the Hugging Face hub (`hf-hub`, blocking client),
//! into the usual HF cache so other tools find it too.

use std::path::{Path, PathBuf};

use crate::model::error::{ModelError, Result};

pub const HUB_REPO: &str = "robbyant/lingbot-map";
pub const HUB_FILE: &str = "lingbot-map-long.pt";

/// What to fetch and from where. `None` fields take hf-hub's environment defaults
/// (`HF_ENDPOINT`, `HF_HOME`).
#[derive(Clone, Debug)]
pub struct HubRequest<'a> {
    pub endpoint: Option<&'a str>,
    pub cache_dir: Option<&'a Path>,
    pub repo: &'a str,
    pub file: &'a str,
}

impl Default for HubRequest<'_> {
    fn default() -> Self {
        HubRequest {
            endpoint: None,
            cache_dir: None,
            repo: HUB_REPO,
            file: HUB_FILE,
        }
    }
}

/// Download (or find in the HF cache) the released checkpoint.
pub fn download_default() -> Result<PathBuf> {
    download(&HubRequest::default())
}

pub fn download(req: &HubRequest<'_>) -> Result<PathBuf> {
    let mut builder = hf_hub::api::sync::ApiBuilder::from_env().with_progress(false);
    if let Some(dir) = req.cache_dir {
        builder = builder.with_cache_dir(dir.to_owned());
    }
    if let Some(e) = req.endpoint {
        builder = builder.with_endpoint(e.to_owned());
    }
    let api = builder
        .build()
        .map_err(|e| ModelError::Download(format!("cannot set up the hub client: {e}")))?;
    api.model(req.repo.to_owned()).get(req.file).map_err(|e| {
        ModelError::Download(format!(
            "could not fetch `{}` from the hub repository `{}` ({e}). If this machine is \
             offline, download the file elsewhere and pass it with --weights PATH",
            req.file, req.repo
        ))
    })
}
