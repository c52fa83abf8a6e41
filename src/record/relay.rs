//! Recording from a running pipeline: which pipeline events go into a session (the one
//! event → recorder mapping, shared by `run --headless` and the viewer's record toggle), and
//! the relay that lets a recording start and stop while the pipeline runs.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::SystemTime;

use crossbeam_channel::Receiver;

use super::session_name::new_session_path;
use super::{Offer, RecordError, RecorderOptions, RecorderStatus, SessionRecorder};
use crate::pipeline::PipelineEvent;

/// The notice a recording keeps for `event`, or `None` when the event is not written down
/// (frames are recorded as frames; pause, end of input and stop are not part of a session).
pub fn recorder_note(event: &PipelineEvent) -> Option<String> {
    match event {
        PipelineEvent::Warning(w) => Some(format!("warning: {w}")),
        PipelineEvent::Error { stage, message } => Some(format!("error ({stage}): {message}")),
        PipelineEvent::SessionReset { reason } => Some(format!("session reset: {reason}")),
        PipelineEvent::Frame(_)
        | PipelineEvent::InputEnded
        | PipelineEvent::Paused(_)
        | PipelineEvent::Stopped(_) => None,
    }
}

/// Hands `event` to `recorder`: a result is offered, a warning, error or reset is noted.
/// `None` when the event is not for a recording (see [`recorder_note`]).
pub fn record_event(recorder: &SessionRecorder, event: &PipelineEvent) -> Option<Offer> {
    match event {
        PipelineEvent::Frame(result) => Some(recorder.offer(Arc::clone(result))),
        other => recorder_note(other).map(|note| recorder.note(note)),
    }
}

/// One line on a finished recording, for a status bar or a terminal.
pub fn recording_summary(s: &RecorderStatus) -> String {
    let mut line = format!(
        "recorded {} frames to {} ({} bytes)",
        s.frames_recorded,
        s.path.display(),
        s.bytes_written
    );
    if s.results_not_recorded > 0 {
        line.push_str(&format!(
            "; fell behind: {} not recorded",
            s.results_not_recorded
        ));
    }
    if let Some(e) = &s.error {
        line.push_str(&format!("; {e}"));
    }
    line
}

/// A thread that drains a lossless subscription of the pipeline and hands events to the
/// recorder while one is active. It exists for the whole run (so the subscription is never
/// left full and inference never waits for it) and only offers, which never blocks; a viewer's
/// own stream drops frames and is never recorded from.
pub struct RecordingRelay {
    config: serde_json::Value,
    active: Arc<Mutex<Option<SessionRecorder>>>,
    /// Events taken off the subscription and dealt with (recorded or not).
    seen: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// The slot of the recording in progress. A panic while it was held (in the recorder's
/// `offer`) leaves the recorder itself sound: its thread owns the file, so the slot is used on.
fn slot(active: &Mutex<Option<SessionRecorder>>) -> MutexGuard<'_, Option<SessionRecorder>> {
    active.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RecordingRelay {
    /// Starts relaying `events` (a `Delivery::Lossless` subscription) until it disconnects;
    /// `config` is the session header of every recording made through it.
    pub fn spawn(
        events: Receiver<PipelineEvent>,
        config: serde_json::Value,
    ) -> Result<Self, RecordError> {
        let active: Arc<Mutex<Option<SessionRecorder>>> = Arc::default();
        let relay_slot = Arc::clone(&active);
        let seen: Arc<AtomicU64> = Arc::default();
        let counter = Arc::clone(&seen);
        let thread = thread::Builder::new()
            .name("record-relay".into())
            .spawn(move || {
                for event in events.iter() {
                    if let Some(recorder) = slot(&relay_slot).as_ref() {
                        // The recorder counts and notes what it cannot take, and a stopped
                        // recording says why in its status: the answer needs nothing more here.
                        record_event(recorder, &event);
                    }
                    counter.fetch_add(1, Ordering::AcqRel);
                }
            })
            .map_err(RecordError::Spawn)?;
        Ok(Self {
            config,
            active,
            seen,
            thread: Some(thread),
        })
    }

    /// Starts recording into `path` (which must not exist); a recording in progress is
    /// finished first.
    pub fn start(&self, path: &Path) -> Result<RecorderStatus, RecordError> {
        self.stop();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| RecordError::io(dir, e))?;
        }
        let recorder = SessionRecorder::create(path, &self.config, RecorderOptions::default())?;
        let status = recorder.status();
        *slot(&self.active) = Some(recorder);
        Ok(status)
    }

    /// Starts recording into a new timestamped file in `dir`.
    pub fn start_in(&self, dir: &Path) -> Result<RecorderStatus, RecordError> {
        let path = new_session_path(dir, SystemTime::now())?;
        self.start(&path)
    }

    /// Finishes the recording in progress (queue, index, footer) and says how it went.
    pub fn stop(&self) -> Option<RecorderStatus> {
        // Taken out under the lock, finished outside it: the relay goes on draining meanwhile.
        let recorder = slot(&self.active).take()?;
        Some(recorder.finish())
    }

    /// Events the relay has dealt with so far (whether or not a recording was active): lets a
    /// caller know that what it sent before a toggle has been through.
    pub fn events_seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    /// How the recording in progress is going (`None`: not recording).
    pub fn status(&self) -> Option<RecorderStatus> {
        slot(&self.active).as_ref().map(SessionRecorder::status)
    }

    /// Waits for the subscription to end (the pipeline stopped), then finishes any recording.
    pub fn join(mut self) -> Option<RecorderStatus> {
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the record-relay thread panicked; finishing the recording");
        }
        self.stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_errors_and_resets_are_noted_the_rest_is_not() {
        let note = |e: PipelineEvent| recorder_note(&e);
        assert_eq!(
            note(PipelineEvent::Warning("slow".into())).as_deref(),
            Some("warning: slow")
        );
        assert_eq!(
            note(PipelineEvent::Error {
                stage: "model",
                message: "nan".into()
            })
            .as_deref(),
            Some("error (model): nan")
        );
        assert_eq!(
            note(PipelineEvent::SessionReset {
                reason: "budget".into()
            })
            .as_deref(),
            Some("session reset: budget")
        );
        assert_eq!(note(PipelineEvent::InputEnded), None);
        assert_eq!(note(PipelineEvent::Paused(true)), None);
    }
}
