use std::path::PathBuf;

/// Why a source could not open or deliver a frame.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("camera {requested} not found; cameras found: {}", found_list(.found))]
    CameraNotFound {
        requested: String,
        /// `index: name` of every camera the backend reported.
        found: Vec<String>,
    },
    #[error("camera {device}: {reason}")]
    Camera { device: String, reason: String },
    #[error("camera {device} stopped delivering frames (unplugged?): {reason}")]
    Disconnected { device: String, reason: String },
    #[error("{}: {reason}", .path.display())]
    Decode { path: PathBuf, reason: String },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no PNG or JPEG images in this folder", .0.display())]
    EmptyFolder(PathBuf),
    #[error("frame worker: {0}")]
    Worker(String),
    #[error("bad input `{input}`: {reason}")]
    BadInput { input: String, reason: String },
}

fn found_list(found: &[String]) -> String {
    if found.is_empty() {
        "none".to_owned()
    } else {
        found.join(", ")
    }
}
