//! `view`'s recording relay: results relayed from a lossless subscription reach a session file
//! that reads back, toggling off finishes the file (index present), results offered while not
//! recording are not in any file, and resets are written down as notices; on a real pipeline
//! (tiny random model) every frame is recorded while the window's stream may drop.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::unbounded;
use streamrecon::capture::{SyntheticScene, SyntheticSource};
use streamrecon::model::{GctModel, ModelConfig};
use streamrecon::pipeline::{
    CpuFrameModel, Delivery, Outputs, Pipeline, PipelineConfig, PipelineEvent,
};
use streamrecon::record::sample::sample_result;
use streamrecon::record::{Parts, SessionReader};
use streamrecon::record::{RecordingRelay, new_session_path};

fn frame(i: u64) -> PipelineEvent {
    PipelineEvent::Frame(Arc::new(sample_result(i, 16, 12, 50)))
}

/// The relay runs on its own thread: wait until it has handed `n` frames to the recorder.
fn wait_recorded(relay: &RecordingRelay, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let recorded = relay.status().map_or(0, |s| s.frames_recorded);
        if recorded >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {recorded} of {n} frames recorded"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn toggling_records_what_the_pipeline_produced_and_finishes_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sessions = dir.path().join("sessions");
    let (tx, rx) = unbounded();
    let relay = RecordingRelay::spawn(rx, serde_json::json!({ "command": "test" })).expect("spawn");

    // Not recording: these go nowhere.
    for i in 0..3 {
        tx.send(frame(i)).expect("open");
    }
    assert!(relay.status().is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    while relay.events_seen() < 3 {
        assert!(Instant::now() < deadline, "the relay did not drain");
        std::thread::sleep(Duration::from_millis(5));
    }

    let started = relay.start_in(&sessions).expect("start");
    let first = started.path.clone();
    assert!(first.starts_with(&sessions));
    let name = first.file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert!(
        name.starts_with("session-") && name.ends_with(".srec"),
        "{name}"
    );
    for i in 3..8 {
        tx.send(frame(i)).expect("open");
    }
    tx.send(PipelineEvent::SessionReset {
        reason: "test reset".into(),
    })
    .expect("open");
    tx.send(frame(8)).expect("open");
    wait_recorded(&relay, 6);

    let finished = relay.stop().expect("was recording");
    assert_eq!(finished.frames_recorded, 6);
    assert_eq!(finished.error, None);
    assert!(relay.status().is_none());

    let reader = SessionReader::open(&first).expect("reads back");
    assert!(reader.indexed(), "toggling off writes the index");
    let frames: Vec<u64> = reader.frames().iter().map(|f| f.frame).collect();
    assert_eq!(frames, vec![3, 4, 5, 6, 7, 8]);
    assert!(
        reader
            .notices()
            .iter()
            .any(|n| n.message.contains("session reset: test reset")),
        "{:?}",
        reader.notices()
    );
    let r = reader.read_frame(2, Parts::ALL).expect("frame decodes");
    assert_eq!(r.frame, 5);
    assert_eq!(r.points.len(), 50);
    assert_eq!(reader.config()["command"], "test");

    // On again: a new file (even within the same second); the relay closes it when the
    // pipeline's subscription ends.
    let second = relay.start_in(&sessions).expect("start again").path;
    assert_ne!(second, first);
    for i in 9..12 {
        tx.send(frame(i)).expect("open");
    }
    drop(tx);
    let closed = relay.join().expect("was recording");
    assert_eq!(closed.frames_recorded, 3);
    let reader = SessionReader::open(&second).expect("reads back");
    assert!(reader.indexed());
    assert_eq!(reader.frames().len(), 3);
}

#[test]
fn a_recording_that_cannot_start_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_tx, rx) = unbounded::<PipelineEvent>();
    let relay = RecordingRelay::spawn(rx, serde_json::json!({})).expect("spawn");
    let taken = dir.path().join("taken.srec");
    std::fs::write(&taken, b"x").expect("write");
    let err = relay
        .start(&taken)
        .expect_err("an existing file is not overwritten");
    assert!(format!("{err:#}").contains("taken.srec"), "{err:#}");
    assert!(relay.status().is_none());
    assert_eq!(std::fs::read(&taken).expect("read"), b"x");
}

#[test]
fn session_names_are_utc_timestamps_and_unique() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 2024-02-29 13:45:07 UTC.
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_709_214_307);
    let a = new_session_path(dir.path(), t).expect("path");
    assert_eq!(
        a.file_name().and_then(|n| n.to_str()),
        Some("session-20240229-134507.srec")
    );
    std::fs::write(&a, b"").expect("write");
    let b = new_session_path(dir.path(), t).expect("path");
    assert_eq!(
        b.file_name().and_then(|n| n.to_str()),
        Some("session-20240229-134507-2.srec")
    );
}

#[test]
fn a_real_pipeline_is_recorded_through_the_relay_while_the_window_stream_may_drop() {
    let cfg = ModelConfig::tiny();
    let store = streamrecon::model::weights::random::random_store(&cfg, 0).expect("weights");
    let model = Arc::new(CpuFrameModel::new(
        GctModel::from_store(cfg, store).expect("model"),
    ));
    let source = Box::new(SyntheticSource::new(SyntheticScene {
        frames: Some(6),
        ..SyntheticScene::default()
    }));
    // The same two subscriptions `view` makes: the window's (lossy) and the relay's.
    let mut outputs = Outputs::default();
    let window = outputs.subscribe(Delivery::Latest, 1);
    let relay = RecordingRelay::spawn(
        outputs.subscribe(Delivery::Lossless, 8),
        serde_json::json!({ "command": "test" }),
    )
    .expect("spawn");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("live.srec");
    relay.start(&path).expect("start");
    let pipeline =
        Pipeline::start(source, model, PipelineConfig::default(), outputs).expect("pipeline");
    let mut produced = Vec::new();
    for event in window.iter() {
        match event {
            PipelineEvent::Frame(r) => produced.push(r.frame),
            PipelineEvent::Stopped(_) | PipelineEvent::InputEnded => break,
            _ => {}
        }
    }
    pipeline.stop_and_join();
    let status = relay.join().expect("was recording");
    assert_eq!(status.error, None);
    assert_eq!(status.results_not_recorded, 0);
    assert_eq!(status.frames_recorded, 6);
    let reader = SessionReader::open(&path).expect("reads back");
    assert!(reader.indexed());
    let recorded: Vec<u64> = reader.frames().iter().map(|f| f.frame).collect();
    assert_eq!(
        recorded,
        (0..6).collect::<Vec<u64>>(),
        "every frame, in order"
    );
    // The window's stream is a subset (it may drop); the recording never is.
    assert!(produced.iter().all(|f| recorded.contains(f)));
}
