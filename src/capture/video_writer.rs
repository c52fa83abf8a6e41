//! Writes RGB frames as a video file through the system's FFmpeg: the bundled sample's video of
//! the synthetic room (`run --write-sample`), and videos made inside tests.
//!
//! H.264 (libx264, one thread so the bytes are the same on every run of one build) where the
//! system's FFmpeg has it, else FFmpeg's own MPEG-4 Part 2 encoder; the container follows the
//! file's extension (mp4, mkv, ...). Frame k is stamped k / fps.

use std::path::{Path, PathBuf};

use ffmpeg_next as ffmpeg;

use super::error::CaptureError;
use crate::frame::RgbImage;

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoWritten {
    pub path: PathBuf,
    pub frames: u64,
    /// The encoder used (`libx264` or `mpeg4`).
    pub codec: String,
    pub bytes: u64,
}

/// Encodes `frames` (all of one size, even width and height) at `fps` frames per second into
/// `path`, through a temporary file beside it (a failed write leaves nothing half-written).
pub fn write_video(
    path: &Path,
    fps: u32,
    frames: impl IntoIterator<Item = RgbImage>,
) -> Result<VideoWritten, CaptureError> {
    let fail = |reason: String| CaptureError::Decode {
        path: path.to_owned(),
        reason,
    };
    if fps == 0 {
        return Err(fail("a video needs at least 1 frame per second".into()));
    }
    super::video::init_ffmpeg().map_err(|e| fail(format!("FFmpeg did not start: {e}")))?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "mp4".into());
    let part = tempfile::Builder::new()
        .prefix(".video-")
        .suffix(&format!(".{ext}"))
        .tempfile_in(dir)
        .map_err(|source| CaptureError::Io {
            path: dir.to_owned(),
            source,
        })?
        .into_temp_path();
    let (frames, codec) = encode(&part, fps, frames).map_err(|e| fail(e.to_string()))?;
    // A temporary file is private to its owner; the video is an ordinary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o644)).map_err(
            |source| CaptureError::Io {
                path: part.to_path_buf(),
                source,
            },
        )?;
    }
    part.persist(path).map_err(|e| CaptureError::Io {
        path: path.to_owned(),
        source: e.error,
    })?;
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(VideoWritten {
        path: path.to_owned(),
        frames,
        codec,
        bytes,
    })
}

#[derive(Debug, thiserror::Error)]
enum EncodeError {
    #[error("{0}")]
    Ffmpeg(#[from] ffmpeg::Error),
    #[error("{0}")]
    Input(String),
}

fn encode(
    path: &Path,
    fps: u32,
    frames: impl IntoIterator<Item = RgbImage>,
) -> Result<(u64, String), EncodeError> {
    use ffmpeg::format::Pixel;
    use ffmpeg::software::scaling;
    let mut frames = frames.into_iter().peekable();
    let (width, height) = match frames.peek() {
        Some(f) => (f.width, f.height),
        None => return Err(EncodeError::Input("no frames to write".into())),
    };
    if width % 2 == 1 || height % 2 == 1 || width == 0 || height == 0 {
        return Err(EncodeError::Input(format!(
            "{width}×{height}: video frames need an even width and height"
        )));
    }
    let mut output = ffmpeg::format::output(path)?;
    let (codec, codec_name) = match ffmpeg::encoder::find_by_name("libx264") {
        Some(c) => (c, "libx264"),
        None => (
            ffmpeg::encoder::find(ffmpeg::codec::Id::MPEG4)
                .ok_or(ffmpeg::Error::EncoderNotFound)?,
            "mpeg4",
        ),
    };
    let global_header = output
        .format()
        .flags()
        .contains(ffmpeg::format::Flags::GLOBAL_HEADER);
    let time_base = ffmpeg::Rational::new(1, fps as i32);
    let mut stream = output.add_stream(codec)?;
    let stream_index = stream.index();
    let mut encoder = ffmpeg::codec::context::Context::new_with_codec(codec)
        .encoder()
        .video()?;
    encoder.set_width(width);
    encoder.set_height(height);
    encoder.set_format(Pixel::YUV420P);
    encoder.set_time_base(time_base);
    encoder.set_frame_rate(Some(ffmpeg::Rational::new(fps as i32, 1)));
    if global_header {
        encoder.set_flags(ffmpeg::codec::Flags::GLOBAL_HEADER);
    }
    let mut options = ffmpeg::Dictionary::new();
    if codec_name == "libx264" {
        options.set("preset", "medium");
        options.set("crf", "20");
        options.set("threads", "1");
    } else {
        encoder.set_bit_rate(2_000_000);
    }
    let mut encoder = encoder.open_with(options)?;
    stream.set_parameters(&encoder);
    stream.set_time_base(time_base);
    output.write_header()?;
    let stream_time_base = output
        .stream(stream_index)
        .map(|s| s.time_base())
        .unwrap_or(time_base);

    let mut scaler = scaling::Context::get(
        Pixel::RGB24,
        width,
        height,
        Pixel::YUV420P,
        width,
        height,
        scaling::Flags::BILINEAR,
    )?;
    let mut written = 0u64;
    let mut packet = ffmpeg::Packet::empty();
    let mut drain = |encoder: &mut ffmpeg::encoder::Video,
                     output: &mut ffmpeg::format::context::Output|
     -> Result<(), ffmpeg::Error> {
        while encoder.receive_packet(&mut packet).is_ok() {
            packet.set_stream(stream_index);
            // Every frame lasts one period: without it an MP4's edit list ends at the last
            // frame's start and players drop that frame.
            if packet.duration() == 0 {
                packet.set_duration(1);
            }
            packet.rescale_ts(time_base, stream_time_base);
            packet.write_interleaved(output)?;
        }
        Ok(())
    };
    for (k, image) in frames.enumerate() {
        if (image.width, image.height) != (width, height) {
            return Err(EncodeError::Input(format!(
                "frame {k} is {}×{}, the video is {width}×{height}",
                image.width, image.height
            )));
        }
        let mut rgb = ffmpeg::frame::Video::new(Pixel::RGB24, width, height);
        let stride = rgb.stride(0);
        let row = width as usize * 3;
        let plane = rgb.data_mut(0);
        for y in 0..height as usize {
            plane[y * stride..y * stride + row]
                .copy_from_slice(&image.data[y * row..(y + 1) * row]);
        }
        let mut yuv = ffmpeg::frame::Video::empty();
        scaler.run(&rgb, &mut yuv)?;
        yuv.set_pts(Some(k as i64));
        encoder.send_frame(&yuv)?;
        drain(&mut encoder, &mut output)?;
        written += 1;
    }
    encoder.send_eof()?;
    drain(&mut encoder, &mut output)?;
    output.write_trailer()?;
    Ok((written, codec_name.to_owned()))
}
