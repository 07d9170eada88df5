"""Fixtures for Kiln's Qwen-Image MMDiT (engine/models/tests/fixtures/qwen_image/), from ComfyUI's own
QwenImageTransformer2DModel (comfy/ldm/qwen_image/model.py at 0f1fa67a), cross-checked with diffusers'.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/qwen_image.py

ComfyUI and diffusers centre odd token grids differently (models-qwen-image.md 3.4); Kiln matches ComfyUI, so
ComfyUI's module computes the recorded outputs, and diffusers' QwenImageTransformer2DModel on the same weights
must agree on the even-grid case (checked here, within 1e-5).

Writes:
- weights.safetensors: a tiny random MMDiT with the released structure (2 double-stream blocks, 2 heads of
  width 32, inner width 64, text width 48, RoPE axes (4, 14, 14) = the released (16, 56, 56) scaled to the head,
  patch 2 over 16 channels), ComfyUI's (= diffusers') names, bf16; the reference runs in f32 on those values.
  RMS-norm weights and biases are random too.
- io.safetensors (f32): for each case, `x.<c>` [B, 16, h, w], `sigma.<c>` [B], `context.<c>` [B, N, 48] and
  ComfyUI's output `out.<c>` [B, 16, h, w]. Cases: even (8x4 latent, one sample), odd (6x10: a 3x5 token grid,
  two samples at different sigmas), ragged (5x7: circular padding to 6x8, then cropped).
- references: `ref.1` [1, 16, 6, 4] and `ref.2` [1, 16, 3, 5] (model space, as ComfyUI's model gets them)
  with the odd case's inputs, the output for each reference method: `out.refs.index`,
  `out.refs.negative_index`, `out.refs.offset` (`uxo` takes the same branch), `out.refs.index_timestep_zero`
  (Qwen-Image-Edit 2511's: placed as `index`, the references' tokens modulated at timestep 0). That last one is
  also checked here to be what a model built with `default_ref_method="index_timestep_zero"` (whose state dict
  carries the `__index_timestep_zero__` marker ComfyUI detects 2511 by) computes with no method given, and
  cross-checked with diffusers' `zero_cond_t` on the even case with two even crops of `ref.1` (within 1e-5;
  diffusers starts the text after every image's grid, ComfyUI after the latents', so the references' grids
  stay no larger than the latents').
- Qwen-Image-Layered: `layered.addition_t_embedding` [2, 64] (bf16 values; the layered file's extra weight),
  `x.layered` [1, 16, 3, 6, 4] (three frames), `context.layered`, `sigma.layered`, and ComfyUI's outputs
  `out.layered` [1, 16, 3, 6, 4] and, with `ref.2` as a reference, `out.layered.ref`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/qwen_image"
CONFIG = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=32,
              num_attention_heads=2, joint_attention_dim=48, axes_dims_rope=(4, 14, 14))


def main():
    import_comfyui()
    import comfy.ops
    from comfy.ldm.qwen_image.model import QwenImageTransformer2DModel
    from diffusers import QwenImageTransformer2DModel as Diffusers

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(23)
    model = QwenImageTransformer2DModel(**CONFIG, operations=comfy.ops.disable_weight_init).eval()
    stored = randomize(model)
    save_file(stored, f"{OUT}/weights.safetensors")

    g = torch.Generator().manual_seed(7)
    cases = {"even": (1, 8, 4, 5, [0.7]), "odd": (2, 6, 10, 4, [0.9, 0.25]), "ragged": (1, 5, 7, 3, [0.5])}
    io = {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas) in cases.items():
            x = torch.randn(b, 16, h, w, generator=g)
            context = torch.randn(b, n, 48, generator=g)
            sigma = torch.tensor(sigmas)
            out = model(x.unsqueeze(2), sigma, context).squeeze(2)
            io.update({f"x.{name}": x, f"sigma.{name}": sigma, f"context.{name}": context, f"out.{name}": out})
            print(name, tuple(out.shape), float(out.abs().max()))

        refs = [torch.randn(1, 16, 6, 4, generator=g), torch.randn(1, 16, 3, 5, generator=g)]
        io["ref.1"], io["ref.2"] = refs
        x, context, sigma = io["x.odd"], io["context.odd"], io["sigma.odd"]
        for method in ["index", "negative_index", "offset", "index_timestep_zero"]:
            # A batch-1 reference serves every sample (ComfyUI repeats a cond to the batch).
            out = model(x.unsqueeze(2), sigma, context, ref_latents=[r.repeat(2, 1, 1, 1).unsqueeze(2) for r in refs],
                        ref_latents_method=method).squeeze(2)
            io[f"out.refs.{method}"] = out
            print("refs", method, tuple(out.shape), float(out.abs().max()))
        print("index_timestep_zero vs index: max |difference|",
              float((io["out.refs.index_timestep_zero"] - io["out.refs.index"]).abs().max()))

        # Edit 2511's file: the marker buffer makes `index_timestep_zero` the default method.
        edit = QwenImageTransformer2DModel(**CONFIG, default_ref_method="index_timestep_zero",
                                           operations=comfy.ops.disable_weight_init).eval()
        state = {k: v.float() for k, v in stored.items()}
        state["__index_timestep_zero__"] = torch.tensor([])
        edit.load_state_dict(state, strict=True)
        out = edit(x.unsqueeze(2), sigma, context,
                   ref_latents=[r.repeat(2, 1, 1, 1).unsqueeze(2) for r in refs]).squeeze(2)
        assert torch.equal(out, io["out.refs.index_timestep_zero"])

        # diffusers on the same weights, packed tokens (channel-major 2x2 patches), even grid only.
        ref = Diffusers(**{k: v for k, v in CONFIG.items()}).eval()
        missing = ref.load_state_dict({k: v.float() for k, v in stored.items()}, strict=False)
        assert not missing.missing_keys, missing.missing_keys
        x, context, sigma = io["x.even"], io["context.even"], io["sigma.even"]
        b, c, h, w = x.shape
        packed = pack(x)
        v = ref(packed, context, torch.ones(b, context.shape[1], dtype=torch.bool), sigma,
                img_shapes=[[(1, h // 2, w // 2)]] * b, return_dict=False)[0]
        v = v.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        diff = float((v - io["out.even"]).abs().max())
        print(f"diffusers on the even case: max |difference| {diff:.2e}")
        assert diff < 1e-5

        # diffusers' 2511 (`zero_cond_t`) on the even case with two references of even token grids.
        edit = Diffusers(**CONFIG, zero_cond_t=True).eval()
        assert not edit.load_state_dict({k: v.float() for k, v in stored.items()}, strict=False).missing_keys
        refs = [io["ref.1"][:, :, :4, :4], io["ref.1"][:, :, 2:6, :4]]
        want = model(x.unsqueeze(2), sigma, context, ref_latents=[r.unsqueeze(2) for r in refs],
                     ref_latents_method="index_timestep_zero").squeeze(2)
        tokens = torch.cat([pack(t) for t in [x] + refs], dim=1)
        shapes = [(1, t.shape[2] // 2, t.shape[3] // 2) for t in [x] + refs]
        v = edit(tokens, context, torch.ones(b, context.shape[1], dtype=torch.bool), sigma,
                 img_shapes=[shapes] * b, return_dict=False)[0][:, :h * w // 4]
        v = v.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        diff = float((v - want).abs().max())
        print(f"diffusers' zero_cond_t on the even case with references: max |difference| {diff:.2e}")
        assert diff < 1e-5

        # Qwen-Image-Layered: its file adds `addition_t_embedding` (row 0 joins the timestep embedding) and
        # its latents have frames (the layers), numbered 0, 1, 2 on RoPE's frame axis.
        layered = QwenImageTransformer2DModel(**CONFIG, use_additional_t_cond=True,
                                              operations=comfy.ops.disable_weight_init).eval()
        g2 = torch.Generator().manual_seed(11)
        addition = torch.randn(2, 64, generator=g2).to(torch.bfloat16).float()
        state = {k: v.float() for k, v in stored.items()}
        state["time_text_embed.addition_t_embedding.weight"] = addition
        layered.load_state_dict(state, strict=True)
        x = torch.randn(1, 16, 3, 6, 4, generator=g2)
        context = torch.randn(1, 5, 48, generator=g2)
        sigma = torch.tensor([0.6])
        io.update({"layered.addition_t_embedding": addition, "x.layered": x, "context.layered": context,
                   "sigma.layered": sigma})
        io["out.layered"] = layered(x, sigma, context)
        io["out.layered.ref"] = layered(x, sigma, context, ref_latents=[io["ref.2"].unsqueeze(2)])
        for k in ["out.layered", "out.layered.ref"]:
            print(k, tuple(io[k].shape), float(io[k].abs().max()))
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


def randomize(module, seed=None):
    """Random bf16-representable values for every parameter (norm weights near 1, small biases, weights scaled
    by their fan-in), from the seed when one is given, else from torch's generator as it stands; sets them on
    `module` and returns them in bf16 by name."""
    if seed is not None:
        torch.manual_seed(seed)
    stored = {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or ".norm_" in name:
                value = 1.0 + 0.2 * torch.randn_like(p)
            elif name.endswith("bias"):
                value = 0.1 * torch.randn_like(p)
            else:
                value = torch.randn_like(p) / max(1, p.shape[-1]) ** 0.5
            s = value.to(torch.bfloat16)
            p.copy_(s.float())
            stored[name] = s.contiguous()
    return stored


def pack(x):
    """Latents [B, C, H, W] as diffusers' packed tokens (row-major 2x2 patches, channel-major features)."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


if __name__ == "__main__":
    main()
