"""Fixtures for RebatchLatents (engine/src/nodes/builtin/rebatch_latents.rs): ComfyUI's own node at 0f1fa67a
(comfy_extras/nodes_rebatch.py's LatentRebatch).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/rebatch_latents.py

Writes engine/tests/fixtures/rebatch_latents/io.safetensors. The list in: `in.0` [3, 4, 2, 3] (no mask, no
indices), `in.1` [2, 4, 2, 3] with `in.1.mask` [1, 1, 16, 24] (repeated to the batch), `in.2` [1, 4, 3, 3] (another
size), `in.3` [4, 4, 3, 3] with `in.3.index` [10, 11, 12, 13]; rebatched at 2 (`b2.<i>.*`) and at 3 (`b3.<i>.*`):
each output's `samples`, `index` and, when kept, `mask`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/rebatch_latents"


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_rebatch import LatentRebatch

    g = torch.Generator().manual_seed(17)
    io = {"in.0": torch.randn(3, 4, 2, 3, generator=g), "in.1": torch.randn(2, 4, 2, 3, generator=g),
          "in.1.mask": torch.rand(1, 1, 16, 24, generator=g), "in.2": torch.randn(1, 4, 3, 3, generator=g),
          "in.3": torch.randn(4, 4, 3, 3, generator=g), "in.3.index": torch.tensor([10.0, 11, 12, 13])}
    latents = [{"samples": io["in.0"]}, {"samples": io["in.1"], "noise_mask": io["in.1.mask"]},
               {"samples": io["in.2"]}, {"samples": io["in.3"], "batch_index": [10, 11, 12, 13]}]
    for size in [2, 3]:
        out = LatentRebatch.execute(latents, [size]).result[0]
        for i, latent in enumerate(out):
            io[f"b{size}.{i}.samples"] = latent["samples"]
            io[f"b{size}.{i}.index"] = torch.tensor(latent["batch_index"], dtype=torch.float32)
            if "noise_mask" in latent:
                io[f"b{size}.{i}.mask"] = latent["noise_mask"]
        print(size, [(list(x["samples"].shape), x["batch_index"], "noise_mask" in x) for x in out])
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.clone().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
