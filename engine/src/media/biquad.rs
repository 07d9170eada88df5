//! The tone controls of `AudioEqualizer3Band`: torchaudio's `bass_biquad`, `equalizer_biquad` and
//! `treble_biquad` (the Audio EQ Cookbook's low shelf, peaking and high shelf filters), run as its `lfilter`.
//!
//! Invariant: the coefficients are computed as torchaudio computes them for an f32 waveform, in f32, one rounding
//! per operation in its order, then divided by `a0` as its `lfilter` does; the filter runs in f32 (the feed-forward
//! sum, then the feedback terms oldest first) and clamps its output to [-1, 1] (`lfilter`'s `clamp=True`).

use std::f32::consts::LN_10;

/// A second-order IIR filter, normalised so that `a0` is 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Biquad {
    /// Feed-forward coefficients `b0, b1, b2`.
    b: [f32; 3],
    /// Feedback coefficients `a1, a2`.
    a: [f32; 2],
}

/// The shared terms of the shelving and peaking designs at `freq` Hz: `w0`, `sin(w0)` and the amplitude
/// `A = 10^(gain/40)`.
fn design(rate: u32, freq: f32, gain_db: f32) -> (f32, f32, f32) {
    let w0 = (2.0 * std::f64::consts::PI) as f32 * freq / rate as f32;
    let amplitude = (gain_db / 40.0 * LN_10).exp();
    (w0, w0.sin(), amplitude)
}

impl Biquad {
    /// The coefficients as torchaudio's `biquad` receives them, divided by `a0` as `lfilter` divides them.
    fn new([b0, b1, b2]: [f32; 3], [a0, a1, a2]: [f32; 3]) -> Biquad {
        Biquad { b: [b0 / a0, b1 / a0, b2 / a0], a: [a1 / a0, a2 / a0] }
    }

    /// torchaudio's `bass_biquad`: a low shelf of `gain_db` below `freq` Hz, quality `q`.
    pub fn bass(rate: u32, gain_db: f32, freq: f32, q: f32) -> Biquad {
        let (w0, sin, a) = design(rate, freq, gain_db);
        let alpha = sin / 2.0 / q;
        let temp1 = 2.0 * a.sqrt() * alpha;
        let temp2 = (a - 1.0) * w0.cos();
        let temp3 = (a + 1.0) * w0.cos();
        let b0 = a * ((a + 1.0) - temp2 + temp1);
        let b1 = 2.0 * a * ((a - 1.0) - temp3);
        let b2 = a * ((a + 1.0) - temp2 - temp1);
        let a0 = (a + 1.0) + temp2 + temp1;
        let a1 = -2.0 * ((a - 1.0) + temp3);
        let a2 = (a + 1.0) + temp2 - temp1;
        // torchaudio passes these already divided by a0, and a0 / a0 (exactly 1) as the new a0.
        Biquad::new([b0 / a0, b1 / a0, b2 / a0], [1.0, a1 / a0, a2 / a0])
    }

    /// torchaudio's `equalizer_biquad`: a peak of `gain_db` at `freq` Hz, quality `q`.
    pub fn peaking(rate: u32, gain_db: f32, freq: f32, q: f32) -> Biquad {
        let (w0, sin, a) = design(rate, freq, gain_db);
        let alpha = sin / 2.0 / q;
        let b0 = 1.0 + alpha * a;
        let b1 = -2.0 * w0.cos();
        let b2 = 1.0 - alpha * a;
        let a0 = 1.0 + alpha / a;
        let a1 = -2.0 * w0.cos();
        let a2 = 1.0 - alpha / a;
        Biquad::new([b0, b1, b2], [a0, a1, a2])
    }

    /// torchaudio's `treble_biquad`: a high shelf of `gain_db` above `freq` Hz, quality `q`.
    pub fn treble(rate: u32, gain_db: f32, freq: f32, q: f32) -> Biquad {
        let (w0, sin, a) = design(rate, freq, gain_db);
        let alpha = sin / 2.0 / q;
        let temp1 = 2.0 * a.sqrt() * alpha;
        let temp2 = (a - 1.0) * w0.cos();
        let temp3 = (a + 1.0) * w0.cos();
        let b0 = a * ((a + 1.0) + temp2 + temp1);
        let b1 = -2.0 * a * ((a - 1.0) + temp3);
        let b2 = a * ((a + 1.0) + temp2 - temp1);
        let a0 = (a + 1.0) - temp2 + temp1;
        let a1 = 2.0 * ((a - 1.0) - temp3);
        let a2 = (a + 1.0) - temp2 - temp1;
        Biquad::new([b0, b1, b2], [a0, a1, a2])
    }

    /// `x` filtered from rest (zero initial state), clamped to [-1, 1].
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let [b0, b1, b2] = self.b;
        let [a1, a2] = self.a;
        let mut out = Vec::with_capacity(x.len());
        let (mut x1, mut x2, mut y1, mut y2) = (0f32, 0f32, 0f32, 0f32);
        for &x0 in x {
            let y0 = (b2 * x2 + b1 * x1 + b0 * x0) - y2 * a2 - y1 * a1;
            out.push(y0);
            (x2, x1, y2, y1) = (x1, x0, y1, y0);
        }
        for y in &mut out {
            *y = y.clamp(-1.0, 1.0);
        }
        out
    }
}
