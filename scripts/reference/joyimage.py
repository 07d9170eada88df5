"""Fixtures for JoyAI Image Edit's DiT (engine/models/tests/fixtures/joyimage/): ComfyUI's
`JoyImageTransformer3DModel` (comfy/ldm/joyimage/model.py) as a tiny random network built by ComfyUI's own class,
and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd is not
imported, so no torchaudio stand-in is needed):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/joyimage.py

ComfyUI code this relies on (model.py is comfy/ldm/joyimage/model.py at 0f1fa67a):
- JoyImageModulate: `modulate_table` [1, 6, D] added to vec [B, 6, D], chunks (shift, scale, gate) of the
  attention then of the MLP.
- JoyImageFeedForward: net.0 = GELU_approx (Linear then tanh GELU), net.2 = Linear; both with biases.
- JoyImageAttention: qkv Linear (bias) chunked q, k, v, each split into heads; text q/k RMSNorm (eps 1e-6, weight as
  is); image q/k through comfy_kitchen.rms_rope: F.rms_norm with the weight, then RoPE on interleaved pairs
  (2i, 2i + 1) (comfy_kitchen's eager backend, rope.py: `split_half=False`); joint unmasked attention over
  [image tokens, text tokens] (image first; the text has no positions); separate output projections.
- JoyImageTransformerBlock: LayerNorm without affine (eps 1e-6), x * (1 + scale) + shift, gated residuals; the
  image and text streams each with their own modulation table, norms and MLP, the same vec for both.
- JoyImageTimeTextImageEmbedding: Timesteps(256, flip_sin_to_cos=True, shift 0) (lightricks/model.py:
  [cos, sin] of t * exp(-ln(1e4) k / 128)), TimestepEmbedding (linear_1, SiLU, linear_2), then time_proj(SiLU(temb))
  -> vec [B, 6D]; temb itself is unused. Text: PixArtAlphaTextProjection (linear_1, tanh GELU, linear_2).
- _get_rotary_pos_embed_for_range / get_rotary_pos_embed_for_components: per axis (t, h, w) of rope_dim_list,
  freqs 1 / theta ** (arange(0, d, 2) / d) in float32, angles pos * freq in float32; components in the order
  [target, ref0, ref1, ...], t running on across them (offset += the component's patch frames), h and w from 0 for
  each.
- _forward: each component (target, then the references) pad_to_patch_size'd (circular, end of each of t, h, w),
  img_in (Conv3d, kernel = stride = patch) flattened (t, h, w)-major; only the target's tokens reach norm_out
  (LayerNorm, no affine, no modulation) and proj_out; unpatchify reads features (pt, ph, pw, c) (channels last),
  then crops to the input's sides.
- supported_models.py JoyImage: theta 10000 and rope_dim_list [16, 56, 56] override the class defaults (256 and
  the same list); sampling multiplier 1000, shift 1.5; latent format Wan21. model_base.py JoyImage:
  ModelType.FLOW (ModelSamplingDiscreteFlow: timestep = sigma * 1000, denoised = x - out * sigma); ref_latents
  through process_latent_in, repeated to the batch by CONDList.
- model_detection.py: recognised by double_blocks.0.attn.img_attn_qkv.weight, ...img_attn_q_norm.weight,
  condition_embedder.time_embedder.linear_1.weight and a 5-D img_in.weight; in_channels, hidden_size, patch_size
  from img_in, layers counted, heads = hidden / q_norm width; text_dim fixed at 4096 (Kiln reads it from
  condition_embedder.text_embedder.linear_1.weight, which gives 4096 for the released file and lets the tiny one
  load).

The tiny config (released values in brackets, from jd-opensource/JoyAI-Image's
joyai_image_comfyui/configs/transformer/config.json): hidden 128 [4096], heads 2 of 64 [32 of 128], layers 2 [40],
mlp ratio 4 [4], in_channels 16 [16], text_dim 64 [4096], patch [1, 2, 2], rope_dim_list [16, 24, 24] (Kiln's rule
for a head of width hd: [16, (hd - 16) / 2, (hd - 16) / 2]) [16, 56, 56], theta 10000.

Writes engine/models/tests/fixtures/joyimage/:
- weights.safetensors: JoyImageTransformer3DModel.state_dict() (ComfyUI's names, no prefix), every tensor bf16
  (computed in f32 from exactly these values). Linear and conv weights N(0, 1) / sqrt(fan_in), biases 0.1 N,
  modulation tables 0.1 N, RMSNorm weights 1 + 0.1 N.
- io.safetensors (f32), per case c: `{c}.x` [B, 16, T, H, W], `{c}.t` [B] (sigma * 1000: what the DiT gets),
  `{c}.context` [B, N, 64], `{c}.ref0`, ... (5-D reference latents), `{c}.out`: even (1 frame, 8x8), odd (7x9:
  padding), batch (2 samples, t 1000 and 200), ref1 (one reference), ref2 (two references of different sizes, one
  odd), frames (2 frames, a reference).
- cases.json: per case its inputs' shapes and t; the kwargs; ComfyUI's detection of weights.safetensors;
  `released`: the shapes of the released configuration (built on the meta device) and ComfyUI's detection of them.

Checks: the loaded module holds exactly the written values; ComfyUI's JoyImage model_base (supported_models.JoyImage
-> get_model -> apply_model, rope_dim_list set to the tiny one) on case ref1 gives x - out * sigma with timestep
sigma * 1000. Cross-check (max |diff| / max |ref|, CPU f32): a plain-torch restatement of the forward from the state
dict (below, no ComfyUI code) on every case.
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/joyimage")
SEED = 91
BUDGET = 5_000_000

DIT = dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=128, num_attention_heads=2, text_dim=64,
           mlp_width_ratio=4.0, num_layers=2, rope_dim_list=[16, 24, 24], theta=10000)
RELEASED = dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=4096, num_attention_heads=32, text_dim=4096,
                mlp_width_ratio=4.0, num_layers=40, rope_dim_list=[16, 56, 56], theta=10000)
# name: (batch, frames, h, w, text tokens, t (sigma * 1000), refs [(frames, h, w)])
CASES = {
    "even": (1, 1, 8, 8, 5, [750.0], []),
    "odd": (1, 1, 7, 9, 4, [400.0], []),
    "batch": (2, 1, 6, 8, 6, [1000.0, 200.0], []),
    "ref1": (1, 1, 6, 6, 3, [900.0], [(1, 4, 6)]),
    "ref2": (2, 1, 6, 4, 4, [600.0, 300.0], [(1, 5, 4), (1, 4, 6)]),
    "frames": (1, 2, 4, 6, 3, [500.0], [(1, 4, 4)]),
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
        if name.endswith("norm.weight"):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith(("bias", "modulate_table")):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(math.prod(p.shape[1:])))
        out[name] = v.to(torch.bfloat16).contiguous()
    return out


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


CROSS = []


def report(name, err, bound):
    CROSS.append(f"{name}: {err:.2e}")
    print(f"  {name}: max |diff| / max |ref| = {err:.2e}")
    assert err < bound, (name, err)


def build(**kwargs):
    import comfy.ops
    from comfy.ldm.joyimage.model import JoyImageTransformer3DModel

    return JoyImageTransformer3DModel(**kwargs, operations=comfy.ops.manual_cast).eval()


# --------------------------------------------------------------------------- a plain-torch restatement (no ComfyUI)


class Plain:
    """The forward written again from the state dict with torch's own ops: what the docstring says the model does."""

    def __init__(self, sd, cfg):
        self.w = sd
        self.cfg = cfg
        self.heads = cfg["num_attention_heads"]
        self.hd = cfg["hidden_size"] // self.heads

    def lin(self, x, name):
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def rms(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w[name]

    @staticmethod
    def ln(x):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6)

    @staticmethod
    def rotate(x, cos, sin):
        # x [B, L, H, D]; pairs (2i, 2i + 1) rotated by the angle of pair i; cos/sin [L, D/2].
        a, b = x[..., 0::2], x[..., 1::2]
        cos, sin = cos[None, :, None], sin[None, :, None]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def tokens(self, comp):
        pt, ph, pw = self.cfg["patch_size"]
        pad = []
        for i, p in reversed(list(enumerate((pt, ph, pw)))):
            pad += [0, (-comp.shape[2 + i]) % p]
        comp = F.pad(comp, pad, mode="circular")
        B, C, T, H, W = comp.shape
        grid = (T // pt, H // ph, W // pw)
        x = comp.view(B, C, grid[0], pt, grid[1], ph, grid[2], pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        x = x.reshape(B, math.prod(grid), C * pt * ph * pw)
        w = self.w["img_in.weight"].reshape(self.w["img_in.weight"].shape[0], -1)
        return x @ w.T + self.w["img_in.bias"], grid

    def angles(self, grids):
        parts, t0 = [], 0
        for t, h, w in grids:
            pos = torch.stack(torch.meshgrid(torch.arange(t0, t0 + t), torch.arange(h), torch.arange(w),
                                             indexing="ij"), 0).reshape(3, -1).float()
            cols = []
            for a, d in enumerate(self.cfg["rope_dim_list"]):
                freqs = 1.0 / (float(self.cfg["theta"]) ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
                cols.append(pos[a][:, None] * freqs[None])
            parts.append(torch.cat(cols, 1))
            t0 += t
        a = torch.cat(parts, 0)
        return a.cos(), a.sin()

    def forward(self, x, t, context, refs=()):
        cfg = self.cfg
        B, C, T, H, W = x.shape
        D, heads, hd = cfg["hidden_size"], self.heads, self.hd
        toks, grids = zip(*(self.tokens(c) for c in [x, *refs]))
        img = torch.cat(toks, 1)
        n_target = math.prod(grids[0])
        half = 128
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        emb = t[:, None] * freqs[None]
        emb = torch.cat((emb.cos(), emb.sin()), -1)
        temb = self.lin(F.silu(self.lin(emb, "condition_embedder.time_embedder.linear_1")),
                        "condition_embedder.time_embedder.linear_2")
        vec = self.lin(F.silu(temb), "condition_embedder.time_proj").view(B, 6, D)
        txt = self.lin(F.gelu(self.lin(context, "condition_embedder.text_embedder.linear_1"), approximate="tanh"),
                       "condition_embedder.text_embedder.linear_2")
        cos, sin = self.angles(grids)
        n_img = img.shape[1]
        for i in range(cfg["num_layers"]):
            p = f"double_blocks.{i}"
            im = (vec + self.w[f"{p}.img_mod.modulate_table"]).unbind(1)
            tm = (vec + self.w[f"{p}.txt_mod.modulate_table"]).unbind(1)
            img_in = self.ln(img) * (1 + im[1][:, None]) + im[0][:, None]
            txt_in = self.ln(txt) * (1 + tm[1][:, None]) + tm[0][:, None]
            iq, ik, iv = self.lin(img_in, f"{p}.attn.img_attn_qkv").view(B, n_img, 3, heads, hd).unbind(2)
            tq, tk, tv = self.lin(txt_in, f"{p}.attn.txt_attn_qkv").view(B, -1, 3, heads, hd).unbind(2)
            iq = self.rotate(self.rms(iq, f"{p}.attn.img_attn_q_norm.weight"), cos, sin)
            ik = self.rotate(self.rms(ik, f"{p}.attn.img_attn_k_norm.weight"), cos, sin)
            tq = self.rms(tq, f"{p}.attn.txt_attn_q_norm.weight")
            tk = self.rms(tk, f"{p}.attn.txt_attn_k_norm.weight")
            q, k, v = (torch.cat(pair, 1).transpose(1, 2) for pair in ((iq, tq), (ik, tk), (iv, tv)))
            o = ((q @ k.transpose(-1, -2)) / math.sqrt(hd)).softmax(-1) @ v
            o = o.transpose(1, 2).reshape(B, -1, D)
            img = img + self.lin(o[:, :n_img], f"{p}.attn.img_attn_proj") * im[2][:, None]
            txt = txt + self.lin(o[:, n_img:], f"{p}.attn.txt_attn_proj") * tm[2][:, None]

            def mlp(y, name):
                return self.lin(F.gelu(self.lin(y, f"{name}.net.0.proj"), approximate="tanh"), f"{name}.net.2")

            img = img + mlp(self.ln(img) * (1 + im[4][:, None]) + im[3][:, None], f"{p}.img_mlp") * im[5][:, None]
            txt = txt + mlp(self.ln(txt) * (1 + tm[4][:, None]) + tm[3][:, None], f"{p}.txt_mlp") * tm[5][:, None]
        y = self.lin(self.ln(img[:, :n_target]), "proj_out")
        (gt, gh, gw), (pt, ph, pw) = grids[0], cfg["patch_size"]
        y = y.view(B, gt, gh, gw, pt, ph, pw, C).permute(0, 7, 1, 4, 2, 5, 3, 6)
        y = y.reshape(B, C, gt * pt, gh * ph, gw * pw)
        return y[:, :, :T, :H, :W]


# ---------------------------------------------------------------------------------------------------- fixtures


def released():
    """The released configuration's weight shapes and ComfyUI's detection of them."""
    import comfy.model_detection

    with torch.device("meta"):
        model = build(**RELEASED)
    sd = model.state_dict()
    detected = comfy.model_detection.detect_unet_config(sd, "")
    return {"shapes": {k: list(v.shape) for k, v in sd.items()}, "detect_unet_config": detected,
            "kwargs": RELEASED,
            "source": "jd-opensource/JoyAI-Image joyai_image_comfyui/configs/transformer/config.json "
                      "(JoyImageEditTransformer3DModel: hidden_size 4096, num_attention_heads 32, num_layers 40, "
                      "text_dim 4096, in_channels 16, patch_size [1, 2, 2], rope_dim_list [16, 56, 56], "
                      "theta 10000, mlp_width_ratio 4.0)"}


def main():
    import_comfyui()
    import comfy.model_detection
    import comfy.model_sampling
    import comfy.supported_models

    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    draw = Draw(SEED)
    model = build(**DIT)
    weights = draw_weights(draw, model)
    save_file(weights, f"{OUT}/weights.safetensors")
    weights = load_file(f"{OUT}/weights.safetensors")
    model.load_state_dict(f32(weights), strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k].float()), k
    plain = Plain(f32(weights), DIT)
    detected = comfy.model_detection.detect_unet_config(weights, "")
    print(f"ComfyUI's detect_unet_config of the tiny file: {detected}")

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (b, frames, h, w, n, t, refs) in CASES.items():
            x = torch.randn(b, 16, frames, h, w, generator=g)
            context = torch.randn(b, n, DIT["text_dim"], generator=g)
            refs = [torch.randn(b, 16, rt, rh, rw, generator=g) for rt, rh, rw in refs]
            t = torch.tensor(t)
            out = model(x, t, context, ref_latents=refs or None, transformer_options={})
            assert out.shape == x.shape and torch.isfinite(out).all()
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.out": out})
            io.update({f"{name}.ref{i}": r for i, r in enumerate(refs)})
            cases[name] = {"x": list(x.shape), "t": t.tolist(), "context": list(context.shape),
                           "refs": [list(r.shape) for r in refs], "out": list(out.shape)}
            report(f"plain torch vs ComfyUI, case {name}", rel_err(plain.forward(x, t, context, refs), out), 1e-5)
            print(f"case {name}: x {tuple(x.shape)}, t {t.tolist()}, refs {[tuple(r.shape) for r in refs]}, "
                  f"out std {out.std():.3f}, max |out| {out.abs().max():.3f}")

        # The references reach the target's tokens.
        c = "ref2"
        alone = model(io[f"{c}.x"], io[f"{c}.t"], io[f"{c}.context"], transformer_options={})
        assert rel_err(alone, io[f"{c}.out"]) > 1e-2

        # ComfyUI's model_base path: JoyImage (ModelType.FLOW), timestep = sigma * 1000, denoised = x - out * sigma.
        mc = comfy.supported_models.JoyImage({"image_model": "joyimage", **DIT})
        assert mc.unet_config["rope_dim_list"] == [16, 56, 56] and mc.unet_config["theta"] == 10000
        mc.unet_config["rope_dim_list"] = DIT["rope_dim_list"]
        mc.set_inference_dtype(torch.float32, None)
        based = mc.get_model({})
        based.diffusion_model.load_state_dict(f32(weights), strict=True)
        c = "ref1"
        sigma = io[f"{c}.t"] / 1000.0
        assert isinstance(based.model_sampling, comfy.model_sampling.ModelSamplingDiscreteFlow)
        assert abs(based.model_sampling.shift - 1.5) < 1e-12 and based.model_sampling.multiplier == 1000
        assert torch.allclose(based.model_sampling.timestep(sigma), io[f"{c}.t"])
        denoised = based.apply_model(io[f"{c}.x"], sigma, c_crossattn=io[f"{c}.context"],
                                     ref_latents=[io[f"{c}.ref0"]])
        err = rel_err(denoised, io[f"{c}.x"] - io[f"{c}.out"] * sigma.view(-1, 1, 1, 1, 1))
        print(f"JoyImage.apply_model, case {c} (sigma {float(sigma):.2f}): denoised vs x - out * sigma {err:.2e}")
        assert err < 1e-5

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({"seed": SEED, "kwargs": DIT, "t_is": "sigma * 1000 (ModelSamplingDiscreteFlow, multiplier 1000)",
                   "storage": "weights.safetensors bf16; computed in f32 from the stored values",
                   "cases": cases,
                   "comfy_detection": {"detect_unet_config": detected,
                                       "note": "ComfyUI's detection fixes text_dim at 4096 and takes rope_dim_list "
                                               "[16, 56, 56] from supported_models: the tiny file is built with "
                                               "text_dim 64 and rope_dim_list [16, 24, 24] instead"},
                   "released": released()}, f, indent=1)
        f.write("\n")

    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        print(f"  {name:30} {size:9d} bytes")
    print(f"  total {total} bytes")
    print("CROSS-CHECKS (max |diff| / max |ref|):")
    for line in CROSS:
        print("  " + line)
    assert total < BUDGET, total


if __name__ == "__main__":
    main()
