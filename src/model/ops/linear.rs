//! Dense layers over the `gemm` crate (multithreaded through rayon).

use gemm::Parallelism;

/// Parallelism for one large product: rayon with every thread of the pool.
pub fn gemm_parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    // Small products cost more to split than to run.
    if m.saturating_mul(n).saturating_mul(k) < 64 * 64 * 64 {
        Parallelism::None
    } else {
        Parallelism::Rayon(rayon::current_num_threads())
    }
}

/// A linear layer with the PyTorch weight layout `[out][in]`, its weight and bias of types `M`
/// and `B` (f32 vectors on the CPU; see [`crate::model::storage`]).
#[derive(Clone, Debug)]
pub struct Linear<M = Vec<f32>, B = M> {
    pub weight: M,
    pub bias: Option<B>,
    pub in_features: usize,
    pub out_features: usize,
}

impl Linear {
    /// `y[rows][out] = x[rows][in] · Wᵀ + b`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; rows * self.out_features];
        self.forward_into(x, rows, &mut y);
        y
    }

    pub fn forward_into(&self, x: &[f32], rows: usize, y: &mut [f32]) {
        let (k, n) = (self.in_features, self.out_features);
        debug_assert_eq!(x.len(), rows * k);
        debug_assert_eq!(y.len(), rows * n);
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(n) {
                row.copy_from_slice(b);
            }
        }
        matmul_transposed_rhs(x, &self.weight, y, rows, n, k, self.bias.is_some());
    }
}

/// `dst[m][n] (+)= lhs[m][k] · rhs[n][k]ᵀ`; `accumulate` adds onto `dst`.
pub fn matmul_transposed_rhs(
    lhs: &[f32],
    rhs: &[f32],
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
) {
    assert!(lhs.len() >= m * k && rhs.len() >= n * k && dst.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    // SAFETY: the asserts above bound every index gemm touches: dst is m×n with row stride n,
    // lhs is m×k with row stride k, and rhs (read as k×n) is rhs[n][k] with column stride k.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            k as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm_parallelism(m, n, k),
        );
    }
}

/// `dst[m][n] = lhs[m][k] · rhs[k][n]` (both row-major).
pub fn matmul(lhs: &[f32], rhs: &[f32], dst: &mut [f32], m: usize, n: usize, k: usize) {
    assert!(lhs.len() >= m * k && rhs.len() >= k * n && dst.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    // SAFETY: bounds as asserted above; all three matrices are dense row-major.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            1,
            n as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm_parallelism(m, n, k),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_naive() {
        let (rows, k, n) = (5, 7, 3);
        let x: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let b = vec![0.5, -1.0, 2.0];
        let lin = Linear {
            weight: w.clone(),
            bias: Some(b.clone()),
            in_features: k,
            out_features: n,
        };
        let y = lin.forward(&x, rows);
        for r in 0..rows {
            for o in 0..n {
                let want: f32 = b[o] + (0..k).map(|i| x[r * k + i] * w[o * k + i]).sum::<f32>();
                assert!((y[r * n + o] - want).abs() < 1e-5);
            }
        }
    }
}

/// A matrix view into a slice: element (r, c) is at `r * row_stride + c * col_stride`.
#[derive(Clone, Copy)]
pub struct Strides {
    pub row: usize,
    pub col: usize,
}

fn last_index(rows: usize, cols: usize, s: Strides) -> usize {
    (rows - 1) * s.row + (cols - 1) * s.col
}

/// `dst (+)= lhs · rhs` for arbitrary (non-negative) strides, bounds-checked.
#[allow(clippy::too_many_arguments)]
pub fn strided_matmul(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    dst_s: Strides,
    lhs: &[f32],
    lhs_s: Strides,
    rhs: &[f32],
    rhs_s: Strides,
    accumulate: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(last_index(m, n, dst_s) < dst.len());
    assert!(last_index(m, k, lhs_s) < lhs.len());
    assert!(last_index(k, n, rhs_s) < rhs.len());
    // SAFETY: the asserts bound the largest element gemm reads or writes in each matrix.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_s.col as isize,
            dst_s.row as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_s.col as isize,
            lhs_s.row as isize,
            rhs.as_ptr(),
            rhs_s.col as isize,
            rhs_s.row as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm_parallelism(m, n, k),
        );
    }
}
