//! ComfyUI's `WhisperFeatureExtractor` on the host: the channels averaged, each clip padded with zeros or cut
//! to 30 seconds at 16 kHz, torchaudio's `MelSpectrogram` (400-sample periodic Hann window, hop 160, centred
//! with reflect padding, power 2, slaney mel scale and area normalisation from 0 to 8 kHz), the last frame
//! dropped, then `log10(max(mel, 1e-10))` floored at the batch's maximum − 8 and mapped by `(x + 4) / 4`.
//!
//! The window and the filter bank are torch's f32 values (computed as torch computes them); the spectrogram is
//! a direct DFT in f64 (400 points; frames of silence are skipped), and the features are rounded to f32 once,
//! at the end. torch's STFT runs in f32, so the two agree to its rounding of the power spectrum: bands far
//! below the loudest (near the floor) differ by up to ~1e-5 of the features' range.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// The rate the features are computed at (audio is resampled to it first).
pub const SAMPLE_RATE: u32 = 16000;
/// Samples in one window: 30 seconds at 16 kHz (shorter clips are padded with zeros, longer ones cut).
pub const WINDOW_SAMPLES: usize = 480_000;
/// The STFT's frame and window length.
pub const N_FFT: usize = 400;
/// Samples between frames.
pub const HOP: usize = 160;
/// Mel frames per window (the centred STFT's 3001 frames, the last dropped).
pub const FRAMES: usize = WINDOW_SAMPLES / HOP;
/// Frequency bins of the one-sided spectrum.
const BINS: usize = N_FFT / 2 + 1;
/// The filter bank's upper edge (Hz).
const F_MAX: f64 = 8000.0;

/// Log-mel features `[B, mels, FRAMES]` of `audio` `[B, C, T]` (row-major, at [`SAMPLE_RATE`]), as ComfyUI's
/// Whisper feature extractor gives them. The floor (maximum − 8 in log10) is taken over the whole batch, as
/// ComfyUI does.
pub fn log_mel(audio: &[f32], shape: [usize; 3], mels: usize) -> Result<Vec<f32>> {
    let [batch, channels, samples] = shape;
    if batch == 0 || channels == 0 || mels == 0 || audio.len() != batch * channels * samples {
        return Err(Error::Invalid(format!(
            "Whisper's features take audio [B, C, T] with B, C ≥ 1 into ≥ 1 mel bands, got {} values for \
             {shape:?} and {mels} bands",
            audio.len()
        )));
    }
    let filters = mel_filters(mels);
    let window = hann_window();
    let (cos, sin) = dft_basis();
    let mut logs = Vec::with_capacity(batch * mels * FRAMES);
    for item in audio.chunks_exact(channels * samples) {
        let padded = reflect_padded(&mono(item, channels, samples));
        // [frame][mel]
        let frames: Vec<Vec<f64>> = (0..FRAMES)
            .into_par_iter()
            .map(|f| {
                let frame = &padded[f * HOP..f * HOP + N_FFT];
                if frame.iter().all(|&v| v == 0.0) {
                    return vec![0.0; mels];
                }
                let x: Vec<f64> = frame.iter().zip(&window).map(|(v, w)| v * w).collect();
                let power: Vec<f64> = (0..BINS)
                    .map(|k| {
                        let row = k * N_FFT..(k + 1) * N_FFT;
                        let re: f64 = x.iter().zip(&cos[row.clone()]).map(|(a, b)| a * b).sum();
                        let im: f64 = x.iter().zip(&sin[row]).map(|(a, b)| a * b).sum();
                        re * re + im * im
                    })
                    .collect();
                (0..mels)
                    .map(|m| (0..BINS).map(|k| filters[k * mels + m] * power[k]).sum())
                    .collect()
            })
            .collect();
        for m in 0..mels {
            logs.extend(frames.iter().map(|mel| mel[m].max(1e-10).log10()));
        }
    }
    let floor = logs.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b)) - 8.0;
    Ok(logs.into_iter().map(|v| ((v.max(floor) + 4.0) / 4.0) as f32).collect())
}

/// The mean over channels of one clip `[C, T]`, rounded to f32 as torch's mean is, then padded with zeros or
/// cut to [`WINDOW_SAMPLES`].
fn mono(item: &[f32], channels: usize, samples: usize) -> Vec<f64> {
    let mut out = vec![0f64; WINDOW_SAMPLES];
    for (n, v) in out.iter_mut().enumerate().take(samples) {
        let sum: f64 = (0..channels).map(|c| f64::from(item[c * samples + n])).sum();
        *v = f64::from((sum / channels as f64) as f32);
    }
    out
}

/// `x` with `N_FFT / 2` samples mirrored on each side (torch's reflect padding: the edge sample not repeated).
fn reflect_padded(x: &[f64]) -> Vec<f64> {
    let (pad, n) = (N_FFT / 2, x.len());
    let mut out = Vec::with_capacity(n + 2 * pad);
    out.extend((1..=pad).rev().map(|i| x[i]));
    out.extend_from_slice(x);
    out.extend((1..=pad).map(|i| x[n - 1 - i]));
    out
}

/// The DFT's cosines and sines `[BINS][N_FFT]`: `cos(2π·k·n / N_FFT)`, `sin(..)` (the angle reduced mod 2π
/// exactly first).
fn dft_basis() -> (Vec<f64>, Vec<f64>) {
    let angle =
        |k: usize, n: usize| 2.0 * std::f64::consts::PI * ((k * n) % N_FFT) as f64 / N_FFT as f64;
    let cos = (0..BINS).flat_map(|k| (0..N_FFT).map(move |n| angle(k, n).cos())).collect();
    let sin = (0..BINS).flat_map(|k| (0..N_FFT).map(move |n| angle(k, n).sin())).collect();
    (cos, sin)
}

/// torchaudio's `melscale_fbanks(201, 0, 8000, mels, 16000, norm="slaney", mel_scale="slaney")` `[BINS][mels]`:
/// triangles between `mels + 2` points evenly spaced on the slaney mel scale (linear below 1 kHz, logarithmic
/// above), each scaled by 2 / its width in Hz. Computed as torch does for the f32 module ComfyUI builds: its
/// `linspace`, then one f32 rounding per operation (the Python constants rounded to f32 where they meet a
/// tensor); a filter's feet sit close to bins, where the f32 rounding of a point moves a weight's value.
fn mel_filters(mels: usize) -> Vec<f64> {
    // `_hz_to_mel(8000, "slaney")` in Python's doubles.
    let f_sp = 200.0 / 3.0;
    let min_log_mel = 1000.0 / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    let top = min_log_mel + (F_MAX / 1000.0).ln() / logstep;
    let steps = mels + 2;
    let points: Vec<f32> = crate::rope::linspace(0.0, top as f32, steps)
        .map(|mel| {
            if mel >= min_log_mel as f32 {
                // `min_log_hz * torch.exp(logstep * (mels - min_log_mel))`; torch's f32 exp rounds as a
                // correctly rounded one does here.
                let e = (f64::from(logstep as f32 * (mel - min_log_mel as f32))).exp() as f32;
                1000.0 * e
            } else {
                0.0 + f_sp as f32 * mel
            }
        })
        .collect();
    let freqs: Vec<f32> = crate::rope::linspace(0.0, (SAMPLE_RATE / 2) as f32, BINS).collect();
    let mut out = vec![0f64; BINS * mels];
    for (k, &freq) in freqs.iter().enumerate() {
        for m in 0..mels {
            let down = -(points[m] - freq) / (points[m + 1] - points[m]);
            let up = (points[m + 2] - freq) / (points[m + 2] - points[m + 1]);
            let norm = 2.0 / (points[m + 2] - points[m]);
            out[k * mels + m] = f64::from(0f32.max(down.min(up)) * norm);
        }
    }
    out
}

/// torch's `hann_window(N_FFT)` (periodic) in f32: `0.5 − 0.5·cos(n · 2π/N)`, each operation rounded to f32.
fn hann_window() -> Vec<f64> {
    let step = (2.0 * std::f64::consts::PI / N_FFT as f64) as f32;
    (0..N_FFT)
        .map(|n| {
            let c = (f64::from(n as f32 * step)).cos() as f32;
            f64::from(c * -0.5 + 0.5)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_the_floor() {
        // All zeros: log10(1e-10) = −10 everywhere, so the floor (−18) never applies: (−10 + 4) / 4.
        let f = log_mel(&[0.0; 10], [1, 2, 5], 8).unwrap();
        assert_eq!(f.len(), 8 * FRAMES);
        assert!(f.iter().all(|&v| v == -1.5));
        assert!(log_mel(&[0.0; 9], [1, 2, 5], 8).is_err());
    }

    #[test]
    fn the_filter_bank_covers_the_band() {
        // Slaney normalisation: each triangle's area is 1 (in Hz), so Σ_k weight·40 Hz ≈ 1 away from the edges.
        let mels = 128;
        let fb = mel_filters(mels);
        for m in 60..mels - 1 {
            let area: f64 = (0..BINS).map(|k| fb[k * mels + m] * 40.0).sum();
            assert!((area - 1.0).abs() < 0.1, "band {m}: {area}");
        }
    }
}
