"""Fixture for Lotus depth's whole sampling path in Kiln's engine (engine/src/nodes/builtin/lotus.rs): ComfyUI's
own LotusD model, its LotusConditioning node and its custom-sampling nodes on a tiny Lotus UNet.

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/lotus_sampling.py

The tiny UNet has Lotus's structure where it matters to the sampling path (heads of 64, so its width is 64; the
1024-wide context LotusConditioning gives; the 4-wide label_emb ComfyUI's Lotus model feeds its task embedding)
and is otherwise as small as ComfyUI's UNetModel builds: one level of one ResBlock, no attention outside the middle
block. Its weights (std 1/sqrt(fan_in), biases std 0.1, norm scales 1 + 0.1 noise) are stored with every matrix
and conv kernel in fp8 e4m3 and the rest in bf16; ComfyUI runs in f32 on exactly those values.

ComfyUI builds the model as its loader would for a LotusD file (supported_models.LotusD on the detected UNet config:
model_base.Lotus, IMG_TO_IMG, ModelSamplingDiscrete) and samples through the nodes the templates use:
LotusConditioning -> BasicGuider, KSamplerSelect "euler", BasicScheduler "normal", SamplerCustomAdvanced.

Writes engine/tests/fixtures/lotus/:
- unet.safetensors: the tiny UNet under ComfyUI's (LDM) names.
- sampling.safetensors (f32): `latent` [1,4,8,12] (a VAE-space latent, as VAEEncode gives); `out.template`, the
  templates' run (1 step, SetFirstSigma 999, DisableNoise); `out.two_steps`, 2 normal steps from the table's
  largest sigma with RandomNoise(`seed`) (EPS noise scaling with max_denoise); `sigmas.two_steps` and `seed`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/lotus"
SEED = 7
WIDTH = 64


def tiny_unet_config():
    """ComfyUI's UNetModel arguments for the tiny Lotus (before LotusD's unet_extra_config)."""
    return {
        "use_checkpoint": False,
        "image_size": 32,
        "out_channels": 4,
        "use_spatial_transformer": True,
        "legacy": False,
        "adm_in_channels": 4,
        "in_channels": 4,
        "model_channels": WIDTH,
        "num_res_blocks": [1],
        "transformer_depth": [0],
        "transformer_depth_output": [0, 0],
        "channel_mult": [1],
        "transformer_depth_middle": 1,
        "use_linear_in_transformer": True,
        "context_dim": 1024,
        "use_temporal_resblock": False,
        "use_temporal_attention": False,
    }


def fp8_bf16(t):
    """The stored value: fp8 e4m3 for matrices and kernels, bf16 for vectors."""
    dtype = torch.float8_e4m3fn if t.ndim >= 2 else torch.bfloat16
    return t.to(dtype)


def tiny_weights(model):
    """Random stored weights for `model`'s state dict."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, p in model.state_dict().items():
        if name.endswith(".bias"):
            v = torch.randn(p.shape, generator=g) * 0.1
        elif p.ndim == 1:
            v = 1.0 + torch.randn(p.shape, generator=g) * 0.1
        else:
            fan_in = p[0].numel()
            v = torch.randn(p.shape, generator=g) / fan_in ** 0.5
        out[name] = fp8_bf16(v)
    return out


def main():
    import_comfyui(node_modules=True)
    import comfy.model_management
    import comfy.model_patcher
    import comfy.sample
    import comfy.samplers
    import comfy.supported_models
    from comfy_extras.nodes_custom_sampler import (
        BasicGuider, BasicScheduler, DisableNoise, KSamplerSelect, RandomNoise, SamplerCustomAdvanced,
        SetFirstSigma)
    from comfy_extras.nodes_lotus import LotusConditioning

    config = comfy.supported_models.LotusD(tiny_unet_config())
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({}, "")
    assert type(model).__name__ == "Lotus", type(model).__name__
    stored = tiny_weights(model.diffusion_model)
    model.diffusion_model.load_state_dict({k: v.float() for k, v in stored.items()}, strict=True)
    cpu = torch.device("cpu")
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)

    latent = torch.randn((1, 4, 8, 12), generator=torch.Generator().manual_seed(1))
    positive = LotusConditioning.execute().result[0]
    guider = BasicGuider.execute(model=patcher, conditioning=positive).result[0]
    sampler = KSamplerSelect.execute(sampler_name="euler").result[0]

    def run(noise, sigmas):
        with torch.no_grad():
            out = SamplerCustomAdvanced.execute(noise=noise, guider=guider, sampler=sampler, sigmas=sigmas,
                                                latent_image={"samples": latent.clone()})
        return out.result[0]["samples"].float()

    one = BasicScheduler.execute(model=patcher, scheduler="normal", steps=1, denoise=1.0).result[0]
    template = run(DisableNoise.execute().result[0], SetFirstSigma.execute(sigmas=one, sigma=999.0).result[0])
    two = BasicScheduler.execute(model=patcher, scheduler="normal", steps=2, denoise=1.0).result[0]
    two_steps = run(RandomNoise.execute(noise_seed=SEED).result[0], two)
    for name, t in [("template", template), ("two_steps", two_steps)]:
        assert torch.isfinite(t).all() and t.abs().max() > 0.1, name
        print(f"{name}: max |out| {t.abs().max():.4f}")
    print("sigmas", two.tolist())

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in stored.items()}, f"{OUT}/unet.safetensors")
    save_file({
        "latent": latent,
        "out.template": template.contiguous(),
        "out.two_steps": two_steps.contiguous(),
        "sigmas.two_steps": two.float().contiguous(),
        "seed": torch.tensor([float(SEED)]),
    }, f"{OUT}/sampling.safetensors")
    for f in ("unet.safetensors", "sampling.safetensors"):
        print(f, os.path.getsize(f"{OUT}/{f}"), "bytes")


if __name__ == "__main__":
    main()
