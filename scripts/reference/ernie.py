"""Fixtures for ERNIE-Image's DiT (engine/models/tests/fixtures/ernie/): ComfyUI's `ErnieImageModel`
(comfy/ldm/ernie/model.py) as tiny random networks built by ComfyUI's own class, and what ComfyUI computes with
them.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd is not
imported, so no torchaudio stand-in is needed; the RoPE comes from the comfy-kitchen package, installed in the
reference venv):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/ernie.py

ComfyUI code this relies on (model.py is comfy/ldm/ernie/model.py at 0f1fa67a):
- ErnieImagePatchEmbedDynamic: x_embedder.proj, a Conv2d (bias) whose kernel is the patch (1: ComfyUI's detection
  never sets another), its output flattened row-major into tokens.
- text_proj: a bias-free Linear(text_in_dim, hidden), absent when text_in_dim == hidden (the context is then used
  as is).
- Timesteps(hidden, flip_sin_to_cos=False): [sin, cos] of t * exp(-ln(1e4) k / (hidden / 2)) in float32 (sin half
  first), cast to the model's dtype; TimestepEmbedding: linear_1, SiLU, linear_2 -> c. adaLN_modulation: SiLU,
  Linear(hidden, 6 hidden) -> (shift, scale, gate) of the attention, then of the MLP, shared by every layer.
- ErnieImageSharedAdaLNBlock: x + gate * attn(RMSNorm(x) * (1 + scale) + shift), then likewise the MLP; the
  RMSNorms (adaLN_sa_ln, adaLN_mlp_ln) have a weight, used as is, eps 1e-6.
- ErnieImageAttention: bias-free to_q, to_k, to_v, to_out.0; heads of hidden / heads; per-head RMSNorm of q and k
  (norm_q, norm_k, weight as is, eps 1e-6) and RoPE through comfy_kitchen's rms_rope_split_half (eval, rotary
  given: the fused path; comfy_kitchen/backends/eager/rope.py: F.rms_norm with the weight, then
  apply_rope_split_half1); unmasked attention over [image tokens, text tokens], scale 1 / sqrt(head_dim).
- ErnieImageEmbedND3 with comfy_kitchen's split-half rotation: per token the angles a (axes concatenated,
  head_dim / 2 of them, pos * theta^(-2k/d) in float64, cos/sin stored float32); cos_top/sin_top = the first
  head_dim / 4 of them repeat_interleave'd to head_dim / 2, cos_bot/sin_bot the last head_dim / 4 likewise; feature
  j < head_dim / 2 becomes cos_top[j] x[j] - sin_top[j] x[j + head_dim / 2], feature j + head_dim / 2 becomes
  sin_bot[j] x[j] + cos_bot[j] x[j + head_dim / 2]: the pairs (j, j + head_dim / 2) of rotate-half, but the two
  halves of a pair turned by different angles.
- ErnieImageFeedForward: linear_fc2(up_proj(x) * gelu(gate_proj(x))) (erf GELU, no biases).
- ErnieImageModel.forward: tokens [image (row-major), text]; positions: text token i (i, 0, 0), image token (r, c)
  (T + shift_t, linspace(shift_y, (Hp - 1) scale_y + shift_y, Hp)[r], likewise x[c]) in float32 with T the text
  length (rope_options from transformer_options, identity without); final_norm: LayerNorm without affine (eps
  1e-6) then x * (1 + scale) + shift with (scale, shift) = final_norm.linear(c) (c itself, no SiLU);
  final_linear (bias) on the image tokens, un-patched to [B, out_channels, H, W].
- supported_models.py ErnieImage: sampling multiplier 1000, shift 3.0, latent format Flux2 (128 channels);
  model_base.py ErnieImage: ModelType.FLOW (ModelSamplingDiscreteFlow: timestep = sigma * 1000, denoised = x - out *
  sigma), c_crossattn -> context. model_detection.py: a file with `layers.0.mlp.linear_fc2.weight` is ERNIE-Image,
  built with the class defaults (hidden 4096, 32 heads, 36 layers, ffn 12288, in/out 128, text_in_dim 3072, rope
  axes (32, 48, 48), theta 256): it reads no widths from the file. Kiln reads them all from shapes (see
  engine/models/src/ernie/config.rs), which gives the defaults for the released file and lets the tiny ones load.

The tiny configs (released values in brackets), theta 256, eps 1e-6, in/out 128 channels (the Flux2 latent's),
patch 1:
- `tiny`: hidden 128 [4096], 2 heads of 64 [32 of 128], 2 layers [36], ffn 64 [12288], text_in_dim 48 [3072], rope
  axes (16, 24, 24) (Kiln's rule for a head of width hd: (hd / 4, 3 hd / 8, 3 hd / 8)) [(32, 48, 48)].
- `wide`: hidden 128, 1 head of 128 (the released head width and axes (32, 48, 48)), 1 layer, ffn 64, text_in_dim
  128 = hidden (no text_proj). (Two 128-wide heads would need hidden 256, over the fixture budget.)

Writes engine/models/tests/fixtures/ernie/:
- {tiny,wide}.safetensors: ErnieImageModel.state_dict() (ComfyUI's names, no prefix), every tensor bf16 (computed
  in f32 from exactly these values). Linear and conv weights N(0, 1) / sqrt(fan_in), biases 0.1 N, RMSNorm weights
  1 + 0.1 N.
- io.safetensors (f32), per case c: `{c}.x` [B, 128, H, W], `{c}.t` [B] (sigma * 1000: what the DiT gets),
  `{c}.context` [B, T, text_in_dim], `{c}.out` = ErnieImageModel(x, t, context, transformer_options=...).
- cases.json: per case its model, inputs' shapes, t and rope_options; each model's kwargs; ComfyUI's detection of
  the tiny file; `released`: the shapes of ErnieImageModel() with the class defaults (built on the meta device) and
  ComfyUI's detection of them.

Checks: the loaded modules hold exactly the written values; the fused RoPE path (rms_rope_split_half) gives what the
unfused one (norms, then apply_rope_split_half) gives; ComfyUI's ErnieImage model_base (supported_models.ErnieImage
-> get_model -> apply_model) on one case denoises as x - out * sigma with timestep sigma * 1000.
"""

import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/ernie")
SEED = 57
BUDGET = 2_000_000

COMMON = dict(in_channels=128, out_channels=128, patch_size=1, rope_theta=256, eps=1e-6)
MODELS = {
    "tiny": dict(hidden_size=128, num_attention_heads=2, num_layers=2, ffn_hidden_size=64, text_in_dim=48,
                 rope_axes_dim=(16, 24, 24), **COMMON),
    "wide": dict(hidden_size=128, num_attention_heads=1, num_layers=1, ffn_hidden_size=64, text_in_dim=128,
                 rope_axes_dim=(32, 48, 48), **COMMON),
}
ROPE = {"scale_x": 2.0, "scale_y": 0.5, "shift_t": 1.5, "shift_y": 3.0, "shift_x": -1.0}
# name: (model, batch, h, w, text tokens, t (sigma * 1000), rope_options)
CASES = {
    "one": ("tiny", 1, 4, 6, 7, [900.0], None),
    "batch": ("tiny", 2, 6, 4, 1, [900.0, 300.0], None),
    "odd": ("tiny", 1, 5, 3, 3, [300.0], None),
    "rope": ("tiny", 1, 4, 6, 7, [600.0], ROPE),
    "wide": ("wide", 2, 4, 6, 7, [900.0, 300.0], None),
    "wide_one": ("wide", 1, 6, 4, 1, [300.0], None),
}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_weights(draw, module):
    """Every state_dict entry re-drawn and rounded to bf16 (see the docstring)."""
    out = {}
    for name, p in module.state_dict().items():
        if p.dim() == 1 and (name.endswith("ln.weight") or "norm_" in name):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(math.prod(p.shape[1:])))
        out[name] = v.to(torch.bfloat16).contiguous()
    return out


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def build(**kwargs):
    import comfy.ops
    from comfy.ldm.ernie.model import ErnieImageModel

    return ErnieImageModel(**kwargs, operations=comfy.ops.manual_cast).eval()


def released():
    """The class defaults' (the released model's) weight shapes and ComfyUI's detection of them."""
    import comfy.model_detection

    with torch.device("meta"):
        model = build()
    sd = model.state_dict()
    detected = comfy.model_detection.detect_unet_config(sd, "")
    return {"shapes": {k: list(v.shape) for k, v in sd.items()}, "detect_unet_config": detected,
            "note": "ErnieImageModel() with the class defaults, which ComfyUI's detection always uses"}


def main():
    import_comfyui()
    import comfy.model_detection
    import comfy.model_management
    import comfy.model_sampling
    import comfy.quant_ops
    import comfy.supported_models

    assert not comfy.model_management.in_training
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    draw = Draw(SEED)
    models, detected = {}, {}
    for name, kwargs in MODELS.items():
        model = build(**kwargs)
        weights = draw_weights(draw, model)
        save_file(weights, f"{OUT}/{name}.safetensors")
        weights = load_file(f"{OUT}/{name}.safetensors")
        model.load_state_dict(f32(weights), strict=True)
        for k, v in model.state_dict().items():
            assert torch.equal(v, weights[k].float()), k
        assert (model.text_proj is None) == (kwargs["text_in_dim"] == kwargs["hidden_size"])
        models[name] = model
        detected[name] = comfy.model_detection.detect_unet_config(weights, "")
        print(f"ComfyUI's detect_unet_config of {name}.safetensors: {detected[name]}")

    # The fused RoPE path ComfyUI takes at inference and the unfused one agree (on the tiny model's first layer).
    attn = models["tiny"].layers[0].self_attention
    q = torch.randn(2, 5, 2, 64, generator=draw.g)
    k = torch.randn(2, 5, 2, 64, generator=draw.g)
    ids = torch.randint(0, 9, (2, 5, 3), generator=draw.g).float()
    with torch.no_grad():
        rot = models["tiny"].pos_embed(ids)
        fq, fk = comfy.quant_ops.ck.rms_rope_split_half(q, k, rot, attn.norm_q.weight, attn.norm_k.weight, 1e-6)
        uq, uk = comfy.quant_ops.ck.apply_rope_split_half(attn.norm_q(q), attn.norm_k(k), rot)
    assert rel_err(fq, uq) < 1e-6 and rel_err(fk, uk) < 1e-6

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (which, b, h, w, n, t, rope) in CASES.items():
            model, kwargs = models[which], MODELS[which]
            x = torch.randn(b, 128, h, w, generator=g)
            context = torch.randn(b, n, kwargs["text_in_dim"], generator=g)
            t = torch.tensor(t)
            options = {} if rope is None else {"rope_options": rope}
            out = model(x, t, context, transformer_options=options)
            assert out.shape == x.shape and torch.isfinite(out).all()
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.out": out})
            cases[name] = {"model": which, "x": list(x.shape), "t": t.tolist(), "context": list(context.shape),
                           "rope_options": rope, "out": list(out.shape)}
            print(f"case {name} ({which}): x {tuple(x.shape)}, t {t.tolist()}, text {n}, rope {rope}, "
                  f"out std {out.std():.3f}, max |out| {out.abs().max():.3f}")

        # The RoPE options move the output.
        plain = models["tiny"](io["rope.x"], io["rope.t"], io["rope.context"], transformer_options={})
        assert rel_err(plain, io["rope.out"]) > 1e-2

        # ComfyUI's model_base path: ErnieImage (ModelType.FLOW), timestep = sigma * 1000, denoised = x - out * sigma.
        kwargs = MODELS["tiny"]
        mc = comfy.supported_models.ErnieImage({"image_model": "ernie", **kwargs})
        assert mc.sampling_settings == {"multiplier": 1000.0, "shift": 3.0}
        mc.set_inference_dtype(torch.float32, None)
        based = mc.get_model({})
        based.diffusion_model.load_state_dict(models["tiny"].state_dict(), strict=True)
        c = "batch"
        sigma = io[f"{c}.t"] / 1000.0
        assert isinstance(based.model_sampling, comfy.model_sampling.ModelSamplingDiscreteFlow)
        assert abs(based.model_sampling.shift - 3.0) < 1e-12 and based.model_sampling.multiplier == 1000
        assert torch.allclose(based.model_sampling.timestep(sigma), io[f"{c}.t"])
        denoised = based.apply_model(io[f"{c}.x"], sigma, c_crossattn=io[f"{c}.context"])
        err = rel_err(denoised, io[f"{c}.x"] - io[f"{c}.out"] * sigma.view(-1, 1, 1, 1))
        print(f"ErnieImage.apply_model, case {c}: denoised vs x - out * sigma {err:.2e}")
        assert err < 1e-5

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({"seed": SEED, "models": MODELS, "t_is": "sigma * 1000 (ModelSamplingDiscreteFlow, multiplier 1000)",
                   "storage": "{tiny,wide}.safetensors bf16; computed in f32 from the stored values",
                   "cases": cases,
                   "comfy_detection": {"detect_unet_config": detected,
                                       "note": "ComfyUI's detection reads no widths (the class defaults); the "
                                               "tiny files are built with the kwargs above"},
                   "released": released()}, f, indent=1)
        f.write("\n")

    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        print(f"  {name:30} {size:9d} bytes")
    print(f"  total {total} bytes")
    assert total < BUDGET, total


if __name__ == "__main__":
    main()
