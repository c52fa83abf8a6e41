// Paged attention for Hopper (sm_90a), warp-specialised (FlashAttention-3 style). Same layouts
// and page table as paged_attention.cu (read its header); same result format as the other
// kernels (bf16 `out` with one split, else f32 partials normalised by the split's own sum and
// their log2-domain LSE for attention_combine).
//
// One CTA per SM: 3 warpgroups, 128 query rows of one head against one key split.
//   warpgroup 0  producer: gathers the paged K/V tiles (128 keys) with cp.async into a ring of
//                STAGES shared-memory stages; each row looks up its own page (a tile may straddle
//                pages). A stage is announced on its `full` mbarrier once its copies landed (the
//                producer waits two tiles behind, then fences to the async proxy and arrives), and
//                refilled once both consumers arrived on its `empty` mbarrier.
//   warpgroups 1, 2  consumers, 64 query rows each. Per key tile j one "GEMM section" issues
//                S(j) = Q K(j)^T (m64n128k16, Q and K from shared memory) together with
//                O += P(j-1) V(j-1) (m64n64k16, P from registers, V MN-major), waits, then does
//                the online softmax of S(j) into P(j) on the CUDA cores. The two consumers take
//                turns issuing their sections (ping-pong through named barriers 1 and 2), so one
//                warpgroup's softmax runs while the other's products occupy the tensor cores.
// Tiles are stored with the 128-byte swizzle the wgmma descriptors expect (16-byte chunk c of
// row r at c ^ (r & 7)); the descriptors and fragment layouts are those of
// paged_attention_sm90.cu's WgmmaWide kernel.
//
// Variants (entry points, timed side by side): PINGPONG (the turn-taking above) and OVERLAP (the
// exponentials of S(j) computed while the warpgroup's own P(j-1) V(j-1) is still running; only O
// and P wait for it). Measured: a quarter of the exponentials on the FMA pipe by a polynomial
// (FlashAttention-4's trick) was 8 % slower than all on MUFU: the softmax is latency-bound here,
// not MUFU-bound.
//
// Further variants (FLAGS, key tile BN, copy lag; H200, 72/72, median of 30, two benches):
// setmaxnreg 40/232 (ws_regs) 0.717 ms vs the default's 0.729; 192-key tiles in four stages with
// setmaxnreg and a 1-tile lag (ws_n192, the host's default) 0.714-0.717; copy lag 3 0.718-0.736;
// copies arriving on the barrier by themselves (noinc) 0.742-0.746 with 128-key tiles, 0.710-0.715
// with 192. The consumers alone (ws_nocopy: no copies, wrong results) take 0.693-0.696 ms, so the
// gather costs ~4 %; the consumers are latency-bound (ncu: issue 50-53 %, MUFU 46-48 %, tensor
// ~43 % busy; the top stall is the fixed-latency dependency wait in the softmax).
//
// Three consumers (ws_m192: 192 query rows, 512 threads, 128-key tiles, setmaxnreg 32/160; a
// consumer warpgroup without valid rows runs the barrier protocol only). H200, one run, median of
// 30: 72/72 0.693 ms with 4 splits (ws_n192 0.692 in the same bench), 72/10000 1.226 (ws_n192
// 1.264); split sweep at 72/72 (20 runs): 1 split 0.872, 2 0.892, 4 0.684, 11 0.700. Per SM it
// is ~15-19 % faster than ws_n192 (1 split: 1.5x the rows in 1.26x the time), but 1005 queries
// make 6 tiles of 192 (the last one 45 rows) = 96 CTAs for 132 SMs, and the wave quantisation
// (4 splits: 384 CTAs in 3 waves) plus the combine take that back at 72/72.
//
// Tail-split (ws_m192t, always 3 key splits): a last query tile of 1..64 valid rows (1005 = 5 x
// 192 + 45) runs in split 0's CTA alone (splits 1 and 2 return at once); its three consumers load
// the same 64 rows and take the key tiles round-robin over the whole key range (consumer c: tiles
// t = c mod 3, written as split c; the combine's log-sum-exp merge does not need contiguous
// splits). Every working CTA then costs the same: 1005 x 16 heads = 16 x (5 x 3 + 1) = 256 CTAs,
// two waves on 132 SMs, against 384 in three with 4 splits. First version (H200, 1005 x 16 heads,
// 72,360 keys): 1.055 ms against ws_n192's 0.689: the 16 tail CTAs took ~2.6x a normal CTA, on
// the critical path. Their ring ran one tile at a time: with the copy lag of 2, the `full` of a
// tail consumer's tile waited for the release by the previous turn's section (a full ring: 3
// stages held for the pending P V, 3 awaited). Now, in tail mode only: the producer's copies
// arrive on `full` by themselves (as WS_NOINC), each section issues P(j-1) V(j-1) before S(j)
// and releases tile j-1 as soon as that product completed, so a tile's `full` depends only on
// its own consumer's release two tiles earlier (read ws_consumer), and the tail CTAs are
// dispatched first (the first gridDim.z linear block indices; read ws_body). Measured after that
// change (same bench, one run): 0.906 ms at 72/72 (ws_n192 0.693), 1.654 at 72/10000 (1.263).
// The tail CTAs still take about twice a normal CTA: a tail CTA reads every K/V tile once per
// consumer turn (3x a normal CTA's traffic per FLOP, ~64 GB/s for one SM), so the copies, not the
// products, set its pace. Kept for timing, not used by default. Sharing each tile between two
// tail consumers (64 keys each; branch wip/m192-halftile) measured 0.872: no better.
//
// Consumers alone (no copies; H200, 72/72): ws_m192 0.626-0.652 ms, ws_m192t 0.616-0.618: the
// tail-split's consumers would beat the default by 10 %; its copies are what it lacks. The TMA
// producer (WS_TMA: one thread, a K and a V box per page-aligned tile) brought ws_m192t from
// 0.872 to 0.702 ms (72/10000: 1.609 to 1.268) but only ties ws_n192 (0.687 / 1.265 in the same
// run); ws_m192 lost with it (0.748 against 0.709) and so did ws_n192 (0.711: a 999-key page is
// five 192-key tiles and one of 39). With the pool head-major (each box one contiguous read)
// ws_m192t_tma ran 0.685-0.702 and the default 0.686-0.703 (a tie). Sharing each tile between
// two tail consumers as 64-key halves (twice the ring lookahead per consumer) ran 0.748: removed.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define HEAD_DIM 64
#define ROW_CHUNKS 8
// Query rows per consumer warpgroup; a CTA has NC consumers (2 or 3) and one producer.
#define WS_WG_ROWS 64
#define NEG_INF __int_as_float(0xff800000u)
// Variant flags (template parameter FLAGS of ws_body).
//   WS_REGS   setmaxnreg: the producer warpgroup drops to 40 registers, the consumers rise to 232.
//   WS_NOINC  the producer never waits for its own copies: each tile's copies arrive on the
//             stage's `full` mbarrier by themselves (cp.async.mbarrier.arrive.noinc); consumers
//             fence to the async proxy after the wait.
//   WS_NOCOPY diagnostic only (wrong results): the producer copies nothing, it only cycles the
//             barriers, so the time is the consumers' alone.
#define WS_REGS 1
#define WS_NOINC 2
#define WS_NOCOPY 4
//   WS_TAIL   tail-split (three consumers, launched with exactly 3 key splits): a last query tile
//             of 1..64 valid rows is worked by split 0's CTA alone, its three consumers on the
//             same 64 rows, each over every third key tile of the whole key range (read ws_body).
#define WS_TAIL 8
//   WS_TMA    the producer is one thread issuing TMA loads (a K and a V box per tile) instead of
//             128 threads gathering rows with cp.async; key tiles then start at page starts
//             (a tile never straddles two pages: a 999-key page is 7 full tiles of 128 and one
//             of 103), and each tile's valid key count travels beside it in shared memory
//             (read ws_tma_schedule and ws_producer_tma).
#define WS_TMA 16
// Bytes of the Q tile of NC consumers (the K/V ring and its barriers follow it).
#define WS_Q_BYTES(NC) ((NC) * WS_WG_ROWS * HEAD_DIM * 2)
// Key tile BN (128 or 192): K and V tiles of one stage, ring depth (the ring is 192 KB either way).
template <int BN>
struct Ws {
    static constexpr u32 STAGES = BN == 128 ? 6 : 4;
    static constexpr u32 TILE_BYTES = BN * HEAD_DIM * 2;
    static constexpr u32 STAGE_BYTES = 2 * TILE_BYTES;
};

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u32 swz(u32 r, u32 c) { return r * ROW_CHUNKS + (c ^ (r & 7)); }

__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
    // src-size 0 zero-fills the 16 bytes: rows past the end of the queries or keys.
    u32 n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
// cp.async writes through the generic proxy; wgmma reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- mbarriers (shared::cta) and named barriers.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives on `bar` once all of this thread's earlier cp.async copies have landed (the arrival
// counts against the barrier's expected count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier counts the phase of
// parity 1 as completed, so the producer's first pass over the ring does not block).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void named_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(u32 id, u32 threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// Shared-memory matrix descriptor for a 128-byte-swizzled tile: start address, leading byte
// offset 16 (unused by these shapes), stride byte offset 1024 (between groups of 8 rows of 128 B).
__device__ __forceinline__ u64 smem_desc(u32 addr) {
    u64 d = 0;
    d |= (u64)((addr & 0x3FFFF) >> 4);
    d |= (u64)1 << 16;
    d |= (u64)(1024 >> 4) << 32;
    d |= (u64)1 << 62;  // 128B swizzle
    return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving register accesses across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int KC>
__device__ __forceinline__ void fence_frag(u32 (*p)[4]) {
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(p[kc][i])::"memory");
}

// D[64x64] += A[64x16] (registers) * B[16x64] (shared, MN-major: V as [key][dim]).
__device__ __forceinline__ void wgmma_m64n64k16_rs_trans(float* d, const u32* a, u64 desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

// D[64x128] (+)= A[64x16] * B[16x128], both from shared memory (K-major); scale_d = 0 overwrites.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64x192] (+)= A[64x16] * B[16x192], both from shared memory (K-major); scale_d = 0 overwrites.
__device__ __forceinline__ void wgmma_m64n192k16_ss(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// S tile of BN keys: m64n128k16 or m64n192k16.
template <int BN>
__device__ __forceinline__ void wgmma_s(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    if constexpr (BN == 128) wgmma_m64n128k16_ss(d, desc_a, desc_b, scale_d);
    else wgmma_m64n192k16_ss(d, desc_a, desc_b, scale_d);
}

__device__ __forceinline__ u32 find_page(const u32* __restrict__ cum, u32 n_pages, u32 t) {
    u32 lo = 0, hi = n_pages;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) >> 1;
        if (__ldg(cum + mid) <= t) lo = mid; else hi = mid;
    }
    return lo;
}

// ---- producer: warpgroup 0 -------------------------------------------------------------------
// Thread `tid` (0..127) copies chunk column tid & 7 of rows (tid >> 3) + 16 i, i < 8, of every
// tile, K and V.
template <int BN, int FLAGS, int LAG>
__device__ __forceinline__ void ws_producer(u32 tid, u16* skv, u32 bar_full, u32 bar_empty,
    const u16* __restrict__ pool, u32 page_size, const u32* __restrict__ indices,
    const u32* __restrict__ cum, u32 n_pages, u32 kv_len, u32 kv_begin, u32 kv_end, u32 n_tiles,
    u32 heads, u32 h) {
    constexpr u32 kRowStep = 128 / ROW_CHUNKS;                // 16
    constexpr int kLoadRows = BN / kRowStep;           // 8 or 12
    // 32-bit strides: the host checks that a page (K and V) has fewer than 2^32 elements.
    const u32 head_stride = page_size * HEAD_DIM;  // pool [page][K|V][heads][page_size][64]
    const u32 v_offset = head_stride * heads;
    const u32 page_stride = 2 * v_offset;
    const u32 ld_col = tid & 7;
    const u32 ld_row = tid >> 3;
    // The rows this thread copies only move forward (row ld_row + 16 i of tile j, tile after
    // tile), so one cursor follows them: the current page's key range [lo, hi) and its base
    // address stay in registers, and the page table is read only when a row crosses into the
    // next page (about once per 60 rows), not as a chain of dependent loads per row.
    u32 p = find_page(cum, n_pages, kv_begin + ld_row < kv_len ? kv_begin + ld_row : kv_len - 1);
    u32 lo = __ldg(cum + p);
    u32 hi = __ldg(cum + p + 1);
    const u16* page_ptr = pool + (u64)__ldg(indices + p) * page_stride + h * head_stride + ld_col * 8;

    for (u32 j = 0; j < n_tiles; ++j) {
        const u32 stage = j % Ws<BN>::STAGES;
        // Wait until both consumers released this stage's previous tile (j - STAGES).
        mbar_wait(bar_empty + stage * 8, ((j / Ws<BN>::STAGES) & 1) ^ 1);
        u16* sk = skv + stage * (Ws<BN>::STAGE_BYTES / 2);
        u16* sv = sk + Ws<BN>::TILE_BYTES / 2;
        const u32 t0 = kv_begin + j * BN;
#pragma unroll
        for (int i = 0; i < kLoadRows; ++i) {
            if (FLAGS & WS_NOCOPY) break;
            const u32 r = ld_row + kRowStep * i;
            const u32 t = t0 + r;
            const bool ok = t < kv_end;
            const u16* src = pool;
            if (ok) {
                // t < kv_len = cum[n_pages], so this stops at a page p < n_pages; empty pages
                // (lo == hi) are stepped over.
                while (t >= hi) {
                    ++p;
                    lo = hi;
                    hi = __ldg(cum + p + 1);
                    page_ptr = pool + (u64)__ldg(indices + p) * page_stride + h * head_stride + ld_col * 8;
                }
                src = page_ptr + (t - lo) * HEAD_DIM;
            }
            const u32 off = swz(r, ld_col) * 8;
            cp_async_16(smem_addr(sk + off), src, ok);
            cp_async_16(smem_addr(sv + off), ok ? src + v_offset : src, ok);
        }
        if (FLAGS & WS_NOINC) {
            mbar_arrive_cp_async(bar_full + stage * 8);
            continue;
        }
        cp_async_commit();
        // Announce tile j - LAG once this thread's copies of it have landed: LAG + 1 tiles of
        // copies stay in flight per thread.
        if (j >= LAG) {
            cp_async_wait<LAG>();
            fence_proxy_async();
            mbar_arrive(bar_full + ((j - LAG) % Ws<BN>::STAGES) * 8);
        }
    }
    cp_async_wait<0>();
    if (FLAGS & WS_NOINC) return;
    fence_proxy_async();
    for (u32 j = n_tiles > LAG ? n_tiles - LAG : 0; j < n_tiles; ++j) mbar_arrive(bar_full + (j % Ws<BN>::STAGES) * 8);
}

// ---- TMA producer (WS_TMA) ----------------------------------------------------------------
// The host encodes the pool as a 4-D tensor {64 dims, page_size slots, heads, 2 x pages planes}
// (plane 2 p is page p's K, 2 p + 1 its V) with a box of {64, BN, 1, 1} (one contiguous run of BN
// rows of 128 bytes) and the 128-byte swizzle, which is exactly the layout swz() gives the
// cp.async path. Slots past page_size read as zeros; slots past a page's valid count are masked
// by the consumers.
struct __align__(64) TmaDesc {
    unsigned long long words[16];
};
__device__ __forceinline__ void mbar_expect_tx_arrive(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_4d(u32 dst, const TmaDesc* map, int c0, int c1, int c2, int c3, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
        ::"r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}
// Page-aligned key tiles: page p holds ceil(len_p / BN) tiles. One warp (all 32 lanes) finds the
// total T, this split's share [begin, begin + n) of ceil(T / splits) tiles (every tile for the
// tail CTA) and the page and in-page offset of its first tile.
struct TmaSpan {
    u32 n_tiles, page, offset;
};
// Valid keys of visible page p, and the page-aligned tiles of BN keys they fill.
__device__ __forceinline__ u32 page_len(const u32* __restrict__ cum, u32 p) { return __ldg(cum + p + 1) - __ldg(cum + p); }
template <int BN>
__device__ __forceinline__ u32 page_tiles(const u32* __restrict__ cum, u32 p) { return (page_len(cum, p) + BN - 1) / BN; }
template <int BN>
__device__ __forceinline__ TmaSpan ws_tma_schedule(const u32* __restrict__ cum, u32 n_pages, u32 split,
    u32 splits, bool all, u32 lane) {
    u32 total = 0;
    for (u32 p = lane; p < n_pages; p += 32) total += page_tiles<BN>(cum, p);
    total = __reduce_add_sync(0xffffffffu, total);
    const u32 per_split = (total + splits - 1) / splits;
    const u32 begin = all ? 0 : split * per_split;
    u32 end = all ? total : begin + per_split;
    if (end > total) end = total;
    TmaSpan span = {end > begin ? end - begin : 0, 0, 0};
    if (span.n_tiles == 0) return span;
    // The page holding tile `begin`: scan the pages 32 at a time.
    u32 base = 0;
    for (u32 p0 = 0; p0 < n_pages; p0 += 32) {
        const u32 p = p0 + lane;
        const u32 t = p < n_pages ? page_tiles<BN>(cum, p) : 0;
        u32 incl = t;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            const u32 up = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += up;
        }
        const u32 hit = __ballot_sync(0xffffffffu, base + incl > begin);
        if (hit) {
            const u32 l = __ffs(hit) - 1;
            const u32 excl = __shfl_sync(0xffffffffu, incl - t, l);
            span.page = p0 + l;
            span.offset = (begin - base - excl) * BN;
            return span;
        }
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    return span;
}
// One thread: per tile, wait for the stage, publish the tile's valid key count, expect the two
// boxes' bytes on `full` (its only arrival) and issue the K and V loads.
template <int BN>
__device__ __forceinline__ void ws_producer_tma(const TmaDesc* map, u32 skv0, u32 bar_full, u32 bar_empty,
    volatile u32* tile_valid, const u32* __restrict__ indices, const u32* __restrict__ cum, TmaSpan span,
    u32 h) {
    u32 p = span.page, offset = span.offset;
    u32 len = page_len(cum, p);
    for (u32 j = 0; j < span.n_tiles; ++j) {
        const u32 stage = j % Ws<BN>::STAGES;
        mbar_wait(bar_empty + stage * 8, ((j / Ws<BN>::STAGES) & 1) ^ 1);
        const u32 left = len - offset;
        tile_valid[stage] = left < BN ? left : BN;
        mbar_expect_tx_arrive(bar_full + stage * 8, Ws<BN>::STAGE_BYTES);
        const u32 plane = 2 * __ldg(indices + p);
        const u32 dst = skv0 + stage * Ws<BN>::STAGE_BYTES;
        tma_load_4d(dst, map, 0, (int)offset, (int)h, (int)plane, bar_full + stage * 8);
        tma_load_4d(dst + Ws<BN>::TILE_BYTES, map, 0, (int)offset, (int)h, (int)plane + 1, bar_full + stage * 8);
        offset += BN;
        // Next tile: the rest of this page, else the next page with keys (empty pages skipped).
        while (offset >= len && j + 1 < span.n_tiles) {
            ++p;
            offset = 0;
            len = page_len(cum, p);
        }
    }
}

// ---- consumers: online softmax of one S tile -------------------------------------------------
// s holds this thread's 2 rows x 32 columns of S (row g + 8 hf, column 8 j + 2 (lane & 3) + e at
// s[4 j + 2 hf + e]). Part 1 (S only): mask, new row maxima, s := P in f32, row sums, and the
// factor corr[hf] by which O must be rescaled. Reductions are trees: with only two consumer warps
// per SM sub-partition, the dependent-latency chain is what the softmax's time is made of.
template <int BN>
__device__ __forceinline__ void ws_softmax_exp(float* s, float* row_max, float* row_sum,
    float* corr, u32 lane, u32 t0, u32 kv_end, float scale_log2) {
    constexpr int NJ = BN / 8;
    if (t0 + BN > kv_end) {
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 col = j * 8 + (lane & 3) * 2 + (e & 1);
                if (t0 + col >= kv_end) s[j * 4 + e] = NEG_INF;
            }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        float m8[NJ / 2];
#pragma unroll
        for (int k = 0; k < NJ / 2; ++k)
            m8[k] = fmaxf(fmaxf(s[(2 * k) * 4 + hf * 2], s[(2 * k) * 4 + hf * 2 + 1]),
                          fmaxf(s[(2 * k + 1) * 4 + hf * 2], s[(2 * k + 1) * 4 + hf * 2 + 1]));
#pragma unroll
        for (int k = 4; k < NJ / 2; ++k) m8[k & 3] = fmaxf(m8[k & 3], m8[k]);
        float mx = fmaxf(fmaxf(m8[0], m8[2]), fmaxf(m8[1], m8[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // Every tile holds at least one valid key, so m_new is finite.
        const float m_new = fmaxf(row_max[hf], mx * scale_log2);
        corr[hf] = fast_exp2(row_max[hf] - m_new);
        row_max[hf] = m_new;
        float sum4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const float p0 = fast_exp2(fmaf(s[j * 4 + hf * 2], scale_log2, -m_new));
            const float p1 = fast_exp2(fmaf(s[j * 4 + hf * 2 + 1], scale_log2, -m_new));
            s[j * 4 + hf * 2] = p0;
            s[j * 4 + hf * 2 + 1] = p1;
            sum4[j & 3] += p0 + p1;
        }
        row_sum[hf] = row_sum[hf] * corr[hf] + ((sum4[0] + sum4[1]) + (sum4[2] + sum4[3]));
    }
}

// Part 2 (once O += P V of the previous tile has completed): rescale O, pack P to bf16 for the
// next P V (the m64k16 A-fragment layout: rows g / g + 8, columns 16 kc + 2 (lane & 3) (+ 8)).
template <int BN>
__device__ __forceinline__ void ws_rescale_pack(const float* s, float* o_acc, u32 (*p)[4], const float* corr) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        // Once the running maximum settles most tiles move no row's maximum (corr == 1
        // exactly): skip the rescale when that holds for the whole warp.
        if (__any_sync(0xffffffffu, corr[hf] != 1.f)) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                o_acc[j * 4 + hf * 2] *= corr[hf];
                o_acc[j * 4 + hf * 2 + 1] *= corr[hf];
            }
        }
    }
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
        p[kc][0] = pack_bf16x2(s[(2 * kc) * 4 + 0], s[(2 * kc) * 4 + 1]);
        p[kc][1] = pack_bf16x2(s[(2 * kc) * 4 + 2], s[(2 * kc) * 4 + 3]);
        p[kc][2] = pack_bf16x2(s[(2 * kc + 1) * 4 + 0], s[(2 * kc + 1) * 4 + 1]);
        p[kc][3] = pack_bf16x2(s[(2 * kc + 1) * 4 + 2], s[(2 * kc + 1) * 4 + 3]);
    }
}

// ---- consumer warpgroup c (0 .. NC-1): query rows c * 64 .. c * 64 + 63 of the tile.
template <int BN, bool PINGPONG, bool OVERLAP, int FLAGS, int NC>
__device__ __forceinline__ void ws_consumer(const u16* __restrict__ q, u16* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_lse, u32 lq, u32 heads, u32 n_splits,
    float scale_log2, u16* sq, u16* skv, u32 bar_full, u32 bar_empty, u32 c, u32 tid, u32 lane,
    u32 warp, u32 q0, u32 split, u32 h, u32 n_tiles, u32 kv_begin, u32 kv_end, bool tail,
    const volatile u32* tile_valid) {
    // Masking bounds of ring entry e (in stage `stage`): key t0 + col is valid while < end. TMA
    // tiles carry their valid count (read after the stage's `full` wait, before its release).
    auto t0_of = [&](u32 e) -> u32 { return (FLAGS & WS_TMA) ? 0u : kv_begin + e * BN; };
    auto end_of = [&](u32 stage) -> u32 { return (FLAGS & WS_TMA) ? tile_valid[stage] : kv_end; };

    const u32 ctid = tid & 127;
#pragma unroll
    for (int i = 0; i < (64 * ROW_CHUNKS) / 128; ++i) {
        const u32 chunk = ctid + i * 128;
        const u32 r = c * 64 + (chunk >> 3), ch = chunk & 7;
        // Tail mode: every consumer loads the same 64 rows (into its own slot of the Q tile).
        const u32 row = q0 + (tail ? (chunk >> 3) : r);
        const bool ok = row < lq;
        const u16* src = q + ((u64)(ok ? row : 0) * heads + h) * HEAD_DIM + ch * 8;
        cp_async_16(smem_addr(sq + swz(r, ch) * 8), src, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    named_sync(1 + NC + c, 128);  // this warpgroup's Q rows are in shared memory
    // With three consumers (192 rows) the last query tile is mostly padding (1005 = 5 x 192 + 45):
    // a warpgroup without a single valid row keeps the barrier protocol (turns, full/empty) but
    // skips its products and softmax, so the tile's one working warpgroup has the tensor cores.
    const bool active = NC == 2 || tail || q0 + c * WS_WG_ROWS < lq;
    // This consumer's j-th key tile is ring entry (and key tile) j * e_mul + e_add: every tile of
    // the split, or in tail mode (n_tiles = all kv_tiles, kv_begin = 0, kv_end = kv_len) the
    // tiles t = 3 j + c, my_tiles of them. Tail mode: every consumer takes `turns` turns (the
    // largest count + 1), padding with protocol-only turns after its own sections.
    const u32 e_mul = tail ? NC : 1;
    const u32 e_add = tail ? c : 0;
    const u32 my_tiles = tail ? (n_tiles > c ? (n_tiles - c + NC - 1) / NC : 0) : n_tiles;
    const u32 turns = tail && n_tiles > 0 ? (n_tiles + NC - 1) / NC + 1 : 0;

    float o_acc[32];
    float s[BN / 2];
    u32 p[BN / 16][4];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) o_acc[i] = 0.f;
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc)
#pragma unroll
        for (int i = 0; i < 4; ++i) p[kc][i] = 0u;
    float row_max[2] = {NEG_INF, NEG_INF};
    float row_sum[2] = {0.f, 0.f};
    const u32 sq_wg = smem_addr(sq) + c * 64 * 128;
    const u32 skv0 = smem_addr(skv);
    // Ping-pong (round robin with three): barrier 1 + c is "consumer c may issue"; each consumer
    // syncs on its own and arrives on the next one's after issuing. Consumer 0 goes first. Counts
    // match exactly: each consumer issues n_tiles + 1 sections; the last consumer arrives once up
    // front and skips the arrive after its last section (nobody would wait for it).
    const u32 my_turn = 1 + c;
    const u32 other_turn = 1 + (c + 1) % NC;
    // Tail mode: a ring entry i is consumed by consumer i % 3 alone (the `empty` barriers count
    // one warpgroup), and consumer c waits on `full` slot i % STAGES with parity (i / STAGES) & 1
    // for its entries i = 3 j + c only, skipping the others' phases. STAGES = 6 is a multiple of
    // 3, so each slot serves one consumer (c uses slots c and c + 3 alternately). No phase
    // aliasing: c itself consumed entry i - STAGES (its tile j - 2; for j < 2 the slot is in its
    // first phase), so the slot's phases up to that entry's have completed, and entry i + STAGES
    // cannot be copied before c releases entry i: the wait sees exactly entry i's phase.
    // The producer's copies arrive on `full` by themselves in tail mode (ws_body), so `full` of
    // entry i needs only its copies issued, i.e. the releases of entries <= i - STAGES (the
    // producer takes the stages in order), and the copies landed; nothing later.
    // Each section j issues P(j-1) V(j-1) before S(j) and releases entry i - 3 (its tile j - 1)
    // as soon as that product completed: c holds at most two slots (i - 3 while its product runs,
    // and i), and the copy of i + 3 (into i - 3's slot) starts one whole section before c needs it.
    // Deadlock-free (by induction over the turns; c's section j is turn 3 j + c, i.e. the turn of
    // its entry i, the padding turns come after every section): the turn of entry i waits for
    // (1) the arrive of turn i - 1, made right after that turn's products were issued, and
    // (2) `full` of entry i, i.e. the releases of entries e <= i - 6, each made by its owner's
    // section of entry e + 3 <= i - 3 (an earlier turn) once that section's own P V completed,
    // which waits on nothing else; such an e is never its owner's last tile (the only tiles never
    // released), because a consumer's last tile is one of the last 3 entries, kv_tiles - 3 or
    // later, and e + 6 <= i < kv_tiles. The named barriers count exactly as before (each turn
    // is one sync of its owner and one arrive of the previous owner; every consumer takes
    // `turns` turns; the last turn overall arrives nowhere).
    if (tail && PINGPONG && c == NC - 1 && turns > 0) named_arrive(other_turn, 256);

    // (Never in tail mode: every consumer has the tile's rows.)
    if (n_tiles > 0 && !active) {
        // Same barrier protocol as below (n_tiles + 1 turns; tiles released one section late),
        // no products: a path of its own so that the working path's wgmma stay unconditional.
        if (PINGPONG && c == NC - 1) named_arrive(other_turn, 256);
        for (u32 j = 0; j <= n_tiles; ++j) {
            if (j < n_tiles) mbar_wait(bar_full + (j % Ws<BN>::STAGES) * 8, (j / Ws<BN>::STAGES) & 1);
            if (PINGPONG) named_sync(my_turn, 256);
            if (PINGPONG && (j < n_tiles || c != NC - 1)) named_arrive(other_turn, 256);
            if (j >= 1 && j < n_tiles) mbar_arrive(bar_empty + ((j - 1) % Ws<BN>::STAGES) * 8);
        }
    } else if (my_tiles > 0) {
        if (PINGPONG && c == NC - 1 && !tail) named_arrive(other_turn, 256);
        float corr[2];

        // Section 0: S(0) only (entry e_add < STAGES: the slot's first phase).
        const u32 first = e_add % Ws<BN>::STAGES;
        mbar_wait(bar_full + first * 8, 0);
        if ((FLAGS & WS_NOINC) || ((FLAGS & WS_TAIL) && tail)) fence_proxy_async();
        if (PINGPONG) named_sync(my_turn, 256);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            wgmma_s<BN>(s, smem_desc(sq_wg + kc * 32),
                smem_desc(skv0 + first * Ws<BN>::STAGE_BYTES + kc * 32), kc);
        wgmma_commit();
        if (PINGPONG) named_arrive(other_turn, 256);
        wgmma_wait<0>();
        fence_regs<BN / 2>(s);
        ws_softmax_exp<BN>(s, row_max, row_sum, corr, lane, t0_of(e_add), end_of(first), scale_log2);
        ws_rescale_pack<BN>(s, o_acc, p, corr);

        // Section j: S(j) and O += P(j-1) V(j-1) as two commit groups; then softmax(j), release
        // tile j-1. OVERLAP: the exponentials of S(j) run while P(j-1) V(j-1) is still on the
        // tensor cores (they only touch s); O and P wait for it.
        for (u32 j = 1; j < my_tiles; ++j) {
            const u32 e = j * e_mul + e_add;  // ring entry and key tile
            const u32 stage = e % Ws<BN>::STAGES;
            const u32 prev = (e - e_mul) % Ws<BN>::STAGES;
            const u32 sk = skv0 + stage * Ws<BN>::STAGE_BYTES;
            const u32 sv_prev = skv0 + prev * Ws<BN>::STAGE_BYTES + Ws<BN>::TILE_BYTES;
            mbar_wait(bar_full + stage * 8, (e / Ws<BN>::STAGES) & 1);
            if ((FLAGS & WS_NOINC) || ((FLAGS & WS_TAIL) && tail)) fence_proxy_async();
            if (PINGPONG) named_sync(my_turn, 256);
            if constexpr ((FLAGS & WS_TAIL) != 0) {
                if (tail) {
                    fence_regs<BN / 2>(s);
                    fence_regs<32>(o_acc);
                    fence_frag<BN / 16>(p);
                    wgmma_fence();
                    // Tail mode: P(j-1) V(j-1) first, then S(j); the previous tile is released as
                    // soon as its product completed (groups complete in order), before S(j) and
                    // the softmax, so that the producer refills its stage one whole step before
                    // this consumer needs it (read the ring note above).
#pragma unroll
                    for (int kc = 0; kc < BN / 16; ++kc)
                        wgmma_m64n64k16_rs_trans(o_acc, p[kc], smem_desc(sv_prev + kc * 2048));
                    wgmma_commit();
#pragma unroll
                    for (int kc = 0; kc < 4; ++kc)
                        wgmma_s<BN>(s, smem_desc(sq_wg + kc * 32), smem_desc(sk + kc * 32), kc);
                    wgmma_commit();
                    if (PINGPONG) named_arrive(other_turn, 256);
                    wgmma_wait<1>();
                    fence_regs<32>(o_acc);
                    fence_frag<BN / 16>(p);
                    mbar_arrive(bar_empty + prev * 8);
                    wgmma_wait<0>();
                    fence_regs<BN / 2>(s);
                    ws_softmax_exp<BN>(s, row_max, row_sum, corr, lane, t0_of(e), end_of(stage), scale_log2);
                    ws_rescale_pack<BN>(s, o_acc, p, corr);
                    continue;
                }
            }
            fence_regs<BN / 2>(s);
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                wgmma_s<BN>(s, smem_desc(sq_wg + kc * 32), smem_desc(sk + kc * 32), kc);
            wgmma_commit();
#pragma unroll
            for (int kc = 0; kc < BN / 16; ++kc) wgmma_m64n64k16_rs_trans(o_acc, p[kc], smem_desc(sv_prev + kc * 2048));
            wgmma_commit();
            if (PINGPONG) named_arrive(other_turn, 256);
            const u32 t0 = t0_of(e);
            const u32 t_end = end_of(stage);
            if (OVERLAP) {
                wgmma_wait<1>();  // S(j) done (groups complete in order); P V may still run
                fence_regs<BN / 2>(s);
                ws_softmax_exp<BN>(s, row_max, row_sum, corr, lane, t0, t_end, scale_log2);
                wgmma_wait<0>();
                fence_regs<32>(o_acc);
                fence_frag<BN / 16>(p);
                mbar_arrive(bar_empty + prev * 8);
            } else {
                wgmma_wait<0>();
                fence_regs<BN / 2>(s);
                fence_regs<32>(o_acc);
                fence_frag<BN / 16>(p);
                mbar_arrive(bar_empty + prev * 8);
                ws_softmax_exp<BN>(s, row_max, row_sum, corr, lane, t0, t_end, scale_log2);
            }
            ws_rescale_pack<BN>(s, o_acc, p, corr);
        }

        // Last section: O += P(n-1) V(n-1).
        {
            const u32 last = ((my_tiles - 1) * e_mul + e_add) % Ws<BN>::STAGES;
            const u32 sv_last = skv0 + last * Ws<BN>::STAGE_BYTES + Ws<BN>::TILE_BYTES;
            if (PINGPONG) named_sync(my_turn, 256);
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < BN / 16; ++kc) wgmma_m64n64k16_rs_trans(o_acc, p[kc], smem_desc(sv_last + kc * 2048));
            wgmma_commit();
            // The very last turn (the last consumer's) arrives nowhere; in tail mode the last
            // consumer may still have padding turns after this section.
            if (PINGPONG && (c != NC - 1 || (tail && my_tiles + 1 < turns))) named_arrive(other_turn, 256);
            wgmma_wait<0>();
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
        }
    }
    if (tail) {
        // Protocol-only turns: no products, no full/empty traffic.
        for (u32 k = my_tiles > 0 ? my_tiles + 1 : 0; k < turns; ++k) {
            if (PINGPONG) named_sync(my_turn, 256);
            if (PINGPONG && (k + 1 < turns || c != NC - 1)) named_arrive(other_turn, 256);
        }
    }

    // ---- epilogue: rows wg_row0 + g and + 8 of this warp (an empty split writes zeros, -inf).
    const u32 wg_row0 = (tail ? 0 : c * 64) + (warp & 3) * 16;
    const u32 g = lane >> 2;
    const u32 tq = lane & 3;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        float l = row_sum[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const u32 row = q0 + wg_row0 + hf * 8 + g;
        if (row >= lq) continue;
        const u64 base = ((u64)row * heads + h) * HEAD_DIM;
        if (n_splits <= 1) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *(u32*)(out + base + j * 8 + tq * 2) =
                    pack_bf16x2(o_acc[j * 4 + hf * 2] * inv, o_acc[j * 4 + hf * 2 + 1] * inv);
        } else {
            // Tail mode: consumer c's keys are split c of the partials.
            const u32 out_split = tail ? c : split;
            const u64 pbase = (u64)out_split * lq * heads * HEAD_DIM + base;
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *(float2*)(part_o + pbase + j * 8 + tq * 2) =
                    make_float2(o_acc[j * 4 + hf * 2] * inv, o_acc[j * 4 + hf * 2 + 1] * inv);
            if (tq == 0)
                part_lse[((u64)out_split * lq + row) * heads + h] =
                    l > 0.f ? row_max[hf] + __log2f(l) : NEG_INF;
        }
    }
}

template <int BN, bool PINGPONG, bool OVERLAP, int FLAGS, int LAG, int NC>
__device__ __forceinline__ void ws_body(const u16* __restrict__ q, u16* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_lse, const u16* __restrict__ pool,
    u32 page_size, const u32* __restrict__ indices, const u32* __restrict__ cum,
    const u32* __restrict__ n_pages_ptr, u32 lq, u32 heads, u32 n_splits, float scale_log2,
    const TmaDesc* kv_map) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
    u16* sq = (u16*)smem;                                     // [NC * 64][64], swizzled
    u16* skv = (u16*)(smem + WS_Q_BYTES(NC));                 // [STAGES][K|V][BN][64]
    const u32 bar_full = smem_addr(smem + WS_Q_BYTES(NC) + Ws<BN>::STAGES * Ws<BN>::STAGE_BYTES);  // [STAGES]
    const u32 bar_empty = bar_full + Ws<BN>::STAGES * 8;                                   // [STAGES]
    // WS_TMA: each stage's valid key count, then the split's schedule (tiles, page, offset).
    u32* tile_valid = (u32*)(smem + WS_Q_BYTES(NC) + Ws<BN>::STAGES * Ws<BN>::STAGE_BYTES + Ws<BN>::STAGES * 16);
    u32* tma_sched = tile_valid + Ws<BN>::STAGES;

    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31;
    const u32 warp = tid >> 5;
    const u32 role = warp >> 2;  // 0 producer, 1 .. NC consumers
    u32 q_tile = blockIdx.x;
    u32 split = blockIdx.y;
    u32 h = blockIdx.z;
    if constexpr ((FLAGS & WS_TAIL) != 0) {
        // Dispatch order (CTAs start in the order of their linear index, x fastest): with a tail,
        // the first gridDim.z CTAs are the tail tile's working CTAs (split 0 of every head), so
        // the slowest CTAs start in the first wave and the others pack around them; then the full
        // tiles in the usual order (query tile, split, head); the tail's idle splits last (they
        // return at once). Without a tail the last query tile comes first (x = 0), harmless.
        const u32 last = gridDim.x - 1;
        if (lq - last * (NC * WS_WG_ROWS) <= WS_WG_ROWS) {
            const u32 lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            if (lin < gridDim.z) {
                q_tile = last;
                split = 0;
                h = lin;
            } else {
                const u32 r = lin - gridDim.z;
                if (r >= last * gridDim.y * gridDim.z) return;  // the tail's idle splits
                q_tile = r % last;
                split = (r / last) % gridDim.y;
                h = r / (last * gridDim.y);
            }
        } else {
            q_tile = blockIdx.x == 0 ? last : blockIdx.x - 1;
        }
    }
    const u32 q0 = q_tile * (NC * WS_WG_ROWS);
    // Tail-split (WS_TAIL, launched with 3 splits): the last query tile with 1..64 valid rows is
    // split 0's alone (splits 1 and 2 leave here, before any barrier is initialised or waited
    // on: nothing in their CTA runs). Its producer streams every key tile; consumer c takes the
    // tiles t = c (mod 3) for the tile's first 64 rows and writes them as split c.
    const bool tail = (FLAGS & WS_TAIL) && lq - q0 <= WS_WG_ROWS;
    if (tail && split != 0) return;

    // This split's key tiles (the contract: tiles of this kernel's BLOCK_N, split evenly).
    const u32 n_pages = __ldg(n_pages_ptr);
    const u32 kv_len = __ldg(cum + n_pages);
    const u32 kv_tiles = (kv_len + BN - 1) / BN;
    const u32 splits = n_splits > 0 ? n_splits : 1;
    const u32 tiles_per_split = (kv_tiles + splits - 1) / splits;
    const u32 tile_begin = split * tiles_per_split;
    u32 tile_end = tile_begin + tiles_per_split;
    if (tile_end > kv_tiles) tile_end = kv_tiles;
    u32 n_tiles = tile_end > tile_begin ? tile_end - tile_begin : 0;
    u32 kv_begin = tile_begin * BN;
    u32 kv_end = n_tiles > 0 ? (tile_end * BN < kv_len ? tile_end * BN : kv_len) : kv_begin;
    if (tail) {
        n_tiles = kv_tiles;
        kv_begin = 0;
        kv_end = kv_len;
    }

    if constexpr ((FLAGS & WS_TMA) != 0) {
        if (warp == 0) {
            const TmaSpan span = ws_tma_schedule<BN>(cum, n_pages, split, splits, tail, lane);
            if (lane == 0) {
                tma_sched[0] = span.n_tiles;
                tma_sched[1] = span.page;
                tma_sched[2] = span.offset;
            }
        }
    }
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < Ws<BN>::STAGES; ++s) {
            // every producer thread arrives; TMA: the one issuing thread, plus the bytes
            mbar_init(bar_full + s * 8, (FLAGS & WS_TMA) ? 1 : 128);
            // every consumer thread arrives; tail mode: one consumer per ring entry
            mbar_init(bar_empty + s * 8, tail ? 128 : NC * 128);
        }
    }
    __syncthreads();  // the only CTA-wide barrier: the roles never meet again
    if constexpr ((FLAGS & WS_TMA) != 0) n_tiles = tma_sched[0];

    // setmaxnreg wants each warpgroup's role as one branch of a single if/else.
    if (role == 0) {
        // 2 consumers: 40 + 2 x 232 registers per thread-row of the 64K file (x 128 threads);
        // 3 consumers: 32 + 3 x 160 (FlashAttention-3's split for four warpgroups).
        if constexpr ((FLAGS & WS_REGS) && NC == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if constexpr ((FLAGS & WS_REGS) && NC == 3) asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n" ::: "memory");
        if constexpr ((FLAGS & WS_TMA) != 0) {
            if (tid == 0 && n_tiles > 0)
                ws_producer_tma<BN>(kv_map, smem_addr(skv), bar_full, bar_empty, tile_valid, indices, cum,
                    TmaSpan{n_tiles, tma_sched[1], tma_sched[2]}, h);
        } else if constexpr ((FLAGS & WS_TAIL) != 0) {
            // Tail mode: copies that arrive on `full` by themselves (WS_NOINC; the consumers
            // fence to the async proxy after the wait), so that a tile is announced as soon as it
            // landed, never held back behind the producer's wait for a later stage (read
            // ws_consumer's ring note).
            if (n_tiles > 0 && tail)
                ws_producer<BN, FLAGS | WS_NOINC, LAG>(tid, skv, bar_full, bar_empty, pool, page_size,
                    indices, cum, n_pages, kv_len, kv_begin, kv_end, n_tiles, heads, h);
            else if (n_tiles > 0)
                ws_producer<BN, FLAGS, LAG>(tid, skv, bar_full, bar_empty, pool, page_size, indices,
                    cum, n_pages, kv_len, kv_begin, kv_end, n_tiles, heads, h);
        } else if (n_tiles > 0)
            ws_producer<BN, FLAGS, LAG>(tid, skv, bar_full, bar_empty, pool, page_size, indices, cum,
                                    n_pages, kv_len, kv_begin, kv_end, n_tiles, heads, h);
    } else {
        if constexpr ((FLAGS & WS_REGS) && NC == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        if constexpr ((FLAGS & WS_REGS) && NC == 3) asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");
        ws_consumer<BN, PINGPONG, OVERLAP, FLAGS, NC>(q, out, part_o, part_lse, lq, heads, n_splits,
            scale_log2, sq, skv, bar_full, bar_empty, role - 1, tid, lane, warp, q0, split, h,
            n_tiles, kv_begin, kv_end, tail, tile_valid);
    }
}

// Smem: 1024 (alignment slack) + NC x 8 KB Q + STAGES x (2 x BN x 128 B) K/V + 2 x STAGES
// mbarriers. NC consumer warpgroups + 1 producer: (NC + 1) x 128 threads, one CTA per SM.
#define WS_ENTRY_NC(NAME, BN, PINGPONG, OVERLAP, FLAGS, LAG, NC)                                   \
    extern "C" __global__ void __launch_bounds__((NC + 1) * 128, 1) NAME(                         \
        const u16* __restrict__ q, u16* __restrict__ out, float* __restrict__ part_o,             \
        float* __restrict__ part_lse, const u16* __restrict__ pool, u32 page_size,                \
        const u32* __restrict__ indices, const u32* __restrict__ cum,                             \
        const u32* __restrict__ n_pages_ptr, u32 lq, u32 heads, u32 n_splits, float scale_log2,   \
        const __grid_constant__ TmaDesc kv_map) {                                                 \
        ws_body<BN, PINGPONG, OVERLAP, FLAGS, LAG, NC>(q, out, part_o, part_lse, pool, page_size,  \
            indices, cum, n_pages_ptr, lq, heads, n_splits, scale_log2, &kv_map);                 \
    }
// Two consumers (128 query rows, 384 threads).
#define WS_ENTRY(NAME, BN, PINGPONG, OVERLAP, FLAGS, LAG) WS_ENTRY_NC(NAME, BN, PINGPONG, OVERLAP, FLAGS, LAG, 2)

// Ping-pong consumers, softmax overlapping the consumer's own P V.
WS_ENTRY(paged_attention_fwd_sm90_ws, 128, true, true, 0, 2)
// Ping-pong, each section fully serial (wait for both products, then the softmax).
WS_ENTRY(paged_attention_fwd_sm90_ws_serial, 128, true, false, 0, 2)
// No ping-pong: the two consumers issue whenever ready; softmax overlapping P V.
WS_ENTRY(paged_attention_fwd_sm90_ws_free, 128, false, true, 0, 2)
// The default with setmaxnreg (producer 40 registers, consumers 232).
WS_ENTRY(paged_attention_fwd_sm90_ws_regs, 128, true, true, WS_REGS, 2)
// setmaxnreg and a 3-tile copy lag (four tiles of copies in flight per producer thread; with six
// stages and two held by the consumers, more would put the producer on the consumers' path).
WS_ENTRY(paged_attention_fwd_sm90_ws_lag3, 128, true, true, WS_REGS, 3)
// setmaxnreg and copies that arrive on the `full` barrier by themselves (no producer waits).
WS_ENTRY(paged_attention_fwd_sm90_ws_noinc, 128, true, true, WS_REGS | WS_NOINC, 2)
// 192-key tiles (four stages), setmaxnreg, 1-tile lag.
WS_ENTRY(paged_attention_fwd_sm90_ws_n192, 192, true, true, WS_REGS, 1)
// 192-key tiles, setmaxnreg, copies arriving by themselves.
WS_ENTRY(paged_attention_fwd_sm90_ws_n192_noinc, 192, true, true, WS_REGS | WS_NOINC, 1)
// Diagnostic (wrong results): no copies at all; the consumers' time alone.
WS_ENTRY(paged_attention_fwd_sm90_ws_nocopy, 128, true, true, WS_REGS | WS_NOINC | WS_NOCOPY, 2)
// Three consumers (192 query rows, 512 threads; FlashAttention-3's layout for head dim 64):
// 128-key tiles in six stages (24 KB Q + 192 KB ring), setmaxnreg 32/160, 2-tile lag.
WS_ENTRY_NC(paged_attention_fwd_sm90_ws_m192, 128, true, true, WS_REGS, 2, 3)
// ws_m192 with the tail-split (WS_TAIL): always 3 key splits; a last query tile of 1..64 rows
// runs in split 0's CTA alone with the keys dealt round-robin to its three consumers, so every
// working CTA costs the same (1005 x 16 heads: 16 x (5 x 3 + 1) = 256 CTAs, two waves on 132 SMs).
WS_ENTRY_NC(paged_attention_fwd_sm90_ws_m192t, 128, true, true, WS_REGS | WS_TAIL, 2, 3)
// TMA producers (WS_TMA: page-aligned tiles, one thread issuing a K and a V box per tile) for
// the 192-key default, the three-consumer kernel and its tail-split.
WS_ENTRY(paged_attention_fwd_sm90_ws_n192_tma, 192, true, true, WS_REGS | WS_TMA, 1)
WS_ENTRY_NC(paged_attention_fwd_sm90_ws_m192_tma, 128, true, true, WS_REGS | WS_TMA, 2, 3)
WS_ENTRY_NC(paged_attention_fwd_sm90_ws_m192t_tma, 128, true, true, WS_REGS | WS_TAIL | WS_TMA, 2, 3)
// Diagnostics (wrong results): ws_m192 and ws_m192t without copies, their consumers' time alone.
WS_ENTRY_NC(paged_attention_fwd_sm90_ws_m192_nocopy, 128, true, true, WS_REGS | WS_NOINC | WS_NOCOPY, 2, 3)
WS_ENTRY_NC(paged_attention_fwd_sm90_ws_m192t_nocopy, 128, true, true, WS_REGS | WS_TAIL | WS_NOCOPY, 2, 3)
