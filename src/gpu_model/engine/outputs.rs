//! What comes back to the host after a call: poses, kept points, the model's input as 8-bit RGB
//! and (when asked) the maps.
//!
//! The copies are queued on the stream right behind the call's work, into page-locked memory of
//! one of two [`OutputSlot`]s, so a call's results travel while the host prepares the next call
//! and the next call's work may already be queued behind them: the host reads a slot only after
//! its `copied` event. Points are copied at the buffers' full size (their count is known only on
//! the device), which costs about 0.1 ms of copy engine per frame and no synchronisation.

use std::time::Instant;

use cudarc::driver::{CudaEvent, PinnedHostSlice};

use super::device_io::download_raw;
use super::*;

/// Page-locked host memory for `len` values. Plain (not write-combined): the host reads it.
fn pinned<T: cudarc::driver::DeviceRepr>(
    dev: &CudaDevice,
    len: usize,
) -> Result<PinnedHostSlice<T>, CudaError> {
    // SAFETY: a slot is only read after a copy into it has completed (its `copied` event).
    Ok(unsafe { dev.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }?)
}

/// The host side of one call's outputs.
pub(super) struct OutputSlot {
    pose: PinnedHostSlice<f32>,
    counts: PinnedHostSlice<u32>,
    xyz: PinnedHostSlice<f32>,
    point_rgb: PinnedHostSlice<u8>,
    point_conf: PinnedHostSlice<f32>,
    model_rgb: PinnedHostSlice<u8>,
    /// Empty (one value) when the session does not download maps.
    depth: PinnedHostSlice<f32>,
    conf: PinnedHostSlice<f32>,
}

/// A submitted call, waiting for [`GpuSession::finish`].
pub(super) struct PendingCall {
    pub slot: usize,
    pub frames: usize,
    pub submitted: Instant,
    pub host_ms: f64,
    pub image_upload_ms: f64,
    pub graph: bool,
    pub stages: Vec<(String, f64)>,
    /// Around the device preprocessing (equal when the images came preprocessed).
    pub preprocess_start: CudaEvent,
    pub start: CudaEvent,
    /// After DINO (front stream).
    pub dino_end: CudaEvent,
    pub aggregator_start: CudaEvent,
    pub aggregator_end: CudaEvent,
    pub end: CudaEvent,
    /// After the last copy into the slot.
    pub copied: CudaEvent,
}

impl OutputSlot {
    pub(super) fn new(
        dev: &CudaDevice,
        max_call: usize,
        plane: usize,
        maps: bool,
    ) -> Result<Self, CudaError> {
        let maps_len = if maps { max_call * plane } else { 0 };
        Ok(Self {
            pose: pinned(dev, max_call * POSE_ENC_LEN)?,
            counts: pinned(dev, max_call)?,
            xyz: pinned(dev, max_call * 3 * plane)?,
            point_rgb: pinned(dev, max_call * 3 * plane)?,
            point_conf: pinned(dev, max_call * plane)?,
            model_rgb: pinned(dev, max_call * 3 * plane)?,
            depth: pinned(dev, maps_len)?,
            conf: pinned(dev, maps_len)?,
        })
    }

    /// Page-locked bytes of the slot.
    pub(super) fn bytes(&self) -> usize {
        self.pose.num_bytes()
            + self.counts.num_bytes()
            + self.xyz.num_bytes()
            + self.point_rgb.num_bytes()
            + self.point_conf.num_bytes()
            + self.model_rgb.num_bytes()
            + self.depth.num_bytes()
            + self.conf.num_bytes()
    }
}

impl GpuSession {
    /// Queues the copies of a call of `s` frames into `slot`; nothing waits.
    pub(super) fn queue_downloads(&mut self, slot: usize, s: usize) -> Result<(), CudaError> {
        let plane = self.shape.plane();
        let b = &self.bufs;
        let dev = &*self.dev;
        let o = &mut self.slots[slot];
        download_raw(
            dev,
            b.pose.slice(0, s * POSE_ENC_LEN)?,
            &mut o.pose.as_mut_slice()?[..s * POSE_ENC_LEN],
        )?;
        download_raw(
            dev,
            b.counts.slice(0, s)?,
            &mut o.counts.as_mut_slice()?[..s],
        )?;
        download_raw(
            dev,
            b.xyz.slice(0, s * 3 * plane)?,
            &mut o.xyz.as_mut_slice()?[..s * 3 * plane],
        )?;
        download_raw(
            dev,
            b.point_rgb.slice(0, s * 3 * plane)?,
            &mut o.point_rgb.as_mut_slice()?[..s * 3 * plane],
        )?;
        download_raw(
            dev,
            b.point_conf.slice(0, s * plane)?,
            &mut o.point_conf.as_mut_slice()?[..s * plane],
        )?;
        download_raw(
            dev,
            b.rgb.slice(0, s * 3 * plane)?,
            &mut o.model_rgb.as_mut_slice()?[..s * 3 * plane],
        )?;
        if self.sc.download_maps {
            download_raw(
                dev,
                b.depth.slice(0, s * plane)?,
                &mut o.depth.as_mut_slice()?[..s * plane],
            )?;
            download_raw(
                dev,
                b.conf.slice(0, s * plane)?,
                &mut o.conf.as_mut_slice()?[..s * plane],
            )?;
        }
        Ok(())
    }

    /// The outputs of a call whose copies into `slot` have completed.
    pub(super) fn read_slot(&self, slot: usize, s: usize) -> Result<GpuStepOutput, CudaError> {
        let sh = self.shape;
        let plane = sh.plane();
        let o = &self.slots[slot];
        let counts = &o.counts.as_slice()?[..s];
        let (xyz, point_rgb, point_conf) = (
            o.xyz.as_slice()?,
            o.point_rgb.as_slice()?,
            o.point_conf.as_slice()?,
        );
        let points = counts
            .iter()
            .enumerate()
            .map(|(f, &count)| {
                let k = (count as usize).min(plane);
                let xyz = &xyz[f * 3 * plane..f * 3 * plane + 3 * k];
                let rgb = &point_rgb[f * 3 * plane..f * 3 * plane + 3 * k];
                GpuPoints {
                    xyz: xyz.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect(),
                    rgb: rgb.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect(),
                    confidence: point_conf[f * plane..f * plane + k].to_vec(),
                }
            })
            .collect();
        let (depth, depth_conf) = if self.sc.download_maps {
            (
                o.depth.as_slice()?[..s * plane].to_vec(),
                o.conf.as_slice()?[..s * plane].to_vec(),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let pose_enc: Vec<[f32; POSE_ENC_LEN]> = o.pose.as_slice()?[..s * POSE_ENC_LEN]
            .chunks_exact(POSE_ENC_LEN)
            .map(|c| {
                let mut e = [0f32; POSE_ENC_LEN];
                e.copy_from_slice(c);
                e
            })
            .collect();
        let cameras = pose_enc
            .iter()
            .map(|e| decode_pose(e, sh.height, sh.width))
            .collect();
        Ok(GpuStepOutput {
            frames: s,
            pose_enc,
            cameras,
            points,
            model_rgb: o.model_rgb.as_slice()?[..s * 3 * plane]
                .chunks_exact(3 * plane)
                .map(<[u8]>::to_vec)
                .collect(),
            depth,
            depth_conf,
            timing: StepTiming::default(),
        })
    }
}
