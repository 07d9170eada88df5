"""Fixtures for Kiln's USO style projector (engine/models/tests/fixtures/flux_uso/), from ComfyUI's own
SigLIPMultiFeatProjModel and UsoStyleProjectorPatch (comfy_extras/nodes_model_patch.py at 0f1fa67a) on the tiny
FLUX.1 DiT of scripts/reference/flux.py's fixture.

Run from the repository root (after flux.py, whose weights it reads):
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/flux_uso.py
(ComfyUI's node imports need the extra pins listed in comfy_sampling.py and flux2.py: einops, comfy-kitchen, av, ...)

Writes:
- projector.safetensors: a tiny random projector in the release's names (`feature_embedder.` + ComfyUI's module
  names), bf16: 9 SigLIP tokens -> 4 style tokens a level, SigLIP width 32 -> the tiny DiT's 128, layer norms.
- io.safetensors (f32): `states.low`, `states.mid`, `states.high` [1, 9, 32] (the SigLIP hidden states
  USOStyleReference stacks: layers -20, -11 and the penultimate one), the projector's output `tokens`
  [1, 12, 128], and the tiny FLUX.1 DiT's output `out` on flux/io.safetensors' `even` case with the projector
  patched in as ComfyUI's USOStyleReference patches it (the tokens before the text after txt_in, ids zero).
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from flux import CONFIG  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/flux_uso"
FLUX = "engine/models/tests/fixtures/flux"


def main():
    import_comfyui(node_modules=True)
    import comfy.ops
    from comfy.ldm.flux.model import Flux
    from comfy_extras.nodes_model_patch import SigLIPMultiFeatProjModel, UsoStyleProjectorPatch

    os.makedirs(OUT, exist_ok=True)
    ops = comfy.ops.disable_weight_init
    projector = SigLIPMultiFeatProjModel(siglip_token_nums=9, style_token_nums=4, siglip_token_dims=32,
                                         hidden_size=128, operations=ops).eval()
    stored = randomize(projector, seed=53)
    save_file({f"feature_embedder.{k}": v for k, v in stored.items()}, f"{OUT}/projector.safetensors")

    net = Flux(**CONFIG, operations=ops).eval()
    weights = {k.replace("_norm.scale", "_norm.weight"): v.float()
               for k, v in load_file(f"{FLUX}/weights.safetensors").items()}
    net.load_state_dict(weights, strict=True)
    io = load_file(f"{FLUX}/io.safetensors")

    g = torch.Generator().manual_seed(59)
    out = {f"states.{level}": torch.randn(1, 9, 32, generator=g) for level in ["low", "mid", "high"]}
    encoded = torch.stack((out["states.low"], out["states.mid"], out["states.high"]))
    with torch.no_grad():
        out["tokens"] = projector(encoded)
        patch = UsoStyleProjectorPatch(type("Patch", (), {"model": projector})(), encoded)
        options = {"patches": {"post_input": [patch]}}
        out["out"] = net(io["x.even"], io["sigma.even"], io["context.even"], y=io["y.even"],
                         guidance=io["guidance.even"], transformer_options=options)
        plain = net(io["x.even"], io["sigma.even"], io["context.even"], y=io["y.even"],
                    guidance=io["guidance.even"], transformer_options={})
    assert torch.allclose(plain, io["out.even"], atol=1e-5), "the FLUX.1 fixture's model"
    print(f"tokens {tuple(out['tokens'].shape)}; max |out - plain| {float((out['out'] - plain).abs().max()):.3f}")
    save_file({k: v.contiguous() for k, v in out.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
