//! `streamrecon bench viewer` run as a user runs it: on the adapter this machine has (Mesa's
//! lavapipe in CI), small N and a small view, every path the adapter has; the JSON report must
//! hold timed cases that drew something, and the compute paths must agree with the sprites.
//! Without any adapter the command must say why and fail without a panic.

use std::process::Command;

fn streamrecon() -> Command {
    Command::new(env!("CARGO_BIN_EXE_streamrecon"))
}

#[test]
fn bench_viewer_reports_every_path_and_their_agreement() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("viewer.json");
    let out = streamrecon()
        .args([
            "bench",
            "viewer",
            "--size",
            "320x180",
            "--points",
            "0.05,0.15",
            "--frames",
            "3",
            "--warmup",
            "1",
            "--path",
            "all",
            "--budgets",
            "every,default",
            "--room-frame",
            "160x120",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run streamrecon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if stderr.contains("needs a GPU adapter") {
        println!("skipping bench viewer: no wgpu adapter here ({stderr})");
        return;
    }
    let adapter_has_compute = !stderr.contains("is not available on");
    if !adapter_has_compute {
        // An adapter without 64-bit atomics: the sprites alone must still run.
        println!("this adapter lacks a compute path ({stderr}); timing the sprites alone");
        let out = streamrecon()
            .args([
                "bench",
                "viewer",
                "--size",
                "320x180",
                "--points",
                "0.05",
                "--frames",
                "2",
                "--path",
                "sprites",
                "--room-frame",
                "160x120",
                "--json",
            ])
            .arg(&json)
            .output()
            .expect("run streamrecon");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        assert!(out.status.success(), "stderr:\n{stderr}\nstdout:\n{stdout}");
        // The table comes last on stdout.
        assert!(stdout.contains("GPU ms"), "{stdout}");
        assert!(stdout.contains("agreement: compute vs sprites"), "{stdout}");
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("JSON");
    assert!(!report["adapter"].as_str().unwrap_or("").is_empty());
    let cases = report["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let ms = case["gpu_ms_median"].as_f64().unwrap_or(0.0);
        assert!(ms > 0.0 && ms.is_finite(), "{case}");
        assert!(case["covered_pixels"].as_u64().unwrap_or(0) > 100, "{case}");
        assert!(case["points_drawn"].as_u64().unwrap_or(0) > 0, "{case}");
        assert!(
            case["point_memory_bytes"].as_u64().unwrap_or(0) > 0,
            "{case}"
        );
    }
    assert!(report["append"]["frames"].as_u64().unwrap_or(0) > 0);
    assert_eq!(report["append"]["points"].as_u64(), Some(150_000));
    if adapter_has_compute {
        // 3 paths x 2 budgets x 2 stages.
        assert_eq!(cases.len(), 12);
        let agreement = report["agreement"].as_array().expect("agreement");
        // Both stages, both compute paths; the default budget strides only the sprites above
        // 4 M points, so at these counts both budgets compare.
        assert_eq!(agreement.len(), 8, "{agreement:?}");
        for a in agreement {
            assert_eq!(a["within_tolerance"].as_bool(), Some(true), "{a}");
        }
    }
}

#[test]
fn bench_viewer_without_an_adapter_says_why() {
    // Metal is not compiled in on Linux, so no adapter can be found.
    if cfg!(target_os = "macos") {
        println!("skipping: Metal exists here");
        return;
    }
    let out = streamrecon()
        .env("WGPU_BACKEND", "metal")
        .args(["bench", "viewer", "--size", "64x64", "--points", "0.01"])
        .output()
        .expect("run streamrecon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("bench viewer needs a GPU adapter"),
        "{stderr}"
    );
}

#[test]
fn bench_viewer_refuses_bad_arguments_by_name() {
    for (args, expected) in [
        (&["--size", "640"][..], "--size `640`"),
        (&["--points", "20,4"][..], "ascending"),
        (&["--path", "fast"][..], "unknown render path `fast`"),
        (&["--budgets", "some"][..], "--budgets `some`"),
    ] {
        let out = streamrecon()
            .args(["bench", "viewer"])
            .args(args)
            .output()
            .expect("run streamrecon");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn bench_viewer_draws_a_recorded_session() {
    // A session of 8 demo frames (about 55 k points), written as `run` writes one.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("take.srec");
    let mut stream = streamrecon::viewer::demo::DemoStream::new(Default::default());
    let out = std::fs::File::create(&file).expect("session file");
    let mut w = streamrecon::record::SessionWriter::new(out, &file, &serde_json::json!({}))
        .expect("writer");
    let mut points = 0;
    for i in 0..8 {
        let r = stream.next_result();
        points += r.points.len() as u64;
        w.write_frame(&r, i as f64 / 30.0).expect("frame");
    }
    w.finish().expect("finish");
    let json = dir.path().join("viewer.json");
    // More points than the session holds: its frames are cycled.
    let wanted = points + points / 2;
    let out = streamrecon()
        .args([
            "bench", "viewer", "--size", "160x90", "--frames", "2", "--warmup", "0",
        ])
        .args(["--path", "sprites", "--points"])
        .arg(format!("{}", wanted as f64 / 1e6))
        .arg("--session")
        .arg(&file)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run streamrecon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if stderr.contains("needs a GPU adapter") {
        println!("skipping the session bench: no wgpu adapter here ({stderr})");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).expect("JSON");
    assert!(
        report["source"]
            .as_str()
            .unwrap_or("")
            .contains("take.srec")
    );
    assert_eq!(report["append"]["points"].as_u64(), Some(wanted));
    assert!(
        report["append"]["frames"].as_u64().unwrap_or(0) > 8,
        "{report}"
    );
    // A session that is not there is named.
    let out = streamrecon()
        .args(["bench", "viewer", "--size", "64x36", "--session"])
        .arg(dir.path().join("missing.srec"))
        .output()
        .expect("run streamrecon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("missing.srec"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
