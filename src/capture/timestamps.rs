//! Capture times for sources that have no clock of their own, or a clock of another kind:
//! times parsed from TUM-style file names, a camera's dequeue time mapped to Unix time, and
//! the nominal times of frames that carry none.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::frame::{CaptureTime, TimeBase};

/// The time a TUM-style file name carries: the name without its extension is a decimal
/// number of seconds, `1305031102.175304.png` (TUM RGB-D, ETH3D). Digits beyond nanoseconds
/// are cut; anything else in the name means it carries no time.
pub fn time_from_file_name(name: &str) -> Option<i64> {
    let stem = match name.rfind('.') {
        Some(dot) if dot > 0 => &name[..dot],
        _ => name,
    };
    let (whole, frac) = stem.split_once('.')?;
    if whole.is_empty()
        || frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || whole.len() > 12
    {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let mut nanos: i64 = 0;
    for (i, b) in frac.bytes().take(9).enumerate() {
        nanos += i64::from(b - b'0') * 10i64.pow(8 - i as u32);
    }
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// The nominal time of the `position`-th frame (0-based) of a source without capture times:
/// `position / fps` seconds at `--fps`, else `position` seconds (the index as the time).
pub fn nominal_time(position: u64, fps: Option<f64>) -> CaptureTime {
    match fps.filter(|f| f.is_finite() && *f > 0.0) {
        Some(fps) => CaptureTime::from_secs_f64(position as f64 / fps, TimeBase::Nominal),
        None => CaptureTime::new(
            (position.min(i64::MAX as u64 / 1_000_000_000) as i64) * 1_000_000_000,
            TimeBase::Nominal,
        ),
    }
}

/// A monotonic clock read as Unix time: the wall clock is read once, when the clock is made,
/// and every later time is that plus the monotonic time since. A wall clock stepped during a
/// run (NTP) cannot make the frames' times jump or go backwards.
#[derive(Debug, Clone, Copy)]
pub struct UnixClock {
    unix_at_start: Duration,
    start: Instant,
}

impl UnixClock {
    pub fn start() -> Self {
        Self {
            unix_at_start: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            start: Instant::now(),
        }
    }

    /// The Unix time of `at` (an instant after the clock started).
    pub fn at(&self, at: Instant) -> CaptureTime {
        let t = self.unix_at_start + at.saturating_duration_since(self.start);
        CaptureTime::new(
            i64::try_from(t.as_nanos()).unwrap_or(i64::MAX),
            TimeBase::Unix,
        )
    }

    pub fn now(&self) -> CaptureTime {
        self.at(Instant::now())
    }
}

/// A camera driver's timestamp, when it is Unix time. nokhwa hands V4L2's monotonic timestamps
/// over already mapped to Unix time; a backend whose timestamps are on another clock (time
/// since boot, since the stream started) gives values long before this program could run,
/// and those are not used (the dequeue time is, through [`UnixClock`]).
pub fn driver_unix_time(driver: Option<Duration>) -> Option<CaptureTime> {
    // 2001-09-09: any real capture is later; a time since boot or since the stream's start is
    // far smaller.
    const PLAUSIBLE_UNIX: Duration = Duration::from_secs(1_000_000_000);
    let t = driver.filter(|t| *t >= PLAUSIBLE_UNIX)?;
    Some(CaptureTime::new(
        i64::try_from(t.as_nanos()).ok()?,
        TimeBase::Unix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tum_names_parse_to_the_nanosecond() {
        assert_eq!(
            time_from_file_name("1305031102.175304.png"),
            Some(1_305_031_102_175_304_000)
        );
        assert_eq!(
            time_from_file_name("1305031102.1753041234.jpg"),
            Some(1_305_031_102_175_304_123)
        );
        assert_eq!(time_from_file_name("0.5.png"), Some(500_000_000));
        for not_a_time in [
            "frame_000001.png",
            "1305031102.png",
            "13050a1102.175304.png",
            ".5.png",
            "1305031102..png",
            "12.34-5.png",
        ] {
            assert_eq!(time_from_file_name(not_a_time), None, "{not_a_time}");
        }
    }

    #[test]
    fn nominal_times_space_frames() {
        assert_eq!(nominal_time(3, Some(30.0)).ns, 100_000_000);
        assert_eq!(nominal_time(3, None).ns, 3_000_000_000);
        assert_eq!(nominal_time(3, None).base, TimeBase::Nominal);
    }

    #[test]
    fn the_unix_clock_is_monotonic_and_near_the_wall_clock() {
        let clock = UnixClock::start();
        let a = clock.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = clock.now();
        assert!(b.ns - a.ns >= 2_000_000, "{a:?} {b:?}");
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!((wall.as_secs_f64() - b.seconds()).abs() < 1.0);
    }

    #[test]
    fn only_plausible_driver_times_are_unix() {
        assert_eq!(driver_unix_time(None), None);
        assert_eq!(driver_unix_time(Some(Duration::from_secs(5000))), None);
        let t = driver_unix_time(Some(Duration::new(1_700_000_000, 5))).expect("unix");
        assert_eq!(t.ns, 1_700_000_000_000_000_005);
    }
}
