//! Image folders (natural order, corrupt files), the synthetic room's geometry against its own
//! ground truth, the bundled sample, and a camera that does not exist.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use glam::{Mat3, Vec3, Vec4};
use streamrecon::capture::synthetic::ROOM_HALF_EXTENTS;
use streamrecon::capture::{
    CameraRequest, CameraSelector, CaptureError, CorruptFilePolicy, ImageFolder, Source,
    SyntheticScene, Webcam, list_cameras,
};

const COURTHOUSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/sequences/courthouse"
);

fn copy_frames(dir: &Path, names: &[(&str, &str)]) {
    for (from, to) in names {
        std::fs::copy(Path::new(COURTHOUSE).join(from), dir.join(to)).unwrap();
    }
}

fn drain(source: &mut dyn Source) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    while let Some(f) = source.next_frame().unwrap() {
        out.push((f.index, f.origin.name));
    }
    out
}

#[test]
fn folder_reads_in_natural_order() {
    let dir = tempfile::tempdir().unwrap();
    copy_frames(
        dir.path(),
        &[
            ("000000.png", "frame10.png"),
            ("000002.png", "frame2.png"),
            ("000004.png", "frame1.PNG"),
        ],
    );
    std::fs::write(dir.path().join("notes.txt"), "not an image").unwrap();
    let mut folder = ImageFolder::open(dir.path(), CorruptFilePolicy::Skip).unwrap();
    assert_eq!(folder.remaining_hint(), Some(3));
    let frames = drain(&mut folder);
    assert_eq!(
        frames,
        vec![
            (0, "frame1.PNG".to_owned()),
            (1, "frame2.png".to_owned()),
            (2, "frame10.png".to_owned())
        ]
    );
}

fn folder_with_corrupt_file() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_frames(
        dir.path(),
        &[("000000.png", "000.png"), ("000002.png", "002.png")],
    );
    // A PNG signature followed by garbage: the decoder must fail on it.
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend(std::iter::repeat_n(0x5a, 300));
    std::fs::write(dir.path().join("001.png"), bytes).unwrap();
    dir
}

#[test]
fn corrupt_file_is_skipped_with_a_warning_naming_it() {
    let dir = folder_with_corrupt_file();
    let mut folder = ImageFolder::open(dir.path(), CorruptFilePolicy::Skip).unwrap();
    let frames = drain(&mut folder);
    assert_eq!(
        frames,
        vec![(0, "000.png".to_owned()), (1, "002.png".to_owned())]
    );
    let warnings = folder.take_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("001.png"), "{}", warnings[0]);
    assert_eq!(folder.skipped(), &[dir.path().join("001.png")]);
}

#[test]
fn corrupt_file_stops_a_strict_run_with_an_error_naming_it() {
    let dir = folder_with_corrupt_file();
    let mut folder = ImageFolder::open(dir.path(), CorruptFilePolicy::Stop).unwrap();
    assert!(folder.next_frame().unwrap().is_some());
    let err = folder.next_frame().unwrap_err();
    assert!(matches!(err, CaptureError::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("001.png"), "{err}");
}

#[test]
fn empty_folder_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = ImageFolder::open(dir.path(), CorruptFilePolicy::Skip)
        .err()
        .unwrap();
    assert!(matches!(err, CaptureError::EmptyFolder(_)), "{err:?}");
}

/// Pixel `(u, v)` with depth `d` in world coordinates, by the model's convention.
fn unproject(view: &streamrecon::capture::SyntheticView, u: usize, v: usize) -> Vec3 {
    let k = view.intrinsics;
    let d = view.depth[v * k.width as usize + u];
    let camera = Vec3::new(
        (u as f32 - k.cx) * d / k.fx,
        (v as f32 - k.cy) * d / k.fy,
        d,
    );
    (view.world_from_camera * camera.extend(1.0)).truncate()
}

#[test]
fn synthetic_depth_lands_on_the_walls() {
    let scene = SyntheticScene {
        width: 64,
        height: 48,
        ..SyntheticScene::default()
    };
    for i in [0, 7, 33] {
        let view = scene.render(i);
        // Poses are rigid.
        let r = Mat3::from_mat4(view.world_from_camera);
        assert!((r.transpose() * r).abs_diff_eq(Mat3::IDENTITY, 1e-5));
        for v in (0..48).step_by(5) {
            for u in (0..64).step_by(5) {
                let p = unproject(&view, u, v);
                let on_wall = (0..3).any(|a| (p[a].abs() - ROOM_HALF_EXTENTS[a]).abs() < 1e-3);
                let inside = (0..3).all(|a| p[a].abs() <= ROOM_HALF_EXTENTS[a] + 1e-3);
                assert!(on_wall && inside, "frame {i} pixel ({u},{v}) → {p}");
            }
        }
    }
}

#[test]
fn synthetic_views_agree_with_each_other() {
    // The room is convex: every wall point in a camera's frustum is visible, so a point seen
    // in one frame must reproject into another with that frame's depth.
    let scene = SyntheticScene {
        width: 80,
        height: 60,
        ..SyntheticScene::default()
    };
    let (a, b) = (scene.render(0), scene.render(6));
    let camera_from_world_b = b.world_from_camera.inverse();
    let k = b.intrinsics;
    let mut checked = 0;
    for v in (0..60).step_by(3) {
        for u in (0..80).step_by(3) {
            let p = unproject(&a, u, v);
            let q: Vec4 = camera_from_world_b * p.extend(1.0);
            let (x, y) = (k.fx * q.x / q.z + k.cx, k.fy * q.y / q.z + k.cy);
            if q.z <= 0.0 || x < 0.0 || y < 0.0 || x >= 79.0 || y >= 59.0 {
                continue;
            }
            // Frame b's depth at the point's sub-pixel position (bilinear; walls are planes,
            // so away from the room's edges this is exact up to the interpolation).
            let (u0, v0) = (x.floor() as usize, y.floor() as usize);
            let (fx, fy) = (x - u0 as f32, y - v0 as f32);
            let at = |uu: usize, vv: usize| b.depth[vv * 80 + uu];
            let corners = [
                at(u0, v0),
                at(u0 + 1, v0),
                at(u0, v0 + 1),
                at(u0 + 1, v0 + 1),
            ];
            let spread = corners.iter().cloned().fold(f32::MIN, f32::max)
                - corners.iter().cloned().fold(f32::MAX, f32::min);
            if spread > 0.05 * q.z {
                continue;
            }
            let depth_b = (corners[0] * (1.0 - fx) + corners[1] * fx) * (1.0 - fy)
                + (corners[2] * (1.0 - fx) + corners[3] * fx) * fy;
            assert!(
                (depth_b - q.z).abs() < 0.01 * q.z,
                "pixel ({u},{v}): depth {} in frame 6, reprojected {}",
                depth_b,
                q.z
            );
            checked += 1;
        }
    }
    assert!(checked > 5, "only {checked} points checked");
    // The camera moved between the two frames.
    let moved = (a.world_from_camera.w_axis - b.world_from_camera.w_axis).length();
    assert!(moved > 0.05, "{moved}");
}

#[test]
fn bundled_sample_is_what_the_generator_makes() {
    let assets = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/synthetic"));
    // Regenerate the sample with `streamrecon run --write-sample assets/synthetic`.
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_owned();
    let scene = streamrecon::capture::synthetic::sample_scene();
    scene
        .write_sample(&dir, streamrecon::capture::synthetic::SAMPLE_FRAMES)
        .unwrap();
    let names: Vec<String> = (0..streamrecon::capture::synthetic::SAMPLE_FRAMES)
        .map(|i| format!("{i:06}.png"))
        .collect();
    for name in &names {
        for sub in ["", "depth"] {
            let ours = image::open(dir.join(sub).join(name)).unwrap().into_rgb16();
            let bundled = image::open(assets.join(sub).join(name))
                .unwrap_or_else(|e| panic!("assets/synthetic/{sub}/{name}: {e}"))
                .into_rgb16();
            assert_eq!(ours.dimensions(), bundled.dimensions());
            // A last-bit difference of sin/cos on another platform may move a pixel by one
            // level; anything more is a changed generator.
            let worst = ours
                .as_raw()
                .iter()
                .zip(bundled.as_raw())
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap_or(0);
            let one_level = if sub.is_empty() { 257 } else { 1 };
            assert!(
                worst <= one_level,
                "{sub}/{name} differs from the generator's output by {worst}"
            );
        }
    }
    let truth = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("ground_truth.json")).unwrap())
            .unwrap()
    };
    let (ours, bundled) = (truth(&dir), truth(&assets));
    assert_eq!(ours["intrinsics"], bundled["intrinsics"]);
    let poses = |t: &serde_json::Value| -> Vec<f64> {
        t["frames"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|f| {
                f["world_from_camera"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (a, b) = (poses(&ours), poses(&bundled));
    assert_eq!(a.len(), b.len());
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
    let total: u64 = walk_size(&assets);
    assert!(total < 400_000, "the bundled sample is {total} bytes");
}

fn walk_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.path().is_dir() {
                walk_size(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}

#[test]
fn a_camera_that_does_not_exist_is_a_clear_error() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let opened = Webcam::open(&CameraRequest {
            selector: CameraSelector::Index(57),
            resolution: Some((640, 480)),
            fps: Some(30),
        });
        if tx.send(opened.err().map(|e| (e.to_string(), e))).is_err() {
            eprintln!("the camera answered after the test stopped waiting (it has failed already)");
        }
    });
    let (message, err) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("opening a missing camera must not hang")
        .expect("camera 57 does not exist, opening it must fail");
    assert!(
        matches!(err, CaptureError::CameraNotFound { .. }),
        "{err:?}"
    );
    assert!(message.contains("webcam:57"), "{message}");
    assert!(message.contains("cameras found:"), "{message}");
    if list_cameras().is_empty() {
        assert!(message.ends_with("cameras found: none"), "{message}");
    }
}

#[test]
fn a_camera_name_that_matches_nothing_is_a_clear_error() {
    let err = Webcam::open(&CameraRequest {
        selector: CameraSelector::Name("no such camera 4f1c".into()),
        resolution: None,
        fps: None,
    })
    .err()
    .expect("no camera has this name");
    assert!(err.to_string().contains("no such camera 4f1c"), "{err}");
}
