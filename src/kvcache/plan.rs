//! The per-step outputs of the bookkeeping: where the step's tokens are written and what
//! attention sees. Both are shared by every layer and by every backend.

use serde::Serialize;

/// A run of consecutive tokens of the step's K/V (`[S·P][heads][head_dim]`, frame-major) that
/// lands in consecutive slots of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TokenRun {
    pub src_token: u32,
    pub page: u32,
    pub slot: u32,
    pub len: u32,
}

/// The pages attention reads, in order: scale frames, window frames (oldest to newest), then the
/// special pages. In the CSR form a paged kernel takes (one request: `indptr = [0, n]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PagePlan {
    pub page_size: u32,
    pub indices: Vec<u32>,
    pub indptr: Vec<u32>,
    pub last_page_len: u32,
    /// Valid tokens of each visible page. In exact mode every page but the last is full; in the
    /// padded mode patch pages end in padding, which a kernel must mask with these lengths.
    pub page_lens: Vec<u32>,
}

impl PagePlan {
    /// Tokens attention reads (padding excluded).
    pub fn kv_tokens(&self) -> u64 {
        self.page_lens.iter().map(|&n| n as u64).sum()
    }

    /// True when only the last page may be partial, so `last_page_len` alone describes the plan.
    pub fn only_last_partial(&self) -> bool {
        let n = self.page_lens.len();
        n == 0 || self.page_lens[..n - 1].iter().all(|&l| l == self.page_size)
    }
}

/// Everything one frame step needs: the token writes and the attention plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StepPlan {
    /// The stream frame indices of this step.
    pub first_frame: u64,
    pub frames: u64,
    pub keyframe: bool,
    pub writes: Vec<TokenRun>,
    pub plan: PagePlan,
    /// Frames whose patch tokens the plan covers, in attention order.
    pub visible_frames: Vec<u64>,
    /// Special tokens the plan covers (committed frames and this step's).
    pub special_tokens_visible: u64,
    /// Frames whose patch pages this step evicted (oldest first).
    pub evicted_frames: Vec<u64>,
}
