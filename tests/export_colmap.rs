//! The COLMAP export read back by a parser written here from COLMAP's binary layout (as
//! `read_write_model.py` and `reconstruction_io.cc` read it, no code shared with the writer),
//! and checked with the folder expectations of 3D Gaussian Splatting's loader.

use std::path::{Path, PathBuf};

use glam::{Mat4, Quat, Vec3};
use streamrecon::frame::{FramePoints, FrameResult, FrameType, Intrinsics, RgbImage};
use streamrecon::model::preprocess::{PreprocessConfig, preprocess_rgb8};
use streamrecon::record::export::colmap::{self, ColmapOptions, ImageMode};
use streamrecon::record::export::{CloudOptions, gather_cloud};
use streamrecon::record::sample::sample_result;
use streamrecon::record::{Notice, SessionReader, SessionWriter};

// ---------------------------------------------------------------- a spec-faithful reader

struct Bytes<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Bytes<'a> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let out: [u8; N] = self.b[self.at..self.at + N].try_into().expect("truncated");
        self.at += N;
        out
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }
    fn f64(&mut self) -> f64 {
        f64::from_le_bytes(self.take())
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn cstr(&mut self) -> String {
        let end = self.b[self.at..].iter().position(|&c| c == 0).expect("NUL");
        let s = String::from_utf8(self.b[self.at..self.at + end].to_vec()).expect("utf-8");
        self.at += end + 1;
        s
    }
    fn done(&self) -> bool {
        self.at == self.b.len()
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Cam {
    id: i32,
    model: i32,
    width: u64,
    height: u64,
    params: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq)]
struct Img {
    id: i32,
    q: [f64; 4],
    t: [f64; 3],
    camera: i32,
    name: String,
    points2d: Vec<(f64, f64, i64)>,
}

#[derive(Debug, Clone, PartialEq)]
struct Pt {
    id: u64,
    xyz: [f64; 3],
    rgb: [u8; 3],
    error: f64,
    track: Vec<(i32, i32)>,
}

struct Parsed {
    cameras: Vec<Cam>,
    images: Vec<Img>,
    points: Vec<Pt>,
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse_binary(sparse: &Path) -> Parsed {
    let bytes = read(&sparse.join("cameras.bin"));
    let mut r = Bytes { b: &bytes, at: 0 };
    let cameras = (0..r.u64())
        .map(|_| {
            let (id, model, width, height) = (r.i32(), r.i32(), r.u64(), r.u64());
            // PINHOLE (model 1) has fx fy cx cy; no other model is written.
            assert_eq!(model, 1);
            Cam {
                id,
                model,
                width,
                height,
                params: (0..4).map(|_| r.f64()).collect(),
            }
        })
        .collect();
    assert!(r.done(), "cameras.bin has trailing bytes");

    let bytes = read(&sparse.join("images.bin"));
    let mut r = Bytes { b: &bytes, at: 0 };
    let images = (0..r.u64())
        .map(|_| {
            let id = r.i32();
            let q = [r.f64(), r.f64(), r.f64(), r.f64()];
            let t = [r.f64(), r.f64(), r.f64()];
            let camera = r.i32();
            let name = r.cstr();
            let n = r.u64();
            let points2d = (0..n).map(|_| (r.f64(), r.f64(), r.i64())).collect();
            Img {
                id,
                q,
                t,
                camera,
                name,
                points2d,
            }
        })
        .collect();
    assert!(r.done(), "images.bin has trailing bytes");

    let bytes = read(&sparse.join("points3D.bin"));
    let mut r = Bytes { b: &bytes, at: 0 };
    let points = (0..r.u64())
        .map(|_| {
            let id = r.u64();
            let xyz = [r.f64(), r.f64(), r.f64()];
            let rgb = [r.u8(), r.u8(), r.u8()];
            let error = r.f64();
            let n = r.u64();
            let track = (0..n).map(|_| (r.i32(), r.i32())).collect();
            Pt {
                id,
                xyz,
                rgb,
                error,
                track,
            }
        })
        .collect();
    assert!(r.done(), "points3D.bin has trailing bytes");
    Parsed {
        cameras,
        images,
        points,
    }
}

/// The same model from COLMAP's text files (`# ` comments, two lines per image).
fn parse_text(sparse: &Path) -> Parsed {
    let lines = |name: &str| -> Vec<String> {
        String::from_utf8(read(&sparse.join(name)))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    };
    let f = |s: &str| s.parse::<f64>().unwrap();
    let cameras = lines("cameras.txt")
        .iter()
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(v[1], "PINHOLE");
            Cam {
                id: v[0].parse().unwrap(),
                model: 1,
                width: v[2].parse().unwrap(),
                height: v[3].parse().unwrap(),
                params: v[4..].iter().map(|s| f(s)).collect(),
            }
        })
        .collect();
    let image_lines = lines("images.txt");
    let images = image_lines
        .chunks(2)
        .map(|pair| {
            let v: Vec<&str> = pair[0].split_whitespace().collect();
            let p: Vec<&str> = pair[1].split_whitespace().collect();
            Img {
                id: v[0].parse().unwrap(),
                q: [f(v[1]), f(v[2]), f(v[3]), f(v[4])],
                t: [f(v[5]), f(v[6]), f(v[7])],
                camera: v[8].parse().unwrap(),
                name: v[9].to_string(),
                points2d: p
                    .chunks(3)
                    .map(|c| (f(c[0]), f(c[1]), c[2].parse().unwrap()))
                    .collect(),
            }
        })
        .collect();
    let points = lines("points3D.txt")
        .iter()
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            Pt {
                id: v[0].parse().unwrap(),
                xyz: [f(v[1]), f(v[2]), f(v[3])],
                rgb: [
                    v[4].parse().unwrap(),
                    v[5].parse().unwrap(),
                    v[6].parse().unwrap(),
                ],
                error: f(v[7]),
                track: v[8..]
                    .chunks(2)
                    .map(|c| (c[0].parse().unwrap(), c[1].parse().unwrap()))
                    .collect(),
            }
        })
        .collect();
    Parsed {
        cameras,
        images,
        points,
    }
}

/// COLMAP's rotation of a (w, x, y, z) quaternion.
fn rotation(q: [f64; 4]) -> [[f64; 3]; 3] {
    let [w, x, y, z] = q;
    [
        [
            1.0 - 2.0 * (y * y + z * z),
            2.0 * (x * y - w * z),
            2.0 * (x * z + w * y),
        ],
        [
            2.0 * (x * y + w * z),
            1.0 - 2.0 * (x * x + z * z),
            2.0 * (y * z - w * x),
        ],
        [
            2.0 * (x * z - w * y),
            2.0 * (y * z + w * x),
            1.0 - 2.0 * (x * x + y * y),
        ],
    ]
}

/// Projects a world point through an image's pose and its PINHOLE camera, as COLMAP does.
fn project(cam: &Cam, img: &Img, world: [f64; 3]) -> (f64, f64) {
    let r = rotation(img.q);
    let c: Vec<f64> = (0..3)
        .map(|row| (0..3).map(|k| r[row][k] * world[k]).sum::<f64>() + img.t[row])
        .collect();
    let (fx, fy, cx, cy) = (cam.params[0], cam.params[1], cam.params[2], cam.params[3]);
    (fx * c[0] / c[2] + cx, fy * c[1] / c[2] + cy)
}

/// What 3DGS's `readColmapSceneInfo` needs: `sparse/0/` with the three files, and every image
/// named in `images.bin` in `images/`, readable at its camera's size.
fn check_3dgs_layout(dir: &Path, model: &Parsed) {
    let sparse = dir.join("sparse/0");
    for f in ["cameras.bin", "images.bin", "points3D.bin"] {
        assert!(sparse.join(f).is_file(), "{f} missing in sparse/0");
    }
    for img in &model.images {
        let path = dir.join("images").join(&img.name);
        let (w, h) =
            image::image_dimensions(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let cam = model.cameras.iter().find(|c| c.id == img.camera).unwrap();
        assert_eq!((u64::from(w), u64::from(h)), (cam.width, cam.height));
    }
}

/// Every point has a track of one observation whose image lists it back at its projection.
fn check_tracks(model: &Parsed) {
    for p in &model.points {
        assert_eq!(p.track.len(), 1, "point {}", p.id);
        let (image_id, idx) = p.track[0];
        let img = model.images.iter().find(|i| i.id == image_id).unwrap();
        let cam = model.cameras.iter().find(|c| c.id == img.camera).unwrap();
        let (x, y, back) = img.points2d[idx as usize];
        assert_eq!(
            back, p.id as i64,
            "image {image_id} names point {} back",
            p.id
        );
        let (u, v) = project(cam, img, p.xyz);
        assert!(
            (u - x).abs() < 1e-6 && (v - y).abs() < 1e-6,
            "{u} {v} vs {x} {y}"
        );
        assert!(x >= 0.0 && x < cam.width as f64 && y >= 0.0 && y < cam.height as f64);
        assert!(p.error >= 0.0);
    }
    let listed: usize = model.images.iter().map(|i| i.points2d.len()).sum();
    assert_eq!(
        listed,
        model.points.len(),
        "no 2D point without its 3D point"
    );
}

// ---------------------------------------------------------------- sessions made here

fn reader_of(results: &[FrameResult], notices: &[(usize, &str)]) -> SessionReader {
    let mut w = SessionWriter::new(Vec::new(), "colmap.srec", &serde_json::json!({})).unwrap();
    for (i, r) in results.iter().enumerate() {
        for (_, m) in notices.iter().filter(|(at, _)| *at == i) {
            w.write_notice(&Notice {
                message: m.to_string(),
                results_not_recorded: 0,
                first_frame: None,
                last_frame: None,
                t_s: 0.0,
            })
            .unwrap();
        }
        w.write_frame(r, 0.1 * i as f64).unwrap();
    }
    SessionReader::from_bytes("colmap.srec", w.finish().unwrap()).unwrap()
}

/// Frame `i` of the sample camera with `n` points its depth would give: inside its view.
fn frame_with_points(i: u64, n: usize) -> FrameResult {
    let mut r = sample_result(i, 16, 12, n);
    let k = r.intrinsics;
    for (j, p) in r.points.xyz.iter_mut().enumerate() {
        let (u, v) = ((j * 7 % 16) as f32 + 0.3, (j * 5 % 12) as f32 + 0.2);
        let depth = 1.0 + (j % 5) as f32 * 0.4;
        let cam = Vec3::new((u - k.cx) / k.fx * depth, (v - k.cy) / k.fy * depth, depth);
        *p = r.world_from_camera.transform_point3(cam).to_array();
    }
    r
}

fn all_points() -> CloudOptions {
    CloudOptions {
        min_confidence: 0.0,
        voxel: None,
        normals: false,
    }
}

fn export(reader: &SessionReader, dir: &Path, options: &ColmapOptions) -> colmap::ColmapReport {
    let cloud = gather_cloud(reader, all_points()).unwrap();
    colmap::export_colmap(dir, reader, 0..reader.frames().len(), &cloud, options).unwrap()
}

#[test]
fn binary_model_reads_back_with_one_observation_per_point_and_a_cap() {
    let results: Vec<FrameResult> = (0..3).map(|i| frame_with_points(i, 60)).collect();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("colmap");
    let cap = 70;
    let report = export(
        &reader,
        &out,
        &ColmapOptions {
            text: false,
            images: ImageMode::Model,
            max_points: cap,
            ..ColmapOptions::default()
        },
    );
    let model = parse_binary(&out.join("sparse/0"));
    assert_eq!(model.images.len(), 3);
    assert_eq!(model.cameras.len(), 3);
    check_tracks(&model);
    check_3dgs_layout(&out, &model);
    assert_eq!(model.points.len(), report.points);
    assert!(model.points.len() <= cap);
    assert_eq!(report.points_unseen, 0, "{report:?}");
    assert_eq!(report.points + report.points_over_cap, 180);
    assert!(report.points_over_cap > 0, "{report:?}");
    // The kept points are the most confident: none left out is above the least kept.
    let cloud = gather_cloud(&reader, all_points()).unwrap();
    let kept: Vec<[f64; 3]> = model.points.iter().map(|p| p.xyz).collect();
    let least_kept = (0..cloud.len())
        .filter(|&k| kept.contains(&cloud.xyz[k].map(f64::from)))
        .map(|k| cloud.confidence[k])
        .fold(f32::INFINITY, f32::min);
    let most_left = (0..cloud.len())
        .filter(|&k| !kept.contains(&cloud.xyz[k].map(f64::from)))
        .map(|k| cloud.confidence[k])
        .fold(f32::NEG_INFINITY, f32::max);
    assert!(least_kept >= most_left, "{least_kept} < {most_left}");
    // The model's input images: cameras at its size; poses are the session's.
    for (i, r) in results.iter().enumerate() {
        let (cam, img) = (&model.cameras[i], &model.images[i]);
        assert_eq!((cam.width, cam.height), (16, 12));
        assert_eq!(img.name, colmap::image_name(&r.origin.name));
        let world = [0.3, -0.2, 1.5];
        let (u, v) = project(cam, img, world);
        let p = r
            .camera_from_world
            .transform_point3(Vec3::new(0.3, -0.2, 1.5));
        let k = r.intrinsics;
        assert!((u - f64::from(k.fx * p.x / p.z + k.cx + 0.5)).abs() < 1e-3);
        assert!((v - f64::from(k.fy * p.y / p.z + k.cy + 0.5)).abs() < 1e-3);
    }
}

#[test]
fn text_model_holds_what_the_binary_one_does() {
    let results: Vec<FrameResult> = (0..3).map(|i| frame_with_points(i, 30)).collect();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let (bin, txt) = (dir.path().join("bin"), dir.path().join("txt"));
    let mut options = ColmapOptions {
        images: ImageMode::None,
        ..ColmapOptions::default()
    };
    export(&reader, &bin, &options);
    options.text = true;
    export(&reader, &txt, &options);
    let (b, t) = (
        parse_binary(&bin.join("sparse/0")),
        parse_text(&txt.join("sparse/0")),
    );
    assert!(
        !txt.join("images").exists(),
        "--colmap-images none writes no images"
    );
    // Rust prints f64 so that it parses back to the same bits.
    assert_eq!(b.cameras, t.cameras);
    assert_eq!(b.images, t.images);
    assert_eq!(b.points, t.points);
    // None: cameras at the size as captured (sample frames record twice their input size),
    // named after their sources.
    assert_eq!((b.cameras[0].width, b.cameras[0].height), (32, 24));
    assert_eq!(b.images[1].name, results[1].origin.name);
    check_tracks(&b);
}

/// A frame captured at `captured`, run through the real preprocessing: its model input and a
/// camera (any intrinsics on that input) posed at `world_from_camera`.
fn preprocessed_frame(
    i: u64,
    captured: (u32, u32),
    marker: (u32, u32),
    world_from_camera: Mat4,
) -> (FrameResult, (f64, f64)) {
    let (w, h) = captured;
    let mut rgb = vec![20u8; (w * h * 3) as usize];
    // A bright 9×9 square centred on `marker`.
    for y in marker.1 - 4..=marker.1 + 4 {
        for x in marker.0 - 4..=marker.0 + 4 {
            let k = ((y * w + x) * 3) as usize;
            rgb[k..k + 3].copy_from_slice(&[250, 250, 250]);
        }
    }
    let input = preprocess_rgb8(&rgb, w as usize, h as usize, &PreprocessConfig::default())
        .unwrap()
        .to_rgb8();
    // The marker's centre in the input: the brightness-weighted centroid (pixel centres at
    // integers, as the model's intrinsics count them).
    let (mut sx, mut sy, mut sw) = (0.0, 0.0, 0.0);
    for y in 0..input.height {
        for x in 0..input.width {
            let v = f64::from(input.data[((y * input.width + x) * 3) as usize]) - 20.0;
            if v > 0.0 {
                sx += v * f64::from(x);
                sy += v * f64::from(y);
                sw += v;
            }
        }
    }
    let in_input = (sx / sw, sy / sw);
    let mut r = sample_result(i, 4, 4, 0);
    r.frame_type = if i < 2 {
        FrameType::Scale
    } else {
        FrameType::Keyframe
    };
    r.origin.name = format!("{i:06}.png");
    r.origin.original_size = Some(captured);
    r.intrinsics = Intrinsics {
        fx: 300.0 + i as f32,
        fy: 310.0,
        cx: input.width as f32 / 2.0 + 7.0,
        cy: input.height as f32 / 2.0 - 5.0,
        width: input.width,
        height: input.height,
    };
    r.world_from_camera = world_from_camera;
    r.camera_from_world = world_from_camera.inverse();
    let n = (input.width * input.height) as usize;
    r.depth = vec![1.0; n];
    r.confidence = vec![1.0; n];
    r.image = RgbImage {
        width: input.width,
        height: input.height,
        data: input.data,
    };
    // The world point seen at the marker, 2.5 in front of the camera.
    let k = r.intrinsics;
    let depth = 2.5;
    let cam = Vec3::new(
        (in_input.0 as f32 - k.cx) / k.fx * depth,
        (in_input.1 as f32 - k.cy) / k.fy * depth,
        depth,
    );
    let world = world_from_camera.transform_point3(cam);
    r.points = FramePoints {
        xyz: vec![world.to_array()],
        rgb: vec![[250, 250, 250]],
        confidence: vec![5.0],
    };
    (r, in_input)
}

#[test]
fn cameras_at_the_captured_size_reproject_onto_the_original_frames() {
    // Landscape (resized only), portrait (resized and centre-cropped: 640×960 → 518×784, 133
    // rows off the top), and an odd size.
    let cases = [
        ((1036, 588), (700, 100)),
        ((640, 960), (100, 700)),
        ((777, 555), (400, 300)),
    ];
    let results: Vec<FrameResult> = cases
        .iter()
        .enumerate()
        .map(|(i, (size, marker))| {
            let pose = Mat4::from_rotation_translation(
                Quat::from_rotation_y(0.2 * i as f32),
                Vec3::new(0.1 * i as f32, -0.05, 0.3),
            );
            preprocessed_frame(i as u64, *size, *marker, pose).0
        })
        .collect();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("colmap");
    let report = export(
        &reader,
        &out,
        &ColmapOptions {
            images: ImageMode::None,
            ..ColmapOptions::default()
        },
    );
    assert_eq!(report.cameras_plain_scale, 0, "{report:?}");
    let model = parse_binary(&out.join("sparse/0"));
    assert_eq!(model.points.len(), 3, "{report:?} {:?}", model.points);
    for (i, (size, marker)) in cases.iter().enumerate() {
        let (cam, img) = (&model.cameras[i], &model.images[i]);
        assert_eq!(
            (cam.width, cam.height),
            (u64::from(size.0), u64::from(size.1))
        );
        // The marker's point, projected through the exported camera, lands on the marker in
        // the captured frame (its centre pixel's centre: +0.5 in COLMAP's convention), within
        // what resampling moves a centroid.
        let (u, v) = project(cam, img, model.points[i].xyz);
        let (x, y) = (f64::from(marker.0) + 0.5, f64::from(marker.1) + 0.5);
        assert!(
            (u - x).abs() < 0.5 && (v - y).abs() < 0.5,
            "frame {i}: ({u}, {v}) for the marker at ({x}, {y})"
        );
    }
}

fn write_originals(dir: &Path, results: &[FrameResult]) {
    std::fs::create_dir_all(dir).unwrap();
    for r in results {
        let (w, h) = r.origin.original_size.unwrap();
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 9]));
        img.save(dir.join(&r.origin.name)).unwrap();
    }
}

#[test]
fn original_frames_are_linked_under_their_names_and_checked() {
    let results: Vec<FrameResult> = (0..3).map(|i| sample_result(i, 16, 12, 20)).collect();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames");
    write_originals(&frames, &results);
    let out = dir.path().join("colmap");
    let options = ColmapOptions {
        images: ImageMode::Original(frames.clone()),
        ..ColmapOptions::default()
    };
    let report = export(&reader, &out, &options);
    assert_eq!(report.images_linked + report.images_copied, 3);
    let model = parse_binary(&out.join("sparse/0"));
    check_3dgs_layout(&out, &model);
    for (img, r) in model.images.iter().zip(&results) {
        assert_eq!(img.name, r.origin.name);
        assert_eq!(
            read(&out.join("images").join(&img.name)),
            read(&frames.join(&r.origin.name)),
            "the user's own frame, byte for byte"
        );
    }

    // A frame of another size, then a missing one: refused, naming the file; nothing written.
    let cloud = gather_cloud(&reader, all_points()).unwrap();
    let wrong = dir.path().join("colmap2");
    image::RgbImage::new(5, 5)
        .save(frames.join(&results[1].origin.name))
        .unwrap();
    let err = colmap::export_colmap(&wrong, &reader, 0..3, &cloud, &options).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&results[1].origin.name) && text.contains("5×5"),
        "{text}"
    );
    std::fs::remove_file(frames.join(&results[1].origin.name)).unwrap();
    let err = colmap::export_colmap(&wrong, &reader, 0..3, &cloud, &options).unwrap_err();
    assert!(err.to_string().contains("cannot be read"), "{err}");
    assert!(!wrong.exists());
}

#[test]
fn stream_frames_have_no_original_files_to_copy() {
    let mut results: Vec<FrameResult> = (0..2).map(|i| sample_result(i, 16, 12, 5)).collect();
    results[1].origin.name = "clip.mp4#frame_000001".into();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let cloud = gather_cloud(&reader, all_points()).unwrap();
    let options = ColmapOptions {
        images: ImageMode::Original(dir.path().to_path_buf()),
        ..ColmapOptions::default()
    };
    let err =
        colmap::export_colmap(&dir.path().join("c"), &reader, 0..2, &cloud, &options).unwrap_err();
    assert!(err.to_string().contains("clip.mp4#frame_000001"), "{err}");
}

pub fn shared_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn streamrecon(args: &[&str], cwd: &Path) -> std::process::Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the streamrecon binary runs");
    assert!(
        out.status.success(),
        "streamrecon {args:?}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn courthouse_session_exports_a_model_of_its_own_frames() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("session");
    // The input as a relative path: the session records where it is, so an export from
    // another folder still finds the frames.
    streamrecon(
        &[
            "run",
            "--headless",
            "--input",
            "../shared/sequences/courthouse",
            "--out",
            session.to_str().unwrap(),
            "--weights",
            "../shared/fixtures/gct-tiny/weights.safetensors",
            "--model-config",
            "../shared/fixtures/gct-tiny/kf1/config.json",
        ],
        root,
    );
    let out = dir.path().join("colmap");
    let export = streamrecon(
        &["export", "session", "--colmap", out.to_str().unwrap()],
        dir.path(),
    );
    let stdout = String::from_utf8_lossy(&export.stdout);
    assert!(stdout.contains("the original frames from"), "{stdout}");

    let model = parse_binary(&out.join("sparse/0"));
    check_3dgs_layout(&out, &model);
    check_tracks(&model);
    let courthouse = shared_path("shared/sequences/courthouse");
    let mut names: Vec<String> = std::fs::read_dir(&courthouse)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".png"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 48);
    assert_eq!(model.images.len(), 48, "48 posed images");
    let got: Vec<&str> = model.images.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(got, names, "under the sources' own names, in stream order");
    for (cam, img) in model.cameras.iter().zip(&model.images) {
        assert_eq!((cam.width, cam.height), (518, 294), "the original size");
        assert!(cam.params.iter().all(|p| p.is_finite()) && cam.params[0] > 0.0);
        let n: f64 = img.q.iter().map(|v| v * v).sum();
        assert!((n - 1.0).abs() < 1e-6, "a unit rotation");
        assert_eq!(
            read(&out.join("images").join(&img.name)),
            read(&courthouse.join(&img.name)),
        );
    }
    assert!(!model.points.is_empty() && model.points.len() <= 100_000);
}

fn session_file(dir: &Path, results: &[FrameResult], notices: &[(usize, &str)]) -> PathBuf {
    let mut w = SessionWriter::new(Vec::new(), "s.srec", &serde_json::json!({})).unwrap();
    for (i, r) in results.iter().enumerate() {
        for (_, m) in notices.iter().filter(|(at, _)| *at == i) {
            w.write_notice(&Notice {
                message: m.to_string(),
                results_not_recorded: 0,
                first_frame: None,
                last_frame: None,
                t_s: 0.0,
            })
            .unwrap();
        }
        w.write_frame(r, 0.1 * i as f64).unwrap();
    }
    let path = dir.join("s.srec");
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path
}

fn streamrecon_fails(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_streamrecon"))
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn images_from_names_the_folder_and_a_frame_that_does_not_match() {
    let results: Vec<FrameResult> = (0..3).map(|i| frame_with_points(i, 10)).collect();
    let dir = tempfile::tempdir().unwrap();
    let s = session_file(dir.path(), &results, &[]);
    let frames = dir.path().join("frames");
    write_originals(&frames, &results);
    let out = dir.path().join("colmap");
    let o = streamrecon(
        &[
            "export",
            s.to_str().unwrap(),
            "--colmap",
            out.to_str().unwrap(),
            "--images-from",
            frames.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("the original frames from"));
    let model = parse_binary(&out.join("sparse/0"));
    check_3dgs_layout(&out, &model);
    assert_eq!((model.cameras[0].width, model.cameras[0].height), (32, 24));

    // Without a known folder, `original` says what to give.
    let err = streamrecon_fails(&[
        "export",
        s.to_str().unwrap(),
        "--colmap",
        dir.path().join("c2").to_str().unwrap(),
        "--colmap-images",
        "original",
    ]);
    assert!(err.contains("--images-from"), "{err}");
    // Another folder's frames: refused, naming the file.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    image::RgbImage::new(7, 3)
        .save(other.join(&results[0].origin.name))
        .unwrap();
    let err = streamrecon_fails(&[
        "export",
        s.to_str().unwrap(),
        "--colmap",
        dir.path().join("c3").to_str().unwrap(),
        "--images-from",
        other.to_str().unwrap(),
    ]);
    assert!(
        err.contains(&results[0].origin.name) && err.contains("7×3"),
        "{err}"
    );
    assert!(!dir.path().join("c3").exists());
}

/// Frames 0..5 one model session, then a reset and 5..8 a second one (scale frames first).
fn two_sessions() -> Vec<FrameResult> {
    (0..8)
        .map(|i| {
            let mut r = frame_with_points(i, 10);
            r.frame_type = match i {
                0 | 1 | 5 | 6 => FrameType::Scale,
                _ => FrameType::Keyframe,
            };
            r
        })
        .collect()
}

#[test]
fn a_recording_with_a_reset_is_two_model_sessions_never_one() {
    use streamrecon::record::export::sessions::model_sessions;
    let results = two_sessions();
    let reader = reader_of(&results, &[(5, "session reset: requested")]);
    assert_eq!(model_sessions(&reader), vec![0..5, 5..8]);
    // The scale frames alone mark the start too (a notice lost with the recorder behind).
    let reader = reader_of(&results, &[]);
    assert_eq!(model_sessions(&reader), vec![0..5, 5..8]);
    // A reset noted before any frame of the new session's scale call: still split there.
    let mut flat = two_sessions();
    for r in &mut flat {
        r.frame_type = FrameType::Keyframe;
    }
    let reader = reader_of(&flat, &[(3, "session reset: keyframe budget spent")]);
    assert_eq!(model_sessions(&reader), vec![0..3, 3..8]);
    // Other notices split nothing.
    let reader = reader_of(
        &flat,
        &[(3, "recorder fell behind: 2 results not recorded")],
    );
    assert_eq!(model_sessions(&reader), vec![0..8]);

    let dir = tempfile::tempdir().unwrap();
    let s = session_file(dir.path(), &results, &[(5, "session reset: requested")]);
    let s = s.to_str().unwrap();
    let p = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let o = streamrecon(
        &[
            "export",
            s,
            "--ply",
            &p("cloud.ply"),
            "--tum",
            &p("traj.txt"),
            "--colmap",
            &p("colmap"),
        ],
        dir.path(),
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("2 model sessions"), "{stdout}");
    assert!(!dir.path().join("cloud.ply").exists(), "no merged cloud");
    for (n, frames) in [(1, 5), (2, 3)] {
        let traj = std::fs::read_to_string(p(&format!("traj-session-{n}.txt"))).unwrap();
        assert_eq!(traj.lines().filter(|l| !l.starts_with('#')).count(), frames);
        let model = parse_binary(&dir.path().join(format!("colmap-session-{n}/sparse/0")));
        assert_eq!(model.images.len(), frames);
        check_tracks(&model);
        let ply = std::fs::read(p(&format!("cloud-session-{n}.ply"))).unwrap();
        let header = String::from_utf8_lossy(&ply[..200]).into_owned();
        assert!(
            header.contains(&format!("element vertex {}", frames * 10)),
            "{header}"
        );
    }
    // --session N: that one alone, under the names given.
    streamrecon(
        &["export", s, "--session", "2", "--tum", &p("only.txt")],
        dir.path(),
    );
    let only = std::fs::read_to_string(p("only.txt")).unwrap();
    assert_eq!(only.lines().filter(|l| !l.starts_with('#')).count(), 3);
    let err = streamrecon_fails(&["export", s, "--session", "3", "--tum", &p("x.txt")]);
    assert!(err.contains("2 model session"), "{err}");
}

#[test]
fn an_up_axis_turns_the_colmap_world_with_the_cloud() {
    use streamrecon::record::export::Up;
    let results: Vec<FrameResult> = (0..3).map(|i| frame_with_points(i, 20)).collect();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let mut models = Vec::new();
    for up in [Up::NegY, Up::Z, Up::Y] {
        let mut cloud = gather_cloud(&reader, all_points()).unwrap();
        up.cloud(&mut cloud);
        let out = dir.path().join(up.name());
        let options = ColmapOptions {
            images: ImageMode::None,
            up,
            ..ColmapOptions::default()
        };
        colmap::export_colmap(&out, &reader, 0..3, &cloud, &options).unwrap();
        let model = parse_binary(&out.join("sparse/0"));
        check_tracks(&model);
        models.push(model);
    }
    // The same pixels, from turned points through turned poses; the points themselves moved.
    let base = &models[0];
    for m in &models[1..] {
        for (a, b) in base.images.iter().zip(&m.images) {
            assert_eq!(a.points2d.len(), b.points2d.len());
            for (p, q) in a.points2d.iter().zip(&b.points2d) {
                // The pose goes through a quaternion: a few 1e-6 px of rounding apart.
                assert!(
                    (p.0 - q.0).abs() < 1e-3 && (p.1 - q.1).abs() < 1e-3,
                    "{p:?} {q:?}"
                );
            }
        }
        assert!(base.points[0].xyz != m.points[0].xyz);
    }
    // z up: (x, y, z) → (x, z, −y).
    let (p, q) = (base.points[0].xyz, models[1].points[0].xyz);
    assert!((q[0] - p[0]).abs() < 1e-6 && (q[1] - p[2]).abs() < 1e-6 && (q[2] + p[1]).abs() < 1e-6);
}

#[test]
fn nerfstudio_transforms_see_the_points_where_colmap_does() {
    use streamrecon::record::export::nerfstudio::export_nerfstudio;
    let results: Vec<FrameResult> = (0..3).map(|i| frame_with_points(i, 20)).collect();
    let reader = reader_of(&results, &[]);
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames");
    write_originals(&frames, &results);
    let options = ColmapOptions {
        images: ImageMode::Original(frames),
        ..ColmapOptions::default()
    };
    let cm = dir.path().join("colmap");
    export(&reader, &cm, &options);
    let model = parse_binary(&cm.join("sparse/0"));
    let ns = dir.path().join("ns");
    let report = export_nerfstudio(&ns, &reader, 0..3, &options).unwrap();
    assert_eq!(report.images, 3);
    let t: serde_json::Value = serde_json::from_slice(&read(&ns.join("transforms.json"))).unwrap();
    assert_eq!(t["camera_model"], "OPENCV");
    let entries = t["frames"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    for (f, (img, cam)) in entries.iter().zip(model.images.iter().zip(&model.cameras)) {
        let file = ns.join(f["file_path"].as_str().unwrap());
        assert!(file.is_file(), "{}", file.display());
        assert_eq!(f["file_path"], format!("images/{}", img.name));
        assert_eq!(f["w"].as_u64().unwrap(), cam.width);
        let m: Vec<Vec<f64>> = f["transform_matrix"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(m[3], vec![0.0, 0.0, 0.0, 1.0]);
        // Invert the rigid camera-to-world (OpenGL axes) and project as nerfstudio does.
        for p in model.points.iter().filter(|p| p.track[0].0 == img.id) {
            let d: Vec<f64> = (0..3).map(|r| p.xyz[r] - m[r][3]).collect();
            let c: Vec<f64> = (0..3)
                .map(|k| (0..3).map(|r| m[r][k] * d[r]).sum())
                .collect();
            let (x, y, z) = (c[0], -c[1], -c[2]);
            let u = f["fl_x"].as_f64().unwrap() * x / z + f["cx"].as_f64().unwrap();
            let v = f["fl_y"].as_f64().unwrap() * y / z + f["cy"].as_f64().unwrap();
            let (cu, cv) = project(cam, img, p.xyz);
            assert!(
                (u - cu).abs() < 1e-6 && (v - cv).abs() < 1e-6,
                "{u} {v} vs {cu} {cv}"
            );
        }
    }
}
