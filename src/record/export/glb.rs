//! GLB (binary glTF 2.0): the cloud as one POINTS primitive with COLOR_0, and every camera as a
//! frustum drawn with LINES. The vertices are the export's world coordinates ([`super::Up`]),
//! the same numbers as the PLY's. The root node holds the one fixed turn that glTF's y-up
//! convention asks of z-up data (−90° about x, what Blender's own glTF exporter writes), so
//! Blender's importer, which turns y-up back to z-up, puts every vertex exactly where its PLY
//! importer puts the same point: the PLY and the GLB of one session overlay, whatever `--up`
//! says. With `--up z` both stand upright there and in y-up glTF viewers.

use std::io::{self, Write};
use std::path::Path;

use glam::Vec3;
use serde_json::{Value, json};

use super::Cloud;
use crate::frame::FrameType;
use crate::record::{FrameInfo, RecordError};

const ARRAY_BUFFER: u32 = 34962;
const ELEMENT_ARRAY_BUFFER: u32 = 34963;
const FLOAT: u32 = 5126;
const UNSIGNED_BYTE: u32 = 5121;
const UNSIGNED_INT: u32 = 5125;
const MODE_POINTS: u32 = 0;
const MODE_LINES: u32 = 1;

/// Frustum corners at `depth` for each camera: centre, then four image corners.
fn frustum_vertices(frames: &[FrameInfo], depth: f32) -> Vec<Vec3> {
    let mut out = Vec::with_capacity(frames.len() * 5);
    for info in frames {
        // Without intrinsics (damaged record) a square 90° frustum still shows the pose.
        let (w, h, fx, fy, cx, cy) = match info.intrinsics {
            Some(k) if k.fx > 0.0 && k.fy > 0.0 => {
                (k.width as f32, k.height as f32, k.fx, k.fy, k.cx, k.cy)
            }
            _ => (2.0, 2.0, 1.0, 1.0, 1.0, 1.0),
        };
        let m = info.world_from_camera;
        out.push(m.transform_point3(Vec3::ZERO));
        for (u, v) in [(0.0, 0.0), (w, 0.0), (w, h), (0.0, h)] {
            let p = Vec3::new((u - cx) / fx * depth, (v - cy) / fy * depth, depth);
            out.push(m.transform_point3(p));
        }
    }
    out
}

/// A size for the frustums: 5 % of the scene's extent (cloud and cameras).
fn default_frustum_depth(frames: &[FrameInfo], cloud: &Cloud) -> f32 {
    let mut lo = Vec3::splat(f32::INFINITY);
    let mut hi = Vec3::splat(f32::NEG_INFINITY);
    let centres = frames
        .iter()
        .map(|f| f.world_from_camera.transform_point3(Vec3::ZERO));
    for p in cloud.xyz.iter().map(|p| Vec3::from(*p)).chain(centres) {
        lo = lo.min(p);
        hi = hi.max(p);
    }
    let extent = (hi - lo).length();
    if extent.is_finite() && extent > 0.0 {
        0.05 * extent
    } else {
        0.1
    }
}

fn bounds(points: impl Iterator<Item = Vec3>) -> (Value, Value) {
    let mut lo = Vec3::splat(f32::INFINITY);
    let mut hi = Vec3::splat(f32::NEG_INFINITY);
    for p in points {
        lo = lo.min(p);
        hi = hi.max(p);
    }
    (json!([lo.x, lo.y, lo.z]), json!([hi.x, hi.y, hi.z]))
}

/// Builds the glTF JSON and the binary buffer.
/// One glTF camera node per keyframe (scale frames and keyframes: the frames the model keeps),
/// placed like the frame's camera: glTF cameras look down −z with y up, so the OpenCV-like
/// camera's y and z are negated. The perspective's `yfov` and `aspectRatio` are the frame's
/// (model input size); a glTF camera has no principal point, so an off-centre one is not kept.
fn camera_nodes(frames: &[FrameInfo]) -> (Vec<Value>, Vec<Value>) {
    let mut cameras = Vec::new();
    let mut nodes = Vec::new();
    let flip = glam::Mat4::from_diagonal(glam::Vec4::new(1.0, -1.0, -1.0, 1.0));
    for info in frames {
        if info.frame_type == FrameType::NonKeyframe {
            continue;
        }
        let Some(k) = info.intrinsics.filter(|k| k.fy > 0.0 && k.height > 0) else {
            continue;
        };
        let yfov = 2.0 * (k.height as f32 / (2.0 * k.fy)).atan();
        cameras.push(json!({
            "type": "perspective",
            "name": info.origin.name,
            "perspective": {
                "yfov": yfov,
                "aspectRatio": k.width as f32 / k.height as f32,
                "znear": 0.01
            }
        }));
        let m = info.world_from_camera * flip;
        nodes.push(json!({
            "name": format!("camera {} ({})", info.frame, info.origin.name),
            "camera": cameras.len() - 1,
            "matrix": m.to_cols_array(),
        }));
    }
    (cameras, nodes)
}

fn build(
    frames: &[FrameInfo],
    cloud: &Cloud,
    frustum_depth: Option<f32>,
    with_cameras: bool,
) -> (Value, Vec<u8>) {
    let mut bin: Vec<u8> = Vec::new();
    let mut views = Vec::new();
    let mut accessors = Vec::new();
    let mut meshes = Vec::new();
    let mut push_view = |bin: &mut Vec<u8>, data: &[u8], target: u32| -> usize {
        // Every view starts 4-byte aligned, as vertex attributes require.
        while !bin.len().is_multiple_of(4) {
            bin.push(0);
        }
        views.push(json!({
            "buffer": 0, "byteOffset": bin.len(), "byteLength": data.len(), "target": target
        }));
        bin.extend_from_slice(data);
        views.len() - 1
    };

    if !cloud.is_empty() {
        let positions: Vec<u8> = cloud
            .xyz
            .iter()
            .flat_map(|p| p.iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        // RGBA8: 4 bytes per element keeps the attribute 4-byte aligned (RGB8 would not be).
        let colours: Vec<u8> = cloud
            .rgb
            .iter()
            .flat_map(|c| [c[0], c[1], c[2], 255])
            .collect();
        let pv = push_view(&mut bin, &positions, ARRAY_BUFFER);
        let cv = push_view(&mut bin, &colours, ARRAY_BUFFER);
        let (min, max) = bounds(cloud.xyz.iter().map(|p| Vec3::from(*p)));
        accessors.push(json!({
            "bufferView": pv, "componentType": FLOAT, "count": cloud.len(), "type": "VEC3",
            "min": min, "max": max
        }));
        accessors.push(json!({
            "bufferView": cv, "componentType": UNSIGNED_BYTE, "normalized": true,
            "count": cloud.len(), "type": "VEC4"
        }));
        meshes.push(json!({
            "name": "cloud",
            "primitives": [{
                "attributes": { "POSITION": accessors.len() - 2, "COLOR_0": accessors.len() - 1 },
                "mode": MODE_POINTS
            }]
        }));
    }

    let cameras = frames.len();
    if cameras > 0 {
        let depth = frustum_depth.unwrap_or_else(|| default_frustum_depth(frames, cloud));
        let verts = frustum_vertices(frames, depth);
        let positions: Vec<u8> = verts
            .iter()
            .flat_map(|p| p.to_array().into_iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        let mut indices: Vec<u8> = Vec::with_capacity(cameras * 16 * 4);
        for c in 0..cameras as u32 {
            let b = c * 5;
            let pairs = [
                (0, 1),
                (0, 2),
                (0, 3),
                (0, 4),
                (1, 2),
                (2, 3),
                (3, 4),
                (4, 1),
            ];
            for (i, j) in pairs {
                indices.extend_from_slice(&(b + i).to_le_bytes());
                indices.extend_from_slice(&(b + j).to_le_bytes());
            }
        }
        let pv = push_view(&mut bin, &positions, ARRAY_BUFFER);
        let iv = push_view(&mut bin, &indices, ELEMENT_ARRAY_BUFFER);
        let (min, max) = bounds(verts.iter().copied());
        accessors.push(json!({
            "bufferView": pv, "componentType": FLOAT, "count": verts.len(), "type": "VEC3",
            "min": min, "max": max
        }));
        accessors.push(json!({
            "bufferView": iv, "componentType": UNSIGNED_INT, "count": cameras * 16,
            "type": "SCALAR"
        }));
        // Which frustum is which frame: the k-th five vertices are camera k of this list.
        let frame_list: Vec<Value> = frames
            .iter()
            .map(|info| {
                json!({
                    "frame": info.frame,
                    "source": info.origin.name,
                    "capture_time": info.origin.time.seconds_text(),
                    "time_base": info.origin.time.base,
                })
            })
            .collect();
        meshes.push(json!({
            "name": "cameras",
            "extras": { "frames": frame_list },
            "primitives": [{
                "attributes": { "POSITION": accessors.len() - 2 },
                "indices": accessors.len() - 1,
                "mode": MODE_LINES,
                "material": 0
            }]
        }));
    }
    while !bin.len().is_multiple_of(4) {
        bin.push(0);
    }

    let mesh_nodes: Vec<Value> = meshes
        .iter()
        .enumerate()
        .map(|(i, m)| json!({ "name": m["name"], "mesh": i }))
        .collect();
    let (gltf_cameras, mut camera_nodes) = if with_cameras {
        camera_nodes(frames)
    } else {
        (Vec::new(), Vec::new())
    };
    let mut mesh_nodes = mesh_nodes;
    mesh_nodes.append(&mut camera_nodes);
    let children: Vec<usize> = (1..=mesh_nodes.len()).collect();
    let mut root = json!({
        "name": "session (export world, taken as z-up)",
        // −90° about x: (x, y, z) → (x, z, −y).
        "rotation": [-std::f64::consts::FRAC_1_SQRT_2, 0.0, 0.0, std::f64::consts::FRAC_1_SQRT_2]
    });
    // glTF forbids empty arrays: an empty session is a scene with one empty node.
    if !children.is_empty() {
        root["children"] = json!(children);
    }
    let mut nodes = vec![root];
    nodes.extend(mesh_nodes);
    let mut gltf = json!({
        "asset": { "version": "2.0", "generator": "streamrecon export" },
        "scene": 0,
        "scenes": [{ "nodes": [0] }],
        "nodes": nodes,
    });
    if !gltf_cameras.is_empty() {
        gltf["cameras"] = json!(gltf_cameras);
    }
    if cameras > 0 {
        gltf["materials"] = json!([{
            "name": "frustum",
            "pbrMetallicRoughness": { "baseColorFactor": [1.0, 0.55, 0.0, 1.0] }
        }]);
    }
    if !meshes.is_empty() {
        gltf["meshes"] = json!(meshes);
        gltf["accessors"] = json!(accessors);
        gltf["bufferViews"] = json!(views);
        gltf["buffers"] = json!([{ "byteLength": bin.len() }]);
    }
    (gltf, bin)
}

pub fn write_glb(
    mut w: impl Write,
    frames: &[FrameInfo],
    cloud: &Cloud,
    frustum_depth: Option<f32>,
    with_cameras: bool,
) -> io::Result<()> {
    let (gltf, bin) = build(frames, cloud, frustum_depth, with_cameras);
    let mut json = serde_json::to_vec(&gltf).map_err(io::Error::other)?;
    while json.len() % 4 != 0 {
        json.push(b' ');
    }
    let bin_chunk = if bin.is_empty() { 0 } else { 8 + bin.len() };
    let total = 12 + 8 + json.len() + bin_chunk;
    let total = u32::try_from(total)
        .map_err(|_| io::Error::other("the scene is larger than GLB's 4 GiB limit"))?;
    w.write_all(b"glTF")?;
    w.write_all(&2u32.to_le_bytes())?;
    w.write_all(&total.to_le_bytes())?;
    w.write_all(&(json.len() as u32).to_le_bytes())?;
    w.write_all(b"JSON")?;
    w.write_all(&json)?;
    if !bin.is_empty() {
        w.write_all(&(bin.len() as u32).to_le_bytes())?;
        w.write_all(b"BIN\0")?;
        w.write_all(&bin)?;
    }
    Ok(())
}

pub fn export_glb(
    path: &Path,
    frames: &[FrameInfo],
    cloud: &Cloud,
    frustum_depth: Option<f32>,
    with_cameras: bool,
) -> Result<(), RecordError> {
    super::write_file(path, |w| {
        write_glb(w, frames, cloud, frustum_depth, with_cameras)
    })
}
