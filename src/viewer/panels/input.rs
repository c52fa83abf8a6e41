//! The input frame as the model saw it, with its depth and confidence maps as thumbnails.

use eframe::egui::{self, Color32, ColorImage, TextureHandle, TextureOptions};

use crate::frame::FrameResult;

/// Height of the depth and confidence thumbnails (the input image gets half as much again).
const THUMBNAIL_HEIGHT: f32 = 120.0;

/// Textures of the newest result; updated in place (one upload per processed frame).
#[derive(Default)]
pub struct InputThumbnails {
    pub frame: Option<u64>,
    image: Option<TextureHandle>,
    depth: Option<TextureHandle>,
    confidence: Option<TextureHandle>,
    pub depth_range: (f32, f32),
    pub confidence_range: (f32, f32),
}

/// Maps `values` (row-major, `width × height`) to grey levels between their min and max;
/// non-finite values are black. Returns the image and the range used.
pub fn greyscale(values: &[f32], width: usize, height: usize) -> Option<(ColorImage, (f32, f32))> {
    if width == 0 || height == 0 || values.len() != width * height {
        return None;
    }
    let (lo, hi) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    let span = (hi - lo).max(1e-6);
    let pixels = values
        .iter()
        .map(|&v| {
            if v.is_finite() {
                let g = (((v - lo) / span) * 255.0) as u8;
                Color32::from_gray(g)
            } else {
                Color32::BLACK
            }
        })
        .collect();
    let range = if lo.is_finite() { (lo, hi) } else { (0.0, 0.0) };
    Some((
        ColorImage {
            size: [width, height],
            pixels,
            source_size: egui::Vec2::new(width as f32, height as f32),
        },
        range,
    ))
}

fn set_texture(
    ctx: &egui::Context,
    slot: &mut Option<TextureHandle>,
    name: &str,
    image: ColorImage,
) {
    match slot {
        Some(handle) => handle.set(image, TextureOptions::LINEAR),
        None => *slot = Some(ctx.load_texture(name, image, TextureOptions::LINEAR)),
    }
}

impl InputThumbnails {
    pub fn update(&mut self, ctx: &egui::Context, result: &FrameResult) {
        self.frame = Some(result.frame);
        let (w, h) = (result.image.width as usize, result.image.height as usize);
        if w > 0 && h > 0 && result.image.data.len() == w * h * 3 {
            set_texture(
                ctx,
                &mut self.image,
                "input_rgb",
                ColorImage::from_rgb([w, h], &result.image.data),
            );
        }
        if let Some((image, range)) = greyscale(&result.depth, w, h) {
            set_texture(ctx, &mut self.depth, "input_depth", image);
            self.depth_range = range;
        }
        if let Some((image, range)) = greyscale(&result.confidence, w, h) {
            set_texture(ctx, &mut self.confidence, "input_confidence", image);
            self.confidence_range = range;
        }
    }
}

pub fn input_ui(ui: &mut egui::Ui, thumbs: &InputThumbnails) {
    let Some(frame) = thumbs.frame else {
        ui.weak("No frame yet.");
        return;
    };
    ui.label(format!("frame {frame}"));
    let width = ui.available_width();
    if let Some(image) = &thumbs.image {
        ui.add(
            egui::Image::new(image)
                .max_width(width)
                .max_height(THUMBNAIL_HEIGHT * 1.5)
                .maintain_aspect_ratio(true),
        );
    }
    ui.horizontal(|ui| {
        let half = (width - ui.spacing().item_spacing.x) * 0.5;
        for (texture, caption) in [
            (
                &thumbs.depth,
                format!(
                    "depth {:.2}–{:.2}",
                    thumbs.depth_range.0, thumbs.depth_range.1
                ),
            ),
            (
                &thumbs.confidence,
                format!(
                    "confidence {:.1}–{:.1}",
                    thumbs.confidence_range.0, thumbs.confidence_range.1
                ),
            ),
        ] {
            ui.vertical(|ui| {
                if let Some(texture) = texture {
                    ui.add(
                        egui::Image::new(texture)
                            .max_width(half)
                            .max_height(THUMBNAIL_HEIGHT)
                            .maintain_aspect_ratio(true),
                    );
                }
                ui.small(caption);
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::greyscale;

    #[test]
    fn greyscale_spans_min_to_max_and_blacks_out_nan() {
        let (image, range) = greyscale(&[1.0, 3.0, f32::NAN, 2.0], 2, 2).expect("valid");
        assert_eq!(range, (1.0, 3.0));
        assert_eq!(image.pixels[0].r(), 0);
        assert_eq!(image.pixels[1].r(), 255);
        assert_eq!(image.pixels[2].r(), 0);
        assert!(greyscale(&[1.0], 2, 2).is_none());
    }
}
