//! The compute rasteriser of the point cloud: points splatted by compute shaders into a
//! per-pixel visibility buffer with atomics, then resolved into the offscreen colour + depth
//! target the sprites would have drawn into (so lines, blit and screenshots are unchanged).
//!
//! Two variants: one 64-bit `atomicMax` per pixel (depth key high, colour low) where the device
//! has `SHADER_INT64_ATOMIC_MIN_MAX`, else a 32-bit depth pass then colour pass. Both read the
//! same point chunks as the sprites.

use std::num::NonZeroU64;

use bytemuck::{Pod, Zeroable};
use eframe::egui_wgpu::wgpu;

use super::shaders;

/// Threads per workgroup of both rasterisers (`@workgroup_size` in raster32/64.wgsl).
pub const WORKGROUP_THREADS: u32 = 256;

/// How the 3D view draws its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RenderPath {
    /// One screen-aligned quad per point through the raster pipeline (every adapter).
    Sprites,
    /// Compute shaders, one 64-bit atomic per covered pixel.
    Compute,
    /// Compute shaders, 32-bit atomics in two passes (depth, then colour).
    Compute32,
}

impl RenderPath {
    pub const ALL: [Self; 3] = [Self::Sprites, Self::Compute, Self::Compute32];

    pub fn name(self) -> &'static str {
        match self {
            Self::Sprites => "sprites",
            Self::Compute => "compute",
            Self::Compute32 => "compute32",
        }
    }

    /// For the memory panel.
    pub fn description(self) -> &'static str {
        match self {
            Self::Sprites => "sprites (raster pipeline)",
            Self::Compute => "compute (64-bit atomics)",
            Self::Compute32 => "compute (32-bit, two passes)",
        }
    }

    pub fn is_compute(self) -> bool {
        self != Self::Sprites
    }

    /// Whether a device with these features and downlevel flags can run this path.
    pub fn supported(self, features: wgpu::Features, downlevel: wgpu::DownlevelFlags) -> bool {
        match self {
            Self::Sprites => true,
            Self::Compute32 => downlevel.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS),
            Self::Compute => {
                downlevel.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
                    && features.contains(
                        wgpu::Features::SHADER_INT64 | wgpu::Features::SHADER_INT64_ATOMIC_MIN_MAX,
                    )
            }
        }
    }

    /// The path the window takes by itself: the 64-bit compute rasteriser where the device
    /// has it, else the 32-bit one where it runs compute shaders, else the sprites. Measured on
    /// an H200 at 1920x1080 (docs/viewer.md): 100 M points in 1.9 ms (64-bit), 3.2 ms (32-bit)
    /// and 537 ms (sprites, which are bound by its few raster units at 5.4 ns a point).
    pub fn auto(features: wgpu::Features, downlevel: wgpu::DownlevelFlags) -> Self {
        [Self::Compute, Self::Compute32]
            .into_iter()
            .find(|p| p.supported(features, downlevel))
            .unwrap_or(Self::Sprites)
    }
}

impl std::str::FromStr for RenderPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown render path `{s}` (sprites, compute, compute32)"))
    }
}

/// Per-dispatch parameters (`ChunkDraw` in shaders/splat.wgsl).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
pub struct ChunkDraw {
    pub count: u32,
    pub row_threads: u32,
    pub chunk_first: u32,
    pub pad: u32,
}

/// Workgroups for `threads` threads as (x, y), x within the per-dimension limit; the shader
/// folds the id back with `row_threads = x * WORKGROUP_THREADS`.
pub fn dispatch_size(threads: u32, max_per_dimension: u32) -> (u32, u32) {
    let groups = threads.div_ceil(WORKGROUP_THREADS).max(1);
    let max = max_per_dimension.max(1);
    if groups <= max {
        (groups, 1)
    } else {
        let y = groups.div_ceil(max);
        (groups.div_ceil(y), y)
    }
}

/// Pipelines, layouts and the per-size visibility buffers of the compute paths.
pub struct ComputeRaster {
    raster64: Option<wgpu::ComputePipeline>,
    depth32: wgpu::ComputePipeline,
    colour32: wgpu::ComputePipeline,
    resolve64: Option<wgpu::RenderPipeline>,
    resolve32: wgpu::RenderPipeline,
    target64_layout: wgpu::BindGroupLayout,
    target32_layout: wgpu::BindGroupLayout,
    resolve64_layout: wgpu::BindGroupLayout,
    resolve32_layout: wgpu::BindGroupLayout,
    draw_stride: u64,
    draw_capacity: u64,
    draw_buffer: wgpu::Buffer,
    max_groups_per_dimension: u32,
    /// The device's largest storage binding: a view whose visibility buffer would not fit is
    /// drawn with sprites.
    max_binding_bytes: u64,
    targets: Option<Targets>,
}

/// The visibility buffers of one view size and one path (only that path's: 8 bytes a pixel),
/// with their bind groups.
struct Targets {
    pixels: u64,
    path: RenderPath,
    draw_capacity: u64,
    /// Bind groups of the splat passes and the resolve.
    target: wgpu::BindGroup,
    resolve: wgpu::BindGroup,
    /// Cleared before each frame: the 64-bit buffer, or the 32-bit depth keys and colours.
    buffers: Vec<wgpu::Buffer>,
}

fn storage_entry(
    binding: u32,
    visibility: wgpu::ShaderStages,
    read_only: bool,
) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

fn draw_entry() -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding: 1,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: NonZeroU64::new(std::mem::size_of::<ChunkDraw>() as u64),
        },
        count: None,
    }
}

impl ComputeRaster {
    /// `None` when the device cannot run compute shaders. `uniform_layout` and `chunk_layout`
    /// are the sprites' (groups 0 and 1 are shared).
    pub fn new(
        device: &wgpu::Device,
        uniform_layout: &wgpu::BindGroupLayout,
        chunk_layout: &wgpu::BindGroupLayout,
        colour_format: wgpu::TextureFormat,
        depth_format: wgpu::TextureFormat,
        downlevel: wgpu::DownlevelFlags,
        point_shaders: shaders::PointShaders,
    ) -> Option<Self> {
        if !RenderPath::Compute32.supported(device.features(), downlevel) {
            return None;
        }
        let with64 = RenderPath::Compute.supported(device.features(), downlevel);
        let compute = wgpu::ShaderStages::COMPUTE;
        let fragment = wgpu::ShaderStages::FRAGMENT;
        let layout = |label, entries: &[wgpu::BindGroupLayoutEntry]| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(label),
                entries,
            })
        };
        let target64_layout = layout(
            "raster64_target",
            &[storage_entry(0, compute, false), draw_entry()],
        );
        let target32_layout = layout(
            "raster32_target",
            &[
                storage_entry(0, compute, false),
                draw_entry(),
                storage_entry(2, compute, false),
            ],
        );
        let resolve64_layout = layout("resolve64", &[storage_entry(0, fragment, true)]);
        let resolve32_layout = layout(
            "resolve32",
            &[
                storage_entry(1, fragment, true),
                storage_entry(2, fragment, true),
            ],
        );
        let compute_pipeline = |label, source: &str, entry, target: &wgpu::BindGroupLayout| {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
            let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(label),
                bind_group_layouts: &[Some(uniform_layout), Some(chunk_layout), Some(target)],
                immediate_size: 0,
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: Some(&layout),
                module: &module,
                entry_point: Some(entry),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            })
        };
        let resolve_module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("resolve"),
            source: wgpu::ShaderSource::Wgsl(shaders::RESOLVE.into()),
        });
        let resolve_pipeline = |label, entry, target: &wgpu::BindGroupLayout| {
            let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(label),
                bind_group_layouts: &[Some(uniform_layout), None, Some(target)],
                immediate_size: 0,
            });
            device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
                label: Some(label),
                layout: Some(&layout),
                vertex: wgpu::VertexState {
                    module: &resolve_module,
                    entry_point: Some("vs_main"),
                    buffers: &[],
                    compilation_options: wgpu::PipelineCompilationOptions::default(),
                },
                primitive: wgpu::PrimitiveState::default(),
                // The visibility buffer already kept the nearest point: write its depth as is.
                depth_stencil: Some(wgpu::DepthStencilState {
                    format: depth_format,
                    depth_write_enabled: Some(true),
                    depth_compare: Some(wgpu::CompareFunction::Always),
                    stencil: wgpu::StencilState::default(),
                    bias: wgpu::DepthBiasState::default(),
                }),
                multisample: wgpu::MultisampleState::default(),
                fragment: Some(wgpu::FragmentState {
                    module: &resolve_module,
                    entry_point: Some(entry),
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
        };
        let peek = device
            .features()
            .contains(wgpu::Features::SHADER_INT64_ATOMIC_ALL_OPS);
        let raster64_source = if peek {
            point_shaders.raster64_peek
        } else {
            point_shaders.raster64
        };
        let raster64 = with64
            .then(|| compute_pipeline("raster64", raster64_source, "cs_main", &target64_layout));
        let resolve64 =
            with64.then(|| resolve_pipeline("resolve64", "fs_resolve64", &resolve64_layout));
        let depth32 = compute_pipeline(
            "raster32_depth",
            point_shaders.raster32,
            "cs_depth",
            &target32_layout,
        );
        let colour32 = compute_pipeline(
            "raster32_colour",
            point_shaders.raster32,
            "cs_colour",
            &target32_layout,
        );
        let resolve32 = resolve_pipeline("resolve32", "fs_resolve32", &resolve32_layout);
        let limits = device.limits();
        let draw_stride = u64::from(limits.min_uniform_buffer_offset_alignment)
            .max(std::mem::size_of::<ChunkDraw>() as u64);
        let draw_capacity = 64;
        Some(Self {
            raster64,
            depth32,
            colour32,
            resolve64,
            resolve32,
            target64_layout,
            target32_layout,
            resolve64_layout,
            resolve32_layout,
            draw_stride,
            draw_capacity,
            draw_buffer: Self::draw_buffer(device, draw_stride, draw_capacity),
            max_groups_per_dimension: limits.max_compute_workgroups_per_dimension,
            max_binding_bytes: limits.max_storage_buffer_binding_size,
            targets: None,
        })
    }

    fn draw_buffer(device: &wgpu::Device, stride: u64, capacity: u64) -> wgpu::Buffer {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("raster_chunk_draws"),
            size: stride * capacity,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Whether a view of `size` pixels fits the device's storage bindings (8 bytes a pixel).
    pub fn fits(&self, size: [u32; 2]) -> bool {
        u64::from(size[0]) * u64::from(size[1]) * 8 <= self.max_binding_bytes
    }

    pub fn supports(&self, path: RenderPath) -> bool {
        match path {
            RenderPath::Sprites => false,
            RenderPath::Compute => self.raster64.is_some(),
            RenderPath::Compute32 => true,
        }
    }

    /// Bytes of the visibility buffers at the current size.
    pub fn target_bytes(&self) -> u64 {
        self.targets
            .as_ref()
            .map_or(0, |t| t.buffers.iter().map(wgpu::Buffer::size).sum())
    }

    /// (Re)creates the visibility buffers of `path` (a compute path this raster supports) for a
    /// view of `size` pixels and room for `draws` chunk dispatches.
    fn ensure_targets(
        &mut self,
        device: &wgpu::Device,
        size: [u32; 2],
        draws: usize,
        path: RenderPath,
    ) {
        let pixels = u64::from(size[0]) * u64::from(size[1]);
        let draws = draws as u64;
        if self
            .targets
            .as_ref()
            .is_some_and(|t| t.pixels == pixels && t.path == path && t.draw_capacity >= draws)
        {
            return;
        }
        // The old buffers go before the new ones are made (a resize never holds both).
        self.targets = None;
        if draws > self.draw_capacity {
            self.draw_capacity = draws.next_power_of_two();
            self.draw_buffer = Self::draw_buffer(device, self.draw_stride, self.draw_capacity);
        }
        let storage = |label, bytes: u64| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.max(8),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let draw_binding = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.draw_buffer,
            offset: 0,
            size: NonZeroU64::new(std::mem::size_of::<ChunkDraw>() as u64),
        });
        let draw_entry = wgpu::BindGroupEntry {
            binding: 1,
            resource: draw_binding,
        };
        let group = |label, layout, entries: &[wgpu::BindGroupEntry]| {
            device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(label),
                layout,
                entries,
            })
        };
        fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
            wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            }
        }
        let (target, resolve, buffers) = if path == RenderPath::Compute {
            let visibility = storage("visibility64", pixels * 8);
            (
                group(
                    "raster64_target",
                    &self.target64_layout,
                    &[entry(0, &visibility), draw_entry],
                ),
                group(
                    "resolve64",
                    &self.resolve64_layout,
                    &[entry(0, &visibility)],
                ),
                vec![visibility],
            )
        } else {
            let depth = storage("depth_keys32", pixels * 4);
            let colour = storage("colours32", pixels * 4);
            (
                group(
                    "raster32_target",
                    &self.target32_layout,
                    &[entry(0, &depth), draw_entry, entry(2, &colour)],
                ),
                group(
                    "resolve32",
                    &self.resolve32_layout,
                    &[entry(1, &depth), entry(2, &colour)],
                ),
                vec![depth, colour],
            )
        };
        self.targets = Some(Targets {
            pixels,
            path,
            draw_capacity: self.draw_capacity,
            target,
            resolve,
            buffers,
        });
    }

    /// Splats every chunk's drawn points into the visibility buffer. `draws` are (chunk bind
    /// group, points drawn, the chunk's first point in the store) in chunk order; `path` must be a compute path this raster supports.
    /// Returns false (nothing encoded) otherwise.
    #[allow(clippy::too_many_arguments)] // the pass's inputs, each used once
    pub fn encode_splats(
        &mut self,
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        encoder: &mut wgpu::CommandEncoder,
        path: RenderPath,
        size: [u32; 2],
        uniform_group: &wgpu::BindGroup,
        draws: &[(&wgpu::BindGroup, u32, u32)],
        timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> bool {
        if !self.supports(path) {
            return false;
        }
        self.ensure_targets(device, size, draws.len(), path);
        let Some(targets) = &self.targets else {
            return false;
        };
        let mut params = vec![0u8; (self.draw_stride as usize) * draws.len().max(1)];
        let mut groups = Vec::with_capacity(draws.len());
        for (i, &(_, count, chunk_first)) in draws.iter().enumerate() {
            let (x, y) = dispatch_size(count, self.max_groups_per_dimension);
            let draw = ChunkDraw {
                count,
                row_threads: x * WORKGROUP_THREADS,
                chunk_first,
                pad: 0,
            };
            let at = i * self.draw_stride as usize;
            params[at..at + std::mem::size_of::<ChunkDraw>()]
                .copy_from_slice(bytemuck::bytes_of(&draw));
            groups.push((x, y));
        }
        queue.write_buffer(&self.draw_buffer, 0, &params);
        for buffer in &targets.buffers {
            encoder.clear_buffer(buffer, 0, None);
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("raster"),
            timestamp_writes,
        });
        pass.set_bind_group(0, uniform_group, &[]);
        let pipelines: Vec<&wgpu::ComputePipeline> = match path {
            RenderPath::Compute => self.raster64.iter().collect(),
            _ => vec![&self.depth32, &self.colour32],
        };
        let target = &targets.target;
        for pipeline in pipelines {
            pass.set_pipeline(pipeline);
            for (i, (&(chunk, count, _), &(x, y))) in draws.iter().zip(&groups).enumerate() {
                if count == 0 {
                    continue;
                }
                pass.set_bind_group(1, chunk, &[]);
                pass.set_bind_group(2, target, &[(i as u64 * self.draw_stride) as u32]);
                pass.dispatch_workgroups(x, y, 1);
            }
        }
        true
    }

    /// Draws the resolve (inside the scene's render pass, before the lines).
    pub fn resolve(&self, pass: &mut wgpu::RenderPass<'_>, path: RenderPath) {
        let Some(targets) = self.targets.as_ref().filter(|t| t.path == path) else {
            return;
        };
        let pipeline = match path {
            RenderPath::Compute => match &self.resolve64 {
                Some(p) => p,
                None => return,
            },
            RenderPath::Compute32 => &self.resolve32,
            RenderPath::Sprites => return,
        };
        pass.set_pipeline(pipeline);
        pass.set_bind_group(2, &targets.resolve, &[]);
        pass.draw(0..3, 0..1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_covers_every_thread_within_limits() {
        for (threads, max) in [
            (1u32, 65535u32),
            (256, 65535),
            (257, 65535),
            (1 << 24, 65535),
            (1 << 26, 65535),
            (1000, 3),
        ] {
            let (x, y) = dispatch_size(threads, max);
            assert!(x <= max && x >= 1 && y >= 1, "{threads}/{max}: {x}x{y}");
            assert!(
                u64::from(x) * u64::from(y) * u64::from(WORKGROUP_THREADS) >= u64::from(threads)
            );
        }
    }

    #[test]
    fn auto_prefers_the_64_bit_then_the_32_bit_compute_path() {
        let compute = wgpu::DownlevelFlags::COMPUTE_SHADERS;
        let int64 = wgpu::Features::SHADER_INT64 | wgpu::Features::SHADER_INT64_ATOMIC_MIN_MAX;
        assert_eq!(RenderPath::auto(int64, compute), RenderPath::Compute);
        assert_eq!(
            RenderPath::auto(wgpu::Features::empty(), compute),
            RenderPath::Compute32
        );
        assert_eq!(
            RenderPath::auto(int64, wgpu::DownlevelFlags::empty()),
            RenderPath::Sprites
        );
        assert!(RenderPath::Compute32.supported(wgpu::Features::empty(), compute));
        assert_eq!("compute32".parse::<RenderPath>(), Ok(RenderPath::Compute32));
        assert!("fast".parse::<RenderPath>().is_err());
    }
}
