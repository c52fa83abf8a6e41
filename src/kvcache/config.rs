//! What a KV cache is sized for and which residency rules it follows.

use serde::{Deserialize, Serialize};

use super::CacheError;

/// Element type of the K/V pages in memory. Attention always accumulates in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageDtype {
    F32,
    Bf16,
}

impl StorageDtype {
    pub fn bytes(self) -> usize {
        match self {
            StorageDtype::F32 => 4,
            StorageDtype::Bf16 => 2,
        }
    }
}

impl std::str::FromStr for StorageDtype {
    type Err = CacheError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(StorageDtype::F32),
            "bf16" | "bfloat16" => Ok(StorageDtype::Bf16),
            _ => Err(CacheError::InvalidConfig {
                field: "dtype",
                value: s.to_string(),
                expected: "f32 or bf16",
            }),
        }
    }
}

/// What happens when the special-token pool (the trajectory memory) reaches its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecialPoolFull {
    /// The keyframe step that would overflow fails with `CacheError::SpecialPoolFull`; the cache
    /// is left exactly as it was, so the caller can reset or stop cleanly.
    Error,
    /// The oldest special page is forgotten (its `page_size` tokens, the oldest trajectory
    /// memory) and reused. Attention keeps working forever at a bounded cost.
    DropOldest,
}

/// A `SpecialPoolFull` spelled other than `error` or `drop-oldest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}`: expected error or drop-oldest")]
pub struct UnknownPoolPolicy(pub String);

impl std::str::FromStr for SpecialPoolFull {
    type Err = UnknownPoolPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "error" => Ok(SpecialPoolFull::Error),
            "drop-oldest" => Ok(SpecialPoolFull::DropOldest),
            other => Err(UnknownPoolPolicy(other.to_owned())),
        }
    }
}

/// How the special-token pool grows: it starts empty and grows in chunks up to a cap, so a short
/// session does not pay for the memory a 10,000-frame one needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialPoolConfig {
    /// Committed frames whose special tokens the pool can hold before `on_full` applies.
    pub max_frames: u64,
    /// Host storage grows by this many frames' worth of special tokens at a time (at least one
    /// page), so growth is rare and never over-allocates by more than a chunk.
    pub grow_frames: u64,
    pub on_full: SpecialPoolFull,
}

impl Default for SpecialPoolConfig {
    fn default() -> Self {
        Self {
            max_frames: 16_384,
            grow_frames: 256,
            on_full: SpecialPoolFull::Error,
        }
    }
}

/// Geometry and residency rules of one model's global-attention KV cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheConfig {
    /// Global-attention layers sharing the one page plan.
    pub layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Patch tokens of one frame (`(H/14)·(W/14)`, 999 at 518×378).
    pub patches_per_frame: usize,
    /// Special tokens of one frame (camera, 4 registers, scale), packed into their own pages.
    pub special_tokens: usize,
    /// Frames kept forever as the anchor context (the first committed frames).
    pub scale_frames: usize,
    /// Most recent keyframes kept in full after the scale frames.
    pub sliding_window: usize,
    /// Tokens per page. `None`: exactly `patches_per_frame` (one page per frame, nothing padded).
    /// `Some(q)`: padded pages; a frame's patches take `ceil(Np/q)` pages and the unused slots are
    /// masked out of attention (never attended as zeros).
    pub page_size: Option<usize>,
    pub dtype: StorageDtype,
    pub special_pool: SpecialPoolConfig,
}

/// The largest layer count, head count and head size a cache accepts (real models: ≤ 128).
const MAX_MODEL_DIM: usize = 4096;
/// The largest tokens per frame or per page a cache accepts (518×378 is 999).
const MAX_TOKENS: usize = 1 << 20;

impl CacheConfig {
    /// A cache with the model's defaults: 6 special tokens per frame, exact pages, f32 storage.
    pub fn new(
        layers: usize,
        heads: usize,
        head_dim: usize,
        patches_per_frame: usize,
        scale_frames: usize,
        sliding_window: usize,
    ) -> Self {
        Self {
            layers,
            heads,
            head_dim,
            patches_per_frame,
            special_tokens: 6,
            scale_frames,
            sliding_window,
            page_size: None,
            dtype: StorageDtype::F32,
            special_pool: SpecialPoolConfig::default(),
        }
    }

    /// Tokens per frame as the model sees them (special + patch).
    pub fn tokens_per_frame(&self) -> usize {
        self.special_tokens + self.patches_per_frame
    }

    /// The page size in effect.
    pub fn resolved_page_size(&self) -> usize {
        self.page_size.unwrap_or(self.patches_per_frame)
    }

    /// Pages one frame's patch tokens occupy.
    pub fn pages_per_frame(&self) -> usize {
        self.patches_per_frame.div_ceil(self.resolved_page_size())
    }

    /// Elements of one K (or V) page: `page_size · heads · head_dim`.
    pub fn page_elems(&self) -> usize {
        self.resolved_page_size() * self.heads * self.head_dim
    }

    /// Bytes of one page id across all layers, K and V.
    pub fn page_bytes_all_layers(&self) -> u64 {
        2 * self.layers as u64 * self.page_elems() as u64 * self.dtype.bytes() as u64
    }

    /// Refuses what the cache cannot hold, naming the field; after it every size product fits.
    pub fn validate(&self) -> Result<(), CacheError> {
        let positive = [
            ("layers", self.layers),
            ("heads", self.heads),
            ("head_dim", self.head_dim),
            ("patches_per_frame", self.patches_per_frame),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(CacheError::InvalidConfig {
                    field,
                    value: value.to_string(),
                    expected: "a positive number",
                });
            }
        }
        // Each size bounded, so every product of them (a page's bytes over all layers) fits
        // in 64 bits: sizes come from flags and files.
        let bounded = [
            ("layers", self.layers, MAX_MODEL_DIM, "at most 4096"),
            ("heads", self.heads, MAX_MODEL_DIM, "at most 4096"),
            ("head_dim", self.head_dim, MAX_MODEL_DIM, "at most 4096"),
            (
                "patches_per_frame",
                self.patches_per_frame,
                MAX_TOKENS,
                "at most 1048576 tokens",
            ),
            (
                "page_size",
                self.page_size.unwrap_or(1),
                MAX_TOKENS,
                "at most 1048576 tokens",
            ),
        ];
        for (field, value, max, expected) in bounded {
            if value > max {
                return Err(CacheError::InvalidConfig {
                    field,
                    value: value.to_string(),
                    expected,
                });
            }
        }
        if self.page_size == Some(0) {
            return Err(CacheError::InvalidConfig {
                field: "page_size",
                value: "0".into(),
                expected: "a positive number of tokens",
            });
        }
        let special = [
            ("special_pool.max_frames", self.special_pool.max_frames),
            ("special_pool.grow_frames", self.special_pool.grow_frames),
        ];
        for (field, value) in special {
            if value == 0 {
                return Err(CacheError::InvalidConfig {
                    field,
                    value: "0".into(),
                    expected: "a positive number of frames",
                });
            }
        }
        // Page ids are u32 on the device; keep every count well inside it. The patch pool
        // (scale frames + window) is named when it alone is too large, else the special cap.
        let limit = u32::MAX as u64 / 2;
        let scale_pages = self.scale_frames.saturating_mul(self.pages_per_frame());
        if scale_pages as u64 > limit {
            return Err(CacheError::InvalidConfig {
                field: "scale_frames",
                value: self.scale_frames.to_string(),
                expected: "scale frames whose pages fit in 31 bits",
            });
        }
        if self.patch_pool_pages() as u64 > limit {
            return Err(CacheError::InvalidConfig {
                field: "sliding_window",
                value: self.sliding_window.to_string(),
                expected: "a window whose pages fit in 31 bits",
            });
        }
        if self.max_pages_u64() > limit {
            return Err(CacheError::InvalidConfig {
                field: "special_pool.max_frames",
                value: self.special_pool.max_frames.to_string(),
                expected: "a cap whose page count fits in 31 bits",
            });
        }
        Ok(())
    }

    /// Patch pages: scale frames, the window, and one more frame that is appended before the
    /// oldest window frame is evicted (or that a non-keyframe borrows).
    pub fn patch_pool_pages(&self) -> usize {
        // Saturating: the sizes come from flags and files, and validate() refuses the huge.
        self.scale_frames
            .saturating_add(self.sliding_window)
            .saturating_add(1)
            .saturating_mul(self.pages_per_frame())
    }

    /// Special pages the committed trajectory memory may use.
    pub fn special_cap_pages(&self) -> usize {
        let tokens = self
            .special_pool
            .max_frames
            .saturating_mul(self.special_tokens as u64);
        tokens.div_ceil(self.resolved_page_size() as u64) as usize
    }

    /// Pages a non-keyframe may borrow beyond the cap for its own special tokens.
    pub fn special_reserve_pages(&self) -> usize {
        if self.special_tokens == 0 {
            0
        } else {
            self.special_tokens.div_ceil(self.resolved_page_size()) + 1
        }
    }

    fn max_pages_u64(&self) -> u64 {
        (self.patch_pool_pages() as u64)
            .saturating_add(self.special_cap_pages() as u64)
            .saturating_add(self.special_reserve_pages() as u64)
    }

    /// Pages host storage grows by at a time.
    pub fn growth_pages(&self) -> usize {
        let tokens = self
            .special_pool
            .grow_frames
            .saturating_mul(self.special_tokens as u64);
        (tokens.div_ceil(self.resolved_page_size() as u64) as usize).max(1)
    }

    /// Every page id is below this: the size of a pool allocated once (the GPU's static plan).
    pub fn max_pages(&self) -> usize {
        self.max_pages_u64() as usize
    }
}
