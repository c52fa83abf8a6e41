//! From a frame's depth, confidence and pose encoding (all on the device) to its filtered point
//! cloud, on the device: the pose decoded as `model::pose::decode_pose`, every pixel unprojected
//! as `model::pose::unproject_to_world` (camera-to-world, u = column, v = row, no +0.5), and the
//! points kept as `pipeline::frame::filter_points` keeps them: confidence above the threshold and
//! finite, then every `stride`-th in pixel order.
//!
//! The compaction is stable and deterministic: per-tile counts, one scan over the tiles, then
//! every kept point written at its rank (three kernels after the one-thread pose decode). No
//! allocation and no host read in [`PointCompactor::run`], so it can sit in a CUDA graph; the
//! count stays on the device (`out_count`).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::backend::cuda::arena::DevPtr;
use crate::backend::cuda::{CudaDevice, CudaError};
use crate::model::spec::POSE_ENC_LEN;

type Result<T> = std::result::Result<T, CudaError>;

/// Pixels per tile of the compaction kernels (`PTS_TILE` in kernels/dpt.cu).
const TILE: usize = 1024;
/// Threads per tile (`PTS_THREADS`).
const TILE_THREADS: u32 = 256;
/// Threads of the one-block scan over the tile counts.
const SCAN_THREADS: u32 = 1024;
/// `[R | t]` (12), fx, fy, cx, cy.
const CAMERA_LEN: usize = 16;

/// Scratch for one image size: the decoded camera and the per-tile counts.
pub struct PointCompactor {
    height: usize,
    width: usize,
    camera: CudaSlice<f32>,
    tile_counts: CudaSlice<u32>,
}

impl PointCompactor {
    pub fn new(dev: &CudaDevice, height: usize, width: usize) -> Result<Self> {
        let pixels = height * width;
        if pixels == 0 || u32::try_from(pixels).is_err() {
            return Err(CudaError::Invalid(format!(
                "point compactor for a {height}x{width} image"
            )));
        }
        Ok(Self {
            height,
            width,
            camera: dev.stream.alloc_zeros::<f32>(CAMERA_LEN)?,
            tile_counts: dev.stream.alloc_zeros::<u32>(pixels.div_ceil(TILE))?,
        })
    }

    /// The most points `run` can write for `stride`: what the output buffers must hold.
    pub fn max_points(&self, stride: u32) -> usize {
        (self.height * self.width).div_ceil(stride.max(1) as usize)
    }

    /// Points of one frame: `depth`, `conf` `[H][W]` f32, `pose_enc` the camera head's 9 values,
    /// `rgb` `[H][W][3]` the model's input image. Writes `out_xyz [n][3]`, `out_rgb [n][3]`,
    /// `out_conf [n]` and `out_count = n`, the points in pixel order. `min_confidence` and `stride`
    /// are session constants (fixed in a captured graph).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        dev: &CudaDevice,
        depth: DevPtr<f32>,
        conf: DevPtr<f32>,
        pose_enc: DevPtr<f32>,
        rgb: DevPtr<u8>,
        min_confidence: f32,
        stride: u32,
        out_xyz: DevPtr<f32>,
        out_rgb: DevPtr<u8>,
        out_conf: DevPtr<f32>,
        out_count: DevPtr<u32>,
    ) -> Result<()> {
        let pixels = self.height * self.width;
        let stride = stride.max(1);
        let max = self.max_points(stride);
        depth.check_len(pixels, "depth map")?;
        conf.check_len(pixels, "confidence map")?;
        pose_enc.check_len(POSE_ENC_LEN, "pose encoding")?;
        rgb.check_len(3 * pixels, "rgb image")?;
        out_xyz.check_len(3 * max, "point positions")?;
        out_rgb.check_len(3 * max, "point colours")?;
        out_conf.check_len(max, "point confidences")?;
        out_count.check_len(1, "point count")?;

        let (h, w, n) = (self.height as u32, self.width as u32, pixels as u32);
        let tiles = pixels.div_ceil(TILE) as u32;
        let cam = DevPtr::of(&self.camera).addr();
        let counts = DevPtr::of(&self.tile_counts).addr();
        let (da, ca, ea, ra) = (depth.addr(), conf.addr(), pose_enc.addr(), rgb.addr());
        let (xa, cola, confa, cnta) = (
            out_xyz.addr(),
            out_rgb.addr(),
            out_conf.addr(),
            out_count.addr(),
        );
        let one = |threads: u32| LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let per_tile = LaunchConfig {
            grid_dim: (tiles, 1, 1),
            block_dim: (TILE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };

        let f = dev.kernels.get("dpt_decode_pose")?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&ea).arg(&h).arg(&w).arg(&cam);
        // SAFETY: arguments match dpt_decode_pose; 9 inputs and 16 outputs checked/allocated.
        unsafe { b.launch(one(32)) }?;

        let f = dev.kernels.get("dpt_points_count")?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&da)
            .arg(&ca)
            .arg(&cam)
            .arg(&n)
            .arg(&w)
            .arg(&min_confidence)
            .arg(&counts);
        // SAFETY: arguments match dpt_points_count; one count per tile allocated.
        unsafe { b.launch(per_tile) }?;

        let f = dev.kernels.get("dpt_points_scan")?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&counts).arg(&tiles).arg(&stride).arg(&cnta);
        // SAFETY: arguments match dpt_points_scan.
        unsafe { b.launch(one(SCAN_THREADS)) }?;

        let f = dev.kernels.get("dpt_points_write")?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&da)
            .arg(&ca)
            .arg(&cam)
            .arg(&ra)
            .arg(&n)
            .arg(&w)
            .arg(&min_confidence)
            .arg(&stride)
            .arg(&counts)
            .arg(&xa)
            .arg(&cola)
            .arg(&confa);
        // SAFETY: arguments match dpt_points_write; the outputs hold ceil(pixels / stride)
        // points, the most the filter can keep.
        unsafe { b.launch(per_tile) }?;
        Ok(())
    }
}
