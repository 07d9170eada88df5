"""Fixture for Kiln's Painter node (engine/tests/fixtures/painter/): ComfyUI's own node (comfy_extras/nodes_painter.py
at 0f1fa67a) on a painting PNG, through PIL as ComfyUI reads and resizes it.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/painter.py

Writes painting.png (a 40 x 30 RGBA painting: random colours, alpha 0 on the left third, random in the middle, 255
on the right third) and io.safetensors (f32): `base` [2, 24, 32, 3] (the second image is not read) and, per case,
`image.<c>` and `mask.<c>`: `canvas` (no image, a 64 x 48 canvas of #3366cc, the painting resized with LANCZOS),
`over` (painted over `base`'s first image, resized to 32 x 24), `exact` (a 40 x 30 canvas: no resize) and `empty` (no
painting: the canvas and a zero mask).
"""

import os
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/painter"


def main():
    import_comfyui(node_modules=True)
    import folder_paths
    from comfy_extras.nodes_painter import PainterNode

    rng = np.random.default_rng(9)
    rgba = rng.integers(0, 256, size=(30, 40, 4), dtype=np.uint8)
    rgba[:, :13, 3] = 0
    rgba[:, 27:, 3] = 255
    os.makedirs(OUT, exist_ok=True)
    Image.fromarray(rgba, "RGBA").save(f"{OUT}/painting.png")
    input_dir = tempfile.mkdtemp()
    Image.fromarray(rgba, "RGBA").save(os.path.join(input_dir, "painting.png"))
    folder_paths.set_input_directory(input_dir)

    g = torch.Generator().manual_seed(4)
    base = torch.rand(2, 24, 32, 3, generator=g)
    out = {"base": base}
    cases = {
        "canvas": dict(mask="painting.png", width=64, height=48, bg_color="#3366cc"),
        "over": dict(mask="painting.png [input]", width=512, height=512, image=base),
        "exact": dict(mask="painting.png", width=40, height=30, bg_color="#000000"),
        "empty": dict(mask="", width=64, height=48, bg_color="#3366cc"),
    }
    for case, kwargs in cases.items():
        result = PainterNode.execute(**kwargs)
        image, mask = result.args
        print(f"{case}: image {tuple(image.shape)}, mask {tuple(mask.shape)}")
        out[f"image.{case}"] = image.float().contiguous()
        out[f"mask.{case}"] = mask.float().contiguous()
    save_file(out, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
