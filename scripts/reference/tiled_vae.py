"""Records ComfyUI's tiling of a VAE pass, `comfy.utils.tiled_scale_multidim` (what `VAE.decode_tiled` and
`VAE.encode_tiled` run each tile through), with a stand-in pass whose output depends on the whole tile: the
reference of Kiln's engine/src/nodes/builtin/tiled.rs, written to engine/tests/fixtures/tiled_vae/cases.json.

The reference is ComfyUI itself at the commit Kiln matches (0f1fa67a), imported from COMFYUI_DIR (see comfyui.py;
nothing of it is copied here), on the CPU in f32. Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/tiled_vae.py

The stand-in pass (Kiln's test computes the same): up (× 8) repeats each position 8 × 8 times, down (÷ 8)
averages each 8 × 8 block; either then adds the mean of the whole input tile, so a tile's output differs from
the same region of the untiled output and the blend weights show in the result.

Each case: `direction` (up or down), `tile` (rows, columns), `overlap`, `shape` [1, C, H, W] of the input,
`input` and `output` (row-major f32 values; the input is seeded uniform noise from torch's CPU generator).
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/tiled_vae"
CASES = {
    "up_tiled": ("up", (4, 6), 2, (1, 2, 11, 13)),
    "up_no_overlap": ("up", (5, 5), 0, (1, 1, 9, 12)),
    "up_one_tile": ("up", (16, 16), 4, (1, 2, 7, 9)),
    "down_tiled": ("down", (24, 40), 16, (1, 2, 56, 72)),
    "down_odd_overlap": ("down", (40, 24), 12, (1, 1, 48, 64)),
}


def stand_in(direction):
    def up(x):
        return x.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3) + x.mean()

    def down(x):
        return torch.nn.functional.avg_pool2d(x, 8) + x.mean()

    return up if direction == "up" else down


def main():
    import_comfyui()
    import comfy.utils

    torch.manual_seed(7)
    cases = {}
    for name, (direction, tile, overlap, shape) in CASES.items():
        x = torch.rand(shape)
        scale = 8 if direction == "up" else 1 / 8
        out = comfy.utils.tiled_scale_multidim(
            x, stand_in(direction), tile=tile, overlap=overlap, upscale_amount=scale, out_channels=shape[1]
        )
        cases[name] = {
            "direction": direction, "tile": list(tile), "overlap": overlap, "shape": list(shape),
            "input": x.flatten().tolist(), "output": out.flatten().tolist(),
        }
        print(name, tuple(out.shape))
    os.makedirs(OUT, exist_ok=True)
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(cases, f)
        f.write("\n")


if __name__ == "__main__":
    main()
