//! The small dense solve the multistep samplers need (UniPC's corrector in f32, SA-Solver's Lagrange weights in
//! f64).

use std::ops::{Div, Mul, Sub, SubAssign};

/// The float types the solve runs in.
pub(super) trait Real:
    Copy
    + Default
    + PartialOrd
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + SubAssign
{
    /// |x|.
    fn abs(self) -> Self;
}

impl Real for f32 {
    fn abs(self) -> Self {
        f32::abs(self)
    }
}

impl Real for f64 {
    fn abs(self) -> Self {
        f64::abs(self)
    }
}

/// Solves `a · x = b` (a few unknowns) by LU with partial pivoting, in `T`.
pub(super) fn solve<T: Real>(mut a: Vec<Vec<T>>, mut b: Vec<T>) -> Vec<T> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| {
                a[i][col].abs().partial_cmp(&a[j][col].abs()).unwrap_or(std::cmp::Ordering::Equal)
            })
            .unwrap_or(col);
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col].clone();
        for row in col + 1..n {
            let f = a[row][col] / pivot_row[col];
            for (v, &p) in a[row].iter_mut().zip(&pivot_row).skip(col) {
                *v -= f * p;
            }
            let pivot_b = b[col];
            b[row] -= f * pivot_b;
        }
    }
    let mut x = vec![T::default(); n];
    for row in (0..n).rev() {
        let s = (row + 1..n).fold(b[row], |s, k| s - a[row][k] * x[k]);
        x[row] = s / a[row][row];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_solve_inverts_a_vandermonde_system() {
        let lambdas = [0.3f64, 1.1, 2.0];
        let a: Vec<Vec<f64>> =
            (0..3).map(|j| lambdas.iter().map(|l| l.powi(j)).collect()).collect();
        let y = solve(a.clone(), vec![1.0, 2.0, 3.0]);
        for (row, b) in a.iter().zip([1.0, 2.0, 3.0]) {
            let got: f64 = row.iter().zip(&y).map(|(a, y)| a * y).sum();
            assert!((got - b).abs() < 1e-12);
        }
    }
}
