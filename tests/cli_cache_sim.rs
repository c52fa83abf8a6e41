//! The `streamrecon` binary: cache-sim output and bad input.

mod common;

use std::process::Command;

use common::streamrecon;

#[test]
fn cache_sim_prints_one_json_line_per_phase2_step() {
    let out = streamrecon(&[
        "cache-sim",
        "--frames",
        "14",
        "--scale-frames",
        "2",
        "--sliding-window",
        "3",
        "--keyframe-interval",
        "2",
        "--patches-per-frame",
        "12",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    assert_eq!(lines[0]["frame"], 2);
    // Frame 8 is the keyframe that pushes frame 2 out of the 3-frame window.
    let frame8 = &lines[6];
    assert_eq!(frame8["frame"], 8);
    assert_eq!(frame8["keyframe"], true);
    assert_eq!(frame8["evicted"], serde_json::json!([2]));
    assert_eq!(frame8["visible_frames"], serde_json::json!([0, 1, 4, 6, 8]));
    // 5 frames of 12 patches + 6 frames of 6 special tokens.
    assert_eq!(frame8["kv_tokens"], 5 * 12 + 6 * 6);
    let frame9 = &lines[7];
    assert_eq!(frame9["keyframe"], false);
    assert_eq!(
        frame9["visible_frames"],
        serde_json::json!([0, 1, 4, 6, 8, 9])
    );
}

#[test]
fn cache_sim_summary_matches_the_performance_table() {
    // performance.md: 72 live frames after 1000 seen is 77,928 keys.
    let out = streamrecon(&["cache-sim", "--frames", "1000", "--summary"]);
    assert!(out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["last_kv_tokens"], 77_928);
    assert_eq!(summary["frames_evicted"], 1000 - 72);
}

#[test]
fn bad_values_are_named_and_exit_nonzero() {
    let out = streamrecon(&["cache-sim", "--frames", "5", "--patches-per-frame", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    // The flag, not the cache's internal field (issue 20).
    assert!(err.contains("--patches-per-frame 0"), "{err}");
    assert!(!err.contains("patches_per_frame"), "{err}");

    let out = streamrecon(&[
        "cache-sim",
        "--frames",
        "5",
        "--on-special-full",
        "sometimes",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("error or drop-oldest"));

    let out = streamrecon(&[
        "cache-sim",
        "--frames",
        "50",
        "--special-max-frames",
        "10",
        "--scale-frames",
        "2",
        "--patches-per-frame",
        "12",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("frame 10") && err.contains("special-token pool is full"),
        "{err}"
    );
}

/// A reader that stops early (`cache-sim … | head`) ends the simulation at once, quietly: a
/// stream of a trillion frames would otherwise keep the process simulating for days after its
/// output went nowhere.
#[test]
fn a_reader_that_stops_ends_the_simulation() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::Duration;

    let mut child = Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .args([
            "cache-sim",
            "--frames",
            "1000000000000",
            "--patches-per-frame",
            "12",
            "--on-special-full",
            "drop-oldest",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the streamrecon binary runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut first)
        .expect("a first line");
    // The reader (and with it the pipe) is gone here.
    let v: serde_json::Value = serde_json::from_str(&first).expect("a JSON line");
    assert_eq!(v["frame"], 8);
    common::wait_or_kill(
        &mut child,
        Duration::from_secs(120),
        "cache-sim after its reader went away",
    );
    let status = child.wait().expect("cache-sim's status");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "exit {status:?}: {stderr}");
    assert!(stderr.is_empty(), "a closed reader is no error: {stderr}");
}
