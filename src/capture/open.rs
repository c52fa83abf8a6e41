//! One way from an [`InputSpec`] to a running [`Source`], for every front end: what is asked of
//! a camera, how the synthetic room runs, what a folder does with a file that does not decode.

use super::{
    CameraRequest, CaptureError, CorruptFilePolicy, ImageFolder, InputSpec, Source, SyntheticScene,
    SyntheticSource, Webcam,
};

/// How the synthetic room plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyntheticPlay {
    /// Endless and paced like a camera at this frame rate, so live behaviour (drops included)
    /// shows in a viewer.
    Live { fps: f64 },
    /// This many frames, as fast as inference takes them (a headless run).
    Frames(u64),
}

/// Everything an input needs besides its spec.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceOptions {
    /// Camera resolution request (`None`: the camera's own).
    pub resolution: Option<(u32, u32)>,
    /// Camera frame-rate request (`None`: the camera's own).
    pub fps: Option<u32>,
    pub synthetic: SyntheticPlay,
    pub corrupt_files: CorruptFilePolicy,
}

/// Opens the input `spec` names.
pub fn open_source(
    spec: &InputSpec,
    options: &SourceOptions,
) -> Result<Box<dyn Source>, CaptureError> {
    Ok(match spec {
        InputSpec::Webcam(selector) => Box::new(Webcam::open(&CameraRequest {
            selector: selector.clone(),
            resolution: options.resolution,
            fps: options.fps,
        })?),
        InputSpec::Synthetic => match options.synthetic {
            SyntheticPlay::Live { fps } => Box::new(SyntheticSource::live(
                SyntheticScene {
                    frames: None,
                    ..SyntheticScene::default()
                },
                fps,
            )),
            SyntheticPlay::Frames(n) => Box::new(SyntheticSource::new(SyntheticScene {
                frames: Some(n),
                ..SyntheticScene::default()
            })),
        },
        InputSpec::Folder(dir) => Box::new(ImageFolder::open(dir, options.corrupt_files)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(synthetic: SyntheticPlay) -> SourceOptions {
        SourceOptions {
            resolution: None,
            fps: None,
            synthetic,
            corrupt_files: CorruptFilePolicy::Skip,
        }
    }

    #[test]
    fn the_synthetic_room_plays_as_asked() {
        let mut finite =
            open_source(&InputSpec::Synthetic, &options(SyntheticPlay::Frames(2))).expect("opens");
        assert!(!finite.is_live());
        assert_eq!(finite.remaining_hint(), Some(2));
        let mut frames = 0;
        while finite.next_frame().expect("a frame").is_some() {
            frames += 1;
        }
        assert_eq!(frames, 2);
        let live = open_source(
            &InputSpec::Synthetic,
            &options(SyntheticPlay::Live { fps: 30.0 }),
        )
        .expect("opens");
        assert!(live.is_live());
        assert_eq!(live.remaining_hint(), None);
    }

    #[test]
    fn a_missing_folder_is_an_error_naming_it() {
        let spec = InputSpec::Folder("no/such/folder".into());
        let err = open_source(&spec, &options(SyntheticPlay::Frames(1)))
            .err()
            .expect("no folder");
        assert!(err.to_string().contains("no/such/folder"), "{err}");
    }
}
