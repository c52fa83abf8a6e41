//! Every frame's capture time and source name, end to end: a TUM-named folder's names and
//! times come back out of `run --headless`, the recording, `replay` and every export; two runs
//! of one input write identical trajectories; a version-1 session (written by the old writer's
//! path) still replays and exports, with the documented fallback.

use std::path::Path;
use std::process::Output;

mod common;

use common::{streamrecon, text};
use streamrecon::frame::TimeBase;
use streamrecon::record::sample::sample_result;
use streamrecon::record::{SessionReader, SessionWriter};

const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);

/// [`common::tiny_run`] that must succeed.
fn tiny_run(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let out = common::tiny_run(input, out, extra);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn tum_times(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect()
}

/// The first `n` courthouse frames under TUM-style names 1/30 s apart, as `(name, time)`;
/// one more file between the 3rd and 4th that does not decode.
fn tum_named_folder(dir: &Path, n: usize) -> Vec<(String, String)> {
    let mut sources: Vec<_> = std::fs::read_dir(COURTHOUSE)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    sources.sort();
    let mut named = Vec::new();
    for (k, src) in sources.iter().take(n).enumerate() {
        // 1305031102.175304 + k/30 s, to the microsecond as TUM names are.
        let micros = 1_305_031_102_175_304i64 + (k as i64 * 1_000_000 + 15) / 30;
        let time = format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
        let name = format!("{time}.png");
        std::fs::copy(src, dir.join(&name)).unwrap();
        named.push((name, time));
    }
    // Sorted between the 3rd and 4th frame; a PNG signature and then garbage.
    let mut broken = b"\x89PNG\r\n\x1a\n".to_vec();
    broken.extend(std::iter::repeat_n(0x5a, 200));
    std::fs::write(dir.join("1305031102.250000.png"), broken).unwrap();
    named
}

#[test]
fn tum_named_folders_round_trip_their_names_and_times() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("rgb");
    std::fs::create_dir(&input).unwrap();
    let named = tum_named_folder(&input, 8);
    let session = dir.path().join("session");
    let out = tiny_run(&input, &session, &[]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("8 processed of 9 captured"), "{stdout}");
    assert!(
        stdout.contains("1305031102.250000.png"),
        "the skip is named: {stdout}"
    );

    // The run's own trajectory, and an export of its recording, carry the names' times.
    let want: Vec<String> = named.iter().map(|(_, t)| t.clone()).collect();
    assert_eq!(tum_times(&session.join("trajectory.tum")), want);
    let exported = dir.path().join("again.tum");
    let colmap = dir.path().join("colmap");
    let out = streamrecon(&[
        "export",
        session.to_str().unwrap(),
        "--tum",
        exported.to_str().unwrap(),
        "--colmap",
        colmap.to_str().unwrap(),
        "--colmap-images",
        "model",
        "--colmap-text",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(tum_times(&exported), want);

    // Per-frame JSON and COLMAP name the files; after the skipped file, frame N is still
    // the file it was (not the N-th decoded one).
    for (k, (name, time)) in named.iter().enumerate() {
        let meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(session.join(format!("frames/{k:06}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(meta["source"], name.as_str());
        assert_eq!(meta["capture_time"], time.as_str());
        assert_eq!(meta["time_base"], "file_name");
        assert_eq!(meta["original_size"], serde_json::json!([518, 294]));
        let jpg = format!("{time}.jpg");
        assert!(colmap.join("images").join(&jpg).is_file(), "{jpg}");
    }
    let images = std::fs::read_to_string(colmap.join("sparse/0/images.txt")).unwrap();
    // Two lines per image: the pose line (its name last), then its 2D points.
    let listed: Vec<&str> = images
        .lines()
        .filter(|l| !l.starts_with('#'))
        .step_by(2)
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    let want_names: Vec<String> = named.iter().map(|(_, t)| format!("{t}.jpg")).collect();
    assert_eq!(listed, want_names);

    // Replay gives every frame back with its name and time.
    let out = streamrecon(&["replay", session.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let replayed = text(&out.stdout);
    for (name, time) in &named {
        assert!(
            replayed.contains(&format!("{name} at {time}")),
            "{name}: {replayed}"
        );
    }
}

#[test]
fn two_runs_of_the_same_input_write_identical_trajectories() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    tiny_run(Path::new(COURTHOUSE), &a, &["--fps", "30"]);
    tiny_run(Path::new(COURTHOUSE), &b, &["--fps", "30"]);
    let ta = std::fs::read(a.join("trajectory.tum")).unwrap();
    let tb = std::fs::read(b.join("trajectory.tum")).unwrap();
    assert_eq!(ta, tb, "the same input gives the same file, times included");
    // Without names carrying times, --fps spaces them: frame k at k/30 s, whatever the clock.
    let times = tum_times(&a.join("trajectory.tum"));
    assert_eq!(times.len(), 48);
    for (k, t) in times.iter().enumerate() {
        let secs: f64 = t.parse().unwrap();
        assert!((secs - k as f64 / 30.0).abs() < 1e-9, "frame {k}: {t}");
    }
    assert!(
        std::fs::read_to_string(a.join("trajectory.tum"))
            .unwrap()
            .contains("nominal time")
    );
}

#[test]
fn a_version_1_session_still_replays_and_exports() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.srec");
    // The writer's version-1 path: the header says 1 and no origin records are written.
    let file = std::fs::File::create(&path).unwrap();
    let mut writer =
        SessionWriter::with_version(file, &path, &serde_json::json!({"command": "old"}), 1)
            .unwrap();
    for i in 0..4u64 {
        writer
            .write_frame(&sample_result(i, 16, 12, 6), 0.5 * i as f64 + 0.125)
            .unwrap();
    }
    writer.finish().unwrap();

    let reader = SessionReader::open(&path).unwrap();
    assert_eq!(reader.version(), 1);
    assert!(reader.issues().is_empty(), "{:?}", reader.issues());
    for (i, info) in reader.frames().iter().enumerate() {
        assert!(!info.origin_recorded);
        assert_eq!(info.origin.name, format!("frame_{i:06}"));
        assert_eq!(info.origin.time.base, TimeBase::Recording);
        assert_eq!(info.origin.original_size, None);
    }

    let out = streamrecon(&["replay", path.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let replayed = text(&out.stdout);
    assert_eq!(replayed.matches("frame_0000").count(), 4, "{replayed}");
    assert!(replayed.contains("frame_000002 at 1.125000"), "{replayed}");

    let tum = dir.path().join("old.tum");
    let colmap = dir.path().join("colmap");
    let out = streamrecon(&[
        "export",
        path.to_str().unwrap(),
        "--tum",
        tum.to_str().unwrap(),
        "--colmap",
        colmap.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("version-1 session records no capture times"),
        "{}",
        text(&out.stdout)
    );
    // As version-1 exports wrote them: seconds since the recording started, six decimals.
    assert_eq!(
        tum_times(&tum),
        ["0.125000", "0.625000", "1.125000", "1.625000"]
    );
    assert!(
        std::fs::read_to_string(&tum)
            .unwrap()
            .contains("version-1 session")
    );
    assert!(colmap.join("images/frame_000003.jpg").is_file());
}

#[test]
fn version_2_sessions_keep_every_origin_field() {
    let mut writer = SessionWriter::new(Vec::new(), "mem.srec", &serde_json::json!({})).unwrap();
    let results: Vec<_> = (0..3).map(|i| sample_result(i, 16, 12, 4)).collect();
    for r in &results {
        writer.write_frame(r, 0.0).unwrap();
    }
    let (bytes, _) = writer.close().unwrap();
    let reader = SessionReader::from_bytes("mem.srec", bytes).unwrap();
    assert_eq!(reader.version(), 2);
    for (i, r) in results.iter().enumerate() {
        let info = &reader.frames()[i];
        assert!(info.origin_recorded);
        assert_eq!(info.origin, r.origin);
        let back = reader
            .read_frame(i, streamrecon::record::Parts::GEOMETRY)
            .unwrap();
        assert_eq!(back.origin, r.origin);
    }
}

#[test]
fn a_damaged_origin_record_costs_the_frame_its_origin_only() {
    use streamrecon::record::format::{self, RecordKind};
    let mut writer = SessionWriter::new(Vec::new(), "mem.srec", &serde_json::json!({})).unwrap();
    for i in 0..3 {
        writer
            .write_frame(&sample_result(i, 16, 12, 4), 0.25 * i as f64)
            .unwrap();
    }
    let (mut bytes, _) = writer.close().unwrap();
    // Frame 1's origin gets a time base no build knows, with a checksum that matches it.
    let (_, _, mut pos) = format::decode_header(&bytes).unwrap();
    loop {
        let rec = format::record_at(&bytes, pos).unwrap();
        let payload = bytes[rec.payload_start..rec.payload_end].to_vec();
        if rec.kind == RecordKind::Origin as u16
            && streamrecon::record::codec::frame_of(&payload) == Some(1)
        {
            let mut edited = payload;
            edited[16] = 99;
            let encoded = format::encode_record(RecordKind::Origin, &edited);
            bytes[rec.offset..rec.payload_end].copy_from_slice(&encoded);
            break;
        }
        pos = rec.payload_end;
    }
    let reader = SessionReader::from_bytes("mem.srec", bytes).unwrap();
    assert_eq!(reader.frames().len(), 3, "every frame is kept");
    let issues = reader.issues();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert!(
        issues[0].what.contains("frame 1's origin record") && issues[0].what.contains("99"),
        "{issues:?}"
    );
    let frames = reader.frames();
    assert!(frames[0].origin_recorded && frames[2].origin_recorded);
    assert!(!frames[1].origin_recorded);
    assert_eq!(frames[1].origin.name, "frame_000001");
    assert_eq!(frames[1].origin.time.base, TimeBase::Recording);
    assert_eq!(frames[1].origin.time.seconds_text(), "0.250000");
}
