//! The 3D view's picture read back from the GPU, and how far two pictures are apart: what the
//! bench and the tests use to check that the compute rasteriser draws what the sprites draw.

use eframe::egui_wgpu::wgpu;

/// An RGBA8 picture, rows top to bottom, no padding.
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    pub width: u32,
    pub height: u32,
    pub rgba: Vec<u8>,
}

/// Where two pictures of the same size differ.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PictureDiff {
    pub pixels: u64,
    /// Pixels where some channel differs by more than [`CHANNEL_TOLERANCE`].
    pub differing: u64,
    /// Pixels showing something (not the background) in one picture and not the other.
    pub coverage_differing: u64,
    /// Pixels showing something in either picture.
    pub covered: u64,
    pub max_channel_difference: u8,
}

/// A channel may differ by this much (8-bit steps) and still count as the same: the compute
/// path rounds colours to 8 bits before the target's own rounding.
pub const CHANNEL_TOLERANCE: u8 = 2;

/// Tolerance of the compute paths against the sprites, in covered pixels (those showing a
/// point in either picture).
///
/// Coverage (point or background) may differ in at most [`MAX_COVERAGE_DIFFERING_FRACTION`]:
/// only pixel centres lying exactly on a sprite's rim decide differently. Colour may differ
/// (beyond [`CHANNEL_TOLERANCE`]) in at most [`MAX_DIFFERING_FRACTION`]: where points lie on
/// one surface at the same depth, which of them wins a pixel is a tie in both paths (the
/// sprites' depth is interpolated by the raster hardware, the compute path's computed once per
/// point; the sprites keep the first drawn, the compute path the larger colour). In RGB and
/// depth colours neighbours on a surface look alike and such pixels rarely differ; in the
/// confidence and frame-age colours they do.
pub const MAX_DIFFERING_FRACTION: f64 = 0.10;
pub const MAX_COVERAGE_DIFFERING_FRACTION: f64 = 0.005;

impl PictureDiff {
    /// Of the covered pixels, the fraction whose colour differs.
    pub fn differing_fraction(&self) -> f64 {
        self.differing as f64 / self.covered.max(1) as f64
    }

    /// Of the covered pixels, the fraction covered in only one picture.
    pub fn coverage_differing_fraction(&self) -> f64 {
        self.coverage_differing as f64 / self.covered.max(1) as f64
    }

    pub fn within_tolerance(&self) -> bool {
        self.differing_fraction() <= MAX_DIFFERING_FRACTION
            && self.coverage_differing_fraction() <= MAX_COVERAGE_DIFFERING_FRACTION
    }
}

impl Picture {
    /// Pixels different from `background` (RGBA8 of the clear colour in the target's format).
    pub fn covered_pixels(&self, background: [u8; 4]) -> u64 {
        self.rgba
            .chunks_exact(4)
            .filter(|p| !near(p, &background))
            .count() as u64
    }

    /// How far `self` is from `reference` (same size; `None` otherwise).
    pub fn diff(&self, reference: &Picture, background: [u8; 4]) -> Option<PictureDiff> {
        if (self.width, self.height) != (reference.width, reference.height) {
            return None;
        }
        let mut d = PictureDiff {
            pixels: u64::from(self.width) * u64::from(self.height),
            differing: 0,
            coverage_differing: 0,
            covered: 0,
            max_channel_difference: 0,
        };
        for (a, b) in self
            .rgba
            .chunks_exact(4)
            .zip(reference.rgba.chunks_exact(4))
        {
            let worst = a[..3]
                .iter()
                .zip(&b[..3])
                .map(|(x, y)| x.abs_diff(*y))
                .max()
                .unwrap_or(0);
            d.max_channel_difference = d.max_channel_difference.max(worst);
            if worst > CHANNEL_TOLERANCE {
                d.differing += 1;
            }
            let (ca, cb) = (!near(a, &background), !near(b, &background));
            d.covered += u64::from(ca || cb);
            d.coverage_differing += u64::from(ca != cb);
        }
        Some(d)
    }
}

fn near(p: &[u8], q: &[u8; 4]) -> bool {
    p[..3].iter().zip(&q[..3]).all(|(a, b)| a.abs_diff(*b) <= 1)
}

/// Copies `texture` (RGBA8 or BGRA8, one layer) back to the CPU; BGRA is swizzled to RGBA.
pub fn read_texture(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    texture: &wgpu::Texture,
) -> Result<Picture, String> {
    let (width, height) = (texture.width(), texture.height());
    let bgra = match texture.format() {
        wgpu::TextureFormat::Rgba8Unorm | wgpu::TextureFormat::Rgba8UnormSrgb => false,
        wgpu::TextureFormat::Bgra8Unorm | wgpu::TextureFormat::Bgra8UnormSrgb => true,
        other => return Err(format!("cannot read back a {other:?} texture")),
    };
    let row = width * 4;
    let padded =
        row.div_ceil(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT) * wgpu::COPY_BYTES_PER_ROW_ALIGNMENT;
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("picture_readback"),
        size: u64::from(padded) * u64::from(height),
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("picture_readback"),
    });
    encoder.copy_texture_to_buffer(
        texture.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &buffer,
            layout: wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(padded),
                rows_per_image: Some(height),
            },
        },
        texture.size(),
    );
    queue.submit([encoder.finish()]);
    let bytes = map_read(device, &buffer)?;
    let mut rgba = Vec::with_capacity((row * height) as usize);
    for y in 0..height as usize {
        let line = &bytes[y * padded as usize..y * padded as usize + row as usize];
        if bgra {
            for p in line.chunks_exact(4) {
                rgba.extend_from_slice(&[p[2], p[1], p[0], p[3]]);
            }
        } else {
            rgba.extend_from_slice(line);
        }
    }
    Ok(Picture {
        width,
        height,
        rgba,
    })
}

/// Waits for the GPU and returns the contents of a `MAP_READ` buffer.
pub fn map_read(device: &wgpu::Device, buffer: &wgpu::Buffer) -> Result<Vec<u8>, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    buffer.map_async(wgpu::MapMode::Read, .., move |r| {
        // The receiver waits below; a send can only fail if it is gone, and then nobody asks.
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| format!("waiting for the GPU: {e}"))?;
    rx.recv()
        .map_err(|_| "the GPU never answered the read-back".to_string())?
        .map_err(|e| format!("read-back: {e}"))?;
    let bytes = buffer
        .slice(..)
        .get_mapped_range()
        .map_err(|e| format!("read-back: {e}"))?
        .to_vec();
    buffer.unmap();
    Ok(bytes)
}
