"""Fixtures for PixelDiT's text-to-image DiT (engine/models/tests/fixtures/pixeldit/): ComfyUI's `PixDiT_T2I`
(comfy/ldm/pixeldit/model.py and modules.py) as a tiny random network built by ComfyUI's own class, its weights
written in the released file's layout, and what ComfyUI computes with them after its own
`process_unet_state_dict`.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd is not
imported; the RoPE comes from the comfy-kitchen package, installed in the reference venv):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/pixeldit.py

ComfyUI code this relies on (model.py and modules.py under comfy/ldm/pixeldit/ at 0f1fa67a):
- The released file's keys start with `core.` (model_detection: `{prefix}core.pixel_embedder.proj.weight` is
  pixeldit_t2i, checked after PiD's `lq_proj.latent_proj.0.weight`; it reads no widths: the class defaults).
  supported_models.PixelDiTT2I.process_unet_state_dict strips `core.` / `net.`, drops `_repa_projector*` and
  `net_ema.*`, and splits each pixel block's `adaLN_modulation.0.{weight,bias}` (rows (pixel, 6, pixel_dim):
  per pixel of the patch the six chunks shift/scale/gate of the attention, then of the MLP) into
  `adaLN_modulation_msa` (chunks 0-2 of every pixel) and `adaLN_modulation_mlp` (3-5).
- forward: x [B, 3, H, W] padded circularly to the patch (pad_to_patch_size), cropped back at the end. timesteps
  (sigma * 1000: ModelSamplingDiscreteFlow, multiplier 1000) -> TimestepEmbedder(max_period=10): [cos, sin] of
  t * exp(-ln(10) k / 128), k < 128, mlp.0, SiLU, mlp.2 -> t_emb; condition = SiLU(t_emb).
  Text: context[:, :txt_max_length] (longer text is cut), y_embedder (Linear with bias, then RMSNorm eps 1e-6 with
  weight) + y_pos_embedding[:, :L]. Image: F.unfold patches (features channel-major c, py, px) -> s_embedder.
- MMDiTBlockT2I (patch blocks): adaLN_modulation_img / _txt (Linear, 6 chunks: shift, scale, gate of attention,
  then MLP) of condition; RMSNorm (weight, eps 1e-6) * (1 + scale) + shift; joint attention: per stream bias-free
  qkv (3, heads, head_dim), per-head RMSNorm of q and k (weights, eps 1e-6), RoPE per stream (image: 2-D, text:
  1-D over positions 0..L-1, theta 1e4, the whole head), sequence [text, image], unmasked; proj_x / proj_y (bias);
  gated residuals; SwiGLU MLPs w2(silu(w1 x) * w3 x), hidden int(2 * 4 hidden / 3), no biases.
- The 2-D RoPE (precompute_freqs_cis_2d, Flux's interleaved pair layout): pair m of a head turns by
  pos_axis * theta^(-2 (m // 2) / (head_dim / 2)), axis x for even m, y for odd; positions
  x = linspace(shift_x, 16 scale_x + shift_x, Ws) and y likewise over Hs (float32; rope_options scale/shift, the
  identity without), theta 1e4. The pixel blocks use it over the same grid with their own head width.
- After the patch blocks s = SiLU(t_emb + s), one condition token per patch.
- PixelTokenEmbedder: per pixel Linear(3, pixel_dim) + 2-D sin/cos table (first half column x, second row y;
  each [sin, cos] of pos / 10000^(k / (d/4)), k < d/4) over the padded image, grouped per patch [B*L, p^2, pd].
- PiTBlock: msa = adaLN_modulation_msa(s) viewed [B*L, p^2, 3 pd] -> shift, scale, gate per pixel;
  RMSNorm(pd) * (1 + scale) + shift; compress_to_attn on the patch's p^2 * pd features -> one token per patch;
  RotaryAttention (bias-free qkv, q/k RMSNorm, 2-D RoPE, unmasked, proj with bias); expand_from_attn back to
  p^2 * pd; x + gate * that; then the MLP half likewise with Mlp (fc1, erf GELU, fc2, biases, hidden 4 pd).
- FinalLayer: RMSNorm(pd), Linear(pd, 3) per pixel; F.fold back to [B, 3, H, W] (pixel order within a patch
  row-major), cropped.
- model_base.PixelDiTT2I (ModelType.FLOW) passes attention_mask, which PixDiT_T2I ignores (its blocks get None).
  supported_models.PixelDiTT2I: sampling_settings {"shift": 4.0} (multiplier: ModelSamplingDiscreteFlow's
  default 1000), latent format PixelDiTPixel (ChromaRadiance's: RGB, identity), bf16 / f32.

The tiny config (released values in brackets): hidden 64 [1536], 4 heads of 16 [24 of 64], pixel_hidden 8 [16],
pixel attention 32 wide [1152] in 2 heads of 16 [16 of 72], patch_depth 2 [14], pixel_depth 2 [2], patch 4 [16],
txt_embed_dim 48 [2304], txt_max_length 8 [300], text RoPE on, theta 1e4.

Writes engine/models/tests/fixtures/pixeldit/:
- tiny.safetensors: the released layout (`core.` prefix, unsplit pixel-block adaLN_modulation.0), every tensor bf16
  (computed in f32 from exactly these values). Linear weights N(0, 1) / sqrt(fan_in), biases 0.1 N, RMSNorm
  weights 1 + 0.1 N, y_pos_embedding 0.5 N.
- io.safetensors (f32), per case c: `{c}.x` [B, 3, H, W], `{c}.t` [B] (sigma * 1000), `{c}.context` [B, T, 48],
  `{c}.out` = PixDiT_T2I(x, t, context, transformer_options=...) after process_unet_state_dict of tiny.safetensors.
- cases.json: per case its inputs' shapes, t and rope_options; the kwargs; ComfyUI's detection of the tiny file;
  `released`: the released layout's names and shapes of PixDiT_T2I() with the class defaults (built on the meta
  device) and ComfyUI's detection of them.

Checks: the split of the written file is exactly the model's state; an attention_mask changes nothing; ComfyUI's
PixelDiTT2I model_base (get_model -> apply_model) denoises as x - out * sigma with timestep sigma * 1000 and
ModelSamplingDiscreteFlow shift 4, multiplier 1000.
"""

import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/pixeldit")
SEED = 61
BUDGET = 2_000_000

KWARGS = dict(hidden_size=64, num_groups=4, pixel_hidden_size=8, pixel_attn_hidden_size=32, pixel_num_groups=2,
              patch_depth=2, pixel_depth=2, patch_size=4, txt_embed_dim=48, txt_max_length=8)
ROPE = {"scale_x": 2.0, "scale_y": 0.5, "shift_y": 3.0, "shift_x": -1.0, "scale_t": 1.0, "shift_t": 0.0}
# name: (batch, h, w, text tokens, t (sigma * 1000), rope_options)
CASES = {
    "one": (1, 8, 8, 7, [900.0], None),
    "odd": (1, 10, 7, 1, [300.0], None),
    "batch": (2, 8, 12, 7, [900.0, 300.0], None),
    "batch_odd": (2, 5, 6, 3, [500.0, 100.0], None),
    "long": (1, 8, 4, 11, [600.0], None),
    "single": (1, 3, 3, 2, [750.0], None),
    "rope": (1, 8, 8, 7, [600.0], ROPE),
}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_weights(draw, module):
    """Every state_dict entry (ComfyUI's processed names) re-drawn and rounded to bf16 (see the docstring)."""
    out = {}
    for name, p in module.state_dict().items():
        if name == "y_pos_embedding":
            v = draw.normal(p.shape, 0.5)
        elif p.dim() == 1 and ("norm" in name.rsplit(".", 2)[-2]):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(math.prod(p.shape[1:])))
        out[name] = v.to(torch.bfloat16).contiguous()
    return out


def released_layout(sd, pixel_dim):
    """ComfyUI's processed names back to the released file's: `core.` put in front and each pixel block's
    adaLN_modulation_msa / _mlp interleaved per pixel into adaLN_modulation.0 (the inverse of
    process_unet_state_dict)."""
    out = {}
    for k, v in sd.items():
        if ".adaLN_modulation_mlp." in k:
            continue
        if ".adaLN_modulation_msa." in k:
            base, suffix = k.split(".adaLN_modulation_msa.")
            mlp = sd[f"{base}.adaLN_modulation_mlp.{suffix}"]
            trail = v.shape[1:]
            p2 = v.shape[0] // (3 * pixel_dim)
            both = torch.cat([v.reshape(p2, 3, pixel_dim, *trail), mlp.reshape(p2, 3, pixel_dim, *trail)], dim=1)
            out[f"core.{base}.adaLN_modulation.0.{suffix}"] = both.reshape(6 * p2 * pixel_dim, *trail).contiguous()
        else:
            out[f"core.{k}"] = v
    return out


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def build(**kwargs):
    import comfy.ops
    from comfy.ldm.pixeldit.model import PixDiT_T2I

    return PixDiT_T2I(**kwargs, operations=comfy.ops.manual_cast).eval()


def processor():
    import comfy.supported_models

    return comfy.supported_models.PixelDiTT2I({"image_model": "pixeldit_t2i"})


def released():
    """The class defaults' (the released model's) weights in the released layout, and ComfyUI's detection."""
    import comfy.model_detection

    with torch.device("meta"):
        model = build()
    sd = model.state_dict()
    file = released_layout(sd, model.pixel_hidden_size)
    back = processor().process_unet_state_dict(dict(file))
    assert {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in sd.items()}
    detected = comfy.model_detection.detect_unet_config(file, "")
    return {"shapes": {k: list(v.shape) for k, v in file.items()}, "detect_unet_config": detected,
            "note": "PixDiT_T2I() with the class defaults (what ComfyUI's detection always builds), in the released "
                    "layout (core. prefix, unsplit pixel-block adaLN_modulation.0)"}


def main():
    import_comfyui()
    import comfy.model_detection
    import comfy.model_management
    import comfy.model_sampling
    import comfy.supported_models

    assert not comfy.model_management.in_training
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    draw = Draw(SEED)
    model = build(**KWARGS)
    weights = draw_weights(draw, model)
    save_file(released_layout(weights, KWARGS["pixel_hidden_size"]), f"{OUT}/tiny.safetensors")
    file = load_file(f"{OUT}/tiny.safetensors")
    detected = comfy.model_detection.detect_unet_config(file, "")
    print(f"ComfyUI's detect_unet_config of tiny.safetensors: {detected}")
    assert detected == {"image_model": "pixeldit_t2i"}
    processed = processor().process_unet_state_dict(dict(file))
    model.load_state_dict(f32(processed), strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k].float()), k

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (b, h, w, n, t, rope) in CASES.items():
            x = torch.randn(b, 3, h, w, generator=g)
            context = torch.randn(b, n, KWARGS["txt_embed_dim"], generator=g)
            t = torch.tensor(t)
            options = {} if rope is None else {"rope_options": rope}
            out = model(x, t, context, transformer_options=options)
            assert out.shape == x.shape and torch.isfinite(out).all()
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.out": out})
            cases[name] = {"x": list(x.shape), "t": t.tolist(), "context": list(context.shape),
                           "rope_options": rope, "out": list(out.shape)}
            print(f"case {name}: x {tuple(x.shape)}, t {t.tolist()}, text {n}, rope {rope}, "
                  f"out std {out.std():.3f}, max |out| {out.abs().max():.3f}")

        # The RoPE options move the output; text past txt_max_length is ignored; an attention mask changes nothing.
        plain = model(io["rope.x"], io["rope.t"], io["rope.context"], transformer_options={})
        assert rel_err(plain, io["rope.out"]) > 1e-2
        cut = model(io["long.x"], io["long.t"], io["long.context"][:, :KWARGS["txt_max_length"]])
        assert torch.equal(cut, io["long.out"])
        mask = torch.zeros(1, 7)
        mask[:, 3:] = -torch.inf
        masked = model(io["one.x"], io["one.t"], io["one.context"], attention_mask=mask)
        assert torch.equal(masked, io["one.out"])

        # ComfyUI's model_base path: PixelDiTT2I (ModelType.FLOW), timestep = sigma * 1000, denoised = x - out * sigma.
        mc = comfy.supported_models.PixelDiTT2I({"image_model": "pixeldit_t2i", **KWARGS})
        assert mc.sampling_settings == {"shift": 4.0}, mc.sampling_settings
        mc.set_inference_dtype(torch.float32, None)
        based = mc.get_model({})
        based.diffusion_model.load_state_dict(model.state_dict(), strict=True)
        c = "batch"
        sigma = io[f"{c}.t"] / 1000.0
        assert isinstance(based.model_sampling, comfy.model_sampling.ModelSamplingDiscreteFlow)
        assert abs(based.model_sampling.shift - 4.0) < 1e-12 and based.model_sampling.multiplier == 1000
        assert torch.allclose(based.model_sampling.timestep(sigma), io[f"{c}.t"])
        denoised = based.apply_model(io[f"{c}.x"], sigma, c_crossattn=io[f"{c}.context"])
        err = rel_err(denoised, io[f"{c}.x"] - io[f"{c}.out"] * sigma.view(-1, 1, 1, 1))
        print(f"PixelDiTT2I.apply_model, case {c}: denoised vs x - out * sigma {err:.2e}")
        assert err < 1e-5

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({"seed": SEED, "kwargs": KWARGS,
                   "t_is": "sigma * 1000 (ModelSamplingDiscreteFlow, multiplier 1000, shift 4)",
                   "storage": "tiny.safetensors bf16 in the released layout; computed in f32 from the stored values "
                              "after ComfyUI's process_unet_state_dict",
                   "cases": cases,
                   "comfy_detection": {"detect_unet_config": detected,
                                       "note": "ComfyUI's detection reads no widths (the class defaults); the tiny "
                                               "file is built with the kwargs above"},
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
