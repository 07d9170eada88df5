//! numpy's and scipy's arithmetic as the reference rounds it: pairwise sums, means and medians, complex
//! absolute values, `linspace`, Hann windows, `next_fast_len`, a real FFT in f64, centred framing.

use std::f64::consts::PI;
use std::sync::Arc;

use realfft::RealFftPlanner;
use realfft::RealToComplex;
use realfft::num_complex::Complex;

/// A row-major `[rows, cols]` array. Spectrogram-like values are kept a row per frame (numpy's `[bins, frames]`
/// transposed), so each frame's bins are contiguous.
#[derive(Debug, Clone)]
pub(super) struct Grid<T> {
    pub(super) cols: usize,
    pub(super) data: Vec<T>,
}

impl<T> Grid<T> {
    /// Row `r`.
    pub(super) fn row(&self, r: usize) -> &[T] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The rows.
    pub(super) fn rows(&self) -> std::slice::ChunksExact<'_, T> {
        self.data.chunks_exact(self.cols.max(1))
    }

    /// How many rows.
    pub(super) fn len(&self) -> usize {
        self.data.len().checked_div(self.cols).unwrap_or(0)
    }

    /// Each value mapped.
    pub(super) fn map<U>(&self, f: impl Fn(&T) -> U) -> Grid<U> {
        Grid { cols: self.cols, data: self.data.iter().map(f).collect() }
    }
}

/// numpy's pairwise sum (`add.reduce` along a contiguous axis), in the values' own type: blocks of up to 128
/// summed with eight accumulators, larger runs split in two.
pub(super) fn pairwise_sum<T: Copy + Default + std::ops::Add<Output = T>>(a: &[T]) -> T {
    let n = a.len();
    if n < 8 {
        return a.iter().fold(T::default(), |s, &v| s + v);
    }
    if n <= 128 {
        let mut r = [T::default(); 8];
        r.copy_from_slice(&a[..8]);
        let whole = n - n % 8;
        for block in a[8..whole].chunks_exact(8) {
            for (acc, &v) in r.iter_mut().zip(block) {
                *acc = *acc + v;
            }
        }
        let tree = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        return a[whole..].iter().fold(tree, |s, &v| s + v);
    }
    let half = n / 2;
    let half = half - half % 8;
    pairwise_sum(&a[..half]) + pairwise_sum(&a[half..])
}

/// numpy's mean of f32 values: the pairwise sum, divided by the count in f64 and rounded back.
pub(super) fn mean_f32(a: &[f32]) -> f32 {
    (f64::from(pairwise_sum(a)) / a.len() as f64) as f32
}

/// numpy's mean of f64 values.
pub(super) fn mean_f64(a: &[f64]) -> f64 {
    pairwise_sum(a) / a.len() as f64
}

/// numpy's `sum(axis=0)` over one frame's bins of a `[bins, frames]` f32 array of `frames` frames: the bins added
/// in order (numpy's reduction then runs along the frames), or pairwise when there is one frame.
pub(super) fn sum_bins(bins: &[f32], frames: usize) -> f32 {
    if frames == 1 { pairwise_sum(bins) } else { bins.iter().fold(0.0, |s, &v| s + v) }
}

/// The median of f32 values as numpy takes it: the middle one, or the f32 sum of the middle two halved.
pub(super) fn median_f32(values: &mut [f32]) -> f32 {
    values.sort_by(f32::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (f64::from(values[n / 2 - 1] + values[n / 2]) / 2.0) as f32
    }
}

/// The median of f64 values as numpy takes it.
pub(super) fn median_f64(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

/// numpy's `abs` of a complex64 value (its SIMD loop): `max · √(fma(r, r, 1))` with `r = min / max`.
pub(super) fn cabs32(re: f32, im: f32) -> f32 {
    let (a, b) = (re.abs(), im.abs());
    let (larger, smaller) = (a.max(b), a.min(b));
    if larger == 0.0 {
        return 0.0;
    }
    let ratio = smaller / larger;
    ratio.mul_add(ratio, 1.0).sqrt() * larger
}

/// numpy's `abs` of a complex128 value.
pub(super) fn cabs64(c: Complex<f64>) -> f64 {
    let (a, b) = (c.re.abs(), c.im.abs());
    let (larger, smaller) = (a.max(b), a.min(b));
    if larger == 0.0 {
        return 0.0;
    }
    let ratio = smaller / larger;
    ratio.mul_add(ratio, 1.0).sqrt() * larger
}

/// A complex128 value rounded to complex64, and widened back.
pub(super) fn round_c64(c: Complex<f64>) -> Complex<f64> {
    Complex::new(f64::from(c.re as f32), f64::from(c.im as f32))
}

/// numpy's `linspace(start, stop, num)`: `i · step + start`, the last value `stop` itself.
pub(super) fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num < 2 {
        return vec![start; num];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut values: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    values[num - 1] = stop;
    values
}

/// scipy's Hann window of `m` points: periodic (`fftbins=True`) or symmetric; `0.5 + 0.5 cos` over numpy's
/// `linspace(−π, π)`.
pub(super) fn hann(m: usize, periodic: bool) -> Vec<f64> {
    if m <= 1 {
        return vec![1.0; m];
    }
    let points = if periodic { m + 1 } else { m };
    linspace(-PI, PI, points).into_iter().take(m).map(|f| 0.5 + 0.5 * f.cos()).collect()
}

/// scipy's `next_fast_len` for complex transforms: the least 11-smooth length not below `target`.
pub(super) fn next_fast_len(target: usize) -> usize {
    let smooth = |n: usize| {
        [2, 3, 5, 7, 11].iter().fold(n, |mut m, &p| {
            while m % p == 0 {
                m /= p;
            }
            m
        }) == 1
    };
    (target.max(1)..).find(|&n| smooth(n)).unwrap_or(target)
}

/// A real FFT of one length in f64 with its buffers (scipy's `rfft`: bins `0..=n/2`).
pub(super) struct Rfft {
    plan: Arc<dyn RealToComplex<f64>>,
    input: Vec<f64>,
    output: Vec<Complex<f64>>,
    scratch: Vec<Complex<f64>>,
}

impl Rfft {
    /// The transform of `n` samples.
    pub(super) fn new(planner: &mut RealFftPlanner<f64>, n: usize) -> Rfft {
        let plan = planner.plan_fft_forward(n);
        let (input, output, scratch) =
            (plan.make_input_vec(), plan.make_output_vec(), plan.make_scratch_vec());
        Rfft { plan, input, output, scratch }
    }

    /// The spectrum of the `n` samples `fill` writes (the buffer is zeroed first).
    pub(super) fn forward(&mut self, fill: impl FnOnce(&mut [f64])) -> &[Complex<f64>] {
        self.input.fill(0.0);
        fill(&mut self.input);
        self.plan
            .process_with_scratch(&mut self.input, &mut self.output, &mut self.scratch)
            .expect("the buffers were made by the plan");
        &self.output
    }
}

/// Writes frame `t` of `y` as librosa's centred framing takes it (the clip zero-padded by `n/2` each side, frames
/// `hop` apart) into `out` (`n` long), each sample through `f(index in the frame, sample)`.
pub(super) fn centred_frame(
    y: &[f32],
    t: usize,
    hop: usize,
    out: &mut [f64],
    f: impl Fn(usize, f32) -> f64,
) {
    let n = out.len();
    let first = (t * hop) as isize - (n / 2) as isize;
    for (j, v) in out.iter_mut().enumerate() {
        let at = first + j as isize;
        let sample = usize::try_from(at).ok().and_then(|i| y.get(i)).copied().unwrap_or(0.0);
        *v = f(j, sample);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairwise_sum_rounds_as_numpy_does() {
        // Nine values: eight accumulators, their tree, then the ninth.
        let a = [1e8f32, 1.0, -1e8, 1.0, 0.5, 0.25, 3.0, 7.0, 1.0];
        let tree = ((1e8f32 + 1.0) + (-1e8 + 1.0)) + ((0.5 + 0.25) + (3.0 + 7.0));
        assert_eq!(pairwise_sum(&a), tree + 1.0);
        assert_eq!(pairwise_sum(&[1.0f64, 2.0, 3.0]), 6.0);
    }

    #[test]
    fn next_fast_len_is_11_smooth() {
        assert_eq!(next_fast_len(689), 693);
        assert_eq!(next_fast_len(1377), 1386);
        assert_eq!(next_fast_len(39), 40);
    }

    #[test]
    fn hann_windows() {
        let periodic = hann(4, true);
        assert_eq!(periodic[0], 0.0);
        assert!((periodic[2] - 1.0).abs() < 1e-15 && (periodic[1] - 0.5).abs() < 1e-15);
        let symmetric = hann(5, false);
        assert!((symmetric[2] - 1.0).abs() < 1e-15 && symmetric[4].abs() < 1e-15);
    }
}
