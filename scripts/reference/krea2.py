"""Fixtures for Krea 2 (engine/models/tests/fixtures/krea2/): ComfyUI's `SingleStreamDiT` (comfy/ldm/krea2/model.py)
as a tiny random network built by ComfyUI's own class, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd is not
imported, so no torchaudio stand-in is needed):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/krea2.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; model.py is comfy/ldm/krea2/model.py):
- model.py:24-35 RMSNorm: eps 1e-5, weight `scale` stored zero-centred, applied as F.rms_norm(x.float(),
  weight = scale.float() + 1) and cast back. Every norm of the model is one (block pre/post norms, per-head q/k
  norms, the text adapter's norms, txtmlp.0, last.norm).
- model.py:48-60 SwiGLU: down(silu(gate(x)) * up(x)), no biases, width 128 * ceil(int(2 * features / 3) *
  multiplier / 128) (read from the gate weight's rows here).
- model.py:63-102 Attention: wq, wk, wv, gate, wo without biases; q, k per-head RMSNorm, then (with positions)
  flux's apply_rope (interleaved pairs); k and v repeat_interleave'd to the query heads (GQA); unmasked
  attention; wo(out * sigmoid(gate(x))).
- model.py:105-124 SimpleModulation (last.modulation.lin [2, F]: scale = t + lin[0], shift = t + lin[1]) and
  DoubleSharedModulation (blocks.N.mod.lin [6F] added to tvec, then chunks prescale, preshift, pregate,
  postscale, postshift, postgate in that order).
- model.py:127-166 TextFusionTransformer: context [B, L, n, d] -> [B*L, n, d]; two layerwise blocks (pre-norm
  attention across the n tapped layers of one token, no positions, then pre-norm SwiGLU, plain residuals); the
  projector Linear(n, 1) (no bias) over the layer axis -> [B, L, d]; two refiner blocks over the tokens (no
  positions, no mask).
- model.py:169-223 SingleStreamBlock: x + pregate * attn((1 + prescale) * prenorm(x) + preshift), then
  x + postgate * mlp((1 + postscale) * postnorm(x) + postshift); with timestep_zero_index the tokens from that index
  on take the second half of vec's batch (the t = 0 modulation).
- model.py:226-236 LastLayer: linear((1 + scale) * norm(x) + shift) (linear with bias).
- model.py:239-288 SingleStreamDiT.__init__: head dim features // heads; RoPE axes [hd - 12 (hd // 16),
  6 (hd // 16), 6 (hd // 16)] = (32, 48, 48) at 128, EmbedND theta int(1e3); first Linear(4C, F) with bias;
  tmlp Linear(tdim, F), GELU(tanh), Linear(F, F); txtmlp RMSNorm(d), Linear(d, F), GELU(tanh), Linear(F, F);
  tproj GELU(tanh), Linear(F, 6F).
- model.py:297-306 process_img: pad_to_patch_size (circular, bottom/right), patches "b c (h ph) (w pw) -> b (h w)
  (c ph pw)" (channel-major), ids (index, row, column) with index 0 for the latent.
- model.py:308-405 _forward: a 5-D x [B, C, T, H, W] is reshaped (not permuted) to [B*T, C, H, W] (the identity
  for T = 1); context [B, L, n*d] -> [B, L, n, d]; references only when ref_latents_method is not None (the
  model's default_ref_method, None: model_detection.py:949-962 never sets it): each ref (5-D reshaped likewise)
  repeat_to_batch_size'd, patched with index i = 1, 2, ... at rows/columns from 0, appended after the latent's
  tokens; method "index_timestep_zero" modulates them by the t = 0 embedding, any other name ("offset", "index",
  "uxo") places them the same way with the normal modulation. t = tmlp(timestep_embedding(timesteps, tdim)) with
  flux's timestep_embedding (flux/layers.py:29-48: 1000 * t first, freqs exp(-ln(1e4) k / half), [cos, sin]);
  tvec = tproj(t). Sequence: text tokens (ids 0, 0, 0) then image tokens. Last layer modulated by t (not tvec);
  out = the latent's tokens, un-patched channel-major, cropped to the input's sides.
- model_base.py:2469 Krea2: ModelType.FLUX -> ModelSamplingFlux (model_sampling.py:406-433): timestep(sigma) =
  sigma (the DiT scales by 1000 itself); CONST: denoised = x - out * sigma. supported_models.py:1903-1929:
  shift 1.15 (ModelSamplingFlux's mu), multiplier 1.0 (unused by ModelSamplingFlux), latent format Wan21.
- model_detection.py:949-962: `txtfusion.projector.weight`; features, channels = first.weight cols / 4, layers,
  heads = wq rows / 128, kvheads = wk rows / 128, txtlayers = projector cols, txtdim; txtheads and txtkvheads are
  left at the class defaults (20), so ComfyUI's own detection builds text heads of txtdim // 20: 128 wide only at
  the released 2560. The tiny file's txtdim 128 would give 6-wide text heads; the tiny model is built with
  txtheads = txtkvheads = 1 (txtdim / 128, what Kiln derives), recorded in cases.json `comfy_detection`.

The tiny config (released values in brackets): features 256 [6144], heads 2 [48] / kvheads 1 [12] of 128, layers 2
[28], multiplier 1 [4] (SwiGLU 256 [16384]), tdim 64 [256], channels 16 [16], patch 2, txtlayers 3 [12], txtdim
128 [2560], txtheads 1 / txtkvheads 1 [20 / 20] (text SwiGLU 128 [6912]), theta 1e3.

Writes engine/models/tests/fixtures/krea2/:
- dit.safetensors: SingleStreamDiT.state_dict() (ComfyUI's names, no prefix), every tensor bf16 (a 2M-parameter
  model in f32 would not fit the budget; computed in f32 from exactly these values). Weights N(0, 1) /
  sqrt(fan_in), biases 0.1 N, RMSNorm scales (zero-centred) 0.1 N, mod.lin and modulation.lin 0.1 N.
- dit_io.safetensors (f32), per case c: `{c}.x`, `{c}.t` [B] (sigma: what the model gets), `{c}.context`
  [B, L, 3 * 128], `{c}.ref0`, ... (reference latents), `{c}.out` = SingleStreamDiT(x, t, context, ref_latents,
  ref_latents_method): t2i x [1, 16, 8, 8]; odd x [1, 16, 7, 9] (padding); batch x [2, 16, 6, 8] t [1.0, 0.2];
  ref_tz x [2, 16, 6, 6], one ref [1, 16, 4, 6] under index_timestep_zero; ref_offset x [1, 16, 6, 4], refs
  [1, 16, 5, 4] and [1, 16, 4, 6] under offset; ref_ignored: ref_offset's inputs with no method (the output is
  the plain forward's, asserted).
- dit_cases.json: per case its inputs' shapes, t and method; the SingleStreamDiT kwargs; ComfyUI's detection of
  dit.safetensors; `released`: the shapes of SingleStreamDiT() built with the class defaults (the released K2's
  sizes) and ComfyUI's detection of them.

Checks: the loaded module holds exactly the written values; a 5-D [B, C, 1, H, W] input gives the 4-D output
with the frame axis; ComfyUI's Krea2 model_base (supported_models.Krea2 -> get_model -> apply_model) on case t2i
denoises as x - out * sigma with timestep = sigma. Cross-check (max |diff| / max |ref|, CPU f32): a plain-torch
restatement of the forward from the state dict (below, no ComfyUI code) on every case: 2.2e-7 to 5.7e-7 this run.
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

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/krea2")
SEED = 72
BUDGET = 5_000_000

DIT = dict(features=256, tdim=64, txtdim=128, heads=2, kvheads=1, multiplier=1, layers=2, patch=2, channels=16,
           theta=1e3, txtlayers=3, txtheads=1, txtkvheads=1)
# name: (batch, h, w, text tokens, t, refs [(batch, h, w)], method)
CASES = {
    "t2i": (1, 8, 8, 5, [0.75], [], None),
    "odd": (1, 7, 9, 4, [0.4], [], None),
    "batch": (2, 6, 8, 6, [1.0, 0.2], [], None),
    "ref_tz": (2, 6, 6, 3, [0.9, 0.3], [(1, 4, 6)], "index_timestep_zero"),
    "ref_offset": (1, 6, 4, 4, [0.6], [(1, 5, 4), (1, 4, 6)], "offset"),
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
        if name.endswith((".scale", ".lin", "bias")):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
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
    from comfy.ldm.krea2.model import SingleStreamDiT

    return SingleStreamDiT(**kwargs, operations=comfy.ops.manual_cast).eval()


# --------------------------------------------------------------------------- a plain-torch restatement (no ComfyUI)


class Plain:
    """The forward written again from the state dict with torch's own ops: what the docstring says the model does."""

    def __init__(self, sd, cfg):
        self.w = sd
        self.cfg = cfg

    def norm(self, x, name):
        s = self.w[name]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + s)

    def lin(self, x, name, bias=True):
        y = x @ self.w[f"{name}.weight"].T
        return y + self.w[f"{name}.bias"] if bias else y

    def rotate(self, x, cos, sin):
        # x [B, H, L, D]; pairs (2i, 2i + 1) rotated by the angle of pair i.
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def attn(self, x, p, heads, kvheads, rope=None):
        B, L, _ = x.shape
        split = lambda t, h: t.view(B, L, h, 128).transpose(1, 2)  # noqa: E731
        q = split(self.lin(x, f"{p}.wq", False), heads)
        k = split(self.lin(x, f"{p}.wk", False), kvheads)
        v = split(self.lin(x, f"{p}.wv", False), kvheads)
        q = self.norm(q, f"{p}.qknorm.qnorm.scale")
        k = self.norm(k, f"{p}.qknorm.knorm.scale")
        if rope is not None:
            q, k = self.rotate(q, *rope), self.rotate(k, *rope)
        k = k.repeat_interleave(heads // kvheads, dim=1)
        v = v.repeat_interleave(heads // kvheads, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(128)
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, heads * 128)
        return self.lin(o * torch.sigmoid(self.lin(x, f"{p}.gate", False)), f"{p}.wo", False)

    def mlp(self, x, p):
        return self.lin(F.silu(self.lin(x, f"{p}.gate", False)) * self.lin(x, f"{p}.up", False), f"{p}.down", False)

    def text_block(self, x, p):
        h = self.cfg["txtdim"] // 128
        x = x + self.attn(self.norm(x, f"{p}.prenorm.scale"), f"{p}.attn", h, self.cfg["txtkvheads"])
        return x + self.mlp(self.norm(x, f"{p}.postnorm.scale"), f"{p}.mlp")

    def sinusoid(self, t, dim):
        half = dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = (1000.0 * t)[:, None] * freqs[None]
        return torch.cat((args.cos(), args.sin()), -1)

    def patches(self, x):
        x = F.pad(x, (0, (-x.shape[3]) % 2, 0, (-x.shape[2]) % 2), mode="circular")
        B, C, H, W = x.shape
        tokens = x.view(B, C, H // 2, 2, W // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(B, H * W // 4, C * 4)
        ids = [(r, c) for r in range(H // 2) for c in range(W // 2)]
        return tokens, ids, H // 2, W // 2

    def forward(self, x, t, context, refs=(), method=None):
        cfg, w = self.cfg, self.w
        B, C, H, W = x.shape
        F_ = cfg["features"]
        img, ids, rows, cols = self.patches(x)
        pos = [(0, r, c) for r, c in ids]
        n_img = img.shape[1]
        if method is not None:
            for i, ref in enumerate(refs, 1):
                ref = ref.expand(B, -1, -1, -1) if ref.shape[0] == 1 else ref
                tok, rids, _, _ = self.patches(ref)
                img = torch.cat((img, tok), 1)
                pos += [(i, r, c) for r, c in rids]
        img = self.lin(img, "first")

        def tmlp(ts):
            hidden = F.gelu(self.lin(self.sinusoid(ts, cfg["tdim"]), "tmlp.0"), approximate="tanh")
            return self.lin(hidden, "tmlp.2")

        def tproj(tt):
            return self.lin(F.gelu(tt, approximate="tanh"), "tproj.1")

        temb = tmlp(t)  # [B, F]
        mods = [tproj(temb)]
        if method == "index_timestep_zero" and refs:
            mods.append(tproj(tmlp(torch.zeros_like(t))))
        # The text adapter.
        L = context.shape[1]
        txt = context.view(B * L, cfg["txtlayers"], cfg["txtdim"])
        for i in range(2):
            txt = self.text_block(txt, f"txtfusion.layerwise_blocks.{i}")
        txt = (txt * w["txtfusion.projector.weight"][0][None, :, None]).sum(1).view(B, L, cfg["txtdim"])
        for i in range(2):
            txt = self.text_block(txt, f"txtfusion.refiner_blocks.{i}")
        txt = self.lin(F.gelu(self.lin(self.norm(txt, "txtmlp.0.scale"), "txtmlp.1"), approximate="tanh"), "txtmlp.3")
        x = torch.cat((txt, img), 1)
        # RoPE: text at (0, 0, 0), image tokens at their ids; axes (32, 48, 48), theta 1000.
        pos = torch.tensor([(0, 0, 0)] * L + pos, dtype=torch.float64)
        angles = []
        for a, d in enumerate((32, 48, 48)):
            omega = 1000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            angles.append(pos[:, a:a + 1] * omega[None])
        angles = torch.cat(angles, -1).float()
        rope = (angles.cos(), angles.sin())
        zero_at = L + n_img if len(mods) == 2 else x.shape[1]
        for i in range(cfg["layers"]):
            p = f"blocks.{i}"
            chunks = [(m + w[f"{p}.mod.lin"]).chunk(6, -1) for m in mods]

            def modulated(y, k):
                parts = [y[:, :zero_at] * (1 + chunks[0][k][:, None]) + chunks[0][k + 1][:, None]]
                if len(chunks) == 2:
                    parts.append(y[:, zero_at:] * (1 + chunks[1][k][:, None]) + chunks[1][k + 1][:, None])
                return torch.cat(parts, 1)

            def gated(y, k):
                parts = [y[:, :zero_at] * chunks[0][k][:, None]]
                if len(chunks) == 2:
                    parts.append(y[:, zero_at:] * chunks[1][k][:, None])
                return torch.cat(parts, 1)

            a = self.attn(modulated(self.norm(x, f"{p}.prenorm.scale"), 0), f"{p}.attn", cfg["heads"], cfg["kvheads"],
                          rope)
            x = x + gated(a, 2)
            m = self.mlp(modulated(self.norm(x, f"{p}.postnorm.scale"), 3), f"{p}.mlp")
            x = x + gated(m, 5)
        y = x[:, L:L + n_img]
        lin = w["last.modulation.lin"]
        y = self.norm(y, "last.norm.scale") * (1 + temb + lin[0])[:, None] + (temb + lin[1])[:, None]
        y = self.lin(y, "last.linear")
        y = y.view(B, rows, cols, C, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(B, C, rows * 2, cols * 2)
        return y[:, :, :H, :W]


# ---------------------------------------------------------------------------------------------------- fixtures


def released():
    """The released K2's weight shapes (the class defaults) and ComfyUI's detection of them."""
    import comfy.model_detection

    with torch.device("meta"):
        model = build()
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    detected = comfy.model_detection.detect_unet_config({k: v for k, v in model.state_dict().items()}, "")
    return {"shapes": shapes, "detect_unet_config": detected,
            "kwargs": "SingleStreamDiT() defaults: features 6144, tdim 256, txtdim 2560, heads 48, kvheads 12, "
                      "multiplier 4, layers 28, channels 16, txtlayers 12, txtheads 20, txtkvheads 20"}


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
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    model.load_state_dict(f32(weights), strict=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k].float()), k
    plain = Plain(f32(weights), DIT)
    detected = comfy.model_detection.detect_unet_config(weights, "")
    print(f"ComfyUI's detect_unet_config of the tiny file: {detected}")

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    ctx_width = DIT["txtlayers"] * DIT["txtdim"]
    with torch.no_grad():
        for name, (b, h, w, n, t, refs, method) in CASES.items():
            x = torch.randn(b, 16, h, w, generator=g)
            context = torch.randn(b, n, ctx_width, generator=g)
            refs = [torch.randn(rb, 16, rh, rw, generator=g) for rb, rh, rw in refs]
            t = torch.tensor(t)
            kwargs = {} if method is None else {"ref_latents_method": method}
            out = model(x, t, context, ref_latents=refs or None, transformer_options={}, **kwargs)
            assert out.shape == x.shape and torch.isfinite(out).all()
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.out": out})
            io.update({f"{name}.ref{i}": r for i, r in enumerate(refs)})
            cases[name] = {"x": list(x.shape), "t": t.tolist(), "context": list(context.shape),
                           "refs": [list(r.shape) for r in refs], "method": method, "out": list(out.shape)}
            report(f"plain torch vs ComfyUI, case {name}", rel_err(plain.forward(x, t, context, refs, method), out),
                   1e-5)
            print(f"case {name}: x {tuple(x.shape)}, t {t.tolist()}, refs {[tuple(r.shape) for r in refs]}, "
                  f"method {method}, out std {out.std():.3f}, max |out| {out.abs().max():.3f}")

        # References without a method are ignored (the model's default_ref_method is None).
        c = "ref_offset"
        refs = [io[f"{c}.ref0"], io[f"{c}.ref1"]]
        ignored = model(io[f"{c}.x"], io[f"{c}.t"], io[f"{c}.context"], ref_latents=refs, transformer_options={})
        plain_out = model(io[f"{c}.x"], io[f"{c}.t"], io[f"{c}.context"], transformer_options={})
        assert torch.equal(ignored, plain_out)
        io["ref_ignored.out"] = ignored
        cases["ref_ignored"] = {"inputs": "ref_offset's (x, t, context, ref0, ref1), no ref_latents_method",
                                "out": list(ignored.shape)}
        # A referenced output differs from the plain one (the references reach the latent's tokens).
        assert rel_err(io[f"{c}.out"], plain_out) > 1e-2
        # "index" places references as "offset" does (any method but index_timestep_zero).
        index = model(io[f"{c}.x"], io[f"{c}.t"], io[f"{c}.context"], ref_latents=refs, transformer_options={},
                      ref_latents_method="index")
        assert torch.equal(index, io[f"{c}.out"])

        # The t = 0 modulation of index_timestep_zero changes the output (against the same references placed alike).
        c = "ref_tz"
        alike = model(io[f"{c}.x"], io[f"{c}.t"], io[f"{c}.context"], ref_latents=[io[f"{c}.ref0"]],
                      transformer_options={}, ref_latents_method="index")
        assert rel_err(alike, io[f"{c}.out"]) > 1e-2

        # A 5-D latent with one frame.
        five = model(io["t2i.x"].unsqueeze(2), io["t2i.t"], io["t2i.context"], transformer_options={})
        assert torch.equal(five.squeeze(2), io["t2i.out"]) and five.shape == (1, 16, 1, 8, 8)

        # ComfyUI's model_base path: Krea2 (ModelType.FLUX), timestep = sigma, denoised = x - out * sigma.
        mc = comfy.supported_models.Krea2({"image_model": "krea2", **DIT})
        mc.set_inference_dtype(torch.float32, None)
        based = mc.get_model({})
        based.diffusion_model.load_state_dict(f32(weights), strict=True)
        sigma = io["t2i.t"]
        assert float(based.model_sampling.timestep(sigma)) == float(sigma)
        assert isinstance(based.model_sampling, comfy.model_sampling.ModelSamplingFlux)
        assert abs(based.model_sampling.shift - 1.15) < 1e-12
        denoised = based.apply_model(io["t2i.x"], sigma, c_crossattn=io["t2i.context"])
        err = rel_err(denoised, io["t2i.x"] - io["t2i.out"] * sigma.view(-1, 1, 1, 1))
        print(f"Krea2.apply_model, case t2i (sigma 0.75): denoised vs x - out * sigma {err:.2e}")
        assert err < 1e-5

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({"seed": SEED, "kwargs": DIT, "t_is": "sigma (ModelSamplingFlux; the DiT multiplies by 1000)",
                   "storage": "dit.safetensors bf16; computed in f32 from the stored values",
                   "cases": cases,
                   "comfy_detection": {"detect_unet_config": detected,
                                       "note": "txtheads/txtkvheads are left at 20 by ComfyUI's detection: the "
                                               "tiny file is built with 1 (txtdim / 128) instead"},
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
