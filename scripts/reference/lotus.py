"""Fixtures for Kiln's SD-style UNet (ComfyUI's openaimodel.UNetModel in its LotusD configuration, the Lotus
depth network), from diffusers' UNet2DConditionModel with tiny random weights.

Run from the repository root:
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/lotus.py

COMFYUI_DIR (a ComfyUI checkout at 0f1fa67a, see comfyui.py; its extra pins are listed in comfy_sampling.py) is
optional: without it the fixtures are written all the same and the ComfyUI checks below are skipped.

Writes engine/models/tests/fixtures/lotus/:
- weights.safetensors: the tiny UNet's weights under ComfyUI's (LDM) names, no `diffusion_model.` prefix
  (`input_blocks.1.1.proj_in.weight`, `label_emb.0.0.weight`, `output_blocks.2.1.conv.weight`, ...). Every
  weight matrix and conv kernel is stored as fp8 e4m3 and the biases and norm parameters as bf16, to stay
  within the 2 MB fixture budget; the reference runs in f32 on exactly those rounded values.
- diffusers_names.json: {diffusers name: LDM name} for every weight (the shapes are the same in both layouts),
  so the test rebuilds a diffusers-layout file from the same weights.
- io.safetensors (f32): `unet(x, t, encoder_hidden_states=context, class_labels=y).sample` for two cases:
  `a` x [1,4,8,8], t [999], context [1,1,32] and y Lotus's task embedding (sin and cos of [1, 0], as ComfyUI's
  model_base.Lotus builds it); `b` x [2,4,10,14] (odd sizes: the decoder upsamples to each skip's size),
  t [500.5, 37], context [2,3,32], y random [2,4]. Tensors `{case}.x`, `.t`, `.context`, `.y`, `.out`.

The tiny model has Lotus's structure (SD 2's UNet: linear transformer projections, GEGLU feed-forward, 2
ResBlocks a level, attention at every level but the last, a 4-wide `label_emb` fed through diffusers'
"projection" class embedding) at widths (32, 32, 64) (ComfyUI: model_channels 32, channel_mult (1, 1, 2)),
head width 8 (4 heads at 32 channels, 8 in the 64-wide middle block) and context width 32. Widths (32, 64, 64)
would make 2.2M weights, over 2 MB even all in fp8; (32, 32, 64) still has a width change (the last level's
first ResBlock has a skip conv), two head counts and two upsample convs, in 1.4M weights (1.5 MB). Every
parameter is re-drawn (weights with std 1/sqrt(fan_in), biases std 0.1, norm scales 1 + 0.1 noise) so every
path matters.

The LDM names come from the rename below, written from openaimodel's module structure. With COMFYUI_DIR set it
is checked against ComfyUI's own comfy.utils.unet_to_diffusers, the weights are loaded (strict) into ComfyUI's
UNetModel built with its LotusD-style config at these widths, and its output is checked against diffusers'
(max |diff| / max |out| about 1e-6 on both cases; the bound is 1e-5).
"""

import json
import os
import sys

import torch
from diffusers import UNet2DConditionModel
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))

OUT = "engine/models/tests/fixtures/lotus"
MODEL_CHANNELS = 32
CHANNEL_MULT = (1, 1, 2)
WIDTHS = tuple(MODEL_CHANNELS * m for m in CHANNEL_MULT)
LAYERS = 2  # ResBlocks a level (ComfyUI's num_res_blocks)
HEAD_CHANNELS = 8
CONTEXT_DIM = 32
ADM_IN_CHANNELS = 4
ATTENTION = (True, True, False)  # a SpatialTransformer at each level (Lotus/SD 2: all but the last)


def tiny_unet():
    """diffusers' UNet2DConditionModel with Lotus's structure at tiny widths."""
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        flip_sin_to_cos=True,
        freq_shift=0,
        down_block_types=tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in ATTENTION),
        up_block_types=tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(ATTENTION)),
        block_out_channels=WIDTHS,
        layers_per_block=LAYERS,
        norm_num_groups=32,
        cross_attention_dim=CONTEXT_DIM,
        # SD 2's configs give the number of heads under this name (diffusers reads it so).
        attention_head_dim=tuple(w // HEAD_CHANNELS for w in WIDTHS),
        use_linear_projection=True,
        transformer_layers_per_block=1,
        upcast_attention=False,
        class_embed_type="projection",
        projection_class_embeddings_input_dim=ADM_IN_CHANNELS,
    ).eval()


# diffusers ResnetBlock2D part -> openaimodel ResBlock part
RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "time_emb_proj": "emb_layers.1",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "conv_shortcut": "skip_connection",
}
BASIC = {
    "conv_in": "input_blocks.0.0",
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "class_embedding.linear_1": "label_emb.0.0",
    "class_embedding.linear_2": "label_emb.0.2",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}


def ldm_name(name: str) -> str:
    """diffusers UNet2DConditionModel name -> ComfyUI/LDM UNetModel name.

    input_blocks: 0 is conv_in; level L's ResBlock i (with its SpatialTransformer as submodule 1) is
    1 + (LAYERS + 1) * L + i; its Downsample (submodule 0, `op`) follows at (LAYERS + 1) * (L + 1).
    middle_block: ResBlock 0, SpatialTransformer 1, ResBlock 2. output_blocks: up level U (U = 0 the deepest)
    holds LAYERS + 1 blocks from (LAYERS + 1) * U; the last of them carries the Upsample after the ResBlock
    and, where the level has one, the SpatialTransformer (submodule 2 then, else 1). Transformer parts keep
    their diffusers names (norm, proj_in, transformer_blocks.t.{norm1..3, attn1/2.to_q/k/v/out.0, ff.net.0.proj,
    ff.net.2}, proj_out)."""
    p = name.split(".")
    for old, new in BASIC.items():
        if name.startswith(old + "."):
            return new + name[len(old):]
    if p[0] in ("down_blocks", "up_blocks"):
        level, kind, i, rest = int(p[1]), p[2], int(p[3]), p[4:]
        if p[0] == "down_blocks":
            n = 1 + (LAYERS + 1) * level + i
            prefix = "input_blocks"
        else:
            n = (LAYERS + 1) * level + i
            prefix = "output_blocks"
        if kind == "resnets":
            return ".".join([prefix, str(n), "0", RESNET[rest[0]]] + rest[1:])
        if kind == "attentions":
            return ".".join([prefix, str(n), "1"] + rest)
        if kind == "downsamplers":  # downsamplers.0.conv.*
            assert rest[0] == "conv"
            return ".".join([prefix, str((LAYERS + 1) * (level + 1)), "0", "op"] + rest[1:])
        if kind == "upsamplers":  # upsamplers.0.conv.*
            assert rest[0] == "conv"
            attention = ATTENTION[len(WIDTHS) - 1 - level]
            n = (LAYERS + 1) * level + LAYERS
            return ".".join([prefix, str(n), "2" if attention else "1", "conv"] + rest[1:])
    if p[0] == "mid_block":
        kind, i, rest = p[1], int(p[2]), p[3:]
        if kind == "resnets":
            return ".".join(["middle_block", str(2 * i), RESNET[rest[0]]] + rest[1:])
        if kind == "attentions":
            return ".".join(["middle_block", "1"] + rest)
    raise ValueError(f"no LDM name for {name}")


def comfy_config():
    """ComfyUI's UNetModel config for the tiny model, in model_detection's LotusD form."""
    depth = [1 if a else 0 for a in ATTENTION for _ in range(LAYERS)]
    depth_output = [1 if a else 0 for a in ATTENTION for _ in range(LAYERS + 1)]
    return {
        "use_checkpoint": False,
        "image_size": 32,
        "out_channels": 4,
        "use_spatial_transformer": True,
        "legacy": False,
        "adm_in_channels": ADM_IN_CHANNELS,
        "num_classes": "sequential",
        "in_channels": 4,
        "model_channels": MODEL_CHANNELS,
        "num_res_blocks": [LAYERS] * len(CHANNEL_MULT),
        "transformer_depth": depth,
        "channel_mult": list(CHANNEL_MULT),
        "transformer_depth_middle": 1,
        "use_linear_in_transformer": True,
        "context_dim": CONTEXT_DIM,
        "num_head_channels": HEAD_CHANNELS,
        "num_heads": -1,
        "transformer_depth_output": depth_output,
        "use_temporal_attention": False,
        "use_temporal_resblock": False,
    }


def randomize(unet):
    """Re-draws every parameter and rounds it to its stored type; returns {diffusers name: stored tensor}."""
    norms = set()
    for mname, m in unet.named_modules():
        if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)):
            norms.update(f"{mname}.{p}" for p in ("weight", "bias"))
    stored = {}
    with torch.no_grad():
        for name, p in unet.named_parameters():
            if name in norms:
                v = (1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn_like(p)
            else:
                v = torch.randn_like(p) / p[0].numel() ** 0.5
            s = v.to(torch.float8_e4m3fn if p.ndim >= 2 else torch.bfloat16)
            p.copy_(s.float())
            stored[name] = s.contiguous()
    assert set(stored) == set(unet.state_dict()), "buffers besides parameters"
    return stored


def lotus_task_embedding():
    """ComfyUI's model_base.Lotus `y`: sin and cos of the task switch [1, 0] (depth), [1, 4]."""
    task = torch.tensor([1.0, 0.0])
    return torch.cat([torch.sin(task), torch.cos(task)]).unsqueeze(0)


def comfy_check(ldm, names, cases):
    """ComfyUI's own map and UNetModel against ours; returns the worst relative difference of the outputs."""
    from comfyui import import_comfyui

    import_comfyui()
    import comfy.utils
    from comfy.ldm.modules.diffusionmodules.openaimodel import UNetModel

    config = comfy_config()
    theirs = comfy.utils.unet_to_diffusers(config)
    for d, l in names.items():
        assert theirs.get(d) == l, (d, l, theirs.get(d))
    extra = sorted(set(theirs) - set(names))
    # ComfyUI's map also names SDXL's add_embedding, the last level's (absent) down/upsamplers and the skip
    # convs of ResBlocks that keep their width (absent too).
    last = len(CHANNEL_MULT) - 1
    absent = ("add_embedding.", f"down_blocks.{last}.downsamplers.", f"up_blocks.{last}.upsamplers.")
    for k in extra:
        assert k.startswith(absent) or ".conv_shortcut." in k, k
    print(f"ComfyUI's unet_to_diffusers agrees on all {len(names)} names ({len(extra)} extra names of absent modules)")

    model = UNetModel(**config, dtype=torch.float32, device="cpu").eval()
    model.load_state_dict({k: v.float() for k, v in ldm.items()}, strict=True)
    print("ComfyUI's UNetModel loads the weights (strict)")
    worst = 0.0
    with torch.no_grad():
        for case, c in cases.items():
            out = model(c["x"], timesteps=c["t"], context=c["context"], y=c["y"])
            ref = c["out"]
            rel = ((out - ref).abs().max() / ref.abs().max()).item()
            print(f"case {case}: ComfyUI vs diffusers max |diff| / max |out| = {rel:.3e}")
            assert rel < 1e-5, rel
            worst = max(worst, rel)
    return worst


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(20)
    unet = tiny_unet()
    stored = randomize(unet)

    ldm, names = {}, {}
    for name, s in stored.items():
        new = ldm_name(name)
        assert new not in ldm, f"{new} mapped twice"
        ldm[new] = s
        names[name] = new
    save_file(ldm, f"{OUT}/weights.safetensors")
    with open(f"{OUT}/diffusers_names.json", "w") as f:
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(names.items())]
        f.write("{\n" + ",\n".join(lines) + "\n}\n")

    g = torch.Generator().manual_seed(21)
    cases = {
        "a": {
            "x": torch.randn(1, 4, 8, 8, generator=g),
            "t": torch.tensor([999.0]),
            "context": torch.randn(1, 1, CONTEXT_DIM, generator=g),
            "y": lotus_task_embedding(),
        },
        "b": {
            "x": torch.randn(2, 4, 10, 14, generator=g),
            "t": torch.tensor([500.5, 37.0]),
            "context": torch.randn(2, 3, CONTEXT_DIM, generator=g),
            "y": torch.randn(2, ADM_IN_CHANNELS, generator=g),
        },
    }
    io = {}
    with torch.no_grad():
        for case, c in cases.items():
            out = unet(c["x"], c["t"], encoder_hidden_states=c["context"], class_labels=c["y"]).sample
            assert out.shape == c["x"].shape, out.shape
            assert torch.isfinite(out).all(), f"case {case}: non-finite output"
            assert out.abs().max() > 0.1 and out.std() > 0.05, f"case {case}: degenerate output"
            c["out"] = out
            print(f"case {case}: out {list(out.shape)} max |out| {out.abs().max():.4f} std {out.std():.4f}")
            for k, v in c.items():
                io[f"{case}.{k}"] = v.float().contiguous()
    save_file(io, f"{OUT}/io.safetensors")

    if os.environ.get("COMFYUI_DIR"):
        comfy_check(ldm, names, cases)
    else:
        print("COMFYUI_DIR not set: ComfyUI's map and UNetModel not checked")
    for f in sorted(os.listdir(OUT)):
        print(f"{OUT}/{f}: {os.path.getsize(os.path.join(OUT, f))} bytes")


if __name__ == "__main__":
    main()
