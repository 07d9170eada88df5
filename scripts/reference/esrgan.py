"""Fixtures for Kiln's ESRGAN upscale models (engine/tests/fixtures/esrgan/, read by the kiln-models test too): a
tiny random RRDBNet loaded by spandrel (ComfyUI's loader; `pip install spandrel==0.4.1 av==18.1.0` beside the pins
comfy_sampling.py lists) and run by ComfyUI's own `ImageUpscaleWithModel` node (comfy_extras/nodes_upscale_model.py
at 0f1fa67a: spandrel's call, which clamps each tile to [0, 1], `comfy.utils.tiled_scale` with 512-pixel tiles
overlapping by 32, the clamp).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/esrgan.py

The model: Real-ESRGAN's new-arch names (conv_first, body.N.rdbR.convC, conv_body, conv_up1, conv_up2, conv_hr,
conv_last), 8 filters, spandrel's fixed growth of 32 channels, 2 RRDB blocks, scale 4 (two nearest ×2 + conv
stages), f32; weights N(0, 1) / sqrt(fan-in), biases 0.02 N (conv_last's 0.5 more). Spandrel reads it as its old-arch ESRGAN.

Writes:
- weights.safetensors: the model (f32).
- io.safetensors (f32): `image` [2, 20, 28, 3] (uniform [0, 1]) and `out` [2, 80, 112, 3], the node's output;
  `wide` [1, 8, 560, 3] and `wide_out` [1, 32, 2240, 3], an image wider than a tile (two tiles, blended).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/esrgan"
NF, GC, BLOCKS = 8, 32, 2


def weights():
    g = torch.Generator().manual_seed(5)
    shapes = {"conv_first": (NF, 3), "conv_body": (NF, NF), "conv_up1": (NF, NF), "conv_up2": (NF, NF),
              "conv_hr": (NF, NF), "conv_last": (3, NF)}
    for b in range(BLOCKS):
        for r in (1, 2, 3):
            for c in range(1, 6):
                shapes[f"body.{b}.rdb{r}.conv{c}"] = (NF if c == 5 else GC, NF + (c - 1) * GC)
    out = {}
    for name, (o, i) in shapes.items():
        out[f"{name}.weight"] = torch.randn(o, i, 3, 3, generator=g) / (9 * i) ** 0.5
        out[f"{name}.bias"] = 0.02 * torch.randn(o, generator=g)
    # Outputs around 0.5, so the clamps to [0, 1] cut a little at both ends.
    out["conv_last.bias"] += 0.5
    return out


def main():
    import_comfyui(node_modules=True)
    import comfy.model_management
    import comfy.model_patcher
    from comfy_extras.nodes_upscale_model import ImageUpscaleWithModel
    from spandrel import ModelLoader

    os.makedirs(OUT, exist_ok=True)
    sd = weights()
    save_file(sd, f"{OUT}/weights.safetensors")
    model = ModelLoader().load_from_state_dict(dict(sd)).eval()
    assert type(model.model).__name__ == "RRDBNet" and model.scale == 4, (type(model.model), model.scale)
    model.patcher = comfy.model_patcher.CoreModelPatcher(
        model.model, load_device=comfy.model_management.get_torch_device(),
        offload_device=comfy.model_management.unet_offload_device())
    g = torch.Generator().manual_seed(9)
    io = {"image": torch.rand(2, 20, 28, 3, generator=g), "wide": torch.rand(1, 8, 560, 3, generator=g)}
    with torch.no_grad():
        io["out"] = ImageUpscaleWithModel.execute(model, io["image"])[0]
        io["wide_out"] = ImageUpscaleWithModel.execute(model, io["wide"])[0]
    for k in ("out", "wide_out"):
        print(k, tuple(io[k].shape), float(io[k].min()), float(io[k].max()))
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    sizes = {f: os.path.getsize(f"{OUT}/{f}") for f in sorted(os.listdir(OUT))}
    print(f"fixtures: {sizes}")


if __name__ == "__main__":
    main()
