//! Every WGSL module the viewer creates parses and validates with naga (the compiler wgpu uses),
//! with no more capabilities than the device it runs on is asked for, and the uniform/point
//! layouts the shaders declare match the Rust structs uploaded into them.

use naga::valid::{Capabilities, ValidationFlags, Validator};
use streamrecon::viewer::point_format::POINT_BYTES;
use streamrecon::viewer::raster::ChunkDraw;
use streamrecon::viewer::render::ViewUniforms;
use streamrecon::viewer::shaders::{self, ShaderNeeds};

fn capabilities(needs: ShaderNeeds) -> Capabilities {
    match needs {
        ShaderNeeds::Base => Capabilities::empty(),
        ShaderNeeds::Int64AtomicMinMax => {
            Capabilities::SHADER_INT64 | Capabilities::SHADER_INT64_ATOMIC_MIN_MAX
        }
        ShaderNeeds::Int64AtomicAll => {
            Capabilities::SHADER_INT64 | Capabilities::SHADER_INT64_ATOMIC_ALL_OPS
        }
    }
}

fn validate(
    name: &str,
    source: &str,
    caps: Capabilities,
) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{name}.wgsl does not parse:\n{}", e.emit_to_string(source)))?;
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("{name}.wgsl does not validate: {e:?}"))?;
    Ok((module, info))
}

fn struct_size(module: &naga::Module, name: &str) -> u32 {
    module
        .types
        .iter()
        .find(|(_, ty)| ty.name.as_deref() == Some(name))
        .map(|(handle, _)| {
            let mut layouter = naga::proc::Layouter::default();
            layouter
                .update(module.to_ctx())
                .unwrap_or_else(|e| panic!("layout: {e:?}"));
            layouter[handle].size
        })
        .unwrap_or_else(|| panic!("no struct {name}"))
}

fn entry_points(module: &naga::Module) -> Vec<&str> {
    module
        .entry_points
        .iter()
        .map(|e| e.name.as_str())
        .collect()
}

#[test]
fn all_shaders_validate_with_entry_points() {
    let all = shaders::all();
    assert_eq!(all.len(), 7);
    for (name, source, needs) in all {
        let (module, _) =
            validate(&name, source, capabilities(needs)).unwrap_or_else(|e| panic!("{e}"));
        let entries = entry_points(&module);
        let expected: &[&str] = match name.as_str() {
            "raster64" | "raster64_peek" => &["cs_main"],
            "raster32" => &["cs_depth", "cs_colour"],
            "resolve" => &["vs_main", "fs_resolve64", "fs_resolve32"],
            _ => &["vs_main", "fs_main"],
        };
        for e in expected {
            assert!(entries.contains(e), "{name}: {entries:?}");
        }
    }
}

#[test]
fn the_64_bit_rasteriser_needs_exactly_int64_atomic_min_max() {
    // Without the capability naga must refuse it (so the device check in the renderer matters),
    // and with only MIN_MAX (not ALL_OPS) it must pass: that is all the renderer asks for.
    let without = validate(
        "raster64",
        shaders::POINT_SHADERS.raster64,
        Capabilities::SHADER_INT64,
    );
    assert!(
        without.is_err(),
        "raster64 validated without 64-bit atomics"
    );
    validate(
        "raster64",
        shaders::POINT_SHADERS.raster64,
        Capabilities::SHADER_INT64 | Capabilities::SHADER_INT64_ATOMIC_MIN_MAX,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn shader_layouts_match_the_rust_structs() {
    let s = shaders::POINT_SHADERS;
    for (name, source) in [
        ("points", s.points),
        ("raster32", s.raster32),
        ("resolve", shaders::RESOLVE),
    ] {
        let (module, _) =
            validate(name, source, Capabilities::empty()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            struct_size(&module, "ViewUniforms") as usize,
            std::mem::size_of::<ViewUniforms>(),
            "{name}"
        );
    }
    let (points, _) =
        validate("points", s.points, Capabilities::empty()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(u64::from(struct_size(&points, "StoredPoint")), POINT_BYTES);
    let (raster, _) =
        validate("raster32", s.raster32, Capabilities::empty()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        struct_size(&raster, "ChunkDraw") as usize,
        std::mem::size_of::<ChunkDraw>()
    );
}

#[test]
fn the_point_shader_decodes_confidence_as_the_rust_side() {
    // The WGSL constants are written out; they must be the Rust ones.
    use streamrecon::viewer::point_format::{LN_CONFIDENCE_MIN, LN_CONFIDENCE_STEP};
    let source = include_str!("../shaders/stored_point.wgsl");
    let constant = |name: &str| -> f32 {
        let line = source
            .lines()
            .find(|l| l.starts_with(&format!("const {name}: f32 = ")))
            .unwrap_or_else(|| panic!("no {name}"));
        line.rsplit(' ')
            .next()
            .and_then(|v| v.trim_end_matches(';').parse().ok())
            .unwrap_or_else(|| panic!("bad {line}"))
    };
    assert!((constant("LN_CONFIDENCE_MIN") - LN_CONFIDENCE_MIN).abs() < 1e-6);
    assert!((constant("LN_CONFIDENCE_STEP") / LN_CONFIDENCE_STEP - 1.0).abs() < 1e-6);
}
