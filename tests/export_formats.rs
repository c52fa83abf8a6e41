//! Exporters, each checked by a reader that shares no code with the writer: ply-rs for PLY,
//! the gltf crate for GLB, and a parser written here from the TUM spec (COLMAP: export_colmap.rs).

use std::collections::HashSet;

use glam::{Mat4, Quat, Vec3};
use streamrecon::frame::FrameResult;
use streamrecon::record::export::{CloudOptions, gather_cloud, glb, ply, tum};
use streamrecon::record::sample::sample_result;
use streamrecon::record::{SessionReader, SessionWriter};

const MIN_CONF: f32 = 2.0;

fn session(frames: u64) -> (SessionReader, Vec<FrameResult>) {
    let mut w = SessionWriter::new(Vec::new(), "export.srec", &serde_json::json!({})).unwrap();
    let results: Vec<FrameResult> = (0..frames).map(|i| sample_result(i, 16, 12, 50)).collect();
    for (i, r) in results.iter().enumerate() {
        w.write_frame(r, 0.25 * i as f64).unwrap();
    }
    let reader = SessionReader::from_bytes("export.srec", w.finish().unwrap()).unwrap();
    (reader, results)
}

/// (xyz, rgb, confidence, frame) of every point at or above the threshold, in session order.
type Point = ([f32; 3], [u8; 3], f32, u32);

fn expected_points(results: &[FrameResult]) -> Vec<Point> {
    let mut out = Vec::new();
    for r in results {
        for k in 0..r.points.len() {
            if r.points.confidence[k] >= MIN_CONF {
                out.push((
                    r.points.xyz[k],
                    r.points.rgb[k],
                    r.points.confidence[k],
                    r.frame as u32,
                ));
            }
        }
    }
    out
}

fn options() -> CloudOptions {
    CloudOptions {
        min_confidence: MIN_CONF,
        voxel: None,
        normals: false,
    }
}

#[test]
fn ply_reads_back_with_ply_rs() {
    use ply_rs::ply::{DefaultElement, Encoding, Property};
    let (reader, results) = session(4);
    let cloud = gather_cloud(&reader, options()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud.ply");
    ply::export_ply(&path, &cloud).unwrap();

    let mut f = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let parsed = ply_rs::parser::Parser::<DefaultElement>::new()
        .read_ply(&mut f)
        .unwrap();
    assert_eq!(parsed.header.encoding, Encoding::BinaryLittleEndian);
    let names: Vec<&String> = parsed.header.elements["vertex"].properties.keys().collect();
    assert_eq!(
        names,
        ["x", "y", "z", "red", "green", "blue", "confidence", "frame"]
    );
    let want = expected_points(&results);
    let got = &parsed.payload["vertex"];
    assert!(want.len() > 20 && want.len() < 200, "{}", want.len());
    assert_eq!(got.len(), want.len());
    for (v, (xyz, rgb, conf, frame)) in got.iter().zip(&want) {
        let float = |k: &str| match v[k] {
            Property::Float(x) => x,
            ref other => panic!("{k}: {other:?}"),
        };
        let uchar = |k: &str| match v[k] {
            Property::UChar(x) => x,
            ref other => panic!("{k}: {other:?}"),
        };
        assert_eq!([float("x"), float("y"), float("z")], *xyz);
        assert_eq!([uchar("red"), uchar("green"), uchar("blue")], *rgb);
        assert_eq!(float("confidence"), *conf);
        // `int`, not `uint`: Open3D's tensor reader drops unsigned properties.
        assert_eq!(v["frame"], Property::Int(*frame as i32));
    }
}

#[test]
fn ply_normals_are_unit_vectors_facing_their_camera() {
    use ply_rs::ply::{DefaultElement, Property};
    let (reader, results) = session(3);
    let cloud = gather_cloud(
        &reader,
        CloudOptions {
            normals: true,
            ..options()
        },
    )
    .unwrap();
    let mut bytes = Vec::new();
    ply::write_ply(&mut bytes, &cloud).unwrap();
    let parsed = ply_rs::parser::Parser::<DefaultElement>::new()
        .read_ply(&mut bytes.as_slice())
        .unwrap();
    let names: Vec<&String> = parsed.header.elements["vertex"].properties.keys().collect();
    assert_eq!(
        names,
        [
            "x",
            "y",
            "z",
            "nx",
            "ny",
            "nz",
            "red",
            "green",
            "blue",
            "confidence",
            "frame"
        ]
    );
    let want = expected_points(&results);
    let got = &parsed.payload["vertex"];
    assert_eq!(got.len(), want.len());
    for (v, (xyz, _, _, frame)) in got.iter().zip(&want) {
        let float = |k: &str| match v[k] {
            Property::Float(x) => x,
            ref other => panic!("{k}: {other:?}"),
        };
        let n = Vec3::new(float("nx"), float("ny"), float("nz"));
        assert!((n.length() - 1.0).abs() < 1e-5, "{n}");
        let centre = results[*frame as usize].camera_position();
        assert!(n.dot(centre - Vec3::from(*xyz)) >= 0.0, "faces its camera");
    }
}

#[test]
fn voxel_downsampling_keeps_one_point_per_occupied_voxel() {
    let (reader, results) = session(4);
    let size = 0.5f32;
    let cloud = gather_cloud(
        &reader,
        CloudOptions {
            min_confidence: MIN_CONF,
            voxel: Some(size),
            normals: false,
        },
    )
    .unwrap();
    let key = |p: [f32; 3]| p.map(|v| (v / size).floor() as i64);
    let want = expected_points(&results);
    let voxels: HashSet<[i64; 3]> = want.iter().map(|p| key(p.0)).collect();
    assert!(voxels.len() < want.len(), "the test needs shared voxels");
    assert_eq!(cloud.len(), voxels.len());
    let got: HashSet<[i64; 3]> = cloud.xyz.iter().map(|p| key(*p)).collect();
    // A mean of points in a voxel lies in that voxel.
    assert_eq!(got, voxels);
    for k in 0..cloud.len() {
        assert!(cloud.confidence[k] >= MIN_CONF);
    }
}

#[test]
fn tum_trajectory_is_camera_to_world() {
    let (reader, results) = session(5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traj.txt");
    assert_eq!(tum::export_tum(&path, reader.frames()).unwrap(), 5);
    let text = std::fs::read_to_string(&path).unwrap();
    let rows: Vec<Vec<f64>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 5);
    for (i, (row, r)) in rows.iter().zip(&results).enumerate() {
        assert_eq!(row.len(), 8);
        // The frame's capture time, digit for digit (not when it was recorded).
        let stamp = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .nth(i)
            .and_then(|l| l.split_whitespace().next())
            .unwrap();
        assert_eq!(stamp, r.origin.time.seconds_text(), "frame {i}");
        let t = Vec3::new(row[1] as f32, row[2] as f32, row[3] as f32);
        let q = Quat::from_xyzw(row[4] as f32, row[5] as f32, row[6] as f32, row[7] as f32);
        assert!((q.length() - 1.0).abs() < 1e-5);
        let pose = Mat4::from_rotation_translation(q, t);
        assert!(
            pose.abs_diff_eq(r.world_from_camera, 1e-5),
            "frame {i}: {pose} vs {}",
            r.world_from_camera
        );
    }
}

#[test]
fn glb_reads_back_with_the_gltf_crate() {
    use gltf::mesh::Mode;
    let (reader, results) = session(3);
    let cloud = gather_cloud(&reader, options()).unwrap();
    let mut bytes = Vec::new();
    glb::write_glb(&mut bytes, reader.frames(), &cloud, Some(0.2), false).unwrap();
    let parsed = gltf::Gltf::from_slice(&bytes).unwrap();
    let blob = parsed.blob.clone().expect("a BIN chunk");
    let want = expected_points(&results);
    let mut saw = (false, false);
    for mesh in parsed.document.meshes() {
        for prim in mesh.primitives() {
            let read = prim.reader(|_| Some(&blob));
            let positions: Vec<[f32; 3]> = read.read_positions().unwrap().collect();
            match prim.mode() {
                Mode::Points => {
                    saw.0 = true;
                    let colours: Vec<[u8; 4]> =
                        read.read_colors(0).unwrap().into_rgba_u8().collect();
                    assert_eq!(positions.len(), want.len());
                    for ((p, c), (xyz, rgb, _, _)) in positions.iter().zip(&colours).zip(&want) {
                        assert_eq!(p, xyz);
                        assert_eq!(&c[..3], rgb);
                    }
                }
                Mode::Lines => {
                    saw.1 = true;
                    let indices: Vec<u32> = read.read_indices().unwrap().into_u32().collect();
                    assert_eq!(indices.len(), 16 * results.len());
                    assert_eq!(positions.len(), 5 * results.len());
                    for (i, r) in results.iter().enumerate() {
                        let centre = Vec3::from(positions[5 * i]);
                        assert!(centre.abs_diff_eq(r.camera_position(), 1e-5));
                        // Corners sit 0.2 in front of the camera, along its z.
                        let corner = r
                            .camera_from_world
                            .transform_point3(positions[5 * i + 1].into());
                        assert!((corner.z - 0.2).abs() < 1e-4, "{corner}");
                    }
                }
                other => panic!("unexpected primitive mode {other:?}"),
            }
        }
    }
    assert_eq!(saw, (true, true));
    // The cameras mesh names each frustum's frame, source and capture time (the JSON chunk
    // follows the 12-byte GLB header and the chunk's own 8 bytes).
    let json_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let doc: serde_json::Value = serde_json::from_slice(&bytes[20..20 + json_len]).unwrap();
    let cameras = doc["meshes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "cameras")
        .unwrap();
    let frames = cameras["extras"]["frames"].as_array().unwrap();
    assert_eq!(frames.len(), results.len());
    for (f, r) in frames.iter().zip(&results) {
        assert_eq!(f["frame"], r.frame);
        assert_eq!(f["source"], r.origin.name.as_str());
        assert_eq!(f["capture_time"], r.origin.time.seconds_text());
    }
    // An empty session is still a valid file.
    let mut w = SessionWriter::new(Vec::new(), "e", &serde_json::json!({})).unwrap();
    w.flush().unwrap();
    let empty = SessionReader::from_bytes("e", w.finish().unwrap()).unwrap();
    let mut bytes = Vec::new();
    glb::write_glb(&mut bytes, empty.frames(), &Default::default(), None, true).unwrap();
    gltf::Gltf::from_slice(&bytes).unwrap();
}

#[test]
fn depth_maps_come_back_from_their_16_bit_pngs_and_scales() {
    use streamrecon::record::Parts;
    use streamrecon::record::export::depth::{DepthFormat, export_depth};
    let (reader, _) = session(3);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("depth");
    let report = export_depth(&out, &reader, 0..3, reader.frames(), DepthFormat::Png16).unwrap();
    assert_eq!(report.frames, 3);
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("depth.json")).unwrap()).unwrap();
    let frames = doc["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 3);
    for (i, f) in frames.iter().enumerate() {
        let recorded = reader
            .read_frame(
                i,
                Parts {
                    image: false,
                    maps: true,
                },
            )
            .unwrap();
        for (key, values) in [
            ("depth", &recorded.depth),
            ("confidence", &recorded.confidence),
        ] {
            let png = image::open(out.join(f[key].as_str().unwrap())).unwrap();
            let png = png.as_luma16().expect("16-bit grayscale");
            assert_eq!((png.width(), png.height()), (16, 12));
            let scale = f[format!("{key}_scale")].as_f64().unwrap();
            assert!(scale > 0.0);
            for (level, want) in png.pixels().zip(values.iter()) {
                let got = f64::from(level.0[0]) * scale;
                assert!(
                    (got - f64::from(*want)).abs() <= scale * 0.5 + 1e-9,
                    "{key} of frame {i}: {got} vs {want}"
                );
            }
        }
        assert_eq!(f["source"], reader.frames()[i].origin.name.as_str());
    }
}

#[test]
fn glb_cameras_are_one_node_per_keyframe_looking_where_the_frame_did() {
    use streamrecon::frame::FrameType;
    let (reader, results) = session(7);
    let cloud = gather_cloud(&reader, options()).unwrap();
    let mut bytes = Vec::new();
    glb::write_glb(&mut bytes, reader.frames(), &cloud, None, true).unwrap();
    let parsed = gltf::Gltf::from_slice(&bytes).unwrap();
    let keyframes: Vec<&FrameResult> = results
        .iter()
        .filter(|r| r.frame_type != FrameType::NonKeyframe)
        .collect();
    assert!(keyframes.len() >= 3 && keyframes.len() < results.len());
    let nodes: Vec<gltf::Node> = parsed
        .document
        .nodes()
        .filter(|n| n.camera().is_some())
        .collect();
    assert_eq!(nodes.len(), keyframes.len());
    for (node, r) in nodes.iter().zip(&keyframes) {
        let m = Mat4::from_cols_array_2d(&node.transform().matrix());
        assert!(
            m.transform_point3(Vec3::ZERO)
                .abs_diff_eq(r.camera_position(), 1e-5)
        );
        // glTF cameras look down their −z: the frame's optical axis.
        let look = m.transform_vector3(Vec3::NEG_Z);
        let axis = r.world_from_camera.transform_vector3(Vec3::Z);
        assert!(look.abs_diff_eq(axis, 1e-5), "{look} vs {axis}");
        let up = m.transform_vector3(Vec3::Y);
        assert!(up.abs_diff_eq(r.world_from_camera.transform_vector3(Vec3::NEG_Y), 1e-5));
        match node.camera().unwrap().projection() {
            gltf::camera::Projection::Perspective(p) => {
                let k = r.intrinsics;
                let want = 2.0 * (k.height as f32 / (2.0 * k.fy)).atan();
                assert!((p.yfov() - want).abs() < 1e-6);
                assert_eq!(p.aspect_ratio(), Some(k.width as f32 / k.height as f32));
            }
            other => panic!("{other:?}"),
        }
    }
    // Under the root, like the cloud: the same turn applies to both.
    let root = parsed
        .document
        .scenes()
        .next()
        .unwrap()
        .nodes()
        .next()
        .unwrap();
    let children: Vec<usize> = root.children().map(|c| c.index()).collect();
    assert!(nodes.iter().all(|n| children.contains(&n.index())));
}

#[test]
fn depth_npy_files_hold_the_recorded_maps_bit_for_bit() {
    use streamrecon::record::Parts;
    use streamrecon::record::export::depth::{DepthFormat, export_depth};
    let (reader, _) = session(2);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("depth");
    export_depth(&out, &reader, 0..2, reader.frames(), DepthFormat::Npy).unwrap();
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("depth.json")).unwrap()).unwrap();
    for (i, f) in doc["frames"].as_array().unwrap().iter().enumerate() {
        let bytes = std::fs::read(out.join(f["depth"].as_str().unwrap())).unwrap();
        // NumPy's format 1.0: magic, version, u16 header length, the header dict, the data.
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + len) % 64, 0, "data starts 64-byte aligned");
        let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
        assert!(header.contains("'descr': '<f4'"), "{header}");
        assert!(header.contains("'fortran_order': False"), "{header}");
        assert!(header.contains("'shape': (12, 16)"), "{header}");
        assert!(header.ends_with('\n'));
        let values: Vec<f32> = bytes[10 + len..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let recorded = reader
            .read_frame(
                i,
                Parts {
                    image: false,
                    maps: true,
                },
            )
            .unwrap();
        assert_eq!(values, recorded.depth);
    }
}
