"""Fixtures for Kiln's Wan 2.1 / 2.2 diffusion transformer (engine/models/tests/fixtures/wan/), from diffusers'
WanTransformer3DModel, cross-checked with ComfyUI's own WanModel (comfy/ldm/wan/model.py at 0f1fa67a).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan.py
(ComfyUI's imports need the extra pins listed in comfy_sampling.py: einops, comfy-kitchen, ...)

One tiny random FLF2V-shaped model holds every weight the cases use; the other variants are that model with
tensors left out or replaced (models-wan-video.md 2.2), as the Rust test rebuilds them:
- flf2v: the whole file (in 36, out 16, img_emb with emb_pos);
- i2v: without `img_emb.emb_pos` (2.1 I2V);
- expert: without `img_emb.*` and the blocks' `cross_attn.{k_img,v_img,norm_k_img}` (a 2.2 I2V A14B expert: 36
  channels in, no CLIP branch, detected by ComfyUI as t2v);
- t2v: the expert with `patch_embedding.weight` cut to its first 16 input channels (2.1 T2V);
- ti2v: t2v with `patch_embedding.*` and `head.head.*` from ti2v.safetensors (2.2 TI2V 5B: 48 in and out).

Sizes: dim 256 = 2 heads x 128 (so the RoPE split 44/42/42 and the q/k RMSNorm across both heads are the
released ones), ffn 128, 2 blocks, text width 32, CLIP width 32 (ComfyUI hard-codes 1280 in MLPProj; its module
gets a 32-wide one swapped in, which changes nothing else), 5 CLIP tokens per image (10 for FLF2V's two images,
so emb_pos is [1, 10, 32]).

Writes:
- weights.safetensors: the FLF2V-shaped model in ComfyUI's (original Wan) names, bf16. Every value random (norm
  gains 1 + 0.2 N, biases 0.1 N, modulation tables N / sqrt(dim), emb_pos 0.1 N, weights N / sqrt(fan-in)); the
  references run in f32 on exactly these bf16 values.
- ti2v.safetensors: `patch_embedding.{weight,bias}` [256, 48, 1, 2, 2] / [256] and `head.head.{weight,bias}`
  [192, 256] / [192] of the TI2V-shaped variant (bf16).
- diffusers_names.json: {diffusers name: [ComfyUI name, shape]} for every weight of weights.safetensors (the
  conversion this script loads diffusers with), so the test rebuilds the file in diffusers' layout.
- released.json: for each released configuration, ComfyUI's module built on the meta device: its weights outside
  the blocks and those of block 0 (name -> shape; every block has the same), and the block count.
- io.safetensors (f32), per case c: `x.<c>` [B, C, T, H, W] (the channels the DiT reads), `t.<c>` (sigma x 1000:
  [B], or [B, T] per latent frame for ti2v), `context.<c>` [B, L, 32], `clip.<c>` where the case has CLIP
  features, and the output `out.<c>` [B, out, T, H, W]:
  t2v (B 2, 16 x 3 x 4 x 6, L 7, t 900 / 250); ragged (B 1, 16 x 2 x 5 x 7: ComfyUI pads H and W circularly to
  even and crops the output; diffusers gets the padded latent and its output is cropped the same way, L 4, t 500);
  i2v (B 2, 36 x 2 x 4 x 4, L 512, clip [1, 5, 32] repeated to the batch as ComfyUI's CONDRegular does,
  t 700 / 300); i2v_noclip (only `out`: the i2v inputs without the CLIP features; ComfyUI then splits nothing
  off and the image attention reads the text too; recorded from ComfyUI, diffusers has no such call); flf2v (B 1,
  36 x 2 x 4 x 6, L 512, clip [1, 10, 32] = both images' tokens, t 600); expert (B 1, 36 x 2 x 4 x 4, L 6,
  t 875); ti2v (B 2, 48 x 3 x 4 x 4, L 5, per-frame t [[0, 800, 800], [0, 300, 300]] as a noise mask with a
  clean first frame gives); ti2v_sample (only `t` and `out`: the ti2v x and context, t 800 / 300 per sample).
- rope.safetensors (f32): `out`, ComfyUI's t2v output on the t2v case's inputs with ScaleROPE's
  `transformer_options["rope_options"]` (ROPE_OPTIONS: time stretched 7x as ChronoEdit's template does, fractional
  scales and shifts on every axis); diffusers has no such option, so it is ComfyUI's alone. `wan.py rope` writes
  only this file, from the fixtures already there.
- bernini.safetensors (f32): ComfyUI's t2v output on the t2v case's inputs with two in-context latents
  (`context_latents`, BerniniConditioning's; see `bernini()`); ComfyUI's alone too. `wan.py bernini` writes only it.
- causal.safetensors (f32): ComfyUI's `ar_video` sampler (`sample_ar_video`) on its CausalWanModel with the t2v
  variant's weights, for an image-to-video run framewise and a text-to-video run chunkwise (see `causal()`);
  ComfyUI's alone (diffusers has no causal Wan). `wan.py causal` writes only it.
- humo.safetensors (f32): ComfyUI's HumoWanModel (17B- and 1.7B-shaped, from the expert's and t2v's weights with
  tiny audio weights) with a reference latent and audio, see `humo()`; ComfyUI's alone (diffusers has no HuMo).
  `wan.py humo` writes only it.
- phantom.safetensors (f32): ComfyUI's t2v output with WanPhantomSubjectToVideo's reference frames
  (`time_dim_concat`) on the t2v and ragged cases' inputs, see `phantom()`; ComfyUI's alone (diffusers has no
  Phantom). `wan.py phantom` writes only it.

diffusers' I2V attention takes the text as the last 512 context tokens (hard-coded), so the I2V cases use 512
text tokens; its FLF2V image embedder adds pos_embed to the two images' tokens viewed as one sequence, so it gets
the CLIP states as [2B, 5, 32]; its TI2V path takes a timestep per token, so each frame's t is repeated over the
frame's tokens. Every case diffusers can run is recorded from diffusers and must agree with ComfyUI's module
within 1e-5 of the output's largest magnitude; ComfyUI's detection must give WAN21_I2V (flf2v, i2v), WAN21_T2V
(expert, t2v) and WAN22_T2V (ti2v) for the variants, and refuse none of them.
"""

import json
import os
import sys

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/wan"
DIM, HEADS, FFN, LAYERS, TEXT, CLIP, CLIP_TOKENS = 256, 2, 128, 2, 32, 32, 5
DIFFUSERS = dict(patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=DIM // HEADS, in_channels=36,
                 out_channels=16, text_dim=TEXT, freq_dim=256, ffn_dim=FFN, num_layers=LAYERS, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=CLIP, added_kv_proj_dim=DIM,
                 pos_embed_seq_len=2 * CLIP_TOKENS)
# ComfyUI's WanModel for each released configuration (models-wan-video.md 2.2).
RELEASED = {
    "t2v_1_3b": dict(model_type="t2v", dim=1536, ffn_dim=8960, num_heads=12, num_layers=30, in_dim=16, out_dim=16),
    "t2v_14b": dict(model_type="t2v", dim=5120, ffn_dim=13824, num_heads=40, num_layers=40, in_dim=16, out_dim=16),
    "i2v_14b": dict(model_type="i2v", dim=5120, ffn_dim=13824, num_heads=40, num_layers=40, in_dim=36, out_dim=16),
    "flf2v_14b": dict(model_type="i2v", dim=5120, ffn_dim=13824, num_heads=40, num_layers=40, in_dim=36, out_dim=16,
                      flf_pos_embed_token_number=514),
    "i2v_a14b": dict(model_type="t2v", dim=5120, ffn_dim=13824, num_heads=40, num_layers=40, in_dim=36, out_dim=16),
    "ti2v_5b": dict(model_type="t2v", dim=3072, ffn_dim=14336, num_heads=24, num_layers=30, in_dim=48, out_dim=48),
}


def comfy_name(name):
    """diffusers WanTransformer3DModel name -> ComfyUI / original Wan name (models-wan-video.md 2.3; note the
    norm2/norm3 swap: diffusers' affine cross-attention norm is norm2, ComfyUI's norm3)."""
    top = [("condition_embedder.time_embedder.linear_1.", "time_embedding.0."),
           ("condition_embedder.time_embedder.linear_2.", "time_embedding.2."),
           ("condition_embedder.time_proj.", "time_projection.1."),
           ("condition_embedder.text_embedder.linear_1.", "text_embedding.0."),
           ("condition_embedder.text_embedder.linear_2.", "text_embedding.2."),
           ("condition_embedder.image_embedder.norm1.", "img_emb.proj.0."),
           ("condition_embedder.image_embedder.ff.net.0.proj.", "img_emb.proj.1."),
           ("condition_embedder.image_embedder.ff.net.2.", "img_emb.proj.3."),
           ("condition_embedder.image_embedder.norm2.", "img_emb.proj.4."),
           ("proj_out.", "head.head."), ("patch_embedding.", "patch_embedding.")]
    for old, new in top:
        if name.startswith(old):
            return new + name[len(old):]
    exact = {"condition_embedder.image_embedder.pos_embed": "img_emb.emb_pos", "scale_shift_table": "head.modulation"}
    if name in exact:
        return exact[name]
    _, i, rest = name.split(".", 2)
    block = [("attn1.to_q.", "self_attn.q."), ("attn1.to_k.", "self_attn.k."), ("attn1.to_v.", "self_attn.v."),
             ("attn1.to_out.0.", "self_attn.o."), ("attn1.norm_q.", "self_attn.norm_q."),
             ("attn1.norm_k.", "self_attn.norm_k."), ("attn2.to_q.", "cross_attn.q."), ("attn2.to_k.", "cross_attn.k."),
             ("attn2.to_v.", "cross_attn.v."), ("attn2.to_out.0.", "cross_attn.o."),
             ("attn2.norm_q.", "cross_attn.norm_q."), ("attn2.norm_k.", "cross_attn.norm_k."),
             ("attn2.add_k_proj.", "cross_attn.k_img."), ("attn2.add_v_proj.", "cross_attn.v_img."),
             ("attn2.norm_added_k.", "cross_attn.norm_k_img."), ("norm2.", "norm3."),
             ("ffn.net.0.proj.", "ffn.0."), ("ffn.net.2.", "ffn.2."), ("scale_shift_table", "modulation")]
    for old, new in block:
        if rest.startswith(old):
            return f"blocks.{i}.{new}{rest[len(old):]}"
    raise KeyError(name)


def random_values(name, shape):
    """A bf16 value for a diffusers parameter: norm gains near 1, small biases, modulation tables like diffusers'
    init, weights scaled by their fan-in."""
    if name.endswith("bias"):
        value = 0.1 * torch.randn(shape)
    elif len(shape) == 1:
        value = 1.0 + 0.2 * torch.randn(shape)
    elif name.endswith("scale_shift_table"):
        value = torch.randn(shape) / DIM ** 0.5
    elif name.endswith("pos_embed"):
        value = 0.1 * torch.randn(shape)
    else:
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        value = torch.randn(shape) / fan_in ** 0.5
    return value.to(torch.bfloat16).contiguous()


def variant(state, name, ti2v):
    """The ComfyUI-named weights of a variant (see the module comment) from the base model's."""
    if name == "flf2v":
        return dict(state)
    out = {k: v for k, v in state.items() if k != "img_emb.emb_pos"}
    if name == "i2v":
        return out
    out = {k: v for k, v in out.items() if not k.startswith("img_emb.") and "_img." not in k}
    if name == "expert":
        return out
    out["patch_embedding.weight"] = out["patch_embedding.weight"][:, :16].contiguous()
    if name == "t2v":
        return out
    return {**out, **ti2v}


# Each variant's diffusers config beside the base's, and which ComfyUI supported-model entry detects it.
VARIANTS = {
    "flf2v": ({}, "WAN21_I2V"),
    "i2v": ({"pos_embed_seq_len": None}, "WAN21_I2V"),
    "expert": ({"image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None}, "WAN21_T2V"),
    "t2v": ({"image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None, "in_channels": 16},
            "WAN21_T2V"),
    "ti2v": ({"image_dim": None, "added_kv_proj_dim": None, "pos_embed_seq_len": None, "in_channels": 48,
              "out_channels": 48}, "WAN22_T2V"),
}
# case: (variant, batch, channels, frames, h, w, text tokens, timesteps, CLIP tokens or None)
CASES = {
    "t2v": ("t2v", 2, 16, 3, 4, 6, 7, [900.0, 250.0], None),
    "ragged": ("t2v", 1, 16, 2, 5, 7, 4, [500.0], None),
    "i2v": ("i2v", 2, 36, 2, 4, 4, 512, [700.0, 300.0], CLIP_TOKENS),
    "flf2v": ("flf2v", 1, 36, 2, 4, 6, 512, [600.0], 2 * CLIP_TOKENS),
    "expert": ("expert", 1, 36, 2, 4, 4, 6, [875.0], None),
    "ti2v": ("ti2v", 2, 48, 3, 4, 4, 5, [[0.0, 800.0, 800.0], [0.0, 300.0, 300.0]], None),
    "ti2v_sample": ("ti2v", 2, 48, 3, 4, 4, 5, [800.0, 300.0], None),
}


# Cases that read another case's inputs: i2v_noclip all of i2v's but the CLIP states, ti2v_sample ti2v's x and
# context with its own t.
SHARED_INPUTS = {"i2v_noclip": "i2v", "ti2v_sample": "ti2v"}


def main():
    import_comfyui()
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(41)
    base = WanTransformer3DModel(**DIFFUSERS)
    shapes = {k: tuple(v.shape) for k, v in base.state_dict().items()}
    stored = {comfy_name(k): random_values(k, s) for k, s in shapes.items()}
    assert len(stored) == len(shapes)
    ti2v = {"patch_embedding.weight": random_values("patch_embedding.weight", (DIM, 48, 1, 2, 2)),
            "patch_embedding.bias": random_values("patch_embedding.bias", (DIM,)),
            "head.head.weight": random_values("proj_out.weight", (4 * 48, DIM)),
            "head.head.bias": random_values("proj_out.bias", (4 * 48,))}
    save_file(stored, f"{OUT}/weights.safetensors")
    save_file(ti2v, f"{OUT}/ti2v.safetensors")
    with open(f"{OUT}/diffusers_names.json", "w") as f:
        json.dump({k: [comfy_name(k), list(s)] for k, s in sorted(shapes.items())}, f, indent=0, sort_keys=True)
        f.write("\n")

    g = torch.Generator().manual_seed(7)
    io = {}
    for case, (_, b, c, t, h, w, n, steps, clip) in CASES.items():
        io[f"t.{case}"] = torch.tensor(steps)
        if case in SHARED_INPUTS:
            continue
        io[f"x.{case}"] = torch.randn(b, c, t, h, w, generator=g)
        io[f"context.{case}"] = torch.randn(b, n, TEXT, generator=g)
        if clip is not None:
            io[f"clip.{case}"] = torch.randn(1, clip, CLIP, generator=g)

    with torch.no_grad():
        nets = {name: diffusers_net(name, stored, ti2v) for name in VARIANTS}
        for case, spec in CASES.items():
            io[f"out.{case}"] = diffusers_call(nets[spec[0]], io, case)
        comfy = {name: comfy_net(name, stored, ti2v) for name in VARIANTS}
        for case, spec in CASES.items():
            got = comfy_call(comfy[spec[0]], io, case)
            want = io[f"out.{case}"]
            diff = float((got - want).abs().max())
            rel = diff / float(want.abs().max())
            print(f"ComfyUI vs diffusers, {case:12} {str(tuple(want.shape)):20} max |out| "
                  f"{float(want.abs().max()):.3f}, max |difference| {diff:.2e} (relative {rel:.2e})")
            assert rel < 1e-5, case
        io["out.i2v_noclip"] = comfy_call(comfy["i2v"], io, "i2v_noclip", clip=False)
        with_clip = io["out.i2v"]
        moved = float((io["out.i2v_noclip"] - with_clip).abs().max())
        print(f"ComfyUI, i2v without CLIP features: differs from i2v by {moved:.3f}")
        detection_check(stored, ti2v)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    reference_image(stored, ti2v)
    vace(stored, ti2v)
    camera(stored, ti2v)
    scaled_rope()
    bernini()
    causal()
    released()
    sizes = {f: os.path.getsize(f"{OUT}/{f}") for f in sorted(os.listdir(OUT))}
    print(f"fixtures: {sizes}, {sum(sizes.values()) / 1e6:.2f} MB in all")


def diffusers_net(name, stored, ti2v):
    """diffusers' model of a variant, loaded with its weights renamed from ComfyUI's."""
    net = WanTransformer3DModel(**{**DIFFUSERS, **VARIANTS[name][0]}).eval()
    state = {k: v.float() for k, v in variant(stored, name, ti2v).items()}
    names = {comfy_name(k): k for k in net.state_dict()}
    result = net.load_state_dict({names[k]: v for k, v in state.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    return net


def diffusers_call(net, io, case):
    """diffusers' output for a case: the latent circularly padded to even H and W (ComfyUI's pad_to_patch_size;
    diffusers' own patch embedding would drop the odd row and column) and the output cropped back."""
    x, t, context, clip = inputs(io, case)
    b, _, frames, h, w = x.shape
    padded = torch.nn.functional.pad(x, (0, w % 2, 0, h % 2, 0, 0), mode="circular")
    if t.ndim == 2:
        # One timestep per token: each frame's repeated over its (H/2)(W/2) tokens.
        per_frame = padded.shape[3] * padded.shape[4] // 4
        t = t.repeat_interleave(per_frame, dim=1)
    if clip is not None:
        clip = clip.repeat(b, 1, 1)
        if clip.shape[1] == 2 * CLIP_TOKENS:
            clip = clip.reshape(2 * b, CLIP_TOKENS, CLIP)
    out = net(padded, t, context, encoder_hidden_states_image=clip, return_dict=False)[0]
    return out[:, :, :frames, :h, :w].contiguous()


def comfy_net(name, stored, ti2v, device=None):
    """ComfyUI's WanModel of a variant with its (ComfyUI-named) weights, the MLPProj swapped for a 32-wide one."""
    import comfy.ops
    from comfy.ldm.wan.model import MLPProj, WanModel

    ops = comfy.ops.disable_weight_init
    config = {**DIFFUSERS, **VARIANTS[name][0]}
    image = config["image_dim"] is not None
    pos = config["pos_embed_seq_len"]
    net = WanModel(model_type="i2v" if image else "t2v", patch_size=(1, 2, 2), in_dim=config["in_channels"], dim=DIM,
                   ffn_dim=FFN, freq_dim=256, text_dim=TEXT, out_dim=config["out_channels"], num_heads=HEADS,
                   num_layers=LAYERS, eps=1e-6, flf_pos_embed_token_number=pos, operations=ops).eval()
    if image:
        net.img_emb = MLPProj(CLIP, DIM, flf_pos_embed_token_number=pos,
                              operation_settings={"operations": ops, "device": None, "dtype": None})
    state = {k: v.float() for k, v in variant(stored, name, ti2v).items()}
    result = net.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    return net


def comfy_call(net, io, case, clip=True):
    """ComfyUI's output, called as model_base.WAN21 calls it: t = sigma x 1000 ([B], or [B, T] from WAN22's
    process_timestep), clip_fea = the CLIP penultimate states repeated to the batch (none without `clip`)."""
    x, t, context, clip_fea = inputs(io, case)
    if clip_fea is not None and clip:
        clip_fea = clip_fea.repeat(x.shape[0], 1, 1)
    else:
        clip_fea = None
    return net(x, t, context, clip_fea=clip_fea, transformer_options={})


def inputs(io, case):
    """A case's latent, timesteps, text and CLIP states (those of the case it shares them with, if any; its own
    timesteps where it has them)."""
    source = SHARED_INPUTS.get(case, case)
    t = io.get(f"t.{case}", io[f"t.{source}"])
    return io[f"x.{source}"], t, io[f"context.{source}"], io.get(f"clip.{source}")


def reference_image(stored, ti2v):
    """ComfyUI's WanModel with the reference-image convolution (Wan 2.2 Fun Control, `in_dim_ref_conv`; diffusers
    has no such model): the expert variant plus a random `ref_conv` (16 channels), called as WAN21 calls it with
    `reference_latent` (the last reference latent's first frame, [B, 16, H, W]). Written to ref_conv.safetensors:
    `ref_conv.{weight,bias}` (bf16) and, in f32, `x` [1, 36, 2, 4, 6], `t` [1] (650), `context` [1, 6, 32],
    `reference` [1, 16, 4, 6], `out` [1, 16, 2, 4, 6], and `out_plain` (the same call without the reference)."""
    import comfy.ops
    from comfy.ldm.wan.model import WanModel

    g = torch.Generator().manual_seed(11)
    weights = {"ref_conv.weight": (torch.randn(DIM, 16, 2, 2, generator=g) / 8.0).to(torch.bfloat16),
               "ref_conv.bias": (torch.randn(DIM, generator=g) * 0.1).to(torch.bfloat16)}
    io = {"x": torch.randn(1, 36, 2, 4, 6, generator=g), "t": torch.tensor([650.0]),
          "context": torch.randn(1, 6, TEXT, generator=g), "reference": torch.randn(1, 16, 4, 6, generator=g)}
    net = WanModel(model_type="t2v", patch_size=(1, 2, 2), in_dim=36, dim=DIM, ffn_dim=FFN, freq_dim=256,
                   text_dim=TEXT, out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6, in_dim_ref_conv=16,
                   operations=comfy.ops.disable_weight_init).eval()
    state = {k: v.float() for k, v in {**variant(stored, "expert", ti2v), **weights}.items()}
    result = net.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    with torch.no_grad():
        io["out"] = net(io["x"], io["t"], io["context"], reference_latent=io["reference"], transformer_options={})
        io["out_plain"] = net(io["x"], io["t"], io["context"], transformer_options={})
    moved = float((io["out"] - io["out_plain"]).abs().max())
    print(f"ComfyUI, expert with a reference latent: differs from without by {moved:.3f}")
    save_file({**weights, **{k: v.contiguous() for k, v in io.items()}}, f"{OUT}/ref_conv.safetensors")


def camera_weights(expert):
    """The camera adapter's weights (1 embedding channel) made of the expert variant's own, as `camera` describes."""
    derived = {"control_adapter.conv.weight": expert["blocks.1.self_attn.v.weight"].float().reshape(DIM, 64, 2, 2),
               "control_adapter.conv.bias": expert["blocks.1.self_attn.v.bias"].float()}
    for conv, source in (("conv1", "q"), ("conv2", "k")):
        w = expert[f"blocks.0.self_attn.{source}.weight"].float()
        derived[f"control_adapter.residual_blocks.0.{conv}.weight"] = w[:, :, None, None].expand(-1, -1, 3, 3) / 3.0
        derived[f"control_adapter.residual_blocks.0.{conv}.bias"] = expert[f"blocks.0.self_attn.{source}.bias"].float()
    return derived


def camera(stored, ti2v):
    """ComfyUI's CameraWanModel as a Wan 2.2 Fun Camera model (the expert variant: 36 channels in, no CLIP; its
    `model_type="camera_2.2"`) with a camera adapter reading 1 embedding channel (the released ones read 24; the
    adapter is the same for any count), its weights made of the fixture's own so the fixture stays small (the
    Rust test builds them the same way): `control_adapter.conv` is block 1's `self_attn.v` ([256, 256] viewed as
    [256, 64, 2, 2]), the residual block's two 3x3 convolutions block 0's `self_attn.q` and `self_attn.k` (each
    weight on all nine taps, divided by 3); the biases those layers'. Called as WAN21_Camera calls it, with
    `camera_conditions`. Written to camera.safetensors (f32): `x` [1, 36, 2, 4, 6], `t` [1] (720), `context`
    [1, 6, 32], `camera` [1, 1, 2, 32, 48] (16x the latent's sides), `out` [1, 16, 2, 4, 6] and `out_plain`
    (without the camera)."""
    import comfy.ops
    from comfy.ldm.wan.model import CameraWanModel

    g = torch.Generator().manual_seed(13)
    expert = variant(stored, "expert", ti2v)
    derived = camera_weights(expert)
    io = {"x": torch.randn(1, 36, 2, 4, 6, generator=g), "t": torch.tensor([720.0]),
          "context": torch.randn(1, 6, TEXT, generator=g), "camera": torch.randn(1, 1, 2, 32, 48, generator=g)}
    net = CameraWanModel(model_type="camera_2.2", patch_size=(1, 2, 2), in_dim=36, dim=DIM, ffn_dim=FFN, freq_dim=256,
                         text_dim=TEXT, out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6,
                         in_dim_control_adapter=1, operations=comfy.ops.disable_weight_init).eval()
    state = {k: v.float() for k, v in {**expert, **derived}.items()}
    result = net.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    with torch.no_grad():
        io["out"] = net(io["x"], io["t"], io["context"], camera_conditions=io["camera"], transformer_options={})
        io["out_plain"] = net(io["x"], io["t"], io["context"], transformer_options={})
    moved = float((io["out"] - io["out_plain"]).abs().max())
    print(f"ComfyUI, Fun Camera with a camera embedding: differs from without by {moved:.3f}")
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/camera.safetensors")


# ScaleROPE's options for the rope fixture: ChronoEdit's stretched time axis, fractional scales and shifts.
ROPE_OPTIONS = {"scale_t": 7.0, "shift_t": 0.5, "scale_y": 1.5, "shift_y": -2.0, "scale_x": 0.5, "shift_x": 3.0}


def scaled_rope():
    """ComfyUI's t2v WanModel on the `t2v` case's inputs with `transformer_options["rope_options"]` (what
    `ScaleROPE` sets): rope.safetensors holds `out` [2, 16, 3, 4, 6] (f32). Reads the weights and inputs already
    written, so it runs on its own too (`wan.py rope`)."""
    from safetensors.torch import load_file

    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    io = load_file(f"{OUT}/io.safetensors")
    net = comfy_net("t2v", stored, ti2v)
    x, t, context, _ = inputs(io, "t2v")
    with torch.no_grad():
        out = net(x, t, context, transformer_options={"rope_options": dict(ROPE_OPTIONS)})
    moved = float((out - io["out.t2v"]).abs().max())
    print(f"ComfyUI, t2v with {ROPE_OPTIONS}: differs from plain t2v by {moved:.3f}")
    save_file({"out": out.contiguous()}, f"{OUT}/rope.safetensors")


def bernini():
    """ComfyUI's t2v WanModel on the `t2v` case's inputs with BerniniConditioning's in-context latents
    (`context_latents`, what `WAN21.extra_conds` hands the model): a 2-frame source video and a 1-frame
    reference of odd sides (padded circularly), one per sample. bernini.safetensors holds `context.0` [2, 16, 2,
    4, 6], `context.1` [2, 16, 1, 3, 5] and `out` [2, 16, 3, 4, 6] (f32). Reads the weights and inputs already
    written, so it runs on its own too (`wan.py bernini`)."""
    from safetensors.torch import load_file

    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    io = load_file(f"{OUT}/io.safetensors")
    net = comfy_net("t2v", stored, ti2v)
    x, t, context, _ = inputs(io, "t2v")
    g = torch.Generator().manual_seed(13)
    latents = [torch.randn(2, 16, 2, 4, 6, generator=g), torch.randn(2, 16, 1, 3, 5, generator=g)]
    with torch.no_grad():
        out = net(x, t, context, transformer_options={}, context_latents=latents)
    moved = float((out - io["out.t2v"]).abs().max())
    print(f"ComfyUI, t2v with two in-context latents: differs from plain t2v by {moved:.3f}")
    save_file({"context.0": latents[0], "context.1": latents[1], "out": out.contiguous()},
              f"{OUT}/bernini.safetensors")


def phantom():
    """ComfyUI's t2v WanModel with WanPhantomSubjectToVideo's reference frames (`time_dim_concat`, what
    `WAN21.extra_conds` hands the model in its latent space): their frames follow the video's along time, the RoPE
    runs over both, and the output is cut back to the video's frames. On the `t2v` case's inputs, 2 reference
    frames [1, 16, 2, 4, 6] repeated to the batch of 2 (CONDRegular); on the `ragged` case's (odd sides, padded
    circularly, the references too), 1 frame [1, 16, 1, 5, 7]. phantom.safetensors holds `concat.t2v`,
    `out.t2v` [2, 16, 3, 4, 6], `concat.ragged` and `out.ragged` [1, 16, 2, 5, 7] (f32). Reads the weights and
    inputs already written, so it runs on its own (`wan.py phantom`)."""
    from safetensors.torch import load_file

    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    io = load_file(f"{OUT}/io.safetensors")
    net = comfy_net("t2v", stored, ti2v)
    g = torch.Generator().manual_seed(17)
    tensors = {}
    for case, frames in (("t2v", 2), ("ragged", 1)):
        x, t, context, _ = inputs(io, case)
        concat = torch.randn(1, 16, frames, *x.shape[-2:], generator=g)
        with torch.no_grad():
            out = net(x, t, context, time_dim_concat=concat.repeat(x.shape[0], 1, 1, 1, 1), transformer_options={})
        assert out.shape == x.shape, (out.shape, x.shape)
        moved = float((out - io[f"out.{case}"]).abs().max())
        print(f"ComfyUI, {case} with {frames} Phantom reference frames: differs from plain {case} by {moved:.3f}")
        tensors[f"concat.{case}"] = concat
        tensors[f"out.{case}"] = out.contiguous()
    save_file(tensors, f"{OUT}/phantom.safetensors")


# ComfyUI's mark of a causal Wan file: its metadata `config`, whose `transformer` entries detection merges in.
CAUSAL_METADATA = {"config": json.dumps({"transformer": {"causal_ar": True}})}


def causal():
    """ComfyUI's `ar_video` sampler (comfy/k_diffusion/sampling.py `sample_ar_video`) on its CausalWanModel
    (comfy/ldm/wan/ar_model.py) with the t2v variant's weights, detected as WAN21_CausalAR_T2V (shift 5) from a
    file carrying CAUSAL_METADATA. The sampler's model is ComfyUI's at CFG 1: x - sigma * v, the DiT reading
    sigma * 1000. Two runs on one 4-frame latent [1, 16, 4, 4, 6] with the sigmas of the simple scheduler at
    shift 5, 3 steps: `i2v`, framewise (1 frame per block) after a start latent [1, 16, 1, 4, 6] (in model space:
    the wrapper's process_latent_in is the identity), seed 42; `t2v`, chunkwise (2 frames per block), seed 7.
    causal.safetensors holds `sigmas`, `noise` [1, 16, 4, 4, 6] (the noise-scaled x at sigma 1), `context`
    [1, 6, 32], `initial`, `out.i2v` and `out.t2v` (f32)."""
    from types import SimpleNamespace

    import comfy.model_detection
    import comfy.ops
    import comfy.samplers
    from comfy.k_diffusion.sampling import sample_ar_video
    from comfy.ldm.wan.ar_model import CausalWanModel
    from safetensors.torch import load_file

    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    weights = variant(stored, "t2v", ti2v)
    config = comfy.model_detection.model_config_from_unet(dict(weights), "", metadata=CAUSAL_METADATA)
    assert type(config).__name__ == "WAN21_CausalAR_T2V", type(config).__name__
    assert config.sampling_settings["shift"] == 5.0
    plain = comfy.model_detection.model_config_from_unet(dict(weights), "")
    assert type(plain).__name__ == "WAN21_T2V", type(plain).__name__

    net = CausalWanModel(model_type="t2v", patch_size=(1, 2, 2), in_dim=16, dim=DIM, ffn_dim=FFN, freq_dim=256,
                         text_dim=TEXT, out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6,
                         operations=comfy.ops.disable_weight_init).eval()
    result = net.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result

    sampling = comfy.model_sampling.ModelSamplingDiscreteFlow(SimpleNamespace(sampling_settings={"shift": 5.0}))
    sigmas = comfy.samplers.calculate_sigmas(sampling, "simple", 3).float()
    g = torch.Generator().manual_seed(17)
    noise = torch.randn(1, 16, 4, 4, 6, generator=g)
    context = torch.randn(1, 6, TEXT, generator=g)
    initial = torch.randn(1, 16, 1, 4, 6, generator=g)

    inner = SimpleNamespace(diffusion_model=net, get_dtype=lambda: torch.float32,
                            process_latent_in=lambda latent: latent)

    class Denoiser:
        """ComfyUI's CFG-1 model function: x - sigma * v, v the DiT's output at t = sigma * 1000."""
        inner_model = SimpleNamespace(inner_model=inner)

        def __call__(self, x, sigma, model_options=None, seed=None):
            options = model_options["transformer_options"]
            v = net(x, sigma * 1000.0, context, transformer_options=options)
            return x - v * sigma.view(sigma.shape[:1] + (1,) * (v.ndim - 1))

    out = {"sigmas": sigmas, "noise": noise, "context": context, "initial": initial}
    for case, per_block, seed, start in (("i2v", 1, 42, initial), ("t2v", 2, 7, None)):
        options = {"transformer_options": {"ar_config": {"initial_latent": start}} if start is not None else {}}
        # The sampler takes x noise-scaled at the first sigma (1: the noise itself).
        x = comfy.model_sampling.CONST().noise_scaling(sigmas[0], noise, torch.zeros_like(noise))
        with torch.no_grad():
            out[f"out.{case}"] = sample_ar_video(Denoiser(), x, sigmas, extra_args={"model_options": options,
                                                 "seed": seed}, disable=True, num_frame_per_block=per_block)
        print(f"ComfyUI ar_video {case}: max |out| {float(out[f'out.{case}'].abs().max()):.3f}")
    save_file({k: v.contiguous() for k, v in out.items()}, f"{OUT}/causal.safetensors")


# HuMo's audio branch at tiny widths: features 4 wide (Whisper's 1280), a 32-wide projection (512), audio tokens
# 24 wide (1536); 16 tokens per latent frame, as ComfyUI's gather attention hard-codes.
HUMO_CHANNELS, HUMO_HIDDEN, HUMO_AUDIO, HUMO_TOKENS = 4, 32, 24, 16


def humo():
    """ComfyUI's HumoWanModel (comfy/ldm/wan/model.py) with the expert's weights (36 channels in: HuMo 17B) and
    the t2v variant's (16: HuMo 1.7B), plus random audio weights: `audio_proj` and every block's
    `audio_cross_attn_wrapper` at the tiny widths above (ComfyUI hard-codes the released widths in its
    constructors, so the modules are swapped for tiny ones built by the same classes). Detection by ComfyUI's own
    model_config_from_unet must give WAN21_HuMo for both.

    humo.safetensors (f32) holds the audio weights (ComfyUI names, bf16 values) and three cases, each with `x.<c>`
    (the channels the DiT reads: the 17B's are the noise then WAN21_HuMo's c_concat), `t.<c>`, `context.<c>`,
    `reference.<c>` (the 16-channel reference latent in model space, as WanHuMoImageToVideo's conditioning gives
    it; the 17B model is handed WAN21_HuMo's 36-channel form of it), `audio.<c>` [B, F, 8, 5, 4] and `out.<c>`:
    `17b` (B 1, 2 latent frames of 4 x 4, one reference frame, audio for 2 frames: the model pads it for the
    reference), `1_7b` (B 2, 3 frames of 4 x 6, the audio's batch 1 repeated as CONDRegular does, t 700 / 300) and
    `1_7b_silent` (the 1_7b inputs without audio: no audio attention)."""
    import comfy.model_base
    import comfy.model_detection
    import comfy.ops
    from comfy.ldm.wan.model import AudioCrossAttentionWrapper, AudioProjModel, HumoWanModel
    from safetensors.torch import load_file

    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    ops = comfy.ops.disable_weight_init
    settings = {"operations": ops, "device": None, "dtype": None}
    g = torch.Generator().manual_seed(23)

    def nets(in_dim):
        net = HumoWanModel(patch_size=(1, 2, 2), in_dim=in_dim, dim=DIM, ffn_dim=FFN, freq_dim=256, text_dim=TEXT,
                           out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6, operations=ops).eval()
        net.audio_proj = AudioProjModel(seq_len=8, blocks=5, channels=HUMO_CHANNELS, intermediate_dim=HUMO_HIDDEN,
                                        output_dim=HUMO_AUDIO, context_tokens=HUMO_TOKENS, operations=ops)
        for block in net.blocks:
            block.audio_cross_attn_wrapper = AudioCrossAttentionWrapper(DIM, HUMO_AUDIO, HEADS, True, 1e-6,
                                                                        operation_settings=settings)
        return net

    # The audio weights, drawn once for the 36-channel net's names; the 16-channel net has the same ones.
    template = nets(36)
    audio = {}
    for name, p in template.state_dict().items():
        if not (name.startswith("audio_proj.") or ".audio_cross_attn_wrapper." in name):
            continue
        if name.endswith("bias"):
            value = 0.1 * torch.randn(p.shape, generator=g)
        elif p.ndim == 1:
            value = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
        else:
            value = torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
        audio[name] = value.to(torch.bfloat16)

    out = {k: v.float().contiguous() for k, v in audio.items()}
    cases = (("17b", "expert", 1, (2, 4, 4), 1, [875.0]),
             ("1_7b", "t2v", 2, (3, 4, 6), 1, [700.0, 300.0]))
    for case, name, batch, (frames, h, w), audio_batch, t in cases:
        weights = {**variant(stored, name, ti2v), **audio}
        config = comfy.model_detection.model_config_from_unet(dict(weights), "")
        assert type(config).__name__ == "WAN21_HuMo", type(config).__name__
        in_dim = weights["patch_embedding.weight"].shape[1]
        net = nets(in_dim)
        result = net.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
        assert not result.missing_keys and not result.unexpected_keys, result
        noise = torch.randn(batch, 16, frames, h, w, generator=g)
        reference = torch.randn(1, 16, 1, h, w, generator=g)
        sound = torch.randn(audio_batch, frames, 8, 5, HUMO_CHANNELS, generator=g)
        context = torch.randn(batch, 6, TEXT, generator=g)
        if in_dim == 36:
            # WAN21_HuMo.extra_conds: c_concat (4 zeros, then the empty video's latents per frame) and the
            # reference as 16 zeros, 4 ones and the latent.
            model = comfy.model_base.WAN21_HuMo(config)
            conds = model.extra_conds(noise=noise, device="cpu", reference_latents=[reference])
            concat = conds["c_concat"].cond
            assert concat.shape == (batch, 20, frames, h, w), concat.shape
            x = torch.cat([noise, concat], dim=1)
            ref_in = torch.cat([torch.zeros(1, 16, 1, h, w), torch.ones(1, 4, 1, h, w), reference], dim=1)
            # (extra_conds moves the latent into model space; the cases hand the net one already there.)
            want = torch.cat([ref_in[:, :20], model.process_latent_in(reference)], dim=1)
            assert torch.equal(conds["reference_latent"].cond, want)
        else:
            x, ref_in = noise, reference
        timesteps = torch.tensor(t)
        with torch.no_grad():
            got = net(x, timesteps, context, transformer_options={}, audio_embed=sound.repeat(
                batch // audio_batch, 1, 1, 1, 1), reference_latent=ref_in.repeat(batch, 1, 1, 1, 1))
            out.update({f"x.{case}": x, f"t.{case}": timesteps, f"context.{case}": context,
                        f"reference.{case}": reference, f"audio.{case}": sound, f"out.{case}": got})
            if case == "1_7b":
                silent = net(x, timesteps, context, transformer_options={},
                             reference_latent=ref_in.repeat(batch, 1, 1, 1, 1))
                out["out.1_7b_silent"] = silent
                print(f"HuMo 1.7B: audio moves the output by {float((got - silent).abs().max()):.3f}")
        print(f"HuMo {case}: max |out| {float(got.abs().max()):.3f}")
    save_file({k: v.contiguous() for k, v in out.items()}, f"{OUT}/humo.safetensors")


def vace_weights(t2v):
    """The VACE weights of the tiny VACE model, made of the t2v variant's own tensors so the fixture stays small
    (the Rust test builds them the same way): VACE block 0 is block 1 renamed, VACE block 1 is block 0; block 0's
    `before_proj` is block 0's self-attention output projection, each `after_proj` its block's cross-attention
    output projection; `vace_patch_embedding` is the TI2V patch embedding (48 channels) twice over (96)."""
    out = {}
    for n, source in ((0, 1), (1, 0)):
        for k, v in t2v.items():
            if k.startswith(f"blocks.{source}."):
                out[f"vace_blocks.{n}." + k[len(f"blocks.{source}."):]] = v
        for part in ("weight", "bias"):
            out[f"vace_blocks.{n}.after_proj.{part}"] = t2v[f"blocks.{source}.cross_attn.o.{part}"]
    for part in ("weight", "bias"):
        out[f"vace_blocks.0.before_proj.{part}"] = t2v[f"blocks.0.self_attn.o.{part}"]
    return out


def vace(stored, ti2v):
    """ComfyUI's VaceWanModel (2 blocks, 2 VACE blocks, 96-channel contexts) on the t2v variant's weights and
    vace_weights(), called as WAN21_Vace calls it: two control contexts with strengths 1.0 and 0.5. Written to
    vace.safetensors (f32): `x` [1, 16, 2, 4, 6], `t` [1] (550), `context` [1, 6, 32], `vace_context`
    [1, 2, 96, 2, 4, 6], `vace_strength` [2], `out` [1, 16, 2, 4, 6]."""
    import comfy.ops
    from comfy.ldm.wan.model import VaceWanModel

    t2v = variant(stored, "t2v", ti2v)
    weights = {**t2v, **vace_weights(t2v)}
    weights["vace_patch_embedding.weight"] = torch.cat([ti2v["patch_embedding.weight"]] * 2, dim=1)
    weights["vace_patch_embedding.bias"] = ti2v["patch_embedding.bias"]
    g = torch.Generator().manual_seed(12)
    io = {"x": torch.randn(1, 16, 2, 4, 6, generator=g), "t": torch.tensor([550.0]),
          "context": torch.randn(1, 6, TEXT, generator=g),
          "vace_context": torch.randn(1, 2, 96, 2, 4, 6, generator=g), "vace_strength": torch.tensor([1.0, 0.5])}
    net = VaceWanModel(patch_size=(1, 2, 2), in_dim=16, dim=DIM, ffn_dim=FFN, freq_dim=256, text_dim=TEXT,
                       out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6, vace_layers=2, vace_in_dim=96,
                       operations=comfy.ops.disable_weight_init).eval()
    result = net.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    with torch.no_grad():
        io["out"] = net(io["x"], io["t"], io["context"], vace_context=io["vace_context"],
                        vace_strength=io["vace_strength"].tolist(), transformer_options={})
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/vace.safetensors")


def detection_check(stored, ti2v):
    """ComfyUI's detection on each variant's file: the supported-model entry and the widths it reads."""
    import comfy.model_detection

    for name, (changes, kind) in VARIANTS.items():
        state = variant(stored, name, ti2v)
        config = comfy.model_detection.model_config_from_unet(dict(state), "")
        assert type(config).__name__ == kind, (name, type(config).__name__)
        unet = config.unet_config
        want = {**DIFFUSERS, **changes}
        assert (unet["dim"], unet["num_heads"], unet["ffn_dim"], unet["num_layers"], unet["in_dim"],
                unet["out_dim"]) == (DIM, HEADS, FFN, LAYERS, want["in_channels"], want["out_channels"]), unet
        assert unet.get("flf_pos_embed_token_number") == want["pos_embed_seq_len"], unet
        print(f"ComfyUI detects {name:7} as {kind}")


def weight_listing(net, count):
    """A module's weights as the Rust tests read them: {"globals": {name: shape} outside the blocks, "block":
    block 0's {name after `blocks.0.`: shape}, "blocks": count, "keys": how many in all}, checking every block
    `blocks.{i}.` has block 0's."""
    state = {k: list(v.shape) for k, v in net.state_dict().items()}
    blocks = [{k.split(".", 2)[2]: s for k, s in state.items() if k.startswith(f"blocks.{i}.")} for i in range(count)]
    assert all(b == blocks[0] for b in blocks)
    return {"globals": {k: s for k, s in sorted(state.items()) if not k.startswith("blocks.")},
            "block": dict(sorted(blocks[0].items())), "blocks": count, "keys": len(state)}


def write_listing(path, listing):
    """Writes a weight listing (or a map of them) as the Rust tests read it: sorted JSON, a newline after."""
    with open(path, "w") as f:
        json.dump(listing, f, indent=0, sort_keys=True)
        f.write("\n")


def released():
    """released.json: ComfyUI's module of each released configuration on the meta device."""
    import comfy.ops
    from comfy.ldm.wan.model import WanModel

    out = {}
    for name, config in RELEASED.items():
        net = WanModel(**config, text_dim=4096, freq_dim=256, patch_size=(1, 2, 2), eps=1e-6, device="meta",
                       operations=comfy.ops.disable_weight_init)
        out[name] = weight_listing(net, config["num_layers"])
        print(f"released {name:10} {out[name]['keys']} weights")
    write_listing(f"{OUT}/released.json", out)


if __name__ == "__main__":
    if sys.argv[1:] == ["rope"]:
        import_comfyui()
        scaled_rope()
    elif sys.argv[1:] == ["bernini"]:
        import_comfyui()
        bernini()
    elif sys.argv[1:] == ["phantom"]:
        import_comfyui()
        phantom()
    elif sys.argv[1:] == ["causal"]:
        import_comfyui()
        causal()
    elif sys.argv[1:] == ["humo"]:
        import_comfyui()
        humo()
    else:
        main()
