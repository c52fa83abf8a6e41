//! The `--input` argument: `webcam:N`, `webcam:NAME`, `synthetic` or a folder path.

use std::path::PathBuf;
use std::str::FromStr;

use super::error::CaptureError;
use super::webcam::CameraSelector;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSpec {
    Webcam(CameraSelector),
    Synthetic,
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
        Ok(InputSpec::Folder(PathBuf::from(s)))
    }
}

impl std::fmt::Display for InputSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputSpec::Webcam(sel) => write!(f, "webcam:{sel}"),
            InputSpec::Synthetic => f.write_str("synthetic"),
            InputSpec::Folder(p) => write!(f, "{}", p.display()),
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
        assert!("webcam:".parse::<InputSpec>().is_err());
    }
}
