"""Fixtures for the audio nodes that mix, split, join, filter and resample clips (engine/src/nodes/builtin/
audio_mix.rs, audio.rs's AudioConcat): ComfyUI's own nodes at 0f1fa67a (comfy_extras/nodes_audio.py), whose
filters and resampling are torchaudio's.

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py; needs torchaudio 2.11.1 and av, which
nodes_audio imports):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/audio_nodes.py

The clips are audio_clips.clip's tones, chirps and noise, stored as f32 `[1, channels, samples]` (the waveform of
an AUDIO), each beside its rate. Writes engine/tests/fixtures/audio_nodes/io.safetensors and cases.json:
- `eq.in` (stereo, 22050 Hz) through AudioEqualizer3Band with all three bands (`eq.all`) and the mid band alone
  at a narrow Q (`eq.mid`), the inputs in cases.json;
- `merge.a` (stereo, 16000 Hz) and `merge.b` (mono, 8000 Hz: resampled, padded, broadcast) through AudioMerge with
  each method (`merge.<method>`), and `merge.loud` (`merge.a` at 3x) added to `merge.b`, scaled back under 1
  (`merge.loud_add`);
- `join.left` (mono, 16000 Hz) and `join.right` (mono, 12000 Hz: resampled up, the longer one cut) through
  JoinAudioChannels (`join.out`);
- `concat.a` (mono, 16000 Hz: made stereo, resampled up) and `concat.b` (stereo, 22050 Hz) through AudioConcat
  after (`concat.out`);
- `merge.a` through AudioAdjustVolume at -7 dB (`volume.out`).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from audio_clips import clip  # noqa: E402
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/audio_nodes"


def audio(waveform, rate):
    return {"waveform": waveform, "sample_rate": rate}


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_audio import (AudioAdjustVolume, AudioConcat, AudioEqualizer3Band, AudioMerge,
                                          JoinAudioChannels)

    g = torch.Generator().manual_seed(2026)
    io, rates, cases = {}, {}, {}

    def put(name, a):
        io[name] = a["waveform"].contiguous()
        rates[name] = a["sample_rate"]

    eq_in = audio(clip(2, 2205, 22050, g, gain=0.6).unsqueeze(0), 22050)
    put("eq.in", eq_in)
    cases["eq.all"] = dict(low_gain_dB=6.0, low_freq=120, mid_gain_dB=-4.5, mid_freq=1500, mid_q=1.5,
                           high_gain_dB=3.0, high_freq=6000)
    cases["eq.mid"] = dict(low_gain_dB=0.0, low_freq=100, mid_gain_dB=9.0, mid_freq=800, mid_q=4.0,
                           high_gain_dB=0.0, high_freq=5000)
    for name in ["eq.all", "eq.mid"]:
        put(name, AudioEqualizer3Band.execute(eq_in, **cases[name]).result[0])

    a = audio(clip(2, 1000, 16000, g, gain=0.5).unsqueeze(0), 16000)
    b = audio(clip(1, 300, 8000, g, gain=0.4).unsqueeze(0), 8000)
    put("merge.a", a)
    put("merge.b", b)
    for method in ["add", "mean", "subtract", "multiply"]:
        put(f"merge.{method}", AudioMerge.execute(a, b, method).result[0])
    loud = audio(a["waveform"] * 3, 16000)
    put("merge.loud", loud)
    put("merge.loud_add", AudioMerge.execute(loud, b, "add").result[0])

    left = audio(clip(1, 800, 16000, g).unsqueeze(0), 16000)
    right = audio(clip(1, 500, 12000, g).unsqueeze(0), 12000)
    put("join.left", left)
    put("join.right", right)
    put("join.out", JoinAudioChannels.execute(left, right).result[0])

    ca = audio(clip(1, 400, 16000, g).unsqueeze(0), 16000)
    cb = audio(clip(2, 300, 22050, g).unsqueeze(0), 22050)
    put("concat.a", ca)
    put("concat.b", cb)
    put("concat.out", AudioConcat.execute(ca, cb, "after").result[0])

    put("volume.out", AudioAdjustVolume.execute(a, -7).result[0])

    os.makedirs(OUT, exist_ok=True)
    save_file(io, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({"rates": rates, "eq": cases}, f, indent=1, sort_keys=True)
        f.write("\n")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
