// Camera frustums, the trajectory and the ground grid: plain coloured line lists in world
// space, depth-tested against the points.

struct LineVertexIn {
    @location(0) position: vec3<f32>,
    @location(1) colour: vec4<f32>,
};

struct LineVertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) colour: vec4<f32>,
};

@vertex
fn vs_main(in: LineVertexIn) -> LineVertexOut {
    var out: LineVertexOut;
    out.position = view.clip_from_world * vec4<f32>(in.position, 1.0);
    out.colour = in.colour;
    return out;
}

@fragment
fn fs_main(in: LineVertexOut) -> @location(0) vec4<f32> {
    return in.colour;
}
