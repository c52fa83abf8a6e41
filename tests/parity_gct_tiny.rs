//! Parity of the CPU model against the reference's own outputs on the `gct-tiny` fixtures:
//! both scenarios (keyframe interval 1 and 2), both weight files, both KV layouts.

mod common;

use std::path::PathBuf;
use std::process::Command;

use streamrecon::attention::AttentionLayout;
use streamrecon::parity::{ParityReport, WeightsChoice, run_parity};

fn fixture_dir() -> Option<PathBuf> {
    common::gct_tiny_fixtures("kf1/config.json")
}

fn check(scenario: &str, weights: &str, layout: AttentionLayout) -> Option<ParityReport> {
    let dir = fixture_dir()?;
    let report = run_parity(
        &dir.join(scenario),
        &WeightsChoice::File(dir.join(weights)),
        layout,
    )
    .expect("parity run completes");
    let failures: Vec<String> = report
        .rows
        .iter()
        .filter(|r| !r.pass)
        .map(|r| format!("{} (err/tol {:.3}, {:?})", r.name, r.worst_ratio, r.problem))
        .collect();
    assert!(
        failures.is_empty(),
        "{scenario} {weights} {layout}: {failures:#?}"
    );
    // Everything the fixture holds was produced and compared: outputs, every block of every
    // call, and the cache state.
    assert!(report.rows.iter().any(|r| r.name == "world_points"));
    assert!(
        report
            .rows
            .iter()
            .any(|r| r.name.ends_with(".global_block.5"))
    );
    assert!(report.rows.iter().any(|r| r.name.ends_with("k_0_special")));
    Some(report)
}

#[test]
fn kf1_safetensors_paged() {
    if let Some(r) = check("kf1", "weights.safetensors", AttentionLayout::Paged) {
        assert!(r.rows.len() > 250);
    }
}

#[test]
fn kf1_pt_dense() {
    check("kf1", "weights.pt", AttentionLayout::Dense);
}

#[test]
fn kf1_pt_paged() {
    check("kf1", "weights.pt", AttentionLayout::Paged);
}

#[test]
fn kf1_safetensors_dense() {
    check("kf1", "weights.safetensors", AttentionLayout::Dense);
}

#[test]
fn kf2_safetensors_paged() {
    check("kf2", "weights.safetensors", AttentionLayout::Paged);
}

#[test]
fn kf2_safetensors_dense() {
    check("kf2", "weights.safetensors", AttentionLayout::Dense);
}

#[test]
fn kf2_pt_paged() {
    check("kf2", "weights.pt", AttentionLayout::Paged);
}

#[test]
fn kf2_pt_dense() {
    check("kf2", "weights.pt", AttentionLayout::Dense);
}

#[test]
fn cli_prints_table_and_passes() {
    let Some(dir) = fixture_dir() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .arg("parity")
        .arg(dir.join("kf2"))
        .args(["--attention", "dense"])
        .output()
        .expect("binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("call04.global_block.3"));
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.contains("0 over tolerance") && last.contains("worst"),
        "{last}"
    );
}

#[test]
fn cli_fails_on_wrong_weights() {
    // Random weights of the right shapes: the run completes but parity must fail, with a
    // non-zero exit status.
    let Some(dir) = fixture_dir() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .arg("parity")
        .arg(dir.join("kf1"))
        .args(["--random-weights", "tiny", "--failures-only"])
        .output()
        .expect("binary runs");
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("FAIL"), "{stdout}");
}

#[test]
fn missing_weights_file_is_a_clear_error() {
    let Some(dir) = fixture_dir() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .arg("parity")
        .arg(dir.join("kf1"))
        .args(["--weights", "/nonexistent/weights.pt"])
        .output()
        .expect("binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/weights.pt"), "{stderr}");
}

#[test]
fn weights_of_another_size_are_named_plainly() {
    // Full-size random weights against the tiny scenario: the size mismatch is reported as
    // such (embed 1024 vs 128), before any tensor is compared.
    let Some(dir) = fixture_dir() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    // A safetensors file with the tiny names but a wider camera token.
    let mut tensors = Vec::new();
    let mut store =
        streamrecon::model::weights::WeightStore::load(&dir.join("weights.safetensors"))
            .expect("loads");
    let mut names: Vec<String> = store.names().map(str::to_owned).collect();
    names.sort();
    for name in &names {
        let t = store.read(name).expect("present");
        let (shape, data) = if name == "aggregator.camera_token" {
            (vec![1, 2, 1, 256], vec![0.0f32; 512])
        } else {
            (t.shape.clone(), t.data.clone())
        };
        tensors.push((name.clone(), shape, data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    s.clone(),
                    bytemuck::cast_slice(d),
                )
                .expect("view"),
            )
        })
        .collect();
    let path = tmp.path().join("wide.safetensors");
    safetensors::serialize_to_file(views, None, &path).expect("write");
    let err = run_parity(
        &dir.join("kf1"),
        &WeightsChoice::File(path.clone()),
        AttentionLayout::Dense,
    )
    .expect_err("size mismatch");
    let msg = format!("{err:#}");
    assert!(msg.contains("embed 256 (config: 128)"), "{msg}");
    assert!(msg.contains("wide.safetensors"), "{msg}");
}

#[test]
fn frame_feeder_reproduces_the_reference_one_frame_at_a_time() {
    // The live-source path: frames pushed singly, schedule decided by the feeder.
    use streamrecon::model::weights::WeightStore;
    use streamrecon::model::{FrameFeeder, GctModel, ModelConfig};
    let Some(dir) = fixture_dir() else { return };
    let cfg = ModelConfig::from_json_file(&dir.join("kf2/config.json")).expect("config");
    let model = GctModel::load(cfg.clone(), &dir.join("weights.pt")).expect("model");
    let mut inputs = WeightStore::load(&dir.join("kf2/inputs.safetensors")).expect("inputs");
    let outputs = streamrecon::model::weights::safetensors_file::read_safetensors_any(
        &dir.join("kf2/outputs.safetensors"),
    )
    .expect("outputs");
    let images = inputs.read("images").expect("images");
    let want: Vec<f32> = outputs
        .iter()
        .find(|(name, _, _)| name == "pose_enc")
        .map(|(_, _, d)| d.iter().map(|&v| v as f32).collect())
        .expect("pose_enc");
    let (h, w) = (42, 56);
    let mut state = model
        .new_stream(h, w, AttentionLayout::Paged)
        .expect("stream");
    let mut feeder = FrameFeeder::new(cfg.scale_frames, cfg.keyframe_interval);
    let mut poses = Vec::new();
    for frame in images.data.chunks_exact(3 * h * w) {
        if let Some(out) = feeder.push(&model, &mut state, frame).expect("step") {
            poses.extend(out.pose_enc);
        }
    }
    assert!(feeder.finish(&model, &mut state).expect("finish").is_none());
    assert_eq!(poses.len(), want.len());
    for (a, b) in poses.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // kf2: 2 scale frames + keyframes 2, 4, 6, 8 are committed.
    assert_eq!(state.committed_frames(), 6);
}
