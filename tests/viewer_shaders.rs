//! Every WGSL module the viewer creates parses and validates with naga (the compiler wgpu uses),
//! and the uniform/point layouts the shaders declare match the Rust structs uploaded into them.

use naga::valid::{Capabilities, ValidationFlags, Validator};
use streamrecon::viewer::chunks::GpuPoint;
use streamrecon::viewer::render::ViewUniforms;
use streamrecon::viewer::shaders;

fn validate(name: &str, source: &str) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{name}.wgsl does not parse:\n{}", e.emit_to_string(source)));
    let info = Validator::new(ValidationFlags::all(), Capabilities::empty())
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}.wgsl does not validate: {e:?}"));
    (module, info)
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

#[test]
fn all_shaders_validate_with_entry_points() {
    for (name, source) in shaders::all() {
        let (module, _) = validate(name, source);
        let entries: Vec<&str> = module
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert!(entries.contains(&"vs_main"), "{name}: {entries:?}");
        assert!(entries.contains(&"fs_main"), "{name}: {entries:?}");
    }
}

#[test]
fn shader_layouts_match_the_rust_structs() {
    let (points, _) = validate("points", shaders::POINTS);
    assert_eq!(
        struct_size(&points, "ViewUniforms") as usize,
        std::mem::size_of::<ViewUniforms>()
    );
    assert_eq!(
        struct_size(&points, "Point") as usize,
        std::mem::size_of::<GpuPoint>()
    );
}
