//! `streamrecon export` and `streamrecon replay --headless` on a recorded session.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use streamrecon::record::sample::sample_result;
use streamrecon::record::{RecorderOptions, SESSION_FILE, SessionRecorder};

fn streamrecon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .args(args)
        .output()
        .expect("the streamrecon binary runs")
}

fn record(dir: &Path, frames: u64) -> std::path::PathBuf {
    let path = dir.join(SESSION_FILE);
    let rec =
        SessionRecorder::create(&path, &serde_json::json!({}), RecorderOptions::default()).unwrap();
    for i in 0..frames {
        rec.offer(Arc::new(sample_result(i, 16, 12, 40)));
    }
    assert_eq!(rec.finish().frames_recorded, frames);
    path
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn export_writes_every_format_from_a_session_directory() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), 3);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let p = |name: &str| out.join(name).to_string_lossy().into_owned();
    let o = streamrecon(&[
        "export",
        dir.path().to_str().unwrap(),
        "--ply",
        &p("cloud.ply"),
        "--tum",
        &p("traj.txt"),
        "--colmap",
        &p("colmap"),
        "--glb",
        &p("scene.glb"),
        "--min-confidence",
        "2",
        "--voxel",
        "0.25",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("(3 poses)"), "{stdout}");
    for f in [
        "cloud.ply",
        "traj.txt",
        "colmap/sparse/0/cameras.bin",
        "colmap/sparse/0/images.bin",
        "colmap/sparse/0/points3D.bin",
        "scene.glb",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    assert_eq!(
        std::fs::read_dir(out.join("colmap/images"))
            .unwrap()
            .count(),
        3
    );
}

#[test]
fn export_without_an_output_or_with_a_bad_voxel_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let session = record(dir.path(), 1);
    let o = streamrecon(&["export", session.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("nothing to export"));
    let o = streamrecon(&[
        "export",
        session.to_str().unwrap(),
        "--ply",
        "x.ply",
        "--voxel",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--voxel"));
}

#[test]
fn the_dataset_outputs_come_from_one_command_and_their_flags_need_their_output() {
    let dir = tempfile::tempdir().unwrap();
    record(dir.path(), 4);
    let s = dir.path().to_str().unwrap().to_owned();
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let o = streamrecon(&[
        "export",
        &s,
        "--ply",
        &p("n.ply"),
        "--normals",
        "--nerfstudio",
        &p("ns"),
        "--depth",
        &p("depth"),
        "--glb",
        &p("s.glb"),
        "--glb-cameras",
        "--up",
        "z",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("with normals"), "{stdout}");
    assert!(stdout.contains("4 frames of depth"), "{stdout}");
    // The session read no folder: the images are the recorded model input, and the report says
    // how many were written (not "0 linked, 0 copied").
    assert!(
        stdout.contains("4 frames; images: the model's input (4 written)"),
        "{stdout}"
    );
    for f in ["ns/transforms.json", "depth/depth.json", "s.glb"] {
        assert!(dir.path().join(f).is_file(), "{f}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path().join("ns/images"))
            .unwrap()
            .count(),
        4
    );
    let header = std::fs::read(p("n.ply")).unwrap();
    assert!(text(&header[..300]).contains("property float nx"));
    // A flag without the output it shapes is an error, not silently ignored.
    for (flag, needs) in [
        (vec!["--tum", "t.txt", "--normals"], "--ply"),
        (vec!["--tum", "t.txt", "--glb-cameras"], "--glb"),
        (vec!["--tum", "t.txt", "--depth-npy"], "--depth"),
        (vec!["--tum", "t.txt", "--colmap-text"], "--colmap"),
        (vec!["--tum", "t.txt", "--images-from", "x"], "--colmap"),
        (vec!["--colmap", "c", "--max-points", "0"], "--max-points"),
        (vec!["--tum", "t.txt", "--session", "0"], "--session"),
    ] {
        let mut args = vec!["export", s.as_str()];
        args.extend(flag.iter().copied());
        let o = streamrecon(&args);
        assert!(!o.status.success(), "{flag:?}");
        assert!(
            text(&o.stderr).contains(needs),
            "{flag:?}: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn headless_replay_prints_one_line_per_frame_and_reports_damage() {
    let dir = tempfile::tempdir().unwrap();
    let session = record(dir.path(), 4);
    let o = streamrecon(&["replay", session.to_str().unwrap(), "--headless"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("frame")).collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(stdout.contains("replayed 4 of 4 frames"), "{stdout}");

    // Damage one byte in the middle: reported with its offset, the rest replays.
    let mut bytes = std::fs::read(&session).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let damaged = dir.path().join("damaged.srec");
    std::fs::write(&damaged, bytes).unwrap();
    let o = streamrecon(&[
        "replay",
        damaged.to_str().unwrap(),
        "--headless",
        "--from",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stderr = text(&o.stderr);
    assert!(stderr.contains("damaged.srec at byte"), "{stderr}");

    let o = streamrecon(&["replay", "no-such-session.srec", "--headless"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("no-such-session.srec"));
}
