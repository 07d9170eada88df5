"""Fixtures for SDXL's unCLIP pooled vector (engine/models/src/unet/unclip.rs, `unCLIPConditioning`): ComfyUI's own
`model_base.sdxl_pooled` at 0f1fa67a, with the `CLIPEmbeddingNoiseAugmentation` SDXL builds (1000-step
`squaredcos_cap_v2`, timestep_dim 1280).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/unclip.py

ComfyUI code this relies on: comfy/model_base.py (`sdxl_pooled`, `unclip_adm`, `SDXL.__init__`'s noise augmentor),
comfy/ldm/modules/encoders/noise_aug_modules.py and comfy/ldm/modules/diffusionmodules/upscaling.py (`q_sample`:
`torch.manual_seed(seed)` per embedding, `randn_like` from the global generator for the merge of several).

Writes engine/models/tests/fixtures/unclip/: io.safetensors with `embeds.<k>` [n, 1280] (f32, the CLIP vision
image embeddings of each case's unCLIPConditioning nodes, k in order) and `<case>.pooled` [1, 1280]; cases.json
with each case's seed and its conditionings' (k, strength, noise_augmentation).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/unclip"


class Output:
    """The part of a CLIP vision output `unclip_adm` reads."""

    def __init__(self, image_embeds):
        self.image_embeds = image_embeds


def main():
    import_comfyui()
    import comfy.model_base as mb
    from comfy.ldm.modules.encoders.noise_aug_modules import CLIPEmbeddingNoiseAugmentation

    augmentor = CLIPEmbeddingNoiseAugmentation(
        noise_schedule_config={"timesteps": 1000, "beta_schedule": "squaredcos_cap_v2"}, timestep_dim=1280
    )
    g = torch.Generator().manual_seed(5)
    embeds = [torch.randn(1, 1280, generator=g), torch.randn(1, 1280, generator=g), torch.randn(2, 1280, generator=g)]
    io = {f"embeds.{k}": e for k, e in enumerate(embeds)}
    # (name, seed, [(embeds index, strength, noise_augmentation)])
    cases = [
        ("one", 42, [(0, 0.75, 0.0)]),
        ("noised", 123456789, [(0, 1.5, 0.3)]),
        ("small_seed", 3, [(1, 1.0, 0.0)]),
        ("two", 900749379955168, [(0, 0.75, 0.0), (1, 0.75, 0.0)]),
        ("batch", 7, [(2, -0.5, 0.9)]),
        ("half_level", 11, [(1, 2.0, 0.5)]),
    ]
    recorded = {}
    for name, seed, conds in cases:
        unclip = [
            {"clip_vision_output": Output(embeds[k]), "strength": s, "noise_augmentation": a} for k, s, a in conds
        ]
        pooled = mb.sdxl_pooled({"unclip_conditioning": unclip, "device": "cpu", "seed": seed}, augmentor)
        io[f"{name}.pooled"] = pooled.contiguous()
        recorded[name] = {"seed": seed, "conds": [list(c) for c in conds]}
    os.makedirs(OUT, exist_ok=True)
    save_file(io, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(recorded, f, indent=1)


if __name__ == "__main__":
    main()
