//! What `streamrecon run --headless` prints: the progress bar while it runs, the summary after.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::frame::FrameResult;
use crate::pipeline::PipelineSummary;
use crate::record::session_dir::Exported;
use crate::record::{RecorderStatus, SessionDir};

pub fn progress_bar(total: Option<u64>) -> ProgressBar {
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = if total.is_some() {
        "{bar:30} {pos}/{len} {msg}"
    } else {
        "{spinner} {pos} frames {msg}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

pub fn progress_message(r: &FrameResult, dir: &SessionDir, started: Instant) -> String {
    let s = &r.cache.stats;
    let fps = dir.frames() as f64 / started.elapsed().as_secs_f64().max(1e-9);
    format!(
        "{fps:.2} fps | cache {}/{} pages, {} committed | {} points | {} dropped",
        s.allocated_pages.saturating_sub(s.free_pages),
        s.max_pages,
        s.frames_committed,
        dir.points(),
        dir.dropped()
    )
}

pub fn print_summary(s: &PipelineSummary, dir: &SessionDir) {
    println!("input:      {}", s.source);
    println!("model:      {}", s.model);
    println!(
        "frames:     {} processed of {} captured ({} dropped, {} skipped, {} discarded at stop)",
        s.frames_processed,
        s.frames_captured,
        s.frames_dropped,
        s.frames_skipped,
        s.frames_discarded
    );
    println!(
        "kinds:      {} scale, {} keyframes, {} non-keyframes; {} committed at the end; {} session(s)",
        s.scale_frames, s.keyframes, s.non_keyframes, s.committed_frames_at_end, s.sessions
    );
    println!(
        "speed:      {:.2} fps over {:.2} s; {:.2} fps after the first result ({})",
        s.fps,
        s.wall_s,
        s.steady_fps,
        match s.first_result_s {
            Some(t) => format!("{t:.2} s after the start"),
            None => "no result".to_owned(),
        }
    );
    if s.consumer_wait_s > 0.0005 {
        println!(
            "waited:     {:.3} s handing results to consumers that were behind",
            s.consumer_wait_s
        );
    }
    let stages: Vec<String> = s
        .mean_stage_ms
        .iter()
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect();
    println!("mean ms:    {}", stages.join(", "));
    println!("points:     {}", dir.points());
    println!("session:    {}", dir.path().display());
    for w in &s.warnings {
        println!("warning:    {w}");
    }
}

pub fn print_recorded(recorded: &RecorderStatus) {
    println!(
        "recorded:   {} frames, {} bytes in {}{}",
        recorded.frames_recorded,
        recorded.bytes_written,
        recorded.path.display(),
        if recorded.results_not_recorded > 0 {
            format!(
                " ({} results not recorded: the recorder fell behind)",
                recorded.results_not_recorded
            )
        } else {
            String::new()
        }
    );
}

/// The cloud and trajectory files written at the end, one pair per model session.
pub fn print_exported(exported: &Exported) {
    if exported.sessions.len() > 1 {
        println!(
            "note:       {} model sessions (resets): their worlds are not aligned, so each has its own cloud and trajectory",
            exported.sessions.len()
        );
    }
    for e in &exported.sessions {
        println!(
            "exported:   {} ({} points), {} ({} poses)",
            e.cloud.display(),
            e.points,
            e.trajectory.display(),
            e.poses
        );
    }
}

/// The end-of-run files that a failed finish did not write, for the message (empty if none).
pub fn missing_outputs(dir: &SessionDir) -> String {
    use crate::record::export::sessions::suffixed;
    use crate::record::session_dir::{CLOUD_FILE, SUMMARY_FILE, TRAJECTORY_FILE};
    // A reset run writes `-session-N` files instead of the plain ones.
    let written = |name: &str| {
        let plain = dir.path().join(name);
        plain.exists() || suffixed(&plain, 1).exists()
    };
    let missing: Vec<&str> = [SUMMARY_FILE, CLOUD_FILE, TRAJECTORY_FILE]
        .into_iter()
        .filter(|name| !written(name))
        .collect();
    if missing.is_empty() {
        String::new()
    } else {
        format!("; not written: {}", missing.join(", "))
    }
}
