"""Fixtures for Kiln's FLUX.1 DiT (engine/models/tests/fixtures/flux/), from ComfyUI's own Flux
(comfy/ldm/flux/model.py at 0f1fa67a), cross-checked with diffusers' FluxTransformer2DModel.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/flux.py
(ComfyUI's imports need the extra pins listed in comfy_sampling.py: einops, comfy-kitchen, ...)

ComfyUI's module computes every recorded output, called as comfy/model_base.py's Flux calls it: timestep = sigma,
`guidance` [B] (extra_conds' FloatTensor([g]) repeated to the batch), `y` = the pooled vector (the model reads
y[:, :vec_in_dim]), `ref_latents` a list of model-space latents each repeated to the batch (CONDList does that
before the model sees them) and `ref_latents_method` as a keyword. diffusers' model, on the same weights converted
to its names (models-flux.md 3.4), packed tokens and the ids ComfyUI builds, must agree on every case (checked
here, relative to the output's largest magnitude, within 1e-5) once its q/k RMSNorms get ComfyUI's epsilon (ComfyUI
passes none, so torch uses f32's machine epsilon, ~1.19e-7; diffusers' are 1e-6: this script sets them to None).
The ragged case goes to diffusers circularly padded to the patch size and its output is cropped, as ComfyUI does.
The stored files are also loaded the way ComfyUI loads a diffusion-model file (detection from the shapes, the
`_norm.scale` rename) and must be detected as Flux, FluxSchnell and FluxInpaint and give the recorded outputs.

Writes:
- weights.safetensors: a tiny random FLUX.1-dev-shaped DiT in BFL/ComfyUI names, bf16: hidden 128 = 1 head x 128
  (RoPE axes (16, 56, 56), theta 10000, so ComfyUI's detection would read it), MLP ratio 4, 2 double + 2 single
  blocks, 16 latent channels in and out at patch 2 (img_in [128, 64]), context width 32 (txt_in [128, 32]),
  vec_in_dim 16 (vector_in.in_layer [128, 16]), guidance_in present, qkv biases. The q/k-norm gains are stored as
  `.scale` (the released files' name; ComfyUI renames `_norm.scale` to `_norm.weight` on load). Every value is
  random (norm gains 1 + 0.2 N, biases 0.1 N, weights N / sqrt(fan-in), as qwen_image.py's `randomize`); the
  references run in f32 on exactly these bf16 values. (hidden 256 / 2 heads would be about 15 MB; this is
  3.7 MB, and a diffusers-layout copy would double it, so none is written: the check converts in memory.)
- fill_img_in.safetensors: `fill.img_in.weight` [128, 384] and `fill.img_in.bias` [128] (bf16): a Fill-shaped
  model (in_channels 96) that shares every other weight with weights.safetensors.
- io.safetensors (f32), for each case c: `x.<c>` [B, C, h, w], `sigma.<c>` [B], `context.<c>` [B, N, 32],
  `y.<c>` [B, 16], `guidance.<c>` [B] (not for schnell) and ComfyUI's output `out.<c>` [B, 16, h, w]. Cases:
  even (B 1, 8x6 latent, N 7, sigma 0.7, guidance 3.5); odd (B 2, 6x10 = 3x5 tokens, N 5, sigmas (0.9, 0.25),
  guidances (3.5, 2.0)); ragged (B 1, 5x7 latent: ComfyUI pads circularly to 6x8 and crops the output back, N 4,
  sigma 0.5, guidance 4.0); schnell (the odd case's inputs, no guidance, on the model built with
  guidance_embed=False from weights.safetensors minus `guidance_in.*`); fill (B 1, x [1, 96, 6, 8] = the channels
  the DiT sees after ComfyUI's concat, N 6, sigma 0.8, guidance 30.0, on the Fill-shaped model).
- references: `ref.1` [1, 16, 6, 4] and `ref.2` [1, 16, 4, 6] (model space, batch 1; repeated to the batch of 2
  as CONDList does) with the odd case's inputs: `out.refs.offset` (Kontext's default: index 1, the second
  reference placed below or right of the first) and `out.refs.index` (index 1, 2 on axis 0: FLUX.1's
  ref_index_scale is 1).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/flux"
HIDDEN, HEADS = 128, 1
CONFIG = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=16, context_in_dim=32,
              hidden_size=HIDDEN, mlp_ratio=4.0, num_heads=HEADS, depth=2, depth_single_blocks=2,
              axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True,
              txt_ids_dims=[])
DIFFUSERS = dict(patch_size=1, in_channels=64, out_channels=64, num_layers=2, num_single_layers=2,
                 attention_head_dim=128, num_attention_heads=HEADS, joint_attention_dim=32, pooled_projection_dim=16,
                 guidance_embeds=True, axes_dims_rope=(16, 56, 56))


def main():
    import_comfyui()
    import comfy.ops
    from comfy.ldm.flux.model import Flux

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(29)
    ops = comfy.ops.disable_weight_init
    model = Flux(**CONFIG, operations=ops).eval()
    stored = randomize(model)
    state = {k: v.float() for k, v in stored.items()}
    save_file({bfl_name(k): v for k, v in stored.items()}, f"{OUT}/weights.safetensors")

    schnell = Flux(**{**CONFIG, "guidance_embed": False}, operations=ops).eval()
    schnell.load_state_dict({k: v for k, v in state.items() if not k.startswith("guidance_in.")}, strict=True)

    fill = Flux(**{**CONFIG, "in_channels": 96}, operations=ops).eval()
    fill_in = randomize(fill.img_in, seed=31)
    fill.load_state_dict({**state, **{f"img_in.{k}": v.float() for k, v in fill_in.items()}}, strict=True)
    save_file({f"fill.img_in.{k}": v for k, v in fill_in.items()}, f"{OUT}/fill_img_in.safetensors")

    g = torch.Generator().manual_seed(7)
    # name: (batch, channels, h, w, text tokens, sigmas, guidances)
    cases = {"even": (1, 16, 8, 6, 7, [0.7], [3.5]), "odd": (2, 16, 6, 10, 5, [0.9, 0.25], [3.5, 2.0]),
             "ragged": (1, 16, 5, 7, 4, [0.5], [4.0]), "fill": (1, 96, 6, 8, 6, [0.8], [30.0])}
    io = {}
    with torch.no_grad():
        for name, (b, c, h, w, n, sigmas, guidances) in cases.items():
            io[f"x.{name}"] = torch.randn(b, c, h, w, generator=g)
            io[f"context.{name}"] = torch.randn(b, n, 32, generator=g)
            io[f"y.{name}"] = torch.randn(b, 16, generator=g)
            io[f"sigma.{name}"] = torch.tensor(sigmas)
            io[f"guidance.{name}"] = torch.tensor(guidances)
            net = fill if name == "fill" else model
            io[f"out.{name}"] = comfy_call(net, io, name)
        for k in ["x", "context", "y", "sigma"]:
            io[f"{k}.schnell"] = io[f"{k}.odd"].clone()
        io["out.schnell"] = comfy_call(schnell, io, "schnell")

        io["ref.1"] = torch.randn(1, 16, 6, 4, generator=g)
        io["ref.2"] = torch.randn(1, 16, 4, 6, generator=g)
        refs = [io["ref.1"].repeat(2, 1, 1, 1), io["ref.2"].repeat(2, 1, 1, 1)]
        for method in ["offset", "index"]:
            io[f"out.refs.{method}"] = comfy_call(model, io, "odd", refs=refs, method=method)
        # Kontext's default method is "offset": no method given must give the same.
        assert torch.equal(comfy_call(model, io, "odd", refs=refs), io["out.refs.offset"])
        for k, v in io.items():
            if k.startswith("out."):
                print(f"{k:18} {str(tuple(v.shape)):16} max |out| {float(v.abs().max()):.3f}  "
                      f"std {float(v.std()):.3f}")

        cross_check(stored, fill_in, io)
        detection_check(stored, fill_in, io)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


def comfy_call(net, io, case, refs=None, method=None):
    kwargs = {} if method is None else {"ref_latents_method": method}
    return net(io[f"x.{case}"], io[f"sigma.{case}"], io[f"context.{case}"], y=io[f"y.{case}"],
               guidance=io.get(f"guidance.{case}"), ref_latents=refs, transformer_options={}, **kwargs)


def bfl_name(name):
    """ComfyUI's module names are BFL's but for the q/k-norm gains, which the released files call `.scale`."""
    return name[:-len(".weight")] + ".scale" if name.endswith(("query_norm.weight", "key_norm.weight")) else name


def to_diffusers(state, hidden=None, depth=None, single=None, mlp_ratio=None):
    """ComfyUI/BFL names to diffusers' FluxTransformer2DModel (models-flux.md 3.4): fused qkv and linear1 split by
    rows, the final modulation's halves swapped (BFL shift | scale, diffusers scale | shift). The sizes default to
    the fixture's; bench/flux-gpu/torch_flux.py passes a synthetic file's."""
    h = hidden or HIDDEN
    out = {}

    def put(dst, src):
        for suffix in ["weight", "bias"]:
            if f"{src}.{suffix}" in state:
                out[f"{dst}.{suffix}"] = state[f"{src}.{suffix}"]

    def split(dsts, src, sizes):
        for suffix in ["weight", "bias"]:
            for dst, part in zip(dsts, state[f"{src}.{suffix}"].split(sizes, dim=0)):
                out[f"{dst}.{suffix}"] = part

    put("x_embedder", "img_in")
    put("context_embedder", "txt_in")
    for dst, src in [("timestep", "time_in"), ("guidance", "guidance_in"), ("text", "vector_in")]:
        put(f"time_text_embed.{dst}_embedder.linear_1", f"{src}.in_layer")
        put(f"time_text_embed.{dst}_embedder.linear_2", f"{src}.out_layer")
    for i in range(depth or CONFIG["depth"]):
        d, s = f"transformer_blocks.{i}", f"double_blocks.{i}"
        put(f"{d}.norm1.linear", f"{s}.img_mod.lin")
        put(f"{d}.norm1_context.linear", f"{s}.txt_mod.lin")
        split([f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v"], f"{s}.img_attn.qkv", [h] * 3)
        split([f"{d}.attn.add_q_proj", f"{d}.attn.add_k_proj", f"{d}.attn.add_v_proj"], f"{s}.txt_attn.qkv", [h] * 3)
        put(f"{d}.attn.norm_q", f"{s}.img_attn.norm.query_norm")
        put(f"{d}.attn.norm_k", f"{s}.img_attn.norm.key_norm")
        put(f"{d}.attn.norm_added_q", f"{s}.txt_attn.norm.query_norm")
        put(f"{d}.attn.norm_added_k", f"{s}.txt_attn.norm.key_norm")
        put(f"{d}.attn.to_out.0", f"{s}.img_attn.proj")
        put(f"{d}.attn.to_add_out", f"{s}.txt_attn.proj")
        put(f"{d}.ff.net.0.proj", f"{s}.img_mlp.0")
        put(f"{d}.ff.net.2", f"{s}.img_mlp.2")
        put(f"{d}.ff_context.net.0.proj", f"{s}.txt_mlp.0")
        put(f"{d}.ff_context.net.2", f"{s}.txt_mlp.2")
    m = int(h * (mlp_ratio or CONFIG["mlp_ratio"]))
    for i in range(single or CONFIG["depth_single_blocks"]):
        d, s = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        split([f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v", f"{d}.proj_mlp"], f"{s}.linear1", [h, h, h, m])
        put(f"{d}.attn.norm_q", f"{s}.norm.query_norm")
        put(f"{d}.attn.norm_k", f"{s}.norm.key_norm")
        put(f"{d}.proj_out", f"{s}.linear2")
        put(f"{d}.norm.linear", f"{s}.modulation.lin")
    for suffix in ["weight", "bias"]:
        shift, scale = state[f"final_layer.adaLN_modulation.1.{suffix}"].chunk(2, dim=0)
        out[f"norm_out.linear.{suffix}"] = torch.cat([scale, shift])
    put("proj_out", "final_layer.linear")
    return out


def pack(x):
    """Latents [B, C, H, W] as packed tokens: row-major 2x2 patches, features ordered (c, py, px)."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)


def unpack(tokens, c, h, w):
    b = tokens.shape[0]
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def grid_ids(rows, cols, index=0, row0=0, col0=0):
    """(index, row, col) per token of a rows x cols grid, row-major."""
    r, c = torch.meshgrid(torch.arange(rows) + row0, torch.arange(cols) + col0, indexing="ij")
    return torch.stack([torch.full_like(r, index), r, c], dim=-1).reshape(-1, 3).float()


def cross_check(stored, fill_in, io):
    """diffusers' FluxTransformer2DModel on the same weights: each case must match ComfyUI's output."""
    from diffusers import FluxTransformer2DModel

    def build(config, state):
        net = FluxTransformer2DModel(**config).eval()
        result = net.load_state_dict(to_diffusers({k: v.float() for k, v in state.items()}), strict=True)
        assert not result.missing_keys and not result.unexpected_keys, result
        for module in net.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.eps = None  # ComfyUI's: torch's default, f32 machine epsilon
        return net

    dev = build(DIFFUSERS, stored)
    schnell = build({**DIFFUSERS, "guidance_embeds": False},
                    {k: v for k, v in stored.items() if not k.startswith("guidance_in.")})
    fill = build({**DIFFUSERS, "in_channels": 384}, {**stored, **{f"img_in.{k}": v for k, v in fill_in.items()}})

    def run(net, case, refs=(), ref_ids=()):
        x = io[f"x.{case}"]
        b, c, h, w = x.shape
        ph, pw = -h % 2, -w % 2
        padded = torch.nn.functional.pad(x, (0, pw, 0, ph), mode="circular")
        tokens = torch.cat([pack(padded)] + [pack(r) for r in refs], dim=1)
        img_ids = torch.cat([grid_ids((h + ph) // 2, (w + pw) // 2)] + list(ref_ids))
        context = io[f"context.{case}"]
        v = net(tokens, context, io[f"y.{case}"], io[f"sigma.{case}"], img_ids,
                torch.zeros(context.shape[1], 3), io.get(f"guidance.{case}"), return_dict=False)[0]
        n = (h + ph) * (w + pw) // 4
        return unpack(v[:, :n], 16, h + ph, w + pw)[:, :, :h, :w]

    refs = [io["ref.1"].repeat(2, 1, 1, 1), io["ref.2"].repeat(2, 1, 1, 1)]
    # Kontext's placement (ref rows + H > ref cols + W puts a reference right of the others, else below):
    # ref.1 (6x4) at (0, 0), then H, W = 6, 4; ref.2 (4x6): 4 + 6 > 6 + 4 is false (a tie), so it goes below,
    # at row offset 6 latent pixels = 3 tokens. index: axis 0 = 1, 2 (ref_index_scale 1) with no offsets.
    offset_ids = [grid_ids(3, 2, index=1), grid_ids(2, 3, index=1, row0=3)]
    index_ids = [grid_ids(3, 2, index=1), grid_ids(2, 3, index=2)]
    checks = {"even": run(dev, "even"), "odd": run(dev, "odd"), "ragged": run(dev, "ragged"),
              "schnell": run(schnell, "schnell"), "fill": run(fill, "fill"),
              "refs.offset": run(dev, "odd", refs, offset_ids), "refs.index": run(dev, "odd", refs, index_ids)}
    for case, v in checks.items():
        want = io[f"out.{case}"]
        diff = float((v - want).abs().max())
        rel = diff / float(want.abs().max())
        print(f"diffusers vs ComfyUI, {case:12} max |difference| {diff:.2e} (relative {rel:.2e})")
        assert rel < 1e-5, case


def detection_check(stored, fill_in, io):
    """The stored files as ComfyUI loads a diffusion-model file (detect_unet_config from the shapes, the
    `_norm.scale` rename): dev, schnell and Fill must be detected as Flux, FluxSchnell and FluxInpaint with this
    config and give the recorded outputs."""
    import comfy.model_detection

    bfl = {bfl_name(k): v for k, v in stored.items()}
    files = {"Flux": ("even", bfl), "FluxSchnell": ("schnell", {k: v for k, v in bfl.items()
                                                                  if not k.startswith("guidance_in.")}),
             "FluxInpaint": ("fill", {**bfl, **{f"img_in.{k}": v for k, v in fill_in.items()}})}
    for kind, (case, state) in files.items():
        config = comfy.model_detection.model_config_from_unet(dict(state), "")
        assert type(config).__name__ == kind, type(config).__name__
        unet = config.unet_config
        assert (unet["hidden_size"], unet["num_heads"], unet["depth"], unet["depth_single_blocks"],
                unet["vec_in_dim"], unet["context_in_dim"]) == (HIDDEN, HEADS, 2, 2, 16, 32), unet
        model = config.get_model(dict(state), "", device="cpu")
        model.load_model_weights(dict(state), "")
        net = model.diffusion_model.float()
        want = io[f"out.{case}"]
        diff = float((comfy_call(net, io, case) - want).abs().max())
        print(f"ComfyUI's loader on the stored file ({kind}): max |difference| {diff:.2e}")
        assert diff / float(want.abs().max()) < 1e-5, kind


if __name__ == "__main__":
    main()
