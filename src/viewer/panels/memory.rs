//! Memory: the KV cache's allocated and resident bytes, page counts, and the points on the GPU.

use eframe::egui;

use crate::kvcache::CacheStats;
use crate::viewer::raster::RenderPath;

impl Default for GpuPointStats {
    fn default() -> Self {
        Self {
            points: 0,
            bytes: 0,
            chunks: 0,
            stride: 1,
            refused: 0,
            path: RenderPath::Sprites,
        }
    }
}

/// The 3D view's side of the memory panel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuPointStats {
    pub points: u64,
    pub bytes: u64,
    pub chunks: usize,
    /// Level of detail in use: every `stride`-th point drawn.
    pub stride: u32,
    pub refused: u64,
    /// How the points are drawn.
    pub path: RenderPath,
}

pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

pub fn memory_ui(ui: &mut egui::Ui, stats: &CacheStats, gpu: &GpuPointStats) {
    let resident = if stats.bytes_allocated > 0 {
        stats.bytes_resident as f32 / stats.bytes_allocated as f32
    } else {
        0.0
    };
    ui.label("KV cache");
    ui.add(egui::ProgressBar::new(resident).text(format!(
        "{} resident of {} allocated",
        format_bytes(stats.bytes_resident),
        format_bytes(stats.bytes_allocated)
    )));
    egui::Grid::new("memory_grid")
        .num_columns(2)
        .striped(true)
        .show(ui, |ui| {
            let mut row = |k: &str, v: String| {
                ui.label(k);
                ui.monospace(v);
                ui.end_row();
            };
            row(
                "pages",
                format!(
                    "{} scale · {} window · {} special · {} free ({} of cap {})",
                    stats.scale_pages,
                    stats.window_pages,
                    stats.special_pages,
                    stats.free_pages,
                    stats.allocated_pages,
                    stats.max_pages
                ),
            );
            row("tokens visible", stats.tokens_visible.to_string());
            row("frames committed", stats.frames_committed.to_string());
            row(
                "points on GPU",
                format!(
                    "{} ({}, {} chunk{})",
                    gpu.points,
                    format_bytes(gpu.bytes),
                    gpu.chunks,
                    if gpu.chunks == 1 { "" } else { "s" }
                ),
            );
            row("rasteriser", gpu.path.description().to_string());
            row(
                "drawn",
                if gpu.stride <= 1 {
                    "every point".to_string()
                } else {
                    format!("every {}th point (point budget)", gpu.stride)
                },
            );
            if gpu.refused > 0 {
                row(
                    "not stored",
                    format!("{} points (the GPU gave no more memory)", gpu.refused),
                );
            }
        });
}

#[cfg(test)]
mod tests {
    use super::format_bytes;

    #[test]
    fn bytes_read_well() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(3 << 30), "3.0 GiB");
    }
}
