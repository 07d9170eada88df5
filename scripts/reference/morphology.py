"""Fixtures for Morphology, ImageRGBToYUV and ImageYUVToRGB (engine/src/nodes/builtin/morphology.rs): ComfyUI's own
nodes at 0f1fa67a (comfy_extras/nodes_morphology.py) on kornia 0.9.0, the newest release its `kornia>=0.7.1` takes.

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/morphology.py

Writes engine/tests/fixtures/morphology/io.safetensors: `image` [2, 10, 9, 3] in 0..1; `<operation>.<size>` for
every operation and kernel sizes 3, 4 (even: the window is not centred) and 7; `y`, `u`, `v` (ImageRGBToYUV) and
`rgb` (ImageYUVToRGB of those).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/morphology"


def main():
    import_comfyui(node_modules=True)
    import kornia
    from comfy_extras.nodes_morphology import ImageRGBToYUV, ImageYUVToRGB, Morphology

    assert kornia.__version__ == "0.9.0", kornia.__version__
    io = {"image": torch.rand(2, 10, 9, 3, generator=torch.Generator().manual_seed(73))}
    for operation in ("erode", "dilate", "open", "close", "gradient", "bottom_hat", "top_hat"):
        for size in (3, 4, 7):
            io[f"{operation}.{size}"] = Morphology.execute(io["image"], operation, size).result[0]
    io["y"], io["u"], io["v"] = ImageRGBToYUV.execute(io["image"]).result
    io["rgb"] = ImageYUVToRGB.execute(io["y"], io["u"], io["v"]).result[0]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print(sorted(io))


if __name__ == "__main__":
    main()
