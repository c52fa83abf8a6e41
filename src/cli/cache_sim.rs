//! `streamrecon cache-sim`: drives the page table over a stream and prints, for every frame
//! step after phase 1, what that step's attention sees (one JSON object per line).

use anyhow::Context;
use serde::Serialize;

use crate::kvcache::{CacheConfig, PageTable, SpecialPoolFull, StepKind, StepPlan};

#[derive(Debug, clap::Args)]
pub struct CacheSimArgs {
    /// Frames in the stream.
    #[arg(long)]
    pub frames: u64,
    /// Scale frames (phase 1, kept forever).
    #[arg(long, default_value_t = 8)]
    pub scale_frames: usize,
    /// Keyframes kept in full after the scale frames.
    #[arg(long, default_value_t = 64)]
    pub sliding_window: usize,
    /// Every K-th frame after the scale frames is a keyframe (K ≤ 1: all of them).
    #[arg(long, default_value_t = 1)]
    pub keyframe_interval: u64,
    /// Patch tokens per frame (999 at 518×378).
    #[arg(long, default_value_t = 999)]
    pub patches_per_frame: usize,
    /// Tokens per page; default exactly the patches per frame. Larger pads (masked), smaller
    /// splits a frame over several pages.
    #[arg(long)]
    pub page_size: Option<usize>,
    /// Committed frames whose special tokens the pool may hold.
    #[arg(long, default_value_t = 16_384)]
    pub special_max_frames: u64,
    /// At the special pool's cap: `error` or `drop-oldest`.
    #[arg(long, default_value = "error", value_parser = parse_policy)]
    pub on_special_full: SpecialPoolFull,
    /// Global-attention layers, heads and head size: only used for the byte counts.
    #[arg(long, default_value_t = 24)]
    pub layers: usize,
    #[arg(long, default_value_t = 16)]
    pub heads: usize,
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// Print totals instead of one line per step.
    #[arg(long)]
    pub summary: bool,
}

fn parse_policy(s: &str) -> Result<SpecialPoolFull, String> {
    match s {
        "error" => Ok(SpecialPoolFull::Error),
        "drop-oldest" => Ok(SpecialPoolFull::DropOldest),
        other => Err(format!("`{other}`: expected error or drop-oldest")),
    }
}

/// One phase-2 frame step as its attention sees it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct StepLine {
    pub frame: u64,
    pub keyframe: bool,
    pub visible_frames: Vec<u64>,
    pub special_frames: u64,
    pub kv_tokens: u64,
    pub last_page_len: u32,
    pub pages_in_use: usize,
    pub evicted: Vec<u64>,
}

#[derive(Debug, Serialize)]
struct Summary {
    frames: u64,
    phase1_frames: u64,
    steps: u64,
    keyframes: u64,
    non_keyframes: u64,
    frames_evicted: u64,
    max_kv_tokens: u64,
    last_kv_tokens: u64,
    max_pages_in_use: usize,
    page_size: usize,
    max_pages: usize,
    bytes_per_page_all_layers: u64,
    bytes_allocated_at_end: u64,
    bytes_resident_at_end: u64,
    special_pages_at_end: usize,
    special_tokens_dropped: u64,
}

impl StepLine {
    fn from_step(step: &StepPlan, special_tokens: usize) -> Self {
        Self {
            frame: step.first_frame,
            keyframe: step.keyframe,
            visible_frames: step.visible_frames.clone(),
            special_frames: step.special_tokens_visible / special_tokens.max(1) as u64,
            kv_tokens: step.plan.kv_tokens(),
            last_page_len: step.plan.last_page_len,
            pages_in_use: step.plan.indices.len(),
            evicted: step.evicted_frames.clone(),
        }
    }
}

/// Whether frame `index` of the stream is a keyframe (phase 2 counts from the scale frames).
pub fn is_keyframe(index: u64, scale_frames: u64, keyframe_interval: u64) -> bool {
    keyframe_interval <= 1 || (index - scale_frames).is_multiple_of(keyframe_interval)
}

/// Runs the simulation and calls `each` for every phase-2 step.
pub fn simulate(args: &CacheSimArgs, mut each: impl FnMut(StepLine)) -> anyhow::Result<PageTable> {
    let mut cfg = CacheConfig::new(
        args.layers,
        args.heads,
        args.head_dim,
        args.patches_per_frame,
        args.scale_frames,
        args.sliding_window,
    );
    cfg.page_size = args.page_size;
    cfg.special_pool.max_frames = args.special_max_frames;
    cfg.special_pool.on_full = args.on_special_full;
    let mut table = PageTable::new(cfg).context("cache configuration")?;
    let phase1 = (args.scale_frames as u64).min(args.frames);
    if phase1 > 0 {
        table
            .begin_step(0..phase1, StepKind::Keyframe)
            .context("phase 1 (scale frames)")?;
        table.end_step()?;
    }
    for frame in phase1..args.frames {
        let kind = if is_keyframe(frame, phase1, args.keyframe_interval) {
            StepKind::Keyframe
        } else {
            StepKind::NonKeyframe
        };
        let special_tokens = table.config().special_tokens;
        let step = table
            .begin_step(frame..frame + 1, kind)
            .with_context(|| format!("frame {frame}"))?;
        each(StepLine::from_step(step, special_tokens));
        table.end_step()?;
    }
    Ok(table)
}

pub fn run(args: CacheSimArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.summary {
        let mut summary = Summary {
            frames: args.frames,
            phase1_frames: (args.scale_frames as u64).min(args.frames),
            steps: 0,
            keyframes: 0,
            non_keyframes: 0,
            frames_evicted: 0,
            max_kv_tokens: 0,
            last_kv_tokens: 0,
            max_pages_in_use: 0,
            page_size: 0,
            max_pages: 0,
            bytes_per_page_all_layers: 0,
            bytes_allocated_at_end: 0,
            bytes_resident_at_end: 0,
            special_pages_at_end: 0,
            special_tokens_dropped: 0,
        };
        let table = simulate(&args, |line| {
            summary.steps += 1;
            if line.keyframe {
                summary.keyframes += 1;
            } else {
                summary.non_keyframes += 1;
            }
            summary.frames_evicted += line.evicted.len() as u64;
            summary.max_kv_tokens = summary.max_kv_tokens.max(line.kv_tokens);
            summary.last_kv_tokens = line.kv_tokens;
            summary.max_pages_in_use = summary.max_pages_in_use.max(line.pages_in_use);
        })?;
        let stats = table.stats();
        summary.page_size = stats.page_size;
        summary.max_pages = stats.max_pages;
        summary.bytes_per_page_all_layers = table.config().page_bytes_all_layers();
        summary.bytes_allocated_at_end = stats.bytes_allocated;
        summary.bytes_resident_at_end = stats.bytes_resident;
        summary.special_pages_at_end = stats.special_pages;
        summary.special_tokens_dropped = stats.special_tokens_dropped;
        serde_json::to_writer_pretty(&mut out, &summary)?;
        writeln!(out)?;
    } else {
        let mut write_error = None;
        simulate(&args, |line| {
            if write_error.is_none()
                && let Err(e) = serde_json::to_writer(&mut out, &line)
                    .map_err(anyhow::Error::from)
                    .and_then(|()| {
                        writeln!(out)?;
                        Ok(())
                    })
            {
                write_error = Some(e);
            }
        })?;
        if let Some(e) = write_error {
            return Err(e.context("writing to standard output"));
        }
    }
    out.flush()?;
    Ok(())
}
