//! A recorded session in the window at its recorded pace: frames when they are due, and the
//! window's pause, reset, seek and speed carried out on the [`Player`].

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::{Feed, ViewerGone, send};
use crate::record::{Parts, Player};
use crate::viewer::{ViewerControl, ViewerEvent};

/// Results queued for the window; replay waits for it (nothing is live, nothing is lost).
const VIEWER_QUEUE: usize = 8;

pub struct ReplayFeed {
    pub player: Player,
    /// Start over when the end is reached.
    pub repeat: bool,
}

impl Feed for ReplayFeed {
    fn thread_name(&self) -> &'static str {
        "replay-feed"
    }

    fn queue(&self) -> usize {
        VIEWER_QUEUE
    }

    fn run(
        self: Box<Self>,
        viewer: &Sender<ViewerEvent>,
        controls: &Receiver<ViewerControl>,
    ) -> Vec<String> {
        // A replay plays until the window closes: that is its only way to end.
        if play(self.player, viewer, controls, self.repeat).is_err() {
            tracing::debug!("the window closed: the replay stops");
        }
        Vec::new()
    }
}

/// Carries out one of the window's controls; `Ok(true)` when the player moved back, so the
/// end of the input is to be announced again.
pub fn apply_control(
    player: &mut Player,
    control: ViewerControl,
    viewer: &Sender<ViewerEvent>,
) -> Result<bool, ViewerGone> {
    let send = |event: ViewerEvent| send(viewer, event);
    let now = Instant::now();
    match control {
        ViewerControl::Pause(true) => {
            player.pause(now);
            send(ViewerEvent::Paused(true))?;
        }
        ViewerControl::Pause(false) => {
            player.resume(now);
            send(ViewerEvent::Paused(false))?;
        }
        ViewerControl::Reset => {
            player.restart(now);
            send(ViewerEvent::SessionReset(
                "replay restarted from the first frame".into(),
            ))?;
            return Ok(true);
        }
        ViewerControl::Speed(speed) => {
            // Anything not a positive factor plays as fast as possible (as the player does).
            let speed = if speed.is_finite() && speed > 0.0 {
                speed
            } else {
                0.0
            };
            player.set_speed(speed, now);
            send(ViewerEvent::Status(if speed > 0.0 {
                format!("replay at {speed}× the recorded pace")
            } else {
                "replay as fast as possible".to_string()
            }))?;
        }
        ViewerControl::Seek(frame) => {
            // The cloud is append-only: start it over and feed everything before the target,
            // unpaced, so the view shows the session as it was at that frame.
            send(ViewerEvent::SessionReset(format!(
                "replay: seeking to frame {frame}"
            )))?;
            let catch_up = player.catch_up_to(frame);
            let last = catch_up.end;
            for pos in catch_up {
                // Only the newest result's images are shown: skip decoding the others.
                let parts = if pos + 1 == last {
                    Parts::ALL
                } else {
                    Parts::GEOMETRY
                };
                match player.frame_at(pos, parts) {
                    Some(Ok(r)) => send(ViewerEvent::Frame(r))?,
                    Some(Err(e)) => send(ViewerEvent::Status(format!("skipped a frame: {e}")))?,
                    None => break,
                }
            }
            // From here on at the chosen pace (or held, if paused).
            player.seek_to_frame(frame, Instant::now());
            return Ok(true);
        }
        other => send(ViewerEvent::Status(format!(
            "replay: {other:?} changes a live run; a recording plays as it was"
        )))?,
    }
    Ok(false)
}

/// Sends frames when they are due and answers the window's pause, reset, seek and speed,
/// until the window closes.
fn play(
    mut player: Player,
    viewer: &Sender<ViewerEvent>,
    controls: &Receiver<ViewerControl>,
    repeat: bool,
) -> Result<(), ViewerGone> {
    let mut ended_sent = false;
    loop {
        let wait = player.wait(Instant::now());
        let control = match wait {
            Some(d) if d.is_zero() => controls.try_recv().ok(),
            // Paused or at the end: nothing to do until the window asks.
            Some(d) => match controls.recv_timeout(d) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Err(ViewerGone),
            },
            None => match controls.recv_timeout(Duration::from_millis(200)) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Err(ViewerGone),
            },
        };
        if let Some(control) = control {
            let rewound = apply_control(&mut player, control, viewer)?;
            ended_sent &= !rewound;
            continue;
        }
        if player.is_finished() {
            if repeat {
                player.restart(Instant::now());
                send(viewer, ViewerEvent::SessionReset("replay looped".into()))?;
            } else if !ended_sent {
                ended_sent = true;
                send(viewer, ViewerEvent::InputEnded)?;
            }
            continue;
        }
        if player.wait(Instant::now()).is_some_and(|d| d.is_zero()) {
            let event = match player.next_frame(Parts::ALL) {
                Some(Ok(r)) => ViewerEvent::Frame(r),
                Some(Err(e)) => ViewerEvent::Status(format!("skipped a frame: {e}")),
                None => continue,
            };
            send(viewer, event)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crossbeam_channel::unbounded;

    use crate::record::sample::sample_result;
    use crate::record::{RecorderOptions, ReplayOptions, SessionReader, SessionRecorder};

    const FRAMES: u64 = 10;

    /// A session of frames 0..FRAMES recorded through the recorder into a tempdir.
    fn session() -> (tempfile::TempDir, Arc<SessionReader>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.srec");
        let recorder = SessionRecorder::create(
            &path,
            &serde_json::json!({}),
            RecorderOptions {
                queue: 64,
                ..RecorderOptions::default()
            },
        )
        .expect("create");
        for i in 0..FRAMES {
            recorder.offer(Arc::new(sample_result(i, 16, 12, 20)));
        }
        let status = recorder.finish();
        assert_eq!(status.frames_recorded, FRAMES);
        let reader = SessionReader::open(&path).expect("open");
        (dir, Arc::new(reader))
    }

    /// The events in short form: `reset`, `frame N`, `ended`, `paused`, `status`, ….
    fn short(e: &ViewerEvent) -> String {
        match e {
            ViewerEvent::Frame(r) => format!("frame {}", r.frame),
            ViewerEvent::SessionReset(_) => "reset".into(),
            ViewerEvent::InputEnded => "ended".into(),
            ViewerEvent::Paused(p) => format!("paused {p}"),
            ViewerEvent::Status(_) => "status".into(),
            other => format!("{other:?}"),
        }
    }

    fn frames(from: u64, to: u64) -> Vec<String> {
        (from..to).map(|i| format!("frame {i}")).collect()
    }

    #[test]
    fn seek_rebuilds_the_view_up_to_the_target_then_plays_on_from_it() {
        let (_dir, reader) = session();
        let mut player = Player::new(reader, ReplayOptions::default(), Instant::now());
        let (tx, rx) = unbounded();

        assert_eq!(
            apply_control(&mut player, ViewerControl::Seek(6), &tx),
            Ok(true)
        );
        let got: Vec<String> = rx.try_iter().map(|e| short(&e)).collect();
        let mut want = vec!["reset".to_string()];
        want.extend(frames(0, 6));
        assert_eq!(got, want);
        assert_eq!(player.position(), 6);
        let next = player
            .next_frame(Parts::GEOMETRY)
            .expect("more")
            .expect("ok");
        assert_eq!(next.frame, 6);

        // Backwards: the view starts over again.
        assert_eq!(
            apply_control(&mut player, ViewerControl::Seek(2), &tx),
            Ok(true)
        );
        let got: Vec<String> = rx.try_iter().map(|e| short(&e)).collect();
        assert_eq!(got, vec!["reset", "frame 0", "frame 1"]);
        assert_eq!(player.position(), 2);

        // Past the end: everything, and nothing left to play.
        apply_control(&mut player, ViewerControl::Seek(1000), &tx).expect("open");
        assert_eq!(rx.try_iter().count(), 1 + FRAMES as usize);
        assert!(player.is_finished());
    }

    #[test]
    fn a_seek_while_paused_stays_paused_and_speed_changes_the_pace() {
        let (_dir, reader) = session();
        let mut player = Player::new(reader, ReplayOptions::default(), Instant::now());
        let (tx, rx) = unbounded();
        apply_control(&mut player, ViewerControl::Pause(true), &tx).expect("open");
        apply_control(&mut player, ViewerControl::Seek(4), &tx).expect("open");
        assert!(player.is_paused());
        assert_eq!(player.wait(Instant::now()), None);
        apply_control(&mut player, ViewerControl::Pause(false), &tx).expect("open");
        // Speed 0 (and nonsense) is as fast as possible: due at once.
        apply_control(&mut player, ViewerControl::Speed(0.0), &tx).expect("open");
        assert_eq!(player.wait(Instant::now()), Some(Duration::ZERO));
        apply_control(&mut player, ViewerControl::Speed(f64::NAN), &tx).expect("open");
        assert_eq!(player.wait(Instant::now()), Some(Duration::ZERO));
        apply_control(&mut player, ViewerControl::Speed(0.25), &tx).expect("open");
        let got: Vec<String> = rx.try_iter().map(|e| short(&e)).collect();
        let mut want = vec!["paused true".to_string(), "reset".into()];
        want.extend(frames(0, 4));
        want.extend(["paused false", "status", "status", "status"].map(String::from));
        assert_eq!(got, want);
        drop(rx);
        assert_eq!(
            apply_control(&mut player, ViewerControl::Speed(1.0), &tx),
            Err(ViewerGone)
        );
    }

    #[test]
    fn the_feeding_loop_plays_to_the_end_and_seeks_back_from_there() {
        let (_dir, reader) = session();
        let options = ReplayOptions {
            speed: 0.0,
            ..ReplayOptions::default()
        };
        let player = Player::new(reader, options, Instant::now());
        let (events_tx, events_rx) = unbounded();
        let (control_tx, control_rx) = unbounded();
        let feeder = std::thread::spawn(move || {
            play(player, &events_tx, &control_rx, false).expect_err("ends when the window goes")
        });
        let next = || {
            events_rx
                .recv_timeout(Duration::from_secs(10))
                .map(|e| short(&e))
                .expect("an event")
        };
        let first: Vec<String> = (0..=FRAMES).map(|_| next()).collect();
        let mut want = frames(0, FRAMES);
        want.push("ended".into());
        assert_eq!(first, want);

        control_tx.send(ViewerControl::Seek(7)).expect("open");
        let after: Vec<String> = (0..=FRAMES + 1).map(|_| next()).collect();
        let mut want = vec!["reset".to_string()];
        want.extend(frames(0, 7));
        want.extend(frames(7, FRAMES));
        want.push("ended".into());
        assert_eq!(after, want, "caught up to 7, played on, ended again");

        drop(control_tx);
        assert_eq!(
            feeder
                .join()
                .expect("the feeder returns when the window goes"),
            ViewerGone
        );
    }
}
