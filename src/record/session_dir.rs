//! The folder `run --headless` writes: the recording (`session.srec`), one JSON file of
//! metadata per frame as it is processed (`frames/NNNNNN.json`), and at the end `summary.json`
//! and the cloud and trajectory (`points.ply`, `trajectory.tum`), written from the recording by
//! the same exporters as `streamrecon export`, so the two never disagree on a format. A run
//! whose model was reset holds several model sessions, each in its own world: each gets its own
//! cloud and trajectory (`points-session-N.ply`, `trajectory-session-N.tum`), as `export` does.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::export::{CloudOptions, gather_cloud_in, ply, sessions, tum};
use super::{RecordError, SESSION_FILE, SessionReader};
use crate::frame::FrameResult;
use crate::frame::camera::row_major;

/// Per-frame metadata inside the session folder.
pub const FRAMES_DIR: &str = "frames";
/// The cloud of every recorded point (the PLY `export --ply` writes).
pub const CLOUD_FILE: &str = "points.ply";
/// The camera trajectory (the TUM file `export --tum` writes).
pub const TRAJECTORY_FILE: &str = "trajectory.tum";
/// The run's summary, as the caller gives it.
pub const SUMMARY_FILE: &str = "summary.json";

/// A session folder being written.
#[derive(Debug)]
pub struct SessionDir {
    dir: PathBuf,
    frames: u64,
    points: u64,
    dropped: u64,
}

/// What [`SessionDir::finish`] exported from the recording: one entry per model session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub sessions: Vec<ExportedSession>,
}

/// The cloud and trajectory of one model session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSession {
    pub cloud: PathBuf,
    pub points: usize,
    pub trajectory: PathBuf,
    pub poses: usize,
}

impl SessionDir {
    /// Creates `dir` and its `frames/` folder; a folder that already holds files is refused,
    /// so a run never mixes into an older one.
    pub fn create(dir: &Path) -> Result<Self, RecordError> {
        if dir.exists() {
            let mut entries = std::fs::read_dir(dir).map_err(|e| RecordError::io(dir, e))?;
            if entries.next().is_some() {
                return Err(RecordError::NotEmpty {
                    path: dir.to_path_buf(),
                });
            }
        }
        let frames = dir.join(FRAMES_DIR);
        std::fs::create_dir_all(&frames).map_err(|e| RecordError::io(&frames, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            frames: 0,
            points: 0,
            dropped: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where the recorder writes the session inside the folder.
    pub fn session_file(&self) -> PathBuf {
        self.dir.join(SESSION_FILE)
    }

    /// Writes `frames/NNNNNN.json` for `r`, at once, so the folder shows progress and a killed
    /// run leaves every processed frame's metadata beside its recording.
    pub fn write_frame(&mut self, r: &FrameResult) -> Result<(), RecordError> {
        let path = self
            .dir
            .join(FRAMES_DIR)
            .join(format!("{:06}.json", r.frame));
        let bytes = serde_json::to_vec_pretty(&frame_meta(r)).map_err(|e| RecordError::Export {
            path: path.clone(),
            what: e.to_string(),
        })?;
        super::export::write_file_unsynced(&path, |w| w.write_all(&bytes))?;
        self.frames += 1;
        self.points += r.points.len() as u64;
        self.dropped += r.dropped_before;
        Ok(())
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Points of the frames written so far.
    pub fn points(&self) -> u64 {
        self.points
    }

    /// Frames the source dropped before the frames written so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Writes `summary.json`, then the cloud and trajectory from the finished recording: one
    /// pair for a run of one model session (or none), one pair per session, suffixed
    /// `-session-N`, for a run that was reset (the sessions' worlds are not aligned).
    pub fn finish(&self, summary: &impl Serialize) -> Result<Exported, RecordError> {
        self.write_summary(summary)?;
        let reader = SessionReader::open(self.session_file())?;
        let all = sessions::model_sessions(&reader);
        let (cloud, trajectory) = (self.dir.join(CLOUD_FILE), self.dir.join(TRAJECTORY_FILE));
        if all.len() <= 1 {
            let frames = all.into_iter().next().unwrap_or(0..0);
            let one = export_session(&reader, frames, cloud, trajectory)?;
            return Ok(Exported {
                sessions: vec![one],
            });
        }
        let sessions = all
            .into_iter()
            .enumerate()
            .map(|(i, frames)| {
                export_session(
                    &reader,
                    frames,
                    sessions::suffixed(&cloud, i + 1),
                    sessions::suffixed(&trajectory, i + 1),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(Exported { sessions })
    }
}

impl SessionDir {
    /// Writes `summary.json` (all [`Self::finish`] does for a run without a recording).
    pub fn write_summary(&self, summary: &impl Serialize) -> Result<(), RecordError> {
        let path = self.dir.join(SUMMARY_FILE);
        let bytes = serde_json::to_vec_pretty(summary).map_err(|e| RecordError::Export {
            path: path.clone(),
            what: e.to_string(),
        })?;
        // Through a temporary file: a full disk leaves no half summary.
        super::export::write_file(&path, |w| w.write_all(&bytes))
    }
}

/// Writes the cloud and the trajectory of the recording's `frames` (one model session).
fn export_session(
    reader: &SessionReader,
    frames: std::ops::Range<usize>,
    cloud_path: PathBuf,
    trajectory_path: PathBuf,
) -> Result<ExportedSession, RecordError> {
    let cloud = gather_cloud_in(reader, frames.clone(), CloudOptions::default())?;
    ply::export_ply(&cloud_path, &cloud)?;
    let poses = tum::export_tum(&trajectory_path, &reader.frames()[frames])?;
    Ok(ExportedSession {
        cloud: cloud_path,
        points: cloud.len(),
        trajectory: trajectory_path,
        poses,
    })
}

/// A frame without its arrays: what it was, where the camera stood, what the cache did.
fn frame_meta(r: &FrameResult) -> serde_json::Value {
    serde_json::json!({
        "frame": r.frame,
        "source": r.origin.name,
        // Text, with every digit: a float would round a Unix time's nanoseconds.
        "capture_time": r.origin.time.seconds_text(),
        "time_base": r.origin.time.base,
        "original_size": r.origin.original_size,
        "frame_type": r.frame_type,
        "world_from_camera": row_major(&r.world_from_camera),
        "intrinsics": r.intrinsics,
        "points": r.points.len(),
        "dropped_before": r.dropped_before,
        "timings": r.timings,
        "cache": r.cache.stats,
        "cache_events": r.cache.events,
        "depth_min_max": min_max(&r.depth),
    })
}

fn min_max(v: &[f32]) -> [f32; 2] {
    v.iter()
        .fold([f32::INFINITY, f32::NEG_INFINITY], |[lo, hi], &x| {
            [lo.min(x), hi.max(x)]
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::record::sample::sample_result;
    use crate::record::{RecorderOptions, SessionRecorder};

    #[test]
    fn a_folder_holding_files_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("old.txt"), b"keep").expect("write");
        let err = SessionDir::create(dir.path()).expect_err("not empty");
        assert!(matches!(err, RecordError::NotEmpty { .. }), "{err}");
    }

    /// A fresh session folder `root/s` and a recorder writing its session file.
    fn folder_with_recorder(root: &Path) -> (SessionDir, SessionRecorder) {
        let dir = SessionDir::create(&root.join("s")).expect("create");
        let recorder = SessionRecorder::create(
            dir.session_file(),
            &serde_json::json!({}),
            RecorderOptions {
                queue: 16,
                ..RecorderOptions::default()
            },
        )
        .expect("recorder");
        (dir, recorder)
    }

    #[test]
    fn frames_are_written_as_they_come_and_the_exports_at_the_end() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut dir, recorder) = folder_with_recorder(tmp.path());
        for i in 0..3 {
            let r = Arc::new(sample_result(i, 8, 6, 10));
            dir.write_frame(&r).expect("frame json");
            recorder.offer(r);
        }
        assert_eq!((dir.frames(), dir.points()), (3, 30));
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(FRAMES_DIR).join("000002.json")).expect("read"),
        )
        .expect("json");
        assert_eq!(meta["frame"], 2);
        assert_eq!(meta["points"], 10);
        recorder.finish();
        let exported = dir
            .finish(&serde_json::json!({ "frames_processed": 3 }))
            .expect("finish");
        assert_eq!(
            exported,
            Exported {
                sessions: vec![ExportedSession {
                    cloud: dir.path().join(CLOUD_FILE),
                    points: 30,
                    trajectory: dir.path().join(TRAJECTORY_FILE),
                    poses: 3
                }]
            }
        );
        let ply = std::fs::read(dir.path().join(CLOUD_FILE)).expect("ply");
        assert!(ply.starts_with(b"ply\n"));
        let tum = std::fs::read_to_string(dir.path().join(TRAJECTORY_FILE)).expect("tum");
        assert_eq!(tum.lines().filter(|l| !l.starts_with('#')).count(), 3);
        assert!(dir.path().join(SUMMARY_FILE).exists());
    }

    #[test]
    fn a_reset_run_gets_a_cloud_and_a_trajectory_per_model_session() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (mut dir, recorder) = folder_with_recorder(tmp.path());
        // Three frames, a reset, two frames: the second session's world is its own.
        for i in 0..5 {
            if i == 3 {
                recorder.note(format!("{}: requested", sessions::RESET_NOTICE));
            }
            let r = Arc::new(sample_result(i, 8, 6, 10 + i as usize));
            dir.write_frame(&r).expect("frame json");
            recorder.offer(r);
        }
        recorder.finish();
        let exported = dir.finish(&serde_json::json!({})).expect("finish");
        let got: Vec<(String, usize, String, usize)> = exported
            .sessions
            .iter()
            .map(|e| {
                let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
                (name(&e.cloud), e.points, name(&e.trajectory), e.poses)
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "points-session-1.ply".into(),
                    10 + 11 + 12,
                    "trajectory-session-1.tum".into(),
                    3
                ),
                (
                    "points-session-2.ply".into(),
                    13 + 14,
                    "trajectory-session-2.tum".into(),
                    2
                ),
            ]
        );
        for e in &exported.sessions {
            let tum = std::fs::read_to_string(&e.trajectory).expect("tum");
            assert_eq!(tum.lines().filter(|l| !l.starts_with('#')).count(), e.poses);
            assert!(std::fs::read(&e.cloud).expect("ply").starts_with(b"ply\n"));
        }
        // Nothing merged across the sessions is written.
        assert!(!dir.path().join(CLOUD_FILE).exists());
        assert!(!dir.path().join(TRAJECTORY_FILE).exists());
    }
}
