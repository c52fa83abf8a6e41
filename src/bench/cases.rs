//! The cases of `bench attention`: how many frames are live in the cache after how many were
//! seen, checked against the model's streaming schedule (scale frames plus a sliding window).

use super::BenchError;

/// Scale frames of the model's schedule (docs/gct-model.md).
pub const SCALE_FRAMES: usize = 8;
/// Sliding window of streaming frames (docs/gct-model.md).
pub const WINDOW: usize = 64;

/// `live` frames in the cache after `seen` frames: always `min(seen, SCALE_FRAMES + WINDOW)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionCase {
    live: usize,
    seen: u64,
}

impl AttentionCase {
    pub fn live(self) -> usize {
        self.live
    }

    pub fn seen(self) -> u64 {
        self.seen
    }
}

/// Cases as `live/seen` pairs, comma separated (`8/8,72/1000`).
pub fn parse_cases(s: &str) -> Result<Vec<AttentionCase>, BenchError> {
    s.split(',')
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            let (l, f) = c
                .trim()
                .split_once('/')
                .ok_or_else(|| BenchError::CaseNotLiveSeen(c.to_owned()))?;
            let live: usize = l.parse().map_err(|source| BenchError::CaseCount {
                count: "live",
                case: c.to_owned(),
                source,
            })?;
            let seen: u64 = f.parse().map_err(|source| BenchError::CaseCount {
                count: "seen",
                case: c.to_owned(),
                source,
            })?;
            if seen == 0 || live as u64 > seen || live > SCALE_FRAMES + WINDOW {
                return Err(BenchError::CaseOutOfRange {
                    case: c.to_owned(),
                    max_live: SCALE_FRAMES + WINDOW,
                });
            }
            if live as u64 != seen.min((SCALE_FRAMES + WINDOW) as u64) {
                return Err(BenchError::CaseLiveMismatch {
                    case: c.to_owned(),
                    scale_frames: SCALE_FRAMES,
                    window: WINDOW,
                    seen,
                    live: seen.min((SCALE_FRAMES + WINDOW) as u64),
                });
            }
            Ok(AttentionCase { live, seen })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_and_bad_ones_say_what_was_expected() {
        let cases = parse_cases("8/8, 72/10000,").unwrap();
        assert_eq!(
            cases
                .iter()
                .map(|c| (c.live(), c.seen()))
                .collect::<Vec<_>>(),
            [(8, 8), (72, 10000)]
        );
        let message = |s: &str| crate::error_chain::one_line(&parse_cases(s).unwrap_err());
        assert_eq!(message("8"), "case `8` is not live/seen");
        assert!(
            message("x/8").starts_with("bad live count in `x/8`: "),
            "{}",
            message("x/8")
        );
        assert!(message("8/y").starts_with("bad seen count in `8/y`: "));
        assert_eq!(
            message("0/0"),
            "case `0/0`: need 0 < live <= seen and live <= 72"
        );
        assert_eq!(
            message("8/100"),
            "case `8/100`: with 8 scale frames and a window of 64, 100 frames seen leave 72 live"
        );
    }
}
