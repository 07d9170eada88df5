//! torchaudio's `functional.resample` with its defaults (`sinc_interp_hann`, a low-pass filter 6 zero crossings
//! wide, roll-off 0.99), which ComfyUI's audio encoders run before their models (`encode_audio`: to 16 kHz).
//!
//! The rates are reduced by their gcd to `orig` and `new`; output sample `m = f·new + j` is input frame
//! `f` (`orig` samples, the input zero-padded by `width` before and `width + orig` after) filtered by phase `j`'s
//! kernel, a Hann-windowed sinc at cut-off `0.99·min(orig, new)`; the output is cut to `⌈new·len / orig⌉`.
//!
//! Invariant: each kernel value is computed as torchaudio computes it for an f32 waveform, in f32, one rounding
//! per operation in its order (the kernel takes the waveform's dtype; in f64 its values differ by up to 1e-5
//! of the output). Only the taps where the filter's argument is clamped to ±6 zero crossings are left out:
//! torchaudio's value there is sinc(6π)·cos²(π/2) in f32, below 1e-20. The sums run in f64.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Zero crossings of the sinc on each side of the filter's centre (torchaudio's `lowpass_filter_width`).
const ZERO_CROSSINGS: u32 = 6;
/// The filter's cut-off as a fraction of the lower rate's Nyquist frequency (torchaudio's `rolloff`).
const ROLLOFF: f64 = 0.99;

/// A resampler between two integer rates, its kernels built once (torchaudio's `transforms.Resample`).
#[derive(Debug, Clone)]
pub struct Resampler {
    /// The input rate divided by the gcd of the rates.
    orig: usize,
    /// The output rate divided by the gcd.
    new: usize,
    /// Zero padding before the input (torchaudio's `width`).
    width: usize,
    /// Phase `j`'s kernel: its first kernel index and its taps from there (the unclamped part).
    phases: Vec<(usize, Vec<f32>)>,
}

impl Resampler {
    /// A resampler from `orig` Hz to `new` Hz; equal rates give the identity. A zero rate is
    /// [`Error::Invalid`].
    pub fn new(orig: u32, new: u32) -> Result<Resampler> {
        if orig == 0 || new == 0 {
            return Err(Error::Invalid(format!(
                "resampling needs positive rates, got {orig} Hz to {new} Hz"
            )));
        }
        let g = gcd(orig, new);
        let (orig, new) = ((orig / g) as usize, (new / g) as usize);
        if orig == new {
            return Ok(Resampler { orig, new, width: 0, phases: Vec::new() });
        }
        let base = orig.min(new) as f64 * ROLLOFF;
        let lw = f64::from(ZERO_CROSSINGS);
        let width = ((u64::from(ZERO_CROSSINGS) * orig as u64) as f64 / base).ceil() as usize;
        let taps = 2 * width + orig;
        // torchaudio's scalars, as its f32 tensor ops round them.
        let (base32, scale32, lw32) = (base as f32, (base / orig as f64) as f32, lw as f32);
        let (orig32, new32) = (orig as f32, new as f32);
        let pi = std::f32::consts::PI;
        let phases = (0..new)
            .map(|j| {
                // The taps where |t| < 6, with a margin: t = ((k − width)/orig − j/new)·base.
                let centre = width as f64 + orig as f64 * j as f64 / new as f64;
                let reach = lw * orig as f64 / base;
                let lo = (centre - reach).floor().max(2.0) as usize - 2;
                let hi = ((centre + reach).ceil() as usize + 3).min(taps);
                let row = (lo..hi)
                    .map(|k| {
                        let idx = (k as f32 - width as f32) / orig32;
                        let t = ((-(j as f32)) / new32 + idx) * base32;
                        let t = t.clamp(-lw32, lw32);
                        let window = (t * pi / lw32 / 2.0).cos();
                        let window = window * window;
                        let t = t * pi;
                        let sinc = if t == 0.0 { 1.0 } else { t.sin() / t };
                        sinc * (window * scale32)
                    })
                    .collect();
                (lo, row)
            })
            .collect();
        Ok(Resampler { orig, new, width, phases })
    }

    /// How many samples `len` input samples become: `⌈new·len / orig⌉` (`len` for the identity).
    pub fn output_len(&self, len: usize) -> usize {
        ((self.new as u128 * len as u128).div_ceil(self.orig as u128)) as usize
    }

    /// One channel `x` resampled (a copy of it for the identity).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        if self.phases.is_empty() {
            return x.to_vec();
        }
        let mut out = vec![0f32; self.output_len(x.len())];
        out.par_chunks_mut(4096).enumerate().for_each(|(chunk, values)| {
            for (i, y) in values.iter_mut().enumerate() {
                let m = chunk * 4096 + i;
                let (frame, j) = (m / self.new, m % self.new);
                let (lo, taps) = &self.phases[j];
                // Kernel index k reads input sample frame·orig + k − width.
                let first = frame * self.orig + lo;
                let sum: f64 = taps
                    .iter()
                    .enumerate()
                    .filter_map(|(k, &w)| {
                        let at = (first + k).checked_sub(self.width)?;
                        x.get(at).map(|&v| f64::from(v) * f64::from(w))
                    })
                    .sum();
                *y = sum as f32;
            }
        });
        out
    }
}

/// `x` (one channel) resampled from `orig` Hz to `new` Hz as torchaudio's `functional.resample` with its
/// defaults; equal rates return `x` unchanged.
pub fn resample(x: &[f32], orig: u32, new: u32) -> Result<Vec<f32>> {
    Ok(Resampler::new(orig, new)?.apply(x))
}

/// Every channel of `audio` `[B, C, T]` (row-major) resampled from `orig` Hz to `new` Hz as [`resample`] does
/// one: the values `[B, C, T']` and T' (what ComfyUI's audio encoders do first).
pub fn resample_clips(
    audio: &[f32],
    shape: [usize; 3],
    orig: u32,
    new: u32,
) -> Result<(Vec<f32>, usize)> {
    let [batch, channels, samples] = shape;
    if audio.len() != batch * channels * samples {
        return Err(Error::Invalid(format!(
            "audio of shape {shape:?} has {} values, not {}",
            audio.len(),
            batch * channels * samples
        )));
    }
    let resampler = Resampler::new(orig, new)?;
    let len = resampler.output_len(samples);
    let mut out = Vec::with_capacity(batch * channels * len);
    for channel in audio.chunks_exact(samples.max(1)).take(batch * channels) {
        out.extend(resampler.apply(channel));
    }
    Ok((out, len))
}

/// The greatest common divisor.
fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_rates_are_the_identity() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        assert_eq!(resample(&x, 16000, 16000).unwrap(), x);
        let r = Resampler::new(22050, 22050).unwrap();
        assert_eq!(r.output_len(1234), 1234);
    }

    #[test]
    fn lengths_round_up_as_torchaudio() {
        // ⌈new·len / orig⌉ after dividing the rates by their gcd.
        for (orig, new, len, want) in [
            (24000, 16000, 31200, 20800),
            (44100, 16000, 4411, 1601),
            (8000, 16000, 1999, 3998),
            (16000, 997, 1601, 100),
            (16000, 44100, 1, 3),
            (44100, 16000, 0, 0),
        ] {
            let r = Resampler::new(orig, new).unwrap();
            assert_eq!(r.output_len(len), want, "{orig} → {new}");
            assert_eq!(r.apply(&vec![0.5; len]).len(), want, "{orig} → {new}");
        }
    }

    #[test]
    fn a_constant_stays_constant_away_from_the_edges() {
        // The kernels' taps sum to ≈ 1 (the low-pass filter's gain at DC, slightly below from the window).
        let y = resample(&[1.0; 4000], 48000, 16000).unwrap();
        for v in &y[100..y.len() - 100] {
            assert!((v - 1.0).abs() < 2e-3, "{v}");
        }
        assert!(resample(&[1.0], 0, 16000).is_err());
    }
}
