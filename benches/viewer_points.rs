//! The CPU side of appending a frame's points to the 3D view's store: placing them in chunks
//! (`ChunkBook`) and encoding them as stored, for one 640×480 frame of the demo room
//! (307 k points). The GPU side (write, draw) is `streamrecon bench viewer`. A bench: it times
//! and prints, asserting nothing. Run with `cargo bench --bench viewer_points`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use streamrecon::viewer::chunks::{ChunkBook, DEFAULT_CHUNK_POINTS};
use streamrecon::viewer::demo::{DemoConfig, DemoStream};
use streamrecon::viewer::point_format::encode_points;
use streamrecon::viewer::scene;

fn append(c: &mut Criterion) {
    let mut stream = DemoStream::new(DemoConfig {
        width: 640,
        height: 480,
        ..DemoConfig::default()
    });
    let result = stream.next_result();
    let n = scene::point_count(&result);
    let mut group = c.benchmark_group("viewer_append");
    group.throughput(Throughput::Elements(n as u64));
    let mut staging = Vec::new();
    group.bench_function("encode", |b| {
        b.iter(|| encode_points(&result, n, &mut staging))
    });
    group.bench_function("place_in_chunks", |b| {
        let mut book = ChunkBook::new(DEFAULT_CHUNK_POINTS, u64::MAX);
        b.iter(|| {
            if book.total_points() > 1 << 30 {
                book.clear();
            }
            book.append_frame(n, result.frame)
        })
    });
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
