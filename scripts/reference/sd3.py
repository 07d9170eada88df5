"""Fixtures for Stable Diffusion 3 / 3.5's MMDiT (engine/models/tests/fixtures/sd3/): a tiny random network built by
ComfyUI's own OpenAISignatureMMDITWrapper, what it computes, and a tiny SD3.5 Large-style ControlNet run through
ComfyUI's own loader and ControlNet class.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; its extra pins
are listed in comfy_sampling.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/sd3.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; mmdit.py is
comfy/ldm/modules/diffusionmodules/mmdit.py):
- mmdit.py:752 MMDiT: hidden_size = 64 * depth, num_heads = depth (head width 64, mmdit.py:810-811); the last joint
  block's context_block is pre_only (mmdit.py:871: no attn.proj, no norm2/mlp, adaLN 2 * hidden: shift, scale);
  x_block_self_attn for the layers listed in x_block_self_attn_layers (none here, as SD3.5 Large / SD3 Medium).
- mmdit.py:1009-1022 forward: x = x_embedder(x) + cropped_pos_embed(hw); c = t_embedder(t) + y_embedder(y);
  context = context_embedder(context); joint blocks; final_layer; unpatchify; crop to the input's h, w.
- mmdit.py:57-107 PatchEmbed: pads right/bottom to the patch size, circularly (common_dit.py:5), then a Conv2d of
  kernel = stride = patch, flattened row-major to tokens [B, h*w, hidden].
- mmdit.py:892-918 cropped_pos_embed: h, w = (H + 1) // p, (W + 1) // p; the [1, max*max, hidden] `pos_embed`
  buffer viewed [max, max] row-major, cropped at top = (max - h) // 2, left = (max - w) // 2.
- mmdit.py:209-229 TimestepEmbedder: util.py:229 timestep_embedding(t, 256) ([cos, sin], freqs
  exp(-ln(10000) * i / 128)), Linear, SiLU, Linear; mmdit.py:232 VectorEmbedder: Linear, SiLU, Linear.
- mmdit.py:389-539 DismantledBlock: norm1/norm2 LayerNorm(eps 1e-6, no affine); adaLN SiLU + Linear to 6 * hidden
  chunked (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp); modulate = x * (1 + scale) + shift;
  Mlp fc1, GELU(tanh), fc2 (ratio 4). mmdit.py:260-308 SelfAttention: qkv Linear, split [B, L, 3, heads, 64]
  (mmdit.py:255), ln_q / ln_k = mmdit.py:325 RMSNorm(64, eps 1e-6, weight) per head (comfy/rmsnorm.py:7:
  torch.nn.functional.rms_norm). mmdit.py:612 _block_mixing: one attention over cat(context, x) tokens
  (context first), split back; the pre_only context_block returns None.
- mmdit.py:677-707 FinalLayer: adaLN 2 * hidden chunked (shift, scale), LayerNorm(eps 1e-6, no affine), Linear
  to p * p * out_channels. mmdit.py:920-938 unpatchify: [B, h, w, p, q, c] -> einsum "nhwpqc->nchpwq" (within
  a token the features are ordered p (row in patch), q (column), c (channel), c fastest).
- model_detection.py:54-93 detect_unet_config for `joint_blocks.0.context_block.attn.qkv.weight`;
  supported_models.py:548 SD3 matches in_channels 16 and pos_embed_scaling_factor None.
- ControlNet (controlnet.py:556 load_controlnet_sd35, the branch at controlnet.py:792-794 for files with
  `pos_embed_input.proj.weight` and `transformer_blocks.0.adaLN_modulation.1.bias`): MMDIT_MAP_BASIC
  (utils.py:407) renames `time_text_embed.*` to t_embedder / y_embedder; depth = y_embedder.mlp.0.weight rows / 64;
  num_blocks = count of `transformer_blocks.N.`; comfy/cldm/dit_embedder.py ControlNetEmbedder with
  double_y_emb = (y_embedder.mlp.0 square) and adm_in_channels 2048 (controlnet.py:597); ControlNetSD35.pre_run
  (controlnet.py:541) copies the main model's x_embedder into it; ControlNet.get_control (controlnet.py:253):
  timesteps = model_sampling.timestep(sigma) = sigma * 1000, the hint is the VAE latent after
  SD3.process_in; dit_embedder.py:96-120: x_embedder(x) + get_2d_sincos_pos_embed_torch(hidden, w, h) (computed,
  not the pos_embed buffer) + pos_embed_input(hint), c = t + y embedders, each DismantledBlock (no context),
  controlnet_blocks[i] output repeated ceil(depth / num_blocks) times; control_merge (controlnet.py:190) scales
  by the strength; mmdit.py:980-985 adds control["output"][i] to x after joint block i.

The tiny config (ComfyUI's MMDiT kwargs as detect_unet_config gives them; SD3.5 Large's values in brackets):
patch_size 2, in_channels 16, out_channels 16, depth 2 [38] (hidden 128 [2432], 2 heads [38] of 64),
adm_in_channels 80 [2048], context_embedder Linear 96 [4096] -> 128, pos_embed_max_size 8 [192], num_patches 64
[36864], qk_norm "rms", qkv_bias, mlp_ratio 4, no x_block_self_attn layers [none; SD3.5 Medium has 0-12].
The ControlNet: 1 transformer block [19] on the depth-2 main model, so each output is used by 2 joint blocks
[38 / 19 = 2], adm 80 [2048].

Shims on ComfyUI: load_controlnet_sd35 builds its ControlNetEmbedder with adm_in_channels 2048 hard-coded (the
real pooled width); here the class is wrapped so it gets the tiny 80. The hint is set as the latent directly
(cond_hint = the processed latent, of the noise's size, so get_control does not re-encode it): no VAE.

Writes engine/models/tests/fixtures/sd3/:
- weights.safetensors: the MMDiT under ComfyUI's names without `model.diffusion_model.` (x_embedder.proj.*,
  pos_embed [1, 64, 128], t_embedder.mlp.{0,2}.*, y_embedder.mlp.{0,2}.*, context_embedder.*,
  joint_blocks.N.{context_block,x_block}.{adaLN_modulation.1, attn.qkv, attn.proj, attn.ln_q, attn.ln_k,
  mlp.fc1, mlp.fc2}.*, final_layer.{adaLN_modulation.1, linear}.*). Every 2-D weight of >= 16384 values fp8
  e4m3; every other tensor bf16 (the conv weight, pos_embed, the small Linears, biases, ln_q / ln_k).
- controlnet.safetensors: the ControlNet in the released files' layout: `control_type` (0-d f32, 2 = depth),
  time_text_embed.{timestep_embedder,text_embedder}.linear_{1,2}.*, pos_embed_input.proj.*,
  transformer_blocks.0.{adaLN_modulation.1, attn.qkv, attn.proj, mlp.fc1, mlp.fc2}.*, controlnet_blocks.0.*;
  no x_embedder (ComfyUI copies the main model's). Same dtypes rule.
  Every value is re-drawn from one seeded generator (weights std 1/sqrt(fan_in), biases std 0.1, ln_q / ln_k
  weights 1 + 0.1 N, pos_embed std 0.7, about its sin/cos values' scale) and rounded to its stored type;
  everything below is computed in f32 from the rounded values.
- io.safetensors (f32): for c in a, b, c: `{c}.x`, `{c}.t` (the timestep the network gets, sigma * 1000),
  `{c}.context`, `{c}.y`, `{c}.out` = diffusion_model(x, t, context=context, y=y):
  a: x [1,16,8,8] (4x4 tokens), t [750], context [1,5,96], y [1,80]; b: x [2,16,6,10] (3x5 tokens, the crop
  centred at top 2, left 1), t [999, 3.5], context [2,7,96], y [2,80]; c: x [1,16,5,7] (padded circularly to 6x8, output
  cropped back; 3x4 tokens, crop at top 2, left 2), t [500], context [1,3,96], y [1,80].
  Intermediates: `a.patches` [1,16,128] = x_embedder(a.x), `a.pos` [1,16,128] = cropped_pos_embed((8, 8)) (the
  4x4 tokens at top 2, left 2 of the 8x8 table), `b.pos` [1,15,128] = cropped_pos_embed((6, 10)),
  `a.c` [1,128] = t_embedder(a.t) + y_embedder(a.y).
  ControlNet case `cn.*`: x [1,16,6,10], sigma [0.75], t [750], context [1,4,96], y [1,80], hint [1,16,6,10]
  (the latent after SD3.process_in), `cn.pos` [15,128] (get_2d_sincos_pos_embed_torch(128, w 5, h 3)),
  `cn.block.0` [1,15,128] (controlnet_blocks[0] output before the strength), `cn.out` [1,16,6,10] =
  diffusion_model(x, t, context, y, control=get_control(...)) at strength 0.75, `cn.denoised` = SD3.apply_model
  (x - out * sigma), `cn.out_plain` the same network without control.
- cases.json: the seed, the config, detect_unet_config's answer, the dtype rule and each case's description.

Checks: detect_unet_config on the written weights equals the tiny config and selects supported_models.SD3; the
loaded model holds exactly the written values; diffusers' SD3Transformer2DModel (names from ComfyUI's
utils.mmdit_to_diffusers) agrees on all three cases (c circularly padded and cropped by hand); the ControlNet
loads with only x_embedder missing, its outputs are the repeated, strength-scaled block output.
"""

import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui()
import comfy.cldm.dit_embedder  # noqa: E402
import comfy.controlnet  # noqa: E402
import comfy.model_base  # noqa: E402
import comfy.model_detection  # noqa: E402
import comfy.ops  # noqa: E402
import comfy.supported_models  # noqa: E402
import comfy.utils  # noqa: E402
from comfy.ldm.modules.diffusionmodules.mmdit import (  # noqa: E402
    OpenAISignatureMMDITWrapper,
    get_2d_sincos_pos_embed_torch,
)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/sd3")
SEED = 35
HIDDEN, DEPTH, ADM, CONTEXT = 128, 2, 80, 96
FP8_MIN = 16384  # 2-D weights with at least this many values are stored fp8 e4m3
UNET = {
    "in_channels": 16, "patch_size": 2, "out_channels": 16, "depth": DEPTH, "input_size": None,
    "adm_in_channels": ADM,
    "context_embedder_config": {"target": "torch.nn.Linear",
                                "params": {"in_features": CONTEXT, "out_features": HIDDEN}},
    "num_patches": 64, "pos_embed_max_size": 8, "qk_norm": "rms", "pos_embed_scaling_factor": None,
    "x_block_self_attn_layers": [],
}
CN_BLOCKS = 1
CN_CONTROL_TYPE = 2.0  # depth: only changes ComfyUI's image preprocessing (1 - image), not used here
CN_STRENGTH = 0.75


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def stored(value):
    big = value.ndim == 2 and value.numel() >= FP8_MIN
    return value.to(torch.float8_e4m3fn if big else torch.bfloat16).contiguous()


def draw_module(draw, module, skip=()):
    """Every state_dict entry (parameters and the pos_embed buffer) re-drawn; {name: stored tensor}."""
    out = {}
    for name, p in module.state_dict().items():
        if any(name.startswith(s) for s in skip):
            continue
        if name.endswith(("ln_q.weight", "ln_k.weight")):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name == "pos_embed":
            v = draw.normal(p.shape, 0.7)
        elif name.endswith("bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(p[0].numel()))
        out[name] = stored(v)
    return out


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def check_close(name, got, want, bound=1e-5):
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"  {name}: max |diff| / max |ref| = {rel:.2e}")
    assert rel < bound, (name, rel)


def check_loaded(module, want, missing=()):
    have = module.state_dict()
    assert set(want) | set(missing) == set(have), sorted(set(want) ^ set(have))[:10]
    for k in want:
        assert torch.equal(have[k], want[k].float()), k


class TinyControlNetEmbedder(comfy.cldm.dit_embedder.ControlNetEmbedder):
    """load_controlnet_sd35 hard-codes adm_in_channels 2048; the tiny model's pooled vector is ADM wide."""

    def __init__(self, **kwargs):
        kwargs["adm_in_channels"] = ADM
        super().__init__(**kwargs)


def controlnet_file_names(sd):
    """ComfyUI's module names -> the released files' (MMDIT_MAP_BASIC read backwards for what the file holds)."""
    back = {k[0]: k[1] for k in comfy.utils.MMDIT_MAP_BASIC}
    return {back.get(k, k): v for k, v in sd.items()}


def diffusers_check(sd, cases):
    """The same weights in diffusers' SD3Transformer2DModel, named by ComfyUI's mmdit_to_diffusers."""
    from diffusers import SD3Transformer2DModel

    model = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, num_layers=DEPTH, attention_head_dim=64,
        num_attention_heads=DEPTH, joint_attention_dim=CONTEXT, caption_projection_dim=HIDDEN,
        pooled_projection_dim=ADM, out_channels=16, pos_embed_max_size=8, dual_attention_layers=(),
        qk_norm="rms_norm",
    ).eval()
    key_map = comfy.utils.mmdit_to_diffusers({"depth": DEPTH})
    conv = {}
    for k in model.state_dict():
        m = key_map[k]
        if isinstance(m, str):
            conv[k] = sd[m]
        elif m[1] is None:
            conv[k] = m[2](sd[m[0]])
        else:
            dim, start, length = m[1]
            conv[k] = sd[m[0]].narrow(dim, start, length)
    model.load_state_dict(conv, strict=True)
    with torch.no_grad():
        for name, c in cases.items():
            x = c["x"]
            h, w = x.shape[-2:]
            xp = torch.nn.functional.pad(x, (0, (2 - w % 2) % 2, 0, (2 - h % 2) % 2), mode="circular")
            out = model(hidden_states=xp, encoder_hidden_states=c["context"], pooled_projections=c["y"],
                        timestep=c["t"]).sample[:, :, :h, :w]
            check_close(f"diffusers SD3Transformer2DModel, case {name}", out, c["out"])


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(SEED)
    draw = Draw(SEED)
    ops = comfy.ops.disable_weight_init

    # --- the MMDiT ---
    net = OpenAISignatureMMDITWrapper(**UNET, dtype=torch.float32, operations=ops)
    weights = draw_module(draw, net)
    assert "pos_embed" in weights and weights["pos_embed"].shape == (1, 64, HIDDEN)
    assert "joint_blocks.1.context_block.attn.proj.weight" not in weights  # the last context block is pre_only
    assert weights["joint_blocks.1.context_block.adaLN_modulation.1.weight"].shape == (2 * HIDDEN, HIDDEN)

    # --- the ControlNet, built as load_controlnet_sd35 builds it ---
    cn_module = TinyControlNetEmbedder(
        img_size=None, patch_size=2, in_chans=16, num_layers=CN_BLOCKS, main_model_double=DEPTH,
        double_y_emb=False, attention_head_dim=64, num_attention_heads=DEPTH, adm_in_channels=2048,
        device="cpu", dtype=torch.float32, operations=ops)
    cn_weights = controlnet_file_names(draw_module(draw, cn_module, skip=("x_embedder.",)))
    cn_weights["control_type"] = torch.tensor(CN_CONTROL_TYPE)

    save_file(weights, f"{OUT}/weights.safetensors")
    save_file(cn_weights, f"{OUT}/controlnet.safetensors")
    # Everything below reads the files back.
    weights = load_file(f"{OUT}/weights.safetensors")
    cn_weights = load_file(f"{OUT}/controlnet.safetensors")
    sd = f32(weights)

    # --- detection ---
    det = comfy.model_detection.detect_unet_config(sd, "")
    print(f"detect_unet_config: {det}")
    assert det == UNET, (det, UNET)
    mc = comfy.model_detection.model_config_from_unet(sd, "")
    assert type(mc) is comfy.supported_models.SD3, type(mc)
    print(f"model_config_from_unet: {type(mc).__module__}.{type(mc).__name__}, sampling {mc.sampling_settings}, "
          f"latent {type(mc.latent_format).__name__}")
    mc.set_inference_dtype(torch.float32, None)
    model = mc.get_model(sd, "")
    model.load_model_weights(dict(sd), "")
    assert isinstance(model, comfy.model_base.SD3) and model.model_type == comfy.model_base.ModelType.FLOW
    dm = model.diffusion_model
    assert isinstance(dm, OpenAISignatureMMDITWrapper) and dm.hidden_size == HIDDEN and dm.num_heads == DEPTH
    check_loaded(dm, weights)
    dm.eval()

    # --- cases ---
    g = torch.Generator().manual_seed(SEED + 1)

    def case(shape, ts, tokens):
        b = shape[0]
        return {"x": torch.randn(shape, generator=g), "t": torch.tensor(ts),
                "context": torch.randn(b, tokens, CONTEXT, generator=g), "y": torch.randn(b, ADM, generator=g)}

    cases = {"a": case((1, 16, 8, 8), [750.0], 5), "b": case((2, 16, 6, 10), [999.0, 3.5], 7),
             "c": case((1, 16, 5, 7), [500.0], 3)}
    outputs = {}
    with torch.no_grad():
        for name, c in cases.items():
            c["out"] = dm(c["x"], c["t"], context=c["context"], y=c["y"])
            assert c["out"].shape == c["x"].shape, c["out"].shape
            for k in ("x", "t", "context", "y", "out"):
                outputs[f"{name}.{k}"] = c[k]
            print(f"case {name}: x {list(c['x'].shape)}, out std {c['out'].std():.3f}")
        a = cases["a"]
        outputs["a.patches"] = dm.x_embedder(a["x"])
        outputs["a.pos"] = dm.cropped_pos_embed((8, 8))
        outputs["b.pos"] = dm.cropped_pos_embed((6, 10))
        outputs["a.c"] = dm.t_embedder(a["t"], dtype=torch.float32) + dm.y_embedder(a["y"])
        # The crops by hand on the 8x8 token table: a's 4x4 at rows 2..5, columns 2..5; b's 3x5 at rows 2..4,
        # columns 1..5.
        grid = sd["pos_embed"].view(8, 8, HIDDEN)
        assert torch.equal(outputs["a.pos"][0], grid[2:6, 2:6].reshape(16, HIDDEN))
        assert torch.equal(outputs["b.pos"][0], grid[2:5, 1:6].reshape(15, HIDDEN))
        assert outputs["a.patches"].shape == (1, 16, HIDDEN) and outputs["a.c"].shape == (1, HIDDEN)
        # model_base.SD3 (FLOW, shift 3): denoised = x - out * sigma, t = sigma * 1000.
        sigma = torch.tensor([0.75])
        den = model.apply_model(a["x"], sigma, c_crossattn=a["context"], y=a["y"])
        assert torch.allclose(den, a["x"] - a["out"] * 0.75, atol=1e-5)

    # --- ControlNet ---
    print("ControlNet:")
    comfy.cldm.dit_embedder.ControlNetEmbedder = TinyControlNetEmbedder
    loaded = comfy.controlnet.load_controlnet_state_dict(f32(cn_weights))
    assert type(loaded) is comfy.controlnet.ControlNetSD35, type(loaded)
    cm = loaded.control_model
    assert isinstance(cm, TinyControlNetEmbedder) and not cm.double_y_emb and cm.main_model_double == DEPTH
    assert len(cm.transformer_blocks) == CN_BLOCKS and cm.dtype == torch.float32
    comfy_names = {k: v for k, v in f32(cn_weights).items() if k != "control_type"}
    comfy_names = {({k[1]: k[0] for k in comfy.utils.MMDIT_MAP_BASIC}).get(k, k): v for k, v in comfy_names.items()}
    check_loaded(cm, comfy_names, missing=("x_embedder.proj.weight", "x_embedder.proj.bias"))

    gc = torch.Generator().manual_seed(SEED + 2)
    cn = {"x": torch.randn(1, 16, 6, 10, generator=gc), "sigma": torch.tensor([0.75]),
          "context": torch.randn(1, 4, CONTEXT, generator=gc), "y": torch.randn(1, ADM, generator=gc),
          "hint": torch.randn(1, 16, 6, 10, generator=gc)}
    control = loaded.copy().set_cond_hint(torch.zeros(1, 3, 48, 80), CN_STRENGTH, (0.0, 1.0), vae=None)
    control.cond_hint = cn["hint"]  # the processed latent, of the noise's size: get_control keeps it
    control.pre_run(model, model.model_sampling.percent_to_sigma)
    assert torch.equal(cm.x_embedder.proj.weight, dm.x_embedder.proj.weight)
    with torch.no_grad():
        cn["t"] = model.model_sampling.timestep(cn["sigma"])
        assert torch.equal(cn["t"], torch.tensor([750.0]))
        raw = cm(x=cn["x"], timesteps=cn["t"], y=cn["y"], context=cn["context"], hint=cn["hint"])["output"]
        assert len(raw) == 2 and raw[0] is raw[1]
        cn["block.0"] = raw[0]
        cond = {"c_crossattn": cn["context"], "y": cn["y"]}
        ctl = control.get_control(cn["x"], cn["sigma"], cond, 1, {})
        assert len(ctl["output"]) == 2 and ctl["output"][0] is ctl["output"][1]
        assert torch.allclose(ctl["output"][0], cn["block.0"] * CN_STRENGTH, atol=1e-6, rtol=0)
        cn["pos"] = get_2d_sincos_pos_embed_torch(HIDDEN, 5, 3)
        cn["out"] = dm(cn["x"], cn["t"], context=cn["context"], y=cn["y"], control=ctl)
        cn["out_plain"] = dm(cn["x"], cn["t"], context=cn["context"], y=cn["y"])
        cn["denoised"] = model.apply_model(cn["x"], cn["sigma"], c_crossattn=cn["context"], y=cn["y"], control=ctl)
        assert torch.allclose(cn["denoised"], cn["x"] - cn["out"] * 0.75, atol=1e-5)
        # By hand: the block output added after both joint blocks (ceil(2 / 1) = 2 copies).
        x = dm.x_embedder(cn["x"]) + dm.cropped_pos_embed((6, 10))
        c = dm.t_embedder(cn["t"], dtype=torch.float32) + dm.y_embedder(cn["y"])
        ctx = dm.context_embedder(cn["context"])
        for blk in dm.joint_blocks:
            ctx, x = blk(ctx, x, c=c, use_checkpoint=False)
            x = x + cn["block.0"] * CN_STRENGTH
        by_hand = dm.unpatchify(dm.final_layer(x, c), hw=(6, 10))
        check_close("ControlNet case by hand", by_hand, cn["out"])
        diff = (cn["out"] - cn["out_plain"]).abs().max() / cn["out_plain"].abs().max()
        print(f"  control changes the output by {diff:.3f} of its largest magnitude")
        assert diff > 0.05
    for k in ("x", "sigma", "t", "context", "y", "hint", "pos", "block.0", "out", "out_plain", "denoised"):
        outputs[f"cn.{k}"] = cn[k]

    save_file({k: v.float().clone().contiguous() for k, v in outputs.items()}, f"{OUT}/io.safetensors")

    print("independent checks:")
    diffusers_check(sd, cases)

    doc = {
        "seed": SEED,
        "config": {**UNET, "mlp_ratio": 4.0, "qkv_bias": True, "hidden_size": HIDDEN, "num_heads": DEPTH},
        "detect_unet_config": det,
        "weights": f"2-D weights of >= {FP8_MIN} values fp8 e4m3, every other tensor bf16",
        "cases": {
            "a": {"x": [1, 16, 8, 8], "t": [750.0], "context": [1, 5, CONTEXT], "y": [1, ADM],
                  "pos_crop": {"top": 2, "left": 2, "h": 4, "w": 4}},
            "b": {"x": [2, 16, 6, 10], "t": [999.0, 3.5], "context": [2, 7, CONTEXT], "y": [2, ADM],
                  "pos_crop": {"top": 2, "left": 1, "h": 3, "w": 5}},
            "c": {"x": [1, 16, 5, 7], "t": [500.0], "context": [1, 3, CONTEXT], "y": [1, ADM],
                  "padded": [6, 8], "padding_mode": "circular"},
        },
        "controlnet": {
            "file": "controlnet.safetensors", "control_type": CN_CONTROL_TYPE, "num_blocks": CN_BLOCKS,
            "main_model_double": DEPTH, "repeat": math.ceil(DEPTH / CN_BLOCKS), "strength": CN_STRENGTH,
            "adm_in_channels": ADM, "sigma": 0.75, "t": 750.0,
            "hint": "the VAE latent after SD3.process_in (here drawn directly)",
            "outputs": "cn.out = diffusion_model(cn.x, cn.t, context, y, control); joint block i gets "
                       "cn.block.0 * strength for i in 0, 1",
        },
    }
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(os.path.join(OUT, name))
        total += size
        print(f"{OUT}/{name}: {size} bytes")
    print(f"total {total} bytes")
    assert total < 2_500_000, total


if __name__ == "__main__":
    main()
