"""Fixtures for Kiln's VAEEncodeForInpaint (engine/src/nodes/builtin/inpaint.rs), from ComfyUI's own nodes.py at
0f1fa67a on wan_vae.py's tiny Wan 2.1 VAE (as comfy.sd.VAE loads it; it encodes an image as one frame).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/inpaint.py

Writes engine/tests/fixtures/inpaint/encode_for_inpaint.safetensors (f32): `pixels` [1, 37, 45, 3] and a soft
`mask` [1, 20, 28] (bilinear-resized to the image, cropped with it to 32 x 40, rounded), `samples` [1, 16, 1, 4,
5] (the greyed image encoded) and `noise_mask.<g>` [1, 1, 32, 40] for grow_mask_by g in 0, 3, 6.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/inpaint"


def main():
    import_comfyui(node_modules=True)
    import comfy.sd
    import nodes

    weights = load_file("engine/models/tests/fixtures/wan_vae/weights.safetensors")
    vae = comfy.sd.VAE(sd={k: v.float() for k, v in weights.items()})
    g = torch.Generator().manual_seed(41)
    io = {"pixels": torch.rand(1, 37, 45, 3, generator=g), "mask": torch.rand(1, 20, 28, generator=g)}
    # A blob of ones so growing it shows, on soft noise elsewhere.
    io["mask"][:, 6:11, 9:15] = 1.0
    for grow in (0, 3, 6):
        (latent,) = nodes.VAEEncodeForInpaint().encode(vae, io["pixels"], io["mask"], grow)
        io["samples"] = latent["samples"].float()
        io[f"noise_mask.{grow}"] = latent["noise_mask"].float()
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/encode_for_inpaint.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
