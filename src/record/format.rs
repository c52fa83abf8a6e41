//! The byte layout of a session file (see `docs/recording-format.md`): the header, the framing
//! of one record, and the footer that points at the index. Payloads are in `codec`.

use crate::record::codec::{ByteReader, ByteWriter};

/// `\r\n` in the magic catches a file mangled by a text-mode transfer (as PNG does).
pub const FILE_MAGIC: [u8; 8] = *b"SRSESS\r\n";
/// Version 2 adds the [`RecordKind::Origin`] record (capture time, source name, size as
/// captured). Version-1 files are still read: their frames get the origin
/// [`FrameOrigin::recorded_v1`](crate::frame::FrameOrigin::recorded_v1) gives.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest version this build reads.
pub const OLDEST_READABLE_VERSION: u16 = 1;
/// magic, version u16, flags u16, config length u32, crc32 u32; then the config JSON.
pub const HEADER_FIXED_LEN: usize = 20;

/// Every record starts with these bytes, so a reader can resync after damage by scanning.
pub const RECORD_MAGIC: [u8; 4] = *b"SRrc";
/// magic, kind u16, flags u16, payload length u32, crc32 u32.
pub const RECORD_HEADER_LEN: usize = 16;
/// A sanity cap for lengths read from damaged bytes; one frame's maps stay far below it.
pub const MAX_PAYLOAD_LEN: usize = 1 << 30;

/// index record offset u64, crc32 of those 8 bytes u32, magic.
pub const FOOTER_LEN: usize = 16;
pub const FOOTER_MAGIC: [u8; 4] = *b"SRnd";

/// What a record holds. Frame records start with the frame index (u64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum RecordKind {
    /// Opens a frame: frame index, type, time, drops, both transforms.
    Pose = 1,
    Intrinsics = 2,
    /// The model's input image as JPEG.
    Image = 3,
    /// Depth map as f16.
    Depth = 4,
    /// Confidence map as f16.
    Confidence = 5,
    /// The filtered points (f32 xyz, u8 rgb, f32 confidence).
    Points = 6,
    /// Cache stats, events and page map (JSON).
    Cache = 7,
    /// Stage timings (JSON).
    Timings = 8,
    /// Closes a frame: every record of it was written before this one.
    FrameEnd = 9,
    /// A recorder notice (JSON), e.g. "fell behind, N results not recorded".
    Notice = 10,
    /// Written at close: the offset, kind and frame of every record before it.
    Index = 11,
    /// A frame's capture time, source name and size as captured (version 2).
    Origin = 12,
}

impl RecordKind {
    pub fn from_u16(v: u16) -> Option<Self> {
        use RecordKind::*;
        Some(match v {
            1 => Pose,
            2 => Intrinsics,
            3 => Image,
            4 => Depth,
            5 => Confidence,
            6 => Points,
            7 => Cache,
            8 => Timings,
            9 => FrameEnd,
            10 => Notice,
            11 => Index,
            12 => Origin,
            _ => return None,
        })
    }

    /// Whether the payload starts with a frame index.
    pub fn is_frame_part(self) -> bool {
        !matches!(self, RecordKind::Notice | RecordKind::Index)
    }
}

pub fn encode_header(config_json: &[u8]) -> Vec<u8> {
    encode_header_version(FORMAT_VERSION, config_json)
}

/// A header naming `version`: the current one, or an older one for a writer that makes
/// files of that version (tests of the readers' compatibility).
pub fn encode_header_version(version: u16, config_json: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::default();
    w.bytes(&FILE_MAGIC);
    w.u16(version);
    w.u16(0);
    w.u32(config_json.len() as u32);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&w.as_slice()[8..16]);
    crc.update(config_json);
    w.u32(crc.finalize());
    w.bytes(config_json);
    w.into_vec()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    NotASession,
    Version(u16),
    /// The header itself is damaged or cut (a crash before the first sync).
    Damaged(String),
}

/// Parses the header; returns (version, config JSON bytes range end = first record offset).
pub fn decode_header(bytes: &[u8]) -> Result<(u16, &[u8], usize), HeaderError> {
    if bytes.len() < FILE_MAGIC.len() || bytes[..8] != FILE_MAGIC {
        return Err(HeaderError::NotASession);
    }
    let mut r = ByteReader::new(&bytes[8..]);
    let fixed = (|| Some((r.u16()?, r.u16()?, r.u32()?, r.u32()?)))();
    let Some((version, _flags, config_len, crc)) = fixed else {
        return Err(HeaderError::Damaged("the header is cut short".into()));
    };
    if !(OLDEST_READABLE_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(HeaderError::Version(version));
    }
    let end = HEADER_FIXED_LEN
        .checked_add(config_len as usize)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| HeaderError::Damaged("the config is cut short".into()))?;
    let config = &bytes[HEADER_FIXED_LEN..end];
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&bytes[8..16]);
    hasher.update(config);
    if hasher.finalize() != crc {
        return Err(HeaderError::Damaged("header checksum mismatch".into()));
    }
    Ok((version, config, end))
}

pub fn encode_record(kind: RecordKind, payload: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(RECORD_HEADER_LEN + payload.len());
    w.bytes(&RECORD_MAGIC);
    w.u16(kind as u16);
    w.u16(0);
    w.u32(payload.len() as u32);
    w.u32(record_crc(kind as u16, 0, payload));
    w.bytes(payload);
    w.into_vec()
}

fn record_crc(kind: u16, flags: u16, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&kind.to_le_bytes());
    h.update(&flags.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// A record found intact at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordAt {
    pub offset: usize,
    /// The raw kind (a newer writer may add kinds this build skips).
    pub kind: u16,
    pub payload_start: usize,
    pub payload_end: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordProblem {
    /// Fewer bytes remain than the record needs: a write cut short.
    Incomplete,
    /// The bytes are there but wrong.
    Damaged(String),
}

/// Checks the record starting at `offset` (magic, sane length, checksum).
pub fn record_at(bytes: &[u8], offset: usize) -> Result<RecordAt, RecordProblem> {
    let rest = bytes.get(offset..).unwrap_or_default();
    if rest.len() < RECORD_HEADER_LEN {
        if RECORD_MAGIC.starts_with(&rest[..rest.len().min(4)]) {
            return Err(RecordProblem::Incomplete);
        }
        return Err(RecordProblem::Damaged("no record magic".into()));
    }
    if rest[..4] != RECORD_MAGIC {
        return Err(RecordProblem::Damaged("no record magic".into()));
    }
    let mut r = ByteReader::new(&rest[4..RECORD_HEADER_LEN]);
    let (kind, flags, len, crc) = match (r.u16(), r.u16(), r.u32(), r.u32()) {
        (Some(k), Some(f), Some(l), Some(c)) => (k, f, l as usize, c),
        _ => return Err(RecordProblem::Incomplete),
    };
    if len > MAX_PAYLOAD_LEN {
        return Err(RecordProblem::Damaged(format!(
            "impossible record length {len}"
        )));
    }
    if rest.len() < RECORD_HEADER_LEN + len {
        return Err(RecordProblem::Incomplete);
    }
    let payload = &rest[RECORD_HEADER_LEN..RECORD_HEADER_LEN + len];
    if record_crc(kind, flags, payload) != crc {
        return Err(RecordProblem::Damaged("record checksum mismatch".into()));
    }
    Ok(RecordAt {
        offset,
        kind,
        payload_start: offset + RECORD_HEADER_LEN,
        payload_end: offset + RECORD_HEADER_LEN + len,
    })
}

/// The next offset after `from` where an intact record starts (the resync after damage).
pub fn next_record(bytes: &[u8], from: usize) -> Option<RecordAt> {
    let mut pos = from;
    while pos + RECORD_MAGIC.len() <= bytes.len() {
        let found = bytes[pos..]
            .windows(RECORD_MAGIC.len())
            .position(|w| w == RECORD_MAGIC)?;
        pos += found;
        if let Ok(rec) = record_at(bytes, pos) {
            return Some(rec);
        }
        pos += 1;
    }
    None
}

pub fn encode_footer(index_offset: u64) -> [u8; FOOTER_LEN] {
    let mut out = [0u8; FOOTER_LEN];
    out[..8].copy_from_slice(&index_offset.to_le_bytes());
    out[8..12].copy_from_slice(&crc32fast::hash(&index_offset.to_le_bytes()).to_le_bytes());
    out[12..].copy_from_slice(&FOOTER_MAGIC);
    out
}

/// The index offset the footer names, if the file ends in an intact footer.
pub fn decode_footer(bytes: &[u8]) -> Option<u64> {
    let start = bytes.len().checked_sub(FOOTER_LEN)?;
    let f = &bytes[start..];
    if f[12..] != FOOTER_MAGIC {
        return None;
    }
    let offset_bytes: [u8; 8] = f[..8].try_into().ok()?;
    let crc = u32::from_le_bytes(f[8..12].try_into().ok()?);
    (crc32fast::hash(&offset_bytes) == crc).then(|| u64::from_le_bytes(offset_bytes))
}
