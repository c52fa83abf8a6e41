//! Where the bench's points come from: the synthetic room (the demo's ray-cast room, as many
//! frames as the point count needs) or a recorded session's frames, one `FrameResult` at a time.

use std::path::PathBuf;

use crate::frame::FrameResult;
use crate::record::{Parts, SessionReader};
use crate::viewer::demo::{DemoConfig, DemoStream};

use super::ViewerBenchError;

#[derive(Debug, Clone, PartialEq)]
pub enum PointSource {
    /// The demo room seen by a moving camera; every pixel of a `width`×`height` frame is a point.
    SyntheticRoom { width: u32, height: u32 },
    /// A recorded session (a `.srec` file or a session folder), its frames in order, cycled
    /// when it has fewer points than asked for.
    Session(PathBuf),
}

impl PointSource {
    pub fn describe(&self) -> String {
        match self {
            Self::SyntheticRoom { width, height } => {
                format!("synthetic room, {width}x{height} points a frame")
            }
            Self::Session(path) => format!("session {}", path.display()),
        }
    }
}

/// Yields results until told to stop.
pub enum Frames {
    Room(Box<DemoStream>),
    Session {
        reader: Box<SessionReader>,
        next: usize,
        path: PathBuf,
    },
}

impl Frames {
    pub fn open(source: &PointSource) -> Result<Self, ViewerBenchError> {
        match source {
            PointSource::SyntheticRoom { width, height } => {
                if *width == 0 || *height == 0 {
                    return Err(ViewerBenchError::Config(format!(
                        "the synthetic room's frame size {width}x{height} has no pixels"
                    )));
                }
                Ok(Self::Room(Box::new(DemoStream::new(DemoConfig {
                    width: *width,
                    height: *height,
                    ..DemoConfig::default()
                }))))
            }
            PointSource::Session(path) => {
                let file = if path.is_dir() {
                    path.join(crate::record::SESSION_FILE)
                } else {
                    path.clone()
                };
                let reader =
                    SessionReader::open(&file).map_err(|source| ViewerBenchError::Session {
                        path: file.clone(),
                        source,
                    })?;
                if reader.frames().is_empty() {
                    return Err(ViewerBenchError::Config(format!(
                        "session {} holds no frames",
                        file.display()
                    )));
                }
                Ok(Self::Session {
                    reader: Box::new(reader),
                    next: 0,
                    path: file,
                })
            }
        }
    }

    pub fn next_result(&mut self) -> Result<FrameResult, ViewerBenchError> {
        match self {
            Self::Room(stream) => Ok(stream.next_result()),
            Self::Session { reader, next, path } => {
                let count = reader.frames().len();
                let i = *next % count;
                *next += 1;
                reader
                    .read_frame(i, Parts::GEOMETRY)
                    .map_err(|source| ViewerBenchError::Session {
                        path: path.clone(),
                        source,
                    })
            }
        }
    }
}
