//! A safe, bounds-checked front for `gemm::gemm` on f32 strided matrices.
//!
//! The strided products on the CPU (matmul, the blocks of attention, convolution, and linears where no SIMD
//! kernel of `packed_gemm` runs) go through [`gemm`]: the AVX-512 micro-kernel where the CPU has it, else the
//! `gemm` crate.
//! Invariant: before the one `unsafe` call, the views are checked to cover every element the strides reach
//! and the destination's strides are checked not to alias two elements, so no call can read or write out of
//! bounds or race with itself.

#![allow(unsafe_code)]

use gemm::Parallelism;

use super::packed_gemm::{self, Rhs};

/// A read-only strided matrix: element (i, j) is `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    /// The elements.
    pub(crate) data: &'a [f32],
    /// Row stride.
    pub(crate) rs: usize,
    /// Column stride.
    pub(crate) cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major matrix with rows of `cols` elements.
    pub(crate) fn rows(data: &'a [f32], cols: usize) -> Mat<'a> {
        Mat { data, rs: cols, cs: 1 }
    }

    /// The transpose of a row-major matrix with rows of `cols` elements.
    pub(crate) fn rows_t(data: &'a [f32], cols: usize) -> Mat<'a> {
        Mat { data, rs: 1, cs: cols }
    }
}

/// A mutable strided matrix (see [`Mat`]).
pub(crate) struct MatMut<'a> {
    /// The elements.
    pub(crate) data: &'a mut [f32],
    /// Row stride.
    pub(crate) rs: usize,
    /// Column stride.
    pub(crate) cs: usize,
}

impl<'a> MatMut<'a> {
    /// A row-major matrix with rows of `cols` elements.
    pub(crate) fn rows(data: &'a mut [f32], cols: usize) -> MatMut<'a> {
        MatMut { data, rs: cols, cs: 1 }
    }
}

/// How many threads a product may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Threads {
    /// The calling thread only (inside an outer rayon loop).
    One,
    /// Every thread of the rayon pool.
    All,
}

/// One past the largest index an `rows × cols` view with these strides reaches (0 when empty).
fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 }
}

/// `dst = scale · lhs · rhs` (or `dst += scale · lhs · rhs` with `accumulate`) for lhs `m × k`, rhs `k × n`
/// and dst `m × n`.
///
/// # Panics
/// If a view is too short for its shape and strides, or dst's strides make two elements alias (the callers
/// derive both from shapes they have checked, so this is a bug, not bad input).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<'_>,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    accumulate: bool,
    scale: f32,
    threads: Threads,
) {
    assert!(dst.data.len() >= span(m, n, dst.rs, dst.cs), "gemm: dst too short");
    assert!(lhs.data.len() >= span(m, k, lhs.rs, lhs.cs), "gemm: lhs too short");
    assert!(rhs.data.len() >= span(k, n, rhs.rs, rhs.cs), "gemm: rhs too short");
    let distinct = (m <= 1 || dst.rs >= 1)
        && (n <= 1 || dst.cs >= 1)
        && (m <= 1 || n <= 1 || dst.rs >= n * dst.cs || dst.cs >= m * dst.rs);
    assert!(distinct, "gemm: dst strides alias");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    dst.data[i * dst.rs + j * dst.cs] = 0.0;
                }
            }
        }
        return;
    }
    // The AVX-512 micro-kernel where it runs (x read along rows, dst written along rows); the gemm crate,
    // which only uses AVX2 here, otherwise.
    if lhs.cs == 1 && dst.cs == 1 && packed_gemm::strided_available() {
        packed_gemm::gemm_f32((m, n, k), dst, lhs, Rhs::Strided(rhs), accumulate, scale, threads);
        return;
    }
    let parallelism = match threads {
        Threads::One => Parallelism::None,
        Threads::All => Parallelism::Rayon(rayon::current_num_threads()),
    };
    // SAFETY: the asserts above show each view covers every index (i·rs + j·cs) the product reads or
    // writes, and that dst's elements are distinct; `dst` is a unique borrow, so it aliases neither input.
    // `gemm::gemm` computes dst := alpha·dst + beta·lhs·rhs (dst only read when `read_dst`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            dst.cs as isize,
            dst.rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_products_match_loops() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i % 5) as f32 - 2.0).collect();
        // b is stored [n, k]; use it transposed. a row-major takes the AVX-512 kernel where the CPU has it,
        // a transposed copy of a the gemm crate.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        for (lhs, threads) in
            [(Mat::rows(&a, k), Threads::One), (Mat::rows_t(&at, m), Threads::All)]
        {
            let mut c = vec![1.0f32; m * n];
            gemm(m, n, k, MatMut::rows(&mut c, n), lhs, Mat::rows_t(&b, k), true, 2.0, threads);
            for i in 0..m {
                for j in 0..n {
                    let dot: f32 = (0..k).map(|l| a[i * k + l] * b[j * k + l]).sum();
                    assert_eq!(c[i * n + j], 1.0 + 2.0 * dot);
                }
            }
        }
    }
}
