"""Fixtures for Kiln's image resampling (engine/src/nodes/builtin/resize.rs), from ComfyUI's own
`comfy.utils.common_upscale` at 0f1fa67a: every method Kiln offers, without a crop and with the centre crop,
on images whose aspect ratios make the crop's rounding matter.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/common_upscale.py

Writes engine/tests/fixtures/common_upscale/io.safetensors (f32): `image` [2, 13, 17, 3] in 0..1 (values on the
1/255 grid, so lanczos, which ComfyUI runs through 8-bit PIL images, sees the same values) and, for each method
m, crop c (`disabled`, `center`) and target W×H, `out.m.c.WxH` [2, H, W, 3].
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/common_upscale"
METHODS = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
TARGETS = [(24, 10), (8, 8), (31, 29), (5, 19)]


def main():
    import_comfyui()
    import comfy.utils

    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(3)
    image = torch.randint(0, 256, (2, 13, 17, 3), generator=g).float() / 255.0
    io = {"image": image}
    for method in METHODS:
        for crop in ["disabled", "center"]:
            for w, h in TARGETS:
                out = comfy.utils.common_upscale(image.movedim(-1, 1), w, h, method, crop).movedim(1, -1)
                io[f"out.{method}.{crop}.{w}x{h}"] = out.contiguous()
    save_file(io, f"{OUT}/io.safetensors")
    print(len(io) - 1, "cases")


if __name__ == "__main__":
    main()
