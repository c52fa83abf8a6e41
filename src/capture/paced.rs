//! Frames at a camera's pace: `--pace FPS` makes a folder or the synthetic room behave like a
//! live source (frame k is due at k / FPS after the first, whether or not inference is ready),
//! so the live path, its newest-frame hand-off and its drop accounting can be exercised and
//! measured without a camera.

use std::time::{Duration, Instant};

use super::{CaptureError, CapturedFrame, Source};

/// A fixed frame clock.
#[derive(Debug, Clone)]
pub struct Pacer {
    period: Duration,
    fps: f64,
    start: Option<Instant>,
    next: u64,
}

impl Pacer {
    /// `fps` is clamped to at least one frame a day (callers check their flags; this keeps a
    /// bad value from panicking or stalling forever).
    pub fn new(fps: f64) -> Self {
        const SLOWEST: f64 = 1.0 / 86_400.0;
        let fps = if fps.is_finite() {
            fps.max(SLOWEST)
        } else {
            SLOWEST
        };
        Self {
            period: Duration::from_secs_f64(1.0 / fps),
            fps,
            start: None,
            next: 0,
        }
    }

    pub fn fps(&self) -> f64 {
        self.fps
    }

    /// Sleeps until the next frame is due and returns its time since the first frame. A frame
    /// that is ready late goes at once; the schedule does not slip (a camera does not wait).
    pub fn wait(&mut self) -> Duration {
        let start = *self.start.get_or_insert_with(Instant::now);
        let due = self
            .period
            .saturating_mul(self.next.min(u32::MAX as u64) as u32);
        self.next += 1;
        let now = start.elapsed();
        if due > now {
            std::thread::sleep(due - now);
        }
        due
    }
}

/// Any source, delivered at a fixed frame rate and treated as live.
pub struct Paced {
    inner: Box<dyn Source>,
    pacer: Pacer,
}

impl Paced {
    pub fn new(inner: Box<dyn Source>, fps: f64) -> Self {
        Self {
            inner,
            pacer: Pacer::new(fps),
        }
    }
}

impl Source for Paced {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        let Some(mut frame) = self.inner.next_frame()? else {
            return Ok(None);
        };
        let clock = Instant::now();
        // The frame keeps its own capture time (a file name's, a video's): pacing changes when
        // it arrives, not when it was taken.
        self.pacer.wait();
        // Waiting for the frame's time is the camera's exposure, not work: it counts as capture.
        frame.capture_ms += clock.elapsed().as_secs_f64() * 1e3;
        frame.captured_at = Instant::now();
        Ok(Some(frame))
    }

    fn is_live(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!(
            "{} paced at {} fps",
            self.inner.describe(),
            self.pacer.fps()
        )
    }

    fn remaining_hint(&self) -> Option<u64> {
        self.inner.remaining_hint()
    }

    fn take_warnings(&mut self) -> Vec<String> {
        self.inner.take_warnings()
    }

    fn take_skipped(&mut self) -> u64 {
        self.inner.take_skipped()
    }

    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        self.inner.frame_size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_due_on_the_clock() {
        let mut pacer = Pacer::new(100.0);
        let clock = Instant::now();
        let times: Vec<Duration> = (0..5).map(|_| pacer.wait()).collect();
        assert_eq!(times[4], Duration::from_millis(40));
        assert!(clock.elapsed() >= Duration::from_millis(40));
        // A late consumer does not shift the schedule.
        std::thread::sleep(Duration::from_millis(35));
        assert_eq!(pacer.wait(), Duration::from_millis(50));
        let quick = Instant::now();
        pacer.wait();
        assert!(quick.elapsed() < Duration::from_millis(30));
    }
}
