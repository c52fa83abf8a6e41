// Where the device has only 64-bit atomic min/max (SHADER_INT64_ATOMIC_MIN_MAX, e.g. Metal):
// no 64-bit load, so every covered pixel takes the atomicMax.

@group(2) @binding(0) var<storage, read_write> visibility: array<atomic<u64>>;

fn worth_writing(i: u32, key_depth: u32) -> bool {
    return true;
}
