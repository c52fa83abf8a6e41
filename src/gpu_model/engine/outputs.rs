//! What comes back to the host after a call: poses, kept points and (when asked) the maps.

use super::device_io::download_raw;
use super::*;

impl GpuSession {
    /// Copies the call's poses, kept points (and maps, when asked) to the host; synchronises.
    pub(super) fn download(&self, s: usize) -> Result<GpuStepOutput, CudaError> {
        let sh = self.shape;
        let plane = sh.plane();
        let b = &self.bufs;
        let mut pose = vec![0f32; s * POSE_ENC_LEN];
        let mut counts = vec![0u32; s];
        download_raw(&self.dev, b.pose, &mut pose)?;
        download_raw(&self.dev, b.counts, &mut counts)?;
        self.dev.stream.synchronize()?;
        let mut points = Vec::with_capacity(s);
        for (f, &count) in counts.iter().enumerate() {
            let k = (count as usize).min(plane);
            let mut xyz = vec![[0f32; 3]; k];
            let mut rgb = vec![[0u8; 3]; k];
            let mut confidence = vec![0f32; k];
            download_raw(
                &self.dev,
                b.xyz.slice(f * 3 * plane, 3 * k)?,
                xyz.as_flattened_mut(),
            )?;
            download_raw(
                &self.dev,
                b.point_rgb.slice(f * 3 * plane, 3 * k)?,
                rgb.as_flattened_mut(),
            )?;
            download_raw(
                &self.dev,
                b.point_conf.slice(f * plane, k)?,
                &mut confidence,
            )?;
            points.push(GpuPoints {
                xyz,
                rgb,
                confidence,
            });
        }
        let (mut depth, mut depth_conf) = (Vec::new(), Vec::new());
        if self.sc.download_maps {
            depth = vec![0f32; s * plane];
            depth_conf = vec![0f32; s * plane];
            download_raw(&self.dev, b.depth.slice(0, s * plane)?, &mut depth)?;
            download_raw(&self.dev, b.conf.slice(0, s * plane)?, &mut depth_conf)?;
        }
        self.dev.stream.synchronize()?;
        let pose_enc: Vec<[f32; POSE_ENC_LEN]> = pose
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
            depth,
            depth_conf,
            timing: StepTiming::default(),
        })
    }
}
