//! The wgpu side of the 3D view: append-only point chunks, the line list, and an offscreen
//! colour + depth target drawn inside an egui-wgpu paint callback, then copied into egui's pass.
//!
//! `SceneRenderer` lives in egui-wgpu's callback resources (one per window). The app uploads each
//! frame's points into it once, as results arrive; every repaint only writes the small uniform
//! block and records one draw per chunk.

use std::num::NonZeroU64;

use bytemuck::{Pod, Zeroable};
use eframe::egui;
use eframe::egui_wgpu::{self, wgpu};

use super::chunks::{ChunkBook, Placement};
use super::lines::LineVertex;
use super::point_format::POINT_BYTES;
use super::raster::{ComputeRaster, RenderPath};
use super::shaders;

/// Vertices per sprite (`SPRITE_VERTICES` in shaders/points.wgsl: one triangle).
const SPRITE_VERTICES: u32 = 3;
const DEPTH_FORMAT: wgpu::TextureFormat = wgpu::TextureFormat::Depth32Float;
/// Background of the 3D view (dark, a touch of blue so black points still show).
const CLEAR: wgpu::Color = wgpu::Color {
    r: 0.035,
    g: 0.04,
    b: 0.055,
    a: 1.0,
};

/// The uniform block of `shaders/common.wgsl`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
pub struct ViewUniforms {
    pub clip_from_world: [[f32; 4]; 4],
    pub view_from_world: [[f32; 4]; 4],
    pub viewport_px: [f32; 2],
    pub point_size_px: f32,
    pub confidence_threshold: f32,
    pub colour_mode: u32,
    pub stride: u32,
    pub newest_frame: u32,
    pub age_span_frames: f32,
    pub depth_range: [f32; 2],
    pub log_confidence_range: [f32; 2],
    pub chunk_points: u32,
    pub frame_count: u32,
    /// `confidence_threshold` as a stored point's code (`point_format::confidence_code`).
    pub threshold_code: u32,
    pub pad: u32,
}

/// The GPU copy of the book's frame table: grown by doubling, appended to as frames arrive,
/// rewritten after a reset.
struct FrameTable {
    buffer: wgpu::Buffer,
    capacity: u64,
    /// (book generation, entries written) of what the buffer holds.
    synced: (u64, usize),
}

const FRAME_ENTRY_BYTES: u64 = 8;

impl FrameTable {
    fn new(device: &wgpu::Device, capacity: u64) -> Self {
        Self {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("frame_table"),
                size: capacity * FRAME_ENTRY_BYTES,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            capacity,
            synced: (0, 0),
        }
    }
}

fn uniform_bind_group(
    device: &wgpu::Device,
    layout: &wgpu::BindGroupLayout,
    uniforms: &wgpu::Buffer,
    frame_table: &wgpu::Buffer,
) -> wgpu::BindGroup {
    device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("view_uniforms"),
        layout,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: uniforms.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: frame_table.as_entire_binding(),
            },
        ],
    })
}

struct GpuChunk {
    buffer: wgpu::Buffer,
    bind_group: wgpu::BindGroup,
}

struct Offscreen {
    size: [u32; 2],
    colour: wgpu::Texture,
    colour_view: wgpu::TextureView,
    depth_view: wgpu::TextureView,
    blit_bind_group: wgpu::BindGroup,
}

struct LineBuffer {
    buffer: wgpu::Buffer,
    capacity: u64,
    vertices: u32,
}

pub struct SceneRenderer {
    colour_format: wgpu::TextureFormat,
    chunk_points: u32,
    /// Most bytes of point chunks this renderer creates (`None`: until the device refuses).
    max_point_bytes: Option<u64>,
    /// The device refused a chunk (out of memory): the store stops growing.
    store_full: bool,
    raster: Option<ComputeRaster>,
    points_pipeline: wgpu::RenderPipeline,
    lines_pipeline: wgpu::RenderPipeline,
    blit_pipeline: wgpu::RenderPipeline,
    uniform_buffer: wgpu::Buffer,
    uniform_layout: wgpu::BindGroupLayout,
    uniform_bind_group: wgpu::BindGroup,
    /// The store's frame table (`ChunkBook::frames`), bound beside the uniforms.
    frame_table: FrameTable,
    chunk_layout: wgpu::BindGroupLayout,
    blit_layout: wgpu::BindGroupLayout,
    chunks: Vec<GpuChunk>,
    lines: Option<LineBuffer>,
    offscreen: Option<Offscreen>,
    bytes_uploaded: u64,
}

impl SceneRenderer {
    /// `colour_format` is egui's target format: the offscreen target uses it too, so the copy
    /// into egui's pass is a plain texel load.
    /// `downlevel` is the adapter's (whether it runs compute shaders).
    pub fn new(
        device: &wgpu::Device,
        colour_format: wgpu::TextureFormat,
        chunk_points: u32,
        downlevel: wgpu::DownlevelFlags,
    ) -> Self {
        let shaders = shaders::POINT_SHADERS;
        let all_stages =
            wgpu::ShaderStages::VERTEX | wgpu::ShaderStages::FRAGMENT | wgpu::ShaderStages::COMPUTE;
        let uniform_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("view_uniforms"),
            size: std::mem::size_of::<ViewUniforms>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let uniform_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("view_uniforms"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: all_stages,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: NonZeroU64::new(
                            std::mem::size_of::<ViewUniforms>() as u64
                        ),
                    },
                    count: None,
                },
                wgpu::BindGroupLayoutEntry {
                    binding: 1,
                    visibility: all_stages,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: true },
                        has_dynamic_offset: false,
                        min_binding_size: NonZeroU64::new(FRAME_ENTRY_BYTES),
                    },
                    count: None,
                },
            ],
        });
        let frame_table = FrameTable::new(device, 1024);
        let uniform_bind_group = uniform_bind_group(
            device,
            &uniform_layout,
            &uniform_buffer,
            &frame_table.buffer,
        );
        let chunk_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("point_chunk"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::VERTEX | wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: true },
                    has_dynamic_offset: false,
                    min_binding_size: NonZeroU64::new(POINT_BYTES),
                },
                count: None,
            }],
        });
        let blit_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("scene_blit"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::FRAGMENT,
                ty: wgpu::BindingType::Texture {
                    sample_type: wgpu::TextureSampleType::Float { filterable: false },
                    view_dimension: wgpu::TextureViewDimension::D2,
                    multisampled: false,
                },
                count: None,
            }],
        });

        let depth = Some(wgpu::DepthStencilState {
            format: DEPTH_FORMAT,
            depth_write_enabled: Some(true),
            depth_compare: Some(wgpu::CompareFunction::Less),
            stencil: wgpu::StencilState::default(),
            bias: wgpu::DepthBiasState::default(),
        });
        let points_pipeline = pipeline(
            device,
            "points",
            shaders.points,
            &[&uniform_layout, &chunk_layout],
            &[],
            wgpu::PrimitiveTopology::TriangleList,
            depth.clone(),
            colour_format,
        );
        let line_attributes = wgpu::vertex_attr_array![0 => Float32x3, 1 => Unorm8x4];
        let line_layout = wgpu::VertexBufferLayout {
            array_stride: std::mem::size_of::<LineVertex>() as u64,
            step_mode: wgpu::VertexStepMode::Vertex,
            attributes: &line_attributes,
        };
        let lines_pipeline = pipeline(
            device,
            "lines",
            shaders::LINES,
            &[&uniform_layout],
            &[line_layout],
            wgpu::PrimitiveTopology::LineList,
            depth,
            colour_format,
        );
        let blit_pipeline = pipeline(
            device,
            "scene_blit",
            shaders::BLIT,
            &[&blit_layout],
            &[],
            wgpu::PrimitiveTopology::TriangleList,
            None,
            colour_format,
        );
        // A driver that claims the features but cannot build the pipelines leaves the view on
        // the sprites rather than taking the window down with wgpu's error handler.
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        let raster = ComputeRaster::new(
            device,
            &uniform_layout,
            &chunk_layout,
            colour_format,
            DEPTH_FORMAT,
            downlevel,
            shaders,
        );
        let failed = pollster::block_on(internal.pop());
        let failed = pollster::block_on(validation.pop()).or(failed);
        let raster = match failed {
            Some(error) => {
                tracing::warn!(
                    "the compute rasteriser could not be built ({error}); drawing sprites"
                );
                None
            }
            None => raster,
        };
        Self {
            colour_format,
            chunk_points,
            max_point_bytes: None,
            store_full: false,
            raster,
            points_pipeline,
            lines_pipeline,
            blit_pipeline,
            uniform_buffer,
            uniform_layout,
            uniform_bind_group,
            frame_table,
            chunk_layout,
            blit_layout,
            chunks: Vec::new(),
            lines: None,
            offscreen: None,
            bytes_uploaded: 0,
        }
    }

    /// Bytes of point data sent to the GPU so far (each point once).
    pub fn bytes_uploaded(&self) -> u64 {
        self.bytes_uploaded
    }

    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    pub fn chunk_points(&self) -> u32 {
        self.chunk_points
    }

    /// Bytes of the point chunks created (each holds `chunk_points` points).
    pub fn point_bytes(&self) -> u64 {
        self.chunks.len() as u64 * self.chunk_bytes()
    }

    fn chunk_bytes(&self) -> u64 {
        u64::from(self.chunk_points) * POINT_BYTES
    }

    /// Brings the GPU copy of the book's frame table up to date (appending what is new, or
    /// rewriting it after a reset), growing its buffer when needed.
    pub fn sync_frames(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, book: &ChunkBook) {
        let frames = book.frames();
        let (generation, written) = self.frame_table.synced;
        let from = if generation == book.generation() && written <= frames.len() {
            written
        } else {
            0
        };
        if frames.len() as u64 > self.frame_table.capacity {
            let capacity = (frames.len() as u64).next_power_of_two();
            let grown = FrameTable::new(device, capacity);
            self.uniform_bind_group = uniform_bind_group(
                device,
                &self.uniform_layout,
                &self.uniform_buffer,
                &grown.buffer,
            );
            self.frame_table = grown;
            // A new buffer holds nothing yet.
            self.write_frames(queue, frames, 0);
        } else if from < frames.len() {
            self.write_frames(queue, frames, from);
        }
        self.frame_table.synced = (book.generation(), frames.len());
    }

    fn write_frames(&self, queue: &wgpu::Queue, frames: &[[u32; 2]], from: usize) {
        let bytes: &[u8] = bytemuck::cast_slice(&frames[from..]);
        queue.write_buffer(
            &self.frame_table.buffer,
            from as u64 * FRAME_ENTRY_BYTES,
            bytes,
        );
    }

    /// Caps the bytes of point chunks (an explicit budget below what the device would give).
    pub fn set_max_point_bytes(&mut self, bytes: Option<u64>) {
        self.max_point_bytes = bytes;
    }

    /// Whether the renderer can draw `path` on this device.
    pub fn supports(&self, path: RenderPath) -> bool {
        match path {
            RenderPath::Sprites => true,
            _ => self.raster.as_ref().is_some_and(|r| r.supports(path)),
        }
    }

    /// Bytes of the compute path's visibility buffers at the current view size.
    pub fn raster_target_bytes(&self) -> u64 {
        self.raster.as_ref().map_or(0, ComputeRaster::target_bytes)
    }

    /// Makes sure `chunks` point chunks exist, creating the missing ones, and returns how many
    /// exist afterwards: fewer when the byte budget is reached or the device runs out of
    /// memory (caught with an error scope; the store then stops growing for good).
    pub fn reserve_chunks(&mut self, device: &wgpu::Device, chunks: usize) -> usize {
        while self.chunks.len() < chunks && !self.store_full {
            if self
                .max_point_bytes
                .is_some_and(|max| self.point_bytes() + self.chunk_bytes() > max)
            {
                break;
            }
            // Out of memory is the expected refusal; a validation error (a chunk over the
            // device's buffer limits) would otherwise reach wgpu's handler, which panics.
            let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let chunk = self.new_chunk(device);
            let refused = pollster::block_on(memory.pop());
            let invalid = pollster::block_on(validation.pop());
            if let Some(error) = refused.or(invalid) {
                tracing::warn!(
                    "the GPU refused point chunk {} ({} points stored): {error}; the cloud stops growing",
                    self.chunks.len(),
                    self.chunks.len() as u64 * u64::from(self.chunk_points)
                );
                self.store_full = true;
                break;
            }
            self.chunks.push(chunk);
        }
        self.chunks.len().min(chunks)
    }

    /// Writes `points` where `placements` (from `ChunkBook::append`) put them, creating the
    /// chunk buffers the placements open.
    pub fn upload_points(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        placements: &[Placement],
        points: &[u8],
    ) {
        let point_bytes = POINT_BYTES as usize;
        for placement in placements {
            if self.reserve_chunks(device, placement.chunk + 1) <= placement.chunk {
                continue;
            }
            let range = placement.source.start * point_bytes..placement.source.end * point_bytes;
            let Some(bytes) = points.get(range) else {
                continue;
            };
            let offset = u64::from(placement.first) * point_bytes as u64;
            queue.write_buffer(&self.chunks[placement.chunk].buffer, offset, bytes);
            self.bytes_uploaded += bytes.len() as u64;
        }
    }

    fn new_chunk(&self, device: &wgpu::Device) -> GpuChunk {
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("point_chunk"),
            size: self.chunk_bytes(),
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("point_chunk"),
            layout: &self.chunk_layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: buffer.as_entire_binding(),
            }],
        });
        GpuChunk { buffer, bind_group }
    }

    /// Replaces the line list (frustums, trajectory, grid): a few vertices per frame, rewritten
    /// when a frame arrives.
    pub fn upload_lines(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        vertices: &[LineVertex],
    ) {
        let bytes: &[u8] = bytemuck::cast_slice(vertices);
        let needed = (bytes.len() as u64).max(1);
        if self.lines.as_ref().is_none_or(|l| l.capacity < needed) {
            // Grow geometrically so a growing trajectory reallocates rarely.
            let capacity = needed.next_power_of_two().max(64 * 1024);
            self.lines = Some(LineBuffer {
                buffer: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("lines"),
                    size: capacity,
                    usage: wgpu::BufferUsages::VERTEX | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                capacity,
                vertices: 0,
            });
        }
        if let Some(lines) = &mut self.lines {
            queue.write_buffer(&lines.buffer, 0, bytes);
            lines.vertices = vertices.len() as u32;
        }
    }

    fn ensure_offscreen(&mut self, device: &wgpu::Device, size: [u32; 2]) {
        if self.offscreen.as_ref().is_some_and(|o| o.size == size) {
            return;
        }
        let extent = wgpu::Extent3d {
            width: size[0],
            height: size[1],
            depth_or_array_layers: 1,
        };
        let texture = |label, format, usage| {
            device.create_texture(&wgpu::TextureDescriptor {
                label: Some(label),
                size: extent,
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format,
                usage,
                view_formats: &[],
            })
        };
        let colour = texture(
            "scene_colour",
            self.colour_format,
            // COPY_SRC: the bench and the tests read the picture back.
            wgpu::TextureUsages::RENDER_ATTACHMENT
                | wgpu::TextureUsages::TEXTURE_BINDING
                | wgpu::TextureUsages::COPY_SRC,
        );
        let depth = texture(
            "scene_depth",
            DEPTH_FORMAT,
            wgpu::TextureUsages::RENDER_ATTACHMENT,
        );
        let colour_view = colour.create_view(&wgpu::TextureViewDescriptor::default());
        let blit_bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("scene_blit"),
            layout: &self.blit_layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::TextureView(&colour_view),
            }],
        });
        self.offscreen = Some(Offscreen {
            size,
            colour,
            colour_view,
            depth_view: depth.create_view(&wgpu::TextureViewDescriptor::default()),
            blit_bind_group,
        });
    }

    /// The path `frame` is drawn with: its own, or the sprites where the device cannot run it
    /// or the view's visibility buffer would not fit one storage binding.
    pub fn drawn_path(&self, frame: &SceneFrame) -> RenderPath {
        let fits = self.raster.as_ref().is_some_and(|r| r.fits(frame.size_px));
        if self.supports(frame.path) && (fits || !frame.path.is_compute()) {
            frame.path
        } else {
            RenderPath::Sprites
        }
    }

    /// The offscreen colour target (after a render), for reading the picture back.
    pub fn colour_texture(&self) -> Option<&wgpu::Texture> {
        self.offscreen.as_ref().map(|o| &o.colour)
    }

    /// Encodes one repaint of the 3D view into its offscreen target (sized to the frame),
    /// through `frame.path` (the sprites when the device cannot run it). With `timestamps` (a
    /// query set of two), the GPU writes when the first pass starts and the last one ends.
    pub fn encode_scene(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        encoder: &mut wgpu::CommandEncoder,
        frame: &SceneFrame,
        timestamps: Option<&wgpu::QuerySet>,
    ) {
        if frame.size_px[0] == 0 || frame.size_px[1] == 0 {
            return;
        }
        self.ensure_offscreen(device, frame.size_px);
        queue.write_buffer(&self.uniform_buffer, 0, bytemuck::bytes_of(&frame.uniforms));
        let path = self.drawn_path(frame);
        let mut scene_begin = timestamps.map(|q| (q, 0u32));
        if path.is_compute()
            && let Some(raster) = &mut self.raster
        {
            let draws: Vec<(&wgpu::BindGroup, u32, u32)> = frame
                .draws
                .iter()
                .filter_map(|&(chunk, n)| {
                    let first = (chunk as u32).saturating_mul(self.chunk_points);
                    self.chunks.get(chunk).map(|c| (&c.bind_group, n, first))
                })
                .collect();
            let writes = timestamps.map(|query_set| wgpu::ComputePassTimestampWrites {
                query_set,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: None,
            });
            if raster.encode_splats(
                device,
                queue,
                encoder,
                path,
                frame.size_px,
                &self.uniform_bind_group,
                &draws,
                writes,
            ) {
                scene_begin = None;
            }
        }
        let Some(target) = &self.offscreen else {
            return;
        };
        let mut pass = encoder.begin_render_pass(&wgpu::RenderPassDescriptor {
            label: Some("scene"),
            color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                view: &target.colour_view,
                resolve_target: None,
                ops: wgpu::Operations {
                    load: wgpu::LoadOp::Clear(CLEAR),
                    store: wgpu::StoreOp::Store,
                },
                depth_slice: None,
            })],
            depth_stencil_attachment: Some(wgpu::RenderPassDepthStencilAttachment {
                view: &target.depth_view,
                depth_ops: Some(wgpu::Operations {
                    load: wgpu::LoadOp::Clear(1.0),
                    store: wgpu::StoreOp::Discard,
                }),
                stencil_ops: None,
            }),
            occlusion_query_set: None,
            timestamp_writes: timestamps.map(|query_set| wgpu::RenderPassTimestampWrites {
                query_set,
                beginning_of_pass_write_index: scene_begin.map(|(_, i)| i),
                end_of_pass_write_index: Some(1),
            }),
            multiview_mask: None,
        });
        pass.set_bind_group(0, &self.uniform_bind_group, &[]);
        if path.is_compute() {
            if let Some(raster) = &self.raster {
                raster.resolve(&mut pass, path);
            }
        } else {
            pass.set_pipeline(&self.points_pipeline);
            for &(chunk, sprites) in &frame.draws {
                let Some(gpu) = self.chunks.get(chunk) else {
                    continue;
                };
                pass.set_bind_group(1, &gpu.bind_group, &[]);
                // The instance index tells the shader which chunk it reads (the frame table).
                let chunk = chunk as u32;
                pass.draw(0..sprites.saturating_mul(SPRITE_VERTICES), chunk..chunk + 1);
            }
        }
        if let Some(lines) = self
            .lines
            .as_ref()
            .filter(|l| frame.draw_lines && l.vertices > 0)
        {
            pass.set_pipeline(&self.lines_pipeline);
            pass.set_vertex_buffer(0, lines.buffer.slice(..));
            pass.draw(0..lines.vertices, 0..1);
        }
    }
}

#[allow(clippy::too_many_arguments)] // one call site per pipeline; a builder would be noise
fn pipeline(
    device: &wgpu::Device,
    label: &str,
    source: &str,
    layouts: &[&wgpu::BindGroupLayout],
    vertex_buffers: &[wgpu::VertexBufferLayout<'_>],
    topology: wgpu::PrimitiveTopology,
    depth_stencil: Option<wgpu::DepthStencilState>,
    colour_format: wgpu::TextureFormat,
) -> wgpu::RenderPipeline {
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let layouts: Vec<Option<&wgpu::BindGroupLayout>> = layouts.iter().map(|l| Some(*l)).collect();
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(label),
        bind_group_layouts: &layouts,
        immediate_size: 0,
    });
    let buffers: Vec<Option<wgpu::VertexBufferLayout<'_>>> =
        vertex_buffers.iter().cloned().map(Some).collect();
    device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
        label: Some(label),
        layout: Some(&layout),
        vertex: wgpu::VertexState {
            module: &module,
            entry_point: Some("vs_main"),
            buffers: &buffers,
            compilation_options: wgpu::PipelineCompilationOptions::default(),
        },
        primitive: wgpu::PrimitiveState {
            topology,
            ..Default::default()
        },
        depth_stencil,
        multisample: wgpu::MultisampleState::default(),
        fragment: Some(wgpu::FragmentState {
            module: &module,
            entry_point: Some("fs_main"),
            targets: &[Some(wgpu::ColorTargetState {
                format: colour_format,
                blend: None,
                write_mask: wgpu::ColorWrites::ALL,
            })],
            compilation_options: wgpu::PipelineCompilationOptions::default(),
        }),
        multiview_mask: None,
        cache: None,
    })
}

/// Everything one repaint of the 3D view needs; cheap to build every frame.
#[derive(Debug, Clone)]
pub struct SceneFrame {
    pub uniforms: ViewUniforms,
    /// Size of the offscreen target in physical pixels.
    pub size_px: [u32; 2],
    /// (chunk, points drawn) for each chunk with points.
    pub draws: Vec<(usize, u32)>,
    pub draw_lines: bool,
    /// How the points are drawn (the sprites where the device cannot run it).
    pub path: RenderPath,
}

impl egui_wgpu::CallbackTrait for SceneFrame {
    fn prepare(
        &self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        _screen_descriptor: &egui_wgpu::ScreenDescriptor,
        egui_encoder: &mut wgpu::CommandEncoder,
        callback_resources: &mut egui_wgpu::CallbackResources,
    ) -> Vec<wgpu::CommandBuffer> {
        let Some(renderer) = callback_resources.get_mut::<SceneRenderer>() else {
            return Vec::new();
        };
        renderer.encode_scene(device, queue, egui_encoder, self, None);
        Vec::new()
    }

    fn paint(
        &self,
        _info: egui::PaintCallbackInfo,
        render_pass: &mut wgpu::RenderPass<'static>,
        callback_resources: &egui_wgpu::CallbackResources,
    ) {
        let Some(renderer) = callback_resources.get::<SceneRenderer>() else {
            return;
        };
        let Some(target) = &renderer.offscreen else {
            return;
        };
        render_pass.set_pipeline(&renderer.blit_pipeline);
        render_pass.set_bind_group(0, &target.blit_bind_group, &[]);
        render_pass.draw(0..3, 0..1);
    }
}
