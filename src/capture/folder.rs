//! An image folder: PNG and JPEG files in natural order (`frame2` before `frame10`), read and
//! decoded ahead on a small ordered pool ([`OrderedPool`]) so decoding keeps up with a GPU.
//!
//! A file that cannot be decoded is skipped with a warning naming it (see
//! [`CorruptFilePolicy`]); a long sequence is worth more than one broken frame. `--strict`
//! ([`CorruptFilePolicy::Stop`]) turns the same case into an error naming the file.
//!
//! A frame's capture time comes from its file name when every name in the folder carries one
//! (TUM style, `1305031102.175304.png`; the files then play in time order); otherwise from its
//! position in the folder at `--fps` spacing, or the position itself in seconds. Positions
//! count every file, so a skipped file shifts no later frame's time or name.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::decode_pool::{OrderedPool, default_workers};
use super::error::CaptureError;
use super::image_limits::{DecodeLimits, decode_limits, jpeg_is_complete};
use super::timestamps::{nominal_time, time_from_file_name};
use super::{CapturedFrame, Source, ms_since};
use crate::frame::{CaptureTime, FrameOrigin, RgbImage, TimeBase};

/// What a file that does not decode does to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CorruptFilePolicy {
    /// Skip it, with a warning naming it (the default).
    #[default]
    Skip,
    /// Stop the source with an error naming it.
    Stop,
}

pub struct ImageFolder {
    dir: PathBuf,
    files: Vec<PathBuf>,
    next_file: usize,
    next_index: u64,
    policy: CorruptFilePolicy,
    warnings: Vec<String>,
    skipped: Vec<PathBuf>,
    /// Files that did not decode since the last [`Source::take_skipped`].
    newly_skipped: u64,
    /// Each file's time from its name, when every name carries one.
    name_times: Option<Vec<i64>>,
    /// `--fps`: the spacing of nominal times when the names carry none.
    fps: Option<f64>,
    /// Started at the first frame (opening a folder spawns nothing).
    pool: Option<OrderedPool<(usize, PathBuf), FileOutcome>>,
    workers: usize,
}

/// One file as a worker read and decoded it.
struct FileOutcome {
    /// The file's position in the folder's order.
    position: usize,
    path: PathBuf,
    image: Result<RgbImage, CaptureError>,
    read_ms: f64,
    decode_ms: f64,
}

fn read_and_decode((position, path): (usize, PathBuf)) -> FileOutcome {
    let clock = Instant::now();
    let bytes = std::fs::read(&path);
    let read_ms = ms_since(clock);
    let clock = Instant::now();
    let image = match bytes {
        // Decode from the bytes already read so the two timings stay apart.
        Ok(bytes) => decode_bytes(&path, bytes),
        Err(source) => Err(CaptureError::Io {
            path: path.clone(),
            source,
        }),
    };
    FileOutcome {
        position,
        path,
        image,
        read_ms,
        decode_ms: ms_since(clock),
    }
}

impl ImageFolder {
    pub fn open(dir: &Path, policy: CorruptFilePolicy) -> Result<Self, CaptureError> {
        let entries = std::fs::read_dir(dir).map_err(|source| CaptureError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| CaptureError::Io {
                path: dir.to_owned(),
                source,
            })?;
            let path = entry.path();
            if path.is_file() && is_image_name(&path) {
                files.push(path);
            }
        }
        if files.is_empty() {
            return Err(CaptureError::EmptyFolder(dir.to_owned()));
        }
        files.sort_by(|a, b| natural_cmp(&file_name(a), &file_name(b)));
        let mut name_times = files
            .iter()
            .map(|f| time_from_file_name(&file_name(f)))
            .collect::<Option<Vec<i64>>>();
        if let Some(times) = name_times.as_mut() {
            // Names that carry times play in time order: natural order puts `1.99` before
            // `1.175304`, whose time is earlier. The sort is stable, so equal times keep the
            // natural order.
            let mut timed: Vec<(i64, PathBuf)> = times.iter().copied().zip(files).collect();
            timed.sort_by_key(|(t, _)| *t);
            (*times, files) = timed.into_iter().unzip();
        }
        Ok(ImageFolder {
            dir: dir.to_owned(),
            files,
            next_file: 0,
            next_index: 0,
            policy,
            warnings: Vec::new(),
            skipped: Vec::new(),
            newly_skipped: 0,
            name_times,
            fps: None,
            pool: None,
            workers: default_workers(),
        })
    }

    /// Space frames `1 / fps` seconds apart when the file names carry no times (default: one
    /// second, the position as the time).
    pub fn with_frame_rate(mut self, fps: Option<f64>) -> Self {
        self.fps = fps;
        self
    }

    /// Whether the frames' times come from their file names.
    pub fn times_from_names(&self) -> bool {
        self.name_times.is_some()
    }

    fn capture_time(&self, position: usize) -> CaptureTime {
        match &self.name_times {
            Some(times) => CaptureTime::new(times[position], TimeBase::FileName),
            None => nominal_time(position as u64, self.fps),
        }
    }

    /// Decode on this many worker threads (default: [`default_workers`]).
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Keeps the pool's queue full with the next files.
    fn fill_pool(&mut self) -> Result<(), CaptureError> {
        if self.pool.is_none() {
            let pool = OrderedPool::new("decode", self.workers, 2 * self.workers, read_and_decode)
                .map_err(|e| CaptureError::Worker(format!("starting the decode threads: {e}")))?;
            self.pool = Some(pool);
        }
        let Some(pool) = self.pool.as_mut() else {
            return Ok(());
        };
        let (files, next_file) = (&self.files, &mut self.next_file);
        pool.fill(|| {
            let path = files.get(*next_file)?.clone();
            *next_file += 1;
            Some((*next_file - 1, path))
        })
        .map_err(|e| CaptureError::Worker(e.to_string()))
    }

    /// The files in the order they will be read.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Files skipped so far because they did not decode.
    pub fn skipped(&self) -> &[PathBuf] {
        &self.skipped
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn is_image_name(p: &Path) -> bool {
    matches!(
        p.extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .as_deref(),
        Some("png" | "jpg" | "jpeg")
    )
}

/// Natural order: runs of digits compare by value, the rest by character.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.chars().next(), b.chars().next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.len() - a.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let db = b.len() - b.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let (na, nb) = (&a[..da], &b[..db]);
                let (ta, tb) = (na.trim_start_matches('0'), nb.trim_start_matches('0'));
                // Longer digit runs (without leading zeros) are larger numbers; no overflow.
                let by_value = ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb));
                // Equal values: fewer leading zeros first, so the order is total.
                let ord = by_value.then_with(|| na.len().cmp(&nb.len()));
                if ord != Ordering::Equal {
                    return ord;
                }
                a = &a[da..];
                b = &b[db..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(&y);
                }
                a = &a[x.len_utf8()..];
                b = &b[y.len_utf8()..];
            }
        }
    }
}

/// Decode a file to packed RGB8 the way the model's preprocessing does: EXIF orientation
/// applied, transparency composited onto white.
pub fn decode_rgb8(path: &Path) -> Result<RgbImage, CaptureError> {
    let bytes = std::fs::read(path).map_err(|source| CaptureError::Io {
        path: path.to_owned(),
        source,
    })?;
    decode_bytes(path, bytes)
}

impl Source for ImageFolder {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        loop {
            self.fill_pool()?;
            let Some(next) = self.pool.as_mut().and_then(|p| p.next_result()) else {
                return Ok(None);
            };
            let done = next.map_err(|e| CaptureError::Worker(e.to_string()))?;
            let image = match done.image {
                Ok(img) => img,
                // A file that cannot be read is as unusable as one that does not decode.
                Err(err) => match self.policy {
                    CorruptFilePolicy::Stop => return Err(err),
                    CorruptFilePolicy::Skip => {
                        self.warnings.push(format!("skipped {err}"));
                        self.skipped.push(done.path);
                        self.newly_skipped += 1;
                        continue;
                    }
                },
            };
            let index = self.next_index;
            self.next_index += 1;
            let origin = FrameOrigin {
                name: file_name(&done.path),
                time: self.capture_time(done.position),
                original_size: Some((image.width, image.height)),
            };
            return Ok(Some(CapturedFrame {
                index,
                image,
                origin,
                captured_at: Instant::now(),
                capture_ms: done.read_ms,
                decode_ms: done.decode_ms,
            }));
        }
    }

    fn is_live(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        format!(
            "folder {} ({} images, {})",
            self.dir.display(),
            self.files.len(),
            match (&self.name_times, self.fps) {
                (Some(_), _) => "capture times from the file names".to_owned(),
                (None, Some(fps)) => format!("times at {fps} fps"),
                (None, None) => "times: the file's position in seconds".to_owned(),
            }
        )
    }

    fn remaining_hint(&self) -> Option<u64> {
        let queued = self.pool.as_ref().map_or(0, |p| p.outstanding());
        Some((self.files.len() - self.next_file + queued) as u64)
    }

    fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.newly_skipped)
    }

    /// The next file's size from its header (orientation applied), without decoding it.
    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        use image::ImageDecoder;
        let path = self.files.get(self.next_file)?;
        let decoder = image::ImageReader::open(path)
            .ok()?
            .with_guessed_format()
            .ok()?
            .into_decoder()
            .ok()?;
        let (w, h) = decoder.dimensions();
        let mut decoder = decoder;
        let turned = matches!(
            decoder.orientation().ok()?,
            image::metadata::Orientation::Rotate90
                | image::metadata::Orientation::Rotate270
                | image::metadata::Orientation::Rotate90FlipH
                | image::metadata::Orientation::Rotate270FlipH
        );
        Some(if turned { (h, w) } else { (w, h) })
    }

    fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// Decodes an image file's bytes with the process-wide [`DecodeLimits`]. A free function with
/// no state of its own, so decode threads can call it side by side.
pub fn decode_bytes(path: &Path, bytes: Vec<u8>) -> Result<RgbImage, CaptureError> {
    decode_bytes_limited(path, bytes, &decode_limits())
}

/// Decodes with explicit limits: the size the header declares is checked before any pixel
/// memory is allocated, and with `reject_partial` a JPEG cut short is an error.
pub fn decode_bytes_limited(
    path: &Path,
    bytes: Vec<u8>,
    limits: &DecodeLimits,
) -> Result<RgbImage, CaptureError> {
    use image::ImageDecoder;
    let bad = |reason: String| CaptureError::Decode {
        path: path.to_owned(),
        reason,
    };
    if limits.reject_partial
        && image::guess_format(&bytes).ok() == Some(image::ImageFormat::Jpeg)
        && !jpeg_is_complete(&bytes)
    {
        return Err(bad(
            "the JPEG ends before its image data does (a truncated file); --strict refuses \
             partial images"
                .into(),
        ));
    }
    let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(e.to_string()))?;
    // The decoder's own allocation cap must not be below what the size limit lets through
    // (RGBA8 plus the RGB8 copy); the size itself is checked below, from the header.
    let mut decoder_limits = image::Limits::default();
    decoder_limits.max_alloc = Some(limits.max_pixels.saturating_mul(8).max(512 << 20));
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().map_err(|e| bad(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    if let Some(why) = limits.refuse_size(width, height) {
        return Err(bad(format!(
            "{why} (--max-image-megapixels raises the limit)"
        )));
    }
    let orientation = decoder.orientation().map_err(|e| bad(e.to_string()))?;
    let mut img = image::DynamicImage::from_decoder(decoder).map_err(|e| bad(e.to_string()))?;
    img.apply_orientation(orientation);
    Ok(composite_on_white(&img.to_rgba8()))
}

fn composite_on_white(rgba: &image::RgbaImage) -> RgbImage {
    let (width, height) = rgba.dimensions();
    let mut data = Vec::with_capacity(width as usize * height as usize * 3);
    for px in rgba.pixels() {
        let a = px[3] as u32;
        for c in 0..3 {
            // Alpha-composite onto white, rounded like PIL's 8-bit compositing.
            data.push(((px[c] as u32 * a + 255 * (255 - a) + 127) / 255) as u8);
        }
    }
    RgbImage {
        width,
        height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_carry_times_play_in_time_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["1.5.png", "1.25.png", "0.75.png"] {
            image::save_buffer(
                dir.path().join(name),
                &[0u8; 12],
                2,
                2,
                image::ExtendedColorType::Rgb8,
            )
            .unwrap();
        }
        let folder = ImageFolder::open(dir.path(), CorruptFilePolicy::Skip).unwrap();
        assert!(folder.times_from_names());
        let names: Vec<String> = folder.files().iter().map(|p| file_name(p)).collect();
        assert_eq!(names, ["0.75.png", "1.25.png", "1.5.png"]);
        assert_eq!(folder.capture_time(2).ns, 1_500_000_000);
    }

    #[test]
    fn natural_order() {
        let mut names = vec!["f10.png", "f2.png", "f1.png", "f02.png", "a.png", "f1b.png"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            vec!["a.png", "f1.png", "f1b.png", "f2.png", "f02.png", "f10.png"]
        );
    }
}
