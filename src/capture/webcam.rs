//! Webcams through nokhwa (V4L2 on Linux, AVFoundation, Media Foundation). Frames arrive as
//! MJPEG or YUYV and are decoded to RGB8 here, on the capture thread.
//!
//! A frame's capture time is the driver's timestamp when it gives one in Unix time (V4L2's,
//! which nokhwa maps from the monotonic clock), else the monotonic clock read when the frame
//! was dequeued, mapped to Unix time once when the camera opened ([`UnixClock`]).
//!
//! nokhwa is called inside `catch_unwind`: a backend that panics (missing device nodes,
//! driver quirks) becomes a [`CaptureError`], never a crash of the program.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, bounded};

use nokhwa::Camera;
use nokhwa::pixel_format::RgbFormat;
use nokhwa::utils::{
    ApiBackend, CameraFormat, CameraIndex, CameraInfo, FrameFormat, RequestedFormat,
    RequestedFormatType, Resolution,
};

use super::error::CaptureError;
use super::timestamps::{UnixClock, driver_unix_time};
use super::{CapturedFrame, Source, ms_since};
use crate::frame::{FrameOrigin, RgbImage};

/// Which camera: its index as the backend numbers them, or (part of) its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CameraSelector {
    Index(u32),
    Name(String),
}

impl std::fmt::Display for CameraSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CameraSelector::Index(i) => write!(f, "{i}"),
            CameraSelector::Name(n) => f.write_str(n),
        }
    }
}

/// What to ask the camera for. The driver picks the closest mode it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CameraRequest {
    pub selector: CameraSelector,
    /// `(width, height)`; `None` lets the driver choose.
    pub resolution: Option<(u32, u32)>,
    pub fps: Option<u32>,
}

/// A camera the backend reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CameraEntry {
    pub index: String,
    pub name: String,
    pub description: String,
}

impl std::fmt::Display for CameraEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.index, self.name, self.description)
    }
}

fn unwind_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the camera backend panicked".to_owned())
}

/// A nokhwa call that failed: its error, or the panic it raised (some backends panic on
/// devices they do not understand).
#[derive(Debug, thiserror::Error)]
enum BackendFailure {
    #[error("{0}")]
    Error(#[from] nokhwa::NokhwaError),
    #[error("panic in nokhwa: {0}")]
    Panic(String),
}

/// Runs a nokhwa call, catching its panics as well as its errors.
fn guarded<T>(f: impl FnOnce() -> Result<T, nokhwa::NokhwaError>) -> Result<T, BackendFailure> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => Ok(result?),
        Err(payload) => Err(BackendFailure::Panic(unwind_message(payload))),
    }
}

/// The cameras the platform backend reports. A machine with no camera (or no backend)
/// gives an empty list, not an error.
pub fn list_cameras() -> Vec<CameraEntry> {
    match guarded(|| nokhwa::query(ApiBackend::Auto)) {
        Ok(infos) => infos.iter().map(entry).collect(),
        Err(reason) => {
            tracing::debug!("camera query failed: {reason}");
            Vec::new()
        }
    }
}

fn entry(info: &CameraInfo) -> CameraEntry {
    CameraEntry {
        index: info.index().as_string(),
        name: info.human_name(),
        description: info.description().to_owned(),
    }
}

fn not_found(requested: &CameraSelector, found: &[CameraEntry]) -> CaptureError {
    CaptureError::CameraNotFound {
        requested: format!("webcam:{requested}"),
        found: found
            .iter()
            .map(|c| format!("{}: {}", c.index, c.name))
            .collect(),
    }
}

/// A live camera. nokhwa's `Camera` may not move between threads, so it lives on a thread
/// of its own that opens it, reads and decodes frames, and hands them over one at a time.
pub struct Webcam {
    frames: Receiver<Result<CapturedFrame, CaptureError>>,
    device: String,
    description: String,
    /// The mode the camera streams in.
    size: (u32, u32),
}

impl Webcam {
    /// Open and start streaming. A camera that does not exist is
    /// [`CaptureError::CameraNotFound`], naming the request and listing the cameras found.
    pub fn open(request: &CameraRequest) -> Result<Self, CaptureError> {
        let device = format!("webcam:{}", request.selector);
        let (ready_tx, ready_rx) = bounded(1);
        let (frames_tx, frames_rx) = bounded(1);
        let request = request.clone();
        let thread_device = device.clone();
        std::thread::Builder::new()
            .name("webcam".into())
            .spawn(move || match CameraReader::open(&request, thread_device) {
                Ok(reader) => {
                    // Nobody waiting means `open` gave up on the camera: nobody to stream to.
                    let size = (reader.format.width(), reader.format.height());
                    if ready_tx.send(Ok((reader.describe(), size))).is_ok() {
                        reader.stream(frames_tx);
                    }
                }
                Err(e) => {
                    if ready_tx.send(Err(e)).is_err() {
                        tracing::debug!("a camera failed to open after `open` stopped waiting");
                    }
                }
            })
            .map_err(|e| CaptureError::Camera {
                device: device.clone(),
                reason: format!("cannot start the camera thread: {e}"),
            })?;
        match ready_rx.recv() {
            Ok(Ok((description, size))) => Ok(Webcam {
                frames: frames_rx,
                device,
                description,
                size,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CaptureError::Camera {
                device,
                reason: "the camera thread ended while opening".into(),
            }),
        }
    }
}

impl Source for Webcam {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        match self.frames.recv() {
            Ok(Ok(frame)) => Ok(Some(frame)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CaptureError::Disconnected {
                device: self.device.clone(),
                reason: "the camera thread ended".into(),
            }),
        }
    }

    fn is_live(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        Some(self.size)
    }
}

/// The camera on its own thread.
struct CameraReader {
    camera: Camera,
    device: String,
    format: CameraFormat,
    next_index: u64,
    clock: UnixClock,
}

impl CameraReader {
    fn open(request: &CameraRequest, device: String) -> Result<Self, CaptureError> {
        let found = list_cameras();
        let index = match &request.selector {
            CameraSelector::Index(i) => CameraIndex::Index(*i),
            CameraSelector::Name(name) => {
                let wanted = name.to_lowercase();
                let hit = found
                    .iter()
                    .find(|c| c.name.to_lowercase().contains(&wanted))
                    .ok_or_else(|| not_found(&request.selector, &found))?;
                match hit.index.parse::<u32>() {
                    Ok(i) => CameraIndex::Index(i),
                    Err(_) => CameraIndex::String(hit.index.clone()),
                }
            }
        };
        if !found.iter().any(|c| c.index == index.as_string()) {
            // Opening an unlisted index only produces a backend-specific message; say
            // plainly what was asked for and what exists.
            return Err(not_found(&request.selector, &found));
        }
        let mut last_reason = String::new();
        for requested in requested_formats(request) {
            let format = RequestedFormat::new::<RgbFormat>(requested);
            let opened = guarded(|| {
                let mut camera = Camera::new(index.clone(), format)?;
                camera.open_stream()?;
                Ok(camera)
            });
            match opened {
                Ok(camera) => {
                    let format = camera.camera_format();
                    return Ok(CameraReader {
                        camera,
                        device,
                        format,
                        next_index: 0,
                        clock: UnixClock::start(),
                    });
                }
                Err(reason) => last_reason = reason.to_string(),
            }
        }
        Err(CaptureError::Camera {
            device,
            reason: last_reason,
        })
    }

    fn describe(&self) -> String {
        format!(
            "{} ({}×{} {} @ {} fps)",
            self.device,
            self.format.width(),
            self.format.height(),
            self.format.format(),
            self.format.frame_rate()
        )
    }

    /// Read until the device fails or nobody wants frames any more.
    fn stream(mut self, frames: Sender<Result<CapturedFrame, CaptureError>>) {
        loop {
            let frame = self.read();
            let failed = frame.is_err();
            if frames.send(frame).is_err() || failed {
                break;
            }
        }
        let camera = &mut self.camera;
        if let Err(reason) = guarded(|| camera.stop_stream()) {
            tracing::debug!("{}: stopping the stream: {reason}", self.device);
        }
    }

    fn read(&mut self) -> Result<CapturedFrame, CaptureError> {
        let clock = Instant::now();
        let camera = &mut self.camera;
        let buffer = guarded(|| camera.frame()).map_err(|reason| CaptureError::Disconnected {
            device: self.device.clone(),
            reason: reason.to_string(),
        })?;
        let dequeued = self.clock.now();
        let capture_ms = ms_since(clock);
        let clock = Instant::now();
        let decoded = guarded(|| buffer.decode_image::<RgbFormat>()).map_err(|reason| {
            CaptureError::Camera {
                device: self.device.clone(),
                reason: format!(
                    "cannot decode a {} frame: {reason}",
                    buffer.source_frame_format()
                ),
            }
        })?;
        let (width, height) = (decoded.width(), decoded.height());
        let image = RgbImage {
            width,
            height,
            data: decoded.into_raw(),
        };
        let decode_ms = ms_since(clock);
        let time = driver_unix_time(buffer.capture_timestamp()).unwrap_or(dequeued);
        let index = self.next_index;
        self.next_index += 1;
        let origin = FrameOrigin {
            name: format!("{}#frame_{index:06}", self.device),
            time,
            original_size: Some((image.width, image.height)),
        };
        Ok(CapturedFrame {
            index,
            image,
            origin,
            captured_at: Instant::now(),
            capture_ms,
            decode_ms,
        })
    }
}

/// Modes to try in order: the requested size/rate as MJPEG (cheap over USB), then YUYV,
/// then whatever the driver prefers.
fn requested_formats(request: &CameraRequest) -> Vec<RequestedFormatType> {
    let fps = request.fps.unwrap_or(30);
    let mut out = Vec::new();
    if let Some((w, h)) = request.resolution {
        for fourcc in [FrameFormat::MJPEG, FrameFormat::YUYV] {
            out.push(RequestedFormatType::Closest(CameraFormat::new(
                Resolution::new(w, h),
                fourcc,
                fps,
            )));
        }
    } else if request.fps.is_some() {
        out.push(RequestedFormatType::HighestFrameRate(fps));
    }
    out.push(RequestedFormatType::AbsoluteHighestFrameRate);
    out
}
