//! One pre-norm transformer block on the device (DINO blocks, aggregator frame and global
//! blocks): `x += ls1 ⊙ proj(attn(LN1 x))`, `x += ls2 ⊙ fc2(GELU(fc1(LN2 x)))`, with the residual
//! stream in f32 and every GEMM in bf16 with f32 accumulation. Only launches: graph-capturable.

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::backend::cuda::arena::{ArenaPlan, DevPtr};
use crate::backend::cuda::attention::{
    AttentionKernel, KeyViews, MAX_TAIL_SPLITS, RawPagedKv, RawWorkspace, Softmax, choose_splits,
    frame_attention_from_qkv, has_frame_attention_from_qkv, paged_attention_raw,
    paged_attention_views_raw,
};
use crate::backend::cuda::gemm::{Epilogue, Gemm};
use crate::backend::cuda::ops::{self, LnOut, PagedKvDest, QkNorm, Rope, RowCopy};
use crate::backend::cuda::{CudaDevice, CudaError, DeviceKvCache};

use crate::attention::{ScoreBound, log2_query_scale};
use crate::backend::cuda::storage::{Device, DeviceNorm};
use crate::model::block::TransformerBlock;
use crate::model::ops::norm::LayerNorm;
use crate::model::spec::HEAD_DIM;

/// How the MLP's GELU is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeluMode {
    /// Fused into the fc1 GEMM's epilogue (cuBLASLt's tanh form): one pass fewer.
    Fused,
    /// The exact erf form of the reference, as a separate kernel after the GEMM.
    Exact,
}

/// Scratch shared by every block of a session (`n` tokens at most).
#[derive(Debug, Clone, Copy)]
pub struct BlockScratch {
    pub normed: DevPtr<bf16>,
    pub qkv: DevPtr<bf16>,
    pub q: DevPtr<bf16>,
    /// K and V: per frame `[K: tokens][V: tokens]` (frame-local attention reads it as pages of
    /// one frame each); for a cache layer, K is the first `n` rows and V the next `n`.
    pub kv: DevPtr<bf16>,
    pub attn: DevPtr<bf16>,
    pub out: DevPtr<bf16>,
    pub hidden: DevPtr<bf16>,
    pub ws: RawWorkspace,
}

impl BlockScratch {
    pub fn plan(plan: &mut ArenaPlan, tokens: usize, dim: usize, hidden: usize, heads: usize) {
        plan.add::<bf16>(tokens * dim); // normed
        plan.add::<bf16>(tokens * 3 * dim);
        plan.add::<bf16>(tokens * dim); // q
        plan.add::<bf16>(2 * tokens * dim);
        plan.add::<bf16>(tokens * dim); // attn
        plan.add::<bf16>(tokens * dim); // out
        plan.add::<bf16>(tokens * hidden);
        let (o, l, t) = RawWorkspace::elems(tokens, heads, MAX_SPLITS);
        plan.add::<f32>(o);
        plan.add::<f32>(l);
        plan.add::<u32>(t);
    }

    pub fn carve(
        arena: &mut crate::backend::cuda::arena::Arena,
        tokens: usize,
        dim: usize,
        hidden: usize,
        heads: usize,
    ) -> Result<Self, CudaError> {
        let (o, l, t) = RawWorkspace::elems(tokens, heads, MAX_SPLITS);
        Ok(Self {
            normed: arena.alloc(tokens * dim)?,
            qkv: arena.alloc(tokens * 3 * dim)?,
            q: arena.alloc(tokens * dim)?,
            kv: arena.alloc(2 * tokens * dim)?,
            attn: arena.alloc(tokens * dim)?,
            out: arena.alloc(tokens * dim)?,
            hidden: arena.alloc(tokens * hidden)?,
            ws: RawWorkspace {
                part_o: arena.alloc(o)?,
                part_lse: arena.alloc(l)?,
                tickets: arena.alloc(t)?,
            },
        })
    }
}

/// Most key splits any attention call of the model uses (the workspace is sized for it). Eight,
/// for frames just past a whole number of 256-row query tiles: at 518×392 (any 4:3 input) a
/// frame is 1042 tokens, five tiles of which the last holds 18 rows; that lone tile takes up to
/// [`MAX_TAIL_SPLITS`] key splits of its own (16 heads: eight splits, one wave of 128 CTAs after
/// the full tiles' two).
pub const MAX_SPLITS: usize = 8;
const _: () = assert!(
    MAX_TAIL_SPLITS <= MAX_SPLITS,
    "the workspace holds a lone tile's splits"
);

/// Words per frame of the frame-local attention tables (read [`Attend::WithinFrames`]).
pub const LOCAL_TABLE_WORDS: usize = 5;

/// The frame-local attention tables of `frames` frames of `tokens` tokens.
pub fn local_tables(frames: usize, tokens: usize) -> Vec<u32> {
    (0..frames)
        .flat_map(|f| [1, 0, f as u32, 0, tokens as u32])
        .collect()
}

/// What a block's attention looks at.
pub enum Attend<'a> {
    /// Each frame's tokens attend to their own frame (DINO, frame blocks). `tables` holds one
    /// `[1, 0, f, 0, tokens]` record per frame ([`LOCAL_TABLE_WORDS`]): read from word 0 it is
    /// a one-page table (n_pages 1, page f, cum 0..tokens), read from word 1 with the run count
    /// at word 0 it is the one write run [src 0, page f, slot 0, tokens], so the q/k/v split
    /// writes each frame's K/V into the scratch as page f of `tokens` slots, in the pool layout.
    WithinFrames {
        frames: usize,
        tokens: usize,
        tables: DevPtr<u32>,
        rope: Rope<'a>,
    },
    /// The call's tokens are written into cache layer `layer`, then attend to everything the
    /// step's page table shows: with `views` 1 all of them to its one view; with 2 (a two-frame
    /// step) each frame's `n / 2` queries to its own view.
    Cache {
        cache: &'a DeviceKvCache,
        layer: usize,
        views: usize,
        rope: Rope<'a>,
        /// The dense baseline: the visible keys are first concatenated into this buffer.
        dense: Option<DenseScratch>,
        /// The layer's softmax (a fixed offset where its scores are bounded) and its queries.
        attention: &'a CacheAttention,
    },
}

/// Where the dense baseline concatenates a layer's visible keys.
#[derive(Debug, Clone, Copy)]
pub struct DenseScratch {
    pub kv: DevPtr<bf16>,
    pub capacity: usize,
    pub table: DevPtr<u32>,
}

/// How attention runs in a session.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSetup {
    pub kernel: AttentionKernel,
    pub sm_count: usize,
}

impl AttentionSetup {
    /// Key splits for `lq` queries, as the bench chooses them (`choose_splits`): one for the
    /// 128-row warp-specialised kernels at 1005 queries x 16 heads (128 CTAs already fill 132
    /// SMs), two for the 256-row one (64 CTAs a split) and for mma.sync (two CTAs per SM). The
    /// key count is not known when a graph is captured (it lives on the device), so it does not
    /// bound the choice; `MAX_SPLITS` does (the workspace's size).
    fn splits(&self, lq: usize, heads: usize) -> usize {
        self.splits_for_tiles(self.kernel.split_tiles(lq), heads)
    }

    /// As [`Self::splits`] for `q_tiles` query tiles (of all views of a launch).
    fn splits_for_tiles(&self, q_tiles: usize, heads: usize) -> usize {
        choose_splits(
            q_tiles,
            heads,
            usize::MAX,
            self.sm_count,
            self.kernel.ctas_per_sm(),
        )
        .clamp(1, MAX_SPLITS)
    }
}

/// How a block's attention over the cache runs: its softmax, and, where that softmax takes
/// log2-domain queries, the q-norm's parameters multiplied by `log2(e)/√d` (the q/k/v split then
/// writes queries whose product with a key is the score in the log2 domain: one rounding to
/// bf16, as before, and nothing left for the kernel to multiply).
pub struct CacheAttention {
    pub softmax: Softmax,
    log2_q_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
}

impl CacheAttention {
    /// The running maximum, the block's own q-norm.
    pub fn running_max() -> Self {
        Self {
            softmax: Softmax::RunningMax,
            log2_q_norm: None,
        }
    }

    /// For block `w` attending with `kernel`: a fixed offset where its qk-norm bounds the scores
    /// ([`ScoreBound`]) and the kernel takes one (log2-domain queries where it is the bounded
    /// kernel), else the running maximum. Reads the norms back from the device and uploads the
    /// scaled ones (syncs: for session setup, not for a step).
    pub fn for_block(
        dev: &CudaDevice,
        w: &TransformerBlock<Device>,
        kernel: AttentionKernel,
    ) -> Result<Self, CudaError> {
        let Some((qn, kn)) = &w.qk_norm else {
            return Ok(Self::running_max());
        };
        let host = |n: &DeviceNorm| -> Result<LayerNorm, CudaError> {
            Ok(LayerNorm {
                weight: n
                    .weight
                    .as_ref()
                    .map(|v| dev.stream.clone_dtoh(v))
                    .transpose()?,
                bias: n
                    .bias
                    .as_ref()
                    .map(|v| dev.stream.clone_dtoh(v))
                    .transpose()?,
                dim: n.dim,
                eps: n.eps,
            })
        };
        let q_host = host(qn)?;
        let softmax = ScoreBound::from_qk_norms(&q_host, &host(kn)?).softmax();
        if kernel != AttentionKernel::WgmmaWsM256Bounded
            || !matches!(softmax, Softmax::FixedOffset(_))
        {
            return Ok(Self {
                softmax,
                log2_q_norm: None,
            });
        }
        let c = log2_query_scale(w.head_dim);
        let scaled = |v: Option<Vec<f32>>, default: f32| -> Result<CudaSlice<f32>, CudaError> {
            let v: Vec<f32> = v
                .unwrap_or_else(|| vec![default; q_host.dim])
                .iter()
                .map(|x| x * c)
                .collect();
            Ok(dev.stream.clone_htod(&v)?)
        };
        Ok(Self {
            softmax: softmax.for_log2_queries(),
            log2_q_norm: Some((
                scaled(q_host.weight.clone(), 1.0)?,
                scaled(q_host.bias.clone(), 0.0)?,
            )),
        })
    }
}

/// How a block meets its neighbours in a chain of blocks over the same `x` and scratch: every
/// residual is fused with the LayerNorm that follows it, across block boundaries too.
#[derive(Clone, Copy, Default)]
pub struct Chain<'a> {
    /// `s.normed` already holds this block's `LN1(x)`: the previous block wrote it.
    pub normed_in: bool,
    /// The next block's first norm, fused into this block's last residual (its output lands in
    /// `s.normed`); `None` for the last block of a chain.
    pub next_norm1: Option<&'a DeviceNorm>,
    /// Where `x` after this block also goes (a tap of the depth head), written by the kernel of
    /// the block's last residual.
    pub copy_out: Option<RowCopy>,
}

impl<'a> Chain<'a> {
    /// The links of block `i` of `blocks` (each yields its first norm).
    pub fn link<T>(blocks: &'a [T], i: usize, norm1: impl Fn(&'a T) -> &'a DeviceNorm) -> Self {
        Self {
            normed_in: i > 0,
            next_norm1: blocks.get(i + 1).map(norm1),
            copy_out: None,
        }
    }
}

/// Runs block `w` on `x` (`[n][C]` f32, updated in place).
#[allow(clippy::too_many_arguments)]
pub fn block_forward(
    dev: &CudaDevice,
    gemm: &mut Gemm,
    w: &TransformerBlock<Device>,
    x: DevPtr<f32>,
    n: usize,
    s: &BlockScratch,
    attend: Attend<'_>,
    setup: AttentionSetup,
    gelu: GeluMode,
    chain: Chain<'_>,
) -> Result<(), CudaError> {
    let c = w.dim;
    let heads = w.heads;
    let residual_then =
        |dev: &CudaDevice, gamma: &CudaSlice<f32>, norm: &DeviceNorm, copy: Option<RowCopy>| {
            ops::residual_layer_norm(
                dev,
                x,
                s.out,
                DevPtr::of(gamma),
                n,
                c,
                norm.weight_ptr(),
                norm.bias_ptr(),
                norm.eps,
                s.normed,
                copy,
            )
        };
    if !chain.normed_in {
        let norm = &w.norm1;
        ops::layer_norm(
            dev,
            x,
            n,
            c,
            norm.weight_ptr(),
            norm.bias_ptr(),
            norm.eps,
            LnOut::Bf16(s.normed),
        )?;
    }
    gemm.linear(
        dev,
        s.normed,
        w.qkv.weight_ptr(),
        w.qkv.bias_ptr(),
        s.qkv,
        n,
        3 * c,
        c,
        Epilogue::Bias,
    )?;
    // Queries in the log2 domain take the q-norm's scaled parameters.
    let log2_q_norm = match &attend {
        Attend::Cache { attention, .. } => attention.log2_q_norm.as_ref(),
        Attend::WithinFrames { .. } => None,
    };
    let norm = match &w.qk_norm {
        Some((qn, kn)) => {
            let missing = || CudaError::Invalid("qk-norm without affine parameters".into());
            let (q_weight, q_bias) = match log2_q_norm {
                Some((weight, bias)) => (DevPtr::of(weight), DevPtr::of(bias)),
                None => (
                    qn.weight_ptr().ok_or_else(missing)?,
                    qn.bias_ptr().ok_or_else(missing)?,
                ),
            };
            Some(QkNorm {
                q_weight,
                q_bias,
                k_weight: kn.weight_ptr().ok_or_else(missing)?,
                k_bias: kn.bias_ptr().ok_or_else(missing)?,
                eps: qn.eps,
            })
        }
        None => None,
    };
    match attend {
        Attend::WithinFrames {
            frames,
            tokens,
            tables,
            rope,
        } => {
            let row = c;
            // DINO's q/k/v need no norm and no rotation: on Hopper the frame-local kernel reads
            // them from the GEMM's output as they are, without the split kernel.
            let from_qkv = norm.is_none()
                && matches!(rope, Rope::None)
                && setup.kernel == AttentionKernel::WgmmaWs
                && has_frame_attention_from_qkv(dev);
            if from_qkv {
                for f in 0..frames {
                    let table = tables.slice(LOCAL_TABLE_WORDS * f, LOCAL_TABLE_WORDS)?;
                    frame_attention_from_qkv(
                        dev,
                        s.qkv,
                        f,
                        s.attn.slice(f * tokens * row, tokens * row)?,
                        table.slice(2, 1)?,
                        table.slice(3, 2)?,
                        table.slice(0, 1)?,
                        tokens,
                        heads,
                    )?;
                }
            } else {
                s.kv.check_len(2 * frames * tokens * row, "frame-local K/V scratch")?;
                for f in 0..frames {
                    let rows = f * tokens * row;
                    let table = tables.slice(LOCAL_TABLE_WORDS * f, LOCAL_TABLE_WORDS)?;
                    ops::qkv_split_norm_rope_to_pages(
                        dev,
                        s.qkv.slice(3 * rows, 3 * tokens * row)?,
                        s.q.slice(rows, tokens * row)?,
                        PagedKvDest {
                            pool: s.kv.addr(),
                            runs: table.slice(1, 4)?.addr(),
                            n_runs: table.slice(0, 1)?.addr(),
                            page_size: tokens as u32,
                        },
                        tokens,
                        heads,
                        norm,
                        rope,
                    )?;
                    let kv = RawPagedKv {
                        pool: s.kv,
                        page_size: tokens as u32,
                        indices: table.slice(2, 1)?,
                        cum: table.slice(3, 2)?,
                        n_pages: table.slice(0, 1)?,
                    };
                    paged_attention_raw(
                        dev,
                        setup.kernel,
                        Softmax::RunningMax,
                        s.q.slice(rows, tokens * row)?,
                        s.attn.slice(rows, tokens * row)?,
                        &kv,
                        tokens,
                        heads,
                        // Never split: the keys are one frame's, and past a whole wave (1042
                        // tokens are nine 128-row tiles, 144 CTAs) four splits of two or three
                        // key tiles each cost the frame blocks 0.4 ms more than a second wave
                        // (H200, docs/gpu-model.md "Past 1024 tokens"); DINO's kernel has none.
                        1,
                        s.ws,
                    )?;
                }
            }
        }
        Attend::Cache {
            cache,
            layer,
            views,
            rope,
            dense,
            attention,
        } => {
            let softmax = attention.softmax;
            let dest = cache.page_writer(layer, n)?;
            ops::qkv_split_norm_rope_to_pages(dev, s.qkv, s.q, dest, n, heads, norm, rope)?;
            if views == 0 || !n.is_multiple_of(views) || (views > 1 && dense.is_some()) {
                return Err(CudaError::Invalid(format!(
                    "{n} queries in {views} attention views (the dense baseline takes one)"
                )));
            }
            // Each view's queries are a whole frame's rows. The warp-specialised kernels take
            // the views in one launch (2 x 4 query tiles of 256 rows fill the GPU without key
            // splits, so nothing is merged); the portable one runs them one after the other on
            // the same split workspace (a launch leaves its merge tickets at zero).
            let rows = n / views;
            let row = heads * HEAD_DIM;
            if views > 1 && dense.is_none() && setup.kernel.warp_specialised() {
                let kv = cache.raw_keys_view(layer, 0)?;
                let key_views = KeyViews {
                    count: views,
                    stride: cache.view_stride(),
                };
                let q_tiles = views * setup.kernel.split_tiles(rows);
                paged_attention_views_raw(
                    dev,
                    setup.kernel,
                    softmax,
                    s.q,
                    s.attn,
                    &kv,
                    key_views,
                    rows,
                    heads,
                    setup.splits_for_tiles(q_tiles, heads),
                    s.ws,
                )?;
            } else {
                for view in 0..views {
                    let kv = match dense {
                        Some(d) => cache.gather_dense_raw(dev, layer, d.kv, d.capacity, d.table)?,
                        None => cache.raw_keys_view(layer, view)?,
                    };
                    paged_attention_raw(
                        dev,
                        setup.kernel,
                        softmax,
                        s.q.slice(view * rows * row, rows * row)?,
                        s.attn.slice(view * rows * row, rows * row)?,
                        &kv,
                        rows,
                        heads,
                        setup.splits(rows, heads),
                        s.ws,
                    )?;
                }
            }
        }
    }
    gemm.linear(
        dev,
        s.attn,
        w.proj.weight_ptr(),
        w.proj.bias_ptr(),
        s.out,
        n,
        c,
        c,
        Epilogue::Bias,
    )?;
    residual_then(dev, &w.ls1, &w.norm2, None)?;
    let hidden = w.hidden();
    match (gelu, w.fc1.bias_ptr()) {
        (GeluMode::Fused, bias @ Some(_)) => gemm.linear(
            dev,
            s.normed,
            w.fc1.weight_ptr(),
            bias,
            s.hidden,
            n,
            hidden,
            c,
            Epilogue::BiasGelu,
        )?,
        (_, bias) => {
            gemm.linear(
                dev,
                s.normed,
                w.fc1.weight_ptr(),
                None,
                s.hidden,
                n,
                hidden,
                c,
                Epilogue::None,
            )?;
            match bias {
                Some(b) => ops::add_bias_gelu_erf(dev, s.hidden, b, n, hidden)?,
                None => ops::gelu_erf_inplace(dev, s.hidden, n * hidden)?,
            }
        }
    }
    gemm.linear(
        dev,
        s.hidden,
        w.fc2.weight_ptr(),
        w.fc2.bias_ptr(),
        s.out,
        n,
        c,
        hidden,
        Epilogue::Bias,
    )?;
    match chain.next_norm1 {
        Some(next) => residual_then(dev, &w.ls2, next, chain.copy_out)?,
        None => {
            ops::residual_add_scaled(dev, x, s.out, DevPtr::of(&w.ls2), n, c)?;
            if let Some(copy) = chain.copy_out {
                ops::copy_rows(dev, x, c, copy.dst, copy.stride, n, c)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splits(kernel: AttentionKernel, lq: usize, heads: usize) -> usize {
        AttentionSetup {
            kernel,
            sm_count: 132,
        }
        .splits(lq, heads)
    }

    #[test]
    fn splits_fill_the_h200_as_the_bench_measured_best() {
        // One steady-state frame: 1005 queries x 16 heads on 132 SMs.
        assert_eq!(splits(AttentionKernel::WgmmaWsN192, 1005, 16), 1);
        assert_eq!(splits(AttentionKernel::WgmmaWs, 1005, 16), 1);
        // 256-row tiles: 1005 queries x 16 heads are 64 CTAs, two splits 128.
        assert_eq!(splits(AttentionKernel::WgmmaWsM256, 1005, 16), 2);
        // Two CTAs per SM: 128 CTAs fill 264 slots twice with 2 splits.
        assert_eq!(splits(AttentionKernel::MmaSync, 1005, 16), 2);
        // Phase 1 (8 frames of 1005 tokens): many waves already, no split.
        assert_eq!(splits(AttentionKernel::WgmmaWsN192, 8040, 16), 1);
        // The tiny fixtures (2 heads, a few hundred queries): capped by the workspace.
        assert_eq!(splits(AttentionKernel::WgmmaWsN192, 300, 2), MAX_SPLITS);
        // 518x392 (1042 tokens): four full 256-row tiles, 64 CTAs a split: two splits, one wave
        // (the lone fifth tile of 18 rows takes its own, attention::tail_splits).
        assert_eq!(splits(AttentionKernel::WgmmaWsM256, 1042, 16), 2);
    }
}
