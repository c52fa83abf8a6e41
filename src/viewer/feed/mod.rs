//! What feeds the window: one way in for a live pipeline ([`LiveFeed`]), a recorded session
//! ([`ReplayFeed`]) and the demo stream ([`DemoFeed`]). A feed runs on a thread of its own,
//! sends [`ViewerEvent`]s and answers [`ViewerControl`]s until the window closes; [`show`]
//! starts it, runs the window on the calling thread and waits for the feed to stop.

pub mod demo;
pub mod live;
pub mod replay;

use std::thread;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};

pub use demo::DemoFeed;
pub use live::{LiveFeed, LoadError, LoadModel, LoadedModel, RecordingPlan};
pub use replay::ReplayFeed;

use super::{ViewerControl, ViewerError, ViewerEvent, ViewerOptions, ViewerReport, run_viewer};

/// How long [`show`] waits, after the window closes, for the feed to stop (a live feed stops
/// its pipeline and finishes a recording, writing its index), before giving up on it.
pub const FEED_EXIT_WAIT: Duration = Duration::from_secs(10);

/// The window has closed: a feed stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewerGone;

/// Sends one event to the window.
pub(crate) fn send(viewer: &Sender<ViewerEvent>, event: ViewerEvent) -> Result<(), ViewerGone> {
    viewer.send(event).map_err(|_| ViewerGone)
}

/// A producer of what the window shows.
pub trait Feed: Send + 'static {
    /// The name of the feed's thread.
    fn thread_name(&self) -> &'static str;

    /// Events queued between the feed and the window.
    fn queue(&self) -> usize;

    /// Sends events and answers controls until the window closes (or the feed has nothing
    /// more to do). Returns lines for the terminal, said once the feed has stopped.
    fn run(
        self: Box<Self>,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Vec<String>;
}

/// How a window with a feed ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FedRun {
    pub report: ViewerReport,
    /// Whether the feed stopped within [`FEED_EXIT_WAIT`] after the window closed.
    pub feed_stopped: bool,
    /// What the feed had to say when it stopped.
    pub feed_lines: Vec<String>,
}

/// Opens the window on `feed`: the feed runs on its own thread, the window on this one.
pub fn show(feed: Box<dyn Feed>, options: ViewerOptions) -> Result<FedRun, ViewerError> {
    let (events_tx, events_rx) = bounded::<ViewerEvent>(feed.queue());
    let (control_tx, control_rx) = unbounded::<ViewerControl>();
    let (done_tx, done_rx) = bounded::<Vec<String>>(1);
    let name = feed.thread_name();
    thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let lines = feed.run(&events_tx, &control_rx);
            // `show` stops listening after FEED_EXIT_WAIT; lines sent later have no reader.
            if done_tx.send(lines).is_err() {
                tracing::debug!("a feed stopped after the viewer had stopped waiting for it");
            }
        })
        .map_err(|e| ViewerError::Spawn(name, e))?;
    let report = run_viewer(events_rx, Some(control_tx), options);
    // The window has closed, so the feed's channels are gone and it is stopping.
    let (feed_stopped, feed_lines) = match done_rx.recv_timeout(FEED_EXIT_WAIT) {
        Ok(lines) => (true, lines),
        Err(RecvTimeoutError::Timeout) => (false, Vec::new()),
        // The feed's thread ended without a word (it panicked): it has stopped all the same.
        Err(RecvTimeoutError::Disconnected) => (true, Vec::new()),
    };
    Ok(FedRun {
        report: report?,
        feed_stopped,
        feed_lines,
    })
}
