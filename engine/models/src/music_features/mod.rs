//! WanDancer's music features: the 35 values per video frame that ComfyUI's `WanDancerEncodeAudio` node computes
//! from a clip, the music the WanDancer DiT is conditioned on (`comfy_extras/nodes_wandancer.py` at 0f1fa67a: its
//! `execute` and the librosa-derived functions it calls).
//!
//! The node estimates a start tempo from the clip at its own rate (`quick_tempo_estimate`), resamples the clip to
//! 15360 Hz (30 frames a second of 512-sample hops) with torchaudio's defaults ([`Resampler`]), and then, telling
//! every function that the rate is 22050 Hz (the original pipeline's quirk, which ComfyUI keeps and so does Kiln),
//! computes a 128-band mel spectrogram and its dB, the onset envelope, 20 MFCCs, chroma CENS (a 7-octave CQT
//! with 36 bins an octave, each lower octave from a signal halved again, tuned by a piptrack estimate), the onset
//! peaks, the tempo and the beats. A frame's row is `[envelope, 20 MFCCs, 12 chroma, peak, beat]`.
//!
//! Invariant: each step keeps numpy's dtype (f32 or f64) and, where the result feeds a discrete decision (peak
//! picking, the tuning histogram, the CQT's sparsification, the chroma quantisation, the tempo's arg max, the beat
//! tracker), numpy's order of rounding: its pairwise sums, its means as `f32(f64(sum) / n)`, its complex absolute
//! value `max · √(fma(r, r, 1))`, the reciprocal its complex division multiplies by. FFTs and matrix products run
//! in f64 and are rounded to the f32 numpy keeps, so they differ from pocketfft's and BLAS's f32 by a rounding.
//! numpy's transcendental functions (SVML on AVX-512) and BLAS's f64 dot products may also round differently from
//! Rust's by an ulp; such a difference reaches a discrete decision only on a near tie. scipy computes the beat
//! tracker's convolution by FFT from about 75 000 frames (40 minutes) on; Kiln keeps the direct sum throughout.

mod chroma;
mod numpy;
mod rhythm;
mod spectrum;

use crate::error::{Error, Result};
use crate::resample::Resampler;
use chroma::chroma_cens;
use rhythm::{onset_peaks, quick_tempo, tempo_from_onset, track_beats};
use spectrum::{mel_spectrogram, mfcc, onset_envelope, power_to_db};

/// Values per frame: the onset envelope, 20 MFCCs, 12 chroma CENS, the onset-peak and beat one-hots.
pub const FEATURES: usize = 35;
/// The rate the node resamples the clip to before its features: 30 frames a second of 512-sample hops.
pub const FEATURE_RATE: u32 = 15360;

/// The rate every feature function is told the 15360 Hz samples have.
const MODEL_SR: f64 = 22050.0;
/// Samples between frames.
const HOP: usize = 512;
/// The STFT's length (mel spectrogram and piptrack).
const N_FFT: usize = 2048;
const N_MELS: usize = 128;
const N_MFCC: usize = 20;
const N_CHROMA: usize = 12;
const BINS_PER_OCTAVE: usize = 36;
const N_OCTAVES: usize = 7;
const CQT_BINS: usize = N_OCTAVES * BINS_PER_OCTAVE;
/// C1, the CQT's lowest note, in Hz.
const FMIN: f64 = 32.70319566257483;
/// The tempo every estimate is drawn towards, and the one a clip too short to estimate gets.
const DEFAULT_BPM: f64 = 120.0;
/// The floor of a power spectrum before its logarithm.
const AMIN: f32 = 1e-10;
/// The lowest rate whose 8-second tempo window spans two hops (`round(8·rate/512) ≥ 2`); below it ComfyUI's
/// `quick_tempo_estimate` fails on any clip of 20 frames or more.
const MIN_RATE: u32 = 96;
/// The width of the tempo prior, in octaves.
const STD_BPM: f64 = 1.0;

/// Where each feature starts in a frame's row.
const MFCC_AT: usize = 1;
const CHROMA_AT: usize = MFCC_AT + N_MFCC;
const PEAK_AT: usize = CHROMA_AT + N_CHROMA;
const BEAT_AT: usize = PEAK_AT + 1;

/// The 35 music features per frame of WanDancerEncodeAudio (its `audio_feature` without the batch dimension),
/// with the tempi and frames found on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct MusicFeatures {
    /// Frames: `1 + samples / 512` of the clip at 15360 Hz, 30 a second.
    pub frames: usize,
    /// `[frames, FEATURES]`, row-major: the onset envelope, 20 MFCCs, 12 chroma CENS, 1 at an onset peak and 1
    /// at a beat.
    pub values: Vec<f32>,
    /// The tempo estimated from the clip at its own rate (beats a minute): the beat tracker's prior.
    pub start_bpm: f64,
    /// The tempo the beat tracker follows, estimated from the onset envelope.
    pub tempo: f64,
    /// The frames of the onset peaks.
    pub peaks: Vec<usize>,
    /// The frames of the beats.
    pub beats: Vec<usize>,
}

/// WanDancerEncodeAudio's features of a mono clip (ComfyUI averages a clip's channels first) at `sample_rate`
/// Hz. An empty clip has one frame (ComfyUI pads it as any other); a sample that is not finite or a rate under
/// 96 Hz is [`Error::Invalid`].
pub fn music_features(mono: &[f32], sample_rate: u32) -> Result<MusicFeatures> {
    check_clip(mono, sample_rate)?;
    let start_bpm = quick_tempo(mono, f64::from(sample_rate));
    let y = Resampler::new(sample_rate, FEATURE_RATE)?.apply(mono);
    let db = power_to_db(&mel_spectrogram(&y, MODEL_SR));
    let envelope = onset_envelope(&db);
    let mfcc = mfcc(&db);
    let chroma = chroma_cens(&y, MODEL_SR);
    let peaks = onset_peaks(&envelope, MODEL_SR);
    let tempo = tempo_from_onset(&envelope, MODEL_SR, start_bpm);
    let beats = track_beats(&envelope, tempo, MODEL_SR);

    let frames = envelope.len();
    let mut values = vec![0f32; frames * FEATURES];
    for (t, row) in values.chunks_exact_mut(FEATURES).enumerate() {
        row[0] = envelope[t];
        row[MFCC_AT..CHROMA_AT].copy_from_slice(mfcc.row(t));
        row[CHROMA_AT..PEAK_AT].copy_from_slice(chroma.row(t));
    }
    for &t in &peaks {
        values[t * FEATURES + PEAK_AT] = 1.0;
    }
    for &t in &beats {
        values[t * FEATURES + BEAT_AT] = 1.0;
    }
    Ok(MusicFeatures { frames, values, start_bpm, tempo, peaks, beats })
}

/// The start tempo WanDancerEncodeAudio estimates from a mono clip at `sample_rate` Hz, before resampling it
/// (`quick_tempo_estimate`): 120 for a clip shorter than ten hops.
pub fn start_bpm(mono: &[f32], sample_rate: u32) -> Result<f64> {
    check_clip(mono, sample_rate)?;
    Ok(quick_tempo(mono, f64::from(sample_rate)))
}

/// Refuses a clip the features cannot be computed from.
fn check_clip(mono: &[f32], sample_rate: u32) -> Result<()> {
    if sample_rate < MIN_RATE {
        return Err(Error::Invalid(format!(
            "music features need a sample rate of at least {MIN_RATE} Hz, got {sample_rate} Hz"
        )));
    }
    if let Some(at) = mono.iter().position(|v| !v.is_finite()) {
        return Err(Error::Invalid(format!(
            "music features need finite samples; sample {at} of the clip is {}",
            mono[at]
        )));
    }
    Ok(())
}
