//! `streamrecon run --headless` as a user runs it: the courthouse sequence with the gct-tiny
//! fixture, a camera that does not exist, a corrupt image in a strict run, bad arguments.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_streamrecon");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);

/// Run with a deadline: a hang is a failure, not a stuck CI job.
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(ROOT)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_or_kill(
        &mut child,
        Duration::from_secs(120),
        &format!("streamrecon {args:?}"),
    );
    child.wait_with_output().unwrap()
}

fn tiny(extra: &[&str], out: &Path, input: &str) -> Output {
    let out = out.to_str().unwrap();
    let mut args = vec![
        "run",
        "--headless",
        "--input",
        input,
        "--out",
        out,
        "--weights",
        "../shared/fixtures/gct-tiny/weights.safetensors",
        "--model-config",
        "../shared/fixtures/gct-tiny/kf1/config.json",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// `run --headless` on `frames` synthetic frames with random tiny weights into `out`.
fn synthetic_tiny(frames: u32, extra: &[&str], out: &Path) -> Output {
    let frames = frames.to_string();
    let mut args = vec![
        "run",
        "--headless",
        "--input",
        "synthetic",
        "--synthetic-frames",
        &frames,
        "--random-weights",
        "tiny",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn courthouse_with_the_tiny_model_writes_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("session");
    let out = tiny(&[], &session, COURTHOUSE);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("48 processed of 48 captured"), "{stdout}");
    assert!(stdout.contains("fps"), "{stdout}");

    let frames = std::fs::read_dir(session.join("frames")).unwrap().count();
    assert_eq!(frames, 48);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["frames_processed"], 48);
    assert_eq!(summary["frames_dropped"], 0);
    assert_eq!(summary["input_ended"], true);

    // The PLY (the one `export --ply` writes) has as many vertices as its body holds and as the
    // per-frame counts add up to.
    let ply = std::fs::read(session.join("points.ply")).unwrap();
    let end = ply.windows(11).position(|w| w == b"end_header\n").unwrap() + 11;
    let header = text(&ply[..end]);
    let count: u64 = header
        .lines()
        .find_map(|l| l.strip_prefix("element vertex "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        (ply.len() - end) as u64,
        count * 23,
        "x y z f32, rgb u8, confidence f32, frame i32"
    );
    assert!(header.contains("property int frame"), "{header}");
    let per_frame: u64 = (0..48)
        .map(|i| {
            let f: serde_json::Value = serde_json::from_slice(
                &std::fs::read(session.join(format!("frames/{i:06}.json"))).unwrap(),
            )
            .unwrap();
            assert_eq!(f["frame"], i);
            f["points"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(per_frame, count);
    // The TUM trajectory (the one `export --tum` writes): a timestamp in seconds, not a frame
    // index, first on every line, never going back.
    let trajectory = std::fs::read_to_string(session.join("trajectory.tum")).unwrap();
    let stamps: Vec<f64> = trajectory
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(stamps.len(), 48);
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
    assert!(trajectory.lines().next().unwrap().contains("timestamp"));

    // The recorder's session file holds every frame, closed properly.
    let recording = streamrecon::record::SessionReader::open(session.join("session.srec")).unwrap();
    assert!(recording.indexed(), "{:?}", recording.issues());
    let recorded: Vec<u64> = recording.frames().iter().map(|f| f.frame).collect();
    assert_eq!(recorded, (0..48).collect::<Vec<_>>());
    assert_eq!(recording.config()["input"], COURTHOUSE);
    assert!(stdout.contains("recorded:   48 frames"), "{stdout}");
}

#[test]
fn a_missing_camera_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = tiny(&[], &dir.path().join("s"), "webcam:57");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("webcam:57"), "{stderr}");
    assert!(stderr.contains("cameras found:"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !dir.path().join("s").exists(),
        "nothing written for a run that never started"
    );
}

#[test]
fn list_cameras_answers_without_a_camera() {
    let out = run(&["run", "--list-cameras"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("no cameras found") || stdout.contains("webcam:"),
        "{stdout}"
    );
}

#[test]
fn a_corrupt_image_stops_a_strict_run_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for i in 0..3 {
        let name = format!("{:06}.png", 2 * i);
        std::fs::copy(Path::new(COURTHOUSE).join(&name), input.join(&name)).unwrap();
    }
    std::fs::write(input.join("000003.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let input = input.to_str().unwrap();

    let strict = tiny(&["--strict"], &dir.path().join("strict"), input);
    let stderr = text(&strict.stderr);
    assert_eq!(strict.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("000003.png"), "{stderr}");
    // The frames before it were processed and written.
    assert_eq!(
        std::fs::read_dir(dir.path().join("strict/frames"))
            .unwrap()
            .count(),
        2
    );

    let lenient = tiny(&[], &dir.path().join("lenient"), input);
    let (stdout, stderr) = (text(&lenient.stdout), text(&lenient.stderr));
    assert!(lenient.status.success(), "{stderr}");
    // The file that did not decode was captured and skipped: the accounting adds up.
    assert!(
        stdout.contains("3 processed of 4 captured (0 dropped, 1 skipped"),
        "{stdout}"
    );
    assert!(
        stderr.contains("000003.png") || stdout.contains("000003.png"),
        "the skipped file is named\n{stdout}\n{stderr}"
    );
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s");
    for extra in [
        &["--keyframes", "fixed:0"][..],
        &["--on-budget", "later"][..],
        &["--attention", "sparse"][..],
        &["--view-budget", "1"][..],
    ] {
        let out = tiny(extra, &s, COURTHOUSE);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        // The one line before it, on machines without CUDA, says the model runs on the CPU.
        let first = stderr
            .lines()
            .find(|l| !l.ends_with("running the model on the CPU"))
            .unwrap_or("");
        assert!(first.starts_with("error:"), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
    let no_model = run(&[
        "run",
        "--headless",
        "--input",
        "synthetic",
        "--out",
        s.to_str().unwrap(),
    ]);
    assert_eq!(no_model.status.code(), Some(2));
    assert!(text(&no_model.stderr).contains("--weights"));
}

#[test]
fn synthetic_input_runs_with_random_tiny_weights() {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("s");
    let out = synthetic_tiny(6, &[], &session);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("6 processed of 6 captured"), "{stdout}");
    assert!(stdout.contains("synthetic room 640×480"), "{stdout}");
    assert_eq!(
        std::fs::read_dir(session.join("frames")).unwrap().count(),
        6
    );
}

#[test]
fn a_run_reset_by_its_budget_exports_each_model_session_apart() {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("s");
    let out = synthetic_tiny(
        16,
        &[
            "--keyframe-interval",
            "1",
            "--view-budget",
            "6",
            "--on-budget",
            "reset",
        ],
        &session,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session.join("summary.json")).unwrap()).unwrap();
    let sessions = summary["sessions"].as_u64().unwrap();
    assert!(
        sessions >= 2,
        "the budget should have reset the run: {summary}"
    );
    // Each model session has its own world: its own cloud and trajectory, nothing merged.
    assert!(!session.join("points.ply").exists());
    assert!(!session.join("trajectory.tum").exists());
    let mut poses = 0;
    for n in 1..=sessions {
        let tum = std::fs::read_to_string(session.join(format!("trajectory-session-{n}.tum")))
            .unwrap_or_else(|e| panic!("trajectory of session {n}: {e}\n{stdout}"));
        poses += tum.lines().filter(|l| !l.starts_with('#')).count();
        let ply = std::fs::read(session.join(format!("points-session-{n}.ply"))).unwrap();
        assert!(ply.starts_with(b"ply\n"));
    }
    assert!(
        !session
            .join(format!("points-session-{}.ply", sessions + 1))
            .exists()
    );
    assert_eq!(poses, 16, "every frame's pose, once");
    assert!(
        stdout.contains(&format!("{sessions} model sessions")),
        "{stdout}"
    );
}

#[test]
fn keyframe_interval_is_the_fixed_rule_and_excludes_keyframes() {
    let dir = tempfile::tempdir().unwrap();
    let out = tiny(
        &["--keyframe-interval", "2"],
        &dir.path().join("a"),
        COURTHOUSE,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("Fixed { interval: 2 }") || stdout.contains("Fixed { interval: 2 }"),
        "{stdout}\n{stderr}"
    );
    let both = tiny(
        &["--keyframe-interval", "2", "--keyframes", "fixed:3"],
        &dir.path().join("b"),
        COURTHOUSE,
    );
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
}

/// Ctrl-C (SIGINT) mid-run finishes the session instead of cutting it off: the frames' JSON, the
/// recording's index, summary.json and the exported cloud all hold the frames processed before it.
#[cfg(unix)]
#[test]
fn ctrl_c_finishes_the_session_with_the_frames_so_far() {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("s");
    let mut child = Command::new(BIN)
        .args([
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
        ])
        .current_dir(ROOT)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let frames_written = || std::fs::read_dir(session.join("frames")).map_or(0, |d| d.count());
    let start = Instant::now();
    while frames_written() < 3 {
        if start.elapsed() > Duration::from_secs(120) || child.try_wait().unwrap().is_some() {
            // Killing a child that has just exited fails harmlessly; the test fails below.
            child.kill().ok();
            panic!("the run never got going: {:?}", child.wait_with_output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    common::wait_or_kill(&mut child, Duration::from_secs(60), "the run after Ctrl-C");
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("interrupted (Ctrl-C)"), "{stdout}");
    assert!(stderr.contains("finishing the session"), "{stderr}");

    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session.join("summary.json")).unwrap()).unwrap();
    let processed = summary["frames_processed"].as_u64().unwrap();
    assert!((3..100_000).contains(&processed), "{summary}");
    assert_eq!(summary["input_ended"], false);
    assert_eq!(frames_written() as u64, processed);
    let recording = streamrecon::record::SessionReader::open(session.join("session.srec")).unwrap();
    assert!(recording.indexed(), "{:?}", recording.issues());
    assert_eq!(recording.frames().len() as u64, processed);
    assert!(session.join("points.ply").exists() && session.join("trajectory.tum").exists());
}
