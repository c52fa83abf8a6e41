//! A video file through the system's FFmpeg (`ffmpeg-next`): any container and codec it
//! decodes (mp4, mov, mkv, webm; H.264, H.265, VP9, AV1 where the build has them).
//!
//! Decoding is sequential by nature, so one decode thread of its own reads, decodes, converts
//! to RGB8 and rotates ahead of the pipeline's capture thread, over a bounded channel (the
//! back-pressure: it decodes at most [`DECODE_AHEAD`] frames ahead), in presentation order.
//!
//! - A frame's capture time is its presentation time in the container, in seconds from the
//!   stream's start (the first frame's time is its PTS less the stream's start time, so
//!   usually 0); its name is `FILE#frame_N`, N counting every frame decoded, so `--every`,
//!   `--fps` and `--start` never renumber frames.
//! - Rotation metadata (the display matrix phones write; the older `rotate` tag) is applied in
//!   quarter turns, so a portrait phone video comes out portrait.
//! - `--start`/`--duration` cut by presentation time (the file is decoded from its start, so
//!   frame numbers stay true), `--fps` keeps frames at most that often, `--every N` every N-th.
//! - A file FFmpeg cannot open, or one with no video stream (audio only), is an error naming
//!   it. A damaged or truncated file delivers every frame before the damage, then ends with a
//!   warning that says what happened (read error, or fewer frames than the container lists).

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, bounded};
use ffmpeg_next as ffmpeg;

use super::error::CaptureError;
use super::{CapturedFrame, Source, ms_since};
use crate::frame::{CaptureTime, FrameOrigin, RgbImage, TimeBase};

/// Frames decoded ahead of the capture thread at most.
pub const DECODE_AHEAD: usize = 4;

/// Which frames of a video are used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoCut {
    /// Every n-th frame that passes the other rules (1: all).
    pub every: u64,
    /// At most this many frames per second of video time.
    pub fps: Option<f64>,
    /// Seconds of video time (from the stream's start) to skip.
    pub start_s: f64,
    /// Seconds of video time to use from `start_s`.
    pub duration_s: Option<f64>,
}

impl Default for VideoCut {
    fn default() -> Self {
        Self {
            every: 1,
            fps: None,
            start_s: 0.0,
            duration_s: None,
        }
    }
}

impl VideoCut {
    /// Whether nothing is cut.
    pub fn is_whole(&self) -> bool {
        *self == Self::default()
    }
}

/// Picks frames by their presentation time, one decision per decoded frame, in order.
#[derive(Debug, Clone)]
pub struct FramePicker {
    cut: VideoCut,
    /// The next time `--fps` takes a frame at, once the first frame is taken.
    next_due_ns: Option<i64>,
    /// Frames that passed the time rules, for `--every`.
    passed: u64,
}

/// What the picker says of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    Take,
    Skip,
    /// Past `--duration`: nothing later is wanted.
    End,
}

/// Half a millisecond of slack, so frames at a rate `--fps` divides exactly (30 → 15) are
/// not lost to rounding of their timestamps.
const FPS_SLACK_NS: i64 = 500_000;

impl FramePicker {
    pub fn new(cut: VideoCut) -> Self {
        Self {
            cut,
            next_due_ns: None,
            passed: 0,
        }
    }

    pub fn pick(&mut self, t_ns: i64) -> Pick {
        let start_ns = (self.cut.start_s * 1e9).round() as i64;
        if t_ns < start_ns - FPS_SLACK_NS {
            return Pick::Skip;
        }
        if let Some(d) = self.cut.duration_s
            && t_ns >= start_ns + (d * 1e9).round() as i64 - FPS_SLACK_NS
        {
            return Pick::End;
        }
        if let Some(fps) = self.cut.fps {
            let period = (1e9 / fps).round() as i64;
            match self.next_due_ns {
                Some(due) if t_ns < due - FPS_SLACK_NS => return Pick::Skip,
                Some(mut due) => {
                    while due - FPS_SLACK_NS <= t_ns {
                        due += period;
                    }
                    self.next_due_ns = Some(due);
                }
                None => self.next_due_ns = Some(t_ns + period),
            }
        }
        let n = self.passed;
        self.passed += 1;
        if n.is_multiple_of(self.cut.every.max(1)) {
            Pick::Take
        } else {
            Pick::Skip
        }
    }
}

/// What the decode thread learnt when it opened the file.
#[derive(Debug, Clone)]
struct VideoInfo {
    /// Width and height as delivered (after rotation).
    size: (u32, u32),
    codec: String,
    /// Clockwise quarter turns applied (0..=3).
    quarter_turns: u32,
    /// The frames the cut is expected to keep, from the container's frame count or duration.
    expected_frames: Option<u64>,
    frame_rate: Option<f64>,
}

/// One message from the decode thread.
enum Decoded {
    Frame(CapturedFrame),
    /// A problem that ended or damaged the stream; frames before it were delivered.
    Warning(String),
}

/// A video file, decoded on a thread of its own.
pub struct VideoFile {
    path: PathBuf,
    info: VideoInfo,
    frames: Option<Receiver<Decoded>>,
    thread: Option<JoinHandle<()>>,
    delivered: u64,
    warnings: Vec<String>,
}

/// FFmpeg's own log would repeat on stderr what the errors here say, in its words.
pub(crate) fn init_ffmpeg() -> Result<(), ffmpeg::Error> {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| ffmpeg::util::log::set_level(ffmpeg::util::log::Level::Fatal));
    ffmpeg::init()
}

/// Whether `path` names a video by its extension (used where the file does not exist yet, so
/// the error can say "no such video" rather than "no such folder").
pub fn has_video_extension(path: &Path) -> bool {
    matches!(
        path.extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .as_deref(),
        Some("mp4" | "m4v" | "mov" | "mkv" | "webm" | "avi" | "mts" | "m2ts" | "ts" | "mpg")
    )
}

impl VideoFile {
    /// Opens `path` and starts decoding. Errors name the file: not found, not a format FFmpeg
    /// reads, no video stream, a codec this FFmpeg cannot decode.
    pub fn open(path: &Path, cut: VideoCut) -> Result<Self, CaptureError> {
        check_cut(path, &cut)?;
        let bad = |reason: String| CaptureError::Decode {
            path: path.to_owned(),
            reason,
        };
        std::fs::metadata(path).map_err(|source| CaptureError::Io {
            path: path.to_owned(),
            source,
        })?;
        init_ffmpeg().map_err(|e| bad(format!("FFmpeg did not start: {e}")))?;
        let (ready_tx, ready_rx) = bounded(1);
        let (frames_tx, frames_rx) = bounded(DECODE_AHEAD);
        let thread_path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("video-decode".into())
            .spawn(move || match Decoder::open(&thread_path, cut) {
                Ok(decoder) => {
                    if ready_tx.send(Ok(decoder.info.clone())).is_ok() {
                        decoder.run(frames_tx);
                    }
                }
                Err(e) => {
                    // `open` waits for this answer; it cannot have gone.
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| CaptureError::Worker(format!("starting the video decode thread: {e}")))?;
        let info = match ready_rx.recv() {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(bad("the decode thread ended while opening the file".into()));
            }
        };
        Ok(Self {
            path: path.to_owned(),
            info,
            frames: Some(frames_rx),
            thread: Some(thread),
            delivered: 0,
            warnings: Vec::new(),
        })
    }

    /// Clockwise quarter turns the rotation metadata asked for (0 to 3).
    pub fn quarter_turns(&self) -> u32 {
        self.info.quarter_turns
    }
}

fn check_cut(path: &Path, cut: &VideoCut) -> Result<(), CaptureError> {
    let bad = |reason: String| CaptureError::BadInput {
        input: path.display().to_string(),
        reason,
    };
    if cut.every == 0 {
        return Err(bad("--every must be at least 1, got 0".into()));
    }
    if let Some(fps) = cut.fps
        && !(fps.is_finite() && fps > 0.0)
    {
        return Err(bad(format!("--fps must be above 0, got {fps}")));
    }
    if !(cut.start_s.is_finite() && cut.start_s >= 0.0) {
        return Err(bad(format!(
            "--start must be 0 or more seconds, got {}",
            cut.start_s
        )));
    }
    if let Some(d) = cut.duration_s
        && !(d.is_finite() && d > 0.0)
    {
        return Err(bad(format!("--duration must be above 0 seconds, got {d}")));
    }
    Ok(())
}

impl Source for VideoFile {
    fn next_frame(&mut self) -> Result<Option<CapturedFrame>, CaptureError> {
        let Some(frames) = self.frames.as_ref() else {
            return Ok(None);
        };
        loop {
            match frames.recv() {
                Ok(Decoded::Frame(frame)) => {
                    self.delivered += 1;
                    return Ok(Some(frame));
                }
                Ok(Decoded::Warning(w)) => self.warnings.push(w),
                Err(_) => {
                    // The thread is done (end of file or damage, said in a warning).
                    self.frames = None;
                    if let Some(t) = self.thread.take()
                        && t.join().is_err()
                    {
                        return Err(CaptureError::Worker(format!(
                            "{}: the video decode thread panicked",
                            self.path.display()
                        )));
                    }
                    return Ok(None);
                }
            }
        }
    }

    fn is_live(&self) -> bool {
        false
    }

    fn describe(&self) -> String {
        let (w, h) = self.info.size;
        format!(
            "video {} ({} {w}×{h}{}{}; times: presentation time)",
            self.path.display(),
            self.info.codec,
            self.info
                .frame_rate
                .map(|r| format!(" @ {r:.3} fps"))
                .unwrap_or_default(),
            match self.info.quarter_turns {
                0 => String::new(),
                q => format!(", turned {}° clockwise by its rotation metadata", q * 90),
            }
        )
    }

    /// An estimate from the container's frame count or duration (a container may not know
    /// either; then `None`).
    fn remaining_hint(&self) -> Option<u64> {
        self.info
            .expected_frames
            .map(|n| n.saturating_sub(self.delivered))
    }

    fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    fn frame_size_hint(&mut self) -> Option<(u32, u32)> {
        Some(self.info.size)
    }
}

impl Drop for VideoFile {
    fn drop(&mut self) {
        // Hanging up stops the thread at its next frame.
        self.frames = None;
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::warn!("the video decode thread panicked");
        }
    }
}

/// The decoding side, on the decode thread.
struct Decoder {
    path: PathBuf,
    name: String,
    input: ffmpeg::format::context::Input,
    stream_index: usize,
    decoder: ffmpeg::decoder::Video,
    time_base: ffmpeg::Rational,
    start_pts: i64,
    listed_frames: Option<u64>,
    /// The stream's duration in nanoseconds, when the container says.
    duration_ns: Option<i64>,
    info: VideoInfo,
    picker: FramePicker,
    scaler: Option<(ScalerKey, ffmpeg::software::scaling::Context)>,
    /// Frames decoded (every one, picked or not), and the last one's time.
    decoded: u64,
    last_ns: Option<i64>,
    kept: u64,
}

type ScalerKey = (ffmpeg::format::Pixel, u32, u32);

impl Decoder {
    fn open(path: &Path, cut: VideoCut) -> Result<Self, CaptureError> {
        let bad = |reason: String| CaptureError::Decode {
            path: path.to_owned(),
            reason,
        };
        let input = ffmpeg::format::input(path).map_err(|e| {
            bad(format!(
                "FFmpeg cannot read it as a video ({e}){}",
                if e == ffmpeg::Error::InvalidData {
                    "; an MP4 or MOV cut short before its index (which most writers put at \
                     the end) cannot be read at all"
                } else {
                    ""
                }
            ))
        })?;
        let Some(stream) = input.streams().best(ffmpeg::media::Type::Video) else {
            let kinds: Vec<String> = input
                .streams()
                .map(|s| format!("{:?}", s.parameters().medium()).to_lowercase())
                .collect();
            return Err(bad(if kinds.is_empty() {
                "no video stream (the file has no streams at all)".into()
            } else {
                format!(
                    "no video stream (the file has: {}); give a video file",
                    kinds.join(", ")
                )
            }));
        };
        let stream_index = stream.index();
        let time_base = stream.time_base();
        let params = stream.parameters();
        let codec_id = params.id();
        let mut context = ffmpeg::codec::context::Context::from_parameters(params)
            .map_err(|e| bad(format!("the video stream's parameters: {e}")))?;
        // Frame threads: one decode thread alone cannot keep up with 4K H.265.
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(1, 8);
        context.set_threading(ffmpeg::codec::threading::Config {
            kind: ffmpeg::codec::threading::Type::Frame,
            count: threads,
            ..Default::default()
        });
        let decoder = context.decoder().video().map_err(|e| {
            bad(format!(
                "this FFmpeg cannot decode its {codec_id:?} video ({e})"
            ))
        })?;
        let quarter_turns = rotation_quarter_turns(&stream);
        let (w, h) = (decoder.width(), decoder.height());
        if w == 0 || h == 0 {
            return Err(bad("the video stream declares no frame size".into()));
        }
        // The limits a folder's images have: a frame size no machine here can hold is refused
        // from the stream's header, before anything is decoded.
        if let Some(why) = super::image_limits::decode_limits().refuse_size(w, h) {
            return Err(bad(format!(
                "a video frame: {why} (--max-image-megapixels raises the limit)"
            )));
        }
        let size = if quarter_turns % 2 == 1 {
            (h, w)
        } else {
            (w, h)
        };
        let start_pts = match stream.start_time() {
            t if t == ffmpeg::ffi::AV_NOPTS_VALUE => 0,
            t => t,
        };
        let listed_frames = u64::try_from(stream.frames()).ok().filter(|&n| n > 0);
        let duration_ns = match stream.duration() {
            d if d > 0 && d != ffmpeg::ffi::AV_NOPTS_VALUE => Some(to_ns(d, time_base)),
            _ => match input.duration() {
                // The container's, in AV_TIME_BASE (microseconds).
                d if d > 0 && d != ffmpeg::ffi::AV_NOPTS_VALUE => Some(d.saturating_mul(1000)),
                _ => None,
            },
        };
        let frame_rate = rate(stream.avg_frame_rate()).or_else(|| rate(stream.rate()));
        let info = VideoInfo {
            size,
            codec: format!("{codec_id:?}").to_lowercase(),
            quarter_turns,
            expected_frames: expected_frames(&cut, listed_frames, duration_ns, frame_rate),
            frame_rate,
        };
        Ok(Self {
            path: path.to_owned(),
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            input,
            stream_index,
            decoder,
            time_base,
            start_pts,
            listed_frames,
            duration_ns,
            info,
            picker: FramePicker::new(cut),
            scaler: None,
            decoded: 0,
            last_ns: None,
            kept: 0,
        })
    }

    /// Reads to the end, a read error, or until nobody wants frames.
    fn run(mut self, out: Sender<Decoded>) {
        let mut packet = ffmpeg::Packet::empty();
        let mut decode_errors = 0u64;
        let mut first_decode_error = None;
        loop {
            let clock = Instant::now();
            match packet.read(&mut self.input) {
                Ok(()) => {}
                Err(ffmpeg::Error::Eof) => break,
                Err(e) => {
                    let _ = out.send(Decoded::Warning(
                        self.damaged(&format!("reading the file failed ({e})")),
                    ));
                    self.drain(&out);
                    return;
                }
            }
            if packet.stream() != self.stream_index {
                continue;
            }
            let read_ms = ms_since(clock);
            if let Err(e) = self.decoder.send_packet(&packet) {
                decode_errors += 1;
                first_decode_error.get_or_insert_with(|| e.to_string());
                continue;
            }
            match self.receive(&out, read_ms) {
                Flow::Go => {}
                Flow::Stop => return,
            }
        }
        if self.decoder.send_eof().is_ok() && matches!(self.receive(&out, 0.0), Flow::Stop) {
            return;
        }
        if decode_errors > 0 {
            let _ = out.send(Decoded::Warning(format!(
                "{}: {decode_errors} packets did not decode (first: {}); the frames around \
                 them are missing",
                self.path.display(),
                first_decode_error.unwrap_or_default()
            )));
        }
        if let Some(why) = self.short_of_container() {
            let _ = out.send(Decoded::Warning(self.damaged(&why)));
        }
        if self.kept == 0 && self.decoded > 0 {
            let _ = out.send(Decoded::Warning(format!(
                "{}: none of its {} frames (up to {:.3} s) is inside --start/--duration",
                self.path.display(),
                self.decoded,
                self.last_ns.unwrap_or(0) as f64 / 1e9
            )));
        }
    }

    /// Flushes the decoder after a read error: frames it holds are before the damage.
    fn drain(&mut self, out: &Sender<Decoded>) {
        if self.decoder.send_eof().is_ok() {
            self.receive(out, 0.0);
        }
    }

    fn damaged(&self, what: &str) -> String {
        format!(
            "{}: {what}: the file is damaged or cut short; the {} frames before it were used \
             ({} decoded{})",
            self.path.display(),
            self.kept,
            self.decoded,
            self.last_ns
                .map(|t| format!(", up to {:.3} s", t as f64 / 1e9))
                .unwrap_or_default()
        )
    }

    /// Whether the stream ended before what the container lists (a truncated file often
    /// still ends in a clean end-of-file).
    fn short_of_container(&self) -> Option<String> {
        if let Some(listed) = self.listed_frames
            && self.decoded < listed
        {
            return Some(format!(
                "it ended after {} of the {listed} frames its container lists",
                self.decoded
            ));
        }
        let period = self.info.frame_rate.map_or(0.0, |r| 1e9 / r) as i64;
        let (Some(duration), Some(last)) = (self.duration_ns, self.last_ns) else {
            return None;
        };
        // The last frame starts one frame period before the end; allow two more of slack.
        (self.listed_frames.is_none() && last + 3 * period.max(1) < duration).then(|| {
            format!(
                "it ended at {:.3} s of the {:.3} s its container declares",
                last as f64 / 1e9,
                duration as f64 / 1e9
            )
        })
    }

    /// Every frame the decoder has ready.
    fn receive(&mut self, out: &Sender<Decoded>, read_ms: f64) -> Flow {
        let mut frame = ffmpeg::frame::Video::empty();
        loop {
            let clock = Instant::now();
            if self.decoder.receive_frame(&mut frame).is_err() {
                // EAGAIN (wants more input) or EOF (drained).
                return Flow::Go;
            }
            let number = self.decoded;
            self.decoded += 1;
            let t_ns = self.frame_time(&frame, number);
            self.last_ns = Some(t_ns);
            match self.picker.pick(t_ns) {
                Pick::Skip => continue,
                Pick::End => return Flow::Stop,
                Pick::Take => {}
            }
            let image = match self.convert_to_rgb(&frame) {
                Ok(img) => rotate_quarter_turns(img, self.info.quarter_turns),
                Err(e) => {
                    let _ = out.send(Decoded::Warning(format!(
                        "{}: frame {number} did not convert to RGB ({e}); skipped",
                        self.path.display()
                    )));
                    continue;
                }
            };
            let decode_ms = ms_since(clock);
            let index = self.kept;
            self.kept += 1;
            let origin = FrameOrigin {
                name: format!("{}#frame_{number:06}", self.name),
                time: CaptureTime::new(t_ns, TimeBase::Stream),
                original_size: Some((image.width, image.height)),
            };
            let captured = CapturedFrame {
                index,
                image,
                origin,
                captured_at: Instant::now(),
                capture_ms: read_ms,
                decode_ms,
            };
            if out.send(Decoded::Frame(captured)).is_err() {
                return Flow::Stop;
            }
        }
    }

    /// Presentation time from the stream's start. A frame without one (rare, raw streams)
    /// is placed one frame period after the previous.
    fn frame_time(&self, frame: &ffmpeg::frame::Video, number: u64) -> i64 {
        match frame.timestamp().or(frame.pts()) {
            Some(pts) => to_ns(pts - self.start_pts, self.time_base),
            None => {
                let period = self.info.frame_rate.map_or(1e9 / 30.0, |r| 1e9 / r);
                match self.last_ns {
                    Some(last) => last + period as i64,
                    None => (number as f64 * period) as i64,
                }
            }
        }
    }

    fn convert_to_rgb(&mut self, frame: &ffmpeg::frame::Video) -> Result<RgbImage, ffmpeg::Error> {
        use ffmpeg::software::scaling;
        let key = (frame.format(), frame.width(), frame.height());
        if self.scaler.as_ref().is_none_or(|(k, _)| *k != key) {
            let ctx = scaling::Context::get(
                key.0,
                key.1,
                key.2,
                ffmpeg::format::Pixel::RGB24,
                key.1,
                key.2,
                scaling::Flags::BILINEAR,
            )?;
            self.scaler = Some((key, ctx));
        }
        let Some((_, scaler)) = self.scaler.as_mut() else {
            return Err(ffmpeg::Error::Bug);
        };
        let mut rgb = ffmpeg::frame::Video::empty();
        scaler.run(frame, &mut rgb)?;
        let (w, h) = (rgb.width() as usize, rgb.height() as usize);
        let stride = rgb.stride(0);
        let plane = rgb.data(0);
        let mut data = Vec::with_capacity(w * h * 3);
        for row in 0..h {
            data.extend_from_slice(&plane[row * stride..row * stride + w * 3]);
        }
        Ok(RgbImage {
            width: w as u32,
            height: h as u32,
            data,
        })
    }
}

enum Flow {
    Go,
    Stop,
}

fn to_ns(ts: i64, tb: ffmpeg::Rational) -> i64 {
    if tb.denominator() == 0 {
        return 0;
    }
    // Rounded to the nearest nanosecond (1/3 s is 333333333 ns, 2/3 s 666666667).
    let num = i128::from(ts) * i128::from(tb.numerator()) * 1_000_000_000;
    let den = i128::from(tb.denominator());
    let ns = (2 * num + den.abs()).div_euclid(2 * den.abs()) * den.signum();
    ns.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

fn rate(r: ffmpeg::Rational) -> Option<f64> {
    (r.numerator() > 0 && r.denominator() > 0)
        .then(|| f64::from(r.numerator()) / f64::from(r.denominator()))
}

/// Frames the cut keeps, estimated from the container.
fn expected_frames(
    cut: &VideoCut,
    listed: Option<u64>,
    duration_ns: Option<i64>,
    frame_rate: Option<f64>,
) -> Option<u64> {
    let total_s = duration_ns.map(|d| d as f64 / 1e9);
    let rate = frame_rate?;
    let span_s = match (total_s, cut.duration_s) {
        (Some(t), Some(d)) => (t - cut.start_s).min(d),
        (Some(t), None) => t - cut.start_s,
        (None, _) if cut.start_s == 0.0 && cut.duration_s.is_none() => listed? as f64 / rate,
        (None, _) => return None,
    }
    .max(0.0);
    let frames = match (cut.start_s == 0.0 && cut.duration_s.is_none(), listed) {
        (true, Some(n)) => n as f64,
        _ => (span_s * rate).round(),
    };
    let frames = match cut.fps {
        Some(fps) if fps < rate => (frames * fps / rate).ceil(),
        _ => frames,
    };
    Some((frames / cut.every.max(1) as f64).ceil() as u64)
}

/// Clockwise quarter turns that show the stream upright: from its display matrix (FFmpeg's
/// angle is counter-clockwise), else the `rotate` tag (clockwise). Angles between quarter turns
/// are rounded to the nearest; a mirrored matrix's flip is not applied (phones do not write one).
fn rotation_quarter_turns(stream: &ffmpeg::format::stream::Stream) -> u32 {
    let from_matrix = stream
        .side_data()
        .find(|sd| sd.kind() == ffmpeg::codec::packet::side_data::Type::DisplayMatrix)
        .and_then(|sd| {
            let bytes = sd.data();
            if bytes.len() < 36 {
                return None;
            }
            let mut matrix = [0i32; 9];
            for (i, m) in matrix.iter_mut().enumerate() {
                *m = i32::from_ne_bytes(bytes[4 * i..4 * i + 4].try_into().ok()?);
            }
            // SAFETY: FFmpeg reads the nine values of the matrix it is given and nothing else.
            let ccw = unsafe { ffmpeg::ffi::av_display_rotation_get(matrix.as_ptr()) };
            ccw.is_finite().then_some(-ccw)
        });
    let clockwise = from_matrix.or_else(|| {
        stream
            .metadata()
            .get("rotate")
            .and_then(|r| r.trim().parse::<f64>().ok())
    });
    match clockwise {
        Some(deg) => ((deg / 90.0).round() as i64).rem_euclid(4) as u32,
        None => 0,
    }
}

/// `image` turned clockwise by `turns` quarter turns.
pub fn rotate_quarter_turns(image: RgbImage, turns: u32) -> RgbImage {
    let turns = turns % 4;
    if turns == 0 {
        return image;
    }
    let (w, h) = (image.width as usize, image.height as usize);
    let (nw, nh) = if turns == 2 { (w, h) } else { (h, w) };
    let mut data = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            // Where source pixel (x, y) lands.
            let (nx, ny) = match turns {
                1 => (h - 1 - y, x),
                2 => (w - 1 - x, h - 1 - y),
                _ => (y, w - 1 - x),
            };
            let src = 3 * (y * w + x);
            let dst = 3 * (ny * nw + nx);
            data[dst..dst + 3].copy_from_slice(&image.data[src..src + 3]);
        }
    }
    RgbImage {
        width: nw as u32,
        height: nh as u32,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(cut: VideoCut, fps: f64, n: u64) -> Vec<u64> {
        let mut picker = FramePicker::new(cut);
        let mut out = Vec::new();
        for i in 0..n {
            let t = (i as f64 / fps * 1e9).round() as i64;
            match picker.pick(t) {
                Pick::Take => out.push(i),
                Pick::Skip => {}
                Pick::End => break,
            }
        }
        out
    }

    #[test]
    fn every_fps_start_and_duration_pick_frames() {
        let all = VideoCut::default();
        assert_eq!(picks(all, 30.0, 5), vec![0, 1, 2, 3, 4]);
        let every = VideoCut { every: 3, ..all };
        assert_eq!(picks(every, 30.0, 10), vec![0, 3, 6, 9]);
        let fps = VideoCut {
            fps: Some(10.0),
            ..all
        };
        assert_eq!(picks(fps, 30.0, 10), vec![0, 3, 6, 9]);
        // 29.97 fps thinned to 15: every other frame, none lost to rounding.
        let ntsc = VideoCut {
            fps: Some(15.0),
            ..all
        };
        assert_eq!(picks(ntsc, 30_000.0 / 1001.0, 8), vec![0, 2, 4, 6]);
        let window = VideoCut {
            start_s: 0.1,
            duration_s: Some(0.1),
            ..all
        };
        assert_eq!(picks(window, 30.0, 30), vec![3, 4, 5]);
    }

    #[test]
    fn presentation_times_round_to_the_nanosecond() {
        let tb = ffmpeg::Rational::new(1, 15360);
        assert_eq!(to_ns(5120, tb), 333_333_333);
        assert_eq!(to_ns(10240, tb), 666_666_667);
        assert_eq!(to_ns(-5120, tb), -333_333_333);
        assert_eq!(to_ns(3, ffmpeg::Rational::new(1001, 30000)), 100_100_000);
    }

    #[test]
    fn quarter_turns_move_pixels_clockwise() {
        // 2×1: red, green.
        let img = RgbImage {
            width: 2,
            height: 1,
            data: vec![255, 0, 0, 0, 255, 0],
        };
        let cw = rotate_quarter_turns(img.clone(), 1);
        assert_eq!((cw.width, cw.height), (1, 2));
        assert_eq!(cw.data, vec![255, 0, 0, 0, 255, 0], "red on top");
        let half = rotate_quarter_turns(img.clone(), 2);
        assert_eq!(half.data, vec![0, 255, 0, 255, 0, 0]);
        let ccw = rotate_quarter_turns(img, 3);
        assert_eq!(ccw.data, vec![0, 255, 0, 255, 0, 0], "green on top");
    }

    #[test]
    fn a_bad_cut_names_the_flag() {
        for (cut, flag) in [
            (
                VideoCut {
                    every: 0,
                    ..VideoCut::default()
                },
                "--every",
            ),
            (
                VideoCut {
                    fps: Some(0.0),
                    ..VideoCut::default()
                },
                "--fps",
            ),
            (
                VideoCut {
                    start_s: -1.0,
                    ..VideoCut::default()
                },
                "--start",
            ),
            (
                VideoCut {
                    duration_s: Some(f64::NAN),
                    ..VideoCut::default()
                },
                "--duration",
            ),
        ] {
            let err = VideoFile::open(Path::new("clip.mp4"), cut)
                .err()
                .expect("refused");
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    #[test]
    fn a_missing_or_unreadable_file_is_named() {
        let err = VideoFile::open(Path::new("no/such/clip.mp4"), VideoCut::default())
            .err()
            .expect("missing");
        assert!(err.to_string().contains("no/such/clip.mp4"), "{err}");
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk.mp4");
        std::fs::write(&junk, b"this is not a video at all").expect("write");
        let err = VideoFile::open(&junk, VideoCut::default())
            .err()
            .expect("junk");
        let text = err.to_string();
        assert!(
            text.contains("junk.mp4") && text.contains("cannot read"),
            "{text}"
        );
    }
}
