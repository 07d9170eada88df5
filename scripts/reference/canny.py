"""Records ComfyUI's `Canny` (comfy_extras/nodes_canny.py, which calls kornia.filters.canny) and `ImageBlur`
(comfy_extras/nodes_post_processing.py) on a small deterministic image batch: the reference of Kiln's
engine/src/nodes/builtin/filters.rs, written to engine/tests/fixtures/canny/cases.json.

The reference is ComfyUI itself at the commit Kiln matches (0f1fa67a), imported from COMFYUI_DIR (see comfyui.py;
nothing of it is copied here), running on the CPU. Importing `nodes_post_processing` imports ComfyUI's `nodes`,
which imports torchaudio; nothing here uses it, so when it is not installed an empty stand-in package is put on
the path first.

Pinned versions (the fixture records them too): torch 2.15.0 (scripts/reference/requirements.txt), kornia 0.9.0
with kornia-rs 0.2.0 (ComfyUI's requirements.txt asks for kornia>=0.7.1; 0.9.0 is the newest release), and
scipy 1.17.1 (ComfyUI's nodes import it). Beyond scripts/reference/requirements.txt:
    target/reference-venv/bin/pip install kornia==0.9.0 kornia-rs==0.2.0 scipy==1.17.1

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/canny.py

What the fixture holds:
  - `image`: the input, a batch of two 20x24 RGB images as ComfyUI's IMAGE [B, H, W, C], stored as 8-bit
    `pixels` (row-major B, H, W, C); the node input is pixel / 255 in f32, as LoadImage makes it. Each image is a
    seeded pattern: a bright disc and a darker bar (step edges at several angles) over a soft gradient, with
    uniform noise from torch's CPU generator.
  - `canny`: for each (low, high) pair, `edges`, the node's output read as 0/1 per pixel (its three channels are
    equal; row-major B, H, W), and `magnitude_bits`, kornia's first output (the gradient magnitude after
    non-maximum suppression; ComfyUI drops it) as f32 bit patterns, for diagnosing a mismatch.
  - `blur`: for each (blur_radius, sigma), the node's output [B, H, W, C] as f32 bit patterns.

Everything is computed in f32 on the CPU, as ComfyUI computes it with --cpu.
"""

import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui(node_modules=True)
import kornia  # noqa: E402
import torch  # noqa: E402
from comfy_extras.nodes_canny import Canny  # noqa: E402
from comfy_extras.nodes_post_processing import Blur  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "../../engine/tests/fixtures/canny")
SEED = 20240607
BATCH, HEIGHT, WIDTH = 2, 20, 24
THRESHOLDS = [(0.4, 0.8), (0.1, 0.3), (0.05, 0.99), (0.5, 0.5), (0.9, 0.95)]
BLURS = [(1, 1.0), (3, 0.5), (2, 10.0)]


def bits(values):
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


def pattern():
    """The input batch as 8-bit pixels [B, H, W, C]."""
    g = torch.Generator().manual_seed(SEED)
    noise = torch.rand((BATCH, HEIGHT, WIDTH, 3), generator=g)
    pixels = []
    for b in range(BATCH):
        cx, cy, r = 9.5 + 3 * b, 8.0 + 2 * b, 5.5 - b
        for y in range(HEIGHT):
            for x in range(WIDTH):
                base = 0.25 + 0.2 * math.sin(0.31 * x + 0.17 * y + b)
                disc = 0.5 if (x - cx) ** 2 + (y - cy) ** 2 <= r * r else 0.0
                bar = -0.2 if 0 <= (x + 2 * y) - (30 + 4 * b) < 5 else 0.0
                for c in range(3):
                    tint = (0.1, 0.0, -0.1)[c] * (1 if b == 0 else -1)
                    v = base + disc + bar + tint + 0.08 * (float(noise[b, y, x, c]) - 0.5)
                    pixels.append(max(0, min(255, round(v * 255))))
    return pixels


def main():
    pixels = pattern()
    image = (torch.tensor(pixels, dtype=torch.uint8).reshape(BATCH, HEIGHT, WIDTH, 3).numpy().astype("float32")
             / 255.0)
    image = torch.from_numpy(image)
    canny = []
    for low, high in THRESHOLDS:
        out = Canny.execute(image, low, high).result[0]
        assert out.shape == (BATCH, HEIGHT, WIDTH, 3)
        assert torch.equal(out[..., 0], out[..., 1]) and torch.equal(out[..., 0], out[..., 2])
        edges = out[..., 0].flatten().tolist()
        assert set(edges) <= {0.0, 1.0}
        magnitude, _ = kornia.filters.canny(image.movedim(-1, 1), low, high)
        canny.append({"low": low, "high": high, "edges": [int(e) for e in edges],
                      "magnitude_bits": bits(magnitude.flatten().tolist())})
    blur = []
    for radius, sigma in BLURS:
        out = Blur.execute(image, radius, sigma).result[0]
        assert out.shape == image.shape and out.dtype == torch.float32
        blur.append({"blur_radius": radius, "sigma": sigma, "output_bits": bits(out.flatten().tolist())})
    fixture = {
        "versions": {"torch": torch.__version__.split("+")[0], "kornia": kornia.__version__, "comfyui": "0f1fa67a"},
        "image": {"shape": [BATCH, HEIGHT, WIDTH, 3], "pixels": pixels},
        "canny": canny,
        "blur": blur,
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
