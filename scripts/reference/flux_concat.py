"""Fixtures for the extra input channels of FLUX.1 Fill and Canny/Depth (engine/src/nodes/builtin/concat.rs),
from ComfyUI's own `comfy.model_base.Flux.concat_cond` at 0f1fa67a.

The function is called unbound, on a stand-in `self` that holds only what it reads: the diffusion model's
`img_in.weight` (its shape gives the input channels) and `patch_size`, the model config's `in_channels` and
`out_channels`, and `process_latent_in` (ComfyUI's own `comfy.latent_formats.Flux().process_in`). Its inputs are
passed as `encode_model_conds` passes them: `noise`, `device`, the conditioning's `concat_latent_image` and
`concat_mask` only where the conditioning has them, and `denoise_mask` (the latent's noise mask as the sampler
reshapes it to the latents, or None).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/flux_concat.py

Writes engine/tests/fixtures/flux_concat/cases.safetensors (f32). For each case c: `c.noise_shape` (the latents'
shape, all the function reads of them), `c.image` (concat_latent_image, VAE space), `c.mask` (concat_mask) and
`c.denoise_mask` where the case has them, `c.in_channels` (one value: the model's input channels, 96 for Fill, 32
for Canny/Depth) and `c.out` (ComfyUI's result).
"""

import os
import sys
import types

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/flux_concat"


def fake_model(in_channels, latent_format):
    """What `Flux.concat_cond` reads of `self`, for a model of `in_channels` inputs (patch 2, 16 outputs)."""
    patch = 2
    diffusion_model = types.SimpleNamespace(
        img_in=types.SimpleNamespace(weight=torch.empty(8, in_channels * patch * patch)),
        patch_size=patch,
    )
    model_config = types.SimpleNamespace(unet_config={"in_channels": in_channels, "out_channels": 16})
    return types.SimpleNamespace(
        diffusion_model=diffusion_model,
        model_config=model_config,
        process_latent_in=latent_format.process_in,
    )


def main():
    import_comfyui()
    import comfy.latent_formats
    import comfy.model_base
    import comfy.utils

    g = torch.Generator().manual_seed(7)

    def randn(*shape):
        return torch.randn(shape, generator=g)

    def rand(*shape):
        return torch.rand(shape, generator=g)

    n1 = randn(1, 16, 6, 8)
    n2 = randn(2, 16, 6, 8)
    cases = {
        # The image latent at another size (bilinear, centre crop), the mask at the latents' pixels.
        "fill_mask": (
            96,
            {"noise": n1, "concat_latent_image": randn(1, 16, 12, 10), "concat_mask": rand(1, 1, 48, 64)},
        ),
        # The mask at another size (resized to 8h × 8w with the centre crop).
        "fill_mask_resized": (
            96,
            {"noise": n1, "concat_latent_image": randn(1, 16, 6, 8), "concat_mask": rand(1, 1, 40, 50)},
        ),
        # No concat_mask: the latent's noise mask, at the latents' shape (its channels made to differ, so their
        # mean is exercised; the sampler's repeats one channel).
        "fill_denoise": (
            96,
            {"noise": n1, "concat_latent_image": randn(1, 16, 6, 8), "denoise_mask": rand(1, 16, 6, 8)},
        ),
        # Neither mask (ones) and no image (zeros, still put in the model's latent space).
        "fill_none": (96, {"noise": n1}),
        # One image and mask for two latents.
        "fill_batch": (
            96,
            {"noise": n2, "concat_latent_image": randn(1, 16, 12, 10), "concat_mask": rand(1, 1, 40, 50)},
        ),
        # Three images and three (small, upscaled) masks for two latents.
        "fill_batch_down": (
            96,
            {"noise": n2, "concat_latent_image": randn(3, 16, 6, 8), "concat_mask": rand(3, 1, 16, 20)},
        ),
        # Canny/Depth: the image latent alone.
        "canny": (32, {"noise": n1, "concat_latent_image": randn(1, 16, 6, 8)}),
    }

    latent_format = comfy.latent_formats.Flux()
    io = {}
    for name, (in_channels, inputs) in cases.items():
        kwargs = {"device": torch.device("cpu"), "denoise_mask": None, **inputs}
        out = comfy.model_base.Flux.concat_cond(fake_model(in_channels, latent_format), **kwargs)
        assert out is not None, name
        io[f"{name}.in_channels"] = torch.tensor([float(in_channels)])
        io[f"{name}.noise_shape"] = torch.tensor([float(d) for d in inputs["noise"].shape])
        for key, field in [("concat_latent_image", "image"), ("concat_mask", "mask"), ("denoise_mask", "denoise_mask")]:
            if inputs.get(key) is not None:
                io[f"{name}.{field}"] = inputs[key]
        io[f"{name}.out"] = out
        print(name, tuple(out.shape))
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.float().contiguous().clone() for k, v in io.items()}, f"{OUT}/cases.safetensors")
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
