//! Image preprocessing as the reference's "crop" mode: resize to a fixed width (518 by default)
//! keeping the aspect ratio with the height rounded to a multiple of the patch size, bicubic
//! resampling like PIL's, centre-crop rows above the width, values in [0, 1] (ImageNet
//! normalisation happens inside the model).

use std::path::Path;

use super::error::{ModelError, Result};
use super::ops::conv::FeatureMap;
use super::ops::resize::resize_bicubic_aa;

#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessConfig {
    /// Output width in pixels (518 for the released model).
    pub width: usize,
    pub patch: usize,
}

impl Default for PreprocessConfig {
    fn default() -> Self {
        PreprocessConfig {
            width: 518,
            patch: crate::model::spec::PATCH,
        }
    }
}

/// A preprocessed frame: `[3][height][width]` RGB in [0, 1].
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub height: usize,
    pub width: usize,
    pub data: Vec<f32>,
}

impl Frame {
    /// The frame as interleaved 8-bit RGB (its values are 8-bit levels / 255, so this is exact).
    pub fn to_rgb8(&self) -> crate::frame::RgbImage {
        let plane = self.height * self.width;
        let mut data = Vec::with_capacity(plane * 3);
        for i in 0..plane {
            for c in 0..3 {
                data.push((self.data[c * plane + i] * 255.0).round().clamp(0.0, 255.0) as u8);
            }
        }
        crate::frame::RgbImage {
            width: self.width as u32,
            height: self.height as u32,
            data,
        }
    }
}

/// Size after resizing (`width`, `resized_height`) and after the centre crop (`final_height`).
pub fn target_size(
    src_width: usize,
    src_height: usize,
    cfg: &PreprocessConfig,
) -> Result<(usize, usize, usize)> {
    if src_width == 0 || src_height == 0 || cfg.patch == 0 || !cfg.width.is_multiple_of(cfg.patch) {
        return Err(ModelError::BadInput(format!(
            "cannot preprocess a {src_width}×{src_height} image to width {} (patch {})",
            cfg.width, cfg.patch
        )));
    }
    // Python's round() on the same expression: halves go to the even neighbour.
    let scaled = src_height as f64 * (cfg.width as f64 / src_width as f64) / cfg.patch as f64;
    let resized_height = (scaled.round_ties_even() as usize) * cfg.patch;
    if resized_height == 0 {
        return Err(ModelError::BadInput(format!(
            "a {src_width}×{src_height} image is too flat for width {}",
            cfg.width
        )));
    }
    Ok((cfg.width, resized_height, resized_height.min(cfg.width)))
}

/// [`target_size`] of a packed 8-bit RGB buffer of `len` bytes, which must hold the image: what
/// [`preprocess_rgb8`] checks, for a caller that leaves the resize to the GPU.
pub fn rgb8_target_size(
    len: usize,
    src_width: usize,
    src_height: usize,
    cfg: &PreprocessConfig,
) -> Result<(usize, usize, usize)> {
    if len != src_width * src_height * 3 {
        return Err(ModelError::BadInput(format!(
            "RGB buffer holds {len} bytes, a {src_width}×{src_height} image needs {}",
            src_width * src_height * 3
        )));
    }
    target_size(src_width, src_height, cfg)
}

/// Preprocess packed 8-bit RGB (`[height][width][3]`).
pub fn preprocess_rgb8(
    rgb: &[u8],
    src_width: usize,
    src_height: usize,
    cfg: &PreprocessConfig,
) -> Result<Frame> {
    let (w, resized_h, final_h) = rgb8_target_size(rgb.len(), src_width, src_height, cfg)?;
    let mut planes = FeatureMap::zeros(3, src_height, src_width);
    for (i, px) in rgb.chunks_exact(3).enumerate() {
        for (c, &v) in px.iter().enumerate() {
            planes.data[c * src_height * src_width + i] = v as f32;
        }
    }
    // PIL resizes 8-bit images in two passes, rounding to 8 bits after each.
    let resized = resize_bicubic_aa(&planes, resized_h, w, true);
    let top = (resized_h - final_h) / 2;
    let mut data = Vec::with_capacity(3 * final_h * w);
    for c in 0..3 {
        let plane = &resized.data[c * resized_h * w..(c + 1) * resized_h * w];
        data.extend(
            plane[top * w..(top + final_h) * w]
                .iter()
                .map(|&v| v / 255.0),
        );
    }
    Ok(Frame {
        height: final_h,
        width: w,
        data,
    })
}

/// Load an image file (EXIF orientation applied, transparency composited onto white) and
/// preprocess it.
pub fn load_image(path: &Path, cfg: &PreprocessConfig) -> Result<Frame> {
    use image::ImageDecoder;
    let bad = |e: String| ModelError::BadInput(format!("{}: {e}", path.display()));
    let reader = image::ImageReader::open(path)
        .map_err(|e| ModelError::io(path, e))?
        .with_guessed_format()
        .map_err(|e| ModelError::io(path, e))?;
    let mut decoder = reader.into_decoder().map_err(|e| bad(e.to_string()))?;
    let orientation = decoder.orientation().map_err(|e| bad(e.to_string()))?;
    let mut img = image::DynamicImage::from_decoder(decoder).map_err(|e| bad(e.to_string()))?;
    img.apply_orientation(orientation);
    let rgba = img.to_rgba8();
    let (w, h) = (rgba.width() as usize, rgba.height() as usize);
    let mut rgb = Vec::with_capacity(w * h * 3);
    for px in rgba.pixels() {
        let a = px[3] as u32;
        for c in 0..3 {
            // Alpha-composite onto white, rounded like PIL's 8-bit compositing.
            let v = (px[c] as u32 * a + 255 * (255 - a) + 127) / 255;
            rgb.push(v as u8);
        }
    }
    preprocess_rgb8(&rgb, w, h, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_reference() {
        let cfg = PreprocessConfig::default();
        // 4:3 → 518×392, 16:9 → 518×294, portrait is cropped to 518 rows.
        assert_eq!(target_size(640, 480, &cfg).unwrap(), (518, 392, 392));
        assert_eq!(target_size(1920, 1080, &cfg).unwrap(), (518, 294, 294));
        assert_eq!(target_size(480, 640, &cfg).unwrap(), (518, 686, 518));
        // 518 × h / 518 / 14 = 26.5 exactly: banker's rounding picks 26.
        assert_eq!(target_size(518, 371, &cfg).unwrap().1, 26 * 14);
        assert_eq!(target_size(518, 385, &cfg).unwrap().1, 28 * 14);
    }

    #[test]
    fn constant_image_stays_constant() {
        let cfg = PreprocessConfig {
            width: 28,
            patch: 14,
        };
        let rgb = vec![200u8; 40 * 30 * 3];
        let f = preprocess_rgb8(&rgb, 40, 30, &cfg).unwrap();
        // 30 · 28/40 / 14 = 1.5 rounds to the even 2.
        assert_eq!((f.width, f.height), (28, 28));
        assert!(f.data.iter().all(|&v| (v - 200.0 / 255.0).abs() < 1e-6));
    }
}
