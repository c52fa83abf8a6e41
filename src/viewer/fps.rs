//! Frame rate of the window: a rate over the last repaints (at least a second's worth, at least
//! `RECENT` repaints, so slow software rendering still reads) and a whole-run mean.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Repaints the rolling rate always spans (when there are that many).
const RECENT: usize = 10;

#[derive(Debug, Default)]
pub struct FpsMeter {
    recent: VecDeque<Instant>,
    first: Option<Instant>,
    frames: u64,
}

impl FpsMeter {
    pub fn tick(&mut self, now: Instant) {
        self.first.get_or_insert(now);
        self.frames += 1;
        self.recent.push_back(now);
        while self.recent.len() > RECENT
            && self
                .recent
                .front()
                .is_some_and(|&t| now.duration_since(t) > Duration::from_secs(1))
        {
            self.recent.pop_front();
        }
    }

    /// Frames per second over the last second (or the last `RECENT` repaints if longer).
    pub fn rolling(&self) -> f64 {
        match (self.recent.front(), self.recent.back()) {
            (Some(a), Some(b)) if self.recent.len() > 1 => {
                (self.recent.len() - 1) as f64 / b.duration_since(*a).as_secs_f64().max(1e-9)
            }
            _ => 0.0,
        }
    }

    /// (frames, seconds) since the first tick.
    pub fn totals(&self, now: Instant) -> (u64, f64) {
        let secs = self
            .first
            .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        (self.frames, secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_rate_counts_the_last_second() {
        let mut fps = FpsMeter::default();
        let t0 = Instant::now();
        for i in 0..=30 {
            fps.tick(t0 + Duration::from_millis(i * 20));
        }
        assert!((fps.rolling() - 50.0).abs() < 1.0);
        assert_eq!(fps.totals(t0 + Duration::from_millis(600)).0, 31);
    }
}
