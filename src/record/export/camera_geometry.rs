//! A frame's pinhole camera in COLMAP's convention, at the size the frame was captured.
//!
//! The model predicts intrinsics in pixels of its *input* image: the captured frame resized to
//! a fixed width (height rounded to a multiple of the patch size) and centre-cropped to at most
//! as many rows as columns (`model::preprocess::target_size`). Undoing that maps the camera back
//! onto the captured frame:
//!
//! - the resize scales each axis on its own: `sx = input_width / captured_width`,
//!   `sy = resized_height / captured_height` (the height is rounded, so `sx` and `sy` differ
//!   slightly);
//! - the crop removes `top = (resized_height - input_height) / 2` rows above;
//! - COLMAP puts the centre of the top-left pixel at (0.5, 0.5), the model at (0, 0).
//!
//! With continuous image coordinates (pixel edges on integers) a captured point `x` lands at
//! `x * sx` in the resized image and at `y * sy - top` after the crop, so
//! `fx' = fx / sx`, `cx' = (cx + 0.5) / sx`, `fy' = fy / sy`, `cy' = (cy + 0.5 + top) / sy`.

use crate::frame::Intrinsics;
use crate::model::preprocess::{PreprocessConfig, target_size};

/// A PINHOLE camera as COLMAP stores it (pixel centres at +0.5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PinholeCamera {
    pub width: u32,
    pub height: u32,
    pub fx: f64,
    pub fy: f64,
    pub cx: f64,
    pub cy: f64,
}

impl PinholeCamera {
    /// The pixel (COLMAP convention) a camera-frame point projects to; `None` behind the camera.
    pub fn project(&self, p: [f64; 3]) -> Option<[f64; 2]> {
        (p[2] > 0.0).then(|| {
            [
                self.fx * p[0] / p[2] + self.cx,
                self.fy * p[1] / p[2] + self.cy,
            ]
        })
    }

    pub fn contains(&self, xy: [f64; 2]) -> bool {
        (0.0..f64::from(self.width)).contains(&xy[0])
            && (0.0..f64::from(self.height)).contains(&xy[1])
    }
}

/// How a captured frame became the model's input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InputMapping {
    pub scale_x: f64,
    pub scale_y: f64,
    /// Rows of the resized image cropped away above the input.
    pub crop_top: f64,
    /// Whether the sizes are the ones the model's preprocessing gives; otherwise the input is
    /// taken as a plain per-axis resize of the whole frame (a source that preprocessed itself).
    pub preprocessing_matched: bool,
}

/// The mapping from a `captured` frame to a model input of `input` pixels.
pub fn input_mapping(captured: (u32, u32), input: (u32, u32)) -> InputMapping {
    let (cw, ch) = (captured.0 as usize, captured.1 as usize);
    let cfg = PreprocessConfig {
        width: input.0 as usize,
        ..PreprocessConfig::default()
    };
    match target_size(cw, ch, &cfg) {
        Ok((w, resized_h, final_h)) if final_h == input.1 as usize => InputMapping {
            scale_x: w as f64 / cw as f64,
            scale_y: resized_h as f64 / ch as f64,
            crop_top: ((resized_h - final_h) / 2) as f64,
            preprocessing_matched: true,
        },
        _ => InputMapping {
            scale_x: f64::from(input.0) / cw.max(1) as f64,
            scale_y: f64::from(input.1) / ch.max(1) as f64,
            crop_top: 0.0,
            preprocessing_matched: false,
        },
    }
}

/// The camera on the model's input image, in COLMAP's pixel convention.
pub fn model_input_camera(k: &Intrinsics) -> PinholeCamera {
    PinholeCamera {
        width: k.width,
        height: k.height,
        fx: f64::from(k.fx),
        fy: f64::from(k.fy),
        cx: f64::from(k.cx) + 0.5,
        cy: f64::from(k.cy) + 0.5,
    }
}

/// The camera on the frame as captured (`captured` = width, height).
pub fn captured_camera(k: &Intrinsics, captured: (u32, u32)) -> (PinholeCamera, InputMapping) {
    let m = input_mapping(captured, (k.width, k.height));
    let camera = PinholeCamera {
        width: captured.0,
        height: captured.1,
        fx: f64::from(k.fx) / m.scale_x,
        fy: f64::from(k.fy) / m.scale_y,
        cx: (f64::from(k.cx) + 0.5) / m.scale_x,
        cy: (f64::from(k.cy) + 0.5 + m.crop_top) / m.scale_y,
    };
    (camera, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(width: u32, height: u32) -> Intrinsics {
        Intrinsics {
            fx: 400.0,
            fy: 410.0,
            cx: width as f32 / 2.0 - 3.0,
            cy: height as f32 / 2.0 + 2.0,
            width,
            height,
        }
    }

    #[test]
    fn a_portrait_frame_maps_its_centre_crop_back() {
        // 480×640 → 518×686 resized, 84 rows cropped above, 518×518 input.
        let (cam, m) = captured_camera(&k(518, 518), (480, 640));
        assert!(m.preprocessing_matched);
        assert_eq!(m.crop_top, 84.0);
        assert_eq!((cam.width, cam.height), (480, 640));
        // The input's centre row (259 edges down) is the captured frame's centre row.
        let cy_model_edge = 259.0;
        let captured_edge = (cy_model_edge + m.crop_top) / m.scale_y;
        assert!((captured_edge - 320.0).abs() < 1e-9, "{captured_edge}");
    }

    #[test]
    fn sizes_the_preprocessing_does_not_give_are_a_plain_scale() {
        let (cam, m) = captured_camera(&k(16, 12), (32, 24));
        assert!(!m.preprocessing_matched);
        assert_eq!((m.scale_x, m.scale_y, m.crop_top), (0.5, 0.5, 0.0));
        assert_eq!(cam.fx, 800.0);
        assert_eq!(cam.cx, (5.0 + 0.5) * 2.0);
    }
}
