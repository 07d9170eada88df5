//! Chroma CENS: the tuning estimate (piptrack), the constant-Q transform octave by octave, the fold to 12
//! pitch classes, quantisation, smoothing and normalisation.

use std::f64::consts::PI;

use realfft::RealFftPlanner;
use realfft::num_complex::Complex;

use super::numpy::{
    Grid, Rfft, cabs32, centred_frame, hann, linspace, median_f32, pairwise_sum, round_c64,
    sum_bins,
};
use super::{BINS_PER_OCTAVE, CQT_BINS, FMIN, HOP, N_CHROMA, N_FFT, N_OCTAVES};

/// `compute_chroma_cens`: chroma energy normalised statistics `[frames, 12]` of `y` as if at `sr` Hz: the tuned
/// CQT folded into pitch classes, each frame L1-normalised, quantised, smoothed over 41 frames and L2-normalised.
pub(super) fn chroma_cens(y: &[f32], sr: f64) -> Grid<f32> {
    let tuning = estimate_tuning(y, sr);
    let cqt = cqt_magnitude(y, sr, tuning);
    let chroma = fold_chroma(&cqt);
    let frames = chroma.len();
    let quantised = chroma.rows().flat_map(|frame| quantise(frame, frames)).collect();
    let smoothed = smooth_frames(&Grid { cols: N_CHROMA, data: quantised });
    let data = smoothed.rows().flat_map(|frame| l2_normalise(frame, frames)).collect();
    Grid { cols: N_CHROMA, data }
}

/// One frame's chroma L1-normalised and quantised: a quarter for each of 0.4, 0.2, 0.1 and 0.05 it exceeds.
pub(super) fn quantise(frame: &[f32], frames: usize) -> Vec<f32> {
    let abs: Vec<f32> = frame.iter().map(|v| v.abs()).collect();
    let sum = sum_bins(&abs, frames).max(f32::MIN_POSITIVE);
    frame
        .iter()
        .map(|&v| {
            let normalised = v / sum;
            [0.4f32, 0.2, 0.1, 0.05].iter().filter(|&&step| normalised > step).count() as f32 * 0.25
        })
        .collect()
}

/// scipy.ndimage's `convolve` along the frames with a symmetric Hann window of 43 points (41 non-zero) summing to
/// one, zeros beyond the clip: summed in f64 over the window's non-zero taps in order, rounded to f32.
pub(super) fn smooth_frames(chroma: &Grid<f32>) -> Grid<f32> {
    let window = hann(41 + 2, false);
    let total = pairwise_sum(&window);
    let window: Vec<f64> = window.iter().map(|w| w / total).collect();
    let half = window.len() / 2;
    let frames = chroma.len();
    let mut data = vec![0f32; chroma.data.len()];
    for t in 0..frames {
        for c in 0..N_CHROMA {
            let mut sum = 0f64;
            for (j, &w) in window.iter().rev().enumerate() {
                if w.abs() <= f64::EPSILON {
                    continue;
                }
                let at = (t + j).checked_sub(half).filter(|&at| at < frames);
                let v = at.map_or(0.0, |at| f64::from(chroma.data[at * N_CHROMA + c]));
                sum += v * w;
            }
            data[t * N_CHROMA + c] = sum as f32;
        }
    }
    Grid { cols: N_CHROMA, data }
}

/// One frame divided by its L2 norm (floored at the least normal f32).
pub(super) fn l2_normalise(frame: &[f32], frames: usize) -> Vec<f32> {
    let squares: Vec<f32> = frame.iter().map(|v| v * v).collect();
    let norm = sum_bins(&squares, frames).sqrt().max(f32::MIN_POSITIVE);
    frame.iter().map(|v| v / norm).collect()
}

/// `cq_to_chroma_mapping` applied: each pitch class sums the three CQT bins around it in every octave, `[frames,
/// 12]` f32.
pub(super) fn fold_chroma(cqt: &Grid<f32>) -> Grid<f32> {
    let merge = BINS_PER_OCTAVE / N_CHROMA;
    // The classes are rolled so that the first is the pitch class of FMIN (C1: no roll).
    let midi = (12.0 * (FMIN / 440.0).log2() + 69.0).rem_euclid(12.0);
    let roll = (midi * (N_CHROMA as f64 / 12.0)).round_ties_even() as usize;
    let class = |bin: usize| ((bin + merge / 2) % BINS_PER_OCTAVE / merge + roll) % N_CHROMA;
    let data = cqt
        .rows()
        .flat_map(|frame| {
            let mut sums = [0f64; N_CHROMA];
            for (bin, &v) in frame.iter().enumerate() {
                sums[class(bin)] += f64::from(v);
            }
            sums.map(|s| s as f32)
        })
        .collect();
    Grid { cols: N_CHROMA, data }
}

/// `estimate_tuning`: the clip's deviation from A440 tuning in fractions of a CQT bin (steps of 0.01 in [−0.5,
/// 0.5)), from the strongest half of piptrack's pitches; 0 for a clip shorter than 2048 samples or without any.
pub(super) fn estimate_tuning(y: &[f32], sr: f64) -> f64 {
    if y.len() < N_FFT {
        return 0.0;
    }
    let (pitches, magnitudes) = piptrack(y, sr);
    if pitches.is_empty() {
        return 0.0;
    }
    let threshold = median_f32(&mut magnitudes.clone());
    let strong: Vec<f32> = pitches
        .iter()
        .zip(&magnitudes)
        .filter(|&(_, &m)| m >= threshold)
        .map(|(&p, _)| p)
        .collect();
    if strong.is_empty() { 0.0 } else { pitch_tuning(&strong) }
}

/// `piptrack` with librosa's defaults (150 Hz to 4 kHz, threshold 0.1): the parabolically interpolated pitch and
/// magnitude of every local spectral peak above a tenth of its frame's maximum, in f32, those with a positive pitch.
pub(super) fn piptrack(y: &[f32], sr: f64) -> (Vec<f32>, Vec<f32>) {
    let window = hann(N_FFT, true);
    let bins = N_FFT / 2 + 1;
    let bin_hz = 1.0 / (N_FFT as f64 * (1.0 / sr));
    let (fmin, fmax) = (150f64, 4000f64.min(sr / 2.0));
    let in_band: Vec<bool> = (0..bins)
        .map(|k| {
            let f = k as f64 * bin_hz;
            fmin <= f && f < fmax
        })
        .collect();
    let mut fft = Rfft::new(&mut RealFftPlanner::new(), N_FFT);
    let (mut pitches, mut magnitudes) = (Vec::new(), Vec::new());
    for t in 0..1 + y.len() / HOP {
        // The windowed frame is rounded to f32, whose FFT numpy takes in f32.
        let spectrum = fft.forward(|buf| {
            centred_frame(y, t, HOP, buf, |j, v| f64::from((window[j] * f64::from(v)) as f32))
        });
        let s: Vec<f32> = spectrum.iter().map(|c| cabs32(c.re as f32, c.im as f32)).collect();
        frame_pitches(&s, &in_band, sr, &mut pitches, &mut magnitudes);
    }
    (pitches, magnitudes)
}

/// One frame's piptrack peaks, appended to `pitches` and `magnitudes`.
pub(super) fn frame_pitches(
    s: &[f32],
    in_band: &[bool],
    sr: f64,
    pitches: &mut Vec<f32>,
    magnitudes: &mut Vec<f32>,
) {
    let n = s.len();
    let reference = 0.1f32 * s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let gated = |i: usize| if s[i] > reference { s[i] } else { 0.0 };
    for i in 1..n {
        let local_max = if i == n - 1 {
            gated(i) > gated(i - 1)
        } else {
            gated(i) > gated(i - 1) && gated(i) >= gated(i + 1)
        };
        if !(local_max && in_band[i]) {
            continue;
        }
        let (shift, slope) = if i == n - 1 {
            (0.0, s[i] - s[i - 1])
        } else {
            let a = (s[i + 1] + s[i - 1]) - 2.0 * s[i];
            let b = (s[i + 1] - s[i - 1]) / 2.0;
            (if b.abs() < a.abs() { -b / a } else { 0.0 }, (s[i + 1] - s[i - 1]) / 2.0)
        };
        let pitch = ((i as f64 + f64::from(shift)) * sr / (2 * (n - 1)) as f64) as f32;
        if pitch > 0.0 {
            pitches.push(pitch);
            magnitudes.push(s[i] + 0.5 * slope * shift);
        }
    }
}

/// `pitch_tuning` at a resolution of 0.01 and 36 bins an octave: the left edge of the fullest histogram bin of the
/// pitches' offsets from the nearest bin, in f32 as numpy computes them and binned against f64 edges.
pub(super) fn pitch_tuning(pitches: &[f32]) -> f64 {
    let edges = linspace(-0.5, 0.5, 101);
    let mut counts = vec![0usize; edges.len() - 1];
    for &pitch in pitches.iter().filter(|&&p| p > 0.0) {
        let octaves = (pitch / 27.5).log2();
        let mut residual = numpy_mod_1(BINS_PER_OCTAVE as f32 * octaves);
        if residual >= 0.5 {
            residual -= 1.0;
        }
        if let Some(bin) = histogram_bin(&edges, f64::from(residual)) {
            counts[bin] += 1;
        }
    }
    let best =
        counts.iter().enumerate().fold(0, |best, (i, &c)| if c > counts[best] { i } else { best });
    edges[best]
}

/// numpy's `mod(x, 1.0)` in f32: the remainder taking the divisor's sign.
pub(super) fn numpy_mod_1(x: f32) -> f32 {
    let m = x % 1.0;
    if m < 0.0 {
        m + 1.0
    } else if m == 0.0 {
        0.0
    } else {
        m
    }
}

/// The bin of `edges` numpy's `histogram` counts `x` in: `[e_i, e_{i+1})`, the last bin closed.
pub(super) fn histogram_bin(edges: &[f64], x: f64) -> Option<usize> {
    let last = edges.len() - 1;
    if x < edges[0] || x > edges[last] {
        return None;
    }
    Some(edges[..last].iter().rposition(|&e| e <= x).unwrap_or(0))
}

/// `_relative_bandwidth`: each CQT bin's bandwidth relative to its frequency, from the log spacing around it.
pub(super) fn relative_bandwidth(freqs: &[f64]) -> Vec<f64> {
    let n = freqs.len();
    let logf: Vec<f64> = freqs.iter().map(|f| f.log2()).collect();
    (0..n)
        .map(|k| {
            let per_octave = if k == 0 {
                1.0 / (logf[1] - logf[0])
            } else if k == n - 1 {
                1.0 / (logf[n - 1] - logf[n - 2])
            } else {
                2.0 / (logf[k + 1] - logf[k - 1])
            };
            let r = 2f64.powf(2.0 / per_octave);
            (r - 1.0) / (r + 1.0)
        })
        .collect()
}

/// `compute_cqt`'s magnitudes `[frames, 252]` of `y` as if at `sr` Hz, 36 bins an octave from C1 shifted by
/// `tuning` bins: each octave, from the top, filtered at the rate it has then, the signal halved after each.
pub(super) fn cqt_magnitude(y: &[f32], sr: f64, tuning: f64) -> Grid<f32> {
    let fmin = FMIN * 2f64.powf(tuning / BINS_PER_OCTAVE as f64);
    let freqs: Vec<f64> =
        (0..CQT_BINS).map(|k| fmin * 2f64.powf(k as f64 / BINS_PER_OCTAVE as f64)).collect();
    let alpha = relative_bandwidth(&freqs);
    let lengths: Vec<f64> = freqs.iter().zip(&alpha).map(|(&f, &a)| (1.0 / a) * sr / f).collect();
    let frames = 1 + y.len() / HOP;
    let mut magnitudes = Grid { cols: CQT_BINS, data: vec![0f32; frames * CQT_BINS] };
    let mut planner = RealFftPlanner::new();
    let (mut signal, mut octave_sr, mut hop) = (y.to_vec(), sr, HOP);
    for octave in 0..N_OCTAVES {
        let top = CQT_BINS - octave * BINS_PER_OCTAVE;
        let bins = top - BINS_PER_OCTAVE..top;
        let basis = octave_basis(
            &mut planner,
            &freqs[bins.clone()],
            &alpha[bins.clone()],
            octave_sr,
            (sr / octave_sr).sqrt(),
        );
        octave_magnitudes(
            &mut planner,
            &signal,
            hop,
            &basis,
            &lengths[bins.clone()],
            &mut magnitudes,
            bins.start,
        );
        if hop % 2 == 0 && octave + 1 < N_OCTAVES {
            hop /= 2;
            octave_sr /= 2.0;
            signal = resample_half(&signal);
        }
    }
    magnitudes
}

/// One octave's CQT filters in the frequency domain: the FFT length, and per bin its kept bins (complex64 values
/// widened and scaled by `√(sr / octave_sr)`).
pub(super) struct OctaveBasis {
    n_fft: usize,
    rows: Vec<Vec<(usize, Complex<f64>)>>,
}

/// `_build_wavelet` and what `compute_cqt` does with it: each bin's wavelet, centred in the octave's FFT length
/// and scaled by its length over it, transformed (complex64) and sparsified.
pub(super) fn octave_basis(
    planner: &mut RealFftPlanner<f64>,
    freqs: &[f64],
    alpha: &[f64],
    octave_sr: f64,
    scale: f64,
) -> OctaveBasis {
    let lengths: Vec<f64> =
        freqs.iter().zip(alpha).map(|(&f, &a)| (1.0 / a) * octave_sr / f).collect();
    let longest = lengths.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let n_fft = 2f64.powf(longest.log2().ceil()) as usize;
    let mut fft = Rfft::new(planner, n_fft);
    let rows = freqs
        .iter()
        .zip(&lengths)
        .map(|(&freq, &length)| {
            let wavelet = wavelet(freq, octave_sr, length);
            let pad = (n_fft - wavelet.len()) / 2;
            let factor = length / n_fft as f64;
            let placed: Vec<(f32, f32)> = wavelet
                .iter()
                .map(|&(re, im)| ((f64::from(re) * factor) as f32, (f64::from(im) * factor) as f32))
                .collect();
            sparsify(&complex_spectrum(&mut fft, &placed, pad))
                .into_iter()
                .map(|(k, (re, im))| {
                    (k, Complex::new(f64::from(re) * scale, f64::from(im) * scale))
                })
                .collect()
        })
        .collect();
    OctaveBasis { n_fft, rows }
}

/// scipy's complex64 `fft` of `values` placed at `pad` in zeros, bins `0..=n/2`: from two real FFTs in f64,
/// `X = FFT(re) + i·FFT(im)`, rounded to complex64.
pub(super) fn complex_spectrum(
    fft: &mut Rfft,
    values: &[(f32, f32)],
    pad: usize,
) -> Vec<(f32, f32)> {
    let real: Vec<Complex<f64>> = fft
        .forward(|buf| {
            for (b, &(re, _)) in buf[pad..].iter_mut().zip(values) {
                *b = f64::from(re);
            }
        })
        .to_vec();
    let imag = fft.forward(|buf| {
        for (b, &(_, im)) in buf[pad..].iter_mut().zip(values) {
            *b = f64::from(im);
        }
    });
    real.iter().zip(imag).map(|(r, i)| ((r.re - i.im) as f32, (r.im + i.re) as f32)).collect()
}

/// A Hann-windowed complex wavelet of `length` samples at `freq` Hz and `sr` Hz in complex64, L1-normalised (times
/// the f32 reciprocal of its L1 norm, as numpy divides a complex64 by an f32).
pub(super) fn wavelet(freq: f64, sr: f64, length: f64) -> Vec<(f32, f32)> {
    let start = (-length / 2.0).floor();
    let count = ((length / 2.0).floor() - start).max(0.0) as usize;
    let window = hann(count, true);
    let values: Vec<(f32, f32)> = (0..count)
        .map(|i| {
            let theta = (start + i as f64) * 2.0 * PI * freq / sr;
            let (re, im) = (theta.cos() as f32, theta.sin() as f32);
            ((f64::from(re) * window[i]) as f32, (f64::from(im) * window[i]) as f32)
        })
        .collect();
    let magnitudes: Vec<f32> = values.iter().map(|&(re, im)| cabs32(re, im)).collect();
    let reciprocal = 1.0 / pairwise_sum(&magnitudes).max(f32::MIN_POSITIVE);
    values.into_iter().map(|(re, im)| (re * reciprocal, im * reciprocal)).collect()
}

/// `_sparsify_rows` with a quantile of 0.01: the bins kept are those at least as strong as the weakest whose
/// running share of the row's L1 norm (weakest first) reaches 1%.
pub(super) fn sparsify(row: &[(f32, f32)]) -> Vec<(usize, (f32, f32))> {
    let magnitudes: Vec<f32> = row.iter().map(|&(re, im)| cabs32(re, im)).collect();
    let norm = pairwise_sum(&magnitudes);
    let norm = if norm == 0.0 { 1.0 } else { norm };
    let mut sorted = magnitudes.clone();
    sorted.sort_by(f32::total_cmp);
    let mut running = 0f32;
    let mut threshold = sorted.first().copied().unwrap_or(0.0);
    for &m in &sorted {
        running += m / norm;
        if running >= 0.01 {
            threshold = m;
            break;
        }
    }
    row.iter()
        .zip(&magnitudes)
        .enumerate()
        .filter(|&(_, (_, &m))| m >= threshold)
        .map(|(k, (&c, _))| (k, c))
        .collect()
}

/// One octave's CQT magnitudes, into columns `first..` of `magnitudes`: each frame of `signal` (`hop` apart,
/// centred, unwindowed, its FFT in complex64) times each bin's sparse filter, summed in complex128 over the kept
/// bins in order, rounded to complex64, divided by the square root of the bin's wavelet length at the full rate
/// (`lengths`) as numpy divides a complex by a real (times the f64 reciprocal), and its complex64 magnitude taken.
pub(super) fn octave_magnitudes(
    planner: &mut RealFftPlanner<f64>,
    signal: &[f32],
    hop: usize,
    basis: &OctaveBasis,
    lengths: &[f64],
    magnitudes: &mut Grid<f32>,
    first: usize,
) {
    let mut fft = Rfft::new(planner, basis.n_fft);
    let cols = magnitudes.cols;
    for (t, frame) in magnitudes.data.chunks_exact_mut(cols).enumerate() {
        let spectrum: Vec<Complex<f64>> = fft
            .forward(|buf| centred_frame(signal, t, hop, buf, |_, v| f64::from(v)))
            .iter()
            .map(|&c| round_c64(c))
            .collect();
        for ((out, row), &length) in frame[first..].iter_mut().zip(&basis.rows).zip(lengths) {
            let mut sum = Complex::new(0.0, 0.0);
            for &(k, a) in row {
                let x = spectrum[k];
                sum.re += a.re * x.re - a.im * x.im;
                sum.im += a.re * x.im + a.im * x.re;
            }
            let (c, scale) = (round_c64(sum), 1.0 / length.sqrt());
            *out = cabs32((c.re * scale) as f32, (c.im * scale) as f32);
        }
    }
}

/// The half-band low-pass `_resample_half` filters with: scipy's `firwin(321, 0.48, window=('kaiser', 6.5))`.
pub(super) fn half_band_filter() -> Vec<f64> {
    const TAPS: usize = 321;
    const CUTOFF: f64 = 0.48;
    const BETA: f64 = 6.5;
    let centre = 0.5 * (TAPS - 1) as f64;
    let sinc = |x: f64| {
        let y = PI * if x == 0.0 { f64::EPSILON } else { x };
        y.sin() / y
    };
    let h: Vec<f64> = (0..TAPS)
        .map(|i| {
            let m = i as f64 - centre;
            let kaiser = bessel_i0(BETA * (1.0 - ((i as f64 - centre) / centre).powi(2)).sqrt())
                / bessel_i0(BETA);
            CUTOFF * sinc(CUTOFF * m) * kaiser
        })
        .collect();
    let total = pairwise_sum(&h);
    h.iter().map(|v| v / total).collect()
}

/// The modified Bessel function of the first kind, order 0, by its power series (converges to the last bit for
/// the Kaiser window's arguments, at most 6.5).
pub(super) fn bessel_i0(x: f64) -> f64 {
    let q = x * x / 4.0;
    let (mut sum, mut term, mut k) = (1.0, 1.0, 1.0);
    while term > sum * 1e-18 {
        term *= q / (k * k);
        sum += term;
        k += 1.0;
    }
    sum
}

/// `_resample_half`: `y` low-passed and halved (scipy's `resample_poly(y, 1, 2)` with the half-band filter, in f64,
/// `⌈n/2⌉` samples), divided by √½ and rounded to f32.
pub(super) fn resample_half(y: &[f32]) -> Vec<f32> {
    let h = half_band_filter();
    let half = (h.len() - 1) / 2;
    let gain = 0.5f64.sqrt();
    (0..y.len().div_ceil(2))
        .map(|n| {
            let centre = 2 * n + half;
            // Input sample i meets tap centre − i, oldest sample first (upfirdn's order).
            let first = centre.saturating_sub(h.len() - 1);
            let last = centre.min(y.len() - 1);
            let sum = (first..=last).fold(0f64, |s, i| s + f64::from(y[i]) * h[centre - i]);
            (sum / gain) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_histogram_takes_the_fullest_bin() {
        // 440 Hz is bin-exact (residual 0); 27.5 · 2^(1/36 · 0.234) is 0.234 of a bin sharp.
        let sharp = (27.5 * 2f64.powf(4.0 + 0.234 / 36.0)) as f32;
        assert_eq!(pitch_tuning(&[440.0, sharp, sharp]), linspace(-0.5, 0.5, 101)[73]);
    }
}
