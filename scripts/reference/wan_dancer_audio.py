"""Fixtures for Kiln's WanDancerEncodeAudio music features (engine/models/src/music_features.rs), in
engine/models/tests/fixtures/wan_dancer_audio/.

The reference is ComfyUI itself at 0f1fa67a: comfy_extras/nodes_wandancer.py's node and its librosa-derived
functions, imported from the checkout COMFYUI_DIR names (nothing of it is copied here). Beside the pins
requirements.txt lists it needs scipy==1.17.1 (and the extra pins comfy_sampling.py lists for ComfyUI's
imports).

Run from the repository root:
    COMFYUI_DIR=... target/reference-venv/bin/python scripts/reference/wan_dancer_audio.py

torchaudio is not in the reference venv, so the clips whose features are recorded are made at the node's own
feature rate, 15360 Hz (30 fps × 512-sample hops), where the node's `torchaudio.functional.resample` is the
identity (torchaudio returns the waveform unchanged when the rates are equal): the script gives ComfyUI's
stand-in torchaudio a `resample` that does just that, and refuses any other pair. The node then runs as it does
in a workflow: the start tempo from the clip at its rate, the mel spectrogram, onset envelope, MFCCs, chroma CENS,
onset peaks, tempo and beats, all with 22050 passed as the sample rate. For one stereo clip at another rate only
`quick_tempo_estimate`, which runs before the resampling, is recorded.

The clips are deterministic (numpy's PCG64 from fixed seeds) and stored as 16-bit PCM, so both sides read the
same samples (value / 32768 in f32): a click track (decaying noise bursts and a kick on each beat over chords
changing every two beats, a quiet noise floor), a swung one at another tempo, one shorter than ten hops, an
empty one (ComfyUI's functions pad it to one frame: a song's segment past its end is empty), and the stereo one
(the node averages the channels in f32).

Writes:
- clips.safetensors (I16): `<case>` [channels, samples].
- features.safetensors (f32): `<case>` [frames, 35], the node's `audio_feature` without its batch dimension
  (envelope, 20 MFCCs, 12 chroma CENS, the onset-peak and beat one-hots).
- cases.json: per case its rate, `start_bpm` (quick_tempo_estimate at the clip's rate), and for the feature cases
  `tempo` (estimate_tempo_from_onset on the envelope), `peaks` and `beats` (frame indices) and `frames`.
"""

import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/wan_dancer_audio"
FEATURE_RATE = 15360  # 30 fps × 512-sample hops, the node's resample target.
MODEL_SR, HOP, N_FFT = 22050, 512, 2048
CHORDS = ((220.0, 261.63, 329.63), (174.61, 220.0, 261.63), (261.63, 329.63, 392.0), (196.0, 246.94, 293.66))

# (case, rate, seconds or samples, bpm, swing, channels, seed, features recorded)
CASES = (
    ("click", FEATURE_RATE, 3.5, 120.0, 0.0, 1, 1, True),
    ("swing", FEATURE_RATE, 3.0, 96.0, 0.12, 1, 2, True),
    ("short", FEATURE_RATE, 4000, 120.0, 0.0, 1, 3, True),
    ("empty", FEATURE_RATE, 0, 120.0, 0.0, 1, 5, True),
    ("stereo_22050", 22050, 2.0, 140.0, 0.0, 2, 4, False),
)


def make_clip(rate, length, bpm, swing, channels, seed):
    """A [channels, samples] int16 clip: chords changing every two beats, a kick and a noise burst on each beat,
    a quieter burst on each (swung) off-beat, and a noise floor; `length` is seconds (float) or samples (int)."""
    rng = np.random.default_rng(seed)
    n = length if isinstance(length, int) else int(round(rate * length))
    t = np.arange(n) / rate
    beat = 60.0 / bpm
    out = np.zeros((channels, n))
    for c in range(channels):
        x = np.zeros(n)
        chord = (t // (2 * beat)).astype(int) % len(CHORDS)
        for k in range(3):
            freqs = np.array([CHORDS[i][k] for i in range(len(CHORDS))])[chord] * (1.0 + 0.003 * c)
            x += (0.12 / (k + 1)) * np.sin(2 * np.pi * freqs * t + 0.7 * k + c)
        for start, gain in ((0.0, 1.0), (0.5 + swing, 0.35)):
            onset = (t - start * beat) % beat
            active = t >= start * beat
            x += active * gain * 0.5 * np.sin(2 * np.pi * 55.0 * onset) * np.exp(-onset / 0.06)
            x += active * gain * 0.4 * rng.standard_normal(n) * np.exp(-onset / 0.01)
        x += 0.004 * rng.standard_normal(n)
        out[c] = x
    return np.clip(np.round(out * 32767.0), -32768, 32767).astype(np.int16)


def identity_resample(waveform, orig_freq, new_freq, *args, **kwargs):
    """torchaudio.functional.resample where the rates are equal (the only case recorded here)."""
    if orig_freq != new_freq:
        raise RuntimeError(f"torchaudio is not installed; cannot resample {orig_freq} Hz to {new_freq} Hz")
    return waveform


def node_intermediates(wd, mono):
    """The onset envelope and its peaks, computed as the node's execute computes them after the resampling."""
    mel = wd._compute_mel_spectrogram(mono, MODEL_SR, N_FFT, HOP, n_mels=128)
    mel_db = wd.power_to_db(mel, amin=1e-10, top_db=80.0, ref=1.0)
    envelope = wd.compute_onset_envelope(mel_db, N_FFT, HOP)
    peaks = wd.detect_onset_peaks(envelope, sr=MODEL_SR, hop_length=HOP)
    return envelope, peaks


def main():
    import_comfyui(node_modules=True)
    import torchaudio
    import torchaudio.functional

    if not hasattr(torchaudio.functional, "resample"):
        torchaudio.functional.resample = identity_resample
    import comfy_extras.nodes_wandancer as wd

    clips, features, cases = {}, {}, {}
    for case, rate, length, bpm, swing, channels, seed, record in CASES:
        pcm = make_clip(rate, length, bpm, swing, channels, seed)
        clips[case] = torch.from_numpy(pcm)
        waveform = torch.from_numpy(pcm.astype(np.float32) / np.float32(32768.0))
        mono = waveform.mean(dim=0) if channels > 1 else waveform[0]
        start_bpm = wd.quick_tempo_estimate(mono.numpy(), rate, hop_length=HOP)
        entry = {"rate": rate, "channels": channels, "start_bpm": float(start_bpm)}
        if record:
            audio = {"waveform": waveform.unsqueeze(0), "sample_rate": rate}
            # video_frames only sets the fps the node reports (it divides by zero when the clip has fewer than
            # half as many frames), so 1.
            result = wd.WanDancerEncodeAudio.execute(video_frames=1, audio_inject_scale=1.0, audio=audio)
            feature = result.args[0]["audio_feature"][0].float().contiguous()
            envelope, peaks = node_intermediates(wd, mono.numpy())
            tempo = wd.estimate_tempo_from_onset(envelope, sr=MODEL_SR, hop_length=HOP, start_bpm=start_bpm)
            beats = wd.track_beats(envelope, tempo, MODEL_SR, HOP, tightness=100, trim=True)
            # The one-hot columns the node wrote are the indices recorded here.
            assert np.flatnonzero(feature[:, 33].numpy()).tolist() == peaks.tolist()
            assert np.flatnonzero(feature[:, 34].numpy()).tolist() == beats.tolist()
            entry.update(tempo=float(tempo), peaks=peaks.tolist(), beats=beats.tolist(), frames=feature.shape[0])
            features[case] = feature
            print(f"{case}: {pcm.shape[1]} samples at {rate} Hz, start {start_bpm:.3f} bpm, tempo {tempo:.3f} "
                  f"bpm, {len(peaks)} peaks, {len(beats)} beats, features {tuple(feature.shape)}")
        else:
            print(f"{case}: {pcm.shape[1]} samples × {channels} at {rate} Hz, start {start_bpm:.3f} bpm")
        cases[case] = entry

    os.makedirs(OUT, exist_ok=True)
    save_file(clips, f"{OUT}/clips.safetensors")
    save_file(features, f"{OUT}/features.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
