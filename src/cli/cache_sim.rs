//! `streamrecon cache-sim`: drives the page table over a stream (`kvcache::sim`) and prints,
//! for every frame step after phase 1, what that step's attention sees (one JSON object per
//! line), or the totals.

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::Context;

use crate::kvcache::sim::{SimConfig, SimError, simulate, summarize};
use crate::kvcache::{CacheError, SpecialPoolFull};

#[derive(Debug, clap::Args)]
pub struct CacheSimArgs {
    /// Frames in the stream.
    #[arg(long, allow_negative_numbers = true)]
    pub frames: u64,
    /// Scale frames (phase 1, kept forever).
    #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
    pub scale_frames: usize,
    /// Keyframes kept in full after the scale frames.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub sliding_window: usize,
    /// Every K-th frame after the scale frames is a keyframe (K ≤ 1: all of them).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub keyframe_interval: u64,
    /// Patch tokens per frame (999 at 518×378).
    #[arg(long, default_value_t = 999, allow_negative_numbers = true)]
    pub patches_per_frame: usize,
    /// Tokens per page; default exactly the patches per frame. Larger pads (masked), smaller
    /// splits a frame over several pages.
    #[arg(long, allow_negative_numbers = true)]
    pub page_size: Option<usize>,
    /// Committed frames whose special tokens the pool may hold.
    #[arg(long, default_value_t = 16_384, allow_negative_numbers = true)]
    pub special_max_frames: u64,
    /// At the special pool's cap: `error` or `drop-oldest`.
    #[arg(long, default_value = "error")]
    pub on_special_full: SpecialPoolFull,
    /// Global-attention layers, heads and head size: only used for the byte counts.
    #[arg(long, default_value_t = 24, allow_negative_numbers = true)]
    pub layers: usize,
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    pub heads: usize,
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub head_dim: usize,
    /// Print totals instead of one line per step.
    #[arg(long)]
    pub summary: bool,
}

impl CacheSimArgs {
    fn sim_config(&self) -> SimConfig {
        SimConfig {
            frames: self.frames,
            scale_frames: self.scale_frames,
            sliding_window: self.sliding_window,
            keyframe_interval: self.keyframe_interval,
            patches_per_frame: self.patches_per_frame,
            page_size: self.page_size,
            special_max_frames: self.special_max_frames,
            on_special_full: self.on_special_full,
            layers: self.layers,
            heads: self.heads,
            head_dim: self.head_dim,
        }
    }
}

/// The flag behind a cache configuration field, so an error names what the person typed.
fn flag_of(field: &str) -> &'static str {
    match field {
        "layers" => "--layers",
        "heads" => "--heads",
        "head_dim" => "--head-dim",
        "patches_per_frame" => "--patches-per-frame",
        "page_size" => "--page-size",
        "sliding_window" => "--sliding-window",
        "scale_frames" => "--scale-frames",
        "special_pool.max_frames" => "--special-max-frames",
        _ => "a cache setting",
    }
}

/// A simulation error in the flags' words: an invalid configuration names the flag.
fn in_flag_terms(err: SimError) -> anyhow::Error {
    match err {
        SimError::Config(CacheError::InvalidConfig {
            field,
            value,
            expected,
        }) => anyhow::anyhow!("{} {value}: expected {expected}", flag_of(field)),
        other => other.into(),
    }
}

pub fn run(args: CacheSimArgs) -> anyhow::Result<()> {
    let config = args.sim_config();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.summary {
        serde_json::to_writer_pretty(&mut out, &summarize(&config).map_err(in_flag_terms)?)?;
        writeln!(out)?;
    } else {
        // A write error ends the simulation (the stream may be long); a reader that stopped
        // reading (`| head`) is a normal end, anything else is reported.
        let mut write_error: Option<std::io::Error> = None;
        simulate(&config, |line| {
            match serde_json::to_writer(&mut out, &line)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out))
            {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    write_error = Some(e);
                    ControlFlow::Break(())
                }
            }
        })
        .map_err(in_flag_terms)?;
        match write_error {
            Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Some(e) => return Err(e).context("writing to standard output"),
            None => {}
        }
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        flushed => flushed.context("writing to standard output"),
    }
}
