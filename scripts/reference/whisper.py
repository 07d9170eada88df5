"""Fixtures for Kiln's Whisper large-v3 audio encoder (ComfyUI's AudioEncoderLoader / AudioEncoderEncode with a
whisper file) and torchaudio's resampler, in engine/models/tests/fixtures/whisper/.

Needs `torchaudio==2.11.1` beside the pins requirements.txt and comfy_sampling.py list.

Run from the repository root:
    COMFYUI_DIR=... target/reference-venv/bin/python scripts/reference/whisper.py

The reference is ComfyUI itself at 0f1fa67a: comfy/audio_encoders/whisper.py's WhisperLargeV3 (its feature
extractor, torchaudio's MelSpectrogram, and the encoder) built with tiny dims (width 80 so its hard-coded 20
heads divide it, 3 layers, 128 mels, 1500 positions), loaded as comfy/audio_encoders/audio_encoders.py's
`load_audio_encoder_from_sd` does (the `model.` prefix stripped, strict=False), and run as its `encode_audio`
does: `torchaudio.functional.resample(audio, rate, 16000)`, then the model, in f32. (`load_audio_encoder_from_sd`
itself builds the released 1280-wide, 32-layer model whatever the file holds, so the tiny one is built directly.)

Writes:
- weights.safetensors (f32): the encoder under the released file's names (`model.encoder.*`); weights
  N(0, 1) / sqrt(fan-in), biases 0.05 N, LayerNorm gains 1 + 0.1 N and biases 0.05 N, positions 0.3 N.
- io.safetensors (f32):
  `audio` [1, 2, 31200]: a 1.3 s stereo clip at 24000 Hz (tones, a chirp and a little noise, within [-1, 1]);
  `resampled` [1, 2, 20800]: torchaudio's resample to 16000 Hz;
  `features` [1, 128, 256]: the feature extractor's first 256 frames (of 3000), and `features_floor` [1]: the
  value of every later frame (the zero padding after the clip, floored at max - 8: (max - 4) / 4);
  `state.<i>` [1, 1500, 80] for i in 0..=3: ComfyUI's tuple of every layer's input, then the final normed output
  (its last hidden state, `encoded_audio`, is `state.3`);
  `batch.audio` [2, 1, 8000] (16 kHz, a loud and a quiet clip), `batch.features` [2, 128, 64] and
  `batch.features_floor` [1]: the feature extractor on a batch (the floor is max - 8 over the whole batch);
  `resample.<from>_<to>.in` [2, N] and `.out`: torchaudio's resample for other rate pairs.
"""

import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from audio_clips import clip  # noqa: E402

OUT = "engine/models/tests/fixtures/whisper"
WIDTH, LAYERS, MELS, CTX = 80, 3, 128, 1500
RATE = 24000
HEAD_FRAMES = 256
# Rate pairs beyond the clip's 24000 -> 16000, with input lengths (odd ones, so the output length rounds up).
RESAMPLES = [(44100, 16000, 4411), (8000, 16000, 1999), (22050, 16000, 2205), (48000, 16000, 4801),
             (16000, 44100, 1601), (997, 16000, 101), (16000, 997, 1601), (16000, 16000, 333)]


def weights(g):
    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g)

    sd = {
        "conv1.weight": randn(WIDTH, MELS, 3) / math.sqrt(3 * MELS),
        "conv1.bias": randn(WIDTH, scale=0.05),
        "conv2.weight": randn(WIDTH, WIDTH, 3) / math.sqrt(3 * WIDTH),
        "conv2.bias": randn(WIDTH, scale=0.05),
        "embed_positions.weight": randn(CTX, WIDTH, scale=0.3),
        "layer_norm.weight": 1 + randn(WIDTH, scale=0.1),
        "layer_norm.bias": randn(WIDTH, scale=0.05),
    }
    for i in range(LAYERS):
        p = f"layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            sd[f"{p}self_attn.{name}.weight"] = randn(WIDTH, WIDTH) / math.sqrt(WIDTH)
            if name != "k_proj":
                sd[f"{p}self_attn.{name}.bias"] = randn(WIDTH, scale=0.05)
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            sd[f"{p}{norm}.weight"] = 1 + randn(WIDTH, scale=0.1)
            sd[f"{p}{norm}.bias"] = randn(WIDTH, scale=0.05)
        sd[f"{p}fc1.weight"] = randn(4 * WIDTH, WIDTH) / math.sqrt(WIDTH)
        sd[f"{p}fc1.bias"] = randn(4 * WIDTH, scale=0.05)
        sd[f"{p}fc2.weight"] = randn(WIDTH, 4 * WIDTH) / math.sqrt(4 * WIDTH)
        sd[f"{p}fc2.bias"] = randn(WIDTH, scale=0.05)
    return {f"model.encoder.{k}": v.float().contiguous() for k, v in sd.items()}


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def main():
    import_comfyui()
    import comfy.ops
    import comfy.utils
    import torchaudio
    from comfy.audio_encoders.whisper import WhisperLargeV3

    assert torchaudio.__version__.startswith("2.11.1"), torchaudio.__version__
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(17)
    sd = weights(g)
    save_file(sd, f"{OUT}/weights.safetensors")

    model = WhisperLargeV3(n_mels=MELS, n_audio_ctx=CTX, n_audio_state=WIDTH, n_audio_head=20,
                           n_audio_layer=LAYERS, dtype=torch.float32, device="cpu",
                           operations=comfy.ops.manual_cast).eval()
    # load_audio_encoder_from_sd: the `model.` prefix stripped, loaded with strict=False.
    loaded = comfy.utils.state_dict_prefix_replace(dict(sd), {"model.": ""})
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    assert not unexpected and all(k.startswith("feature_extractor.") for k in missing), (missing, unexpected)

    io = {"audio": clip(2, int(1.3 * RATE), RATE, g)[None]}
    with torch.no_grad():
        # encode_audio: resample to 16 kHz, then the model.
        io["resampled"] = torchaudio.functional.resample(io["audio"], RATE, 16000)
        features = model.feature_extractor(io["resampled"])
        last, states = model(io["resampled"])
        direct = model.encoder(features)[0]
    assert features.shape == (1, MELS, 3000) and last.shape == (1, CTX, WIDTH), (features.shape, last.shape)
    assert torch.equal(last, states[-1]) and len(states) == LAYERS + 1 and torch.equal(direct, last)
    floor = features[:, :, HEAD_FRAMES:]
    assert bool((floor == floor.flatten()[0]).all()), "the frames after the clip are not all the floor"
    io["features"] = features[:, :, :HEAD_FRAMES]
    io["features_floor"] = floor.flatten()[:1]
    for i, s in enumerate(states):
        io[f"state.{i}"] = s
    print("features", float(features.min()), float(features.max()), "floor", float(floor.flatten()[0]))
    print("last", float(last.abs().max()), "resampled", tuple(io["resampled"].shape))

    loud, quiet = clip(1, 8000, 16000, g), clip(1, 8000, 16000, g, gain=1e-2)
    io["batch.audio"] = torch.stack([loud, quiet])
    with torch.no_grad():
        batch = model.feature_extractor(io["batch.audio"])
    tail = batch[:, :, 64:]
    assert bool((tail == tail.flatten()[0]).all())
    io["batch.features"] = batch[:, :, :64]
    io["batch.features_floor"] = tail.flatten()[:1]
    print("batch features: quiet item floored in", float((batch[1] == tail.flatten()[0]).float().mean()))

    for orig, new, n in RESAMPLES:
        x = clip(2, n, orig, g)
        y = torchaudio.functional.resample(x, orig, new)
        assert y.shape[-1] == math.ceil(new * n / orig), (orig, new, y.shape)
        io[f"resample.{orig}_{new}.in"] = x
        io[f"resample.{orig}_{new}.out"] = y
        # The kernel in f64 (the dtype torchaudio takes from the waveform) against the f32 one it uses here.
        y64 = torchaudio.functional.resample(x.double(), orig, new)
        print(f"resample {orig} -> {new}: {n} -> {y.shape[-1]}, f32 vs f64 kernel {float((y - y64).abs().max()):.2e}")

    save_file({k: v.float().contiguous().clone() for k, v in io.items()}, f"{OUT}/io.safetensors")
    sizes = {f: os.path.getsize(f"{OUT}/{f}") for f in sorted(os.listdir(OUT))}
    print(f"fixtures: {sizes}, total {sum(sizes.values())}")


if __name__ == "__main__":
    main()
