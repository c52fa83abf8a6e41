//! The capture thread: reads the source, preprocesses to the model's input size (or, for a
//! backend that preprocesses on its device, only checks the size it will come to), and hands
//! frames to inference. Live sources keep only the newest frame (older ones are taken back out
//! of the queue and counted as dropped), except while a session starts: then up to its scale
//! frames may wait, since inference will catch up once its first call is done. Other sources
//! block until inference takes the frame, so nothing is dropped.
//!
//! The loop starts reading only when inference says it is ready (its model session prepared for
//! the source's frame size), so a camera's first frames are not lost to the model's start-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, SendTimeoutError, Sender, TrySendError};

use crate::capture::{CapturedFrame, Source};
use crate::model::preprocess::{PreprocessConfig, preprocess_rgb8, rgb8_target_size};

use crate::frame::{FrameOrigin, RgbImage};

/// A preprocessed frame on its way to inference.
#[derive(Debug)]
pub(crate) struct InputFrame {
    pub index: u64,
    /// Capture time, source name, size as captured: carried into the frame's result.
    pub origin: FrameOrigin,
    pub pixels: FramePixels,
    /// The model's input size (after preprocessing, wherever it runs).
    pub height: usize,
    pub width: usize,
    pub capture_ms: f64,
    pub decode_ms: f64,
    pub preprocess_ms: f64,
    pub sent_at: Instant,
    /// Frames dropped between the previous delivered frame and this one.
    pub dropped_before: u64,
}

/// A frame's pixels as the capture thread hands them over.
#[derive(Debug)]
pub(crate) enum FramePixels {
    /// Preprocessed on the host: `[3][H][W]` in [0, 1], and the same as 8-bit RGB (the result's
    /// image and the points' colours).
    Host {
        pixels: Vec<f32>,
        model_rgb: RgbImage,
    },
    /// Decoded only, for a backend that preprocesses on its device.
    Decoded(RgbImage),
}

/// Side messages from the capture thread; frames travel on their own channel.
#[derive(Debug)]
pub(crate) enum CaptureNote {
    Warning(String),
    /// The source failed (a camera unplugged); no more frames will come.
    Failed(String),
    /// The source ended normally (or reached the frame limit).
    Ended,
}

#[derive(Debug, Default)]
pub(crate) struct CaptureCounters {
    pub captured: AtomicU64,
    pub dropped: AtomicU64,
    pub skipped: AtomicU64,
    /// Frames read but not handed over because of a stop request.
    pub discarded: AtomicU64,
}

pub(crate) struct CaptureLoop {
    pub source: Box<dyn Source>,
    pub preprocess: PreprocessConfig,
    /// Leave preprocessing to the backend ([`FramePixels::Decoded`]).
    pub preprocess_on_device: bool,
    pub frames: Sender<InputFrame>,
    /// The inference end of `frames`, used by live sources to take back a stale frame.
    pub frames_back: Receiver<InputFrame>,
    pub notes: Sender<CaptureNote>,
    pub stop: Arc<AtomicBool>,
    pub counters: Arc<CaptureCounters>,
    pub max_frames: Option<u64>,
    /// Inference sends (or hangs up) when it is ready for the first frame.
    pub ready: Receiver<()>,
    /// Frames a live source may keep queued (inference changes it; see the module docs).
    pub live_queue: Arc<AtomicUsize>,
}

/// How often a blocked hand-off looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

impl CaptureLoop {
    pub(crate) fn run(mut self) {
        // Either answer means go: a hung-up inference thread is noticed at the first hand-over.
        let _ = self.ready.recv();
        let live = self.source.is_live();
        while !self.stop.load(Ordering::Acquire) {
            if self
                .max_frames
                .is_some_and(|n| self.counters.captured.load(Ordering::Relaxed) >= n)
            {
                self.last_note(CaptureNote::Ended);
                return;
            }
            let next = self.source.next_frame();
            let unusable = self.source.take_skipped();
            self.counters
                .captured
                .fetch_add(unusable, Ordering::Relaxed);
            self.counters.skipped.fetch_add(unusable, Ordering::Relaxed);
            for w in self.source.take_warnings() {
                if !self.tell(CaptureNote::Warning(w)) {
                    return;
                }
            }
            let frame = match next {
                Ok(Some(f)) => f,
                Ok(None) => {
                    self.last_note(CaptureNote::Ended);
                    return;
                }
                Err(e) => {
                    self.last_note(CaptureNote::Failed(e.to_string()));
                    return;
                }
            };
            self.counters.captured.fetch_add(1, Ordering::Relaxed);
            let Some(input) = self.prepare(frame) else {
                continue;
            };
            let delivered = if live {
                self.hand_over_newest(input)
            } else {
                self.hand_over_blocking(input)
            };
            if !delivered {
                return;
            }
        }
    }

    /// Tells the inference thread; `false` when it has gone (it stopped), so capture stops too.
    fn tell(&self, note: CaptureNote) -> bool {
        self.notes.send(note).is_ok()
    }

    /// The capture loop's last word. It ends either way, so an inference thread that has
    /// stopped already (and no longer listens) changes nothing.
    fn last_note(&self, note: CaptureNote) {
        if !self.tell(note) {
            tracing::debug!("inference had stopped before capture's last note");
        }
    }

    fn prepare(&mut self, frame: CapturedFrame) -> Option<InputFrame> {
        let clock = Instant::now();
        let img = &frame.image;
        let (w, h) = (img.width as usize, img.height as usize);
        let prepared = if self.preprocess_on_device {
            // Only the size it will come to: a frame the session cannot take is skipped here,
            // as on the host path.
            rgb8_target_size(img.data.len(), w, h, &self.preprocess)
                .map(|(width, _, height)| (height, width, None))
                .map_err(|e| e.to_string())
        } else {
            preprocess_rgb8(&img.data, w, h, &self.preprocess)
                .map(|pre| {
                    let model_rgb = pre.to_rgb8();
                    (pre.height, pre.width, Some((pre.data, model_rgb)))
                })
                .map_err(|e| e.to_string())
        };
        let (height, width, host) = match prepared {
            Ok(p) => p,
            Err(e) => {
                self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                let name = frame.origin.name;
                // Nothing to hand over either way; a stopped inference thread is noticed at the
                // next hand-over.
                self.tell(CaptureNote::Warning(format!("skipped {name}: {e}")));
                return None;
            }
        };
        let pixels = match host {
            Some((pixels, model_rgb)) => FramePixels::Host { pixels, model_rgb },
            None => FramePixels::Decoded(frame.image),
        };
        Some(InputFrame {
            index: frame.index,
            origin: frame.origin,
            pixels,
            height,
            width,
            capture_ms: frame.capture_ms,
            decode_ms: frame.decode_ms,
            preprocess_ms: clock.elapsed().as_secs_f64() * 1e3,
            sent_at: Instant::now(),
            dropped_before: 0,
        })
    }

    /// Live: never wait. When the queue holds as many frames as it may, take them all back
    /// (the newest frame replaces them) and count them; the frame handed over carries the count,
    /// so the gap before it is exactly its `dropped_before`.
    fn hand_over_newest(&mut self, mut input: InputFrame) -> bool {
        input.sent_at = Instant::now();
        loop {
            let limit = self.live_queue.load(Ordering::Acquire).max(1);
            if self.frames.len() >= limit {
                // Inference may take some meanwhile; what is left is stale.
                while let Ok(stale) = self.frames_back.try_recv() {
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    input.dropped_before += stale.dropped_before + 1;
                }
            }
            match self.frames.try_send(input) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) => input = back,
            }
        }
    }

    /// Files: wait for inference (back-pressure), but notice a stop request.
    fn hand_over_blocking(&mut self, mut input: InputFrame) -> bool {
        input.sent_at = Instant::now();
        loop {
            match self.frames.send_timeout(input, STOP_POLL) {
                Ok(()) => return true,
                Err(SendTimeoutError::Disconnected(_)) => return false,
                Err(SendTimeoutError::Timeout(back)) => {
                    if self.stop.load(Ordering::Acquire) {
                        self.counters.discarded.fetch_add(1, Ordering::Relaxed);
                        return false;
                    }
                    input = back;
                }
            }
        }
    }
}
