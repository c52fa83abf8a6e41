//! Downloading the released checkpoint from the Hugging Face hub.

use std::path::PathBuf;

use crate::model::error::{ModelError, Result};

pub const HUB_REPO: &str = "robbyant/lingbot-map";
pub const HUB_FILE: &str = "lingbot-map-long.pt";

/// Download (or find in the usual HF cache) the released checkpoint.
pub fn download_default() -> Result<PathBuf> {
    download(None, HUB_REPO, HUB_FILE)
}

/// Download `file` of `repo` into the HF cache. `endpoint` overrides the hub address (tests
/// use a local server); otherwise `HF_ENDPOINT` or the public hub.
pub fn download(endpoint: Option<&str>, repo: &str, file: &str) -> Result<PathBuf> {
    let mut builder = hf_hub::api::sync::ApiBuilder::from_env().with_progress(false);
    if let Some(e) = endpoint {
        builder = builder.with_endpoint(e.to_owned());
    }
    let api = builder
        .build()
        .map_err(|e| ModelError::Download(format!("cannot set up the hub client: {e}")))?;
    api.model(repo.to_owned()).get(file).map_err(|e| {
        ModelError::Download(format!(
            "could not fetch {file} from {repo} ({e}). If this machine is offline, download the \
             file elsewhere and pass it with --weights PATH"
        ))
    })
}
