"""Records ComfyUI's cfg_function under the Mahiro node's post-CFG hook (comfy_extras/nodes_mahiro.py at
0f1fa67a), run through the node on a ModelPatcher, on random predictions of shape [2, 4, 3, 5] (two samples: the
similarity is averaged over both): engine/models/tests/fixtures/comfy_sampling/mahiro.safetensors holds `x`,
`cond`, `uncond` and `out.<cfg>` for cfg 3.5, and 1.0 with the unconditional prediction skipped (zeros), and
alone after CFGZeroStar (`out.zero_star.3.5`).

Run from the repository root:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/comfy_mahiro.py
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/comfy_sampling"


def main():
    import_comfyui(node_modules=True)
    import comfy.model_patcher
    import comfy.samplers
    from comfy_extras.nodes_cfg import CFGZeroStar
    from comfy_extras.nodes_mahiro import Mahiro

    g = torch.Generator().manual_seed(59)
    x, cond, uncond = (torch.randn(2, 4, 3, 5, generator=g) for _ in range(3))
    io = {"x": x, "cond": cond, "uncond": uncond}
    sigma = torch.tensor([0.7])

    def options(zero_star):
        m = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
        if zero_star:
            m = CFGZeroStar.execute(m).result[0]
        return Mahiro.execute(m).result[0].model_options

    for cfg, skipped in ((3.5, False), (1.0, True)):
        un = torch.zeros_like(uncond) if skipped else uncond
        io[f"out.{cfg}"] = comfy.samplers.cfg_function(None, cond, un, cfg, x, sigma, model_options=options(False))
    io["out.zero_star.3.5"] = comfy.samplers.cfg_function(None, cond, uncond, 3.5, x, sigma,
                                                           model_options=options(True))
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/mahiro.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
