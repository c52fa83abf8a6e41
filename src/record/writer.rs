//! Appends records to any `Write`: a file, a buffer in a test, a writer that fails on purpose.
//! Needs no `Seek`: offsets are counted as bytes go out, and the index and footer are appended
//! at close.

use std::io::Write;
use std::path::PathBuf;

use crate::frame::FrameResult;
use crate::record::RecordError;
use crate::record::cache_codec::CacheRecord;
use crate::record::codec::{self, IndexEntry, NO_FRAME, Notice, PoseRecord};
use crate::record::format::{self, RecordKind};

/// JPEG quality of recorded images: near-lossless to the eye at a tenth of the raw size.
pub const DEFAULT_JPEG_QUALITY: u8 = 90;

pub struct SessionWriter<W: Write> {
    out: W,
    /// Named in errors (the file, or what the caller calls its writer).
    path: PathBuf,
    offset: u64,
    index: Vec<IndexEntry>,
    jpeg_quality: u8,
    frames: u64,
    /// After a failed write the tail of the output is unknown: nothing more is appended.
    failed: bool,
    /// The format version written: the current one, or 1 (no origin records) for files that
    /// test how version-1 sessions still read.
    version: u16,
}

impl<W: Write> SessionWriter<W> {
    /// Writes the header. `config` is whatever describes the run (pipeline and model settings);
    /// it is stored as JSON and given back by the reader.
    pub fn new(
        out: W,
        path: impl Into<PathBuf>,
        config: &serde_json::Value,
    ) -> Result<Self, RecordError> {
        Self::with_version(out, path, config, format::FORMAT_VERSION)
    }

    /// A writer of format `version`: the current one, or 1, as sessions were written before
    /// frames carried their origin (so tests can make the files older builds made). Any
    /// other version is refused.
    pub fn with_version(
        out: W,
        path: impl Into<PathBuf>,
        config: &serde_json::Value,
        version: u16,
    ) -> Result<Self, RecordError> {
        let path = path.into();
        if version != format::FORMAT_VERSION && version != 1 {
            return Err(RecordError::Encode {
                path,
                frame: NO_FRAME,
                what: format!(
                    "cannot write format version {version} (this build writes 1 and {})",
                    format::FORMAT_VERSION
                ),
            });
        }
        let mut w = Self {
            out,
            path,
            offset: 0,
            index: Vec::new(),
            jpeg_quality: DEFAULT_JPEG_QUALITY,
            frames: 0,
            failed: false,
            version,
        };
        let json = serde_json::to_vec(config).map_err(|e| RecordError::Encode {
            path: w.path.clone(),
            frame: NO_FRAME,
            what: format!("config JSON: {e}"),
        })?;
        w.put(&format::encode_header_version(version, &json))?;
        Ok(w)
    }

    pub fn with_jpeg_quality(mut self, quality: u8) -> Self {
        self.jpeg_quality = quality.clamp(1, 100);
        self
    }

    /// Bytes written so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn frames_written(&self) -> u64 {
        self.frames
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Appends one frame: pose first (it opens the frame), `FrameEnd` last (it closes it).
    /// Everything is encoded before the first byte goes out, so a frame that cannot be encoded
    /// leaves no trace.
    pub fn write_frame(&mut self, r: &FrameResult, t_s: f64) -> Result<(), RecordError> {
        let frame = r.frame;
        let encode_err = |what: codec::CodecError| RecordError::Encode {
            path: self.path.clone(),
            frame,
            what: what.to_string(),
        };
        let mut parts: Vec<(RecordKind, Vec<u8>)> = Vec::with_capacity(9);
        parts.push((
            RecordKind::Pose,
            codec::encode_pose(&PoseRecord {
                frame,
                frame_type: r.frame_type,
                t_s,
                dropped_before: r.dropped_before,
                world_from_camera: r.world_from_camera,
                camera_from_world: r.camera_from_world,
            }),
        ));
        if self.version >= 2 {
            parts.push((RecordKind::Origin, codec::encode_origin(frame, &r.origin)));
        }
        parts.push((
            RecordKind::Intrinsics,
            codec::encode_intrinsics(frame, &r.intrinsics),
        ));
        if r.image.width > 0 && r.image.height > 0 {
            parts.push((
                RecordKind::Image,
                codec::encode_image(frame, &r.image, self.jpeg_quality).map_err(encode_err)?,
            ));
        }
        // The maps are at the input image's size; the intrinsics name it when the image is absent.
        let (mw, mh) = if r.image.width > 0 {
            (r.image.width, r.image.height)
        } else {
            (r.intrinsics.width, r.intrinsics.height)
        };
        if !r.depth.is_empty() {
            parts.push((
                RecordKind::Depth,
                codec::encode_map(frame, mw, mh, &r.depth),
            ));
        }
        if !r.confidence.is_empty() {
            parts.push((
                RecordKind::Confidence,
                codec::encode_map(frame, mw, mh, &r.confidence),
            ));
        }
        parts.push((
            RecordKind::Points,
            codec::encode_points(frame, &r.points).map_err(encode_err)?,
        ));
        parts.push((
            RecordKind::Cache,
            codec::encode_json_part(frame, &CacheRecord::from(&r.cache)).map_err(encode_err)?,
        ));
        parts.push((
            RecordKind::Timings,
            codec::encode_timings(frame, &r.timings).map_err(encode_err)?,
        ));
        parts.push((RecordKind::FrameEnd, codec::encode_frame_end(frame)));

        let mut bytes = Vec::with_capacity(parts.iter().map(|(_, p)| p.len() + 16).sum());
        let mut entries = Vec::with_capacity(parts.len());
        for (kind, payload) in &parts {
            entries.push(IndexEntry {
                offset: self.offset + bytes.len() as u64,
                kind: *kind as u16,
                frame,
            });
            bytes.extend_from_slice(&format::encode_record(*kind, payload));
        }
        self.put(&bytes)?;
        self.index.extend(entries);
        self.frames += 1;
        Ok(())
    }

    pub fn write_notice(&mut self, notice: &Notice) -> Result<(), RecordError> {
        let json = serde_json::to_vec(notice).map_err(|e| RecordError::Encode {
            path: self.path.clone(),
            frame: NO_FRAME,
            what: format!("notice JSON: {e}"),
        })?;
        let entry = IndexEntry {
            offset: self.offset,
            kind: RecordKind::Notice as u16,
            frame: NO_FRAME,
        };
        self.put(&format::encode_record(RecordKind::Notice, &json))?;
        self.index.push(entry);
        Ok(())
    }

    pub fn flush(&mut self) -> Result<(), RecordError> {
        let offset = self.offset;
        self.out.flush().map_err(|source| RecordError::Write {
            path: self.path.clone(),
            offset,
            source,
        })
    }

    /// Appends the index and the footer that points at it, flushes, and hands the output back
    /// (the caller syncs a file).
    pub fn finish(self) -> Result<W, RecordError> {
        self.close().map(|(out, _)| out)
    }

    /// `finish`, also giving the file's final length.
    pub fn close(mut self) -> Result<(W, u64), RecordError> {
        let index_offset = self.offset;
        let index = codec::encode_index(&self.index);
        self.put(&format::encode_record(RecordKind::Index, &index))?;
        self.put(&format::encode_footer(index_offset))?;
        self.flush()?;
        Ok((self.out, self.offset))
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        if self.failed {
            return Err(RecordError::Write {
                path: self.path.clone(),
                offset: self.offset,
                source: std::io::Error::other("an earlier write failed; recording stopped"),
            });
        }
        if let Err(source) = self.out.write_all(bytes) {
            self.failed = true;
            return Err(RecordError::Write {
                path: self.path.clone(),
                offset: self.offset,
                source,
            });
        }
        self.offset += bytes.len() as u64;
        Ok(())
    }
}
