// Paged attention for Hopper (sm_90a), warp-specialised (FlashAttention-3 style). Same layouts
// and page table as paged_attention.cu (read its header); same result format as the portable
// kernel (bf16 `out` with one split, else f32 partials normalised by the split's own sum and
// their log2-domain LSE), except that with `tickets` the splits are merged in the kernel: the
// last split to finish a warp's 16 rows writes their bf16 output, and no attention_combine runs.
//
// One CTA per SM: 3 warpgroups, 128 query rows of one head against one key split (or 5 and 256
// rows: the four-consumer entry).
//   warpgroup 0  producer: gathers the paged K/V tiles (BN = 64, 128 or 192 keys) with cp.async
//                into a ring of STAGES shared-memory stages; each row looks up its own page (a
//                tile may straddle pages). A stage is announced on its `full` mbarrier once its copies
//                landed (the producer waits LAG tiles behind, then fences to the async proxy and
//                arrives), and refilled once every consumer arrived on its `empty` mbarrier.
//   warpgroups 1 .. NC  consumers, 64 query rows each (with four consumers, a last tile of at
//                most 64 rows, such as the 18 of 1042 tokens, has consumer 0 work alone, taking
//                no turns: the others leave at once; its CTAs start after every full tile's,
//                and it may take more key splits than they do: ws_tile). Per key tile j one "GEMM section" issues
//                S(j) = Q K(j)^T (m64nBNk16, Q and K from shared memory) together with
//                O += P(j-1) V(j-1) (m64n64k16, P from registers, V MN-major), waits for S(j),
//                then does the online softmax of S(j) into P(j) on the CUDA cores while its own
//                P(j-1) V(j-1) may still run (only O and P wait for it). The consumers take
//                turns issuing their sections, in a ring through named barriers 1 .. NC (with
//                two, ping-pong), so one warpgroup's softmax runs while another's products
//                occupy the tensor cores.
// Tiles are stored with the 128-byte swizzle the wgmma descriptors expect (16-byte chunk c of
// row r at c ^ (r & 7)).
//
// Six entry points: paged_attention_fwd_sm90_ws_m256 (four consumers, 256 query rows, 64-key
// tiles in twelve stages, setmaxnreg 32/112, a 2-tile copy lag; more consumer warps per SM
// sub-partition hide more of the softmax's latency), paged_attention_fwd_sm90_ws_m256_fixed (the
// same with one softmax offset for all scores, from the host's bound on them: no maxima, no
// rescale; the default for global attention, whose q and k are qk-normed),
// paged_attention_fwd_sm90_ws_m256_log2 (the same for queries already in the log2 domain, offset 0),
// paged_attention_fwd_sm90_ws_n192 (192-key tiles in four stages, setmaxnreg 40/232, a 1-tile
// copy lag),
// paged_attention_fwd_sm90_ws (128-key tiles in six stages, no setmaxnreg, a 2-tile lag: the
// default for frame-local attention, whose 1005 keys waste less of a ragged last tile of 128) and
// paged_attention_fwd_sm90_ws_qkv (the same, its keys, values and queries read from a q/k/v
// GEMM's output: DINO's frame-local attention without a split kernel). The variants that lost
// against them (their numbers: docs/cuda.md, "Experiments that lost") are in git history before
// commit 51ba199.

#include "common.cuh"
#include "sm90.cuh"

// The wgmma shapes and fragment layouts below are written for 64-wide heads.
static_assert(HEAD_DIM == 64, "paged_attention_sm90_ws.cu is specialised for head_dim 64");
// Query rows per consumer warpgroup (a CTA has NC consumer warpgroups, plus its producer).
#define WS_WG_ROWS 64
// Bytes of the Q tile of NC consumers (the K/V ring and its barriers follow it).
#define WS_Q_BYTES(NC) ((NC) * WS_WG_ROWS * HEAD_DIM * 2)
// Key tile BN (64, 128 or 192): K and V tiles of one stage, ring depth (the ring is 192 KB in
// every case).
template <int BN>
struct Ws {
    static constexpr u32 STAGES = BN == 64 ? 12 : BN == 128 ? 6 : 4;
    static constexpr u32 TILE_BYTES = BN * HEAD_DIM * 2;
    static constexpr u32 STAGE_BYTES = 2 * TILE_BYTES;
};

// S tile of BN keys: m64n64k16, m64n128k16 or m64n192k16.
template <int BN>
__device__ __forceinline__ void wgmma_s(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    if constexpr (BN == 64) wgmma_m64n64k16_ss(d, desc_a, desc_b, scale_d);
    else if constexpr (BN == 128) wgmma_m64n128k16_ss(d, desc_a, desc_b, scale_d);
    else wgmma_m64n192k16_ss(d, desc_a, desc_b, scale_d);
}

// Where K and V live. QKV false: the pool `[page][K|V][heads][page_size][64]`. QKV true: a q/k/v
// GEMM's output `[token][q|k|v][heads][64]`, `pool` pointing at the first token's K, one page
// per frame of page_size tokens (frame-local attention without a split kernel; the queries are
// the same rows' q, 3 x heads x 64 apart).
template <bool QKV>
struct WsLayout {
    u32 row;          // between consecutive keys of a head
    u32 head;         // between heads
    u32 v;            // K -> V
    u32 page;         // between pages
    __device__ __forceinline__ WsLayout(u32 page_size, u32 heads) {
        if constexpr (QKV) {
            row = 3 * heads * HEAD_DIM;
            head = HEAD_DIM;
            v = heads * HEAD_DIM;
            page = page_size * row;
        } else {
            row = HEAD_DIM;
            head = page_size * HEAD_DIM;
            v = head * heads;
            page = 2 * v;
        }
    }
};

// ---- producer: warpgroup 0 -------------------------------------------------------------------
// Thread `tid` (0..127) copies chunk column tid & 7 of rows (tid >> 3) + 16 i, i < BN / 16, of every
// tile, K and V.
template <int BN, int LAG, bool QKV>
__device__ __forceinline__ void ws_producer(u32 tid, u16* skv, u32 bar_full, u32 bar_empty,
    const u16* __restrict__ pool, u32 page_size, const u32* __restrict__ indices,
    const u32* __restrict__ cum, u32 n_pages, u32 kv_len, u32 kv_begin, u32 kv_end, u32 n_tiles,
    u32 heads, u32 h) {
    constexpr u32 kRowStep = 128 / ROW_CHUNKS;                // 16
    constexpr int kLoadRows = BN / kRowStep;           // 4, 8 or 12
    // 32-bit strides: the host checks that a page (K and V) has fewer than 2^32 elements.
    const WsLayout<QKV> at(page_size, heads);
    const u32 head_stride = at.head;
    const u32 v_offset = at.v;
    const u32 page_stride = at.page;
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

    // Shared addresses once: this thread's rows are 16 apart, so with the 128-byte swizzle
    // (which depends on the row only through r & 7) row ld_row + 16 i of a tile is 2 KB past
    // row ld_row. The ring's stage and phase, and the stage of the tile being announced, are
    // counted rather than divided out.
    const u32 row_dst = smem_addr(skv) + swz(ld_row, ld_col) * 16;
    u32 stage = 0, phase = 0, announce = 0;
    for (u32 j = 0; j < n_tiles; ++j) {
        // Wait until the consumers released this stage's previous tile (j - STAGES).
        mbar_wait(bar_empty + stage * 8, phase ^ 1);
        const u32 dst = row_dst + stage * Ws<BN>::STAGE_BYTES;
        const u32 t0 = kv_begin + j * BN + ld_row;
#pragma unroll
        for (int i = 0; i < kLoadRows; ++i) {
            const u32 t = t0 + kRowStep * i;
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
                src = page_ptr + (t - lo) * at.row;
            }
            const u32 d = dst + i * (kRowStep * ROW_CHUNKS * 16);
            cp_async_16(d, src, ok);
            cp_async_16(d + Ws<BN>::TILE_BYTES, ok ? src + v_offset : src, ok);
        }
        cp_async_commit();
        // Announce tile j - LAG once this thread's copies of it have landed: LAG + 1 tiles of
        // copies stay in flight per thread.
        if (j >= LAG) {
            cp_async_wait<LAG>();
            fence_proxy_async();
            mbar_arrive(bar_full + announce * 8);
            if (++announce == Ws<BN>::STAGES) announce = 0;
        }
        if (++stage == Ws<BN>::STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    cp_async_wait<0>();
    fence_proxy_async();
    for (u32 j = n_tiles > LAG ? n_tiles - LAG : 0; j < n_tiles; ++j) {
        mbar_arrive(bar_full + announce * 8);
        if (++announce == Ws<BN>::STAGES) announce = 0;
    }
}

// Softmax modes (SM): the running row maximum; one offset for all scores; queries already in the
// log2 domain (multiplied by log2(e)/8 by the caller) and no offset.
#define SM_RUNNING 0
#define SM_FIXED 1
#define SM_LOG2 2

// ---- consumers: online softmax of one S tile -------------------------------------------------
// s holds this thread's 2 rows x 32 columns of S (row g + 8 hf, column 8 j + 2 (lane & 3) + e at
// s[4 j + 2 hf + e]). Part 1 (S only): mask, new row maxima, s := P in f32, row sums, and the
// factor corr[hf] by which O must be rescaled. Reductions are trees: with only two consumer warps
// per SM sub-partition, the dependent-latency chain is what the softmax's time is made of.
// SM_FIXED / SM_LOG2: every score is offset by the same row_max (the host's offset_log2; 0 with
// SM_LOG2), corr is 1.
template <int BN, int SM>
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
    if constexpr (SM != SM_RUNNING) {
        // A fixed offset (row_max holds it and never moves): no maxima, no rescale of O. The
        // host chose it from a bound on the scores (src/attention/score_bound.rs), so every
        // p <= 2^64 and each row's largest p >= 2^-100. With log2-domain queries and offset 0
        // the score is the exponent itself.
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const float m = row_max[hf];
            float sum4[4];
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const float e0 = SM == SM_LOG2 ? s[j * 4 + hf * 2] : fmaf(s[j * 4 + hf * 2], scale_log2, -m);
                const float e1 = SM == SM_LOG2 ? s[j * 4 + hf * 2 + 1] : fmaf(s[j * 4 + hf * 2 + 1], scale_log2, -m);
                const float p0 = fast_exp2(e0);
                const float p1 = fast_exp2(e1);
                s[j * 4 + hf * 2] = p0;
                s[j * 4 + hf * 2 + 1] = p1;
                // The first four pairs start the sums (not 0 + x: an add a row half each).
                sum4[j & 3] = j < 4 ? p0 + p1 : sum4[j & 3] + (p0 + p1);
            }
            row_sum[hf] += (sum4[0] + sum4[1]) + (sum4[2] + sum4[3]);
            corr[hf] = 1.f;
        }
    } else {
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
            float sum4[4];
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const float p0 = fast_exp2(fmaf(s[j * 4 + hf * 2], scale_log2, -m_new));
                const float p1 = fast_exp2(fmaf(s[j * 4 + hf * 2 + 1], scale_log2, -m_new));
                s[j * 4 + hf * 2] = p0;
                s[j * 4 + hf * 2 + 1] = p1;
                // The first four pairs start the sums (not 0 + x: an add a row half each).
                sum4[j & 3] = j < 4 ? p0 + p1 : sum4[j & 3] + (p0 + p1);
            }
            row_sum[hf] = row_sum[hf] * corr[hf] + ((sum4[0] + sum4[1]) + (sum4[2] + sum4[3]));
        }
    }
}

// Part 2 (once O += P V of the previous tile has completed): rescale O, pack P to bf16 for the
// next P V (the m64k16 A-fragment layout: rows g / g + 8, columns 16 kc + 2 (lane & 3) (+ 8)).
template <int BN, int SM>
__device__ __forceinline__ void ws_rescale_pack(const float* s, float* o_acc, u32 (*p)[4], const float* corr) {
    if constexpr (SM == SM_RUNNING) {
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
// LONE: the tile's rows all lie in consumer 0's 64 (a partial last tile, such as the 18 rows of
// 1042 tokens): consumer 0 works alone and takes no turns, the others have left. Its own instance
// of the loop, so that the shared one stays as it was.
template <int BN, bool QKV, u32 NC, int SM, bool LONE>
__device__ __forceinline__ void ws_consumer(const u16* __restrict__ q, u16* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_lse, u32* __restrict__ tickets, u32 lq,
    u32 heads, u32 n_splits, float scale_log2, float offset_log2, u16* sq, u16* skv, u32 bar_full, u32 bar_empty, u32 c, u32 tid, u32 lane,
    u32 warp, u32 q0, u32 split, u32 h, u32 n_tiles, u32 kv_begin, u32 kv_end) {
    const u32 ctid = tid & 127;
#pragma unroll
    for (int i = 0; i < (64 * ROW_CHUNKS) / 128; ++i) {
        const u32 chunk = ctid + i * 128;
        const u32 r = c * 64 + (chunk >> 3), ch = chunk & 7;
        const u32 row = q0 + r;
        const bool ok = row < lq;
        const u64 q_row = QKV ? 3 * heads : heads;
        const u16* src = q + ((u64)(ok ? row : 0) * q_row + h) * HEAD_DIM + ch * 8;
        cp_async_16(smem_addr(sq + swz(r, ch) * 8), src, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    named_sync(1 + NC + c, 128);  // this warpgroup's Q rows are in shared memory

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
    // With a fixed offset the "maximum" is that offset from the start (and in the LSE).
    const float m0 = SM == SM_RUNNING ? NEG_INF : SM == SM_LOG2 ? 0.f : offset_log2;
    float row_max[2] = {m0, m0};
    float row_sum[2] = {0.f, 0.f};
    const u32 dq = smem_desc_lo(smem_addr(sq) + c * 64 * 128);
    const u32 skv0 = smem_addr(skv);
    // Ping-pong: barrier 1 + c is "consumer c may issue"; each consumer syncs on its own and
    // arrives on the other's after issuing. Consumer 0 goes first. Counts match exactly: each
    // consumer issues n_tiles + 1 sections; the last consumer arrives once up front and skips the
    // arrive after its last section (nobody would wait for it). A lone consumer takes no turns.
    const u32 my_turn = 1 + c;
    const u32 other_turn = 1 + (c + 1) % NC;
    constexpr bool turns = !LONE;

    if (n_tiles > 0) {
        if (turns && c == NC - 1) named_arrive(other_turn, 256);
        float corr[2];

        // Section 0: S(0) only (stage 0, its first phase).
        mbar_wait(bar_full, 0);
        if (turns) named_sync(my_turn, 256);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < 4; ++kc)
            wgmma_s<BN>(s, smem_desc_of(dq + kc * 2), smem_desc_of(smem_desc_lo(skv0) + kc * 2), kc);
        wgmma_commit();
        if (turns) named_arrive(other_turn, 256);
        wgmma_wait<0>();
        fence_regs<BN / 2>(s);
        ws_softmax_exp<BN, SM>(s, row_max, row_sum, corr, lane, kv_begin, kv_end, scale_log2);
        ws_rescale_pack<BN, SM>(s, o_acc, p, corr);

        // Section j: S(j) and O += P(j-1) V(j-1) as two commit groups; then softmax(j), release
        // tile j-1. The exponentials of S(j) run while P(j-1) V(j-1) is still on the tensor cores
        // (they only touch s); O and P wait for it.
        // The ring position moves by one a tile: stage and phase counted, not divided out; V of
        // tile j - 1 sits TILE_BYTES past its K.
        constexpr u32 V_LO = Ws<BN>::TILE_BYTES >> 4;
        u32 stage = 0, phase = 0;
        u32 dv_prev = smem_desc_lo(skv0) + V_LO;
        for (u32 j = 1; j < n_tiles; ++j) {
            const u32 prev = stage;
            if (++stage == Ws<BN>::STAGES) {
                stage = 0;
                phase ^= 1;
            }
            const u32 dk = smem_desc_lo(skv0 + stage * Ws<BN>::STAGE_BYTES);
            mbar_wait(bar_full + stage * 8, phase);
            if (turns) named_sync(my_turn, 256);
            fence_regs<BN / 2>(s);
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < 4; ++kc)
                wgmma_s<BN>(s, smem_desc_of(dq + kc * 2), smem_desc_of(dk + kc * 2), kc);
            wgmma_commit();
#pragma unroll
            for (int kc = 0; kc < BN / 16; ++kc) wgmma_m64n64k16_rs_trans(o_acc, p[kc], smem_desc_of(dv_prev + kc * 128));
            wgmma_commit();
            if (turns) named_arrive(other_turn, 256);
            wgmma_wait<1>();  // S(j) done (groups complete in order); P V may still run
            fence_regs<BN / 2>(s);
            ws_softmax_exp<BN, SM>(s, row_max, row_sum, corr, lane, kv_begin + j * BN, kv_end, scale_log2);
            wgmma_wait<0>();
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
            mbar_arrive(bar_empty + prev * 8);
            ws_rescale_pack<BN, SM>(s, o_acc, p, corr);
            dv_prev = dk + V_LO;
        }

        // Last section: O += P(n-1) V(n-1).
        {
            const u32 dv_last = dv_prev;  // tile n_tiles - 1's V
            if (turns) named_sync(my_turn, 256);
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
            wgmma_fence();
#pragma unroll
            for (int kc = 0; kc < BN / 16; ++kc) wgmma_m64n64k16_rs_trans(o_acc, p[kc], smem_desc_of(dv_last + kc * 128));
            wgmma_commit();
            // The very last turn (the last consumer's) arrives nowhere.
            if (turns && c != NC - 1) named_arrive(other_turn, 256);
            wgmma_wait<0>();
            fence_regs<32>(o_acc);
            fence_frag<BN / 16>(p);
        }
    }

    // ---- epilogue: rows wg_row0 + g and + 8 of this warp (an empty split writes zeros, -inf).
    const u32 wg_row0 = c * 64 + (warp & 3) * 16;
    const u32 g = lane >> 2;
    const u32 tq = lane & 3;
    float inv[2], lse[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        float l = row_sum[hf];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[hf] = l > 0.f ? 1.f / l : 0.f;
        lse[hf] = l > 0.f ? row_max[hf] + __log2f(l) : NEG_INF;
    }
    if (n_splits <= 1) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const u32 row = q0 + wg_row0 + hf * 8 + g;
            if (row >= lq) continue;
            const u64 base = ((u64)row * heads + h) * HEAD_DIM;
#pragma unroll
            for (int j = 0; j < 8; ++j)
                *(u32*)(out + base + j * 8 + tq * 2) =
                    pack_bf16x2(o_acc[j * 4 + hf * 2] * inv[hf], o_acc[j * 4 + hf * 2 + 1] * inv[hf]);
        }
        return;
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const u32 row = q0 + wg_row0 + hf * 8 + g;
        if (row >= lq) continue;
        const u64 pbase = ((u64)split * lq * heads + (u64)row * heads + h) * HEAD_DIM;
#pragma unroll
        for (int j = 0; j < 8; ++j)
            *(float2*)(part_o + pbase + j * 8 + tq * 2) =
                make_float2(o_acc[j * 4 + hf * 2] * inv[hf], o_acc[j * 4 + hf * 2 + 1] * inv[hf]);
        if (tq == 0) part_lse[((u64)split * lq + row) * heads + h] = lse[hf];
    }
    if (!tickets) return;  // attention_combine merges the splits

    // The splits merged here, by whichever split's warp finishes these 16 rows last: every warp
    // publishes its partial (the fence orders its stores before its ticket), the last to take a
    // ticket reads the others' partials and writes the bf16 rows, and sets the ticket back to
    // zero for the next launch. Rows past lq of a working consumer still take their ticket, so
    // every slot counts n_splits arrivals, the tile's own split count (a consumer that left takes
    // none, in every split alike: a lone tile is lone in all of them). Same sums in the same split
    // order as attention_combine.
    // This CTA's query tile, and the head's tiles: the grid's x, except in the four-consumer
    // kernels, whose grid may hold more columns for a lone last tile's key splits (ws_tile).
    const u32 q_tile = NC == 4 ? q0 / (NC * WS_WG_ROWS) : blockIdx.x;
    const u32 q_tiles = NC == 4 ? (lq + NC * WS_WG_ROWS - 1) / (NC * WS_WG_ROWS) : gridDim.x;
    const u32 slot = (h * q_tiles + q_tile) * (NC * 4) + c * 4 + (warp & 3);
    __threadfence();
    __syncwarp();
    u32 arrived = 0;
    if (lane == 0) arrived = atomicAdd(tickets + slot, 1u);
    arrived = __shfl_sync(0xffffffffu, arrived, 0);
    if (arrived != n_splits - 1) return;
    if (lane == 0) tickets[slot] = 0u;
    __threadfence();
    const u64 plane = (u64)lq * heads;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const u32 row = q0 + wg_row0 + hf * 8 + g;
        if (row >= lq) continue;
        const u64 rh = (u64)row * heads + h;
        float mx = NEG_INF;
        for (u32 s = 0; s < n_splits; ++s)
            mx = fmaxf(mx, s == split ? lse[hf] : __ldcg(part_lse + s * plane + rh));
        float acc[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[i] = 0.f;
        float wsum = 0.f;
        for (u32 s = 0; s < n_splits; ++s) {
            const float ls = s == split ? lse[hf] : __ldcg(part_lse + s * plane + rh);
            const float w = ls == NEG_INF ? 0.f : fast_exp2(ls - mx);
            const float* src = part_o + (s * plane + rh) * HEAD_DIM + tq * 2;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                float2 v;
                if (s == split) {
                    v = make_float2(o_acc[j * 4 + hf * 2] * inv[hf], o_acc[j * 4 + hf * 2 + 1] * inv[hf]);
                } else {
                    v = __ldcg((const float2*)(src + j * 8));
                }
                acc[2 * j] += w * v.x;
                acc[2 * j + 1] += w * v.y;
            }
            wsum += w;
        }
        const float winv = wsum > 0.f ? 1.f / wsum : 0.f;
        const u64 base = rh * HEAD_DIM;
#pragma unroll
        for (int j = 0; j < 8; ++j)
            *(u32*)(out + base + j * 8 + tq * 2) = pack_bf16x2(acc[2 * j] * winv, acc[2 * j + 1] * winv);
    }
}

// ---- which tile and key split a CTA works on. The grid is (query tiles, splits, views x
// heads), and CTAs start in the order of their linear index (x fastest). With four consumers a
// lone last query tile (at most 64 rows: 18 of 1042 tokens) takes a fraction of a full tile's
// time, and where its CTAs sit among the full ones they put the SMs out of step, so that at the
// end of the launch some start a full tile while the rest have nothing left. So the full tiles
// take the first linear indices, in the grid's own order (tile, then split, then head: the tiles
// sharing a split's keys still run side by side), and the lone tiles the last ones, filling the
// SMs as the full tiles' last wave leaves them idle. And the lone tile has key splits of its own:
// the host may give the grid more columns than query tiles (x = full tiles + e), and the lone
// tile then takes e x (the grid's y) splits, so that its CTAs, after the full ones, share its keys
// across the GPU instead of each reading a full tile's share with one consumer
// (src/backend/cuda/attention.rs, tail_splits). `splits` is the CTA's tile's split count;
// `planes` the most any tile has (the stride between views' partials). Without a lone tile the
// grid is the tiles and the order is the grid's.
struct WsTile {
    u32 q_tile, split, z, splits, planes;
};

template <u32 NC>
__device__ __forceinline__ WsTile ws_tile(u32 lq, u32 n_splits) {
    const u32 tiles = (lq + NC * WS_WG_ROWS - 1) / (NC * WS_WG_ROWS);
    const bool lone_last = NC == 4 && lq - (tiles - 1) * (NC * WS_WG_ROWS) <= WS_WG_ROWS;
    if (!lone_last) return {blockIdx.x, blockIdx.y, blockIdx.z, n_splits, n_splits};
    const u32 full = tiles - 1;
    const u32 tail_splits = (gridDim.x - full) * gridDim.y;
    const u32 planes = tail_splits > n_splits ? tail_splits : n_splits;
    const u32 id = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const u32 n_full = full * gridDim.y * gridDim.z;
    if (id < n_full) {
        const u32 r = id / full;
        return {id - r * full, r % gridDim.y, r / gridDim.y, n_splits, planes};
    }
    const u32 t = id - n_full;
    return {full, t % tail_splits, t / tail_splits, tail_splits, planes};
}

// REGS: setmaxnreg (the producer warpgroup drops to 40 registers, the consumers rise to 232, or
// 32 and 112 with four consumers).
// LAG: tiles the producer announces behind its latest copies.
// QKV: keys, values and queries in a q/k/v GEMM's output (WsLayout).
// NC: consumer warpgroups (2, or 4 with setmaxnreg 32/112: a CTA of 20 warps puts 5 on each SM
// sub-partition, whose 16K registers allow 96 each at launch, and the consumers can only take
// what the producer gives back: 128 x 64 = 512 x 16).
// Views: blockIdx.z = view * heads + head. View v's queries, outputs, partials and tickets
// follow view 0's (lq rows each), and its page table is view_stride u32 after view 0's (its
// n_pages, indices and cum alike): the two frames of a two-frame step, each over its own keys,
// in one launch. One view (grid.z = heads) reads none of it.
template <int BN, bool REGS, int LAG, bool QKV, u32 NC, int SM>
__device__ __forceinline__ void ws_body(const u16* __restrict__ q, u16* __restrict__ out,
    float* __restrict__ part_o, float* __restrict__ part_lse, const u16* __restrict__ pool,
    u32 page_size, const u32* __restrict__ indices, const u32* __restrict__ cum,
    const u32* __restrict__ n_pages_ptr, u32 lq, u32 heads, u32 n_splits, float scale_log2,
    float offset_log2, u32* __restrict__ tickets, u32 view_stride) {
    static_assert(NC == 2 || (NC == 4 && REGS), "four consumers need setmaxnreg to fit their tiles");
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((u64)smem_raw + 1023) & ~(u64)1023);
    u16* sq = (u16*)smem;                                     // [NC * 64][64], swizzled
    u16* skv = (u16*)(smem + WS_Q_BYTES(NC));                 // [STAGES][K|V][BN][64]
    const u32 bar_full = smem_addr(smem + WS_Q_BYTES(NC) + Ws<BN>::STAGES * Ws<BN>::STAGE_BYTES);  // [STAGES]
    const u32 bar_empty = bar_full + Ws<BN>::STAGES * 8;                                   // [STAGES]

    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31;
    const u32 warp = tid >> 5;
    // 0 producer, 1 .. NC consumers. Through a shuffle from lane 0 so the compiler knows it is
    // warp-uniform: what derives from it (a consumer's Q descriptors) can live in uniform
    // registers instead of being moved there before every wgmma.
    const u32 role = __shfl_sync(0xffffffffu, warp >> 2, 0);
    // ws_tile returns the grid's own coordinates in the two-consumer kernels, but reading them
    // through it changes their machine code (cuobjdump, 2026-12-07); the NC == 4 conditions keep
    // the two-consumer kernels' code the measured one.
    const WsTile at = ws_tile<NC>(lq, n_splits);
    const u32 split = NC == 4 ? at.split : blockIdx.y;
    // This tile's key splits (a lone last tile may have more than the launch's n_splits).
    const u32 tile_splits = NC == 4 ? at.splits : n_splits;
    const u32 z = NC == 4 ? at.z : blockIdx.z;
    const u32 view = z / heads;
    const u32 h = z - view * heads;
    const u32 q0 = (NC == 4 ? at.q_tile : blockIdx.x) * (NC * WS_WG_ROWS);
    if (view > 0) {
        const u64 rows = (u64)view * lq;
        const u32 plane_splits = NC == 4 ? at.planes : n_splits;
        const u64 planes = rows * (plane_splits > 0 ? plane_splits : 1);
        q += rows * (QKV ? 3 * heads : heads) * HEAD_DIM;
        out += rows * heads * HEAD_DIM;
        if (part_o) part_o += planes * heads * HEAD_DIM;
        if (part_lse) part_lse += planes * heads;
        const u32 q_tiles = NC == 4 ? (lq + NC * WS_WG_ROWS - 1) / (NC * WS_WG_ROWS) : gridDim.x;
        if (tickets) tickets += (u64)view * q_tiles * heads * (NC * 4);
        indices += (u64)view * view_stride;
        cum += (u64)view * view_stride;
        n_pages_ptr += (u64)view * view_stride;
    }

    // This split's key tiles (the contract: tiles of this kernel's BLOCK_N, split evenly).
    const u32 n_pages = __ldg(n_pages_ptr);
    const u32 kv_len = __ldg(cum + n_pages);
    const u32 kv_tiles = (kv_len + BN - 1) / BN;
    const u32 splits = tile_splits > 0 ? tile_splits : 1;
    const u32 tiles_per_split = (kv_tiles + splits - 1) / splits;
    const u32 tile_begin = split * tiles_per_split;
    u32 tile_end = tile_begin + tiles_per_split;
    if (tile_end > kv_tiles) tile_end = kv_tiles;
    const u32 n_tiles = tile_end > tile_begin ? tile_end - tile_begin : 0;
    const u32 kv_begin = tile_begin * BN;
    const u32 kv_end = n_tiles > 0 ? (tile_end * BN < kv_len ? tile_end * BN : kv_len) : kv_begin;
    // A tile whose rows all lie in the first consumer's 64 (the grid has no tile starting at or
    // past lq): that consumer works alone, the others leave (the empty barriers count one). Only
    // in the four-consumer kernels: in the two-consumer (frame-local) ones the second instance
    // made DINO and the frame blocks 0.05-0.1 ms slower at 1005 tokens on the H200.
    const bool lone = NC == 4 && lq - q0 <= WS_WG_ROWS;
    const u32 nc = lone ? 1 : NC;

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < Ws<BN>::STAGES; ++s) {
            mbar_init(bar_full + s * 8, 128);        // every producer thread arrives
            mbar_init(bar_empty + s * 8, nc * 128);  // every working consumer thread arrives
        }
    }
    __syncthreads();  // the only CTA-wide barrier: the roles never meet again

    // setmaxnreg wants each warpgroup's role as one branch of a single if/else.
    if (role == 0) {
        // The consumers take what the producer gives back: 40 + 2 x 232 (from 168 each at
        // launch) or 32 + 4 x 112 (from 96).
        if constexpr (REGS && NC == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if constexpr (REGS && NC == 4) asm volatile("setmaxnreg.dec.sync.aligned.u32 32;\n" ::: "memory");
        if (n_tiles > 0)
            ws_producer<BN, LAG, QKV>(tid, skv, bar_full, bar_empty, pool, page_size, indices, cum,
                                 n_pages, kv_len, kv_begin, kv_end, n_tiles, heads, h);
    } else {
        if constexpr (REGS && NC == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        if constexpr (REGS && NC == 4) asm volatile("setmaxnreg.inc.sync.aligned.u32 112;\n" ::: "memory");
        if (!lone)
            ws_consumer<BN, QKV, NC, SM, false>(q, out, part_o, part_lse, tickets, lq, heads, tile_splits, scale_log2, offset_log2, sq,
                skv, bar_full, bar_empty, role - 1, tid, lane, warp, q0, split, h, n_tiles, kv_begin, kv_end);
        else if (role == 1)
            ws_consumer<BN, QKV, NC, SM, true>(q, out, part_o, part_lse, tickets, lq, heads, tile_splits, scale_log2, offset_log2, sq,
                skv, bar_full, bar_empty, 0, tid, lane, warp, q0, split, h, n_tiles, kv_begin, kv_end);
    }
}

// Smem: 1024 (alignment slack) + NC x 8 KB Q + STAGES x (2 x BN x 128 B) K/V + 2 x STAGES
// mbarriers. NC consumer warpgroups + 1 producer: (NC + 1) x 128 threads, one CTA per SM.
// The host names each entry point once more, in src/backend/cuda/attention/table.rs.
#define WS_ENTRY(NAME, BN, REGS, LAG, QKV, NC, SM)                                                 \
    extern "C" __global__ void __launch_bounds__(((NC) + 1) * 128, 1) NAME(                       \
        const u16* __restrict__ q, u16* __restrict__ out, float* __restrict__ part_o,             \
        float* __restrict__ part_lse, const u16* __restrict__ pool, u32 page_size,                \
        const u32* __restrict__ indices, const u32* __restrict__ cum,                             \
        const u32* __restrict__ n_pages_ptr, u32 lq, u32 heads, u32 n_splits, float scale_log2,   \
        float offset_log2, u32* __restrict__ tickets, u32 view_stride) {                          \
        ws_body<BN, REGS, LAG, QKV, NC, SM>(q, out, part_o, part_lse, pool, page_size, indices,  \
            cum, n_pages_ptr, lq, heads, n_splits, scale_log2, offset_log2, tickets, view_stride);\
    }

// 128-key tiles (six stages), 2-tile copy lag: frame-local attention's default.
WS_ENTRY(paged_attention_fwd_sm90_ws, 128, false, 2, false, 2, SM_RUNNING)
// 192-key tiles (four stages), setmaxnreg, 1-tile copy lag.
WS_ENTRY(paged_attention_fwd_sm90_ws_n192, 192, true, 1, false, 2, SM_RUNNING)
// paged_attention_fwd_sm90_ws reading a q/k/v GEMM's output (WsLayout): DINO's frame-local
// attention, whose q/k/v need no norm or rotation, without the split kernel.
WS_ENTRY(paged_attention_fwd_sm90_ws_qkv, 128, false, 2, true, 2, SM_RUNNING)
// Four consumer warpgroups (256 query rows), 64-key tiles in twelve stages, setmaxnreg 32/112,
// 2-tile copy lag: global attention's kernel for layers whose scores are not bounded.
WS_ENTRY(paged_attention_fwd_sm90_ws_m256, 64, true, 2, false, 4, SM_RUNNING)

// The same with the softmax's offset fixed (offset_log2) instead of a running maximum: for
// scores the host has bounded (the global attention's qk-normed q and k). No maxima, no O
// rescale: 0.566 against 0.658 ms at 72/72 (H200, docs/cuda.md).
WS_ENTRY(paged_attention_fwd_sm90_ws_m256_fixed, 64, true, 2, false, 4, SM_FIXED)
// And for queries the caller multiplied by log2(e)/8 (folded into the q-norm's parameters) with
// offset 0: the score is the exponent, no multiply-add an element (about 4 % of the kernel).
WS_ENTRY(paged_attention_fwd_sm90_ws_m256_log2, 64, true, 2, false, 4, SM_LOG2)
