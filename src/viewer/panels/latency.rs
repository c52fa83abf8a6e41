//! Per-frame latency stacked by stage, with the median and 99th percentile of the total.

use eframe::egui::{self, Color32};
use egui_plot::{Bar, BarChart, HLine, LineStyle, Plot};

use crate::viewer::history::StreamHistory;

/// Frames shown as bars (the percentiles use the whole kept history).
const BARS: usize = 120;

fn stage_colour(i: usize) -> Color32 {
    const PALETTE: [Color32; 8] = [
        Color32::from_rgb(90, 160, 250),
        Color32::from_rgb(250, 170, 60),
        Color32::from_rgb(100, 200, 120),
        Color32::from_rgb(220, 90, 120),
        Color32::from_rgb(170, 120, 230),
        Color32::from_rgb(80, 210, 210),
        Color32::from_rgb(230, 220, 90),
        Color32::from_rgb(160, 160, 160),
    ];
    PALETTE[i % PALETTE.len()]
}

pub fn latency_ui(ui: &mut egui::Ui, history: &StreamHistory) {
    let Some((median, p99)) = history.latency_median_p99() else {
        ui.weak("No frames yet.");
        return;
    };
    ui.label(format!(
        "median {median:.1} ms ({:.0} FPS) · p99 {p99:.1} ms · {} dropped",
        1000.0 / median.max(1e-3),
        history.frames_dropped
    ));
    let names = history.stage_names();
    let start = history.latencies.len().saturating_sub(BARS);
    let shown: Vec<_> = history.latencies.iter().skip(start).collect();
    let mut charts: Vec<BarChart> = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let bars = shown
            .iter()
            .map(|s| {
                let ms = s
                    .stages
                    .iter()
                    .filter(|t| &t.stage == name)
                    .map(|t| t.ms)
                    .sum();
                Bar::new(s.frame as f64, ms).width(0.9)
            })
            .collect();
        let below: Vec<&BarChart> = charts.iter().collect();
        let chart = BarChart::new(name.clone(), bars)
            .color(stage_colour(i))
            .stack_on(&below);
        charts.push(chart);
    }
    Plot::new("latency")
        .height(170.0)
        .allow_scroll(false)
        .include_y(0.0)
        .y_axis_label("ms")
        .show(ui, |plot_ui| {
            for chart in charts {
                plot_ui.bar_chart(chart);
            }
            plot_ui.hline(
                HLine::new("median", median)
                    .color(Color32::WHITE)
                    .style(LineStyle::dashed_loose()),
            );
            plot_ui.hline(
                HLine::new("p99", p99)
                    .color(P99)
                    .style(LineStyle::dashed_loose()),
            );
        });
    // The legend goes below the plot: a backend may report a dozen stages, more than fit
    // over it.
    ui.horizontal_wrapped(|ui| {
        for (i, name) in names.iter().enumerate() {
            swatch_ui(ui, stage_colour(i));
            ui.small(name);
        }
        swatch_ui(ui, Color32::WHITE);
        ui.small("median");
        swatch_ui(ui, P99);
        ui.small("p99");
    });
}

const P99: Color32 = Color32::from_rgb(255, 90, 90);

fn swatch_ui(ui: &mut egui::Ui, colour: Color32) {
    let (rect, _) = ui.allocate_exact_size(egui::vec2(9.0, 9.0), egui::Sense::hover());
    ui.painter().rect_filled(rect, 2.0, colour);
}
