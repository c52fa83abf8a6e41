//! Pieces of the model checked on their own: the DINO position table resize against the
//! reference's, the streaming schedule against the fixtures', input validation.

mod common;

use std::path::PathBuf;

use streamrecon::attention::AttentionLayout;
use streamrecon::model::weights::WeightStore;
use streamrecon::model::weights::random::random_store;
use streamrecon::model::{Call, GctModel, ModelConfig, streaming_schedule};

fn fixture_dir() -> Option<PathBuf> {
    common::gct_tiny_fixtures("derived.safetensors")
}

#[test]
fn dino_position_table_matches_reference_bicubic_antialias() {
    let Some(dir) = fixture_dir() else { return };
    let mut derived = WeightStore::load(&dir.join("derived.safetensors")).expect("derived loads");
    let want = derived
        .read("dino_pos_embed_interp")
        .expect("table present");
    let model =
        GctModel::load(ModelConfig::tiny(), &dir.join("weights.safetensors")).expect("model");
    // Fixture images are 42×56: a 3×4 patch grid resized from the stored 5×5 grid.
    let got = model.aggregator().dino().position_table(3, 4);
    assert_eq!(want.shape, vec![1, 13, 128]);
    assert_eq!(got.len(), want.data.len());
    let worst = got
        .iter()
        .zip(&want.data)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-5, "position table differs by {worst}");
    // The transposed grid (4×3) must not match: guards against a swapped resize.
    let swapped = model.aggregator().dino().position_table(4, 3);
    let differs = swapped
        .iter()
        .zip(&want.data)
        .any(|(a, b)| (a - b).abs() > 1e-3);
    assert!(differs);
}

#[test]
fn schedule_matches_fixture_calls() {
    let Some(dir) = fixture_dir() else { return };
    for (scenario, interval) in [("kf1", 1), ("kf2", 2)] {
        let text = std::fs::read_to_string(dir.join(scenario).join("config.json")).expect("config");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        let calls: Vec<Call> = json["calls"]
            .as_array()
            .expect("calls")
            .iter()
            .map(|c| Call {
                frames: c["start"].as_u64().expect("start")..c["end"].as_u64().expect("end"),
                keyframe: c["keyframe"].as_bool().expect("keyframe"),
            })
            .collect();
        assert_eq!(streaming_schedule(10, 2, interval), calls, "{scenario}");
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let cfg = ModelConfig::tiny();
    let model = GctModel::from_store(cfg.clone(), random_store(&cfg, 1).expect("random weights"))
        .expect("model");
    assert!(model.new_stream(43, 56, AttentionLayout::Paged).is_err());
    let mut stream = model
        .new_stream(42, 56, AttentionLayout::Paged)
        .expect("stream");
    // A stream cannot start with a non-keyframe.
    let one = vec![0.5; 3 * 42 * 56];
    assert!(model.step(&mut stream, &one, 0..1, false, None).is_err());
    // Wrong number of values for the frame range.
    assert!(
        model
            .step(&mut stream, &[0.5; 10], 0..2, true, None)
            .is_err()
    );
    // A non-keyframe call of two frames.
    let two = vec![0.5; 2 * 3 * 42 * 56];
    assert!(model.step(&mut stream, &two, 0..2, false, None).is_err());
    // After errors, a valid call still works and commits its frames.
    let out = model
        .step(&mut stream, &two, 0..2, true, None)
        .expect("valid call");
    assert_eq!(out.frames, 2);
    assert_eq!(stream.committed_frames(), 2);
    assert!(out.depth_conf.iter().all(|&c| c >= 1.0));
    // Beyond the 3D RoPE table: a clear error, and the cache is unchanged.
    let mut cfg_short = cfg.clone();
    cfg_short.max_frame_num = 2;
    let short = GctModel::from_store(
        cfg_short.clone(),
        random_store(&cfg_short, 1).expect("random weights"),
    )
    .expect("model");
    let mut s = short
        .new_stream(42, 56, AttentionLayout::Dense)
        .expect("stream");
    short.step(&mut s, &two, 0..2, true, None).expect("fits");
    let err = short
        .step(&mut s, &one, 2..3, true, None)
        .expect_err("past the table");
    assert!(err.to_string().contains("max_frame_num"), "{err}");
    assert_eq!(s.committed_frames(), 2);
}

#[test]
fn config_json_round_trip_and_released_defaults() {
    let cfg = ModelConfig::default();
    assert_eq!((cfg.embed, cfg.heads, cfg.depth), (1024, 16, 24));
    assert_eq!(cfg.taps, vec![4, 11, 17, 23]);
    assert_eq!(
        (cfg.scale_frames, cfg.window, cfg.max_frame_num),
        (8, 64, 1024)
    );
    let back = ModelConfig::from_json_str(&cfg.to_json(), "round trip").expect("parses");
    assert_eq!(back, cfg);
    // A partial file keeps the defaults for what it omits.
    let partial = ModelConfig::from_json_str(r#"{"window": 16}"#, "partial").expect("parses");
    assert_eq!(partial.window, 16);
    assert_eq!(partial.embed, 1024);
}

#[test]
fn image_files_are_composited_resized_and_cropped() {
    use streamrecon::model::preprocess::{PreprocessConfig, load_image};
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = PreprocessConfig {
        width: 28,
        patch: 14,
    };
    // Fully transparent: composited onto white.
    let clear = image::RgbaImage::from_pixel(40, 30, image::Rgba([255, 0, 0, 0]));
    let path = tmp.path().join("clear.png");
    clear.save(&path).expect("png written");
    let f = load_image(&path, &cfg).expect("loads");
    assert_eq!((f.width, f.height), (28, 28));
    assert!(f.data.iter().all(|&v| (v - 1.0).abs() < 1e-6));
    // Opaque red, portrait 30×80: resized to 28×70 (28·80/30/14 = 5.33 → 5 patches) and
    // centre-cropped to 28 rows.
    let red = image::RgbaImage::from_pixel(30, 80, image::Rgba([255, 0, 0, 255]));
    let path = tmp.path().join("red.png");
    red.save(&path).expect("png written");
    let f = load_image(&path, &cfg).expect("loads");
    assert_eq!((f.width, f.height), (28, 28));
    let plane = 28 * 28;
    assert!(f.data[..plane].iter().all(|&v| (v - 1.0).abs() < 1e-6));
    assert!(f.data[plane..].iter().all(|&v| v.abs() < 1e-6));
    // Not an image: an error naming the file.
    let path = tmp.path().join("nothing.png");
    std::fs::write(&path, b"not a png").expect("written");
    let err = load_image(&path, &cfg).expect_err("garbage");
    assert!(err.to_string().contains("nothing.png"), "{err}");
}
