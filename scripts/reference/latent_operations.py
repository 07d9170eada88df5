"""Fixtures for the latent operations (engine/models/src/sampling/latent_operation.rs and the nodes of
engine/src/nodes/builtin/latent_operation.rs): ComfyUI's own nodes at 0f1fa67a (comfy_extras/nodes_latent.py).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/latent_operations.py

Writes engine/tests/fixtures/latent_operations/io.safetensors:
- `x` [2, 4, 12, 10] and `video` [1, 4, 3, 6, 8] (normal, times 2);
- `tonemap.1`, `tonemap.0_4`: LatentOperationTonemapReinhard at multiplier 1 and 0.4 on `x`; `tonemap.video` at 1
  on `video`;
- `sharpen.default` (radius 9 needs a larger latent: radius 4, sigma 1, alpha 0.1) and `sharpen.strong` (radius 3,
  sigma 1.5, alpha 0.8): LatentOperationSharpen on `x`;
- `cond`, `uncond` [1, 4, 12, 10]: LatentApplyOperationCFG's pre-CFG function with the tonemap at 0.4 turns them
  into `cfg.cond` (`conds_out[0]`), and with one prediction alone (`cfg.alone`, on `cond`).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/latent_operations"


def main():
    import_comfyui(node_modules=True)
    # nodes_latent and nodes_post_processing import each other; the latter first, as ComfyUI's loader does.
    import comfy_extras.nodes_post_processing  # noqa: F401
    from comfy_extras.nodes_latent import (LatentApplyOperation, LatentApplyOperationCFG,
                                           LatentOperationSharpen, LatentOperationTonemapReinhard)

    g = torch.Generator().manual_seed(91)
    io = {"x": torch.randn(2, 4, 12, 10, generator=g) * 2, "video": torch.randn(1, 4, 3, 6, 8, generator=g) * 2,
          "cond": torch.randn(1, 4, 12, 10, generator=g), "uncond": torch.randn(1, 4, 12, 10, generator=g)}

    def apply(op, latent):
        return LatentApplyOperation.execute({"samples": latent}, op).result[0]["samples"]

    tonemap = lambda m: LatentOperationTonemapReinhard.execute(m).result[0]  # noqa: E731
    io["tonemap.1"] = apply(tonemap(1.0), io["x"])
    io["tonemap.0_4"] = apply(tonemap(0.4), io["x"])
    io["tonemap.video"] = apply(tonemap(1.0), io["video"])
    io["sharpen.default"] = apply(LatentOperationSharpen.execute(4, 1.0, 0.1).result[0], io["x"])
    io["sharpen.strong"] = apply(LatentOperationSharpen.execute(3, 1.5, 0.8).result[0], io["x"])

    class Model:
        def clone(self):
            return self

        def set_model_sampler_pre_cfg_function(self, fn):
            self.fn = fn

    model = LatentApplyOperationCFG.execute(Model(), tonemap(0.4)).result[0]
    io["cfg.cond"] = model.fn({"conds_out": [io["cond"].clone(), io["uncond"].clone()]})[0]
    io["cfg.alone"] = model.fn({"conds_out": [io["cond"].clone()]})[0]

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
