//! The recorder on the real pipeline (synthetic room, tiny random-weight model on the CPU):
//! the wiring `run --headless` and the viewer are meant to use. A lossless subscription is
//! drained by a relay that only calls `SessionRecorder::offer` (which never waits), so inference never
//! waits on the disk.

use std::sync::Arc;

use streamrecon::capture::{SyntheticScene, SyntheticSource};
use streamrecon::frame::FrameResult;
use streamrecon::model::{GctModel, ModelConfig};
use streamrecon::pipeline::{
    Control, CpuFrameModel, Delivery, Outputs, Pipeline, PipelineConfig, PipelineEvent,
};
use streamrecon::record::{Parts, RecorderOptions, SessionReader, SessionRecorder};

#[test]
fn a_pipeline_run_recorded_reads_back_as_it_was_produced() {
    let cfg = ModelConfig::tiny();
    let store = streamrecon::model::weights::random::random_store(&cfg, 0).unwrap();
    let model = Arc::new(CpuFrameModel::new(
        GctModel::from_store(cfg, store).unwrap(),
    ));
    let source = Box::new(SyntheticSource::new(SyntheticScene {
        frames: Some(5),
        ..SyntheticScene::default()
    }));
    let mut outputs = Outputs::default();
    let events = outputs.subscribe(Delivery::Lossless, 8);
    let pipeline = Pipeline::start(source, model, PipelineConfig::default(), outputs).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.srec");
    let config = serde_json::json!({ "input": "synthetic", "model": "tiny random" });
    let recorder = SessionRecorder::create(&path, &config, RecorderOptions::default()).unwrap();
    let mut produced: Vec<Arc<FrameResult>> = Vec::new();
    for event in events.iter() {
        match event {
            PipelineEvent::Frame(r) => {
                recorder.offer(r.clone());
                produced.push(r);
            }
            PipelineEvent::SessionReset { reason } => {
                recorder.note(format!("session reset: {reason}"));
            }
            PipelineEvent::InputEnded => {
                pipeline.send(Control::Stop);
            }
            PipelineEvent::Error { stage, message } => panic!("{stage}: {message}"),
            _ => {}
        }
    }
    pipeline.join();
    let status = recorder.finish();
    assert_eq!(status.error, None);
    assert_eq!(status.frames_recorded as usize, produced.len());
    assert_eq!(produced.len(), 5);

    let reader = SessionReader::open(&path).unwrap();
    assert!(reader.issues().is_empty(), "{:?}", reader.issues());
    assert_eq!(reader.config(), &config);
    for (i, want) in produced.iter().enumerate() {
        let got = reader.read_frame(i, Parts::ALL).unwrap();
        assert_eq!(got.frame, want.frame);
        assert_eq!(got.frame_type, want.frame_type);
        assert_eq!(got.world_from_camera, want.world_from_camera);
        assert_eq!(got.intrinsics, want.intrinsics);
        assert_eq!(got.points, want.points);
        assert_eq!(got.cache, want.cache);
        assert_eq!(got.timings, want.timings);
        assert_eq!(got.depth.len(), want.depth.len());
        assert_eq!(
            (got.image.width, got.image.height),
            (want.image.width, want.image.height)
        );
    }
}
