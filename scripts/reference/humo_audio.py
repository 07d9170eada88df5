"""Fixture for Kiln's WanHuMoImageToVideo audio embedding (engine/tests/fixtures/humo/audio.safetensors): ComfyUI's
own node (comfy_extras/nodes_wan.py at 0f1fa67a) run on random Whisper states, no VAE (no reference image).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/humo_audio.py

The states: 33 tensors [1, 1500, 2] (N(0, 1); Whisper large-v3 gives 33 of [1, 1500, 1280]), as
AudioEncoderEncode's `encoded_audio_all_layers`, with `audio_samples` 20800 (1.3 s at 16 kHz: 64 Whisper frames
kept, 32 after resampling to 25 per second).

Writes (f32): `layer.<i>` for i < 33, `samples` [1], and per case (`long`: 37 frames, 10 latent frames whose
windows run past the audio; `short`: 13 frames) `length.<case>` [1] and `embed.<case>`, the positive prompt's
`audio_embed` [1, latent frames, 8, 5, 2].
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/humo"
STATES, TOKENS, CHANNELS, SAMPLES = 33, 1500, 2, 20800


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_wan import WanHuMoImageToVideo

    g = torch.Generator().manual_seed(31)
    layers = [torch.randn(1, TOKENS, CHANNELS, generator=g) for _ in range(STATES)]
    output = {"encoded_audio": layers[-1], "encoded_audio_all_layers": tuple(layers), "audio_samples": SAMPLES}
    out = {f"layer.{i}": layer for i, layer in enumerate(layers)}
    out["samples"] = torch.tensor([float(SAMPLES)])
    for case, length in (("long", 37), ("short", 13)):
        positive = [[torch.zeros(1, 1, 4), {}]]
        result = WanHuMoImageToVideo.execute(positive, positive, None, 64, 64, length, 1,
                                             audio_encoder_output=output)
        embed = result.args[0][0][1]["audio_embed"]
        print(f"{case}: audio_embed {tuple(embed.shape)}")
        out[f"length.{case}"] = torch.tensor([float(length)])
        out[f"embed.{case}"] = embed.float()
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, f"{OUT}/audio.safetensors")


if __name__ == "__main__":
    main()
