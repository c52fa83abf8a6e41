//! Downloading the released checkpoint from the Hugging Face hub (`hf-hub`, blocking client),
//! into the usual HF cache so other tools find it too.
//!
//! The download reports its progress (the terminal draws a bar, the window its status bar),
//! resumes a broken transfer (hf-hub keeps the bytes received in a `.part` file beside the
//! blob and asks for the rest), and is checked against the SHA-256 the hub names the file by:
//! a file that does not match is removed, never loaded.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::model::error::{ModelError, Result};

pub const HUB_REPO: &str = "robbyant/lingbot-map";
pub const HUB_FILE: &str = "lingbot-map-long.pt";
/// Reconnections after a broken transfer, each resuming where the last stopped.
const RETRIES: usize = 5;
/// How often progress is reported at most (the last report always comes).
const REPORT_EVERY: Duration = Duration::from_millis(200);

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

/// Where a download stands, as the terminal bar and the window's status bar show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownloadStage {
    /// Bytes received so far (a resumed download starts at what it had).
    Receiving { done: u64, total: u64 },
    /// All bytes are in; the SHA-256 is being checked.
    Verifying { total: u64 },
}

/// A report of `file`'s download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadProgress {
    pub file: String,
    pub stage: DownloadStage,
}

impl std::fmt::Display for DownloadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: u64| b as f64 / 1e6;
        match self.stage {
            DownloadStage::Receiving { done, total } => write!(
                f,
                "downloading {}: {:.0} of {:.0} MB ({:.0} %)",
                self.file,
                mb(done),
                mb(total),
                100.0 * done as f64 / total.max(1) as f64
            ),
            DownloadStage::Verifying { total } => write!(
                f,
                "checking the SHA-256 of {} ({:.0} MB)",
                self.file,
                mb(total)
            ),
        }
    }
}

/// Download (or find in the HF cache) the released checkpoint, silently.
pub fn download_default() -> Result<PathBuf> {
    download(&HubRequest::default())
}

/// Download (or find in the HF cache) `req`'s file, silently.
pub fn download(req: &HubRequest<'_>) -> Result<PathBuf> {
    download_reporting(req, &mut |_| {})
}

/// Download (or find in the HF cache) `req`'s file, reporting progress to `report` (a few
/// times a second at most). A file already in the cache is returned without the network.
pub fn download_reporting(
    req: &HubRequest<'_>,
    report: &mut dyn FnMut(&DownloadProgress),
) -> Result<PathBuf> {
    let mut builder = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(false)
        .with_retries(RETRIES);
    if let Some(dir) = req.cache_dir {
        builder = builder.with_cache_dir(dir.to_owned());
    }
    if let Some(e) = req.endpoint {
        builder = builder.with_endpoint(e.to_owned());
    }
    let api = builder
        .build()
        .map_err(|e| ModelError::Download(format!("cannot set up the hub client: {e}")))?;
    let repo = api.model(req.repo.to_owned());
    let cache = match req.cache_dir {
        Some(dir) => hf_hub::Cache::new(dir.to_owned()),
        None => hf_hub::Cache::from_env(),
    };
    if let Some(path) = cache.model(req.repo.to_owned()).get(req.file) {
        return Ok(path);
    }
    let reporter = Reporter {
        file: req.file.to_owned(),
        done: 0,
        total: 0,
        last: None,
        report,
    };
    let path = repo
        .download_with_progress(req.file, reporter)
        .map_err(|e| {
            ModelError::Download(format!(
                "could not fetch `{file}` from the hub repository `{repo_id}` ({e}). If this \
                 machine is offline, download {url} on one that is not (or run `hf download \
                 {repo_id} {file}` there), copy it here and pass it with --weights PATH; what \
                 was received so far is kept in {cache} and resumed on the next try",
                file = req.file,
                repo_id = req.repo,
                url = repo.url(req.file),
                cache = cache.path().display(),
            ))
        })?;
    verify(&path, req.file, report)?;
    Ok(path)
}

/// Feeds hf-hub's byte counts to `report`, throttled.
struct Reporter<'r> {
    file: String,
    done: u64,
    total: u64,
    last: Option<Instant>,
    report: &'r mut dyn FnMut(&DownloadProgress),
}

impl Reporter<'_> {
    fn send(&mut self, force: bool) {
        let due = self.last.is_none_or(|t| t.elapsed() >= REPORT_EVERY);
        if force || due {
            self.last = Some(Instant::now());
            (self.report)(&DownloadProgress {
                file: self.file.clone(),
                stage: DownloadStage::Receiving {
                    done: self.done,
                    total: self.total,
                },
            });
        }
    }
}

impl hf_hub::api::Progress for Reporter<'_> {
    // Called at every (re)connection; the bytes already on disk follow as one update.
    fn init(&mut self, size: usize, _filename: &str) {
        self.total = size as u64;
        self.done = 0;
    }
    fn update(&mut self, size: usize) {
        self.done += size as u64;
        self.send(false);
    }
    fn finish(&mut self) {
        self.send(true);
    }
}

/// The SHA-256 the hub names a large (LFS) file by: the name of the blob in the HF cache that
/// `path` (a snapshot pointer) leads to, when it is 64 hex digits.
fn expected_sha256(path: &Path) -> Option<String> {
    let blob = path.canonicalize().ok()?;
    let name = blob.file_name()?.to_str()?.to_ascii_lowercase();
    (name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())).then_some(name)
}

/// Checks a fresh download against the hub's SHA-256; a mismatch removes the file so the next
/// try downloads it again instead of loading damaged weights.
fn verify(path: &Path, file: &str, report: &mut dyn FnMut(&DownloadProgress)) -> Result<()> {
    let Some(expected) = expected_sha256(path) else {
        tracing::info!(
            "{file}: the hub gave no SHA-256 for this file (not stored with LFS); not verified"
        );
        return Ok(());
    };
    let total = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    report(&DownloadProgress {
        file: file.to_owned(),
        stage: DownloadStage::Verifying { total },
    });
    let actual = sha256_of(path).map_err(|e| ModelError::io(path, e))?;
    if actual == expected {
        return Ok(());
    }
    let blob = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    for damaged in [path, blob.as_path()] {
        if let Err(e) = std::fs::remove_file(damaged)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "could not remove the damaged download {}: {e}",
                damaged.display()
            );
        }
    }
    Err(ModelError::Download(format!(
        "the download of `{file}` is damaged: its SHA-256 is {actual}, the hub's is {expected}. \
         The file was removed; run again to download it afresh"
    )))
}

fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
