//! One world frame for every export: the PLY, GLB, TUM and COLMAP files of one session hold the
//! same point at the same coordinates (by default the model's frame; `--up` turns all alike),
//! and the GLB overlays the PLY once Blender's glTF importer has turned y-up into z-up.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use glam::{Mat3, Quat, Vec3};
use streamrecon::record::sample::sample_result;
use streamrecon::record::{RecorderOptions, SESSION_FILE, SessionRecorder};

fn record(dir: &Path) -> Vec<streamrecon::frame::FrameResult> {
    let rec = SessionRecorder::create(
        dir.join(SESSION_FILE),
        &serde_json::json!({}),
        RecorderOptions::default(),
    )
    .unwrap();
    let results: Vec<_> = (0..3).map(|i| sample_result(i, 16, 12, 25)).collect();
    for r in &results {
        rec.offer(Arc::new(r.clone()));
    }
    rec.finish();
    results
}

fn ply_xyz(path: &Path) -> Vec<Vec3> {
    use ply_rs::ply::{DefaultElement, Property};
    let mut f = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let ply = ply_rs::parser::Parser::<DefaultElement>::new()
        .read_ply(&mut f)
        .unwrap();
    ply.payload["vertex"]
        .iter()
        .map(|v| {
            let f = |k: &str| match v[k] {
                Property::Float(x) => x,
                _ => panic!("{k}"),
            };
            Vec3::new(f("x"), f("y"), f("z"))
        })
        .collect()
}

/// The GLB's cloud as Blender places it: each vertex through the node transforms into glTF's
/// y-up scene, then glTF (x, y, z) → Blender (x, −z, y), as its importer converts.
fn glb_in_blender(path: &Path) -> Vec<Vec3> {
    let gltf = gltf::Gltf::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let blob = gltf.blob.clone().expect("a BIN chunk");
    let scene = gltf.document.default_scene().unwrap();
    let mut out = Vec::new();
    fn walk(node: gltf::Node, parent: glam::Mat4, blob: &[u8], out: &mut Vec<Vec3>) {
        let m = parent * glam::Mat4::from_cols_array_2d(&node.transform().matrix());
        if let Some(mesh) = node.mesh() {
            for prim in mesh.primitives() {
                if prim.mode() == gltf::mesh::Mode::Points {
                    let read = prim.reader(|_| Some(blob));
                    for p in read.read_positions().unwrap() {
                        let g = m.transform_point3(Vec3::from(p));
                        out.push(Vec3::new(g.x, -g.z, g.y));
                    }
                }
            }
        }
        for child in node.children() {
            walk(child, m, blob, out);
        }
    }
    for node in scene.nodes() {
        walk(node, glam::Mat4::IDENTITY, &blob, &mut out);
    }
    out
}

fn tum_centres(path: &Path) -> Vec<(Vec3, Quat)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let v: Vec<f32> = l
                .split_whitespace()
                .skip(1)
                .map(|s| s.parse().unwrap())
                .collect();
            (
                Vec3::new(v[0], v[1], v[2]),
                Quat::from_xyzw(v[3], v[4], v[5], v[6]),
            )
        })
        .collect()
}

fn export(session: &Path, out: &Path, up: &str) {
    let p = |n: &str| out.join(n).to_string_lossy().into_owned();
    let o = Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .args([
            "export",
            session.to_str().unwrap(),
            "--ply",
            &p("c.ply"),
            "--glb",
            &p("s.glb"),
            "--tum",
            &p("t.txt"),
            "--up",
            up,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn every_export_shares_one_world_and_up_turns_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let results = record(dir.path());
    let (model, turned) = (dir.path().join("model"), dir.path().join("z"));
    export(dir.path(), &model, "-y");
    export(dir.path(), &turned, "z");

    // Default: the model's own coordinates, in the PLY, the GLB (in Blender) and the TUM file.
    let ply = ply_xyz(&model.join("c.ply"));
    let glb = glb_in_blender(&model.join("s.glb"));
    assert_eq!(ply.len(), 75);
    assert_eq!(glb.len(), ply.len());
    for (a, b) in ply.iter().zip(&glb) {
        assert!(a.abs_diff_eq(*b, 1e-5), "PLY {a} vs GLB in Blender {b}");
    }
    let recorded: Vec<Vec3> = results
        .iter()
        .flat_map(|r| r.points.xyz.iter().map(|p| Vec3::from(*p)))
        .collect();
    assert_eq!(ply, recorded, "the model's frame, untouched");
    for ((c, _), r) in tum_centres(&model.join("t.txt")).iter().zip(&results) {
        assert!(c.abs_diff_eq(r.camera_position(), 1e-5));
    }

    // --up z: (x, y, z) → (x, z, −y) in every file; the model's up (−y) is +z.
    let r = Mat3::from_cols(Vec3::X, Vec3::new(0.0, 0.0, -1.0), Vec3::Y);
    let ply_z = ply_xyz(&turned.join("c.ply"));
    let glb_z = glb_in_blender(&turned.join("s.glb"));
    for ((a, b), p) in ply_z.iter().zip(&glb_z).zip(&recorded) {
        assert!(a.abs_diff_eq(r * *p, 1e-5));
        assert!(a.abs_diff_eq(*b, 1e-5));
    }
    let tum_z = tum_centres(&turned.join("t.txt"));
    for ((c, q), res) in tum_z.iter().zip(&results) {
        assert!(c.abs_diff_eq(r * res.camera_position(), 1e-5));
        // The camera's orientation turns with the world.
        let (_, rot, _) = res.world_from_camera.to_scale_rotation_translation();
        let want = Quat::from_mat3(&r) * rot;
        assert!(q.dot(want).abs() > 1.0 - 1e-5, "{q} vs {want}");
    }
}
