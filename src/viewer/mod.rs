//! The desktop viewer: the point cloud growing in real time beside live panels of the paged KV
//! cache. It reads `FrameResult`s from a channel and never touches the model.
//!
//! * `app`: the eframe app (layout, draining results, exit/screenshot plan).
//! * `cloud_view`, `camera`, `chunks`, `lines`, `render`, `raster`, `scene`, `shaders`: the 3D
//!   view (sprites or the compute rasteriser); `gpu`: the device it asks for, and a headless one.
//! * `history`: what the panels show, accumulated from results; `panels`: the `_ui` functions.
//! * `control`: the window's messages in and out; `demo`: a synthetic stream for tests and demos.
//! * `feed`: what feeds the window (a live pipeline, a replay, the demo), one way in for all.

pub mod app;
pub mod camera;
pub mod chunks;
pub mod cloud_view;
pub mod control;
pub mod demo;
pub mod feed;
pub mod fps;
pub mod gpu;
pub mod history;
pub mod lines;
pub mod panels;
pub mod picture;
pub mod point_format;
pub mod raster;
pub mod render;
pub mod scene;
pub mod shaders;

pub use app::{ExitPlan, ViewerApp, ViewerError, ViewerOptions, ViewerReport, run_viewer};
pub use control::{StreamSettings, ViewerControl, ViewerEvent};
pub use feed::{FedRun, Feed, show};
