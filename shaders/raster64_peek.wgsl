// Where the device has every 64-bit atomic (SHADER_INT64_ATOMIC_ALL_OPS): a load before the
// atomicMax skips points already behind what the pixel holds. Most points of a dense cloud
// lose, so this turns most atomic writes, which serialise on a busy pixel, into loads. The
// stored key only grows, so a stale load can only let a loser through, never stop a winner.

@group(2) @binding(0) var<storage, read_write> visibility: array<atomic<u64>>;

fn worth_writing(i: u32, key_depth: u32) -> bool {
    return u32(atomicLoad(&visibility[i]) >> 32u) <= key_depth;
}
