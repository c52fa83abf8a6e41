//! The session format: round trip, every truncation point, damaged records, the index.

use std::sync::Arc;

use streamrecon::frame::FrameResult;
use streamrecon::record::sample::sample_result;
use streamrecon::record::{
    IssueKind, Notice, Parts, RecordError, RecordKind, SessionReader, SessionWriter,
};

fn config() -> serde_json::Value {
    serde_json::json!({ "input": "synthetic", "window": 3 })
}

/// A session in memory and the byte offset where each frame ends (and where the header does).
struct Built {
    bytes: Vec<u8>,
    header_end: u64,
    frame_ends: Vec<u64>,
    data_end: u64,
    results: Vec<FrameResult>,
}

fn build(frames: u64, w: u32, h: u32, points: usize, close: bool) -> Built {
    let mut writer = SessionWriter::new(Vec::new(), "mem.srec", &config()).unwrap();
    let header_end = writer.offset();
    let mut frame_ends = Vec::new();
    let mut results = Vec::new();
    for i in 0..frames {
        let r = sample_result(i, w, h, points);
        writer.write_frame(&r, i as f64 * 0.1).unwrap();
        frame_ends.push(writer.offset());
        results.push(r);
    }
    let data_end = writer.offset();
    let bytes = if close {
        writer.finish().unwrap()
    } else {
        std::mem::take(writer.get_mut())
    };
    Built {
        bytes,
        header_end,
        frame_ends,
        data_end,
        results,
    }
}

fn assert_same_frame(got: &FrameResult, want: &FrameResult) {
    assert_eq!(got.frame, want.frame);
    assert_eq!(got.frame_type, want.frame_type);
    assert_eq!(
        got.origin, want.origin,
        "capture time, source name, size as captured"
    );
    assert_eq!(got.world_from_camera, want.world_from_camera);
    assert_eq!(got.camera_from_world, want.camera_from_world);
    assert_eq!(got.intrinsics, want.intrinsics);
    assert_eq!(got.points, want.points);
    assert_eq!(got.cache, want.cache);
    assert_eq!(got.timings, want.timings);
    assert_eq!(got.dropped_before, want.dropped_before);
    // f16 keeps 11 bits of mantissa.
    assert_eq!(got.depth.len(), want.depth.len());
    for (a, b) in got.depth.iter().zip(&want.depth) {
        assert!((a - b).abs() <= b.abs() * 1e-3, "depth {a} vs {b}");
    }
    assert_eq!(got.confidence.len(), want.confidence.len());
    for (a, b) in got.confidence.iter().zip(&want.confidence) {
        assert!((a - b).abs() <= b.abs() * 1e-3, "confidence {a} vs {b}");
    }
    // JPEG is lossy: same size, close pixels.
    assert_eq!(
        (got.image.width, got.image.height),
        (want.image.width, want.image.height)
    );
    let diff: u64 = got
        .image
        .data
        .iter()
        .zip(&want.image.data)
        .map(|(a, b)| u64::from(a.abs_diff(*b)))
        .sum();
    let mean = diff as f64 / want.image.data.len() as f64;
    // Tiny test images have sharp steps; real frames do far better.
    assert!(mean < 10.0, "mean JPEG error {mean}");
}

#[test]
fn round_trip_through_the_index() {
    let b = build(5, 32, 24, 40, true);
    let reader = SessionReader::from_bytes("mem.srec", b.bytes).unwrap();
    assert!(reader.indexed());
    assert!(reader.issues().is_empty(), "{:?}", reader.issues());
    assert_eq!(reader.config(), &config());
    assert_eq!(reader.frames().len(), 5);
    for (i, want) in b.results.iter().enumerate() {
        let info = &reader.frames()[i];
        assert!(info.complete);
        assert_eq!(info.t_s, i as f64 * 0.1);
        assert_same_frame(&reader.read_frame(i, Parts::ALL).unwrap(), want);
    }
    // Geometry only: no JPEG decode, no maps.
    let light = reader.read_frame(2, Parts::GEOMETRY).unwrap();
    assert!(light.image.data.is_empty() && light.depth.is_empty());
    assert_eq!(light.points, b.results[2].points);
}

#[test]
fn round_trip_by_scanning_when_not_closed() {
    let b = build(4, 16, 12, 10, false);
    let reader = SessionReader::from_bytes("mem.srec", b.bytes).unwrap();
    assert!(!reader.indexed());
    assert!(reader.issues().is_empty(), "{:?}", reader.issues());
    assert_eq!(reader.frames().len(), 4);
    for (i, want) in b.results.iter().enumerate() {
        assert_same_frame(&reader.read_frame(i, Parts::ALL).unwrap(), want);
    }
}

#[test]
fn notices_and_empty_parts_round_trip() {
    let mut writer = SessionWriter::new(Vec::new(), "mem.srec", &config()).unwrap();
    let notice = Notice {
        message: "recorder fell behind: 3 results not recorded".into(),
        results_not_recorded: 3,
        first_frame: Some(4),
        last_frame: Some(6),
        t_s: 1.5,
    };
    writer.write_notice(&notice).unwrap();
    // No image, no maps, no points: still a frame.
    let mut r = sample_result(7, 8, 6, 0);
    r.image = Default::default();
    r.depth.clear();
    r.confidence.clear();
    writer.write_frame(&r, 2.0).unwrap();
    let reader = SessionReader::from_bytes("mem.srec", writer.finish().unwrap()).unwrap();
    assert_eq!(reader.notices(), &[notice]);
    let info = &reader.frames()[0];
    assert!(!info.has(RecordKind::Image) && !info.has(RecordKind::Depth));
    let got = reader.read_frame(0, Parts::ALL).unwrap();
    assert_eq!(got.points.len(), 0);
    assert_eq!(got.cache, r.cache);
}

#[test]
fn every_truncation_point_reads_its_complete_prefix() {
    let b = build(3, 8, 6, 5, true);
    let full = SessionReader::from_bytes("full", b.bytes.clone()).unwrap();
    let want: Vec<FrameResult> = (0..3)
        .map(|i| full.read_frame(i, Parts::ALL).unwrap())
        .collect();
    // Cutting between two records leaves nothing half-written: no issue is reported there.
    let boundaries: Vec<u64> = record_offsets(&b.bytes, b.header_end)
        .iter()
        .map(|(o, _)| *o)
        .chain([b.header_end, b.data_end, b.bytes.len() as u64 - 16])
        .collect();
    for cut in 0..=b.bytes.len() {
        let prefix = b.bytes[..cut].to_vec();
        let reader = match SessionReader::from_bytes("cut.srec", prefix) {
            Ok(r) => r,
            Err(RecordError::NotASession { .. }) if cut < 8 => continue,
            Err(RecordError::Corrupt { offset: 0, .. }) if (cut as u64) < b.header_end => continue,
            Err(e) => panic!("cut at {cut}: {e}"),
        };
        let complete_expected = b.frame_ends.iter().filter(|&&e| e <= cut as u64).count();
        let complete: Vec<_> = reader.frames().iter().filter(|f| f.complete).collect();
        assert_eq!(complete.len(), complete_expected, "cut at {cut}");
        // A frame cut inside may appear (its pose was complete) but marked incomplete.
        assert!(
            reader.frames().len() <= complete_expected + 1,
            "cut at {cut}"
        );
        for (i, w) in want.iter().enumerate().take(complete_expected) {
            assert_same_frame(&reader.read_frame(i, Parts::ALL).unwrap(), w);
        }
        let at_boundary = boundaries.contains(&(cut as u64)) || cut == b.bytes.len();
        if at_boundary {
            assert!(
                reader.issues().is_empty(),
                "cut at {cut}: {:?}",
                reader.issues()
            );
        } else {
            assert_eq!(
                reader.issues().len(),
                1,
                "cut at {cut}: {:?}",
                reader.issues()
            );
        }
        if (cut as u64) < b.data_end && !at_boundary {
            assert_eq!(reader.issues()[0].kind, IssueKind::CutShort, "cut at {cut}");
        }
        assert_eq!(reader.indexed(), cut == b.bytes.len(), "cut at {cut}");
    }
}

/// Offset of the `n`-th record of `kind` in a closed session (found through the reader's
/// view of the file: the records are laid out in the order the writer documents).
fn record_offsets(bytes: &[u8], header_end: u64) -> Vec<(u64, u16)> {
    let mut out = Vec::new();
    let mut pos = header_end as usize;
    while pos + 16 <= bytes.len() && &bytes[pos..pos + 4] == b"SRrc" {
        let kind = u16::from_le_bytes([bytes[pos + 4], bytes[pos + 5]]);
        let len = u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
        out.push((pos as u64, kind));
        pos += 16 + len;
    }
    out
}

#[test]
fn a_damaged_record_is_reported_and_skipped_with_and_without_the_index() {
    let b = build(5, 16, 12, 20, true);
    let records = record_offsets(&b.bytes, b.header_end);
    // Frame 1's image (JPEG bytes) and frame 3's pose.
    let image_1 = records
        .iter()
        .filter(|(_, k)| *k == RecordKind::Image as u16)
        .nth(1)
        .unwrap()
        .0;
    let pose_3 = records
        .iter()
        .filter(|(_, k)| *k == RecordKind::Pose as u16)
        .nth(3)
        .unwrap()
        .0;
    let mut damaged = b.bytes.clone();
    damaged[image_1 as usize + 40] ^= 0xff;
    damaged[pose_3 as usize + 20] ^= 0x5a;
    let closed_len = damaged.len();
    for (label, bytes) in [
        ("indexed", damaged.clone()),
        // The footer gone: the reader scans and resyncs.
        ("scanned", damaged[..closed_len - 16].to_vec()),
    ] {
        let reader = SessionReader::from_bytes("damaged.srec", bytes).unwrap();
        let damaged_at: Vec<u64> = reader
            .issues()
            .iter()
            .filter(|i| i.kind == IssueKind::Damaged)
            .map(|i| i.offset)
            .collect();
        assert_eq!(
            damaged_at,
            vec![image_1, pose_3],
            "{label}: {:?}",
            reader.issues()
        );
        let text = reader.issues()[0].to_string();
        assert!(
            text.contains("damaged.srec") && text.contains(&image_1.to_string()),
            "{text}"
        );
        // Frame 3 lost its pose: its other parts are reported as skipped, the rest loads.
        let frames: Vec<u64> = reader.frames().iter().map(|f| f.frame).collect();
        assert_eq!(frames, vec![0, 1, 2, 4], "{label}");
        assert!(reader.issues().iter().any(|i| i.kind == IssueKind::Skipped));
        let f1 = reader.read_frame(1, Parts::ALL).unwrap();
        assert!(
            f1.image.data.is_empty(),
            "{label}: the damaged image is skipped"
        );
        assert_eq!(f1.points, b.results[1].points);
        assert_same_frame(&reader.read_frame(3, Parts::ALL).unwrap(), &b.results[4]);
    }
}

#[test]
fn a_damaged_length_field_resyncs_at_the_next_record() {
    let b = build(3, 8, 6, 4, false);
    let records = record_offsets(&b.bytes, b.header_end);
    let points_0 = records
        .iter()
        .find(|(_, k)| *k == RecordKind::Points as u16)
        .unwrap()
        .0 as usize;
    let mut bytes = b.bytes.clone();
    bytes[points_0 + 8..points_0 + 12].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let reader = SessionReader::from_bytes("len.srec", bytes).unwrap();
    assert_eq!(reader.issues()[0].offset, points_0 as u64);
    assert_eq!(reader.frames().len(), 3);
    assert!(reader.frames().iter().all(|f| f.complete));
    assert_same_frame(&reader.read_frame(2, Parts::ALL).unwrap(), &b.results[2]);
    assert!(reader.read_frame(0, Parts::ALL).unwrap().points.is_empty());
}

#[test]
fn not_a_session_and_a_newer_version_are_clear_errors() {
    let err =
        SessionReader::from_bytes("x.txt", b"hello world, not a session".to_vec()).unwrap_err();
    assert!(matches!(err, RecordError::NotASession { .. }), "{err}");
    let mut b = build(1, 4, 4, 1, true).bytes;
    b[8] = 99;
    let err = SessionReader::from_bytes("new.srec", b).unwrap_err();
    assert!(
        matches!(err, RecordError::Version { found: 99, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("new.srec"));
}

#[test]
fn a_file_on_disk_opens_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.srec");
    std::fs::write(&path, build(2, 8, 6, 3, true).bytes).unwrap();
    let reader = Arc::new(SessionReader::open(&path).unwrap());
    assert_eq!(reader.frames().len(), 2);
    assert_eq!(reader.path(), path);
    let missing = SessionReader::open(dir.path().join("missing.srec")).unwrap_err();
    assert!(missing.to_string().contains("missing.srec"), "{missing}");
}

#[test]
fn every_single_byte_flip_is_reported_and_costs_at_most_one_frame() {
    let b = build(3, 8, 6, 4, true);
    for pos in b.header_end as usize..b.bytes.len() {
        let mut bytes = b.bytes.clone();
        bytes[pos] ^= 0x41;
        let reader = SessionReader::from_bytes("flip.srec", bytes)
            .unwrap_or_else(|e| panic!("flip at {pos}: {e}"));
        assert!(!reader.issues().is_empty(), "flip at {pos} went unnoticed");
        assert!(
            reader.frames().len() >= 2,
            "flip at {pos} lost more than a frame"
        );
        for i in 0..reader.frames().len() {
            // Damage is caught by the checksums: whatever was kept decodes.
            reader
                .read_frame(i, Parts::ALL)
                .unwrap_or_else(|e| panic!("flip at {pos}, frame {i}: {e}"));
        }
    }
}
