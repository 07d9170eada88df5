"""Fixtures for Kiln's FLUX.2 DiT (engine/models/tests/fixtures/flux2/), from ComfyUI's own Flux module with
FLUX.2's parameters (comfy/ldm/flux/model.py at 0f1fa67a, as comfy/model_detection.py configures it for a file
with `double_stream_modulation_img.lin.weight`), cross-checked with diffusers' Flux2Transformer2DModel.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/flux2.py
(ComfyUI's imports need the extra pins listed in comfy_sampling.py: einops, comfy-kitchen, ...; importing its
FluxKVCache node also needs av==18.1.0, which comfy_api imports)

ComfyUI's module computes every recorded output, called as comfy/model_base.py's Flux2 calls it: timestep = sigma,
the conditioning left-padded with zero rows to 512 tokens (`Flux2.extra_conds`; the fixture stores the unpadded
conditioning, Kiln's model pads it), `guidance` [B] for the dev-shaped model, `ref_latents` each repeated to the
batch and `ref_latents_method` as a keyword. diffusers' model, on the same weights converted to its names, packed
(patch 1) tokens and the ids ComfyUI builds ((0, r, c, 0) for the image, (0, 0, 0, l) for text, (10k, r, c, 0) for
the k-th reference), must agree on every case it can express (checked here, relative to the output's largest
magnitude, within 1e-5) once its q/k RMSNorms get ComfyUI's epsilon (f32's machine epsilon; diffusers' 1e-6).
`index_timestep_zero` is checked against diffusers' KV-cache "extract" mode, which modulates the reference tokens
at a fixed timestep 0 the same way (its references go before the image; order does not change attention). The
stored file is also loaded the way ComfyUI loads a diffusion-model file (detection from the shapes, the
`_norm.scale` rename) and must be detected as Flux2 and give the recorded output.

Writes:
- weights.safetensors: a tiny random FLUX.2-Klein-shaped DiT in BFL/ComfyUI names, bf16: hidden 128 = 1 head x 128
  (RoPE axes (32, 32, 32, 32), theta 2000), MLP ratio 3 (SwiGLU: img_mlp.0 [768, 128]), 1 double + 2 single
  blocks, 128 latent channels in and out at patch 1, context width 96 (= 3 x 32, Klein's three hidden states of a
  32-wide encoder), no biases, no guidance embedding, the three shared modulations. q/k-norm gains stored as
  `.scale` as the released files do.
- guidance_in.safetensors: `guidance_in.{in,out}_layer.weight` (bf16): with weights.safetensors, a FLUX.2-dev-shaped
  model (guidance embedding).
- io.safetensors (f32), for each case c: `x.<c>` [B, 128, h, w], `sigma.<c>` [B], `context.<c>` [B, N, 96]
  (unpadded), `guidance.<c>` [B] (dev only) and ComfyUI's output `out.<c>` [B, 128, h, w]. Cases: even (B 1, 6x8,
  N 7, sigma 0.7); odd (B 2, 5x7, N 5, sigmas (0.9, 0.25)); dev (the odd inputs, guidance (4.0, 2.5), on the
  dev-shaped model); refs: `ref.1` [1, 128, 4, 6] and `ref.2` [1, 128, 6, 4] with the even inputs, `out.refs.index`
  (the default) and `out.refs.index_timestep_zero`; FluxKVCache's two calls of one run with those references,
  `out.kv.1` (sigma 0.7, fills the cache) and `out.kv.2` (sigma `sigma.kv.2`, replays it).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/flux2"
HIDDEN, HEADS, TEXT, MLP_RATIO = 128, 1, 96, 3.0
CONFIG = dict(image_model="flux2", in_channels=128, out_channels=128, vec_in_dim=None, context_in_dim=TEXT,
              hidden_size=HIDDEN, mlp_ratio=MLP_RATIO, num_heads=HEADS, depth=1, depth_single_blocks=2,
              axes_dim=[32, 32, 32, 32], theta=2000, patch_size=1, qkv_bias=False, guidance_embed=False,
              txt_ids_dims=[3], global_modulation=True, mlp_silu_act=True, ops_bias=False,
              default_ref_method="index", ref_index_scale=10.0)
DIFFUSERS = dict(patch_size=1, in_channels=128, num_layers=1, num_single_layers=2, attention_head_dim=128,
                 num_attention_heads=HEADS, joint_attention_dim=TEXT, mlp_ratio=MLP_RATIO, guidance_embeds=False)
TEXT_LEN = 512


def main():
    import_comfyui(node_modules=True)
    import comfy.ops
    from comfy.ldm.flux.model import Flux

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(41)
    ops = comfy.ops.disable_weight_init
    klein = Flux(**CONFIG, operations=ops).eval()
    stored = randomize(klein)
    state = {k: v.float() for k, v in stored.items()}
    save_file({bfl_name(k): v for k, v in stored.items()}, f"{OUT}/weights.safetensors")

    dev = Flux(**{**CONFIG, "guidance_embed": True}, operations=ops).eval()
    guidance_in = randomize(dev.guidance_in, seed=43)
    dev.load_state_dict({**state, **{f"guidance_in.{k}": v.float() for k, v in guidance_in.items()}}, strict=True)
    save_file({f"guidance_in.{k}": v for k, v in guidance_in.items()}, f"{OUT}/guidance_in.safetensors")

    g = torch.Generator().manual_seed(11)
    # name: (batch, h, w, text tokens, sigmas, guidances)
    cases = {"even": (1, 6, 8, 7, [0.7], None), "odd": (2, 5, 7, 5, [0.9, 0.25], None),
             "dev": (2, 5, 7, 5, [0.9, 0.25], [4.0, 2.5])}
    io = {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas, guidances) in cases.items():
            io[f"x.{name}"] = torch.randn(b, 128, h, w, generator=g)
            io[f"context.{name}"] = torch.randn(b, n, TEXT, generator=g)
            io[f"sigma.{name}"] = torch.tensor(sigmas)
            if guidances is not None:
                io[f"guidance.{name}"] = torch.tensor(guidances)
            io[f"out.{name}"] = comfy_call(dev if name == "dev" else klein, io, name)
        io["ref.1"] = torch.randn(1, 128, 4, 6, generator=g)
        io["ref.2"] = torch.randn(1, 128, 6, 4, generator=g)
        refs = [io["ref.1"], io["ref.2"]]
        io["out.refs.index"] = comfy_call(klein, io, "even", refs=refs)
        assert torch.equal(comfy_call(klein, io, "even", refs=refs, method="index"), io["out.refs.index"])
        io["out.refs.index_timestep_zero"] = comfy_call(klein, io, "even", refs=refs, method="index_timestep_zero")
        kv_cache(klein, io, refs)
        for k, v in io.items():
            if k.startswith("out."):
                print(f"{k:30} {str(tuple(v.shape)):18} max |out| {float(v.abs().max()):.3f}  std {float(v.std()):.3f}")

        cross_check(stored, guidance_in, io)
        detection_check(stored, io)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


def kv_cache(net, io, refs):
    """FluxKVCache (comfy_extras/nodes_flux.py): its KV_Attn_Input attention patch and its post_input patch (which
    drops the reference tokens once the cache holds their keys and values) on two calls of one sampling run with
    the even inputs and the references, method `index_timestep_zero` (what the node makes the default): the first
    at sigma 0.7 fills the cache, the second at sigma `sigma.kv.2` replays it. diffusers' KV-cache modes make the
    references attend only to themselves while extracting, which ComfyUI's do not: no cross-check."""
    from comfy_extras.nodes_flux import KV_Attn_Input

    kv = KV_Attn_Input()

    def post_input(inputs):
        if len(kv.cache) > 0:
            n = sum(inputs["transformer_options"].get("reference_image_num_tokens", []))
            if n > 0:
                inputs["img"] = inputs["img"][:, :-n]
        return inputs

    options = {"patches": {"attn1_patch": [kv], "post_input": [post_input]}}
    io["sigma.kv.2"] = torch.tensor([0.4])
    for step, sigma in [(1, io["sigma.even"]), (2, io["sigma.kv.2"])]:
        io[f"out.kv.{step}"] = net(io["x.even"], sigma, padded_context(io["context.even"]), ref_latents=refs,
                                   transformer_options=options, ref_latents_method="index_timestep_zero")
    assert len(kv.cache) == 3 and torch.equal(io["out.kv.1"], io["out.refs.index_timestep_zero"])


def padded_context(context):
    """ComfyUI's Flux2.extra_conds: zero rows before a conditioning shorter than 512 tokens."""
    return torch.nn.functional.pad(context, (0, 0, TEXT_LEN - context.shape[1], 0))


def comfy_call(net, io, case, refs=None, method=None):
    kwargs = {} if method is None else {"ref_latents_method": method}
    b = io[f"x.{case}"].shape[0]
    refs = None if refs is None else [r.repeat(b, 1, 1, 1) for r in refs]
    return net(io[f"x.{case}"], io[f"sigma.{case}"], padded_context(io[f"context.{case}"]),
               guidance=io.get(f"guidance.{case}"), ref_latents=refs, transformer_options={}, **kwargs)


def bfl_name(name):
    """ComfyUI's module names are BFL's but for the q/k-norm gains, which the released files call `.scale`."""
    return name[:-len(".weight")] + ".scale" if name.endswith(("query_norm.weight", "key_norm.weight")) else name


def to_diffusers(state, hidden=HIDDEN, depth=1, single=2):
    """ComfyUI/BFL names to diffusers' Flux2Transformer2DModel: fused double-block qkv split by rows, the single
    blocks' linear1/linear2 kept fused (to_qkv_mlp_proj, to_out), the final modulation's halves swapped (BFL
    shift | scale, diffusers scale | shift). No biases anywhere."""
    out = {}

    def put(dst, src):
        out[f"{dst}.weight"] = state[f"{src}.weight"]

    put("x_embedder", "img_in")
    put("context_embedder", "txt_in")
    for dst, src in [("timestep", "time_in"), ("guidance", "guidance_in")]:
        if f"{src}.in_layer.weight" in state:
            put(f"time_guidance_embed.{dst}_embedder.linear_1", f"{src}.in_layer")
            put(f"time_guidance_embed.{dst}_embedder.linear_2", f"{src}.out_layer")
    for name in ["double_stream_modulation_img", "double_stream_modulation_txt", "single_stream_modulation"]:
        put(f"{name}.linear", f"{name}.lin")
    for i in range(depth):
        d, s = f"transformer_blocks.{i}", f"double_blocks.{i}"
        for dsts, src in [(["to_q", "to_k", "to_v"], "img_attn.qkv"),
                          (["add_q_proj", "add_k_proj", "add_v_proj"], "txt_attn.qkv")]:
            for dst, part in zip(dsts, state[f"{s}.{src}.weight"].split([hidden] * 3, dim=0)):
                out[f"{d}.attn.{dst}.weight"] = part
        put(f"{d}.attn.norm_q", f"{s}.img_attn.norm.query_norm")
        put(f"{d}.attn.norm_k", f"{s}.img_attn.norm.key_norm")
        put(f"{d}.attn.norm_added_q", f"{s}.txt_attn.norm.query_norm")
        put(f"{d}.attn.norm_added_k", f"{s}.txt_attn.norm.key_norm")
        put(f"{d}.attn.to_out.0", f"{s}.img_attn.proj")
        put(f"{d}.attn.to_add_out", f"{s}.txt_attn.proj")
        put(f"{d}.ff.linear_in", f"{s}.img_mlp.0")
        put(f"{d}.ff.linear_out", f"{s}.img_mlp.2")
        put(f"{d}.ff_context.linear_in", f"{s}.txt_mlp.0")
        put(f"{d}.ff_context.linear_out", f"{s}.txt_mlp.2")
    for i in range(single):
        d, s = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        put(f"{d}.attn.to_qkv_mlp_proj", f"{s}.linear1")
        put(f"{d}.attn.to_out", f"{s}.linear2")
        put(f"{d}.attn.norm_q", f"{s}.norm.query_norm")
        put(f"{d}.attn.norm_k", f"{s}.norm.key_norm")
    shift, scale = state["final_layer.adaLN_modulation.1.weight"].chunk(2, dim=0)
    out["norm_out.linear.weight"] = torch.cat([scale, shift])
    put("proj_out", "final_layer.linear")
    return out


def tokens(x):
    """Latents [B, C, H, W] as patch-1 tokens [B, H*W, C]."""
    b, c, h, w = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, h * w, c)


def untokens(t, h, w):
    b, _, c = t.shape
    return t.reshape(b, h, w, c).permute(0, 3, 1, 2)


def grid_ids(rows, cols, index=0):
    """(index, row, col, 0) per token of a rows x cols grid, row-major."""
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.stack([torch.full_like(r, index), r, c, torch.zeros_like(r)], dim=-1).reshape(-1, 4).float()


def text_ids(n):
    ids = torch.zeros(n, 4)
    ids[:, 3] = torch.arange(n)
    return ids


def cross_check(stored, guidance_in, io):
    """diffusers' Flux2Transformer2DModel on the same weights: each case must match ComfyUI's output."""
    from diffusers import Flux2Transformer2DModel

    def build(config, state):
        net = Flux2Transformer2DModel(**config).eval()
        result = net.load_state_dict(to_diffusers({k: v.float() for k, v in state.items()}), strict=True)
        assert not result.missing_keys and not result.unexpected_keys, result
        for module in net.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.eps = None  # ComfyUI's: torch's default, f32 machine epsilon
        return net

    klein = build(DIFFUSERS, stored)
    dev = build({**DIFFUSERS, "guidance_embeds": True},
                {**stored, **{f"guidance_in.{k}": v for k, v in guidance_in.items()}})

    def run(net, case, refs=(), timestep_zero=False):
        x = io[f"x.{case}"]
        b, _, h, w = x.shape
        context = padded_context(io[f"context.{case}"])
        refs = [r.repeat(b, 1, 1, 1) for r in refs]
        ref_ids = [grid_ids(r.shape[2], r.shape[3], index=10 * (k + 1)) for k, r in enumerate(refs)]
        kwargs = dict(timestep=io[f"sigma.{case}"], txt_ids=text_ids(context.shape[1]),
                      guidance=io.get(f"guidance.{case}"), return_dict=False)
        if timestep_zero:
            # diffusers' KV extract mode: references first, modulated at timestep 0.
            ref_tokens = torch.cat([tokens(r) for r in refs], dim=1)
            hidden = torch.cat([ref_tokens, tokens(x)], dim=1)
            ids = torch.cat(ref_ids + [grid_ids(h, w)])
            out = net(hidden, context, img_ids=ids, kv_cache_mode="extract", num_ref_tokens=ref_tokens.shape[1],
                      ref_fixed_timestep=0.0, **kwargs)[0]
            v = out[:, -h * w:] if out.shape[1] > h * w else out
        else:
            hidden = torch.cat([tokens(x)] + [tokens(r) for r in refs], dim=1)
            ids = torch.cat([grid_ids(h, w)] + ref_ids)
            v = net(hidden, context, img_ids=ids, **kwargs)[0][:, :h * w]
        return untokens(v, h, w)

    refs = [io["ref.1"], io["ref.2"]]
    checks = {"even": run(klein, "even"), "odd": run(klein, "odd"), "dev": run(dev, "dev"),
              "refs.index": run(klein, "even", refs),
              "refs.index_timestep_zero": run(klein, "even", refs, timestep_zero=True)}
    for case, v in checks.items():
        want = io[f"out.{case}"]
        diff = float((v - want).abs().max())
        rel = diff / float(want.abs().max())
        print(f"diffusers vs ComfyUI, {case:26} max |difference| {diff:.2e} (relative {rel:.2e})")
        assert rel < 1e-5, case


def detection_check(stored, io):
    """The stored file as ComfyUI loads a diffusion-model file: detected as Flux2 with this config, giving the
    recorded output."""
    import comfy.model_detection

    state = {bfl_name(k): v for k, v in stored.items()}
    config = comfy.model_detection.model_config_from_unet(dict(state), "")
    assert type(config).__name__ == "Flux2", type(config).__name__
    unet = config.unet_config
    assert (unet["hidden_size"], unet["num_heads"], unet["depth"], unet["depth_single_blocks"],
            unet["context_in_dim"], unet["guidance_embed"]) == (HIDDEN, HEADS, 1, 2, TEXT, False), unet
    model = config.get_model(dict(state), "", device="cpu")
    model.load_model_weights(dict(state), "")
    net = model.diffusion_model.float()
    want = io["out.even"]
    diff = float((comfy_call(net, io, "even") - want).abs().max())
    print(f"ComfyUI's loader on the stored file (Flux2): max |difference| {diff:.2e}")
    assert diff / float(want.abs().max()) < 1e-5


if __name__ == "__main__":
    main()
