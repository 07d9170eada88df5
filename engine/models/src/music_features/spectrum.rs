//! The mel spectrogram and what is read from it: its dB, the onset envelope and the MFCCs.

use std::f64::consts::PI;

use realfft::RealFftPlanner;

use super::numpy::{Grid, Rfft, cabs32, centred_frame, hann, linspace, sum_bins};
use super::{AMIN, HOP, N_FFT, N_MELS, N_MFCC};

/// Hz per mel below 1 kHz on the Slaney scale.
pub(super) const F_SP: f64 = 200.0 / 3.0;

/// The Slaney mel scale's log-region constants: the mel of 1 kHz and the log step per mel.
pub(super) fn mel_log_region() -> (f64, f64) {
    ((1000.0 - 0.0) / F_SP, 6.4f64.ln() / 27.0)
}

/// Hz to mels (Slaney).
pub(super) fn hz_to_mel(hz: f64) -> f64 {
    let (min_log_mel, logstep) = mel_log_region();
    if hz >= 1000.0 { min_log_mel + (hz / 1000.0).ln() / logstep } else { (hz - 0.0) / F_SP }
}

/// Mels to Hz (Slaney).
pub(super) fn mel_to_hz(mel: f64) -> f64 {
    let (min_log_mel, logstep) = mel_log_region();
    if mel >= min_log_mel {
        1000.0 * (logstep * (mel - min_log_mel)).exp()
    } else {
        0.0 + F_SP * mel
    }
}

/// One mel filter: its first FFT bin and its f32 weights from there (the rest are zero).
pub(super) struct MelFilter {
    first: usize,
    weights: Vec<f32>,
}

/// The 128 Slaney-normalised triangular mel filters over a 2048-point FFT's bins at `sr` Hz, 0 Hz to `sr/2`.
pub(super) fn mel_filterbank(sr: f64) -> Vec<MelFilter> {
    let bin_hz = 1.0 / (N_FFT as f64 * (1.0 / sr));
    let fft_freqs: Vec<f64> = (0..=N_FFT / 2).map(|k| k as f64 * bin_hz).collect();
    let mel_f: Vec<f64> = linspace(hz_to_mel(0.0), hz_to_mel(sr / 2.0), N_MELS + 2)
        .into_iter()
        .map(mel_to_hz)
        .collect();
    (0..N_MELS)
        .map(|i| {
            let (lower_width, upper_width) = (mel_f[i + 1] - mel_f[i], mel_f[i + 2] - mel_f[i + 1]);
            let enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
            let weights: Vec<f32> = fft_freqs
                .iter()
                .map(|&f| {
                    let lower = -(mel_f[i] - f) / lower_width;
                    let upper = (mel_f[i + 2] - f) / upper_width;
                    let triangle = 0f64.max(lower.min(upper)) as f32;
                    (f64::from(triangle) * enorm) as f32
                })
                .collect();
            let first = weights.iter().position(|&w| w != 0.0).unwrap_or(weights.len());
            let last = weights.iter().rposition(|&w| w != 0.0).map_or(first, |l| l + 1);
            MelFilter { first, weights: weights[first..last].to_vec() }
        })
        .collect()
}

/// `_compute_mel_spectrogram`: the mel power spectrogram of `y` as if at `sr` Hz, `[frames, 128]` f32 (a
/// Hann-windowed 2048-point STFT in f64, its power in f32, the filters applied).
pub(super) fn mel_spectrogram(y: &[f32], sr: f64) -> Grid<f32> {
    let window = hann(N_FFT, true);
    let filters = mel_filterbank(sr);
    let frames = 1 + y.len() / HOP;
    let mut fft = Rfft::new(&mut RealFftPlanner::new(), N_FFT);
    let mut power = vec![0f32; N_FFT / 2 + 1];
    let mut data = Vec::with_capacity(frames * N_MELS);
    for t in 0..frames {
        let spectrum =
            fft.forward(|buf| centred_frame(y, t, HOP, buf, |j, v| window[j] * f64::from(v)));
        for (p, c) in power.iter_mut().zip(spectrum) {
            let magnitude = cabs32(c.re as f32, c.im as f32);
            *p = magnitude * magnitude;
        }
        data.extend(filters.iter().map(|filter| {
            let bins = &power[filter.first..filter.first + filter.weights.len()];
            let sum: f64 =
                filter.weights.iter().zip(bins).map(|(&w, &p)| f64::from(w) * f64::from(p)).sum();
            sum as f32
        }));
    }
    Grid { cols: N_MELS, data }
}

/// `10 · log10(max(1e-10, S))` in f32.
pub(super) fn log_power(mel: &Grid<f32>) -> Grid<f32> {
    mel.map(|&v| 10.0 * v.max(AMIN).log10())
}

/// `power_to_db` with a reference of 1 and `top_db` 80: the log power floored 80 dB below its peak.
pub(super) fn power_to_db(mel: &Grid<f32>) -> Grid<f32> {
    let log = log_power(mel);
    let floor = log.data.iter().copied().fold(f32::NEG_INFINITY, f32::max) - 80.0;
    log.map(|&v| v.max(floor))
}

/// `compute_onset_envelope`: per frame, the mean over the mel bands of the dB rise from the frame before, delayed
/// by three frames (zeros first), f32.
pub(super) fn onset_envelope(db: &Grid<f32>) -> Vec<f32> {
    let frames = db.len();
    let rises = frames.saturating_sub(1);
    let mut diff = vec![0f32; N_MELS];
    let mut envelope = vec![0f32; 1 + N_FFT / (2 * HOP)];
    for t in 0..rises {
        for ((d, &next), &prev) in diff.iter_mut().zip(db.row(t + 1)).zip(db.row(t)) {
            *d = 0f32.max(next - prev);
        }
        envelope.push((f64::from(sum_bins(&diff, rises)) / N_MELS as f64) as f32);
    }
    envelope.truncate(frames);
    envelope
}

/// `compute_mfcc`: the first 20 coefficients of each frame's orthonormal DCT-II over the mel bands, `[frames, 20]`.
pub(super) fn mfcc(db: &Grid<f32>) -> Grid<f32> {
    let n = N_MELS;
    let basis: Vec<f64> = (0..N_MFCC)
        .flat_map(|k| {
            let scale = if k == 0 { (1.0 / n as f64).sqrt() } else { (2.0 / n as f64).sqrt() };
            (0..n).map(move |m| scale * (PI * (k * (2 * m + 1)) as f64 / (2 * n) as f64).cos())
        })
        .collect();
    let data = db
        .rows()
        .flat_map(|frame| {
            basis.chunks_exact(n).map(move |coefficients| {
                let sum: f64 =
                    coefficients.iter().zip(frame).map(|(&c, &v)| c * f64::from(v)).sum();
                sum as f32
            })
        })
        .collect();
    Grid { cols: N_MFCC, data }
}
