//! `streamrecon view`: opens the viewer on an input. The window runs on this (main) thread; the
//! stream is produced on its own thread and arrives over a bounded channel.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use crossbeam_channel::{Sender, bounded};

use crate::pipeline::FrameResult;
use crate::viewer::demo::{DemoConfig, DemoStream};
use crate::viewer::{ExitPlan, ViewerOptions, run_viewer};

#[derive(Debug, Clone, Default, Args)]
pub struct ViewArgs {
    /// What to reconstruct: `demo` (a synthetic room with a simulated cache, no model).
    #[arg(long)]
    pub input: Option<String>,
    /// Save a PNG of the window before exiting (with --exit-after).
    #[arg(long, value_name = "FILE")]
    pub screenshot: Option<PathBuf>,
    /// Close after this many processed frames (a headless check, e.g. under Xvfb).
    #[arg(long, value_name = "N")]
    pub exit_after: Option<u64>,
    /// Frames per second the demo input produces.
    #[arg(long, default_value_t = 30.0)]
    pub demo_fps: f64,
}

pub fn run(args: ViewArgs) -> anyhow::Result<()> {
    if args.screenshot.is_some() && args.exit_after.is_none() {
        anyhow::bail!("--screenshot needs --exit-after N (the screenshot is taken after N frames)");
    }
    if args.exit_after == Some(0) {
        anyhow::bail!("--exit-after must be at least 1");
    }
    let input = args.input.as_deref().unwrap_or("demo");
    let (results_tx, results_rx) = bounded::<Arc<FrameResult>>(4);
    let source_label = match input {
        "demo" | "synthetic-demo" => {
            let fps = args.demo_fps;
            if !(fps.is_finite() && fps > 0.0) {
                anyhow::bail!("--demo-fps must be a positive number, got {fps}");
            }
            spawn_demo(results_tx, fps);
            "demo: synthetic room, simulated cache (no model)".to_string()
        }
        other => anyhow::bail!(
            "input `{other}` needs the capture pipeline, which is not wired into the viewer yet; \
             use `--input demo`"
        ),
    };
    let options = ViewerOptions {
        source_label,
        notices: Vec::new(),
        exit: ExitPlan {
            exit_after: args.exit_after,
            screenshot: args.screenshot.clone(),
        },
        recording_available: false,
    };
    let report = run_viewer(results_rx, None, options).context("running the viewer")?;
    eprintln!(
        "viewer: {} frames processed, {} repaints in {:.1} s ({:.1} FPS mean), {} points on the GPU",
        report.frames_processed,
        report.repaints,
        report.seconds,
        report.mean_fps(),
        report.points_on_gpu
    );
    if let Some(error) = report.error {
        anyhow::bail!(error);
    }
    if let Some(path) = &args.screenshot {
        match &report.screenshot {
            Some(saved) => eprintln!("viewer: screenshot saved to {}", saved.display()),
            None => anyhow::bail!(
                "the window closed before the screenshot {} was taken",
                path.display()
            ),
        }
    }
    Ok(())
}

/// Feeds the synthetic demo stream at `fps` until the viewer hangs up.
fn spawn_demo(tx: Sender<Arc<FrameResult>>, fps: f64) {
    let period = Duration::from_secs_f64(1.0 / fps);
    thread::Builder::new()
        .name("demo-source".to_string())
        .spawn(move || {
            let mut stream = DemoStream::new(DemoConfig::default());
            loop {
                let started = std::time::Instant::now();
                if tx.send(Arc::new(stream.next_result())).is_err() {
                    break;
                }
                if let Some(rest) = period.checked_sub(started.elapsed()) {
                    thread::sleep(rest);
                }
            }
        })
        .map(drop)
        .unwrap_or_else(|e| tracing::error!("could not start the demo source: {e}"));
}
