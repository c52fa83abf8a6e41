//! The panels beside the 3D view. Each reads viewer state (never the model) and is an `_ui`
//! function, so tests can show any one of them alone.

pub mod controls;
pub mod input;
pub mod latency;
pub mod memory;
pub mod page_map;
pub mod timeline;

pub use controls::{
    ColourMode, ControlState, REPLAY_SPEEDS, RenderSettings, TimelineState, controls_ui,
    render_settings_ui, replay_timeline_ui,
};
pub use input::{InputThumbnails, input_ui};
pub use latency::latency_ui;
pub use memory::{GpuPointStats, memory_ui};
pub use page_map::page_map_ui;
pub use timeline::eviction_timeline_ui;
