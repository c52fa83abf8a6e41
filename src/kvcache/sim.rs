//! The page table driven over a stream without a model: what every phase-2 step's attention
//! sees (`streamrecon cache-sim`, and the property tests that check the rules).

use serde::Serialize;
use std::ops::ControlFlow;

use super::{CacheConfig, CacheError, PageTable, SpecialPoolFull, StepKind, StepPlan};

/// The stream and the cache to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Frames in the stream.
    pub frames: u64,
    /// Scale frames (phase 1, kept forever).
    pub scale_frames: usize,
    /// Keyframes kept in full after the scale frames.
    pub sliding_window: usize,
    /// Every K-th frame after the scale frames is a keyframe (K ≤ 1: all of them).
    pub keyframe_interval: u64,
    /// Patch tokens per frame.
    pub patches_per_frame: usize,
    /// Tokens per page (`None`: exactly the patches per frame).
    pub page_size: Option<usize>,
    /// Committed frames whose special tokens the pool may hold.
    pub special_max_frames: u64,
    pub on_special_full: SpecialPoolFull,
    /// Global-attention layers, heads and head size: only used for the byte counts.
    pub layers: usize,
    pub heads: usize,
    pub head_dim: usize,
}

/// Why a simulation stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cache configuration: {0}")]
    Config(#[source] CacheError),
    #[error("phase 1 (scale frames): {0}")]
    Phase1(#[source] CacheError),
    #[error("frame {frame}: {source}")]
    Step {
        frame: u64,
        #[source]
        source: CacheError,
    },
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

/// Totals of a whole simulation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimSummary {
    pub frames: u64,
    pub phase1_frames: u64,
    pub steps: u64,
    pub keyframes: u64,
    pub non_keyframes: u64,
    pub frames_evicted: u64,
    pub max_kv_tokens: u64,
    pub last_kv_tokens: u64,
    pub max_pages_in_use: usize,
    pub page_size: usize,
    pub max_pages: usize,
    pub bytes_per_page_all_layers: u64,
    pub bytes_allocated_at_end: u64,
    pub bytes_resident_at_end: u64,
    pub special_pages_at_end: usize,
    pub special_tokens_dropped: u64,
}

/// Whether frame `index` of the stream is a keyframe (phase 2 counts from the scale frames).
pub fn is_keyframe(index: u64, scale_frames: u64, keyframe_interval: u64) -> bool {
    keyframe_interval <= 1 || (index - scale_frames).is_multiple_of(keyframe_interval)
}

/// Runs the simulation and calls `each` for every phase-2 step, until `each` breaks (a reader
/// that went away: the stream may be long); returns the table as the stream left it.
pub fn simulate(
    config: &SimConfig,
    mut each: impl FnMut(StepLine) -> ControlFlow<()>,
) -> Result<PageTable, SimError> {
    let mut cfg = CacheConfig::new(
        config.layers,
        config.heads,
        config.head_dim,
        config.patches_per_frame,
        config.scale_frames,
        config.sliding_window,
    );
    cfg.page_size = config.page_size;
    cfg.special_pool.max_frames = config.special_max_frames;
    cfg.special_pool.on_full = config.on_special_full;
    let mut table = PageTable::new(cfg).map_err(SimError::Config)?;
    let phase1 = (config.scale_frames as u64).min(config.frames);
    if phase1 > 0 {
        table
            .begin_step(0..phase1, StepKind::Keyframe)
            .map_err(SimError::Phase1)?;
        table.end_step().map_err(SimError::Phase1)?;
    }
    for frame in phase1..config.frames {
        let kind = if is_keyframe(frame, phase1, config.keyframe_interval) {
            StepKind::Keyframe
        } else {
            StepKind::NonKeyframe
        };
        let special_tokens = table.config().special_tokens;
        let step_error = |source| SimError::Step { frame, source };
        let step = table
            .begin_step(frame..frame + 1, kind)
            .map_err(step_error)?;
        let flow = each(StepLine::from_step(step, special_tokens));
        table.end_step().map_err(step_error)?;
        if flow.is_break() {
            break;
        }
    }
    Ok(table)
}

/// Runs the simulation and adds it up.
pub fn summarize(config: &SimConfig) -> Result<SimSummary, SimError> {
    let mut summary = SimSummary {
        frames: config.frames,
        phase1_frames: (config.scale_frames as u64).min(config.frames),
        ..SimSummary::default()
    };
    let table = simulate(config, |line| {
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
        ControlFlow::Continue(())
    })?;
    let stats = table.stats();
    summary.page_size = stats.page_size;
    summary.max_pages = stats.max_pages;
    summary.bytes_per_page_all_layers = table.config().page_bytes_all_layers();
    summary.bytes_allocated_at_end = stats.bytes_allocated;
    summary.bytes_resident_at_end = stats.bytes_resident;
    summary.special_pages_at_end = stats.special_pages;
    summary.special_tokens_dropped = stats.special_tokens_dropped;
    Ok(summary)
}
