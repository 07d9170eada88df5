"""Fixtures for Kiln's Qwen-Image ControlNets (engine/models/tests/fixtures/qwen_image_controlnet/), from
ComfyUI's own modules (comfy/ldm/qwen_image/controlnet.py at 0f1fa67a) on the tiny MMDiT of qwen_image.py,
the InstantX one cross-checked with diffusers' QwenImageControlNetModel.

Run from the repository root, after qwen_image.py (whose weights are the base model here):
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/qwen_image_controlnet.py

ComfyUI spreads an InstantX ControlNet's N block outputs over a fixed 60 blocks (each repeated ceil(60 / N)
times), diffusers over the base model's blocks (ceil(blocks / N)); they agree for one ControlNet block, which is
the diffusers cross-check here. Kiln follows ComfyUI.

Writes (weights bf16 with ComfyUI's names, the reference in f32 on their values):
- instantx.safetensors: an InstantX ControlNet (`controlnet_x_embedder` over 64 features), 1 block.
- inpaint.safetensors: the inpainting InstantX layout (68 features: 16 latent channels and the mask), 2 blocks.
- fun.safetensors: a VideoX-Fun ControlNet (`control_img_in` over 132 features, 5 control blocks, the first
  with `before_proj`), which runs on the base model's embeddings.
- io.safetensors (f32): `x` [2, 16, 8, 12], `sigma` [2], `context` [2, 5, 48] (two samples: a positive and a
  negative as the sampler batches them), `hint` [2, 16, 8, 12], `hint.inpaint` [2, 17, 8, 12]; each ControlNet's
  own outputs (`instantx.0`, `inpaint.0`, `inpaint.1`, `fun.0`..`fun.4`: one per ControlNet block, before
  the strength) and the base model's output with it applied at strength 0.75 (`out.instantx`,
  `out.inpaint`, `out.fun`; the Fun ControlNet's strength enters as its square root, as ComfyUI's
  `QwenFunControlNet` applies it), and `out.none` without control.
"""

import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

BASE = "engine/models/tests/fixtures/qwen_image/weights.safetensors"
OUT = "engine/models/tests/fixtures/qwen_image_controlnet"
CONFIG = dict(patch_size=2, in_channels=64, out_channels=16, attention_head_dim=32,
              num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(4, 14, 14))
STRENGTH = 0.75


def main():
    import_comfyui()
    import comfy.ops
    from comfy.ldm.qwen_image.controlnet import QwenImageControlNetModel, QwenImageFunControlNetModel
    from comfy.ldm.qwen_image.model import QwenImageTransformer2DModel
    from diffusers import QwenImageControlNetModel as DiffusersControlNet

    ops = comfy.ops.disable_weight_init
    os.makedirs(OUT, exist_ok=True)
    base = QwenImageTransformer2DModel(**CONFIG, num_layers=2, operations=ops).eval()
    base.load_state_dict({k: v.float() for k, v in load_file(BASE).items()}, strict=True)

    instantx = QwenImageControlNetModel(**CONFIG, num_layers=1, operations=ops).eval()
    save_file(randomize(instantx, 31), f"{OUT}/instantx.safetensors")
    inpaint = QwenImageControlNetModel(**CONFIG, num_layers=2, extra_condition_channels=4, operations=ops).eval()
    save_file(randomize(inpaint, 32), f"{OUT}/inpaint.safetensors")
    fun = QwenImageFunControlNetModel(control_in_features=132, inner_dim=64, num_attention_heads=2,
                                      attention_head_dim=32, operations=ops).eval()
    save_file(randomize(fun, 33), f"{OUT}/fun.safetensors")

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 16, 8, 12, generator=g)
    sigma = torch.tensor([0.6, 0.6])
    context = torch.randn(2, 5, 48, generator=g)
    hint = torch.randn(2, 16, 8, 12, generator=g)
    mask = (torch.rand(2, 1, 8, 12, generator=g) > 0.5).float()
    io = {"x": x, "sigma": sigma, "context": context, "hint": hint,
          "hint.inpaint": torch.cat([hint, mask], dim=1)}
    with torch.no_grad():
        io["out.none"] = base(x.unsqueeze(2), sigma, context).squeeze(2)
        runs = [
            ("instantx", instantx, dict(hint=hint.unsqueeze(2)), STRENGTH),
            ("inpaint", inpaint, dict(hint=io["hint.inpaint"].unsqueeze(2)), STRENGTH),
            ("fun", fun, dict(hint=hint.unsqueeze(2), base_model=base), math.sqrt(STRENGTH)),
        ]
        for name, net, extra, strength in runs:
            samples = net(x=x.unsqueeze(2), timesteps=sigma, context=context, **extra)["input"]
            unique = []
            for s in samples:
                if s is not None and not any(s is u for u in unique):
                    unique.append(s)
            for i, s in enumerate(unique):
                io[f"{name}.{i}"] = s.clone()
            control = {"input": [None if s is None else s * strength for s in samples]}
            io[f"out.{name}"] = base(x.unsqueeze(2), sigma, context, control=control).squeeze(2)
            print(name, len(unique), "outputs; change from no control",
                  float((io[f"out.{name}"] - io["out.none"]).abs().max()))

        # diffusers' InstantX ControlNet on the same weights: the same block outputs (packed tokens).
        ref = DiffusersControlNet(**CONFIG, num_layers=1).eval()
        missing = ref.load_state_dict({k: v.float() for k, v in load_file(f"{OUT}/instantx.safetensors").items()},
                                      strict=False)
        assert not missing.missing_keys, missing.missing_keys
        b, c, h, w = x.shape
        samples = ref(pack(x), pack(hint), 1.0, context, torch.ones(b, context.shape[1], dtype=torch.bool),
                      sigma, img_shapes=[[(1, h // 2, w // 2)]] * b, return_dict=False)
        diff = float((samples[0] - io["instantx.0"]).abs().max())
        print(f"diffusers' InstantX ControlNet: max |difference| {diff:.2e}")
        assert diff < 1e-5
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


def pack(x):
    """Latents [B, C, H, W] as diffusers' packed tokens (row-major 2x2 patches, channel-major features)."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


if __name__ == "__main__":
    main()
