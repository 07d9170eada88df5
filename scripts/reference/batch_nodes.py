"""Fixtures for BatchMasksNode and BatchLatentsNode (engine/src/nodes/builtin/mask.rs, latent_ops.rs): ComfyUI's own
nodes at 0f1fa67a (comfy_extras/nodes_post_processing.py).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/batch_nodes.py

Writes engine/tests/fixtures/batch_nodes/io.safetensors: masks `mask0` [2, 6, 8], `mask1` [1, 9, 5] and `mask2`
[1, 6, 8] batched into `masks.out` (the second resized bilinearly with the centre crop); latents `latent0`
[1, 4, 6, 8], `latent1` [2, 4, 3, 4] with batch indices 5 and 7, and `latent2` [1, 4, 6, 8], batched into
`latents.out` with `latents.index`; a video latent `video0` [1, 4, 2, 6, 8] and `video1` [1, 4, 2, 3, 4] into
`videos.out`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/batch_nodes"


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_post_processing import BatchLatentsNode, BatchMasksNode

    g = torch.Generator().manual_seed(83)
    io = {"mask0": torch.rand(2, 6, 8, generator=g), "mask1": torch.rand(1, 9, 5, generator=g),
          "mask2": torch.rand(1, 6, 8, generator=g), "latent0": torch.randn(1, 4, 6, 8, generator=g),
          "latent1": torch.randn(2, 4, 3, 4, generator=g), "latent2": torch.randn(1, 4, 6, 8, generator=g),
          "video0": torch.randn(1, 4, 2, 6, 8, generator=g), "video1": torch.randn(1, 4, 2, 3, 4, generator=g)}
    io["masks.out"] = BatchMasksNode.execute({"mask0": io["mask0"], "mask1": io["mask1"],
                                              "mask2": io["mask2"]}).result[0]
    out = BatchLatentsNode.execute({"latent0": {"samples": io["latent0"]},
                                    "latent1": {"samples": io["latent1"], "batch_index": [5, 7]},
                                    "latent2": {"samples": io["latent2"]}}).result[0]
    io["latents.out"], io["latents.index"] = out["samples"], torch.tensor(out["batch_index"], dtype=torch.float32)
    out = BatchLatentsNode.execute({"latent0": {"samples": io["video0"]},
                                    "latent1": {"samples": io["video1"]}}).result[0]
    io["videos.out"] = out["samples"]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
