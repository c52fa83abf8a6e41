//! The bad-input battery (issue 20): what a careless or unlucky user hands streamrecon, and what
//! must hold for each: nothing recorded is lost, nothing is overwritten unasked, no panic reaches
//! the user, and every error names the file or the flag and what was expected.
//!
//! Every crafted file is made here, small. Sessions come from the library's writer (no model);
//! runs use the gct-tiny fixture or random tiny weights with a few frames, so the whole battery
//! stays well under a minute in a debug build.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use streamrecon::capture::{DecodeLimits, decode_bytes_limited};
use streamrecon::record::format::{self, RecordKind};
use streamrecon::record::sample::sample_result;
use streamrecon::record::{SessionReader, SessionWriter};

/// The binary under test; `HOSTILE_BIN` points the battery at another build (an older
/// release, to count what it gets wrong).
fn bin() -> PathBuf {
    std::env::var_os("HOSTILE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_streamrecon")))
}
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TINY_WEIGHTS: &str = "../shared/fixtures/gct-tiny/weights.safetensors";
const TINY_CONFIG: &str = "../shared/fixtures/gct-tiny/kf1/config.json";
const COURTHOUSE: &str = "../shared/sequences/courthouse";

// ---------------------------------------------------------------------------------------------
// helpers

/// Runs the binary with a deadline: a hang is a failure, not a stuck CI job.
fn run(args: &[&str]) -> Output {
    let child = spawn(args, &[]);
    finish(child, Duration::from_secs(120), &format!("{args:?}"))
}

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .current_dir(ROOT)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    common::wait_or_kill(&mut child, limit, &format!("streamrecon {what}"));
    child.wait_with_output().expect("output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn both(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// The command failed the way a person's mistake should: exit 2, a message holding every one
/// of `wanted`, and no panic.
fn refused(out: &Output, wanted: &[&str]) -> String {
    let all = both(out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(!all.contains("panicked"), "{all}");
    for w in wanted {
        assert!(all.contains(w), "expected `{w}` in:\n{all}");
    }
    all
}

fn no_panic(out: &Output) {
    let all = both(out);
    assert!(!all.contains("panicked"), "{all}");
    assert!(out.status.code().is_some(), "killed by a signal: {all}");
}

fn fixtures_present() -> bool {
    let ok = Path::new(ROOT).join(TINY_WEIGHTS).exists();
    if !ok {
        eprintln!("skipping: the gct-tiny fixture is not in ../shared");
    }
    ok
}

fn tiny_run(out: &Path, input: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--headless",
        "--input",
        input,
        "--out",
        out.to_str().expect("utf-8 path"),
        "--weights",
        TINY_WEIGHTS,
        "--model-config",
        TINY_CONFIG,
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// A closed session of `n` frames (16×12 images, 20 points each) made by the library's writer;
/// `t_s(i)` stamps frame i.
fn write_session(path: &Path, n: u64, t_s: impl Fn(u64) -> f64) {
    let file = std::fs::File::create(path).expect("create");
    let mut w =
        SessionWriter::new(file, path, &serde_json::json!({ "test": true })).expect("writer");
    for i in 0..n {
        w.write_frame(&sample_result(i, 16, 12, 20), t_s(i))
            .expect("frame");
    }
    w.close().expect("close");
}

fn session_in(dir: &Path, n: u64) -> PathBuf {
    let path = dir.join("session.srec");
    write_session(&path, n, |i| i as f64 * 0.1);
    path
}

/// Rewrites the first record of `kind` for `frame` with `payload` (same length, so the index
/// stays true) and a correct checksum: damage the checksum cannot see.
fn replace_payload(path: &Path, kind: RecordKind, frame: u64, edit: impl Fn(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).expect("read");
    let (_, _, mut pos) = format::decode_header(&bytes).expect("header");
    loop {
        let rec = format::record_at(&bytes, pos).expect("an intact record");
        let payload = &bytes[rec.payload_start..rec.payload_end];
        let of_frame = payload
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        if rec.kind == kind as u16 && of_frame == Some(frame) {
            let mut new = payload.to_vec();
            edit(&mut new);
            assert_eq!(
                new.len(),
                payload.len(),
                "same length keeps the index valid"
            );
            let encoded = format::encode_record(kind, &new);
            bytes[rec.offset..rec.payload_end].copy_from_slice(&encoded);
            std::fs::write(path, bytes).expect("write");
            return;
        }
        pos = rec.payload_end;
    }
}

/// Flips one payload byte of the first `kind` record of `frame`: the checksum catches it.
fn flip_payload_byte(path: &Path, kind: RecordKind, frame: u64) {
    let mut bytes = std::fs::read(path).expect("read");
    let (_, _, mut pos) = format::decode_header(&bytes).expect("header");
    loop {
        let rec = format::record_at(&bytes, pos).expect("an intact record");
        let of_frame = bytes
            .get(rec.payload_start..rec.payload_start + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        if rec.kind == kind as u16 && of_frame == Some(frame) {
            bytes[rec.payload_end - 1] ^= 0x5A;
            std::fs::write(path, bytes).expect("write");
            return;
        }
        pos = rec.payload_end;
    }
}

/// A PNG of `width`×`height` as its header declares, with one tiny IDAT: a few hundred bytes
/// that ask for gigabytes.
fn png_declaring(width: u32, height: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let mut crc = crc32fast::Hasher::new();
        crc.update(kind);
        crc.update(data);
        out.extend_from_slice(&crc.finalize().to_be_bytes());
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(&mut out, b"IHDR", &ihdr);
    // zlib of a few zero bytes: the decoder gets going, then wants the rest.
    chunk(
        &mut out,
        b"IDAT",
        &[0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01],
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

fn jpeg(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x + y) * 3) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Jpeg)
        .expect("encode");
    out.into_inner()
}

/// A real JPEG whose frame header (SOF0) is patched to declare `width`×`height`.
fn jpeg_declaring(width: u16, height: u16) -> Vec<u8> {
    let mut bytes = jpeg(16, 16);
    let sof = bytes
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .expect("baseline JPEG");
    bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
    bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
    bytes
}

/// A folder of the first `n` courthouse frames plus `extra` files, for runs with bad images.
fn folder_with(dir: &Path, n: usize, extra: &[(&str, &[u8])]) -> PathBuf {
    let folder = dir.join("images");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let mut frames: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join(COURTHOUSE))
        .expect("courthouse")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    frames.sort();
    for (k, src) in frames.iter().take(n).enumerate() {
        std::fs::copy(src, folder.join(format!("{k:03}.png"))).expect("copy");
    }
    for (name, bytes) in extra {
        std::fs::write(folder.join(name), bytes).expect("write");
    }
    folder
}

// ---------------------------------------------------------------------------------------------
// 1. export never writes onto its input, nor over a file unasked

#[test]
fn export_onto_its_own_session_is_refused_and_the_session_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = session_in(dir.path(), 3);
    let before = std::fs::read(&session).expect("read");
    let s = session.to_str().unwrap();
    let tum = dir.path().join("t.txt");
    // Alone, and with another output in the same call (was SIGBUS: truncated while mapped).
    for extra in [vec![], vec!["--tum", tum.to_str().unwrap()]] {
        for force in [false, true] {
            let mut args = vec!["export", s, "--ply", s];
            args.extend(extra.iter().copied());
            if force {
                args.push("--force");
            }
            let out = run(&args);
            refused(&out, &["--ply", "never writes onto its input"]);
        }
    }
    // Through the session's folder, a symlink and a hard link.
    let link = dir.path().join("link.glb");
    std::os::unix::fs::symlink(&session, &link).expect("symlink");
    let hard = dir.path().join("hard.ply");
    std::fs::hard_link(&session, &hard).expect("hard link");
    for (flag, path) in [("--glb", &link), ("--ply", &hard)] {
        let out = run(&[
            "export",
            dir.path().to_str().unwrap(),
            flag,
            path.to_str().unwrap(),
            "--force",
        ]);
        refused(&out, &[flag, "input"]);
    }
    let out = run(&[
        "export",
        s,
        "--colmap",
        dir.path().to_str().unwrap(),
        "--force",
    ]);
    refused(&out, &["--colmap", "holds the session"]);
    assert_eq!(
        std::fs::read(&session).expect("read"),
        before,
        "the session is intact"
    );
    assert!(!tum.exists(), "a refused export writes nothing at all");
}

#[test]
fn existing_outputs_need_force_and_are_replaced_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = session_in(dir.path(), 3);
    let s = session.to_str().unwrap();
    let ply = dir.path().join("cloud.ply");
    std::fs::write(&ply, b"precious").expect("write");
    let out = run(&["export", s, "--ply", ply.to_str().unwrap()]);
    refused(&out, &["--ply", "exists", "--force"]);
    assert_eq!(std::fs::read(&ply).expect("read"), b"precious");
    // Two outputs on one path are refused before either is written.
    let out = run(&["export", s, "--ply", "x.ply", "--glb", "x.ply"]);
    refused(&out, &["--glb", "overlaps --ply"]);
    let out = run(&["export", s, "--ply", ply.to_str().unwrap(), "--force"]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(std::fs::read(&ply).expect("read").starts_with(b"ply\n"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn every_output_gets_its_missing_folders_and_colmap_leaves_no_stale_image() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = session_in(dir.path(), 3);
    let s = session.to_str().unwrap();
    let p = |rel: &str| dir.path().join(rel).to_str().unwrap().to_owned();
    let (ply, tum, glb, colmap) = (
        p("a/b/c.ply"),
        p("d/e/t.txt"),
        p("f/g/s.glb"),
        p("h/i/model"),
    );
    let out = run(&[
        "export", s, "--ply", &ply, "--tum", &tum, "--glb", &glb, "--colmap", &colmap,
    ]);
    assert!(out.status.success(), "{}", both(&out));
    for f in [&ply, &tum, &glb, &colmap] {
        assert!(Path::new(f).exists(), "{f} written");
    }
    // An image of an older, longer export.
    let stale = Path::new(&colmap).join("images/frame_000099.jpg");
    std::fs::write(&stale, b"old").expect("write");
    let out = run(&["export", s, "--colmap", &colmap]);
    refused(&out, &["--colmap", "--force"]);
    let out = run(&["export", s, "--colmap", &colmap, "--force"]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(
        !stale.exists(),
        "the stale image of the older model is gone"
    );
    let images = std::fs::read_dir(Path::new(&colmap).join("images"))
        .expect("images")
        .count();
    assert_eq!(images, 3);
    // A folder that is not a COLMAP model is never swapped away, even with --force.
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).expect("mkdir");
    std::fs::write(mine.join("thesis.tex"), b"keep").expect("write");
    let out = run(&["export", s, "--colmap", mine.to_str().unwrap(), "--force"]);
    refused(&out, &["thesis.tex", "not a COLMAP model"]);
    assert_eq!(
        std::fs::read(mine.join("thesis.tex")).expect("read"),
        b"keep"
    );
}

// ---------------------------------------------------------------------------------------------
// 2 and 7. images: a size limit from the header, and --strict refusing partial decodes

#[test]
fn an_image_declaring_a_huge_size_is_refused_before_decoding() {
    let limits = DecodeLimits::default();
    for (name, bytes) in [
        ("huge.png", png_declaring(200_000, 200_000)),
        ("huge.jpg", jpeg_declaring(65_500, 65_500)),
    ] {
        let path = Path::new("folder").join(name);
        let err = decode_bytes_limited(&path, bytes, &limits).expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains(name), "names the file: {msg}");
        assert!(msg.contains("megapixels"), "says why: {msg}");
    }
    // The limit is configurable, and a normal image passes.
    let small = DecodeLimits {
        max_pixels: 100,
        ..DecodeLimits::default()
    };
    assert!(decode_bytes_limited(Path::new("a.jpg"), jpeg(16, 16), &small).is_err());
    assert!(decode_bytes_limited(Path::new("a.jpg"), jpeg(16, 16), &limits).is_ok());
}

#[test]
fn a_huge_png_in_a_folder_is_skipped_and_the_run_finishes_with_its_summary() {
    if !fixtures_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = folder_with(
        dir.path(),
        3,
        &[("001b.png", &png_declaring(200_000, 200_000))],
    );
    let out_dir = dir.path().join("s");
    let out = tiny_run(&out_dir, folder.to_str().unwrap(), &[]);
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("001b.png") && all.contains("megapixels"),
        "{all}"
    );
    assert!(out_dir.join("summary.json").exists(), "{all}");
    // With a lower limit every courthouse frame is refused too, by name.
    let out_dir = dir.path().join("s2");
    let out = tiny_run(
        &out_dir,
        folder.to_str().unwrap(),
        &["--strict", "--max-image-megapixels", "0.01"],
    );
    refused(&out, &["000.png", "megapixels"]);
    let out = tiny_run(
        &dir.path().join("s3"),
        folder.to_str().unwrap(),
        &["--max-image-megapixels", "nan"],
    );
    refused(&out, &["--max-image-megapixels"]);
}

#[test]
fn strict_refuses_a_jpeg_cut_in_its_middle() {
    let whole = jpeg(64, 48);
    let cut = whole[..whole.len() * 3 / 5].to_vec();
    let strict = DecodeLimits {
        reject_partial: true,
        ..DecodeLimits::default()
    };
    let err = decode_bytes_limited(Path::new("cut.jpg"), cut.clone(), &strict)
        .expect_err("a partial image is refused with --strict");
    assert!(err.to_string().contains("cut.jpg"), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
    decode_bytes_limited(Path::new("whole.jpg"), whole, &strict).expect("a whole JPEG decodes");
    if !fixtures_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = folder_with(dir.path(), 2, &[("001b.jpg", &cut)]);
    let out = tiny_run(
        &dir.path().join("s"),
        folder.to_str().unwrap(),
        &["--strict"],
    );
    refused(&out, &["001b.jpg", "truncated"]);
}

// ---------------------------------------------------------------------------------------------
// 3. SIGTERM and SIGHUP finish a run (and the viewer) like Ctrl-C

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

fn run_until_frames_then(signal_name: &str, shown: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = dir.path().join("s");
    let child = spawn(
        &[
            "run",
            "--headless",
            "--input",
            "synthetic",
            "--synthetic-frames",
            "100000",
            "--random-weights",
            "tiny",
            "--out",
            session.to_str().unwrap(),
        ],
        &[],
    );
    let frames = || std::fs::read_dir(session.join("frames")).map_or(0, |d| d.count());
    let start = Instant::now();
    let mut child = child;
    while frames() < 3 {
        if start.elapsed() > Duration::from_secs(60) || child.try_wait().expect("wait").is_some() {
            child.kill().ok();
            panic!("the run never got going: {:?}", child.wait_with_output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, signal_name);
    let out = finish(child, Duration::from_secs(60), "after the signal");
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains(&format!("interrupted ({shown})")), "{all}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session.join("summary.json")).expect("summary"))
            .expect("json");
    let processed = summary["frames_processed"].as_u64().expect("count");
    let recording = SessionReader::open(session.join("session.srec")).expect("recording");
    assert!(
        recording.indexed(),
        "closed with its index: {:?}",
        recording.issues()
    );
    assert_eq!(recording.frames().len() as u64, processed);
    assert!(session.join("points.ply").exists());
}

#[test]
fn sigterm_finishes_a_run_like_ctrl_c() {
    run_until_frames_then("TERM", "SIGTERM");
}

#[test]
fn sighup_finishes_a_run_like_ctrl_c() {
    run_until_frames_then("HUP", "SIGHUP");
}

/// The viewer on an X server of its own (Xvfb), recording; SIGTERM closes the window and the
/// recording gets its index. Skipped where there is no Xvfb.
#[test]
fn sigterm_closes_the_viewer_and_finishes_its_recording() {
    let Some(xvfb) = ["/usr/bin/Xvfb", "/usr/local/bin/Xvfb"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        eprintln!("skipping: no Xvfb on this machine to open the viewer on");
        return;
    };
    // Xvfb picks a free display itself and writes its number once it is ready.
    let mut server = Command::new(xvfb)
        .args([
            "-displayfd",
            "1",
            "-screen",
            "0",
            "1280x800x24",
            "-nolisten",
            "tcp",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("Xvfb starts");
    let mut number = String::new();
    let ready = server
        .stdout
        .take()
        .map(|out| BufReader::new(out).read_line(&mut number));
    if !matches!(ready, Some(Ok(n)) if n > 0) {
        server.kill().ok();
        server.wait().ok();
        eprintln!("skipping: Xvfb did not start");
        return;
    }
    let display = format!(":{}", number.trim());
    let dir = tempfile::tempdir().expect("tempdir");
    let recording = dir.path().join("r.srec");
    let mut child = spawn(
        &[
            "view",
            "--input",
            "synthetic",
            "--random-weights",
            "tiny",
            "--record",
            recording.to_str().unwrap(),
        ],
        &[("DISPLAY", display.as_str()), ("WAYLAND_DISPLAY", "")],
    );
    let start = Instant::now();
    let recorded = || std::fs::metadata(&recording).map_or(0, |m| m.len());
    let mut skipped = None;
    while recorded() < 20_000 {
        if let Some(status) = child.try_wait().expect("wait") {
            skipped = Some(format!("the viewer exited at once ({status})"));
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            skipped = Some("the viewer recorded nothing in 60 s".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(why) = skipped {
        child.kill().ok();
        let out = child.wait_with_output().expect("output");
        server.kill().ok();
        server.wait().ok();
        let all = both(&out);
        // No usable GPU adapter on this X server: say so and skip; anything else fails.
        assert!(
            all.contains("could not open the viewer window") || all.contains("adapter"),
            "{why}: {all}"
        );
        eprintln!(
            "skipping: {why}: {}",
            all.lines().last().unwrap_or_default()
        );
        return;
    }
    signal(&child, "TERM");
    let out = finish(child, Duration::from_secs(60), "view after SIGTERM");
    server.kill().ok();
    server.wait().ok();
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("SIGTERM"), "{all}");
    let reader = SessionReader::open(&recording).expect("recording");
    assert!(reader.indexed(), "{:?}\n{all}", reader.issues());
    assert!(!reader.frames().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 4. one bad record costs only itself, and is counted

#[test]
fn a_points_record_that_does_not_fit_its_payload_costs_only_its_points() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = session_in(dir.path(), 4);
    // The count says one point more than the payload holds; the checksum is right.
    replace_payload(&session, RecordKind::Points, 2, |p| {
        let n = u32::from_le_bytes(p[8..12].try_into().unwrap());
        p[8..12].copy_from_slice(&(n + 1).to_le_bytes());
    });
    let reader = SessionReader::open(&session).expect("opens");
    assert_eq!(reader.frames().len(), 4, "every frame is kept");
    assert_eq!(reader.issues().len(), 1, "{:?}", reader.issues());
    let issue = reader.issues()[0].to_string();
    assert!(
        issue.contains("frame 2") && issue.contains("points"),
        "{issue}"
    );
    let s = session.to_str().unwrap();
    let p = |rel: &str| dir.path().join(rel).to_str().unwrap().to_owned();
    let out = run(&[
        "export",
        s,
        "--ply",
        &p("c.ply"),
        "--colmap",
        &p("colmap"),
        "--glb",
        &p("s.glb"),
    ]);
    assert!(out.status.success(), "{}", both(&out));
    assert!(
        both(&out).contains("60 points"),
        "3 frames of 20 points: {}",
        both(&out)
    );
}

#[test]
fn a_bad_timings_or_cache_record_keeps_its_frame_and_is_counted() {
    for kind in [RecordKind::Timings, RecordKind::Cache] {
        let dir = tempfile::tempdir().expect("tempdir");
        let session = session_in(dir.path(), 4);
        replace_payload(&session, kind, 1, |p| {
            // Past the frame index: a stage-name length or a JSON brace goes wrong.
            for b in &mut p[8..14] {
                *b = 0xFF;
            }
        });
        let out = run(&["replay", session.to_str().unwrap(), "--headless"]);
        let all = both(&out);
        assert!(out.status.success(), "{kind:?}: {all}");
        assert!(all.contains("replayed 4 of 4 frames"), "{kind:?}: {all}");
        assert!(all.contains("1 read issues"), "{kind:?}: {all}");
        assert!(
            all.contains("frame 1"),
            "{kind:?}: the warning names the frame: {all}"
        );
    }
}

#[test]
fn a_checksum_mismatch_names_the_frame_and_the_record_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = session_in(dir.path(), 3);
    flip_payload_byte(&session, RecordKind::Depth, 1);
    let out = run(&[
        "export",
        session.to_str().unwrap(),
        "--tum",
        dir.path().join("t.txt").to_str().unwrap(),
    ]);
    let all = both(&out);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("checksum"), "{all}");
    assert!(all.contains("depth record of frame 1"), "{all}");
}

// ---------------------------------------------------------------------------------------------
// 5. no panic in replay from a value or a file

#[test]
fn replay_survives_extreme_speeds_and_timestamps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = dir.path().join("far.srec");
    // Frame 1 stamped far in the future (a damaged clock), frame 2 at infinity.
    write_session(&session, 3, |i| [0.0, 1e300, f64::INFINITY][i as usize]);
    let s = session.to_str().unwrap();
    let out = run(&["replay", s, "--headless", "--speed", "1"]);
    no_panic(&out);
    assert!(out.status.success(), "{}", both(&out));
    assert!(both(&out).contains("replayed 3 of 3"), "{}", both(&out));
    for speed in ["1e-310", "5e-324", "1e300", "-1", "nan", "inf"] {
        let out = run(&["replay", s, "--headless", "--speed", speed]);
        refused(&out, &["--speed"]);
    }
}

// ---------------------------------------------------------------------------------------------
// 6. a full disk is said as such, with the frames kept and the summary printed

/// A tmpfs of `size` mounted for the test; `None` (with the reason printed) when not root.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<Self> {
        let uid = Command::new("id").arg("-u").output().ok()?;
        if text(&uid.stdout).trim() != "0" {
            eprintln!("skipping: mounting a small tmpfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status();
        match mounted {
            Ok(s) if s.success() => Some(Self { dir }),
            other => {
                eprintln!("skipping: could not mount a tmpfs ({other:?})");
                None
            }
        }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        match Command::new("umount").arg(self.dir.path()).status() {
            Ok(s) if s.success() => {}
            other => eprintln!("could not unmount {}: {other:?}", self.dir.path().display()),
        }
    }
}

#[test]
fn a_full_disk_is_said_with_the_frames_kept_and_the_summary_printed() {
    if !fixtures_present() {
        return;
    }
    let Some(disk) = SmallDisk::mount("300k") else {
        return;
    };
    let session = disk.path().join("s");
    let out = tiny_run(&session, COURTHOUSE, &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("processed of"),
        "the run's summary: {stdout}"
    );
    assert!(
        stderr.contains("disk") && stderr.contains("full"),
        "{stderr}"
    );
    assert!(stderr.contains("keeps the"), "says what was kept: {stderr}");
    let reader = SessionReader::open(session.join("session.srec")).expect("readable");
    assert!(!reader.frames().is_empty(), "frames kept");
    let kept = format!("keeps the {} frames", reader.frames().len());
    assert!(stderr.contains(&kept), "`{kept}` in {stderr}");
    // No file was left half-written.
    if let Ok(bytes) = std::fs::read(session.join("summary.json")) {
        serde_json::from_slice::<serde_json::Value>(&bytes).expect("whole summary or none");
    }
}

// ---------------------------------------------------------------------------------------------
// 8. flags and configs: the flag named, the value checked

#[test]
fn bad_flags_name_the_flag_and_what_was_expected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let o = out("o");
    let weights = ["--weights", TINY_WEIGHTS, "--model-config", TINY_CONFIG];
    let run_with = |extra: &[&str]| {
        let mut args = vec!["run", "--headless", "--input", COURTHOUSE, "--out", &o];
        args.extend_from_slice(&weights);
        args.extend_from_slice(extra);
        run(&args)
    };
    let all = refused(
        &run(&["run", "--headless", "--input", "demo", "--out", &o]),
        &["view --input demo"],
    );
    assert!(!all.contains("synthetic, demo)"), "{all}");
    refused(
        &run_with(&["--keyframe-interval", "0"]),
        &["--keyframe-interval"],
    );
    refused(&run_with(&["--fps", "-5"]), &["--fps", "-5"]);
    refused(&run_with(&["--fps", "0"]), &["--fps"]);
    refused(
        &run_with(&["--resolution", "abcxdef"]),
        &["--resolution", "abcxdef"],
    );
    for bad in ["nan", "inf", "-inf"] {
        refused(
            &run_with(&["--conf-threshold", bad]),
            &["--conf-threshold", "finite"],
        );
    }
    refused(&run_with(&["--point-stride", "0"]), &["--point-stride"]);
    refused(&run_with(&["--max-frames", "-3"]), &["--max-frames"]);
    // The viewer checks camera flags even on the demo stream, before any window.
    refused(
        &run(&["view", "--input", "demo", "--resolution", "abcxdef"]),
        &["--resolution", "abcxdef"],
    );
    refused(
        &run(&["view", "--input", "demo", "--demo-size", "100000x100000"]),
        &["--demo-size"],
    );
    for fps in ["1e-310", "0", "nan", "1e9"] {
        refused(
            &run(&["view", "--input", "demo", "--demo-fps", fps]),
            &["--demo-fps"],
        );
    }
    refused(
        &run(&["view", "--input", "demo", "--conf-threshold", "nan"]),
        &["--conf-threshold"],
    );
    refused(
        &run(&["export", "x", "--tum", "t", "--min-confidence", "inf"]),
        &["--min-confidence"],
    );
    let all = refused(
        &run(&[
            "cache-sim",
            "--frames",
            "10",
            "--special-max-frames",
            "0",
            "--summary",
        ]),
        &["--special-max-frames"],
    );
    assert!(!all.contains("SpecialPoolConfig"), "no Debug struct: {all}");
    refused(
        &run(&[
            "cache-sim",
            "--frames",
            "10",
            "--sliding-window",
            "4000000000",
            "--summary",
        ]),
        &["--sliding-window"],
    );
    refused(
        &run(&[
            "cache-sim",
            "--frames",
            "10",
            "--sliding-window",
            "18446744073709551615",
            "--summary",
        ]),
        &["--sliding-window"],
    );
    refused(&run(&["cache-sim", "--frames", "-10"]), &["--frames"]);
    // Sizes whose products overflowed (a panic in a debug build, wrapped in release).
    for flag in [
        "--heads",
        "--layers",
        "--head-dim",
        "--page-size",
        "--patches-per-frame",
        "--scale-frames",
    ] {
        refused(
            &run(&[
                "cache-sim",
                "--frames",
                "5",
                flag,
                "18446744073709551615",
                "--summary",
            ]),
            &[flag],
        );
    }
    assert!(
        !Path::new(&o).exists(),
        "no refused run leaves a session folder"
    );
}

#[test]
fn model_settings_that_cannot_work_are_refused_before_anything_is_written() {
    if !fixtures_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let o = dir.path().join("o");
    // A window beyond the model's temporal table (was: blamed special_pool.max_frames and
    // left an empty session folder).
    let out = tiny_run(&o, COURTHOUSE, &["--window", "3000000000"]);
    let all = refused(&out, &["--window"]);
    assert!(!all.contains("special_pool"), "{all}");
    assert!(!o.exists(), "nothing written: {all}");
    // Tiny weights without their config: the hint is --model-config, not "model config".
    let out = run(&[
        "run",
        "--headless",
        "--input",
        COURTHOUSE,
        "--out",
        o.to_str().unwrap(),
        "--weights",
        TINY_WEIGHTS,
    ]);
    refused(&out, &["--model-config", "weights.safetensors"]);
    // A JSON array is no config.
    let array = dir.path().join("array.json");
    std::fs::write(&array, "[1, 2]").expect("write");
    let out = run(&[
        "run",
        "--headless",
        "--input",
        COURTHOUSE,
        "--out",
        o.to_str().unwrap(),
        "--weights",
        TINY_WEIGHTS,
        "--model-config",
        array.to_str().unwrap(),
    ]);
    refused(&out, &["array.json", "JSON object"]);
    // Weights cut short name the file.
    let cut = dir.path().join("cut.safetensors");
    let bytes = std::fs::read(Path::new(ROOT).join(TINY_WEIGHTS)).expect("fixture");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let out = run(&[
        "run",
        "--headless",
        "--input",
        COURTHOUSE,
        "--out",
        o.to_str().unwrap(),
        "--weights",
        cut.to_str().unwrap(),
        "--model-config",
        TINY_CONFIG,
    ]);
    refused(&out, &["cut.safetensors"]);
    assert!(!o.exists());
}

#[test]
fn run_and_view_share_their_point_defaults() {
    use clap::Parser;
    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: streamrecon::cli::run::RunArgs,
    }
    let run = Run::parse_from(["run"]).args;
    let view = streamrecon::cli::view::ViewArgs::default();
    assert_eq!(run.points.point_stride, view.points.point_stride);
    assert_eq!(run.points.conf_threshold, view.points.conf_threshold);
}

// ---------------------------------------------------------------------------------------------
// 9. the hub download: progress, resume, checksum, offline

/// A local "hub" for one file: answers hf-hub's range requests. The first full transfer is cut
/// after `cut_after` bytes when set (a dropped connection); `etag` is what the hub calls it.
struct FakeHub {
    endpoint: String,
    ranges: Arc<std::sync::Mutex<Vec<String>>>,
}

fn fake_hub(body: Vec<u8>, etag: String, cut_after: Option<usize>) -> FakeHub {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let ranges = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&ranges);
    let cuts = Arc::new(AtomicU64::new(u64::from(cut_after.is_some())));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            serve(stream, &body, &etag, &seen, &cuts, cut_after.unwrap_or(0));
        }
    });
    FakeHub { endpoint, ranges }
}

fn serve(
    mut stream: TcpStream,
    body: &[u8],
    etag: &str,
    seen: &std::sync::Mutex<Vec<String>>,
    cuts: &AtomicU64,
    cut_after: usize,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut range = String::from("0-");
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
            range = v.trim().to_owned();
        }
    }
    seen.lock().expect("lock").push(range.clone());
    let (a, b) = range.split_once('-').unwrap_or(("0", ""));
    let start: usize = a.parse().unwrap_or(0);
    let end = if b.is_empty() {
        body.len() - 1
    } else {
        b.parse::<usize>().unwrap_or(0).min(body.len() - 1)
    };
    let chunk = &body[start..=end];
    let head = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{end}/{}\r\n\
         ETag: \"{etag}\"\r\nX-Repo-Commit: fedcba9876543210\r\nConnection: close\r\n\r\n",
        chunk.len(),
        body.len()
    );
    let full_transfer = chunk.len() > 1;
    let send = if full_transfer && cuts.load(Ordering::SeqCst) > 0 {
        cuts.fetch_sub(1, Ordering::SeqCst);
        &chunk[..cut_after.min(chunk.len())]
    } else {
        chunk
    };
    // A client that hung up early makes the test fail on its side, with a better message.
    if stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(send))
        .and_then(|()| stream.flush())
        .is_err()
    {
        eprintln!("fake hub: the client went away");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn hub_body() -> Vec<u8> {
    (0..300_000u32)
        .flat_map(|i| (i.wrapping_mul(2_654_435_761)).to_le_bytes())
        .collect()
}

#[test]
fn a_broken_download_resumes_reports_progress_and_is_verified() {
    use streamrecon::model::weights::hub::{DownloadStage, HubRequest, download_reporting};
    let body = hub_body();
    let hub = fake_hub(body.clone(), sha256_hex(&body), Some(400_000));
    let cache = tempfile::tempdir().expect("tempdir");
    let req = HubRequest {
        endpoint: Some(&hub.endpoint),
        cache_dir: Some(cache.path()),
        repo: "test/model",
        file: "w.bin",
    };
    let mut reports = Vec::new();
    let path = download_reporting(&req, &mut |p| reports.push(p.stage)).expect("resumed");
    let mut got = Vec::new();
    std::fs::File::open(&path)
        .expect("open")
        .read_to_end(&mut got)
        .expect("read");
    assert!(got == body, "the file is whole");
    let ranges = hub.ranges.lock().expect("lock").clone();
    assert!(
        ranges.iter().any(|r| r.starts_with("400000-")),
        "the second transfer asked for the rest only: {ranges:?}"
    );
    let total = body.len() as u64;
    assert!(
        reports.contains(&DownloadStage::Receiving { done: total, total }),
        "{reports:?}"
    );
    assert!(
        reports.contains(&DownloadStage::Verifying { total }),
        "{reports:?}"
    );
}

#[test]
fn a_download_that_does_not_match_the_hubs_checksum_is_removed() {
    use streamrecon::model::weights::hub::{HubRequest, download};
    let body = hub_body();
    let hub = fake_hub(body.clone(), sha256_hex(b"something else"), None);
    let cache = tempfile::tempdir().expect("tempdir");
    let req = HubRequest {
        endpoint: Some(&hub.endpoint),
        cache_dir: Some(cache.path()),
        repo: "test/model",
        file: "w.bin",
    };
    let err = download(&req).expect_err("a damaged download is refused");
    let msg = err.to_string();
    assert!(msg.contains("SHA-256") && msg.contains("w.bin"), "{msg}");
    let blobs = cache.path().join("models--test--model/blobs");
    // hf-hub's lock file may stay; no blob of content may.
    let left: Vec<String> = std::fs::read_dir(&blobs)
        .map(|d| {
            d.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "the damaged blob is gone: {left:?}");
}

#[test]
fn offline_says_what_to_do_by_hand() {
    use streamrecon::model::weights::hub::{HubRequest, download};
    let cache = tempfile::tempdir().expect("tempdir");
    let err = download(&HubRequest {
        endpoint: Some("http://127.0.0.1:9"),
        cache_dir: Some(cache.path()),
        ..HubRequest::default()
    })
    .expect_err("offline");
    let msg = err.to_string();
    for wanted in [
        "offline",
        "--weights",
        "lingbot-map-long.pt",
        "http://127.0.0.1:9/robbyant/lingbot-map/resolve/main/lingbot-map-long.pt",
    ] {
        assert!(msg.contains(wanted), "`{wanted}` in {msg}");
    }
}
