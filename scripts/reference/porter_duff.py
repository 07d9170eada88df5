"""Fixtures for PorterDuffImageComposite and SplitImageWithAlpha (engine/src/nodes/builtin/porter_duff.rs): ComfyUI's
own nodes at 0f1fa67a (comfy_extras/nodes_compositing.py).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/porter_duff.py

Writes engine/tests/fixtures/porter_duff/io.safetensors: `source` [2, 6, 7, 3], `source_alpha` [3, 6, 7],
`destination` [2, 6, 7, 3], `destination_alpha` [2, 6, 7]; `<mode>.image`, `<mode>.mask` for every mode;
`resized.image`, `resized.mask` (SRC_OVER of `small` [1, 4, 5, 3] with `small_alpha` [1, 3, 3] and a
`destination_alpha` of another size, `big_alpha` [1, 9, 8]: all resized bicubically to the destination);
`rgba` [2, 3, 4, 4] split into `split.image`, `split.mask`, and `rgb` [1, 3, 4, 3] into `split_rgb.mask`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/porter_duff"


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_compositing import PorterDuffImageComposite, PorterDuffMode, SplitImageWithAlpha

    g = torch.Generator().manual_seed(79)
    io = {"source": torch.rand(2, 6, 7, 3, generator=g), "source_alpha": torch.rand(3, 6, 7, generator=g),
          "destination": torch.rand(2, 6, 7, 3, generator=g), "destination_alpha": torch.rand(2, 6, 7, generator=g),
          "small": torch.rand(1, 4, 5, 3, generator=g), "small_alpha": torch.rand(1, 3, 3, generator=g),
          "big_alpha": torch.rand(1, 9, 8, generator=g), "rgba": torch.rand(2, 3, 4, 4, generator=g),
          "rgb": torch.rand(1, 3, 4, 3, generator=g)}
    # A few exact zeros and ones in the masks: alphas of 0 and 1 meet the 1e-5 guard.
    io["source_alpha"][0, 0, :3] = 1.0
    io["destination_alpha"][0, 0, :2] = 1.0
    io["destination_alpha"][1, 1, :2] = 0.0
    for mode in PorterDuffMode:
        image, mask = PorterDuffImageComposite.execute(io["source"], io["source_alpha"], io["destination"],
                                                       io["destination_alpha"], mode.name).result
        io[f"{mode.name}.image"], io[f"{mode.name}.mask"] = image, mask
    image, mask = PorterDuffImageComposite.execute(io["small"], io["small_alpha"], io["destination"][:1],
                                                   io["big_alpha"], "SRC_OVER").result
    io["resized.image"], io["resized.mask"] = image, mask
    io["split.image"], io["split.mask"] = SplitImageWithAlpha.execute(io["rgba"]).result
    io["split_rgb.mask"] = SplitImageWithAlpha.execute(io["rgb"]).result[1]
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print(len(io), "tensors")


if __name__ == "__main__":
    main()
