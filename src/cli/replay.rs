//! `streamrecon replay SESSION`: a recorded session in the viewer window at its recorded pace
//! (pause and reset from the window's controls, speed and range from the command line), or,
//! with `--headless`, one summary line per frame.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};

use crate::frame::FrameResult;
use crate::kvcache::CacheEvent;
use crate::record::{Parts, Player, ReplayOptions};
use crate::viewer::panels::TimelineState;
use crate::viewer::{ExitPlan, ViewerControl, ViewerEvent, ViewerOptions, run_viewer};

/// Results queued for the window; replay waits for it (nothing is live, nothing is lost).
const VIEWER_QUEUE: usize = 8;

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The session file, or a session directory holding `session.srec`.
    #[arg(value_name = "SESSION")]
    pub session: PathBuf,
    /// Print one line per frame instead of opening the window.
    #[arg(long)]
    pub headless: bool,
    /// Playback speed: 1 is the recorded pace, 0 as fast as possible. Default: 1 in the
    /// window, 0 headless.
    #[arg(long)]
    pub speed: Option<f64>,
    /// First stream frame to play.
    #[arg(long, value_name = "FRAME")]
    pub from: Option<u64>,
    /// Last stream frame to play.
    #[arg(long, value_name = "FRAME")]
    pub to: Option<u64>,
    /// Start over when the end is reached (window only).
    #[arg(long = "loop")]
    pub repeat: bool,
    /// Close the window after this many frames (a headless check, e.g. under Xvfb).
    #[arg(long, value_name = "N")]
    pub exit_after: Option<u64>,
    /// Save a PNG of the window before exiting (needs --exit-after).
    #[arg(long, value_name = "FILE")]
    pub screenshot: Option<PathBuf>,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let speed = args.speed.unwrap_or(if args.headless { 0.0 } else { 1.0 });
    if !speed.is_finite() || speed < 0.0 {
        bail!("--speed must be 0 (as fast as possible) or a positive factor, got {speed}");
    }
    if let (Some(a), Some(b)) = (args.from, args.to)
        && a > b
    {
        bail!("--from {a} is after --to {b}");
    }
    if args.screenshot.is_some() && args.exit_after.is_none() {
        bail!("--screenshot needs --exit-after N");
    }
    let reader = Arc::new(super::export::open_session(&args.session)?);
    let options = ReplayOptions {
        speed,
        from_frame: args.from,
        to_frame: args.to,
    };
    let player = Player::new(reader.clone(), options, Instant::now());
    if player.is_empty() {
        bail!(
            "{} has no frames to replay{}",
            reader.path().display(),
            if args.from.is_some() || args.to.is_some() {
                " in the range given"
            } else {
                ""
            }
        );
    }
    if args.headless {
        headless(player)
    } else {
        window(player, &args)
    }
}

fn headless(mut player: Player) -> anyhow::Result<()> {
    let mut points = 0usize;
    let mut failed = 0usize;
    let frames = player.len();
    loop {
        match player.wait(Instant::now()) {
            None => break,
            Some(d) if !d.is_zero() => std::thread::sleep(d),
            Some(_) => {}
        }
        let Some(next) = player.next_frame(Parts::GEOMETRY) else {
            break;
        };
        match next {
            Ok(r) => {
                points += r.points.len();
                println!("{}", summary_line(&r));
            }
            Err(e) => {
                failed += 1;
                eprintln!("warning: {e}");
            }
        }
    }
    let reader = player.reader();
    let not_recorded: u64 = reader
        .notices()
        .iter()
        .map(|n| n.results_not_recorded)
        .sum();
    println!(
        "replayed {} of {frames} frames, {points} points; {} read issues; {not_recorded} results not recorded (recorder notices)",
        frames - failed,
        reader.issues().len()
    );
    Ok(())
}

/// One frame in a line: what it was, where the camera was, what the cache did, how long it took.
pub fn summary_line(r: &FrameResult) -> String {
    let s = &r.cache.stats;
    let p = r.camera_position();
    let count = |f: fn(&CacheEvent) -> bool| r.cache.events.iter().filter(|e| f(e)).count();
    format!(
        "frame {:>6} {:<12} camera [{:>8.3} {:>8.3} {:>8.3}] points {:>7} | cache {}/{} pages, {} committed, +{} appended -{} evicted | {:.1} ms",
        r.frame,
        format!("{:?}", r.frame_type),
        p.x,
        p.y,
        p.z,
        r.points.len(),
        s.allocated_pages.saturating_sub(s.free_pages),
        s.max_pages,
        s.frames_committed,
        count(|e| matches!(e, CacheEvent::FrameAppended { .. })),
        count(|e| matches!(e, CacheEvent::FrameEvicted { .. })),
        r.total_ms()
    )
}

fn window(player: Player, args: &ReplayArgs) -> anyhow::Result<()> {
    let (events_tx, events_rx) = bounded::<ViewerEvent>(VIEWER_QUEUE);
    let (control_tx, control_rx) = unbounded::<ViewerControl>();
    let reader = player.reader();
    let mut notices: Vec<String> = Vec::new();
    if !reader.issues().is_empty() {
        notices.push(format!(
            "{} damaged or unreadable records were skipped (see the terminal)",
            reader.issues().len()
        ));
    }
    let not_recorded: u64 = reader
        .notices()
        .iter()
        .map(|n| n.results_not_recorded)
        .sum();
    if not_recorded > 0 {
        notices.push(format!(
            "the recorder fell behind: {not_recorded} results are missing from this recording"
        ));
    }
    let label = format!(
        "replay: {} ({} frames)",
        reader.path().display(),
        player.len()
    );
    // The frames the player plays (the range given), for the timeline's slider.
    let played = reader
        .frames()
        .iter()
        .map(|f| f.frame)
        .filter(|&f| args.from.is_none_or(|a| f >= a) && args.to.is_none_or(|b| f <= b));
    let (first_frame, last_frame) =
        played.fold((u64::MAX, 0), |(lo, hi), f| (lo.min(f), hi.max(f)));
    let timeline = TimelineState {
        first_frame: first_frame.min(last_frame),
        last_frame,
        frame: first_frame.min(last_frame),
        speed: args.speed.unwrap_or(1.0),
    };
    let repeat = args.repeat;
    std::thread::Builder::new()
        .name("replay-feed".into())
        .spawn(move || feed(player, &events_tx, &control_rx, repeat))
        .context("starting the replay thread")?;
    let options = ViewerOptions {
        source_label: label,
        notices,
        exit: ExitPlan {
            exit_after: args.exit_after,
            screenshot: args.screenshot.clone(),
        },
        recording_available: false,
        timeline: Some(timeline),
        ..ViewerOptions::default()
    };
    let report = run_viewer(events_rx, Some(control_tx), options).context("running the viewer")?;
    eprintln!(
        "viewer: {} frames replayed, {} repaints in {:.1} s",
        report.frames_processed, report.repaints, report.seconds
    );
    if let Some(error) = report.error {
        bail!(error);
    }
    if let Some(path) = &args.screenshot
        && report.screenshot.is_none()
    {
        bail!(
            "the window closed before the screenshot {} was taken",
            path.display()
        );
    }
    Ok(())
}

/// The window has closed.
#[derive(Debug, PartialEq, Eq)]
struct ViewerGone;

/// Carries out one of the window's controls; `Ok(true)` when the player moved back, so the
/// end of the input is to be announced again.
fn apply_control(
    player: &mut Player,
    control: ViewerControl,
    viewer: &Sender<ViewerEvent>,
) -> Result<bool, ViewerGone> {
    let send = |event: ViewerEvent| viewer.send(event).map_err(|_| ViewerGone);
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
fn feed(
    mut player: Player,
    viewer: &Sender<ViewerEvent>,
    controls: &Receiver<ViewerControl>,
    repeat: bool,
) {
    let mut ended_sent = false;
    loop {
        let wait = player.wait(Instant::now());
        let control = match wait {
            Some(d) if d.is_zero() => controls.try_recv().ok(),
            // Paused or at the end: nothing to do until the window asks.
            Some(d) => match controls.recv_timeout(d) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            },
            None => match controls.recv_timeout(Duration::from_millis(200)) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            },
        };
        if let Some(control) = control {
            match apply_control(&mut player, control, viewer) {
                Ok(rewound) => ended_sent &= !rewound,
                Err(ViewerGone) => return,
            }
            continue;
        }
        if player.is_finished() {
            if repeat {
                player.restart(Instant::now());
                if viewer
                    .send(ViewerEvent::SessionReset("replay looped".into()))
                    .is_err()
                {
                    return;
                }
            } else if !ended_sent {
                ended_sent = true;
                if viewer.send(ViewerEvent::InputEnded).is_err() {
                    return;
                }
            }
            continue;
        }
        if player.wait(Instant::now()).is_some_and(|d| d.is_zero()) {
            let event = match player.next_frame(Parts::ALL) {
                Some(Ok(r)) => ViewerEvent::Frame(r),
                Some(Err(e)) => ViewerEvent::Status(format!("skipped a frame: {e}")),
                None => continue,
            };
            if viewer.send(event).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::sample::sample_result;
    use crate::record::{Recorder, RecorderOptions, SessionReader};

    const FRAMES: u64 = 10;

    /// A session of frames 0..FRAMES recorded through the recorder into a tempdir.
    fn session() -> (tempfile::TempDir, Arc<SessionReader>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.srec");
        let recorder = Recorder::create(
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
        let feeder = std::thread::spawn(move || feed(player, &events_tx, &control_rx, false));
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
        feeder
            .join()
            .expect("the feeder returns when the window goes");
    }
}
