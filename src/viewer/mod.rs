//! The desktop viewer: the point cloud growing in real time beside live panels of the paged KV
//! cache. It reads `FrameResult`s from a channel and never touches the model.
//!
//! * `app`: the eframe app (layout, draining results, exit/screenshot plan).
//! * `cloud_view`, `camera`, `chunks`, `lines`, `render`, `shaders`: the 3D view.
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
pub mod history;
pub mod lines;
pub mod panels;
pub mod render;
pub mod shaders;

pub use app::{ExitPlan, ViewerApp, ViewerError, ViewerOptions, ViewerReport, run_viewer};
pub use control::{StreamSettings, ViewerControl, ViewerEvent};
pub use feed::{FedRun, Feed, show};
