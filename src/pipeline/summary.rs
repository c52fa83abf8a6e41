//! What a run did, for the end-of-run summary and the session dump.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::frame::FrameResult;

/// Frame accounting: `captured = processed + dropped + discarded + skipped`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PipelineSummary {
    pub source: String,
    pub model: String,
    /// Frames the source delivered.
    pub frames_captured: u64,
    /// Frames that produced a result.
    pub frames_processed: u64,
    /// Frames a live source replaced with a newer one (inference was busy or paused).
    pub frames_dropped: u64,
    /// Frames captured but not run because of a stop request (queued or waiting for the
    /// scale call).
    pub frames_discarded: u64,
    /// Frames that could not be used (preprocessing failed, size differs from the session's,
    /// or the model step failed).
    pub frames_skipped: u64,
    pub scale_frames: u64,
    pub keyframes: u64,
    pub non_keyframes: u64,
    /// Sessions started (1 + resets).
    pub sessions: u64,
    pub committed_frames_at_end: u64,
    pub wall_s: f64,
    /// Processed frames per wall-clock second.
    pub fps: f64,
    /// Seconds from the pipeline's start to its first result (the scale call's frames).
    pub first_result_s: Option<f64>,
    /// Frames per second after the first result: the stream's pace once it runs, without the
    /// start-up and the scale call.
    pub steady_fps: f64,
    /// Seconds spent opening model sessions (with the backend's warm-up).
    pub session_start_s: f64,
    /// Seconds the inference thread spent handing results to consumers that were behind (a
    /// lossless consumer with a full queue makes it wait; see `Delivery`).
    pub consumer_wait_s: f64,
    /// Mean milliseconds per frame of each stage.
    pub mean_stage_ms: BTreeMap<String, f64>,
    pub input_ended: bool,
    pub warnings: Vec<String>,
    pub errors: Vec<String>,
}

/// Running sums of stage times.
#[derive(Debug, Default)]
pub(crate) struct StageSums {
    sums: BTreeMap<String, f64>,
    frames: u64,
}

impl StageSums {
    pub(crate) fn add(&mut self, result: &FrameResult) {
        self.frames += 1;
        for t in &result.timings {
            *self.sums.entry(t.stage.clone()).or_default() += t.ms;
        }
    }

    pub(crate) fn means(&self) -> BTreeMap<String, f64> {
        let n = self.frames.max(1) as f64;
        self.sums.iter().map(|(k, v)| (k.clone(), v / n)).collect()
    }
}
