//! What the panels show, accumulated from the stream of `FrameResult`s: latency per stage, the
//! cache's events on a timeline, the latest page map with highlights, poses, scene bounds.
//!
//! Pure bookkeeping (no egui, no wgpu), so it is tested without a window.

use std::collections::VecDeque;

use glam::Vec3;

use super::lines::CameraPose;
use crate::frame::{FrameResult, StageTime};
use crate::kvcache::{CacheEvent, CacheStats, PageState};

/// Frames of latency kept for the plot and the median/p99.
pub const LATENCY_HISTORY: usize = 300;
/// Cache events kept for the timeline.
pub const TIMELINE_HISTORY: usize = 4000;
/// Frames an evicted page stays highlighted in the page map.
pub const EVICTION_HIGHLIGHT_FRAMES: u64 = 6;

#[derive(Debug, Clone, PartialEq)]
pub struct LatencySample {
    pub frame: u64,
    pub stages: Vec<StageTime>,
}

impl LatencySample {
    pub fn total_ms(&self) -> f64 {
        self.stages.iter().map(|s| s.ms).sum()
    }
}

/// A lane of the eviction timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimelineLane {
    Committed,
    Transient,
    Evicted,
    RolledBack,
    SpecialDropped,
    Reset,
}

impl TimelineLane {
    pub const ALL: [Self; 6] = [
        Self::Committed,
        Self::Transient,
        Self::Evicted,
        Self::RolledBack,
        Self::SpecialDropped,
        Self::Reset,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Committed => "committed",
            Self::Transient => "transient",
            Self::Evicted => "evicted",
            Self::RolledBack => "rolled back",
            Self::SpecialDropped => "special dropped",
            Self::Reset => "reset",
        }
    }
}

/// One cache event placed on the timeline: at step `step` (the result's frame), about `frame`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineEvent {
    pub step: u64,
    pub lane: TimelineLane,
    pub frame: u64,
    pub pages: usize,
}

/// The page map of the newest result, with what changed in it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PageMapState {
    pub pages: Vec<PageState>,
    pub page_size: usize,
    /// Frame of the newest result.
    pub current_frame: u64,
    /// Pages written by the newest step.
    pub newest: Vec<u32>,
    /// Pages freed by evictions, with the step that freed them (fading highlight).
    pub evicted: Vec<(u32, u64)>,
}

impl PageMapState {
    pub fn is_newest(&self, page: u32) -> bool {
        self.newest.contains(&page)
    }

    /// Steps since `page` was evicted, if recently.
    pub fn evicted_ago(&self, page: u32) -> Option<u64> {
        self.evicted
            .iter()
            .rev()
            .find(|(p, _)| *p == page)
            .map(|&(_, at)| self.current_frame.saturating_sub(at))
    }
}

/// Axis-aligned bounds of everything seen (points and cameras).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub min: Vec3,
    pub max: Vec3,
}

impl Bounds {
    pub fn centre(&self) -> Vec3 {
        (self.min + self.max) * 0.5
    }
    pub fn radius(&self) -> f32 {
        ((self.max - self.min).length() * 0.5).max(0.05)
    }
    fn include(&mut self, p: Vec3) {
        self.min = self.min.min(p);
        self.max = self.max.max(p);
    }
}

#[derive(Debug, Clone, Default)]
pub struct StreamHistory {
    pub latencies: VecDeque<LatencySample>,
    pub timeline: VecDeque<TimelineEvent>,
    pub page_map: PageMapState,
    pub stats: CacheStats,
    pub poses: Vec<CameraPose>,
    pub bounds: Option<Bounds>,
    pub frames_received: u64,
    pub frames_dropped: u64,
    /// Largest camera-to-point distance seen (the depth colour ramp's far end).
    pub max_depth: f32,
    /// Range of log(confidence) seen (the confidence colour ramp).
    pub log_confidence_range: Option<(f32, f32)>,
}

impl StreamHistory {
    pub fn latest_frame(&self) -> Option<u64> {
        self.poses.last().map(|p| p.frame)
    }

    pub fn ingest(&mut self, result: &FrameResult) {
        self.frames_received += 1;
        self.frames_dropped += result.dropped_before;

        push_capped(
            &mut self.latencies,
            LatencySample {
                frame: result.frame,
                stages: result.timings.clone(),
            },
            LATENCY_HISTORY,
        );

        let reset = result
            .cache
            .events
            .iter()
            .any(|e| matches!(e, CacheEvent::Reset));
        if reset {
            self.clear_scene();
        }
        self.ingest_cache(result);
        self.poses.push(CameraPose {
            frame: result.frame,
            frame_type: result.frame_type,
            world_from_camera: result.world_from_camera,
            intrinsics: result.intrinsics,
        });
        self.ingest_points(result);
    }

    fn ingest_cache(&mut self, result: &FrameResult) {
        let step = result.frame;
        let map = &mut self.page_map;
        map.current_frame = step;
        map.pages = result.cache.page_map.clone();
        map.page_size = result.cache.stats.page_size;
        map.newest.clear();
        map.evicted
            .retain(|&(_, at)| step.saturating_sub(at) < EVICTION_HIGHLIGHT_FRAMES);
        self.stats = result.cache.stats.clone();
        for event in &result.cache.events {
            let placed = match event {
                CacheEvent::FrameAppended {
                    frame,
                    pages,
                    transient,
                    ..
                } => {
                    map.newest.extend(pages);
                    let lane = if *transient {
                        TimelineLane::Transient
                    } else {
                        TimelineLane::Committed
                    };
                    Some((lane, *frame, pages.len()))
                }
                CacheEvent::FrameEvicted { frame, pages } => {
                    map.evicted.extend(pages.iter().map(|&p| (p, step)));
                    Some((TimelineLane::Evicted, *frame, pages.len()))
                }
                CacheEvent::RolledBack { frames } => frames
                    .first()
                    .map(|&f| (TimelineLane::RolledBack, f, frames.len())),
                CacheEvent::SpecialPageOpened { page } => {
                    map.newest.push(*page);
                    None
                }
                CacheEvent::SpecialPageDropped { .. } => {
                    Some((TimelineLane::SpecialDropped, step, 1))
                }
                CacheEvent::Reset => Some((TimelineLane::Reset, step, 0)),
                _ => None,
            };
            if let Some((lane, frame, pages)) = placed {
                push_capped(
                    &mut self.timeline,
                    TimelineEvent {
                        step,
                        lane,
                        frame,
                        pages,
                    },
                    TIMELINE_HISTORY,
                );
            }
        }
    }

    fn ingest_points(&mut self, result: &FrameResult) {
        let camera = result.camera_position();
        let bounds = self.bounds.get_or_insert(Bounds {
            min: camera,
            max: camera,
        });
        bounds.include(camera);
        // A sparse sample is plenty for bounds and colour ranges, and keeps ingest cheap.
        let step = (result.points.len() / 512).max(1);
        for (i, xyz) in result.points.xyz.iter().enumerate().step_by(step) {
            let p = Vec3::from_array(*xyz);
            if !p.is_finite() {
                continue;
            }
            bounds.include(p);
            self.max_depth = self.max_depth.max((p - camera).length());
            if let Some(&c) = result.points.confidence.get(i) {
                let l = c.max(1e-6).ln();
                let range = self.log_confidence_range.get_or_insert((l, l));
                range.0 = range.0.min(l);
                range.1 = range.1.max(l);
            }
        }
    }

    /// Forgets the reconstruction (poses, bounds, highlights) for a new session; latency and
    /// the timeline keep running so the reset itself stays visible.
    pub fn clear_scene(&mut self) {
        self.poses.clear();
        self.bounds = None;
        self.max_depth = 0.0;
        self.log_confidence_range = None;
        self.page_map.evicted.clear();
    }

    /// A new session that the results themselves do not announce (the pipeline's
    /// `SessionReset`): clears the scene and marks the timeline.
    pub fn session_reset(&mut self) {
        self.clear_scene();
        let step = self.page_map.current_frame;
        push_capped(
            &mut self.timeline,
            TimelineEvent {
                step,
                lane: TimelineLane::Reset,
                frame: step,
                pages: 0,
            },
            TIMELINE_HISTORY,
        );
    }

    /// Median and 99th percentile of the total per-frame latency over the kept history.
    pub fn latency_median_p99(&self) -> Option<(f64, f64)> {
        let mut totals: Vec<f64> = self.latencies.iter().map(LatencySample::total_ms).collect();
        if totals.is_empty() {
            return None;
        }
        totals.sort_by(f64::total_cmp);
        let at = |q: f64| totals[((totals.len() - 1) as f64 * q).round() as usize];
        Some((at(0.5), at(0.99)))
    }

    /// Stage names in first-seen order across the kept history (the stacking order).
    pub fn stage_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for sample in &self.latencies {
            for stage in &sample.stages {
                if !names.contains(&stage.stage) {
                    names.push(stage.stage.clone());
                }
            }
        }
        names
    }
}

fn push_capped<T>(queue: &mut VecDeque<T>, item: T, cap: usize) {
    if queue.len() == cap {
        queue.pop_front();
    }
    queue.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::viewer::demo::DemoStream;

    #[test]
    fn ingest_tracks_poses_events_and_latency() {
        let mut stream = DemoStream::new(Default::default());
        let mut history = StreamHistory::default();
        for _ in 0..30 {
            history.ingest(&stream.next_result());
        }
        assert_eq!(history.poses.len(), 30);
        assert_eq!(history.latencies.len(), 30);
        assert!(
            history
                .timeline
                .iter()
                .any(|e| e.lane == TimelineLane::Evicted)
        );
        assert!(!history.page_map.pages.is_empty());
        assert!(!history.page_map.newest.is_empty());
        let (median, p99) = history.latency_median_p99().expect("samples");
        assert!(median > 0.0 && p99 >= median);
        assert!(history.bounds.is_some());
        assert!(history.stage_names().len() >= 3);
    }

    #[test]
    fn eviction_highlight_fades() {
        let mut stream = DemoStream::new(Default::default());
        let mut history = StreamHistory::default();
        for _ in 0..60 {
            history.ingest(&stream.next_result());
        }
        let now = history.page_map.current_frame;
        assert!(
            history
                .page_map
                .evicted
                .iter()
                .all(|&(_, at)| now - at < EVICTION_HIGHLIGHT_FRAMES)
        );
    }
}
