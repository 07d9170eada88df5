"""Fixtures for PerpNegGuider (engine/src/nodes/builtin/sampler.rs `guide_perp_neg`): ComfyUI's own guider
(comfy_extras/nodes_perpneg.py at 0f1fa67a) on wan.py's tiny t2v model, euler over simple 4 steps from a zero latent
[1, 16, 3, 8, 8] and seeded noise (seed 11).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py; needs wan.py's fixtures first):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/perp_neg.py

Writes engine/tests/fixtures/perp_neg/io.safetensors: `positive`, `negative`, `empty` [1, 6, 32], `noise`,
`sigmas`, and `out.<case>`: `plain` (cfg 4, neg_scale 1), `no_negative` (cfg 4, neg_scale 0: the negative
skipped), `alone` (cfg 1, neg_scale 0: the negative and the empty prompt skipped) and `hooks` (cfg 4, neg_scale
1.5 on the model with TCFG before CFG and Mahiro after it).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import TEXT  # noqa: E402

OUT = "engine/tests/fixtures/perp_neg"
SEED = 11


def main():
    import_comfyui(node_modules=True)
    import comfy.samplers
    from comfy_extras.nodes_mahiro import Mahiro
    from comfy_extras.nodes_perpneg import PerpNegGuider
    from comfy_extras.nodes_tcfg import TCFG
    from wan_windows import patcher_of, tiny_t2v

    patcher = patcher_of(tiny_t2v()[0], "WAN21_T2V")
    g = torch.Generator().manual_seed(43)
    io = {name: torch.randn(1, 6, TEXT, generator=g) for name in ("positive", "negative", "empty")}
    io["noise"] = torch.randn(1, 16, 3, 8, 8, generator=torch.Generator().manual_seed(SEED))
    sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", 4)
    io["sigmas"] = sigmas.float()
    hooked = Mahiro.execute(TCFG.execute(patcher).result[0]).result[0]
    for case, model, cfg, neg_scale in (("plain", patcher, 4.0, 1.0), ("no_negative", patcher, 4.0, 0.0),
                                        ("alone", patcher, 1.0, 0.0), ("hooks", hooked, 4.0, 1.5)):
        guider = PerpNegGuider.execute(model, [[io["positive"], {}]], [[io["negative"], {}]],
                                       [[io["empty"], {}]], cfg, neg_scale).result[0]
        with torch.no_grad():
            out = guider.sample(io["noise"].clone(), torch.zeros_like(io["noise"]),
                                comfy.samplers.sampler_object("euler"), sigmas.clone(), disable_pbar=True, seed=SEED)
        io[f"out.{case}"] = out.float()
        print(case, float(out.abs().max()))
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
