"""Fixtures for ImageSharpen and ImageAddNoise (engine/src/nodes/builtin/filters.rs): ComfyUI's own nodes at
0f1fa67a (comfy_extras/nodes_post_processing.py, comfy_extras/nodes_images.py).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/image_filters.py

Writes engine/tests/fixtures/image_filters/io.safetensors: `image` [2, 9, 11, 3] in 0..1; `sharpen.<r>.<sigma>.<alpha>`
for (1, 1.0, 1.0), (3, 2.5, 0.4) and (2, 0.5, 5.0); `noise.<seed>.<strength>` for (0, 0.5), (123456789, 0.2) and
(2^64 − 1, 1.0).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/image_filters"


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_images import ImageAddNoise
    from comfy_extras.nodes_post_processing import Sharpen

    io = {"image": torch.rand(2, 9, 11, 3, generator=torch.Generator().manual_seed(71))}
    for radius, sigma, alpha in ((1, 1.0, 1.0), (3, 2.5, 0.4), (2, 0.5, 5.0)):
        io[f"sharpen.{radius}.{sigma}.{alpha}"] = Sharpen.execute(io["image"], radius, sigma, alpha).result[0]
    for seed, strength in ((0, 0.5), (123456789, 0.2), (2**64 - 1, 1.0)):
        io[f"noise.{seed}.{strength}"] = ImageAddNoise.execute(io["image"], seed, strength).result[0]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print(sorted(io))


if __name__ == "__main__":
    main()
