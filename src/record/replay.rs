//! Plays a recorded session back at its recorded pace (or faster, or slower): which frame is
//! due when, with pause, speed and restart. The caller owns the loop and the sleeping, so the
//! same player drives the viewer window and the headless summary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::frame::FrameResult;
use crate::record::{Parts, RecordError, SessionReader};

/// The longest a replay waits for one frame: recorded gaps beyond it are damage, not pace.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayOptions {
    /// 1.0 is the recorded pace, 2.0 twice as fast; 0 (or less) plays as fast as possible.
    pub speed: f64,
    /// Stream frame indices to start and stop at (inclusive).
    pub from_frame: Option<u64>,
    pub to_frame: Option<u64>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            speed: 1.0,
            from_frame: None,
            to_frame: None,
        }
    }
}

pub struct Player {
    reader: Arc<SessionReader>,
    /// Indices into `reader.frames()` to play, in order.
    order: Vec<usize>,
    pos: usize,
    speed: f64,
    /// The wall-clock instant at which the recorded time `t_origin` is due.
    clock_origin: Instant,
    t_origin: f64,
    paused_at: Option<Instant>,
}

impl Player {
    pub fn new(reader: Arc<SessionReader>, options: ReplayOptions, now: Instant) -> Self {
        let order: Vec<usize> = reader
            .frames()
            .iter()
            .enumerate()
            .filter(|(_, f)| options.from_frame.is_none_or(|a| f.frame >= a))
            .filter(|(_, f)| options.to_frame.is_none_or(|b| f.frame <= b))
            .map(|(i, _)| i)
            .collect();
        let mut p = Self {
            reader,
            order,
            pos: 0,
            speed: options.speed,
            clock_origin: now,
            t_origin: 0.0,
            paused_at: None,
        };
        p.restart(now);
        p
    }

    pub fn reader(&self) -> &SessionReader {
        &self.reader
    }
    pub fn len(&self) -> usize {
        self.order.len()
    }
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
    /// Frames played so far.
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn is_finished(&self) -> bool {
        self.pos >= self.order.len()
    }
    pub fn is_paused(&self) -> bool {
        self.paused_at.is_some()
    }

    fn t_of(&self, pos: usize) -> f64 {
        let t = self
            .order
            .get(pos)
            .map(|&i| self.reader.frames()[i].t_s)
            .unwrap_or(0.0);
        if t.is_finite() { t } else { 0.0 }
    }

    /// Back to the first frame, due now.
    pub fn restart(&mut self, now: Instant) {
        self.pos = 0;
        self.t_origin = self.t_of(0);
        self.clock_origin = now;
        if self.paused_at.is_some() {
            self.paused_at = Some(now);
        }
    }

    /// Moves to the first played frame whose stream index is at least `frame` (the end if
    /// none), due now. The viewer's cloud is append-only, so a caller that seeks backwards
    /// resets the view and replays up to the target with `next_frame` (see `catch_up_to`).
    pub fn seek_to_frame(&mut self, frame: u64, now: Instant) {
        let frames = self.reader.frames();
        self.pos = self
            .order
            .iter()
            .position(|&i| frames[i].frame >= frame)
            .unwrap_or(self.order.len());
        self.t_origin = self.t_of(self.pos);
        self.clock_origin = self.paused_at.unwrap_or(now);
    }

    /// Playing positions from the start up to (not including) the one `seek_to_frame(frame)`
    /// would land on: what a view rebuilt from scratch must be fed to show that moment.
    pub fn catch_up_to(&self, frame: u64) -> std::ops::Range<usize> {
        let frames = self.reader.frames();
        let end = self
            .order
            .iter()
            .position(|&i| frames[i].frame >= frame)
            .unwrap_or(self.order.len());
        0..end
    }

    /// Reads the frame at playing position `pos` without moving.
    pub fn frame_at(
        &self,
        pos: usize,
        parts: Parts,
    ) -> Option<Result<Arc<FrameResult>, RecordError>> {
        let &i = self.order.get(pos)?;
        Some(self.reader.read_frame(i, parts).map(Arc::new))
    }

    pub fn pause(&mut self, now: Instant) {
        self.paused_at.get_or_insert(now);
    }

    pub fn resume(&mut self, now: Instant) {
        if let Some(at) = self.paused_at.take() {
            // The pause does not count as recorded time.
            self.clock_origin += now.saturating_duration_since(at);
        }
    }

    /// Changes speed from the current position on (no jump). Any value is safe: NaN or
    /// non-positive plays as fast as possible.
    pub fn set_speed(&mut self, speed: f64, now: Instant) {
        self.t_origin = self.t_of(self.pos);
        self.clock_origin = self.paused_at.unwrap_or(now);
        self.speed = speed;
    }

    /// How long until the next frame is due: `None` when finished or paused.
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        if self.is_finished() || self.is_paused() {
            return None;
        }
        // NaN or non-positive: as fast as possible.
        if self.speed.is_nan() || self.speed <= 0.0 {
            return Some(Duration::ZERO);
        }
        let due_s = (self.t_of(self.pos) - self.t_origin).max(0.0) / self.speed;
        // A damaged timestamp (far in the future) or an extreme speed makes a wait no clock
        // can hold: such a frame is due now rather than never (and nothing panics).
        let due = Duration::try_from_secs_f64(due_s)
            .ok()
            .filter(|d| *d <= MAX_WAIT)
            .and_then(|d| self.clock_origin.checked_add(d));
        Some(due.map_or(Duration::ZERO, |due| due.saturating_duration_since(now)))
    }

    /// Reads the next frame (whether or not it is due yet) and moves past it. A frame that
    /// fails to decode is returned as the error; the player still moves on.
    pub fn next_frame(&mut self, parts: Parts) -> Option<Result<Arc<FrameResult>, RecordError>> {
        let &i = self.order.get(self.pos)?;
        self.pos += 1;
        Some(self.reader.read_frame(i, parts).map(Arc::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::SessionWriter;
    use crate::record::sample::sample_result;

    /// A session of three frames, the middle one stamped `t_mid` seconds in.
    fn session_with_times(times: [f64; 3]) -> Arc<SessionReader> {
        let mut w =
            SessionWriter::new(Vec::new(), "mem.srec", &serde_json::json!({})).expect("writer");
        for (i, &t) in times.iter().enumerate() {
            w.write_frame(&sample_result(i as u64, 4, 3, 2), t)
                .expect("frame");
        }
        let (bytes, _) = w.close().expect("close");
        Arc::new(SessionReader::from_bytes("mem.srec", bytes).expect("read"))
    }

    #[test]
    fn extreme_timestamps_and_speeds_never_panic() {
        let now = Instant::now();
        for times in [
            [0.0, 1e300, 2.0],
            [0.0, f64::MAX, f64::INFINITY],
            [0.0, 1e12, 1e13],
        ] {
            for speed in [1.0, 1e-300, 5e-324, 1e300, f64::MAX, f64::MIN_POSITIVE] {
                let reader = session_with_times(times);
                let mut p = Player::new(
                    reader,
                    ReplayOptions {
                        speed,
                        ..ReplayOptions::default()
                    },
                    now,
                );
                while let Some(wait) = p.wait(now) {
                    assert!(wait <= MAX_WAIT, "{wait:?} at speed {speed} for {times:?}");
                    p.next_frame(Parts::GEOMETRY);
                }
                assert!(p.is_finished());
            }
        }
    }
}
