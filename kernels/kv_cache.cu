// KV cache data movement: writing a frame step's K/V into its pages, and the dense baseline's
// per-call concatenation of the visible pages into one contiguous buffer.
//
// Layout (see src/backend/cuda/kv.rs): pool [page][K|V][heads][page_size][64] bf16 (head-major:
// one head's keys of a page are contiguous, so an attention tile is one contiguous read); a step's
// K and V are [tokens][heads][64] bf16. Everything moves in 16-byte chunks (8 bf16).

#include "common.cuh"

// The dense baseline: dense [K|V][heads][capacity][64] <- the visible pages' valid tokens in
// attention order. Graph-safe: the page count is read on the device (the grid covers every page the
// pool can show; blocks past it exit) and the buffer has a fixed capacity, so V sits at a fixed
// offset. Block (0, 0) also writes the one-page
// table the attention kernel reads: [n_pages = 1, page 0, cum 0, kv_len].
extern "C" __global__ void kv_gather_dense(const u16* __restrict__ pool, u16* __restrict__ dense,
                                                 const u32* __restrict__ indices,
                                                 const u32* __restrict__ cum,
                                                 const u32* __restrict__ n_pages_ptr, u32 page_size,
                                                 u32 heads, u32 capacity, u32* __restrict__ dense_table) {
    const u32 n_pages = __ldg(n_pages_ptr);
    const u32 p = blockIdx.y;
    if (p == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        dense_table[0] = 1;
        dense_table[1] = 0;
        dense_table[2] = 0;
        dense_table[3] = cum[n_pages];
    }
    if (p >= n_pages) return;
    const u32 start = cum[p], len = cum[p + 1] - start;
    if (start + len > capacity) return;  // the host sizes capacity for the longest stream
    // Per head: the page's first `len` rows of 64 go to rows start .. start + len of the head's
    // dense plane.
    const u32 chunks_per_head = len * (HEAD_DIM / 8);
    const u64 v_offset = (u64)page_size * heads * HEAD_DIM;
    const u64 dense_v = (u64)capacity * heads * HEAD_DIM;
    const u64 page_base = (u64)indices[p] * 2 * v_offset;
    const u64 total = (u64)heads * chunks_per_head;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 h = (u32)(i / chunks_per_head), c = (u32)(i % chunks_per_head);
        const u64 src = page_base + (u64)h * page_size * HEAD_DIM + (u64)c * 8;
        const u64 dst = ((u64)h * capacity + start) * HEAD_DIM + (u64)c * 8;
        *(uint4*)(dense + dst) = *(const uint4*)(pool + src);
        *(uint4*)(dense + dst + dense_v) = *(const uint4*)(pool + src + v_offset);
    }
}

// A step's K and V into their pages, one thread per 16-byte chunk of the step's tokens: each
// thread finds its token's run among the step's few runs (read on the device), so the grid covers
// the tokens only and a captured graph fits every step of the same token count.
extern "C" __global__ void kv_write_tokens(const u16* __restrict__ k, const u16* __restrict__ v,
                                           u16* __restrict__ pool, const u32* __restrict__ runs,
                                           const u32* __restrict__ n_runs_ptr, u32 tokens,
                                           u32 page_size, u32 heads) {
    const u32 n_runs = __ldg(n_runs_ptr);
    const u32 chunks_per_token = heads * (HEAD_DIM / 8);
    const u64 tok_stride = (u64)heads * HEAD_DIM;
    const u64 v_offset = (u64)page_size * tok_stride;
    const u64 total = (u64)tokens * chunks_per_token;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (u64)gridDim.x * blockDim.x) {
        const u32 t = (u32)(i / chunks_per_token);
        const u32 c = (u32)(i % chunks_per_token);
        for (u32 r = 0; r < n_runs; ++r) {
            const u32 src_token = __ldg(runs + 4 * r), len = __ldg(runs + 4 * r + 3);
            if (t < src_token || t >= src_token + len) continue;
            const u32 page = __ldg(runs + 4 * r + 1), slot = __ldg(runs + 4 * r + 2);
            // Chunk c of token t is head c / 8, chunk c % 8 of that head's row.
            const u64 src = (u64)t * tok_stride + (u64)c * 8;
            const u64 dst = (u64)page * 2 * v_offset + ((u64)(c >> 3) * page_size + slot + t - src_token) * HEAD_DIM +
                            (u64)(c & 7) * 8;
            *(uint4*)(pool + dst) = *(const uint4*)(k + src);
            *(uint4*)(pool + dst + v_offset) = *(const uint4*)(v + src);
            break;
        }
    }
}
