//! The attention kernels, each named once: its variant, its name on the command line and in the
//! bench, its CUDA entry point and the kernel file (stem in `kernels/`) that defines it. The enum,
//! [`AttentionKernel::ALL`], the entry points the registry loads for the attention sources and
//! the bench's name parsing all come from this table. It imports nothing, so the registry can read
//! it without depending on the launchers in the parent module.

macro_rules! attention_kernels {
    ($(
        $(#[$doc:meta])*
        $variant:ident: name $name:literal, entry $entry:literal, source $source:literal;
    )+) => {
        /// Which implementation of the attention kernel runs.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub enum AttentionKernel {
            $($(#[$doc])* $variant,)+
        }

        impl AttentionKernel {
            /// Every kernel, in table order (the portable one first).
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// Its name on the command line (`--kernel`) and in the bench.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }

            /// Its CUDA entry point.
            pub fn entry(self) -> &'static str {
                match self {
                    $(Self::$variant => $entry,)+
                }
            }

            /// The file stem in `kernels/` of the source that defines the entry point.
            pub fn source(self) -> &'static str {
                match self {
                    $(Self::$variant => $source,)+
                }
            }
        }
    };
}

attention_kernels! {
    /// FlashAttention-2 style on mma.sync (m16n8k16): any NVIDIA GPU from sm_80, and the fallback
    /// where the wgmma kernels are not loaded.
    MmaSync: name "mma", entry "paged_attention_fwd", source "paged_attention";
    /// Warp-specialised wgmma (sm_90a only, FlashAttention-3 style): a producer warpgroup gathers
    /// 128-key tiles into a six-stage mbarrier ring, two consumer warpgroups take turns on the
    /// tensor cores (ping-pong); one CTA of 384 threads per SM. Frame-local attention's default.
    WgmmaWs: name "ws", entry "paged_attention_fwd_sm90_ws", source "paged_attention_sm90_ws";
    /// [`Self::WgmmaWs`] with 192-key tiles (four stages), `setmaxnreg` (producer 40 registers,
    /// consumers 232) and a 1-tile copy lag.
    WgmmaWsN192: name "ws-n192", entry "paged_attention_fwd_sm90_ws_n192", source "paged_attention_sm90_ws";
    /// Four consumer warpgroups (256 query rows a CTA, 640 threads, `setmaxnreg` 32/112) over
    /// 64-key tiles in twelve stages: more warps per SM sub-partition to hide the softmax's
    /// latency; 1005 queries are four query tiles, so two key splits fill the GPU. Global
    /// attention's default.
    WgmmaWsM256: name "ws-m256", entry "paged_attention_fwd_sm90_ws_m256", source "paged_attention_sm90_ws";
    /// [`Self::WgmmaWsM256`] with one softmax offset for all scores instead of a running
    /// maximum (no maxima, no rescale of the output), for scores the caller has bounded
    /// ([`crate::attention::ScoreBound`]): the global attention's qk-normed q and k. A launch
    /// without a fixed offset runs [`Self::WgmmaWsM256`]. Global attention's default.
    WgmmaWsM256Bounded: name "ws-m256-bounded", entry "paged_attention_fwd_sm90_ws_m256_fixed", source "paged_attention_sm90_ws";
}

impl AttentionKernel {
    /// The kernel called `name` on the command line, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The entry points that kernel file `source` defines, in table order.
    pub fn entries_in(source: &str) -> impl Iterator<Item = &'static str> + '_ {
        Self::ALL
            .iter()
            .filter(move |k| k.source() == source)
            .map(|k| k.entry())
    }
}
