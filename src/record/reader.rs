//! Reads a session: through the index when the file was closed, by scanning records when it
//! was not (a killed process). Every record's checksum is verified once at open; a damaged
//! record is reported with its offset and skipped, and the scan resyncs at the next record
//! magic, so the rest of the file still loads.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use glam::Mat4;

use crate::frame::{
    CacheSnapshot, FrameOrigin, FramePoints, FrameResult, FrameType, Intrinsics, RgbImage,
};
use crate::record::RecordError;
use crate::record::cache_codec::CacheRecord;
use crate::record::codec::{self, Notice, PoseRecord};
use crate::record::format::{self, HeaderError, RecordAt, RecordKind, RecordProblem};

/// The whole file in memory or mapped.
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Something wrong in the file that did not stop it loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadIssue {
    pub path: PathBuf,
    pub offset: u64,
    pub kind: IssueKind,
    pub what: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueKind {
    /// Bytes that are there but wrong (checksum, magic, payload): skipped.
    Damaged,
    /// The file ends inside a record: the recording was not closed (killed, crashed).
    CutShort,
    /// Intact but not usable by this build (unknown kind, a part without its frame's pose).
    Skipped,
}

impl fmt::Display for ReadIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at byte {}: {}",
            self.path.display(),
            self.offset,
            self.what
        )
    }
}

/// What a frame's pose record says, plus where the rest of its records are.
#[derive(Debug, Clone)]
pub struct FrameInfo {
    pub frame: u64,
    pub frame_type: FrameType,
    /// Seconds since the recording started.
    pub t_s: f64,
    pub dropped_before: u64,
    pub world_from_camera: Mat4,
    pub camera_from_world: Mat4,
    pub intrinsics: Option<Intrinsics>,
    /// Capture time, source name and size as captured: from its origin record, or for a
    /// version-1 file (or an origin record lost to damage) [`FrameOrigin::recorded_v1`].
    pub origin: FrameOrigin,
    /// Whether `origin` was read from the file (not the version-1 fallback).
    pub origin_recorded: bool,
    /// Its `FrameEnd` record was read: every part written is here.
    pub complete: bool,
    parts: HashMap<RecordKind, RecordAt>,
}

impl FrameInfo {
    pub fn has(&self, kind: RecordKind) -> bool {
        self.parts.contains_key(&kind)
    }
}

/// A recorded image as stored: width, height, JPEG bytes.
pub type StoredJpeg<'a> = (u32, u32, &'a [u8]);

/// Which heavy parts `read_frame` decodes (points, cache and timings always are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// Decode the JPEG.
    pub image: bool,
    /// Depth and confidence maps.
    pub maps: bool,
}

impl Parts {
    pub const ALL: Parts = Parts {
        image: true,
        maps: true,
    };
    pub const GEOMETRY: Parts = Parts {
        image: false,
        maps: false,
    };
}

pub struct SessionReader {
    path: PathBuf,
    bytes: Bytes,
    version: u16,
    config: serde_json::Value,
    frames: Vec<FrameInfo>,
    notices: Vec<Notice>,
    /// For each notice, how many frames came before it in the file (where a reset falls).
    notice_frames: Vec<usize>,
    issues: Vec<ReadIssue>,
    /// Damage found only when a frame's payload is decoded (a JPEG whose header reads but
    /// whose data does not): counted as it is found, once per record.
    late_issues: Mutex<Vec<ReadIssue>>,
    indexed: bool,
}

impl fmt::Debug for SessionReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionReader")
            .field("path", &self.path)
            .field("frames", &self.frames.len())
            .field("issues", &self.issues.len())
            .field("indexed", &self.indexed)
            .finish()
    }
}

impl SessionReader {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, RecordError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| RecordError::io(path, e))?;
        // SAFETY: the map is read-only and every byte read from it is bounds- and
        // checksum-checked. A session is append-only, so its bytes do not change under us;
        // truncating a file while it is replayed is the one thing this does not survive.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| RecordError::io(path, e))?;
        Self::parse(path.to_path_buf(), Bytes::Mapped(map))
    }

    /// Reads a session held in memory; `path` is only named in messages.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, RecordError> {
        Self::parse(path.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<Self, RecordError> {
        let (version, config, header_end) = match format::decode_header(&bytes) {
            Ok(h) => h,
            Err(HeaderError::NotASession) => return Err(RecordError::NotASession { path }),
            Err(HeaderError::Version(found)) => {
                return Err(RecordError::Version {
                    path,
                    found,
                    supported: format::FORMAT_VERSION,
                });
            }
            Err(HeaderError::Damaged(what)) => {
                return Err(RecordError::Corrupt {
                    path,
                    offset: 0,
                    what,
                });
            }
        };
        let config = serde_json::from_slice(config).map_err(|e| RecordError::Corrupt {
            path: path.clone(),
            offset: format::HEADER_FIXED_LEN as u64,
            what: format!("config JSON: {e}"),
        })?;
        let mut reader = Self {
            path,
            bytes,
            version,
            config,
            frames: Vec::new(),
            notices: Vec::new(),
            notice_frames: Vec::new(),
            issues: Vec::new(),
            late_issues: Mutex::new(Vec::new()),
            indexed: false,
        };
        let records = match reader.records_from_index(header_end) {
            Some(records) => {
                reader.indexed = true;
                records
            }
            None => {
                let end = match format::decode_footer(&reader.bytes) {
                    // A footer whose index is unusable: scan, but not into the footer.
                    Some(_) => reader.bytes.len() - format::FOOTER_LEN,
                    None => reader.bytes.len(),
                };
                reader.scan(header_end, end)
            }
        };
        reader.group(&records);
        Ok(reader)
    }

    /// The records the index lists, each checked; `None` when there is no usable index.
    fn records_from_index(&mut self, header_end: usize) -> Option<Vec<RecordAt>> {
        let index_offset = usize::try_from(format::decode_footer(&self.bytes)?).ok()?;
        let data_end = self.bytes.len() - format::FOOTER_LEN;
        let index = format::record_at(&self.bytes[..data_end], index_offset).ok();
        let entries = index
            .filter(|r| r.kind == RecordKind::Index as u16 && r.offset >= header_end)
            .and_then(|r| codec::decode_index(&self.bytes[r.payload_start..r.payload_end]).ok());
        let Some(entries) = entries else {
            self.issue(
                index_offset as u64,
                IssueKind::Damaged,
                "the index is damaged; scanning the records instead".into(),
            );
            return None;
        };
        let mut records = Vec::with_capacity(entries.len());
        for e in entries {
            let at = usize::try_from(e.offset)
                .ok()
                .filter(|&o| o >= header_end && o < index_offset);
            let rec = at.map(|o| format::record_at(&self.bytes[..index_offset], o));
            match rec {
                Some(Ok(r)) if r.kind == e.kind => records.push(r),
                Some(Ok(r)) => self.issue(
                    e.offset,
                    IssueKind::Damaged,
                    format!(
                        "the index says record kind {}, the file has {}",
                        e.kind, r.kind
                    ),
                ),
                Some(Err(p)) => self.issue(
                    e.offset,
                    IssueKind::Damaged,
                    format!(
                        "{} record{}: {}; record skipped",
                        RecordKind::from_u16(e.kind).map_or("unknown", kind_name),
                        if e.frame == codec::NO_FRAME {
                            String::new()
                        } else {
                            format!(" of frame {}", e.frame)
                        },
                        problem_text(&p)
                    ),
                ),
                None => self.issue(
                    e.offset,
                    IssueKind::Damaged,
                    "the index points outside the records".into(),
                ),
            }
        }
        Some(records)
    }

    /// Walks records from `start`; after damage, resyncs at the next intact record.
    fn scan(&mut self, start: usize, end: usize) -> Vec<RecordAt> {
        let mut records = Vec::new();
        let mut pos = start;
        while pos < end {
            let data = &self.bytes[..end];
            match format::record_at(data, pos) {
                Ok(r) => {
                    pos = r.payload_end;
                    records.push(r);
                }
                Err(problem) => match format::next_record(data, pos + 1) {
                    Some(next) => {
                        let what = unverified_label(data, pos);
                        self.issue(
                            pos as u64,
                            IssueKind::Damaged,
                            format!(
                                "{what}{}; skipped {} bytes to the next record",
                                problem_text(&problem),
                                next.offset - pos
                            ),
                        );
                        pos = next.offset;
                    }
                    None => {
                        let (kind, what) = match problem {
                            RecordProblem::Incomplete => (
                                IssueKind::CutShort,
                                format!(
                                    "the last record is cut short ({} bytes): the recording was not closed",
                                    end - pos
                                ),
                            ),
                            RecordProblem::Damaged(d) => (
                                IssueKind::Damaged,
                                format!(
                                    "{}{d}; the last {} bytes are skipped",
                                    unverified_label(data, pos),
                                    end - pos
                                ),
                            ),
                        };
                        self.issue(pos as u64, kind, what);
                        break;
                    }
                },
            }
        }
        records
    }

    /// Assembles frames: a pose opens one, the parts that follow with its frame index join it.
    fn group(&mut self, records: &[RecordAt]) {
        // Held aside so payloads can be borrowed while frames and issues are added.
        let bytes = std::mem::replace(&mut self.bytes, Bytes::Owned(Vec::new()));
        for rec in records {
            let payload = &bytes[rec.payload_start..rec.payload_end];
            let Some(kind) = RecordKind::from_u16(rec.kind) else {
                self.issue(
                    rec.offset as u64,
                    IssueKind::Skipped,
                    format!("unknown record kind {} (a newer writer?) skipped", rec.kind),
                );
                continue;
            };
            match kind {
                RecordKind::Index => {}
                RecordKind::Notice => match serde_json::from_slice::<Notice>(payload) {
                    Ok(n) => {
                        self.notices.push(n);
                        self.notice_frames.push(self.frames.len());
                    }
                    Err(e) => self.issue(
                        rec.offset as u64,
                        IssueKind::Damaged,
                        format!("notice JSON: {e}"),
                    ),
                },
                RecordKind::Pose => match codec::decode_pose(payload) {
                    Ok(p) => self.frames.push(frame_info(p)),
                    Err(e) => self.issue(rec.offset as u64, IssueKind::Damaged, e.to_string()),
                },
                _ => self.attach(kind, *rec, payload),
            }
        }
        self.bytes = bytes;
    }

    fn attach(&mut self, kind: RecordKind, rec: RecordAt, payload: &[u8]) {
        let Some(frame) = codec::frame_of(payload) else {
            self.issue(
                rec.offset as u64,
                IssueKind::Damaged,
                "record too short for its frame index".into(),
            );
            return;
        };
        // Parts follow their pose; searching back copes with a pose that was skipped.
        let Some(info) = self.frames.iter_mut().rev().find(|f| f.frame == frame) else {
            self.issue(
                rec.offset as u64,
                IssueKind::Skipped,
                format!("frame {frame}'s pose record is missing; this part of it is skipped"),
            );
            return;
        };
        // Each part is checked once here, so one damaged part costs that part alone: the
        // frame stays, without it, and the damage is counted as an issue (an export or a
        // replay never fails on it later).
        let checked = match kind {
            RecordKind::Intrinsics => codec::decode_intrinsics(payload).map(|k| {
                info.intrinsics = Some(k);
            }),
            RecordKind::Origin => codec::decode_origin(payload).map(|o| {
                info.origin = o;
                info.origin_recorded = true;
            }),
            RecordKind::Points => codec::check_points(payload).map(|_| ()),
            RecordKind::Depth | RecordKind::Confidence => codec::check_map(payload),
            RecordKind::Image => codec::check_image(payload),
            RecordKind::Cache => codec::decode_json_part::<CacheRecord>(payload).map(|_| ()),
            RecordKind::Timings => codec::decode_timings(payload).map(|_| ()),
            _ => Ok(()),
        };
        match checked {
            Ok(()) => {
                if kind == RecordKind::FrameEnd {
                    info.complete = true;
                }
                info.parts.insert(kind, rec);
            }
            Err(e) => self.issue(
                rec.offset as u64,
                IssueKind::Damaged,
                format!(
                    "frame {frame}'s {} record: {e}; the frame is kept without it",
                    kind_name(kind)
                ),
            ),
        }
    }

    fn issue(&mut self, offset: u64, kind: IssueKind, what: String) {
        self.issues.push(ReadIssue {
            path: self.path.clone(),
            offset,
            kind,
            what,
        });
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u16 {
        self.version
    }
    /// The run's settings as the recorder was given them.
    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }
    pub fn frames(&self) -> &[FrameInfo] {
        &self.frames
    }
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }
    /// How many of [`frames`](Self::frames) come before each of [`notices`](Self::notices) in
    /// the file: where a notice (a session reset) falls in the stream.
    pub fn notice_frames(&self) -> &[usize] {
        &self.notice_frames
    }
    /// Everything wrong found so far: at open, and in frames read since.
    pub fn issues(&self) -> Vec<ReadIssue> {
        let mut all = self.issues.clone();
        all.extend(self.late().iter().cloned());
        all
    }

    fn late(&self) -> std::sync::MutexGuard<'_, Vec<ReadIssue>> {
        // A reader that panicked mid-push left a whole Vec: its entries are still true.
        self.late_issues.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn late_issue(&self, offset: u64, what: String) {
        let mut late = self.late();
        if !late.iter().any(|i| i.offset == offset) {
            late.push(ReadIssue {
                path: self.path.clone(),
                offset,
                kind: IssueKind::Damaged,
                what,
            });
        }
    }
    /// Whether the file was closed (index and footer intact).
    pub fn indexed(&self) -> bool {
        self.indexed
    }

    fn part(&self, i: usize, kind: RecordKind) -> Option<(u64, &[u8])> {
        let rec = self.frames.get(i)?.parts.get(&kind)?;
        Some((
            rec.offset as u64,
            &self.bytes[rec.payload_start..rec.payload_end],
        ))
    }

    fn corrupt(&self, offset: u64, what: impl std::fmt::Display) -> RecordError {
        RecordError::Corrupt {
            path: self.path.clone(),
            offset,
            what: what.to_string(),
        }
    }

    /// The JPEG of frame `i` as stored (width, height, bytes), if it was recorded.
    pub fn image_jpeg(&self, i: usize) -> Result<Option<StoredJpeg<'_>>, RecordError> {
        self.part(i, RecordKind::Image)
            .map(|(offset, p)| codec::image_jpeg(p).map_err(|e| self.corrupt(offset, e)))
            .transpose()
    }

    pub fn read_points(&self, i: usize) -> Result<FramePoints, RecordError> {
        match self.part(i, RecordKind::Points) {
            Some((offset, p)) => codec::decode_points(p).map_err(|e| self.corrupt(offset, e)),
            None => Ok(FramePoints::default()),
        }
    }

    /// Frame `i` as the pipeline produced it (image through JPEG, maps through f16). Parts
    /// that were not recorded (or were skipped as damaged) come back empty.
    pub fn read_frame(&self, i: usize, parts: Parts) -> Result<FrameResult, RecordError> {
        let info = self.frames.get(i).ok_or_else(|| {
            self.corrupt(
                0,
                format!("frame {i} requested, the session has {}", self.frames.len()),
            )
        })?;
        // A JPEG that does not decode costs the frame its image only (counted in `issues`).
        let image = match self.part(i, RecordKind::Image).filter(|_| parts.image) {
            Some((offset, p)) => codec::decode_image(p).unwrap_or_else(|e| {
                self.late_issue(
                    offset,
                    format!(
                        "frame {}'s image record: {e}; the frame is kept without its image",
                        info.frame
                    ),
                );
                RgbImage::default()
            }),
            None => RgbImage::default(),
        };
        let map = |kind| -> Result<Vec<f32>, RecordError> {
            match self.part(i, kind).filter(|_| parts.maps) {
                Some((offset, p)) => codec::decode_map(p)
                    .map(|(_, _, v)| v)
                    .map_err(|e| self.corrupt(offset, e)),
                None => Ok(Vec::new()),
            }
        };
        let cache: CacheSnapshot = match self.part(i, RecordKind::Cache) {
            Some((offset, p)) => codec::decode_json_part::<CacheRecord>(p)
                .map_err(|e| self.corrupt(offset, e))?
                .into(),
            None => CacheSnapshot::default(),
        };
        let timings = match self.part(i, RecordKind::Timings) {
            Some((offset, p)) => codec::decode_timings(p).map_err(|e| self.corrupt(offset, e))?,
            None => Vec::new(),
        };
        Ok(FrameResult {
            frame: info.frame,
            origin: info.origin.clone(),
            frame_type: info.frame_type,
            world_from_camera: info.world_from_camera,
            camera_from_world: info.camera_from_world,
            intrinsics: info.intrinsics.unwrap_or(Intrinsics {
                fx: 0.0,
                fy: 0.0,
                cx: 0.0,
                cy: 0.0,
                width: 0,
                height: 0,
            }),
            points: self.read_points(i)?,
            image,
            depth: map(RecordKind::Depth)?,
            confidence: map(RecordKind::Confidence)?,
            cache,
            timings,
            dropped_before: info.dropped_before,
        })
    }
}

fn frame_info(p: PoseRecord) -> FrameInfo {
    FrameInfo {
        frame: p.frame,
        frame_type: p.frame_type,
        t_s: p.t_s,
        dropped_before: p.dropped_before,
        world_from_camera: p.world_from_camera,
        camera_from_world: p.camera_from_world,
        intrinsics: None,
        origin: FrameOrigin::recorded_v1(p.frame, p.t_s),
        origin_recorded: false,
        complete: false,
        parts: HashMap::new(),
    }
}

/// A record kind as a person reads it.
pub fn kind_name(kind: RecordKind) -> &'static str {
    match kind {
        RecordKind::Pose => "pose",
        RecordKind::Intrinsics => "intrinsics",
        RecordKind::Image => "image",
        RecordKind::Depth => "depth",
        RecordKind::Confidence => "confidence",
        RecordKind::Points => "points",
        RecordKind::Cache => "cache",
        RecordKind::Timings => "timings",
        RecordKind::FrameEnd => "frame-end",
        RecordKind::Notice => "notice",
        RecordKind::Index => "index",
        RecordKind::Origin => "origin",
    }
}

/// What a damaged record's own header claims (kind, frame), so a warning says which frame
/// lost what; `"what it claims: "`, or nothing when even the header is unreadable.
fn unverified_label(bytes: &[u8], offset: usize) -> String {
    let Some(head) = bytes.get(offset..offset + format::RECORD_HEADER_LEN) else {
        return String::new();
    };
    if head[..4] != format::RECORD_MAGIC {
        return String::new();
    }
    let Some(kind) = RecordKind::from_u16(u16::from_le_bytes([head[4], head[5]])) else {
        return String::new();
    };
    let payload = offset + format::RECORD_HEADER_LEN;
    let frame = bytes
        .get(payload..payload + 8)
        .filter(|_| kind.is_frame_part())
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes);
    match frame {
        Some(f) => format!(
            "a {} record of frame {f} (by its unchecked header): ",
            kind_name(kind)
        ),
        None => format!("a {} record (by its unchecked header): ", kind_name(kind)),
    }
}

fn problem_text(p: &RecordProblem) -> String {
    match p {
        RecordProblem::Incomplete => "record cut short".into(),
        RecordProblem::Damaged(d) => d.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::SessionWriter;
    use crate::record::sample::sample_result;

    /// A session of `n` frames in memory, with `edit` applied to frame 1's image payload (its
    /// length kept, its checksum made right again).
    fn session_with_image_edit(n: u64, edit: impl Fn(&mut [u8])) -> Vec<u8> {
        let mut w =
            SessionWriter::new(Vec::new(), "mem.srec", &serde_json::json!({})).expect("writer");
        for i in 0..n {
            w.write_frame(&sample_result(i, 16, 12, 5), i as f64)
                .expect("frame");
        }
        let (mut bytes, _) = w.close().expect("close");
        let (_, _, mut pos) = format::decode_header(&bytes).expect("header");
        loop {
            let rec = format::record_at(&bytes, pos).expect("record");
            let payload = &bytes[rec.payload_start..rec.payload_end];
            if rec.kind == RecordKind::Image as u16 && codec::frame_of(payload) == Some(1) {
                let mut new = payload.to_vec();
                edit(&mut new);
                let encoded = format::encode_record(RecordKind::Image, &new);
                bytes[rec.offset..rec.payload_end].copy_from_slice(&encoded);
                return bytes;
            }
            pos = rec.payload_end;
        }
    }

    #[test]
    fn an_image_record_declaring_a_huge_size_costs_only_the_image() {
        // Record and JPEG agree on 65500x65500: decoding would take 12 GB.
        let bytes = session_with_image_edit(3, |payload| {
            payload[8..12].copy_from_slice(&65_500u32.to_le_bytes());
            payload[12..16].copy_from_slice(&65_500u32.to_le_bytes());
            let jpeg = &mut payload[16..];
            let sof = jpeg
                .windows(2)
                .position(|w| w == [0xFF, 0xC0])
                .expect("baseline JPEG");
            jpeg[sof + 5..sof + 9].copy_from_slice(&[0xFF, 0xDC, 0xFF, 0xDC]);
        });
        let reader = SessionReader::from_bytes("mem.srec", bytes).expect("opens");
        assert_eq!(reader.frames().len(), 3, "every frame is kept");
        let issues = reader.issues();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert!(issues[0].what.contains("frame 1's image"), "{issues:?}");
        assert!(issues[0].what.contains("megapixels"), "{issues:?}");
        let frame = reader.read_frame(1, Parts::ALL).expect("the frame reads");
        assert_eq!(frame.image.width, 0, "without its image");
        assert_eq!(frame.points.len(), 5, "with its other parts");
    }
}
