//! Per-frame GPU time: timestamp queries at the start of the first pass and the end of the last
//! where the device has `TIMESTAMP_QUERY`, else the wall time from submit to completion.

use std::time::Instant;

use eframe::egui_wgpu::wgpu;

use crate::viewer::picture::map_read;

pub struct FrameTimer {
    queries: Option<Queries>,
}

struct Queries {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    period_ns: f64,
}

/// One frame's times.
#[derive(Debug, Clone, Copy)]
pub struct FrameTiming {
    /// GPU time (timestamps), or `wall_ms` where the device has none.
    pub gpu_ms: f64,
    /// Submit to completion.
    pub wall_ms: f64,
}

impl FrameTimer {
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let queries = device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY)
            .then(|| {
                let bytes = 2 * std::mem::size_of::<u64>() as u64;
                Queries {
                    set: device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("frame_time"),
                        ty: wgpu::QueryType::Timestamp,
                        count: 2,
                    }),
                    resolve: device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("frame_time_resolve"),
                        size: bytes,
                        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                        mapped_at_creation: false,
                    }),
                    read: device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("frame_time_read"),
                        size: bytes,
                        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
                        mapped_at_creation: false,
                    }),
                    period_ns: f64::from(queue.get_timestamp_period()),
                }
            });
        Self { queries }
    }

    pub fn method(&self) -> &'static str {
        if self.queries.is_some() {
            "timestamp_query"
        } else {
            "submit_to_completion_wall"
        }
    }

    /// Encodes a frame with `encode` (given the query set to write index 0 at the start of its
    /// first pass and 1 at the end of its last), submits it and waits for it.
    pub fn time(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        encode: impl FnOnce(&mut wgpu::CommandEncoder, Option<&wgpu::QuerySet>),
    ) -> Result<FrameTiming, String> {
        let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bench_frame"),
        });
        encode(&mut encoder, self.queries.as_ref().map(|q| &q.set));
        if let Some(q) = &self.queries {
            encoder.resolve_query_set(&q.set, 0..2, &q.resolve, 0);
            encoder.copy_buffer_to_buffer(&q.resolve, 0, &q.read, 0, q.resolve.size());
        }
        let start = Instant::now();
        queue.submit([encoder.finish()]);
        device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("waiting for the GPU: {e}"))?;
        let wall_ms = start.elapsed().as_secs_f64() * 1e3;
        let gpu_ms = match &self.queries {
            Some(q) => {
                let bytes = map_read(device, &q.read)?;
                let t: &[u64] = bytemuck::cast_slice(&bytes);
                t[1].wrapping_sub(t[0]) as f64 * q.period_ns / 1e6
            }
            None => wall_ms,
        };
        Ok(FrameTiming { gpu_ms, wall_ms })
    }
}
