//! Bookkeeping of the append-only GPU point chunks, apart from wgpu so it can be tested.
//!
//! Every frame's points are placed once, at the end of the last chunk (spilling into new chunks
//! as they fill), and never moved or re-uploaded. Drawing is one draw call per chunk; the level
//! of detail is a single stride shared by all chunks so the number of sprites stays under a
//! budget however many points there are.

use std::ops::Range;

/// Points per chunk: 4 Mi points of 16 bytes (`point_format::CompactPoint`), 64 MiB per buffer
/// (under wgpu's default 128 MiB storage binding limit, so every adapter takes it); 100 M points
/// are 24 chunks.
pub const DEFAULT_CHUNK_POINTS: u32 = 4 << 20;

/// Where a run of a frame's points goes: `source` (indices into the frame's points) is written
/// to `chunk` starting at point `first`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub chunk: usize,
    pub first: u32,
    pub source: Range<usize>,
}

/// What the point store holds: lengths of the chunks, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkBook {
    chunk_points: u32,
    /// Points stored in each chunk; all but the last are full.
    lens: Vec<u32>,
    /// Cap on stored points (what the GPU gave); appends past it are refused and counted.
    max_points: u64,
    refused_points: u64,
    /// (first point's index in the store, frame) for every frame stored, in order: where the
    /// compact point format finds a point's frame.
    frames: Vec<[u32; 2]>,
    /// Bumped by every `clear`, so whoever mirrors `frames` knows to start over.
    generation: u64,
}

/// Points are indexed with 32 bits on the GPU: at most this many are stored.
pub const MAX_STORE_POINTS: u64 = u32::MAX as u64;

impl ChunkBook {
    pub fn new(chunk_points: u32, max_points: u64) -> Self {
        Self {
            chunk_points: chunk_points.max(1),
            lens: Vec::new(),
            max_points: max_points.min(MAX_STORE_POINTS),
            refused_points: 0,
            frames: Vec::new(),
            generation: 0,
        }
    }

    pub fn chunk_points(&self) -> u32 {
        self.chunk_points
    }

    pub fn chunk_count(&self) -> usize {
        self.lens.len()
    }

    pub fn chunk_len(&self, chunk: usize) -> u32 {
        self.lens.get(chunk).copied().unwrap_or(0)
    }

    pub fn total_points(&self) -> u64 {
        self.lens.iter().map(|&n| u64::from(n)).sum()
    }

    pub fn max_points(&self) -> u64 {
        self.max_points
    }

    /// Chunks the book would hold after appending `count` more points (within the cap).
    pub fn chunks_after(&self, count: usize) -> usize {
        let room = self.max_points.saturating_sub(self.total_points());
        let total = self.total_points() + (count as u64).min(room);
        total.div_ceil(u64::from(self.chunk_points)) as usize
    }

    /// Caps the store at `chunks` chunks (the GPU would give no more): later appends past
    /// them are refused and counted. Never below what is stored.
    pub fn limit_to_chunks(&mut self, chunks: usize) {
        let cap = (chunks as u64 * u64::from(self.chunk_points)).max(self.total_points());
        self.max_points = self.max_points.min(cap);
    }

    /// Points that did not fit under `max_points`.
    pub fn refused_points(&self) -> u64 {
        self.refused_points
    }

    /// The frame table: (first point's index in the store, frame) per stored frame.
    pub fn frames(&self) -> &[[u32; 2]] {
        &self.frames
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Places `count` new points after everything stored so far. May open new chunks; the
    /// caller creates a buffer for every chunk index it has not seen.
    pub fn append(&mut self, count: usize) -> Vec<Placement> {
        self.append_frame(count, 0)
    }

    /// As `append`, for the points of stream frame `frame` (noted in the frame table).
    pub fn append_frame(&mut self, count: usize, frame: u64) -> Vec<Placement> {
        let first = self.total_points();
        let room = self.max_points.saturating_sub(first);
        let accepted = (count as u64).min(room) as usize;
        self.refused_points += (count - accepted) as u64;
        let mut placements = Vec::new();
        let mut next = 0usize;
        while next < accepted {
            if self.lens.last().is_none_or(|&n| n == self.chunk_points) {
                self.lens.push(0);
            }
            let chunk = self.lens.len() - 1;
            let first = self.lens[chunk];
            let take = ((self.chunk_points - first) as usize).min(accepted - next);
            self.lens[chunk] += take as u32;
            placements.push(Placement {
                chunk,
                first,
                source: next..next + take,
            });
            next += take;
        }
        if accepted > 0 {
            // Frame numbers wrap at 2^32, which no session reaches.
            self.frames.push([first as u32, frame as u32]);
        }
        placements
    }

    /// Forgets every point (a pipeline reset). Chunks are kept for reuse by the renderer.
    pub fn clear(&mut self) {
        self.lens.clear();
        self.refused_points = 0;
        self.frames.clear();
        self.generation += 1;
    }

    /// Every `stride`-th point keeps the drawn sprite count at or under `budget`.
    pub fn stride_for_budget(&self, budget: u64) -> u32 {
        let total = self.total_points();
        if budget == 0 {
            return u32::MAX;
        }
        total.div_ceil(budget).clamp(1, u64::from(u32::MAX)) as u32
    }

    /// Sprites to draw in each chunk at `stride` (indices `0, stride, 2·stride, …` below the
    /// chunk's length).
    pub fn draw_counts(&self, stride: u32) -> impl Iterator<Item = (usize, u32)> + '_ {
        let stride = stride.max(1);
        self.lens
            .iter()
            .enumerate()
            .map(move |(chunk, &len)| (chunk, len.div_ceil(stride)))
            .filter(|&(_, n)| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_fill_chunks_in_order_and_spill() {
        let mut book = ChunkBook::new(10, u64::MAX);
        assert_eq!(
            book.append(7),
            vec![Placement {
                chunk: 0,
                first: 0,
                source: 0..7
            }]
        );
        assert_eq!(
            book.append(8),
            vec![
                Placement {
                    chunk: 0,
                    first: 7,
                    source: 0..3
                },
                Placement {
                    chunk: 1,
                    first: 0,
                    source: 3..8
                },
            ]
        );
        assert_eq!(book.chunk_count(), 2);
        assert_eq!(book.total_points(), 15);
        // A frame bigger than a chunk spans several.
        let p = book.append(25);
        assert_eq!(p.len(), 3);
        assert_eq!(p.iter().map(|p| p.source.len()).sum::<usize>(), 25);
        assert_eq!(book.chunk_count(), 4);
        assert_eq!(book.chunk_len(3), 10);
    }

    #[test]
    fn placements_never_overlap_or_move() {
        let mut book = ChunkBook::new(64, u64::MAX);
        let mut seen = std::collections::HashSet::new();
        for n in [0usize, 1, 63, 64, 65, 200, 3] {
            for p in book.append(n) {
                for i in 0..p.source.len() as u32 {
                    assert!(seen.insert((p.chunk, p.first + i)), "slot written twice");
                }
            }
        }
        assert_eq!(seen.len() as u64, book.total_points());
    }

    #[test]
    fn empty_append_opens_nothing() {
        let mut book = ChunkBook::new(8, u64::MAX);
        assert!(book.append(0).is_empty());
        assert_eq!(book.chunk_count(), 0);
    }

    #[test]
    fn cap_refuses_and_counts() {
        let mut book = ChunkBook::new(8, 20);
        book.append(15);
        let p = book.append(10);
        assert_eq!(p.iter().map(|p| p.source.len()).sum::<usize>(), 5);
        assert_eq!(book.total_points(), 20);
        assert_eq!(book.refused_points(), 5);
        book.clear();
        assert_eq!(book.total_points(), 0);
        assert_eq!(book.refused_points(), 0);
    }

    #[test]
    fn a_chunk_limit_caps_later_appends() {
        let mut book = ChunkBook::new(10, u64::MAX);
        book.append(15);
        assert_eq!(book.chunks_after(0), 2);
        assert_eq!(book.chunks_after(6), 3);
        // The GPU gave only three chunks: 30 points fit, the rest is counted.
        book.limit_to_chunks(3);
        assert_eq!(book.chunks_after(100), 3);
        let p = book.append(20);
        assert_eq!(p.iter().map(|p| p.source.len()).sum::<usize>(), 15);
        assert_eq!(book.refused_points(), 5);
        assert!(p.iter().all(|p| p.chunk < 3));
        // Never below what is stored.
        book.limit_to_chunks(1);
        assert_eq!(book.max_points(), 30);
    }

    #[test]
    fn the_frame_table_notes_where_each_frame_starts() {
        let mut book = ChunkBook::new(10, 25);
        book.append_frame(7, 3);
        book.append_frame(0, 4);
        book.append_frame(12, 5);
        book.append_frame(9, 6);
        // The empty frame 4 stored nothing; frame 6 was cut at the cap.
        assert_eq!(book.frames(), &[[0, 3], [7, 5], [19, 6]]);
        book.append_frame(3, 7);
        assert_eq!(book.frames().len(), 3, "nothing stored, nothing noted");
        let generation = book.generation();
        book.clear();
        assert!(book.frames().is_empty());
        assert_eq!(book.generation(), generation + 1);
    }

    #[test]
    fn stride_keeps_sprites_under_budget() {
        let mut book = ChunkBook::new(1000, u64::MAX);
        book.append(10_500);
        for budget in [1u64, 7, 1000, 5_000, 10_500, 1_000_000] {
            let stride = book.stride_for_budget(budget);
            let drawn: u64 = book.draw_counts(stride).map(|(_, n)| u64::from(n)).sum();
            // Per-chunk rounding adds at most one sprite per chunk.
            assert!(
                drawn <= budget + book.chunk_count() as u64,
                "budget {budget}: {drawn}"
            );
            if budget >= 10_500 {
                assert_eq!(stride, 1);
                assert_eq!(drawn, 10_500);
            }
        }
    }

    #[test]
    fn draw_counts_index_inside_each_chunk() {
        let mut book = ChunkBook::new(10, u64::MAX);
        book.append(23);
        for stride in 1..12u32 {
            for (chunk, n) in book.draw_counts(stride) {
                assert!((n - 1) * stride < book.chunk_len(chunk));
            }
        }
    }
}
