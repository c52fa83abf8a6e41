//! The KV page map: one cell per page id of the pool, coloured by stream and faded by the age
//! of the frame it holds; the newest step's pages and fresh evictions are outlined.

use eframe::egui::{self, Color32, CornerRadius, Rect, Sense, Stroke, StrokeKind, Vec2};

use crate::kvcache::PageState;
use crate::viewer::history::{EVICTION_HIGHLIGHT_FRAMES, PageMapState};

const CELL: f32 = 11.0;
const GAP: f32 = 2.0;
/// Frames over which a page's colour fades to its oldest shade.
const AGE_FADE_FRAMES: f32 = 64.0;

pub const SCALE: Color32 = Color32::from_rgb(200, 90, 210);
pub const WINDOW: Color32 = Color32::from_rgb(70, 150, 250);
pub const TRANSIENT: Color32 = Color32::from_rgb(250, 160, 50);
pub const SPECIAL: Color32 = Color32::from_rgb(80, 200, 120);
pub const FREE: Color32 = Color32::from_rgb(48, 48, 54);
pub const NEWEST: Color32 = Color32::WHITE;
pub const EVICTED: Color32 = Color32::from_rgb(255, 60, 60);

/// Fill of a page's cell: the stream's colour, darker the older its frame.
pub fn page_colour(state: PageState, current_frame: u64) -> Color32 {
    let (base, frame) = match state {
        PageState::Free => return FREE,
        PageState::Special { .. } => return SPECIAL,
        PageState::Scale { frame } => (SCALE, frame),
        PageState::Window { frame } => (WINDOW, frame),
        PageState::Transient { frame } => (TRANSIENT, frame),
    };
    let age = current_frame.saturating_sub(frame) as f32;
    let keep = 1.0 - 0.6 * (age / AGE_FADE_FRAMES).min(1.0);
    Color32::from_rgb(
        (base.r() as f32 * keep) as u8,
        (base.g() as f32 * keep) as u8,
        (base.b() as f32 * keep) as u8,
    )
}

/// What a hover over a page says.
pub fn page_description(page: u32, state: PageState, map: &PageMapState) -> String {
    let tokens = map.page_size;
    let age = |frame: u64| map.current_frame.saturating_sub(frame);
    let mut text = match state {
        PageState::Free => format!("page {page}: free"),
        PageState::Scale { frame } => {
            format!(
                "page {page}: scale frame {frame} (age {}), {tokens} tokens",
                age(frame)
            )
        }
        PageState::Window { frame } => {
            format!(
                "page {page}: window frame {frame} (age {}), {tokens} tokens",
                age(frame)
            )
        }
        PageState::Transient { frame } => {
            format!(
                "page {page}: non-keyframe {frame} (rolled back after this step), {tokens} tokens"
            )
        }
        PageState::Special { tokens } => {
            format!(
                "page {page}: special tokens, {tokens} of {} slots",
                map.page_size
            )
        }
    };
    if map.is_newest(page) {
        text.push_str("\nwritten by the newest step");
    }
    if let Some(ago) = map.evicted_ago(page) {
        text.push_str(&format!("\nevicted {ago} step(s) ago"));
    }
    text
}

pub fn page_map_ui(ui: &mut egui::Ui, map: &PageMapState) {
    let pages = map.pages.len();
    if pages == 0 {
        ui.weak("No cache yet: the page map fills as frames are processed.");
        return;
    }
    let columns = (((ui.available_width() + GAP) / (CELL + GAP)).floor() as usize).max(1);
    let rows = pages.div_ceil(columns);
    let size = Vec2::new(
        columns as f32 * (CELL + GAP) - GAP,
        rows as f32 * (CELL + GAP) - GAP,
    );
    let (rect, response) = ui.allocate_exact_size(size, Sense::hover());
    let cell_rect = |i: usize| {
        let (row, col) = (i / columns, i % columns);
        Rect::from_min_size(
            rect.min + Vec2::new(col as f32 * (CELL + GAP), row as f32 * (CELL + GAP)),
            Vec2::splat(CELL),
        )
    };
    let painter = ui.painter_at(rect.expand(2.0));
    for (i, &state) in map.pages.iter().enumerate() {
        let r = cell_rect(i);
        painter.rect_filled(
            r,
            CornerRadius::same(2),
            page_colour(state, map.current_frame),
        );
        let page = i as u32;
        if let Some(ago) = map.evicted_ago(page) {
            let fade = 1.0 - ago as f32 / EVICTION_HIGHLIGHT_FRAMES as f32;
            let stroke = Stroke::new(2.0, EVICTED.gamma_multiply(fade.clamp(0.2, 1.0)));
            painter.rect_stroke(r, CornerRadius::same(2), stroke, StrokeKind::Outside);
        }
        if map.is_newest(page) {
            painter.rect_stroke(
                r,
                CornerRadius::same(2),
                Stroke::new(1.5, NEWEST),
                StrokeKind::Outside,
            );
        }
    }
    if let Some(pos) = response.hover_pos() {
        let col = ((pos.x - rect.min.x) / (CELL + GAP)).floor() as usize;
        let row = ((pos.y - rect.min.y) / (CELL + GAP)).floor() as usize;
        let i = row * columns + col;
        if col < columns
            && let Some(&state) = map.pages.get(i)
        {
            let text = page_description(i as u32, state, map);
            response.on_hover_ui_at_pointer(|ui| {
                ui.label(text);
            });
        }
    }
    legend_ui(ui);
}

fn legend_ui(ui: &mut egui::Ui) {
    ui.horizontal_wrapped(|ui| {
        for (colour, label) in [
            (SCALE, "scale"),
            (WINDOW, "window"),
            (TRANSIENT, "transient"),
            (SPECIAL, "special"),
            (FREE, "free"),
        ] {
            swatch_ui(ui, colour, false);
            ui.small(label);
        }
        swatch_ui(ui, FREE, true);
        ui.small("newest");
        let (r, _) = ui.allocate_exact_size(Vec2::splat(CELL), Sense::hover());
        ui.painter().rect_stroke(
            r.shrink(1.0),
            CornerRadius::same(2),
            Stroke::new(2.0, EVICTED),
            StrokeKind::Inside,
        );
        ui.small("evicted");
    });
}

fn swatch_ui(ui: &mut egui::Ui, colour: Color32, outlined: bool) {
    let (r, _) = ui.allocate_exact_size(Vec2::splat(CELL), Sense::hover());
    ui.painter().rect_filled(r, CornerRadius::same(2), colour);
    if outlined {
        ui.painter().rect_stroke(
            r.shrink(1.0),
            CornerRadius::same(2),
            Stroke::new(1.5, NEWEST),
            StrokeKind::Inside,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_frames_are_darker_and_streams_differ() {
        let new = page_colour(PageState::Window { frame: 10 }, 10);
        let old = page_colour(PageState::Window { frame: 0 }, 100);
        assert!(old.b() < new.b());
        assert_ne!(page_colour(PageState::Scale { frame: 10 }, 10), new);
        assert_eq!(page_colour(PageState::Free, 5), FREE);
    }

    #[test]
    fn description_names_frame_and_tokens() {
        let map = PageMapState {
            pages: vec![PageState::Window { frame: 7 }],
            page_size: 999,
            current_frame: 9,
            newest: vec![0],
            evicted: vec![],
        };
        let text = page_description(0, map.pages[0], &map);
        assert!(text.contains("frame 7") && text.contains("999 tokens") && text.contains("newest"));
    }
}
