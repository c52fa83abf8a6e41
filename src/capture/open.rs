//! One way from an [`InputSpec`] to a running [`Source`], for every front end: what is asked of
//! a camera, how the synthetic room runs, what a folder does with a file that does not decode,
//! which frames of a video are used.

use super::{
    CameraRequest, CaptureError, CorruptFilePolicy, ImageFolder, InputSpec, Source, SyntheticScene,
    SyntheticSource, VideoCut, VideoFile, Webcam, paced::Paced,
};

/// How the synthetic room plays.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyntheticPlay {
    /// Endless and paced like a camera at this frame rate, so live behaviour (drops included)
    /// shows in a viewer.
    Live { fps: f64 },
    /// This many frames, as fast as inference takes them (a headless run).
    Frames(u64),
    /// This many frames, paced like a camera at this frame rate (`--pace` on a headless run).
    PacedFrames { fps: f64, frames: u64 },
}

/// Everything an input needs besides its spec.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceOptions {
    /// Camera resolution request (`None`: the camera's own).
    pub resolution: Option<(u32, u32)>,
    /// `--fps`: a camera's frame-rate request (rounded; `None`: the camera's own), a video's
    /// most frames per second of video time, a folder's frame spacing when its file names
    /// carry no times.
    pub fps: Option<f64>,
    /// Which frames of a video are used (`--every`, `--start`, `--duration`; its `fps` is
    /// taken from `fps` above).
    pub video: VideoCut,
    pub synthetic: SyntheticPlay,
    pub corrupt_files: CorruptFilePolicy,
    /// Deliver a folder or the synthetic room at this frame rate, as a live source (a camera
    /// keeps its own pace).
    pub pace: Option<f64>,
}

/// Opens the input `spec` names.
pub fn open_source(
    spec: &InputSpec,
    options: &SourceOptions,
) -> Result<Box<dyn Source>, CaptureError> {
    refuse_video_cut_elsewhere(spec, &options.video)?;
    Ok(match spec {
        InputSpec::Webcam(selector) => Box::new(Webcam::open(&CameraRequest {
            selector: selector.clone(),
            resolution: options.resolution,
            fps: options.fps.map(|f| f.round().max(1.0) as u32),
        })?),
        InputSpec::Synthetic => match paced_synthetic(options) {
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
            SyntheticPlay::PacedFrames { fps, frames } => Box::new(SyntheticSource::live(
                SyntheticScene {
                    frames: Some(frames),
                    ..SyntheticScene::default()
                },
                fps,
            )),
        },
        InputSpec::Video(path) => {
            let video = Box::new(VideoFile::open(
                path,
                VideoCut {
                    fps: options.fps,
                    ..options.video
                },
            )?);
            match options.pace {
                Some(fps) => Box::new(Paced::new(video, fps)),
                None => video,
            }
        }
        InputSpec::Folder(dir) => {
            let folder = Box::new(
                ImageFolder::open(dir, options.corrupt_files)?.with_frame_rate(options.fps),
            );
            match options.pace {
                Some(fps) => Box::new(Paced::new(folder, fps)),
                None => folder,
            }
        }
    })
}

/// `--every`, `--start` and `--duration` cut a video; given with another input they would be
/// silently ignored, so they are refused.
fn refuse_video_cut_elsewhere(spec: &InputSpec, cut: &VideoCut) -> Result<(), CaptureError> {
    if matches!(spec, InputSpec::Video(_)) {
        return Ok(());
    }
    let given: Vec<&str> = [
        (cut.every != 1, "--every"),
        (cut.start_s != 0.0, "--start"),
        (cut.duration_s.is_some(), "--duration"),
    ]
    .into_iter()
    .filter_map(|(set, flag)| set.then_some(flag))
    .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(CaptureError::BadInput {
        input: spec.to_string(),
        reason: format!(
            "{} cut a video file; this input is not one",
            given.join(", ")
        ),
    })
}

/// The synthetic room's play with `pace` applied: a paced room is live at that rate (and keeps
/// its frame count when it has one).
fn paced_synthetic(options: &SourceOptions) -> SyntheticPlay {
    match (options.pace, options.synthetic) {
        (None, play) => play,
        (Some(fps), SyntheticPlay::Live { .. }) => SyntheticPlay::Live { fps },
        (Some(fps), SyntheticPlay::Frames(frames) | SyntheticPlay::PacedFrames { frames, .. }) => {
            SyntheticPlay::PacedFrames { fps, frames }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(synthetic: SyntheticPlay) -> SourceOptions {
        SourceOptions {
            resolution: None,
            fps: None,
            video: VideoCut::default(),
            synthetic,
            corrupt_files: CorruptFilePolicy::Skip,
            pace: None,
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
