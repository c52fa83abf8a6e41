//! What an image file may ask of memory, checked from its header before any pixel is decoded,
//! and whether a partial decode counts as a frame.
//!
//! A few-KB PNG can declare 200000×200000 pixels; decoding it would allocate 120 GB and abort
//! the process (or the machine). The limits are process-wide so that `decode_bytes` stays a
//! free function any decode thread can call: the command line sets them once at start.

use std::sync::RwLock;

/// The most an image may hold by default: 64 megapixels (a 48 MP phone photo fits; its RGBA
/// decode takes 256 MB) and 32768 pixels on a side.
pub const DEFAULT_MAX_PIXELS: u64 = 64_000_000;
pub const DEFAULT_MAX_SIDE: u32 = 32_768;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Width × height above this is refused before decoding.
    pub max_pixels: u64,
    /// Width or height above this is refused before decoding.
    pub max_side: u32,
    /// Refuse images whose data ends before the picture does (a JPEG cut in its middle
    /// decodes with the rest of the picture grey); `--strict` turns this on.
    pub reject_partial: bool,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_pixels: DEFAULT_MAX_PIXELS,
            max_side: DEFAULT_MAX_SIDE,
            reject_partial: false,
        }
    }
}

impl DecodeLimits {
    /// Why an image of this size is refused, or `None` when it is within the limits.
    pub fn refuse_size(&self, width: u32, height: u32) -> Option<String> {
        let pixels = u64::from(width) * u64::from(height);
        if width > self.max_side || height > self.max_side || pixels > self.max_pixels {
            return Some(format!(
                "the image declares {width}x{height} pixels ({:.1} megapixels), above the limit \
                 of {:.1} megapixels and {} pixels a side; refused before decoding",
                pixels as f64 / 1e6,
                self.max_pixels as f64 / 1e6,
                self.max_side
            ));
        }
        None
    }
}

static LIMITS: RwLock<Option<DecodeLimits>> = RwLock::new(None);

/// The limits every [`decode_bytes`](super::folder::decode_bytes) call uses.
pub fn decode_limits() -> DecodeLimits {
    // A poisoned lock only means a writer panicked mid-assignment of a Copy value.
    let guard = LIMITS.read().unwrap_or_else(|p| p.into_inner());
    guard.unwrap_or_default()
}

/// Sets the process-wide limits (the command line does this once, before opening sources).
pub fn set_decode_limits(limits: DecodeLimits) {
    let mut guard = LIMITS.write().unwrap_or_else(|p| p.into_inner());
    *guard = Some(limits);
}

/// Whether a JPEG's data runs to its end-of-image marker after its last scan. A file cut in
/// its entropy-coded data has none: the decoder fills the rest with grey and says nothing.
/// (`FF D9` cannot occur inside entropy-coded data, where a data `FF` is stuffed as `FF 00`.)
pub fn jpeg_is_complete(bytes: &[u8]) -> bool {
    let last_scan = bytes.windows(2).rposition(|w| w == [0xFF, 0xDA]);
    match last_scan {
        Some(sos) => bytes[sos..].windows(2).any(|w| w == [0xFF, 0xD9]),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_beyond_the_limits_are_refused_with_the_numbers() {
        let limits = DecodeLimits::default();
        assert!(limits.refuse_size(8000, 6000).is_none());
        let why = limits.refuse_size(200_000, 200_000).expect("refused");
        assert!(why.contains("200000x200000"), "{why}");
        assert!(limits.refuse_size(40_000, 10).is_some(), "a side too long");
    }

    #[test]
    fn a_jpeg_without_its_end_marker_is_partial() {
        assert!(jpeg_is_complete(&[
            0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 0xFF, 0xD9
        ]));
        assert!(!jpeg_is_complete(&[0xFF, 0xD8, 0xFF, 0xDA, 1, 2, 3]));
        assert!(
            !jpeg_is_complete(&[0xFF, 0xD8, 0xFF, 0xD9]),
            "no scan at all"
        );
    }
}
