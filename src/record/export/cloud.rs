//! The session's points as one cloud: every frame's filtered points, with a confidence floor
//! and optional voxel downsampling, each point remembering its frame.

use crate::record::{RecordError, SessionReader};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloudOptions {
    /// Points with confidence below this are left out.
    pub min_confidence: f32,
    /// Voxel edge length for downsampling (one point per occupied voxel); `None` keeps all.
    pub voxel: Option<f32>,
    /// Estimate a normal per point from its frame's depth map (`normals`).
    pub normals: bool,
}

impl Default for CloudOptions {
    fn default() -> Self {
        Self {
            min_confidence: 0.0,
            voxel: None,
            normals: false,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cloud {
    pub xyz: Vec<[f32; 3]>,
    pub rgb: Vec<[u8; 3]>,
    pub confidence: Vec<f32>,
    /// Stream frame index of each point.
    pub frame: Vec<u32>,
    /// Unit normal of each point (world frame); empty when not asked for.
    pub normal: Vec<[f32; 3]>,
}

impl Cloud {
    pub fn len(&self) -> usize {
        self.xyz.len()
    }
    pub fn is_empty(&self) -> bool {
        self.xyz.is_empty()
    }
}

pub fn gather_cloud(reader: &SessionReader, options: CloudOptions) -> Result<Cloud, RecordError> {
    gather_cloud_in(reader, 0..reader.frames().len(), options)
}

/// The cloud of the reader's frames `frames` (one model session's, see `sessions`).
pub fn gather_cloud_in(
    reader: &SessionReader,
    frames: std::ops::Range<usize>,
    options: CloudOptions,
) -> Result<Cloud, RecordError> {
    let mut cloud = Cloud::default();
    for i in frames {
        let info = &reader.frames()[i];
        let points = reader.read_points(i)?;
        // Frame indices beyond u32 (years of 30 fps) saturate rather than wrap.
        let frame = u32::try_from(info.frame).unwrap_or(u32::MAX);
        let normals = if options.normals {
            frame_normals(reader, i, &points.xyz)?
        } else {
            Vec::new()
        };
        for k in 0..points.len() {
            let c = points.confidence[k];
            if c >= options.min_confidence && points.xyz[k].iter().all(|v| v.is_finite()) {
                cloud.xyz.push(points.xyz[k]);
                cloud.rgb.push(points.rgb[k]);
                cloud.confidence.push(c);
                cloud.frame.push(frame);
                if let Some(n) = normals.get(k) {
                    cloud.normal.push(*n);
                }
            }
        }
    }
    Ok(match options.voxel {
        Some(size) => super::voxel::downsample(&cloud, size),
        None => cloud,
    })
}

/// Normals of frame `i`'s points from its depth map; without one (not recorded, damaged) each
/// point's direction back to its camera.
fn frame_normals(
    reader: &SessionReader,
    i: usize,
    xyz: &[[f32; 3]],
) -> Result<Vec<[f32; 3]>, RecordError> {
    let info = &reader.frames()[i];
    let depth = reader
        .read_frame(
            i,
            crate::record::Parts {
                image: false,
                maps: true,
            },
        )?
        .depth;
    let k = info.intrinsics.unwrap_or(crate::frame::Intrinsics {
        fx: 0.0,
        fy: 0.0,
        cx: 0.0,
        cy: 0.0,
        width: 0,
        height: 0,
    });
    let depth = if depth.len() == (k.width * k.height) as usize {
        depth
    } else {
        Vec::new()
    };
    Ok(super::normals::normals_from_depth(
        xyz,
        &depth,
        &k,
        &info.camera_from_world,
    ))
}
