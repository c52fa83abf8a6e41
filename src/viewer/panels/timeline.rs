//! The eviction timeline: every cache event of the kept history as a mark at (step, lane).

use eframe::egui::{self, Color32};
use egui_plot::{Legend, MarkerShape, Plot, Points};

use super::page_map::{EVICTED, SCALE, SPECIAL, TRANSIENT, WINDOW};
use crate::viewer::history::{StreamHistory, TimelineLane};

fn lane_colour(lane: TimelineLane) -> Color32 {
    match lane {
        TimelineLane::Committed => WINDOW,
        TimelineLane::Transient => TRANSIENT,
        TimelineLane::Evicted => EVICTED,
        TimelineLane::RolledBack => SCALE,
        TimelineLane::SpecialDropped => SPECIAL,
        TimelineLane::Reset => Color32::WHITE,
    }
}

pub fn eviction_timeline_ui(ui: &mut egui::Ui, history: &StreamHistory) {
    let evicted = history.stats.frames_evicted;
    ui.label(format!(
        "{} frames evicted · {} live · {} special tokens dropped",
        evicted, history.stats.live_frames, history.stats.special_tokens_dropped
    ));
    Plot::new("eviction_timeline")
        .height(150.0)
        .legend(Legend::default())
        .allow_scroll(false)
        .include_y(-0.5)
        .include_y(TimelineLane::ALL.len() as f64 - 0.5)
        .show_axes([true, false])
        .show(ui, |plot_ui| {
            for (row, lane) in TimelineLane::ALL.into_iter().enumerate() {
                let marks: Vec<[f64; 2]> = history
                    .timeline
                    .iter()
                    .filter(|e| e.lane == lane)
                    .map(|e| [e.step as f64, row as f64])
                    .collect();
                if marks.is_empty() {
                    continue;
                }
                plot_ui.points(
                    Points::new(lane.label(), marks)
                        .color(lane_colour(lane))
                        .shape(MarkerShape::Square)
                        .radius(2.5),
                );
            }
        });
}
