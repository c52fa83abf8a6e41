//! Which wgpu device the 3D view asks for, and a headless one (no window, no surface) for the
//! viewer bench and the rendering tests.
//!
//! The window and the headless device ask for the same optional features, so the same
//! rasteriser runs in both: 64-bit atomics for the compute rasteriser, timestamp queries for the
//! bench, and the adapter's own buffer limits so the point store can use large chunks.

use std::sync::Arc;

use eframe::egui_wgpu::{self, wgpu};

/// Percent of the driver's memory budget past which wgpu refuses new buffers (Vulkan with
/// `VK_EXT_memory_budget`, DX12): the point store grows chunk by chunk until a chunk is refused,
/// leaving the rest for the window, the compositor and other programs. Elsewhere the store grows
/// until the driver itself reports out of memory.
pub const MEMORY_BUDGET_PERCENT: u8 = 90;

/// The instance's memory thresholds (see [`MEMORY_BUDGET_PERCENT`]).
pub fn memory_thresholds() -> wgpu::MemoryBudgetThresholds {
    wgpu::MemoryBudgetThresholds {
        for_resource_creation: Some(MEMORY_BUDGET_PERCENT),
        for_device_loss: None,
    }
}

/// eframe's wgpu setup for the window: its defaults, with the 3D view's device descriptor and
/// memory thresholds.
pub fn window_wgpu_options() -> egui_wgpu::WgpuConfiguration {
    let mut setup = egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    setup.instance_descriptor.memory_budget_thresholds = memory_thresholds();
    setup.device_descriptor = Arc::new(device_descriptor);
    egui_wgpu::WgpuConfiguration {
        wgpu_setup: egui_wgpu::WgpuSetup::CreateNew(setup),
        ..Default::default()
    }
}

/// Optional features the 3D view uses when the adapter has them.
pub fn wanted_features(adapter: wgpu::Features) -> wgpu::Features {
    let mut wanted = wgpu::Features::TIMESTAMP_QUERY;
    // The 64-bit visibility buffer needs u64 values in shaders and u64 atomic max.
    let int64 = wgpu::Features::SHADER_INT64 | wgpu::Features::SHADER_INT64_ATOMIC_MIN_MAX;
    if adapter.contains(int64) {
        // ALL_OPS adds the 64-bit load that lets losing points skip their atomic.
        wanted |= int64 | wgpu::Features::SHADER_INT64_ATOMIC_ALL_OPS;
    }
    adapter & wanted
}

/// Limits the 3D view asks for: wgpu's defaults, with the adapter's own buffer sizes (larger
/// point chunks) and a texture size for 4k+ displays.
pub fn wanted_limits(adapter: &wgpu::Adapter) -> wgpu::Limits {
    let supported = adapter.limits();
    let base = if adapter.get_info().backend == wgpu::Backend::Gl {
        wgpu::Limits::downlevel_webgl2_defaults()
    } else {
        wgpu::Limits::default()
    };
    wgpu::Limits {
        max_texture_dimension_2d: 8192.min(supported.max_texture_dimension_2d),
        max_buffer_size: supported.max_buffer_size.max(base.max_buffer_size),
        max_storage_buffer_binding_size: supported
            .max_storage_buffer_binding_size
            .max(base.max_storage_buffer_binding_size),
        ..base
    }
}

/// The device descriptor of the 3D view (the window's and the headless one).
pub fn device_descriptor(adapter: &wgpu::Adapter) -> wgpu::DeviceDescriptor<'static> {
    wgpu::DeviceDescriptor {
        label: Some("streamrecon device"),
        required_features: wanted_features(adapter.features()),
        required_limits: wanted_limits(adapter),
        ..Default::default()
    }
}

/// Why no headless device could be had.
#[derive(Debug, thiserror::Error)]
pub enum HeadlessError {
    #[error(
        "no wgpu adapter (Vulkan, Metal, DX12 or GL) was found: {0}; on Linux install a Vulkan driver (mesa-vulkan-drivers gives a CPU one)"
    )]
    NoAdapter(String),
    #[error("the adapter {adapter} refused a device: {reason}")]
    NoDevice { adapter: String, reason: String },
}

/// A device with no window: what `bench viewer` and the rendering tests draw with.
pub struct HeadlessGpu {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
}

impl HeadlessGpu {
    /// The adapter wgpu prefers (a discrete GPU before an integrated one before a CPU one),
    /// on any native backend.
    pub fn open() -> Result<Self, HeadlessError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY),
            flags: wgpu::InstanceFlags::from_build_config().with_env(),
            backend_options: wgpu::BackendOptions::from_env_or_default(),
            memory_budget_thresholds: memory_thresholds(),
            display: None,
        });
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| HeadlessError::NoAdapter(e.to_string()))?;
        let (device, queue) = pollster::block_on(
            adapter.request_device(&device_descriptor(&adapter)),
        )
        .map_err(|e| HeadlessError::NoDevice {
            adapter: adapter.get_info().name,
            reason: e.to_string(),
        })?;
        Ok(Self {
            adapter,
            device,
            queue,
        })
    }

    /// "NAME (backend, driver)", for reports.
    pub fn adapter_name(&self) -> String {
        let info = self.adapter.get_info();
        let driver = [info.driver.as_str(), info.driver_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        if driver.is_empty() {
            format!("{} ({:?})", info.name, info.backend)
        } else {
            format!("{} ({:?}, {driver})", info.name, info.backend)
        }
    }
}
