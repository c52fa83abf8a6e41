//! The demo stream in the window: a synthetic room with a simulated cache and no model, at a
//! steady frame rate, obeying pause and reset.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{Feed, ViewerGone, send};
use crate::pipeline::KeyframeRule;
use crate::viewer::demo::{DemoConfig, DemoStream};
use crate::viewer::{StreamSettings, ViewerControl, ViewerEvent};

/// Events queued between the feed and the window.
const VIEWER_QUEUE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoFeed {
    /// Frames per second; positive.
    pub fps: f64,
    pub config: DemoConfig,
    /// Frames before the stream ends (`None`: endless).
    pub frames: Option<u64>,
}

impl Feed for DemoFeed {
    fn thread_name(&self) -> &'static str {
        "demo-source"
    }

    fn queue(&self) -> usize {
        VIEWER_QUEUE
    }

    fn run(
        self: Box<Self>,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Vec<String> {
        // The window closing is the demo's only way to end: nothing to report either way.
        if self.play(viewer, controls).is_err() {
            tracing::debug!("the window closed: the demo stream stops");
        }
        Vec::new()
    }
}

impl DemoFeed {
    fn play(
        &self,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Result<(), ViewerGone> {
        // Any rate is safe here: one the clock cannot hold becomes a frame a minute.
        let period = Duration::try_from_secs_f64(1.0 / self.fps)
            .unwrap_or(Duration::from_secs(60))
            .min(Duration::from_secs(60));
        let mut stream = DemoStream::new(self.config);
        send(
            viewer,
            ViewerEvent::Settings(StreamSettings {
                paged: true,
                sliding_window: self.config.sliding_window,
                keyframe_rule: KeyframeRule::Fixed {
                    interval: self.config.keyframe_interval,
                },
            }),
        )?;
        let mut paused = false;
        let mut sent = 0u64;
        loop {
            let deadline = Instant::now() + period;
            loop {
                match controls.recv_deadline(deadline) {
                    Ok(ViewerControl::Pause(p)) => {
                        paused = p;
                        send(viewer, ViewerEvent::Paused(p))?;
                    }
                    Ok(ViewerControl::Reset) => stream.reset(),
                    // The demo has no model, recording or timeline to change.
                    Ok(_) => {}
                    Err(RecvTimeoutError::Timeout) => break,
                    // Checked here too, so a paused demo notices the window closing.
                    Err(RecvTimeoutError::Disconnected) => return Err(ViewerGone),
                }
            }
            if paused {
                continue;
            }
            if self.frames.is_some_and(|n| sent >= n) {
                send(viewer, ViewerEvent::InputEnded)?;
                // Stay until the window closes, still answering controls (nothing to do).
                while controls.recv().is_ok() {}
                return Err(ViewerGone);
            }
            sent += 1;
            send(viewer, ViewerEvent::Frame(Arc::new(stream.next_result())))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crossbeam_channel::unbounded;

    use super::*;

    #[test]
    fn a_paused_demo_stops_when_the_window_closes() {
        let (events_tx, events_rx) = unbounded();
        let (control_tx, control_rx) = unbounded();
        let (done_tx, done_rx) = unbounded();
        let feed = DemoFeed {
            fps: 1000.0,
            config: DemoConfig::default(),
            frames: None,
        };
        control_tx.send(ViewerControl::Pause(true)).expect("open");
        std::thread::spawn(move || {
            let ended = feed.play(&events_tx, &control_rx);
            done_tx.send(ended).expect("the test waits for the answer");
        });
        let wait = Duration::from_secs(10);
        while !matches!(
            events_rx.recv_timeout(wait).expect("an event"),
            ViewerEvent::Paused(true)
        ) {}
        drop(control_tx);
        assert_eq!(done_rx.recv_timeout(wait), Ok(Err(ViewerGone)));
    }
}
