//! `streamrecon replay SESSION`: a recorded session in the viewer window at its recorded pace
//! (pause and reset from the window's controls, speed and range from the command line), or,
//! with `--headless`, one summary line per frame.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use crate::frame::FrameResult;
use crate::kvcache::CacheEvent;
use crate::record::{Parts, Player, ReplayOptions};
use crate::viewer::feed::ReplayFeed;
use crate::viewer::panels::TimelineState;
use crate::viewer::{ExitPlan, ViewerOptions};

/// Slower than a thousandth of the recorded pace or faster than a million times it is no
/// replay anyone watches; such values are typos.
const MIN_SPEED: f64 = 0.001;
const MAX_SPEED: f64 = 1e6;

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
    #[arg(long, allow_hyphen_values = true)]
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
    if !(speed == 0.0 || (MIN_SPEED..=MAX_SPEED).contains(&speed)) {
        bail!(
            "--speed must be 0 (as fast as possible) or a factor from {MIN_SPEED} to \
             {MAX_SPEED}, got {speed:?}"
        );
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

/// One frame in a line: what it was (its index, source and capture time), where the camera was,
/// what the cache did, how long it took.
pub fn summary_line(r: &FrameResult) -> String {
    let s = &r.cache.stats;
    let p = r.camera_position();
    let count = |f: fn(&CacheEvent) -> bool| r.cache.events.iter().filter(|e| f(e)).count();
    format!(
        "frame {:>6} {} at {} {:<12} camera [{:>8.3} {:>8.3} {:>8.3}] points {:>7} | cache {}/{} pages, {} committed, +{} appended -{} evicted | {:.1} ms",
        r.frame,
        r.origin.name,
        r.origin.time.seconds_text(),
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
    let feed = Box::new(ReplayFeed {
        player,
        repeat: args.repeat,
    });
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
    let report = crate::viewer::show(feed, options)
        .context("running the viewer")?
        .report;
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
