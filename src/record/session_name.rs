//! Names for recordings the viewer starts: `session-YYYYMMDD-HHMMSS.srec` in UTC, made unique
//! with a suffix when two start within the same second.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use time::OffsetDateTime;

use super::RecordError;

/// Suffixes tried before giving up: far more recordings than anyone starts in one second.
const MAX_SAME_SECOND: u32 = 1000;

/// `dir/session-YYYYMMDD-HHMMSS.srec` (UTC) that does not exist yet: a suffix `-2`, `-3`, …
/// when two recordings start within a second.
pub fn new_session_path(dir: &Path, now: SystemTime) -> Result<PathBuf, RecordError> {
    let stamp = utc_stamp(now);
    for n in 1..MAX_SAME_SECOND {
        let name = if n == 1 {
            format!("session-{stamp}.srec")
        } else {
            format!("session-{stamp}-{n}.srec")
        };
        let path = dir.join(name);
        if !path.exists() {
            return Ok(path);
        }
    }
    Err(RecordError::NoFreeName {
        dir: dir.to_path_buf(),
        stamp,
    })
}

/// `YYYYMMDD-HHMMSS` in UTC.
fn utc_stamp(now: SystemTime) -> String {
    let t = OffsetDateTime::from(now);
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn stamps_are_utc_calendar_dates() {
        // 2024-02-29 13:45:07 UTC (a leap day) and the epoch itself.
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_214_307);
        assert_eq!(utc_stamp(leap), "20240229-134507");
        assert_eq!(utc_stamp(SystemTime::UNIX_EPOCH), "19700101-000000");
        // The last second of 1999.
        let y2k = SystemTime::UNIX_EPOCH + Duration::from_secs(946_684_799);
        assert_eq!(utc_stamp(y2k), "19991231-235959");
    }
}
