//! Where a frame came from: the time it was captured and the name of its source (a file name,
//! or a video or camera and the frame's number in it), and its size as captured. These travel
//! from the source through the pipeline into the recording, replay and every export, so a
//! trajectory can be compared with a dataset's ground truth and a frame traced to its file.

use serde::{Deserialize, Serialize};

/// What clock a [`CaptureTime`] is on, so a reader knows what the number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeBase {
    /// Seconds since the Unix epoch (a camera: its driver's timestamp, or the monotonic clock
    /// read at dequeue, mapped to Unix time once when the camera opened).
    Unix,
    /// Seconds from the start of a video stream: the container's presentation time.
    Stream,
    /// Parsed from the file name (TUM style, `1305031102.175304.png`): the dataset's clock.
    FileName,
    /// No capture time is known: the frame's position at `--fps` spacing, or its index.
    Nominal,
    /// A version-1 session: seconds since the recording started, when the recorder got the
    /// frame (the only time those files hold).
    Recording,
}

impl TimeBase {
    pub fn code(self) -> u8 {
        match self {
            TimeBase::Unix => 0,
            TimeBase::Stream => 1,
            TimeBase::FileName => 2,
            TimeBase::Nominal => 3,
            TimeBase::Recording => 4,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => TimeBase::Unix,
            1 => TimeBase::Stream,
            2 => TimeBase::FileName,
            3 => TimeBase::Nominal,
            4 => TimeBase::Recording,
            _ => return None,
        })
    }
}

/// A capture time in whole nanoseconds: an integer, so a time parsed from a name prints back
/// to the same digits and two runs of one input write identical files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureTime {
    pub ns: i64,
    pub base: TimeBase,
}

const NS_PER_S: i64 = 1_000_000_000;

impl CaptureTime {
    pub fn new(ns: i64, base: TimeBase) -> Self {
        Self { ns, base }
    }

    /// From seconds, rounded to the nanosecond (saturating far outside ±292 years).
    pub fn from_secs_f64(secs: f64, base: TimeBase) -> Self {
        let ns = (secs * 1e9).round();
        let ns = if ns.is_finite() {
            ns.clamp(i64::MIN as f64, i64::MAX as f64) as i64
        } else {
            0
        };
        Self { ns, base }
    }

    pub fn seconds(&self) -> f64 {
        self.ns as f64 / 1e9
    }

    /// Seconds as text with every digit the time has: six decimals when it is whole
    /// microseconds (as TUM datasets name frames), else nine.
    pub fn seconds_text(&self) -> String {
        let sign = if self.ns < 0 { "-" } else { "" };
        let abs = self.ns.unsigned_abs();
        let (whole, frac) = (abs / NS_PER_S as u64, abs % NS_PER_S as u64);
        if frac % 1000 == 0 {
            format!("{sign}{whole}.{:06}", frac / 1000)
        } else {
            format!("{sign}{whole}.{frac:09}")
        }
    }
}

/// A frame's origin, as the source produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameOrigin {
    /// The file name (`1305031102.175304.png`), or the video or camera and the frame's number
    /// in it (`clip.mp4#frame_000012`: counted over every decoded frame, so subsampling and
    /// skips never renumber it).
    pub name: String,
    pub time: CaptureTime,
    /// Width and height as captured (after rotation metadata, before preprocessing);
    /// `None` where a version-1 session did not record it.
    pub original_size: Option<(u32, u32)>,
}

impl FrameOrigin {
    /// The origin a version-1 session implies for frame `frame` recorded at `t_s`: its time
    /// since the recording started, named by its index as v1 exports named it.
    pub fn recorded_v1(frame: u64, t_s: f64) -> Self {
        // v1 stored f64 seconds; whole microseconds keep its TUM lines as they were written.
        let micros = (t_s * 1e6).round();
        let ns = if micros.is_finite() {
            (micros.clamp(-9.2e12, 9.2e12) as i64) * 1000
        } else {
            0
        };
        Self {
            name: format!("frame_{frame:06}"),
            time: CaptureTime::new(ns, TimeBase::Recording),
            original_size: None,
        }
    }
}

impl Default for FrameOrigin {
    fn default() -> Self {
        Self {
            name: String::new(),
            time: CaptureTime::new(0, TimeBase::Nominal),
            original_size: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_text_keeps_every_digit() {
        let t = CaptureTime::new(1_305_031_102_175_304_000, TimeBase::FileName);
        assert_eq!(t.seconds_text(), "1305031102.175304");
        let t = CaptureTime::new(33_366_667, TimeBase::Stream);
        assert_eq!(t.seconds_text(), "0.033366667");
        assert_eq!(
            CaptureTime::new(-1_500_000, TimeBase::Nominal).seconds_text(),
            "-0.001500"
        );
    }

    #[test]
    fn codes_round_trip() {
        for b in [
            TimeBase::Unix,
            TimeBase::Stream,
            TimeBase::FileName,
            TimeBase::Nominal,
            TimeBase::Recording,
        ] {
            assert_eq!(TimeBase::from_code(b.code()), Some(b));
        }
        assert_eq!(TimeBase::from_code(9), None);
    }
}
