//! WGSL sources, compiled into the binary. `common.wgsl` (the view uniforms and colour ramp) is
//! prepended to every shader that reads the view, and `point.wgsl` (the stored point and its
//! colour) to both point paths, so sprites and the compute rasteriser filter and colour alike.

pub const POINTS: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/point.wgsl"),
    include_str!("../../shaders/points.wgsl")
);

pub const LINES: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/lines.wgsl")
);

pub const BLIT: &str = include_str!("../../shaders/blit.wgsl");

/// The compute rasteriser with one 64-bit atomic per pixel (needs `SHADER_INT64` and
/// `SHADER_INT64_ATOMIC_MIN_MAX`), every covered pixel written.
pub const RASTER64: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/point.wgsl"),
    include_str!("../../shaders/splat.wgsl"),
    include_str!("../../shaders/raster64_blind.wgsl"),
    include_str!("../../shaders/raster64.wgsl")
);

/// The same with a load before each write (needs `SHADER_INT64_ATOMIC_ALL_OPS` too), so points
/// behind the pixel's nearest skip the atomic.
pub const RASTER64_PEEK: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/point.wgsl"),
    include_str!("../../shaders/splat.wgsl"),
    include_str!("../../shaders/raster64_peek.wgsl"),
    include_str!("../../shaders/raster64.wgsl")
);

/// The compute rasteriser in two 32-bit passes (depth, then colour).
pub const RASTER32: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/point.wgsl"),
    include_str!("../../shaders/splat.wgsl"),
    include_str!("../../shaders/raster32.wgsl")
);

/// The visibility buffer of either compute rasteriser into colour and depth.
pub const RESOLVE: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/resolve.wgsl")
);

/// What a shader module needs of the device beyond WebGPU's base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShaderNeeds {
    Base,
    /// 64-bit integers and 64-bit atomic min/max on storage buffers.
    Int64AtomicMinMax,
    /// 64-bit integers and every 64-bit atomic on storage buffers.
    Int64AtomicAll,
}

/// Every shader module the viewer creates, by name, with what it needs (for validation tests).
pub fn all() -> [(&'static str, &'static str, ShaderNeeds); 7] {
    [
        ("points", POINTS, ShaderNeeds::Base),
        ("lines", LINES, ShaderNeeds::Base),
        ("blit", BLIT, ShaderNeeds::Base),
        ("raster64", RASTER64, ShaderNeeds::Int64AtomicMinMax),
        ("raster64_peek", RASTER64_PEEK, ShaderNeeds::Int64AtomicAll),
        ("raster32", RASTER32, ShaderNeeds::Base),
        ("resolve", RESOLVE, ShaderNeeds::Base),
    ]
}
