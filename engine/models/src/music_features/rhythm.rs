//! Tempo, onset peaks and beats: the autocorrelation tempogram with its prior, peak picking, the dynamic-
//! programming beat tracker and its trim.

use realfft::RealFftPlanner;
use realfft::num_complex::Complex;

use super::numpy::{
    Rfft, cabs64, hann, mean_f32, mean_f64, median_f64, next_fast_len, pairwise_sum,
};
use super::spectrum::{log_power, mel_spectrogram, onset_envelope};
use super::{DEFAULT_BPM, HOP, STD_BPM};

/// `quick_tempo_estimate`: the tempo of the clip `y` at `sr` Hz from its log-mel onset envelope (no dB floor), or
/// 120 for a clip shorter than ten hops.
pub(super) fn quick_tempo(y: &[f32], sr: f64) -> f64 {
    if y.len() < HOP * 10 {
        return DEFAULT_BPM;
    }
    let envelope = onset_envelope(&log_power(&mel_spectrogram(y, sr)));
    tempo_from_onset(&envelope, sr, DEFAULT_BPM)
}

/// `estimate_tempo_from_onset` (a log-normal prior of one octave around `start_bpm`, at most 320 bpm): the tempo
/// whose lag the mean autocorrelation tempogram over 8-second windows favours most; 120 under 20 frames.
pub(super) fn tempo_from_onset(envelope: &[f32], sr: f64, start_bpm: f64) -> f64 {
    let n = envelope.len();
    if n < 20 {
        return DEFAULT_BPM;
    }
    let lags = ((8.0 * sr / HOP as f64).round_ties_even() as usize).min(n);
    let strength = mean_tempogram(envelope, lags);
    let bpm =
        |lag: usize| if lag == 0 { f64::INFINITY } else { 60.0 * sr / (HOP as f64 * lag as f64) };
    // The lags before the first whose tempo is under 320 bpm are ruled out.
    let fastest = (0..lags).find(|&lag| bpm(lag) < 320.0).unwrap_or(0);
    let score = |lag: usize| {
        let octaves = (bpm(lag).log2() - start_bpm.log2()) / STD_BPM;
        let prior = if lag < fastest { f64::NEG_INFINITY } else { -0.5 * (octaves * octaves) };
        (1e6 * strength[lag]).ln_1p() + prior
    };
    let scores: Vec<f64> = (0..lags).map(score).collect();
    let best = (2..lags).fold(1, |best, lag| if scores[lag] > scores[best] { lag } else { best });
    bpm(best)
}

/// The autocorrelation tempogram's mean over frames, floored at 0: each frame's Hann-windowed `lags`-frame
/// window of the envelope (padded by linear ramps from 0), autocorrelated by FFT and scaled to a peak of 1.
pub(super) fn mean_tempogram(envelope: &[f32], lags: usize) -> Vec<f64> {
    let n = envelope.len();
    let padded = pad_linear_ramp(envelope, lags / 2);
    let window = hann(lags, true);
    let n_pad = next_fast_len(2 * lags - 1);
    let mut planner = RealFftPlanner::<f64>::new();
    let mut forward = Rfft::new(&mut planner, n_pad);
    let inverse = planner.plan_fft_inverse(n_pad);
    let (mut power, mut ac) = (inverse.make_input_vec(), inverse.make_output_vec());
    let mut column = |i: usize| -> Vec<f64> {
        let spectrum = forward.forward(|buf| {
            for (j, b) in buf[..lags].iter_mut().enumerate() {
                *b = f64::from(padded[i + j]) * window[j];
            }
        });
        for (p, &c) in power.iter_mut().zip(spectrum) {
            let magnitude = cabs64(c);
            *p = Complex::new(magnitude * magnitude, 0.0);
        }
        inverse.process(&mut power, &mut ac).expect("a real power spectrum in the plan's buffers");
        let scale = 1.0 / n_pad as f64;
        let column: Vec<f64> = ac[..lags].iter().map(|v| v * scale).collect();
        let peak = column.iter().fold(0f64, |m, v| m.max(v.abs()));
        if peak > 0.0 { column.iter().map(|v| v / peak).collect() } else { column }
    };
    let sums = pairwise_over_frames(0..n, lags, &mut column);
    sums.into_iter().map(|sum| (sum / n as f64).max(0.0)).collect()
}

/// numpy's pairwise sum along the frames of a `[lags, frames]` array whose columns `column` makes: the frames of
/// `range` split as numpy splits them, each leaf block (at most 128 frames) made in order and summed per lag, so
/// only one block is held at a time.
pub(super) fn pairwise_over_frames(
    range: std::ops::Range<usize>,
    lags: usize,
    column: &mut impl FnMut(usize) -> Vec<f64>,
) -> Vec<f64> {
    let n = range.len();
    if n <= 128 {
        let columns: Vec<Vec<f64>> = range.map(&mut *column).collect();
        return (0..lags)
            .map(|lag| pairwise_sum(&columns.iter().map(|c| c[lag]).collect::<Vec<f64>>()))
            .collect();
    }
    let half = n / 2 - (n / 2) % 8;
    let first = pairwise_over_frames(range.start..range.start + half, lags, column);
    let second = pairwise_over_frames(range.start + half..range.end, lags, column);
    first.iter().zip(&second).map(|(a, b)| a + b).collect()
}

/// numpy's `pad(x, pad, mode='linear_ramp')` to 0 at both ends, in f32: `i · (edge / pad)` rising to each edge.
pub(super) fn pad_linear_ramp(x: &[f32], pad: usize) -> Vec<f32> {
    let ramp = |edge: f32| -> Vec<f32> {
        let step = edge / pad as f32;
        (0..pad).map(|i| i as f32 * step).collect()
    };
    let (first, last) = (x.first().copied().unwrap_or(0.0), x.last().copied().unwrap_or(0.0));
    let mut padded = ramp(first);
    padded.extend_from_slice(x);
    padded.extend(ramp(last).into_iter().rev());
    padded
}

/// `detect_onset_peaks` with its defaults at `sr` Hz: frames of the min-max normalised envelope that are the
/// maximum of the frame before and themselves, and at least 0.07 above the mean of the 4 frames before to the 4
/// after; after a peak, the next frame is skipped.
pub(super) fn onset_peaks(envelope: &[f32], sr: f64) -> Vec<usize> {
    const DELTA: f32 = 0.07;
    let n = envelope.len();
    let min = envelope.iter().copied().fold(f32::INFINITY, f32::min);
    let mut x: Vec<f32> = envelope.iter().map(|&v| v - min).collect();
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max > 0.0 {
        x.iter_mut().for_each(|v| *v /= max);
    }
    let frames = |seconds: f64| (seconds * sr / HOP as f64) as usize;
    let (pre_max, post_max, pre_avg, post_avg, wait) =
        (frames(0.03), frames(0.0) + 1, frames(0.10), frames(0.10) + 1, frames(0.03));
    let window_max =
        |lo: usize, hi: usize| x[lo..hi].iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut peaks = Vec::new();
    let first =
        x[0] >= window_max(0, post_max.min(n)) && x[0] >= mean_f32(&x[..post_avg.min(n)]) + DELTA;
    let mut i = if first {
        peaks.push(0);
        wait + 1
    } else {
        1
    };
    while i < n {
        let is_max = x[i] == window_max(i.saturating_sub(pre_max), (i + post_max).min(n));
        if !is_max || x[i] < mean_f32(&x[i.saturating_sub(pre_avg)..(i + post_avg).min(n)]) + DELTA
        {
            i += 1;
            continue;
        }
        peaks.push(i);
        i += wait + 1;
    }
    peaks
}

/// The envelope divided by its sample standard deviation (numpy's `std(ddof=1)` in f32), unless that is 0.
pub(super) fn normalise_by_std(envelope: &[f32]) -> Vec<f32> {
    let mean = mean_f32(envelope);
    let squares: Vec<f32> = envelope.iter().map(|&v| (v - mean) * (v - mean)).collect();
    let var = (f64::from(pairwise_sum(&squares)) / (envelope.len() - 1) as f64) as f32;
    let std = var.sqrt();
    if std > 0.0 { envelope.iter().map(|&v| v / std).collect() } else { envelope.to_vec() }
}

/// `track_beats` with a tightness of 100 and trimming: dynamic-programming beats at `tempo` on the envelope.
pub(super) fn track_beats(envelope: &[f32], tempo: f64, sr: f64) -> Vec<usize> {
    let per_beat = (sr / HOP as f64 * 60.0 / tempo).round_ties_even();
    if per_beat <= 0.0 || envelope.len() < 2 {
        return Vec::new();
    }
    let onset: Vec<f64> = normalise_by_std(envelope).into_iter().map(f64::from).collect();
    let reach = per_beat as usize;
    let window: Vec<f64> = (0..=2 * reach)
        .map(|k| {
            let u = (k as f64 - per_beat) * 32.0 / per_beat;
            (-0.5 * (u * u)).exp()
        })
        .collect();
    let local = convolve_same(&onset, &window);
    let (cumulative, backlink) = beat_scores(&local, reach);
    let mut beats = vec![false; local.len()];
    let mut at = last_beat(&cumulative);
    while let Some(t) = at {
        if beats[t] {
            break;
        }
        beats[t] = true;
        at = backlink[t];
    }
    trim_beats(&mut beats, &local);
    beats.iter().enumerate().filter(|&(_, &b)| b).map(|(t, _)| t).collect()
}

/// numpy's `convolve(a, w, 'same')` for an odd-length `w` (scipy's `convolve` picks numpy's direct sum for
/// envelopes under about 75 000 frames), summed in order.
pub(super) fn convolve_same(a: &[f64], w: &[f64]) -> Vec<f64> {
    let centre = (w.len() - 1) / 2;
    (0..a.len())
        .map(|i| {
            let first = (i + centre).saturating_sub(w.len() - 1);
            let last = (i + centre).min(a.len() - 1);
            (first..=last).map(|j| a[j] * w[i + centre - j]).fold(0.0, |s, v| s + v)
        })
        .collect()
}

/// The beat tracker's cumulative scores and back-links: each frame's local score plus the best of the frames half
/// a beat to two beats before it, penalised by the squared log ratio of the gap to the beat; frames before the
/// first one scoring 1% of the maximum link nowhere.
pub(super) fn beat_scores(local: &[f64], per_beat: usize) -> (Vec<f64>, Vec<Option<usize>>) {
    let n = local.len();
    let threshold = 0.01 * local.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let nearest = (per_beat as f64 / 2.0).round_ties_even() as usize;
    let log_beat = (per_beat as f64).ln();
    let mut cumulative = vec![0f64; n];
    let mut backlink = vec![None; n];
    cumulative[0] = local[0];
    let mut before_first = true;
    for i in 1..n {
        // From half a beat back to two beats back, nearest first; the first of equal scores wins.
        let (mut best, mut best_score) = (None, f64::NEG_INFINITY);
        if let Some(nearest) = i.checked_sub(nearest) {
            for loc in (i.saturating_sub(2 * per_beat)..=nearest).rev() {
                let gap = ((i - loc) as f64).ln() - log_beat;
                let score = cumulative[loc] - 100.0 * (gap * gap);
                if score > best_score {
                    (best, best_score) = (Some(loc), score);
                }
            }
        }
        cumulative[i] = if best.is_some() { local[i] + best_score } else { local[i] };
        if before_first && local[i] < threshold {
            backlink[i] = None;
        } else {
            backlink[i] = best;
            before_first = false;
        }
    }
    (cumulative, backlink)
}

/// The frame the beats are traced back from: the last local maximum of the cumulative score at least half the
/// median local maximum (none if no maximum reaches it), or the last frame when there is no local maximum.
pub(super) fn last_beat(cumulative: &[f64]) -> Option<usize> {
    let n = cumulative.len();
    let is_max = |i: usize| {
        if i == 0 {
            false
        } else if i == n - 1 {
            cumulative[i] > cumulative[i - 1]
        } else {
            cumulative[i] > cumulative[i - 1] && cumulative[i] >= cumulative[i + 1]
        }
    };
    let mut maxima: Vec<f64> = (0..n).filter(|&i| is_max(i)).map(|i| cumulative[i]).collect();
    if maxima.is_empty() {
        return n.checked_sub(1);
    }
    let threshold = 0.5 * median_f64(&mut maxima);
    (0..n).rev().find(|&i| is_max(i) && cumulative[i] >= threshold)
}

/// Drops the beats in the leading and trailing frames whose local score is at most half the RMS of the beats'
/// local scores smoothed by a 5-point Hann window.
pub(super) fn trim_beats(beats: &mut [bool], local: &[f64]) {
    let scores: Vec<f64> = beats.iter().zip(local).filter(|&(&b, _)| b).map(|(_, &s)| s).collect();
    if scores.is_empty() {
        return;
    }
    // numpy's full convolution with hanning(5) = [0, ½, 1, ½, 0], kept from index 2 to the frame count + 2.
    let w = [0.0, 0.5, 1.0, 0.5, 0.0];
    let full: Vec<f64> = (0..scores.len() + w.len() - 1)
        .map(|k| {
            let first = k.saturating_sub(w.len() - 1);
            let last = k.min(scores.len() - 1);
            (first..=last).map(|j| scores[j] * w[k - j]).fold(0.0, |s, v| s + v)
        })
        .collect();
    let smooth = &full[2.min(full.len())..(local.len() + 2).min(full.len())];
    let squares: Vec<f64> = smooth.iter().map(|v| v * v).collect();
    let threshold = 0.5 * mean_f64(&squares).sqrt();
    for (beat, _) in beats.iter_mut().zip(local).take_while(|&(_, &s)| s <= threshold) {
        *beat = false;
    }
    for (beat, _) in beats.iter_mut().zip(local).rev().take_while(|&(_, &s)| s <= threshold) {
        *beat = false;
    }
}
