//! Weight loading against the shared fixtures: the `.pt` reader (zip + pickle) and the
//! safetensors reader must give identical tensors; broken files give errors naming the file.

mod common;

use std::path::{Path, PathBuf};

use streamrecon::model::ModelError;
use streamrecon::model::config::ModelConfig;
use streamrecon::model::weights::WeightStore;

fn fixture_dir() -> Option<PathBuf> {
    common::gct_tiny_fixtures("weights.safetensors")
}

#[test]
fn pt_and_safetensors_give_identical_tensors() {
    let Some(dir) = fixture_dir() else { return };
    let mut st = WeightStore::load(&dir.join("weights.safetensors")).expect("safetensors loads");
    let mut pt = WeightStore::load(&dir.join("weights.pt")).expect(".pt loads");
    assert_eq!(st.len(), pt.len());
    assert!(st.len() > 300);
    let names: Vec<String> = st.names().map(str::to_owned).collect();
    for name in &names {
        let a = st.read(name).expect("present");
        let b = pt
            .read(name)
            .unwrap_or_else(|e| panic!("{name} missing from .pt: {e}"));
        assert_eq!(a.shape, b.shape, "{name}");
        assert_eq!(a.data, b.data, "{name}");
    }
}

#[test]
fn fixture_parameter_list_matches_config() {
    let Some(dir) = fixture_dir() else { return };
    let cfg = ModelConfig::from_json_file(&dir.join("kf1/config.json")).expect("config loads");
    assert_eq!(cfg, ModelConfig::tiny());
    let text = std::fs::read_to_string(dir.join("kf1/config.json")).expect("readable");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    let params = json["params"].as_object().expect("params");
    let ours = cfg.parameter_shapes();
    assert_eq!(ours.len(), params.len());
    for (name, shape) in &ours {
        let want: Vec<usize> = params[name]
            .as_array()
            .unwrap_or_else(|| panic!("{name} not in fixture params"))
            .iter()
            .map(|v| v.as_u64().expect("int") as usize)
            .collect();
        assert_eq!(&want, shape, "{name}");
    }
    // Sizes inferred from the tensors agree with the config.
    let st = WeightStore::load(&dir.join("weights.safetensors")).expect("loads");
    let inferred = ModelConfig::tiny().infer_from_weights(&st).expect("infers");
    assert_eq!(inferred, cfg);
}

fn write_truncated(src: &Path, keep: usize, dir: &Path, name: &str) -> PathBuf {
    let bytes = std::fs::read(src).expect("fixture readable");
    let out = dir.join(name);
    std::fs::write(&out, &bytes[..keep.min(bytes.len())]).expect("tempdir writable");
    out
}

#[test]
fn truncated_and_garbage_files_are_clear_errors() {
    let Some(dir) = fixture_dir() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    for src in ["weights.safetensors", "weights.pt"] {
        let len = std::fs::metadata(dir.join(src)).expect("exists").len() as usize;
        for keep in [0, 3, 100, len / 2, len - 10] {
            let p = write_truncated(
                &dir.join(src),
                keep,
                tmp.path(),
                &format!("cut-{keep}-{src}"),
            );
            let err = WeightStore::load(&p).expect_err("truncated file must not load");
            let msg = err.to_string();
            assert!(
                msg.contains(&p.display().to_string()),
                "message names the file: {msg}"
            );
        }
    }
    let garbage = tmp.path().join("garbage.pt");
    std::fs::write(&garbage, b"this is not a checkpoint at all, just words").expect("write");
    let err = WeightStore::load(&garbage).expect_err("garbage");
    assert!(matches!(err, ModelError::BadWeightsFile { .. }), "{err}");
    let missing = tmp.path().join("absent.safetensors");
    assert!(matches!(
        WeightStore::load(&missing),
        Err(ModelError::Io { .. })
    ));
}

#[test]
fn take_reports_missing_and_wrong_shape() {
    let Some(dir) = fixture_dir() else { return };
    let mut st = WeightStore::load(&dir.join("weights.safetensors")).expect("loads");
    let err = st
        .take("aggregator.camera_token", &[1, 2, 1, 64])
        .expect_err("wrong shape");
    match err {
        ModelError::WrongShape {
            name,
            expected,
            found,
            ..
        } => {
            assert_eq!(name, "aggregator.camera_token");
            assert_eq!(expected, vec![1, 2, 1, 64]);
            assert_eq!(found, vec![1, 2, 1, 128]);
        }
        other => panic!("unexpected {other}"),
    }
    let err = st.take("no.such.tensor", &[1]).expect_err("missing");
    assert!(err.to_string().contains("no.such.tensor"));
    // Leftovers are an error only when strict.
    assert!(st.finish(true).is_err());
}
