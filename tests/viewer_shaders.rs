//! Every WGSL module the viewer creates parses and validates with naga (the compiler wgpu uses),
//! with no more capabilities than the device it runs on is asked for, and the uniform/point
//! layouts the shaders declare match the Rust structs uploaded into them.

use naga::valid::{Capabilities, ValidationFlags, Validator};
use streamrecon::viewer::chunks::GpuPoint;
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
    for (name, source, needs) in shaders::all() {
        let (module, _) =
            validate(name, source, capabilities(needs)).unwrap_or_else(|e| panic!("{e}"));
        let entries = entry_points(&module);
        let expected: &[&str] = match name {
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
    let without = validate("raster64", shaders::RASTER64, Capabilities::SHADER_INT64);
    assert!(
        without.is_err(),
        "raster64 validated without 64-bit atomics"
    );
    validate(
        "raster64",
        shaders::RASTER64,
        Capabilities::SHADER_INT64 | Capabilities::SHADER_INT64_ATOMIC_MIN_MAX,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn shader_layouts_match_the_rust_structs() {
    for (name, source) in [
        ("points", shaders::POINTS),
        ("raster32", shaders::RASTER32),
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
    let (points, _) = validate("points", shaders::POINTS, Capabilities::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        struct_size(&points, "StoredPoint") as usize,
        std::mem::size_of::<GpuPoint>()
    );
    let (raster, _) = validate("raster32", shaders::RASTER32, Capabilities::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        struct_size(&raster, "ChunkDraw") as usize,
        std::mem::size_of::<ChunkDraw>()
    );
}
