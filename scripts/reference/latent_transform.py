"""Fixtures for the latent transforms (engine/src/nodes/builtin/latent_transform.rs) and ConditioningMultiply
(conditioning_ops.rs): ComfyUI's own nodes at 0f1fa67a (LatentRotate, LatentFlip, LatentCrop in nodes.py;
LatentCompositeMasked in comfy_extras/nodes_mask.py; ConditioningMultiply in nodes.py).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/latent_transform.py

Writes engine/tests/fixtures/latent_transform/io.safetensors:
- `latent` [2, 3, 12, 10]: `rotate.<k>` (k quarter turns, 1..3), `flip.x`, `flip.y`;
- `crop.<case>` for LatentCrop (width, height, x, y in pixels): `inner` (48, 64, 16, 24), `corner` (512, 512,
  200, 200: the corner pulled back 8 cells from the far edges, the block cut at them);
- `small` [1, 2, 6, 5] (less than 8 cells a side): `crop.small` (64, 64, 8, 8: Python's negative slice bounds);
- LatentCompositeMasked of `source` [1, 3, 5, 4] into `latent` at (16, 40) px: `composite.plain` (no mask),
  `composite.masked` (`mask` [2, 9, 7], resized to the source), `composite.edge` (at (48, 72): cut at the
  edges), `composite.resized` (`resize_source`, with the mask);
- on a video latent `video` [1, 3, 2, 12, 10] with `video_source` [1, 3, 2, 5, 4] and the mask:
  `composite.video` (the mask shared by every frame);
- ConditioningMultiply of `cond` [1, 4, 6] with `pooled` [1, 6] by -1.7: `multiply.cond`, `multiply.pooled`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/latent_transform"


def main():
    import_comfyui(node_modules=True)
    import nodes
    from comfy_extras.nodes_mask import LatentCompositeMasked

    g = torch.Generator().manual_seed(17)
    io = {"latent": torch.randn(2, 3, 12, 10, generator=g), "small": torch.randn(1, 2, 6, 5, generator=g),
          "source": torch.randn(1, 3, 5, 4, generator=g), "mask": torch.rand(2, 9, 7, generator=g),
          "video": torch.randn(1, 3, 2, 12, 10, generator=g), "video_source": torch.randn(1, 3, 2, 5, 4, generator=g),
          "cond": torch.randn(1, 4, 6, generator=g), "pooled": torch.randn(1, 6, generator=g)}
    latent = {"samples": io["latent"]}
    for k, name in ((1, "90 degrees"), (2, "180 degrees"), (3, "270 degrees")):
        io[f"rotate.{k}"] = nodes.LatentRotate().rotate(latent, name)[0]["samples"]
    io["flip.x"] = nodes.LatentFlip().flip(latent, "x-axis: vertically")[0]["samples"]
    io["flip.y"] = nodes.LatentFlip().flip(latent, "y-axis: horizontally")[0]["samples"]
    io["crop.inner"] = nodes.LatentCrop().crop(latent, 48, 64, 16, 24)[0]["samples"]
    io["crop.corner"] = nodes.LatentCrop().crop(latent, 512, 512, 200, 200)[0]["samples"]
    io["crop.small"] = nodes.LatentCrop().crop({"samples": io["small"]}, 64, 64, 8, 8)[0]["samples"]

    def composite(dest, source, x, y, resize, mask):
        out = LatentCompositeMasked.execute({"samples": dest}, {"samples": source}, x, y, resize, mask)
        return out.result[0]["samples"]

    io["composite.plain"] = composite(io["latent"], io["source"], 16, 40, False, None)
    io["composite.masked"] = composite(io["latent"], io["source"], 16, 40, False, io["mask"])
    io["composite.edge"] = composite(io["latent"], io["source"], 48, 72, False, io["mask"])
    io["composite.resized"] = composite(io["latent"], io["source"], 0, 0, True, io["mask"])
    io["composite.video"] = composite(io["video"], io["video_source"], 16, 40, False, io["mask"][:1])

    multiplied = nodes.ConditioningMultiply().multiply([[io["cond"], {"pooled_output": io["pooled"]}]], -1.7)[0]
    io["multiply.cond"] = multiplied[0][0]
    io["multiply.pooled"] = multiplied[0][1]["pooled_output"]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
