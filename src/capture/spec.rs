//! The `--input` argument: `webcam:N`, `webcam:NAME`, `synthetic`, a video file or a folder.
//! A path is a video when it is a file, or, when nothing is there, when its extension is a
//! video's (so a mistyped `clip.mp4` is reported as a missing video, not a missing folder).

use std::path::PathBuf;
use std::str::FromStr;

use super::error::CaptureError;
use super::webcam::CameraSelector;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSpec {
    Webcam(CameraSelector),
    Synthetic,
    Video(PathBuf),
    Folder(PathBuf),
}

impl FromStr for InputSpec {
    type Err = CaptureError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| CaptureError::BadInput {
            input: s.to_owned(),
            reason: reason.to_owned(),
        };
        if s.is_empty() {
            return Err(bad("empty"));
        }
        if s == "synthetic" {
            return Ok(InputSpec::Synthetic);
        }
        if let Some(rest) = s.strip_prefix("webcam:") {
            if rest.is_empty() {
                return Err(bad("give a camera index or name after `webcam:`"));
            }
            return Ok(InputSpec::Webcam(match rest.parse::<u32>() {
                Ok(i) => CameraSelector::Index(i),
                Err(_) => CameraSelector::Name(rest.to_owned()),
            }));
        }
        if s == "webcam" {
            return Ok(InputSpec::Webcam(CameraSelector::Index(0)));
        }
        let path = PathBuf::from(s);
        let is_video = match std::fs::metadata(&path) {
            Ok(meta) => meta.is_file(),
            Err(_) => super::video::has_video_extension(&path),
        };
        Ok(if is_video {
            InputSpec::Video(path)
        } else {
            InputSpec::Folder(path)
        })
    }
}

impl std::fmt::Display for InputSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputSpec::Webcam(sel) => write!(f, "webcam:{sel}"),
            InputSpec::Synthetic => f.write_str("synthetic"),
            InputSpec::Video(p) | InputSpec::Folder(p) => write!(f, "{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_form() {
        assert_eq!(
            "webcam:2".parse::<InputSpec>().unwrap(),
            InputSpec::Webcam(CameraSelector::Index(2))
        );
        assert_eq!(
            "webcam:Logitech C920".parse::<InputSpec>().unwrap(),
            InputSpec::Webcam(CameraSelector::Name("Logitech C920".into()))
        );
        assert_eq!(
            "synthetic".parse::<InputSpec>().unwrap(),
            InputSpec::Synthetic
        );
        assert_eq!(
            "some/dir".parse::<InputSpec>().unwrap(),
            InputSpec::Folder("some/dir".into())
        );
        assert_eq!(
            "no/such/clip.MP4".parse::<InputSpec>().unwrap(),
            InputSpec::Video("no/such/clip.MP4".into())
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("recording.bin");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            file.to_str().unwrap().parse::<InputSpec>().unwrap(),
            InputSpec::Video(file.clone()),
            "any file is tried as a video"
        );
        assert!("webcam:".parse::<InputSpec>().is_err());
    }
}
