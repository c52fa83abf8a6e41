//! The window on a running pipeline: the feed loads the model (so the window opens at once and
//! stays responsive while weights load), starts the pipeline, forwards its events to the window
//! and the window's controls to the pipeline, and records through a [`RecordingRelay`] while
//! the record toggle is on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, select, tick};

use super::{Feed, ViewerGone, send};
use crate::attention::AttentionLayout;
use crate::capture::Source;
use crate::error_chain::one_line;
use crate::pipeline::{
    Control, Delivery, FrameModel, KeyframePolicy, KeyframeRule, Outputs, Pipeline, PipelineConfig,
    PipelineEvent,
};
use crate::record::{RecordError, RecorderStatus, RecordingRelay, recording_summary};
use crate::viewer::{StreamSettings, ViewerControl, ViewerEvent};

/// Events queued between the feed and the window; the pipeline drops frames (for the window
/// only) when the window falls behind.
const VIEWER_QUEUE: usize = 16;
/// Events queued for the recording relay. Lossless, so inference would wait on a full queue,
/// but the relay only hands results to the recorder's own queue (which never blocks).
const RECORD_QUEUE: usize = 8;
/// How often the window is told how the recording is going.
const RECORD_STATUS_EVERY: Duration = Duration::from_millis(500);

/// The model a live feed runs, and for random weights the notice the window keeps on screen.
pub struct LoadedModel {
    pub model: Arc<dyn FrameModel>,
    pub notice: Option<String>,
}

/// Why the model could not load: any error will do, the window shows it with its causes.
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// Loads the model on the feed's thread; lines given to the callback go to the window's
/// status bar (a download's progress).
pub type LoadModel = Box<dyn FnOnce(&dyn Fn(String)) -> Result<LoadedModel, LoadError> + Send>;

/// How the live window records: where the toggle writes, and a file to start with.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordingPlan {
    pub dir: PathBuf,
    pub at_launch: Option<PathBuf>,
    /// The header of every recording.
    pub config: serde_json::Value,
}

/// A source run through the model, into the window.
pub struct LiveFeed {
    pub source: Box<dyn Source>,
    pub config: PipelineConfig,
    pub load_model: LoadModel,
    pub recording: RecordingPlan,
}

impl Feed for LiveFeed {
    fn thread_name(&self) -> &'static str {
        "viewer-feed"
    }

    fn queue(&self) -> usize {
        VIEWER_QUEUE
    }

    fn run(
        self: Box<Self>,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Vec<String> {
        match self.start(viewer) {
            Ok(Some(running)) => running.serve(viewer, controls),
            // Nothing runs: the window shows why (or has closed already).
            Ok(None) | Err(ViewerGone) => Vec::new(),
        }
    }
}

/// A started pipeline with its recording relay.
struct Running {
    pipeline: Pipeline,
    relay: RecordingRelay,
    events: Receiver<PipelineEvent>,
    policy: KeyframePolicy,
    record_dir: PathBuf,
}

impl LiveFeed {
    /// Loads the model and starts the relay and the pipeline; `None` when one of them could
    /// not start (the window has been told why and that nothing more comes).
    fn start(self, viewer: &Sender<ViewerEvent>) -> Result<Option<Running>, ViewerGone> {
        send(
            viewer,
            ViewerEvent::Status("loading the model…".to_string()),
        )?;
        let status = |line: String| {
            if viewer.try_send(ViewerEvent::Status(line)).is_err() {
                // The window is behind (or gone): the next report says the same, newer.
            }
        };
        let LoadedModel { model, notice } = match (self.load_model)(&status) {
            Ok(m) => m,
            Err(e) => {
                let why = one_line(e.as_ref());
                send(
                    viewer,
                    ViewerEvent::Notice(format!("could not load the model: {why}")),
                )?;
                // Nothing will come: a headless run (--exit-after) finishes with the notice shown.
                send(viewer, ViewerEvent::InputEnded)?;
                return Ok(None);
            }
        };
        if let Some(notice) = notice {
            send(viewer, ViewerEvent::Notice(notice))?;
        }
        send(viewer, ViewerEvent::Status(model.describe()))?;
        let window = self.config.window.unwrap_or(model.limits().default_window);
        let paged = self.config.layout == AttentionLayout::Paged;
        let mut outputs = Outputs::default();
        let events = outputs.subscribe(Delivery::Latest, 4);
        let relay = match RecordingRelay::spawn(
            outputs.subscribe(Delivery::Lossless, RECORD_QUEUE),
            self.recording.config,
        ) {
            Ok(r) => r,
            Err(e) => {
                send(viewer, ViewerEvent::Notice(one_line(&e)))?;
                send(viewer, ViewerEvent::InputEnded)?;
                return Ok(None);
            }
        };
        // Before the pipeline starts, so the recording has the first frame.
        if let Some(path) = &self.recording.at_launch {
            send_recording(viewer, relay.start(path))?;
        }
        let pipeline = match Pipeline::start(self.source, model, self.config, outputs) {
            Ok(p) => p,
            Err(e) => {
                send(
                    viewer,
                    ViewerEvent::Notice(format!("could not start the pipeline: {e}")),
                )?;
                send(viewer, ViewerEvent::InputEnded)?;
                if let Some(status) = relay.join() {
                    send(viewer, ViewerEvent::Recording(Some(status)))?;
                }
                return Ok(None);
            }
        };
        let policy = pipeline.keyframe_policy();
        send(
            viewer,
            ViewerEvent::Settings(StreamSettings {
                paged,
                sliding_window: window,
                keyframe_rule: policy.rule,
            }),
        )?;
        Ok(Some(Running {
            pipeline,
            relay,
            events,
            policy,
            record_dir: self.recording.dir,
        }))
    }
}

impl Running {
    /// Relays until the window closes or the pipeline ends, then stops the pipeline and
    /// finishes any recording; says how the recording went.
    fn serve(
        mut self,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Vec<String> {
        // Either way out (the window closed, the pipeline ended) leads to the same cleanup.
        if self.relay_events(viewer, controls).is_err() {
            tracing::debug!("the window closed: stopping the pipeline");
        }
        self.pipeline.stop_and_join();
        // The pipeline has stopped, so the relay's subscription ends and the file can be closed.
        self.relay
            .join()
            .map(|status| recording_summary(&status))
            .into_iter()
            .collect()
    }

    fn relay_events(
        &mut self,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Result<(), ViewerGone> {
        let status_ticks = tick(RECORD_STATUS_EVERY);
        loop {
            select! {
                recv(self.events) -> event => {
                    let Ok(event) = event else { return Ok(()) };
                    send(viewer, to_viewer(event))?;
                }
                recv(status_ticks) -> _ => {
                    if let Some(status) = self.relay.status() {
                        send(viewer, ViewerEvent::Recording(Some(status)))?;
                    }
                }
                recv(controls) -> control => {
                    let Ok(control) = control else { return Err(ViewerGone) };
                    if let ViewerControl::Recording(on) = control {
                        self.toggle_recording(on, viewer)?;
                        continue;
                    }
                    for c in to_pipeline(control, &mut self.policy) {
                        if !self.pipeline.send(c) {
                            // The pipeline has stopped; its events say why and end the loop.
                            break;
                        }
                    }
                }
            }
        }
    }

    fn toggle_recording(&self, on: bool, viewer: &Sender<ViewerEvent>) -> Result<(), ViewerGone> {
        if on {
            return send_recording(viewer, self.relay.start_in(&self.record_dir));
        }
        if let Some(finished) = self.relay.stop() {
            send(viewer, ViewerEvent::Status(recording_summary(&finished)))?;
        }
        send(viewer, ViewerEvent::Recording(None))
    }
}

/// Tells the window a recording started (or why it did not, unticking the toggle).
fn send_recording(
    viewer: &Sender<ViewerEvent>,
    started: Result<RecorderStatus, RecordError>,
) -> Result<(), ViewerGone> {
    match started {
        Ok(status) => send(viewer, ViewerEvent::Recording(Some(status))),
        Err(e) => {
            send(
                viewer,
                ViewerEvent::Notice(format!("recording failed: {}", one_line(&e))),
            )?;
            send(viewer, ViewerEvent::Recording(None))
        }
    }
}

/// What the window shows for a pipeline event.
pub fn to_viewer(event: PipelineEvent) -> ViewerEvent {
    match event {
        PipelineEvent::Frame(r) => ViewerEvent::Frame(r),
        PipelineEvent::Warning(w) => ViewerEvent::Status(format!("warning: {w}")),
        PipelineEvent::Error { stage, message } => {
            ViewerEvent::Notice(format!("{stage} failed: {message}"))
        }
        PipelineEvent::SessionReset { reason } => ViewerEvent::SessionReset(reason),
        PipelineEvent::InputEnded => ViewerEvent::InputEnded,
        PipelineEvent::Paused(p) => ViewerEvent::Paused(p),
        PipelineEvent::Stopped(summary) => ViewerEvent::Status(format!(
            "stopped: {} frames at {:.2} fps",
            summary.frames_processed, summary.fps
        )),
    }
}

/// The pipeline's requests for a window control. Layout, window and keyframe settings take
/// effect at the next reset (a session's cache cannot change shape midway), so they are
/// followed by one.
pub fn to_pipeline(control: ViewerControl, policy: &mut KeyframePolicy) -> Vec<Control> {
    match control {
        ViewerControl::Pause(true) => vec![Control::Pause],
        ViewerControl::Pause(false) => vec![Control::Resume],
        ViewerControl::Reset => vec![Control::Reset],
        ViewerControl::PagedAttention(paged) => vec![
            Control::SetAttention(if paged {
                AttentionLayout::Paged
            } else {
                AttentionLayout::Dense
            }),
            Control::Reset,
        ],
        ViewerControl::SlidingWindow(n) => vec![Control::SetWindow(n), Control::Reset],
        ViewerControl::KeyframeInterval(n) => {
            policy.rule = KeyframeRule::Fixed {
                interval: u64::from(n.max(1)),
            };
            vec![Control::SetKeyframePolicy(*policy), Control::Reset]
        }
        ViewerControl::AdaptiveKeyframes(n) => {
            policy.rule = KeyframeRule::Adaptive {
                base_interval: u64::from(n.max(1)),
            };
            vec![Control::SetKeyframePolicy(*policy), Control::Reset]
        }
        // Recording is the feed's (the relay), not the pipeline's.
        ViewerControl::Recording(_) => Vec::new(),
        // A live stream has no timeline (the window shows it only in replay).
        ViewerControl::Seek(_) | ViewerControl::Speed(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_map_to_pipeline_requests() {
        let mut policy = KeyframePolicy::default();
        assert_eq!(
            to_pipeline(ViewerControl::Pause(true), &mut policy),
            vec![Control::Pause]
        );
        assert_eq!(
            to_pipeline(ViewerControl::SlidingWindow(9), &mut policy),
            vec![Control::SetWindow(9), Control::Reset]
        );
        let requests = to_pipeline(ViewerControl::KeyframeInterval(3), &mut policy);
        assert_eq!(policy.rule, KeyframeRule::Fixed { interval: 3 });
        assert_eq!(requests.last(), Some(&Control::Reset));
        let requests = to_pipeline(ViewerControl::AdaptiveKeyframes(2), &mut policy);
        assert_eq!(policy.rule, KeyframeRule::Adaptive { base_interval: 2 });
        assert_eq!(requests.last(), Some(&Control::Reset));
        assert!(to_pipeline(ViewerControl::Recording(true), &mut policy).is_empty());
    }

    /// What the loader says while it works (a download's progress) reaches the status bar.
    #[test]
    fn the_loaders_progress_lines_reach_the_status_bar() {
        use crate::capture::{SyntheticScene, SyntheticSource};
        let feed = Box::new(LiveFeed {
            source: Box::new(SyntheticSource::new(SyntheticScene {
                frames: Some(1),
                ..SyntheticScene::default()
            })),
            config: PipelineConfig::default(),
            load_model: Box::new(
                |status: &dyn Fn(String)| -> Result<LoadedModel, LoadError> {
                    status("downloading w.bin: 1 of 2 MB (50 %)".into());
                    Err("offline".into())
                },
            ),
            recording: RecordingPlan {
                dir: PathBuf::from("unused"),
                at_launch: None,
                config: serde_json::json!({}),
            },
        });
        let (tx, rx) = crossbeam_channel::bounded(16);
        let (_controls_tx, controls_rx) = crossbeam_channel::unbounded();
        assert!(feed.run(&tx, &controls_rx).is_empty());
        drop(tx);
        let statuses: Vec<String> = rx
            .iter()
            .filter_map(|e| match e {
                ViewerEvent::Status(s) => Some(s),
                _ => None,
            })
            .collect();
        assert!(
            statuses.iter().any(|s| s.contains("downloading w.bin")),
            "{statuses:?}"
        );
    }

    #[test]
    fn pipeline_events_become_window_events() {
        assert!(matches!(
            to_viewer(PipelineEvent::Warning("slow".into())),
            ViewerEvent::Status(s) if s == "warning: slow"
        ));
        assert!(matches!(
            to_viewer(PipelineEvent::SessionReset { reason: "budget".into() }),
            ViewerEvent::SessionReset(r) if r == "budget"
        ));
        assert!(matches!(
            to_viewer(PipelineEvent::InputEnded),
            ViewerEvent::InputEnded
        ));
    }
}
