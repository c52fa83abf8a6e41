//! WGSL sources, compiled into the binary. `common.wgsl` (the view uniforms and colour ramp) is
//! prepended to every shader that reads the view, and `point.wgsl` (the point and its colour)
//! with `stored_point.wgsl` (`load_point`) to both point paths, so sprites and the compute
//! rasteriser filter and colour alike.

/// A point shader: common, point and the stored point's loader, then the given files.
macro_rules! point_shader {
    ($($file:literal),*) => {
        concat!(
            include_str!("../../shaders/common.wgsl"),
            include_str!("../../shaders/point.wgsl"),
            include_str!("../../shaders/stored_point.wgsl"),
            $(include_str!(concat!("../../shaders/", $file)),)*
        )
    };
}

/// The shaders that read stored points.
#[derive(Debug, Clone, Copy)]
pub struct PointShaders {
    /// Sprites.
    pub points: &'static str,
    /// The compute rasteriser with one 64-bit atomic per pixel (needs `SHADER_INT64` and
    /// `SHADER_INT64_ATOMIC_MIN_MAX`), every covered pixel written.
    pub raster64: &'static str,
    /// The same with a load before each write (needs `SHADER_INT64_ATOMIC_ALL_OPS` too), so
    /// points behind the pixel's nearest skip the atomic.
    pub raster64_peek: &'static str,
    /// The compute rasteriser in two 32-bit passes (depth, then colour).
    pub raster32: &'static str,
}

pub const POINT_SHADERS: PointShaders = PointShaders {
    points: point_shader!("points.wgsl"),
    raster64: point_shader!("splat.wgsl", "raster64_blind.wgsl", "raster64.wgsl"),
    raster64_peek: point_shader!("splat.wgsl", "raster64_peek.wgsl", "raster64.wgsl"),
    raster32: point_shader!("splat.wgsl", "raster32.wgsl"),
};

pub const LINES: &str = concat!(
    include_str!("../../shaders/common.wgsl"),
    include_str!("../../shaders/lines.wgsl")
);

pub const BLIT: &str = include_str!("../../shaders/blit.wgsl");

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
pub fn all() -> Vec<(String, &'static str, ShaderNeeds)> {
    let p = POINT_SHADERS;
    [
        ("lines", LINES, ShaderNeeds::Base),
        ("blit", BLIT, ShaderNeeds::Base),
        ("resolve", RESOLVE, ShaderNeeds::Base),
        ("points", p.points, ShaderNeeds::Base),
        ("raster64", p.raster64, ShaderNeeds::Int64AtomicMinMax),
        (
            "raster64_peek",
            p.raster64_peek,
            ShaderNeeds::Int64AtomicAll,
        ),
        ("raster32", p.raster32, ShaderNeeds::Base),
    ]
    .into_iter()
    .map(|(name, source, needs)| (name.to_string(), source, needs))
    .collect()
}
