//! Payloads of the record kinds: little-endian fields, f16 maps, JPEG images, JSON for the
//! small structured parts (cache snapshot, timings, notices).

use glam::Mat4;
use half::f16;
use serde::{Deserialize, Serialize};

use crate::frame::{
    CaptureTime, FrameOrigin, FramePoints, FrameType, Intrinsics, RgbImage, StageTime, TimeBase,
};

/// Appends little-endian fields to a buffer.
#[derive(Debug, Default)]
pub struct ByteWriter(Vec<u8>);

impl ByteWriter {
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn f32(&mut self, v: f32) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn f64(&mut self, v: f64) {
        self.bytes(&v.to_le_bytes());
    }
    pub fn mat4(&mut self, m: &Mat4) {
        for v in m.to_cols_array() {
            self.f32(v);
        }
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

/// Reads little-endian fields; `None` when the payload is shorter than its fields say.
#[derive(Debug)]
pub struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }
    pub fn f32(&mut self) -> Option<f32> {
        Some(f32::from_le_bytes(self.array()?))
    }
    pub fn f64(&mut self) -> Option<f64> {
        Some(f64::from_le_bytes(self.array()?))
    }
    pub fn mat4(&mut self) -> Option<Mat4> {
        let mut cols = [0f32; 16];
        for v in &mut cols {
            *v = self.f32()?;
        }
        Some(Mat4::from_cols_array(&cols))
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let out = &self.bytes[self.pos..];
        self.pos = self.bytes.len();
        out
    }
}

/// What is wrong with a payload that does not decode (which field was missing or wrong), or
/// with a value that cannot be encoded. The reader and writer add the file and the offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

impl From<String> for CodecError {
    fn from(what: String) -> Self {
        CodecError(what)
    }
}

pub type DecodeResult<T> = Result<T, CodecError>;

fn short(what: &str) -> CodecError {
    CodecError(format!("{what} payload is shorter than its fields"))
}

/// The frame index every frame record starts with.
pub fn frame_of(payload: &[u8]) -> Option<u64> {
    ByteReader::new(payload).u64()
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoseRecord {
    pub frame: u64,
    pub frame_type: FrameType,
    /// Seconds since the recording started, when the recorder was handed the result.
    pub t_s: f64,
    pub dropped_before: u64,
    pub world_from_camera: Mat4,
    pub camera_from_world: Mat4,
}

fn frame_type_code(t: FrameType) -> u8 {
    match t {
        FrameType::Scale => 0,
        FrameType::Keyframe => 1,
        FrameType::NonKeyframe => 2,
    }
}

pub fn encode_pose(p: &PoseRecord) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(8 + 1 + 8 + 8 + 128);
    w.u64(p.frame);
    w.u8(frame_type_code(p.frame_type));
    w.f64(p.t_s);
    w.u64(p.dropped_before);
    w.mat4(&p.world_from_camera);
    w.mat4(&p.camera_from_world);
    w.into_vec()
}

pub fn decode_pose(payload: &[u8]) -> DecodeResult<PoseRecord> {
    let mut r = ByteReader::new(payload);
    let frame = r.u64().ok_or_else(|| short("pose"))?;
    let frame_type = match r.u8().ok_or_else(|| short("pose"))? {
        0 => FrameType::Scale,
        1 => FrameType::Keyframe,
        2 => FrameType::NonKeyframe,
        other => return Err(format!("unknown frame type {other}").into()),
    };
    let rest = (|| Some((r.f64()?, r.u64()?, r.mat4()?, r.mat4()?)))();
    let (t_s, dropped_before, world_from_camera, camera_from_world) =
        rest.ok_or_else(|| short("pose"))?;
    Ok(PoseRecord {
        frame,
        frame_type,
        t_s,
        dropped_before,
        world_from_camera,
        camera_from_world,
    })
}

/// Longest source name stored (a path-like name past this is cut at a character boundary).
pub const MAX_SOURCE_NAME: usize = 4096;

/// A frame's origin (format version 2): capture time in ns (i64) and its clock (u8), size as
/// captured (u8 flag, u32 width, u32 height), source name (u32 length, UTF-8).
pub fn encode_origin(frame: u64, o: &FrameOrigin) -> Vec<u8> {
    let mut name = o.name.as_str();
    if name.len() > MAX_SOURCE_NAME {
        let mut cut = MAX_SOURCE_NAME;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name = &name[..cut];
    }
    let mut w = ByteWriter::with_capacity(8 + 8 + 1 + 9 + 4 + name.len());
    w.u64(frame);
    w.u64(o.time.ns as u64);
    w.u8(o.time.base.code());
    let (has_size, (width, height)) = match o.original_size {
        Some(size) => (1, size),
        None => (0, (0, 0)),
    };
    w.u8(has_size);
    w.u32(width);
    w.u32(height);
    w.u32(name.len() as u32);
    w.bytes(name.as_bytes());
    w.into_vec()
}

pub fn decode_origin(payload: &[u8]) -> DecodeResult<FrameOrigin> {
    let mut r = ByteReader::new(payload);
    let head = (|| {
        Some((
            r.u64()?,
            r.u64()?,
            r.u8()?,
            r.u8()?,
            r.u32()?,
            r.u32()?,
            r.u32()?,
        ))
    })();
    let (_, ns, base, has_size, width, height, name_len) = head.ok_or_else(|| short("origin"))?;
    let base = TimeBase::from_code(base).ok_or_else(|| format!("unknown time base {base}"))?;
    if name_len as usize > MAX_SOURCE_NAME {
        return Err(format!("source name of {name_len} bytes (at most {MAX_SOURCE_NAME})").into());
    }
    let name = r.take(name_len as usize).ok_or_else(|| short("origin"))?;
    let name = std::str::from_utf8(name)
        .map_err(|e| format!("source name is not UTF-8: {e}"))?
        .to_owned();
    Ok(FrameOrigin {
        name,
        time: CaptureTime::new(ns as i64, base),
        original_size: (has_size == 1).then_some((width, height)),
    })
}

pub fn encode_intrinsics(frame: u64, k: &Intrinsics) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(32);
    w.u64(frame);
    for v in [k.fx, k.fy, k.cx, k.cy] {
        w.f32(v);
    }
    w.u32(k.width);
    w.u32(k.height);
    w.into_vec()
}

pub fn decode_intrinsics(payload: &[u8]) -> DecodeResult<Intrinsics> {
    let mut r = ByteReader::new(payload);
    let k = (|| {
        r.u64()?;
        Some(Intrinsics {
            fx: r.f32()?,
            fy: r.f32()?,
            cx: r.f32()?,
            cy: r.f32()?,
            width: r.u32()?,
            height: r.u32()?,
        })
    })();
    k.ok_or_else(|| short("intrinsics"))
}

/// JPEG keeps a session small (the image is for looking at, the geometry is stored exactly).
pub fn encode_image(frame: u64, image: &RgbImage, quality: u8) -> DecodeResult<Vec<u8>> {
    let expected = image.width as usize * image.height as usize * 3;
    if image.data.len() != expected {
        return Err(format!(
            "image is {}x{} but holds {} bytes (expected {expected})",
            image.width,
            image.height,
            image.data.len()
        )
        .into());
    }
    let mut w = ByteWriter::with_capacity(16 + expected / 8);
    w.u64(frame);
    w.u32(image.width);
    w.u32(image.height);
    let mut jpeg = Vec::with_capacity(expected / 8);
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, quality)
        .encode(
            &image.data,
            image.width,
            image.height,
            image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| CodecError(format!("JPEG encoding: {e}")))?;
    w.bytes(&jpeg);
    Ok(w.into_vec())
}

/// The JPEG bytes of an image record, undecoded (exporters copy them as they are).
pub fn image_jpeg(payload: &[u8]) -> DecodeResult<(u32, u32, &[u8])> {
    let mut r = ByteReader::new(payload);
    let head = (|| Some((r.u64()?, r.u32()?, r.u32()?)))();
    let (_, width, height) = head.ok_or_else(|| short("image"))?;
    Ok((width, height, r.rest()))
}

pub fn decode_image(payload: &[u8]) -> DecodeResult<RgbImage> {
    // The size is checked from the headers before any pixel memory is taken.
    check_image(payload)?;
    let (width, height, jpeg) = image_jpeg(payload)?;
    let decoded = image::load_from_memory_with_format(jpeg, image::ImageFormat::Jpeg)
        .map_err(|e| CodecError(format!("JPEG decoding: {e}")))?
        .to_rgb8();
    if decoded.width() != width || decoded.height() != height {
        return Err(format!(
            "JPEG is {}x{}, the record says {width}x{height}",
            decoded.width(),
            decoded.height()
        )
        .into());
    }
    Ok(RgbImage {
        width,
        height,
        data: decoded.into_raw(),
    })
}

/// Depth or confidence as f16: half the bytes, and f16's 11-bit mantissa keeps depth to
/// about 0.05 % (far below the model's own error).
pub fn encode_map(frame: u64, width: u32, height: u32, values: &[f32]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(20 + values.len() * 2);
    w.u64(frame);
    w.u32(width);
    w.u32(height);
    w.u32(values.len() as u32);
    for &v in values {
        w.u16(f16::from_f32(v).to_bits());
    }
    w.into_vec()
}

pub fn decode_map(payload: &[u8]) -> DecodeResult<(u32, u32, Vec<f32>)> {
    let mut r = ByteReader::new(payload);
    let head = (|| Some((r.u64()?, r.u32()?, r.u32()?, r.u32()?)))();
    let (_, width, height, count) = head.ok_or_else(|| short("map"))?;
    let bytes = r.take(count as usize * 2).ok_or_else(|| short("map"))?;
    let values = bytes
        .chunks_exact(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    Ok((width, height, values))
}

pub fn encode_points(frame: u64, p: &FramePoints) -> DecodeResult<Vec<u8>> {
    let n = p.xyz.len();
    if p.rgb.len() != n || p.confidence.len() != n {
        return Err(format!(
            "points have {n} positions, {} colours, {} confidences",
            p.rgb.len(),
            p.confidence.len()
        )
        .into());
    }
    let mut w = ByteWriter::with_capacity(12 + n * 19);
    w.u64(frame);
    w.u32(n as u32);
    for xyz in &p.xyz {
        for &v in xyz {
            w.f32(v);
        }
    }
    for rgb in &p.rgb {
        w.bytes(rgb);
    }
    for &c in &p.confidence {
        w.f32(c);
    }
    Ok(w.into_vec())
}

/// The point count, checked against the payload's length (cheap: no point is decoded).
pub fn check_points(payload: &[u8]) -> DecodeResult<usize> {
    let mut r = ByteReader::new(payload);
    let n = (|| {
        r.u64()?;
        r.u32()
    })()
    .ok_or_else(|| short("points"))? as usize;
    // Check the length before allocating: n comes from the file.
    if Some(payload.len()) != n.checked_mul(19).and_then(|b| b.checked_add(12)) {
        return Err(format!(
            "points payload of {} bytes cannot hold the {n} points it declares",
            payload.len()
        )
        .into());
    }
    Ok(n)
}

/// A depth or confidence map's declared size, checked against the payload (no value decoded).
pub fn check_map(payload: &[u8]) -> DecodeResult<()> {
    let mut r = ByteReader::new(payload);
    let head = (|| Some((r.u64()?, r.u32()?, r.u32()?, r.u32()?)))();
    let (_, _, _, count) = head.ok_or_else(|| short("map"))?;
    if r.take(count as usize * 2).is_none() {
        return Err(format!(
            "map payload of {} bytes cannot hold the {count} values it declares",
            payload.len()
        )
        .into());
    }
    Ok(())
}

/// A JPEG part's header: the stored JPEG's own size must be the record's (read from the
/// JPEG header only; the pixels are decoded when the frame is read).
pub fn check_image(payload: &[u8]) -> DecodeResult<()> {
    let (width, height, jpeg) = image_jpeg(payload)?;
    let dims =
        image::ImageReader::with_format(std::io::Cursor::new(jpeg), image::ImageFormat::Jpeg)
            .into_dimensions()
            .map_err(|e| CodecError(format!("JPEG header: {e}")))?;
    if dims != (width, height) {
        return Err(format!(
            "JPEG is {}x{}, the record says {width}x{height}",
            dims.0, dims.1
        )
        .into());
    }
    // A recorded frame is a model input: far below the capture limit, which bounds it here
    // so a crafted record cannot make a replay allocate gigabytes.
    if let Some(why) = crate::capture::DecodeLimits::default().refuse_size(width, height) {
        return Err(CodecError(why));
    }
    Ok(())
}

pub fn decode_points(payload: &[u8]) -> DecodeResult<FramePoints> {
    let n = check_points(payload)?;
    let mut r = ByteReader::new(&payload[12..]);
    let mut out = FramePoints {
        xyz: Vec::with_capacity(n),
        rgb: Vec::with_capacity(n),
        confidence: Vec::with_capacity(n),
    };
    let fields = (|| {
        for _ in 0..n {
            out.xyz.push([r.f32()?, r.f32()?, r.f32()?]);
        }
        for _ in 0..n {
            let c = r.take(3)?;
            out.rgb.push([c[0], c[1], c[2]]);
        }
        for _ in 0..n {
            out.confidence.push(r.f32()?);
        }
        Some(())
    })();
    fields.ok_or_else(|| short("points"))?;
    Ok(out)
}

/// A frame index followed by JSON (cache snapshot, timings).
pub fn encode_json_part<T: Serialize>(frame: u64, value: &T) -> DecodeResult<Vec<u8>> {
    let mut w = ByteWriter::default();
    w.u64(frame);
    w.bytes(&serde_json::to_vec(value).map_err(|e| CodecError(e.to_string()))?);
    Ok(w.into_vec())
}

pub fn decode_json_part<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> DecodeResult<T> {
    let json = payload.get(8..).ok_or_else(|| short("json"))?;
    serde_json::from_slice(json).map_err(|e| CodecError(format!("JSON: {e}")))
}

/// Timings in binary: JSON's float parsing does not give back every f64 bit for bit.
pub fn encode_timings(frame: u64, timings: &[StageTime]) -> DecodeResult<Vec<u8>> {
    let mut w = ByteWriter::default();
    w.u64(frame);
    w.u32(timings.len() as u32);
    for t in timings {
        let name = t.stage.as_bytes();
        let len = u16::try_from(name.len())
            .map_err(|_| CodecError(format!("stage name of {} bytes", name.len())))?;
        w.u16(len);
        w.bytes(name);
        w.f64(t.ms);
    }
    Ok(w.into_vec())
}

pub fn decode_timings(payload: &[u8]) -> DecodeResult<Vec<StageTime>> {
    let mut r = ByteReader::new(payload);
    let n = (|| {
        r.u64()?;
        r.u32()
    })()
    .ok_or_else(|| short("timings"))?;
    let mut out = Vec::new();
    for _ in 0..n {
        let len = r.u16().ok_or_else(|| short("timings"))?;
        let name = r.take(len as usize).ok_or_else(|| short("timings"))?;
        let stage =
            String::from_utf8(name.to_vec()).map_err(|e| CodecError(format!("stage name: {e}")))?;
        let ms = r.f64().ok_or_else(|| short("timings"))?;
        out.push(StageTime { stage, ms });
    }
    Ok(out)
}

pub fn encode_frame_end(frame: u64) -> Vec<u8> {
    frame.to_le_bytes().to_vec()
}

/// A recorder notice: something about the recording itself, kept in the file so a replay and
/// an export can say it too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    pub message: String,
    /// Results handed to the recorder that are not in the file (it fell behind).
    #[serde(default)]
    pub results_not_recorded: u64,
    /// The stream frames of the first and last result not recorded.
    #[serde(default)]
    pub first_frame: Option<u64>,
    #[serde(default)]
    pub last_frame: Option<u64>,
    /// Seconds since the recording started.
    #[serde(default)]
    pub t_s: f64,
}

/// One index entry: where a record starts, its kind and (for frame records) its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub offset: u64,
    pub kind: u16,
    pub frame: u64,
}

/// Frame of a record that belongs to no frame.
pub const NO_FRAME: u64 = u64::MAX;

pub fn encode_index(entries: &[IndexEntry]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(8 + entries.len() * 18);
    w.u64(entries.len() as u64);
    for e in entries {
        w.u64(e.offset);
        w.u16(e.kind);
        w.u64(e.frame);
    }
    w.into_vec()
}

pub fn decode_index(payload: &[u8]) -> DecodeResult<Vec<IndexEntry>> {
    let mut r = ByteReader::new(payload);
    let n = r.u64().ok_or_else(|| short("index"))?;
    if payload.len() as u64 != 8 + n.saturating_mul(18) {
        return Err(format!("index of {} bytes cannot hold {n} entries", payload.len()).into());
    }
    (0..n)
        .map(|_| {
            Some(IndexEntry {
                offset: r.u64()?,
                kind: r.u16()?,
                frame: r.u64()?,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| short("index"))
}
