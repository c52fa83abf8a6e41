//! The online-softmax core shared by the paged and dense CPU paths: a block of queries of one
//! head absorbs K/V tiles one at a time. Both matrix products go through `gemm`, which picks the
//! widest SIMD the CPU has at run time.

/// Keys per tile: large enough for `gemm` to run at speed, small enough to stay in cache.
pub(crate) const KV_TILE: usize = 256;

/// Running max, sum and weighted values of one head for a block of queries.
pub(crate) struct OnlineSoftmax {
    nq: usize,
    d: usize,
    q: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
    scores: Vec<f32>,
}

impl OnlineSoftmax {
    pub(crate) fn new(nq: usize, d: usize) -> Self {
        Self {
            nq,
            d,
            q: vec![0.0; nq * d],
            max: vec![f32::NEG_INFINITY; nq],
            sum: vec![0.0; nq],
            acc: vec![0.0; nq * d],
            scores: vec![0.0; nq * KV_TILE],
        }
    }

    /// Loads head `h` of the block's queries (`[nq][heads][d]`), pre-scaled, and clears the
    /// running state.
    pub(crate) fn start(&mut self, q_block: &[f32], h: usize, heads: usize, scale: f32) {
        let d = self.d;
        for i in 0..self.nq {
            let src = &q_block[(i * heads + h) * d..][..d];
            for (dst, &x) in self.q[i * d..][..d].iter_mut().zip(src) {
                *dst = x * scale;
            }
        }
        self.max.fill(f32::NEG_INFINITY);
        self.sum.fill(0.0);
        self.acc.fill(0.0);
    }

    /// Absorbs `n ≤ KV_TILE` keys and values, each `[n][d]` contiguous f32.
    pub(crate) fn absorb(&mut self, k: &[f32], v: &[f32], n: usize) {
        let (nq, d) = (self.nq, self.d);
        assert!(n <= KV_TILE && k.len() >= n * d && v.len() >= n * d);
        let scores = &mut self.scores[..nq * n];
        // SAFETY: every pointer/stride pair addresses memory inside the slices checked above:
        // scores is nq×n row-major, q is nq×d row-major, k is n×d row-major read as its transpose.
        unsafe {
            gemm::gemm(
                nq,
                n,
                d,
                scores.as_mut_ptr(),
                1,
                n as isize,
                false,
                self.q.as_ptr(),
                1,
                d as isize,
                k.as_ptr(),
                d as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        for i in 0..nq {
            let row = &mut scores[i * n..][..n];
            let tile_max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            let new_max = self.max[i].max(tile_max);
            // exp(-inf) = 0 clears the empty initial state without a branch on the first tile.
            let correction = (self.max[i] - new_max).exp();
            self.max[i] = new_max;
            let mut tile_sum = 0.0;
            for s in row.iter_mut() {
                *s = (*s - new_max).exp();
                tile_sum += *s;
            }
            self.sum[i] = self.sum[i] * correction + tile_sum;
            for a in &mut self.acc[i * d..][..d] {
                *a *= correction;
            }
        }
        // SAFETY: acc is nq×d, scores nq×n, v n×d, all row-major and in bounds (checked above).
        unsafe {
            gemm::gemm(
                nq,
                d,
                n,
                self.acc.as_mut_ptr(),
                1,
                d as isize,
                true,
                scores.as_ptr(),
                1,
                n as isize,
                v.as_ptr(),
                1,
                d as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }

    /// Writes `acc / sum` into head `h` of the output block (`[nq][heads][d]`).
    pub(crate) fn finish_into(&self, out_block: &mut [f32], h: usize, heads: usize) {
        let d = self.d;
        for i in 0..self.nq {
            let inv = 1.0 / self.sum[i];
            let dst = &mut out_block[(i * heads + h) * d..][..d];
            for (o, &a) in dst.iter_mut().zip(&self.acc[i * d..][..d]) {
                *o = a * inv;
            }
        }
    }
}
