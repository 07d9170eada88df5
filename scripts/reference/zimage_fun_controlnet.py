"""Fixtures for Kiln's Z-Image Fun ControlNet (engine/models/tests/fixtures/zimage_fun_controlnet/), from ComfyUI's
own modules at 0f1fa67a: its NextDiT (comfy/ldm/lumina/model.py) as Z-Image configures it, its ZImage_Control
(comfy/ldm/lumina/controlnet.py) and the ZImageControlPatch that QwenImageDiffsynthControlnet puts on the model
(comfy_extras/nodes_model_patch.py), run as ComfyUI runs it: a noise-refiner and a double-block patch.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/zimage_fun_controlnet.py

The tiny NextDiT has Z-Image's structure (z_image modulation, time scale 1000, RoPE θ 256, tokens padded to 32,
2 + 2 refiners) at dim 64 = 2 heads × 32 (axes 8/12/12), 6 main layers, FFN 176 (multiple of 16), captions of
width 32, and a t-embedder of output 64 (ComfyUI's is 256 wide, which the modulations take as min(dim, 256)). The ControlNet is the first release's layout (the union one): 6 control layers and 2 plain noise
refiner blocks, `control_all_x_embedder` over a 16-channel latent; ComfyUI adds control layer k after main layer
5k (round(30 / 6)), so layers 0 and 1 act here. The patch's VAE is a stand-in that hands back `latent` at the
latents' size (the image's encoding is the VAE's own test). The ControlNet's attention names are the released
file's (`to_q`/`to_k`/`to_v`, `to_out.0`, `norm_q`/`norm_k`), which ComfyUI fuses and renames on load.

Writes (weights bf16, the reference in f32 on their values):
- base.safetensors: the NextDiT in ComfyUI's layout (fused qkv).
- control.safetensors: the ControlNet in the released file's layout.
- io.safetensors (f32): `x` [2, 16, 8, 12], `sigma` [2], `context` [2, 7, 32], `latent` [1, 16, 8, 12] (VAE
  space) and `latent.model` (the same in the model's space: Flux's scale and shift), the base model's output
  with the patch at strength 0.75 (`out.control`) and without (`out.none`); and an odd latent, `x.odd`
  [2, 16, 7, 11], which ComfyUI pads to 8 × 12 before the patch sees it, so the control latent is `latent`
  again (`out.odd`).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image_blockwise import Patch, StandInVae  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/zimage_fun_controlnet"
BLOCK = dict(multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5, qk_norm=True)
STRENGTH = 0.75


def released_names(state):
    """ComfyUI's names of the ControlNet (fused qkv, `out`, `q_norm`/`k_norm`) as the released file has them."""
    out = {}
    for name, t in state.items():
        if name.endswith(".attention.qkv.weight"):
            q, k, v = t.chunk(3, dim=0)
            for part, x in (("to_q", q), ("to_k", k), ("to_v", v)):
                out[name.replace(".qkv.", f".{part}.")] = x.contiguous()
            continue
        new = name.replace(".attention.out.", ".attention.to_out.0.")
        new = new.replace(".attention.q_norm.", ".attention.norm_q.").replace(".attention.k_norm.", ".attention.norm_k.")
        out[new] = t
    return out


def main():
    import_comfyui()
    import comfy.latent_formats
    import comfy.ops
    from comfy.ldm.lumina.controlnet import ZImage_Control
    from comfy.ldm.lumina.model import NextDiT, TimestepEmbedder
    from comfy_extras.nodes_model_patch import ZImageControlPatch, z_image_convert

    ops = comfy.ops.disable_weight_init
    os.makedirs(OUT, exist_ok=True)
    base = NextDiT(patch_size=2, in_channels=16, dim=64, n_layers=6, n_refiner_layers=2, n_heads=2, n_kv_heads=2,
                   cap_feat_dim=32, axes_dims=[8, 12, 12], axes_lens=[1536, 512, 512], rope_theta=256.0,
                   z_image_modulation=True, time_scale=1000.0, pad_tokens_multiple=32, operations=ops,
                   **BLOCK).eval()
    # ComfyUI's t-embedder widens to 256 for modulations that take min(dim, 256): at dim 64 both are 64 (the
    # same class, as the released model's are both 256).
    base.t_embedder = TimestepEmbedder(64, output_size=64, operations=ops).eval()
    save_file(randomize(base, 51), f"{OUT}/base.safetensors")
    control = ZImage_Control(dim=64, n_heads=2, n_kv_heads=2, n_control_layers=6, control_in_dim=16,
                             operations=comfy.ops.manual_cast, **BLOCK).eval()
    stored = randomize(control, 52)
    save_file(released_names(stored), f"{OUT}/control.safetensors")
    # What ComfyUI's loader makes of the released names is what the module holds.
    converted = z_image_convert(released_names(stored))
    assert set(converted) == set(stored), set(converted) ^ set(stored)
    assert all(torch.equal(converted[k], stored[k]) for k in stored)

    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, 16, 8, 12, generator=g)
    sigma = torch.tensor([0.6, 0.6])
    context = torch.randn(2, 7, 32, generator=g)
    latent = torch.randn(1, 16, 8, 12, generator=g)
    io = {"x": x, "sigma": sigma, "context": context, "latent": latent,
          "latent.model": comfy.latent_formats.Flux().process_in(latent.clone())}
    image = torch.zeros(1, 8 * 8, 12 * 8, 3)
    with torch.no_grad():
        io["out.none"] = base(x, sigma, context, context.shape[1])
        patch = ZImageControlPatch(Patch(control), StandInVae(latent), image, STRENGTH)
        options = {"patches": {"noise_refiner": [patch], "double_block": [patch]}}
        io["out.control"] = base(x, sigma, context, context.shape[1], transformer_options=options)
        print("change from no control", float((io["out.control"] - io["out.none"]).abs().max()))
        # A second call gives the same (the patch starts over each call).
        again = base(x, sigma, context, context.shape[1], transformer_options=options)
        assert torch.equal(again, io["out.control"])
        # An odd latent: padded to 8 x 12, where the control image (64 x 96 pixels) needs no re-encoding.
        io["x.odd"] = torch.randn(2, 16, 7, 11, generator=g)
        patch = ZImageControlPatch(Patch(control), StandInVae(latent), image, STRENGTH)
        options = {"patches": {"noise_refiner": [patch], "double_block": [patch]}}
        io["out.odd"] = base(io["x.odd"], sigma, context, context.shape[1], transformer_options=options)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
