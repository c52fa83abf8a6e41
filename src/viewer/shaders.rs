//! WGSL sources, compiled into the binary. `common.wgsl` (the view uniforms and colour ramp) is
//! prepended to the point and line shaders so both agree on one uniform layout.

pub const POINTS: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/points.wgsl")
);

pub const LINES: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/lines.wgsl")
);

pub const BLIT: &str = include_str!("../../shaders/blit.wgsl");

/// Every shader module the viewer creates, by name (for validation tests).
pub fn all() -> [(&'static str, &'static str); 3] {
    [("points", POINTS), ("lines", LINES), ("blit", BLIT)]
}
