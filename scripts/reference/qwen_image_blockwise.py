"""Fixtures for Kiln's Qwen-Image DiffSynth block-wise ControlNet (engine/models/tests/fixtures/qwen_image_blockwise/),
from ComfyUI's own modules (comfy_extras/nodes_model_patch.py at 0f1fa67a: QwenImageBlockWiseControlNet and
DiffSynthCnetPatch, the patch `QwenImageDiffsynthControlnet` puts after every block) on the tiny MMDiT of
qwen_image.py.

Run from the repository root, after qwen_image.py (whose weights are the base model here):
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/qwen_image_blockwise.py

ComfyUI builds the network with 60 blocks (the released model's); these have 2, one per block of the tiny
MMDiT. The patch's VAE is a stand-in that hands back `latent` (the control image's encoding is the VAE's own
test), at the latents' size, so the patch uses it as it is.

Writes (weights bf16 with ComfyUI's names, the reference in f32 on their values):
- blockwise.safetensors: `img_in` over 64 features (a control image's latent), 2 blocks.
- inpaint.safetensors: `img_in` over 68 (the latent and a mask channel), 2 blocks.
- io.safetensors (f32): `x` [2, 16, 8, 12], `sigma` [2], `context` [2, 5, 48], `latent` [1, 16, 8, 12] (VAE
  space) and `latent.model` (the same in the model's space, as the patch normalises it); the patch's
  conditioning tokens `cond.blockwise` and `cond.inpaint` (without a mask: a channel of ones); the base
  model's output with each patch at strength 0.8, `out.blockwise` and `out.inpaint`, and `out.none` without.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

BASE = "engine/models/tests/fixtures/qwen_image/weights.safetensors"
OUT = "engine/models/tests/fixtures/qwen_image_blockwise"
CONFIG = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
              num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(4, 14, 14))
STRENGTH = 0.8


class StandInVae:
    """What ComfyUI's ControlNet patches (DiffSynthCnetPatch, ZImageControlPatch) ask of a VAE: an encoding
    (here fixed) and its spatial compression."""

    def __init__(self, latent):
        self.latent = latent

    def encode(self, image):
        return self.latent.clone()

    def spacial_compression_encode(self):
        return 8


class Patch:
    """What ComfyUI's ControlNet patches ask of a MODEL_PATCH: the network."""

    def __init__(self, model):
        self.model = model


def main():
    import_comfyui()
    import comfy.latent_formats
    import comfy.ops
    from comfy.ldm.qwen_image.model import QwenImageTransformer2DModel
    from comfy_extras.nodes_model_patch import DiffSynthCnetPatch, QwenImageBlockWiseControlNet

    ops = comfy.ops.disable_weight_init
    os.makedirs(OUT, exist_ok=True)
    base = QwenImageTransformer2DModel(**CONFIG, operations=ops).eval()
    base.load_state_dict({k: v.float() for k, v in load_file(BASE).items()}, strict=True)

    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 16, 8, 12, generator=g)
    sigma = torch.tensor([0.6, 0.6])
    context = torch.randn(2, 5, 48, generator=g)
    latent = torch.randn(1, 16, 1, 8, 12, generator=g)  # the Wan VAE encodes an image as one frame
    io = {"x": x, "sigma": sigma, "context": context, "latent": latent.squeeze(2),
          "latent.model": comfy.latent_formats.Wan21().process_in(latent.clone()).squeeze(2)}
    image = torch.zeros(1, 8 * 8, 12 * 8, 3)
    with torch.no_grad():
        io["out.none"] = base(x.unsqueeze(2), sigma, context).squeeze(2)
        for name, extra, seed in [("blockwise", 0, 41), ("inpaint", 4, 42)]:
            net = QwenImageBlockWiseControlNet(num_layers=2, dim=64, additional_in_dim=extra,
                                               operations=comfy.ops.manual_cast).eval()
            save_file(randomize(net, seed), f"{OUT}/{name}.safetensors")
            patch = DiffSynthCnetPatch(Patch(net), StandInVae(latent), image, STRENGTH)
            io[f"cond.{name}"] = patch.encoded_image.clone()
            options = {"patches": {"double_block": [patch]}}
            io[f"out.{name}"] = base(x.unsqueeze(2), sigma, context, transformer_options=options).squeeze(2)
            print(name, "change from no patch", float((io[f"out.{name}"] - io["out.none"]).abs().max()))
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
