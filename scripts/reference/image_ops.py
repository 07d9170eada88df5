"""Fixtures for Kiln's image orientation and mask nodes (engine/src/nodes/builtin/orient.rs, mask_ops.rs), from
ComfyUI's own nodes at 0f1fa67a: ImageRotate, ImageFlip and ResizeAndPadImage (comfy_extras/nodes_images.py), ImageColorToMask and
CropMask (comfy_extras/nodes_mask.py).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/image_ops.py

Writes engine/tests/fixtures/image_ops/io.safetensors (f32): `image` [2, 3, 5, 3]; `rotate.<choice>` for each
rotation choice, `flip.<x|y>`; `colors` [1, 4, 4, 3] (levels on the 1/255 grid, some pixels 0x336699, one just
off it, some past 1) and `color_mask` for 0x336699; `mask` [2, 6, 7] and `crop.<x>.<y>.<w>.<h>` for crops inside,
across the edge and past it; `pad_image` [2, 9, 14, 3] and `pad.<W>x<H>.<colour>.<method>` (ResizeAndPadImage).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/image_ops"


def main():
    import_comfyui(node_modules=True)
    from comfy_extras import nodes_images, nodes_mask

    g = torch.Generator().manual_seed(43)
    io = {"image": torch.rand(2, 3, 5, 3, generator=g)}
    for choice in ("none", "90 degrees", "180 degrees", "270 degrees"):
        io[f"rotate.{choice}"] = nodes_images.ImageRotate.execute(io["image"], choice).result[0]
    for choice in ("x-axis: vertically", "y-axis: horizontally"):
        io[f"flip.{choice[0]}"] = nodes_images.ImageFlip.execute(io["image"], choice).result[0]
    colors = torch.randint(0, 256, (1, 4, 4, 3), generator=g).float() / 255.0
    target = torch.tensor([0x33, 0x66, 0x99]).float() / 255.0
    colors[0, 0, 0] = target
    colors[0, 2, 3] = target
    colors[0, 1, 1] = target + torch.tensor([0.0, 0.0, 1.0 / 255.0])
    colors[0, 3, 0] = torch.tensor([1.4, 1.0, -0.2])
    io["colors"] = colors
    io["color_mask"] = nodes_mask.ImageColorToMask.execute(colors, 0x336699).result[0]
    io["white_mask"] = nodes_mask.ImageColorToMask.execute(colors, 0xFFFF00).result[0]
    io["mask"] = torch.rand(2, 6, 7, generator=g)
    for x, y, w, h in ((1, 2, 3, 2), (5, 4, 4, 5), (0, 0, 7, 6), (8, 1, 2, 2)):
        io[f"crop.{x}.{y}.{w}.{h}"] = nodes_mask.CropMask.execute(io["mask"], x, y, w, h).result[0]
    # ResizeAndPadImage: a picture on the 1/255 grid (lanczos runs through 8-bit PIL images) fitted into a
    # wider and a taller target, padded white or black, by every method.
    io["pad_image"] = torch.randint(0, 256, (2, 9, 14, 3), generator=g).float() / 255.0
    for (tw, th), colour in (((20, 11), "white"), ((7, 12), "black")):
        for method in ("area", "bicubic", "nearest-exact", "bilinear", "lanczos"):
            io[f"pad.{tw}x{th}.{colour}.{method}"] = nodes_images.ResizeAndPadImage.execute(
                io["pad_image"], tw, th, colour, method).result[0]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.float().clone().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
