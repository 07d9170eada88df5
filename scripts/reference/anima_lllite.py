"""Fixtures for Anima's ControlNet-LLLite (engine/models/tests/fixtures/anima_lllite/): ComfyUI's AnimaLLLite
(comfy/ldm/anima/lllite.py), loaded by its ModelPatchLoader and applied as its AnimaLLLiteApply node applies it
(comfy_extras/nodes_model_patch.py), on the tiny Anima DiT of engine/models/tests/fixtures/anima/ (written by
scripts/reference/anima.py; the same model is built here again, nothing is imported from that script).

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a, with its pin
comfy-kitchen 0.2.31; the node module imports comfy_api, which imports PyAV: `pip install av==18.1.0` beside the
pins, as flux2.py needs):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/anima_lllite.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; lllite.py is comfy/ldm/anima/lllite.py,
nodes.py is comfy_extras/nodes_model_patch.py, predict2.py is comfy/ldm/cosmos/predict2.py):
- Loading, nodes.py:229-336 ModelPatchLoader: a file with `lllite_conditioning1.conv1.weight` is an AnimaLLLite
  built with the file's safetensors metadata, dtype = the dtype holding most weights (utils.py:183-193: bf16
  here), operations comfy.ops.manual_cast (weights cast to the input's dtype at each op: f32 compute on the
  bf16 values), then load_state_dict (strict). lllite.py:129-175 AnimaLLLite reads everything from the keys:
  cond_in_channels = conv1.weight dim 1, cond_dim = conv3.weight dim 0, cond_emb_dim = proj.weight dim 0,
  resblocks = 1 + the largest `lllite_conditioning1.resblocks.N`, ASPP iff any `lllite_conditioning1.aspp.*` key
  (dilations from metadata `lllite.aspp_dilations`, default "1,2,4,8"), `lllite.version` must be "2" (the
  default), `lllite.inpaint_masked_input` == "true" (case-insensitive; default "false"); one module per
  `lllite_dit_blocks_{i}_{target}` prefix, target in self_attn_{q,k,v}_proj | cross_attn_q_proj | mlp_layer1
  (anything else is an error), mlp_dim / in_dim from its down.weight. Modules may be absent: apply()
  (lllite.py:180-184) returns x unchanged for a missing name.
- lllite.py:14-18 _group_norm(C): groups = 8, halved while C % groups != 0 (8 -> 4 -> 2 -> 1); torch GroupNorm
  eps 1e-5, affine. lllite.py:66-93 the conditioning CNN: conv1 4x4 stride 4 (C_in -> cond_dim/2, bias), GN,
  SiLU; conv2 3x3 pad 1, GN, SiLU; conv3 4x4 stride 4 (-> cond_dim), GN, SiLU (so /16 in each direction);
  resblocks (lllite.py:21-32: x + conv2(silu(gn2(conv1(silu(gn1(x))))))); ASPP (lllite.py:35-63): per
  dilation d a branch Conv (1x1 for d == 1, else 3x3 with padding d, dilation d), GN, SiLU; a global branch
  mean over H W -> Conv 1x1, GN, SiLU -> bilinear (align_corners False) back to H x W (a 1x1 source: a constant);
  concat [branches in dilation order, global] on channels -> Conv 1x1 -> GN -> SiLU; then proj 1x1 (-> emb),
  flatten to tokens in (h w) row-major order [B, H/16 * W/16, emb], LayerNorm(emb) (eps 1e-5, affine).
- lllite.py:96-126 AnimaLLLiteModule(x, cond_emb, strength): x [B, L, D] (5-D [B, T, H, W, D] is flattened to
  [B, T*H*W, D] and reshaped back); cond_emb repeated along the batch when x's batch is a multiple of its own;
  c = cond_emb + depth_embed; h = silu(down(x)); (gamma, beta) = chunk2(cond_to_film(c)) (gamma FIRST);
  h = silu(mid(cat(c, h)) * (1 + gamma) + beta) (c FIRST in the concat); x + up(h) * strength. All Linears
  have biases.
- lllite.py:187-244 AnimaLLLitePatch (the post_input patch): nothing when strength == 0.0; when
  transformer_options has "sigmas": sigma = float(sigmas.max()) and nothing unless sigma_end <= sigma <=
  sigma_start (inclusive; the f32 sigma widened to f64 against the Python-float bounds, so a bound of 0.6 does
  NOT include an f32 sigma of 0.6 = 0.60000002); T must be 1; target = 8 * (padded latent H, W) (the x it gets
  is _forward's x after pad_to_patch_size); image [B, H, W, C] -> [B, C, H, W] -> common_upscale(target_w,
  target_h, "bicubic", crop="center") -> clamp(0, 1) -> * 2 - 1. With cond_in_channels == 4: mask [B, H, W]
  -> [B, 1, H, W] -> common_upscale(..., "nearest-exact", crop="center") (batch repeated to the image's) ->
  (mask >= 0.5) as 0/1; if inpaint_masked_input: image *= (mask < 0.5) (masked pixels become 0, not -1);
  input = cat(image, mask * 2 - 1) (4 channels, mask last). cond_emb = encode_conditioning(input), stored in
  transformer_options["model_patch_data"][patch]; the token embedding (args["img"]) is returned unchanged.
- utils.py:1069-1101 common_upscale(..., crop="center"): old_aspect = old_w / old_h, new_aspect = w / h; if
  old_aspect > new_aspect: x = round((old_w - old_w * (new_aspect / old_aspect)) / 2) columns cut each side,
  if smaller: y = round((old_h - old_h * (old_aspect / new_aspect)) / 2) rows each side (Python round: half to
  even), then torch.nn.functional.interpolate(size=(h, w), mode=method) with torch's defaults: bicubic is
  align_corners False, antialias False (Keys cubic, A = -0.75, source (dst + 0.5) * in / out - 0.5, taps
  clamped to the edge, no clamping of the source index); nearest-exact: source floor((dst + 0.5) * in / out),
  capped at in - 1.
- lllite.py:247-264 AnimaLLLiteAttentionPatch(q, k, v, extra_options): nothing when model_patch_data has no
  entry for the patch; else for each (name, target) in its targets: values[name] = model.apply(values[name],
  cond_emb, extra_options["block_index"], target, strength) - each from its own input. lllite.py:267-278
  AnimaLLLiteMLPPatch: args["x"] = model.apply(args["x"], cond_emb, block_index, "mlp_layer1", strength).
- nodes.py:339-380 AnimaLLLiteApply.apply_patch: image[..., :3]; mask = zeros_like(image[..., 0]) when the model
  has 4 input channels and no mask is given, None when it has 3; sigma_start = float(model_sampling
  .percent_to_sigma(start_percent)), sigma_end = float(percent_to_sigma(end_percent)); one AnimaLLLitePatch set
  as the "post_input" patch, AnimaLLLiteAttentionPatch(patch, {"q": "self_attn_q_proj", "k": "self_attn_k_proj",
  "v": "self_attn_v_proj"}) as "attn1_patch", AnimaLLLiteAttentionPatch(patch, {"q": "cross_attn_q_proj"}) as
  "attn2_patch", AnimaLLLiteMLPPatch(patch) as "mlp_patch" (model_patcher.py:661-715: lists under
  model_options["transformer_options"]["patches"][name]).
- model_sampling.py:321-326 ModelSamplingDiscreteFlow.percent_to_sigma: percent <= 0 -> 1.0, >= 1 -> 0.0, else
  time_snr_shift(shift, 1 - percent) = shift t / (1 + (shift - 1) t) (model_sampling.py:279-282; multiplier does
  not enter). Anima (supported_models.py:1131-1161): shift 3, multiplier 1; so the node's defaults 0 / 1 give
  sigma_start 1.0 / sigma_end 0.0, and e.g. 0.75 -> 0.5, 0.5 -> 0.75, 0.25 -> 0.9.
- Sampling-time transformer_options, samplers.py:311-325 (calc_cond_batch): model_options["transformer_options"]
  (the patches) merged with cond_or_uncond, uuids and "sigmas" = the step's sigma tensor; model_base.py:210-248
  _apply_model copies it, adds prefetch_dynamic_vbars and calls the DiT with timestep = sigma * multiplier (1).
- predict2.py:853-932 MiniTrainDIT._forward: with a "post_input" patch, transformer_options is COPIED and given
  model_patch_data = {} (:896-900); each post_input patch gets {"img": embedded tokens [B, T, H, W, D], "x": the
  padded latent [B, C, T, H, W], "transformer_options"} (:902-905); before each block transformer_options
  ["block_index"] = its 0-based index in self.blocks (:921-922).
- predict2.py:147-197 Attention.compute_qkv: q_input = x, k_input = v_input = context (= x for self-attention);
  the "attn1_patch" list (self-attention) or "attn2_patch" list (cross-attention) is called with (q_input,
  k_input, v_input, pe=rope, attn_mask=None, extra_options=transformer_options.copy() + n_heads, dim_head) and
  its "q" / "k" / "v" replace the inputs BEFORE q_proj / k_proj / v_proj (then q/k RMSNorm and RoPE as before).
  In a Block (predict2.py:471-591) x is, for self-attention, norm(x) * (1 + scale) + shift (the AdaLN-modulated
  LayerNorm of the residual stream) as [B, T*H*W, D] - the SAME tensor is q_input, k_input and v_input; for
  cross-attention q_input is the cross-attention modulated norm and k_input = v_input = the text context [B, N,
  64] (attn2_patch's targets only touch q: context untouched). The "mlp_patch" list (:583-588) gets
  {"x": the MLP's modulated norm [B, T, H, W, D] (already .to(compute dtype)), "transformer_options"} and its
  "x" replaces the MLP input (layer1's input; the residual and gate untouched).

The tiny models (stored bf16, computed in f32 on those values), ComfyUI's names, draws N(0, 1) / sqrt(fan_in)
(fan_in = in_channels * kernel area for convolutions), biases 0.1 N, GroupNorm / LayerNorm gains 1 + 0.1 N,
depth_embed 0.1 N:
- control.safetensors: cond_in_channels 3, cond_dim 16 (half 8), cond_emb_dim 16, 1 resblock, ASPP with
  dilations 1,2,4,8; modules lllite_dit_blocks_{0,1}_{self_attn_q_proj, self_attn_k_proj, self_attn_v_proj,
  cross_attn_q_proj, mlp_layer1} (in_dim 128, mlp_dim 16) less lllite_dit_blocks_1_self_attn_v_proj and
  lllite_dit_blocks_1_mlp_layer1. Metadata lllite.version "2", lllite.aspp_dilations "1,2,4,8".
- inpaint.safetensors: cond_in_channels 4, cond_dim 16, cond_emb_dim 16, no resblocks, no ASPP, all ten
  modules. Metadata lllite.version "2", lllite.aspp_dilations "1,2,4,8", lllite.inpaint_masked_input "true".
- The DiT: ../anima/dit.safetensors, built as scripts/reference/anima.py builds it (Anima with model_channels
  128, 2 blocks, 2 heads of 64, crossattn 64, adaln_lora_dim 32; its LLMAdapter replaced by the 64-wide 2-layer
  one; the adapter's stored 1000-row token table tiled to 32128 rows; the adapter is not used here).

Writes engine/models/tests/fixtures/anima_lllite/: control.safetensors, inpaint.safetensors, io.safetensors (f32)
and cases.json (see the end of main for the names; each case's entries are listed in cases.json).

Checks: ModelPatchLoader loads both files (strict) into what was drawn; every case equals what ComfyUI's node
gives on ComfyUI's own model_base.Anima under a ModelPatcher with sampling-time transformer_options
(denoised == x - out * sigma); control_off equals the unpatched DiT bitwise; the sigma bounds are inclusive.
Cross-checks (max |diff| / max |ref|, printed at the end), all from the math written out below (no ComfyUI
code): the conditioning CNN and one LLLite module; the resize / crop / clamp / mask steps; and the whole patched
forward as diffusers 0.42.1 CosmosTransformer3DModel (the DiT, names mapped as anima.py maps them, q/k eps
1e-6) with forward pre-hooks on attn1.to_q / to_k / to_v, attn2.to_q and ff.net.0.proj applying the
independent LLLite modules to those Linears' inputs.
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "../../engine/models/tests/fixtures/anima_lllite")
DIT_FILE = os.path.join(HERE, "../../engine/models/tests/fixtures/anima/dit.safetensors")
SEED = 3391
BUDGET = 1_500_000

DIT = dict(image_model="anima", max_img_h=240, max_img_w=240, max_frames=128, in_channels=16, out_channels=16,
           patch_spatial=2, patch_temporal=1, concat_padding_mask=True, model_channels=128, num_blocks=2,
           num_heads=2, mlp_ratio=4.0, crossattn_emb_channels=64, pos_emb_cls="rope3d", pos_emb_learnable=True,
           pos_emb_interpolation="crop", min_fps=1, max_fps=30, use_adaln_lora=True, adaln_lora_dim=32,
           extra_per_block_abs_pos_emb=False, rope_h_extrapolation_ratio=4.0, rope_w_extrapolation_ratio=4.0,
           rope_t_extrapolation_ratio=1.0, extra_h_extrapolation_ratio=1.0, extra_w_extrapolation_ratio=1.0,
           extra_t_extrapolation_ratio=1.0, rope_enable_fps_modulation=False)
HEAD_DIM = DIT["model_channels"] // DIT["num_heads"]
ADAPTER = dict(source_dim=64, target_dim=64, model_dim=64, num_layers=2, num_heads=2, use_self_attn=True,
               layer_norm=False)
ROWS, T5_VOCAB = 1000, 32128

TARGETS = ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "cross_attn_q_proj", "mlp_layer1")
ALL_MODULES = [f"lllite_dit_blocks_{b}_{t}" for b in range(2) for t in TARGETS]
LLLITE = {
    "control": dict(cond_in=3, cond_dim=16, emb=16, resblocks=1, aspp=(1, 2, 4, 8), in_dim=128, mlp_dim=16,
                    modules=[m for m in ALL_MODULES if m not in ("lllite_dit_blocks_1_self_attn_v_proj",
                                                                 "lllite_dit_blocks_1_mlp_layer1")],
                    metadata={"lllite.version": "2", "lllite.aspp_dilations": "1,2,4,8"}),
    "inpaint": dict(cond_in=4, cond_dim=16, emb=16, resblocks=0, aspp=(), in_dim=128, mlp_dim=16,
                    modules=list(ALL_MODULES),
                    metadata={"lllite.version": "2", "lllite.aspp_dilations": "1,2,4,8",
                              "lllite.inpaint_masked_input": "true"}),
}
# name: (model, x shape, sigmas, context tokens, image [B, H, W, 3], mask [B, H, W] or None ("zeros": the node's
# default), strength, (sigma_start, sigma_end), the node's (start_percent, end_percent) giving the same gate,
# reuse x / t / context / image of another case)
CASES = {
    "control_a": ("control", (1, 16, 1, 8, 8), [0.6], 20, (1, 40, 56), None, 0.8, (1.0, 0.0), (0.0, 1.0), None),
    "control_off": ("control", None, None, None, None, None, 0.8, (0.5, 0.2), (0.75, 0.9), "control_a"),
    "control_b2": ("control", (2, 16, 1, 8, 8), [0.6, 0.6], 20, None, None, 0.8, (1.0, 0.0), (0.0, 1.0),
                   "control_a"),
    "inpaint_a": ("inpaint", (1, 16, 1, 6, 10), [0.4], 7, (1, 48, 80), (1, 48, 80), 1.2, (1.0, 0.0), (0.0, 1.0),
                  None),
    "inpaint_nomask": ("inpaint", None, None, None, None, "zeros", 1.2, (1.0, 0.0), (0.0, 1.0), "inpaint_a"),
    "inpaint_resize": ("inpaint", None, None, None, (1, 36, 52), (1, 60, 90), 1.2, (1.0, 0.0), (0.0, 1.0),
                       "inpaint_a"),
}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def norm_names(module):
    return {n for n, m in module.named_modules()
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.RMSNorm))
            or type(m).__name__ == "RMSNorm"}


def draw_module(draw, module, norms):
    """Every state_dict entry re-drawn and rounded to bf16: norm gains 1 + 0.1 N, biases and depth_embed 0.1 N,
    weights and embeddings N / sqrt(fan_in) (fan_in = the product of all but the first dimension)."""
    out = {}
    for name, p in module.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner in norms and name.endswith(".weight"):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias") or name.endswith("depth_embed"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(p[0].numel()))
        out[name] = v.to(torch.bfloat16).contiguous()
    return out


def save_deterministic(weights, path, metadata):
    """save_file, with the header's __metadata__ in a fixed (sorted) order: safetensors writes it in hash-map
    order, which changes from run to run (same length, so the data offsets stand)."""
    from safetensors.torch import save

    blob = save(weights, metadata=metadata)
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n], object_pairs_hook=dict)
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    with open(path, "wb") as f:
        f.write(blob[:8] + text + b" " * (n - len(text)) + blob[8 + n:])


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_loaded(module, want):
    have = module.state_dict()
    assert set(want) == set(have), sorted(set(want) ^ set(have))[:10]
    for k in want:
        assert torch.equal(have[k].float(), want[k].float()), k


def tile(table, rows):
    """The stored [ROWS, D] table as the full [rows, D] one: row i = table[i % ROWS]."""
    return table.repeat((rows + table.shape[0] - 1) // table.shape[0], 1)[:rows].contiguous()


CROSS = []


def report(name, err, bound):
    CROSS.append(f"{name}: {err:.2e}")
    print(f"  {name}: max |diff| / max |ref| = {err:.2e}")
    assert err < bound, (name, err)


# ------------------------------------------------------------------------------------------------- the models


def skeleton(cfg):
    """The few keys AnimaLLLite's constructor reads (their shapes), so ComfyUI's class names every parameter."""
    half = cfg["cond_dim"] // 2
    sd = {"lllite_conditioning1.conv1.weight": torch.empty(half, cfg["cond_in"], 4, 4),
          "lllite_conditioning1.conv3.weight": torch.empty(cfg["cond_dim"], half, 4, 4),
          "lllite_conditioning1.proj.weight": torch.empty(cfg["emb"], cfg["cond_dim"], 1, 1)}
    for i in range(cfg["resblocks"]):
        sd[f"lllite_conditioning1.resblocks.{i}.conv1.weight"] = torch.empty(0)
    if cfg["aspp"]:
        sd["lllite_conditioning1.aspp.proj.0.weight"] = torch.empty(0)
    for name in cfg["modules"]:
        sd[f"{name}.down.weight"] = torch.empty(cfg["mlp_dim"], cfg["in_dim"])
        sd[f"{name}.cond_to_film.weight"] = torch.empty(2 * cfg["mlp_dim"], cfg["emb"])
    return sd


def write_lllite(name, cfg, seed):
    """Draws the file with ComfyUI's names (from the class built on the skeleton), writes it with its
    metadata, and loads it back with ComfyUI's ModelPatchLoader."""
    import comfy.ops
    from comfy.ldm.anima.lllite import AnimaLLLite
    from comfy_extras.nodes_model_patch import ModelPatchLoader

    net = AnimaLLLite(skeleton(cfg), cfg["metadata"], dtype=torch.float32, operations=comfy.ops.manual_cast)
    weights = draw_module(Draw(seed), net, norm_names(net))
    path = f"{OUT}/{name}.safetensors"
    save_deterministic(weights, path, cfg["metadata"])
    weights = load_file(path)
    with safe_open(path, "pt") as f:
        assert f.metadata() == cfg["metadata"]
    (patcher,) = ModelPatchLoader().load_model_patch(f"{name}.safetensors")
    model = patcher.model
    check_loaded(model, weights)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.cond_in_channels == cfg["cond_in"] and model.model_dim == cfg["in_dim"]
    assert model.module_names == set(cfg["modules"]) and model.block_count == 2
    assert model.inpaint_masked_input == (cfg["metadata"].get("lllite.inpaint_masked_input") == "true")
    c = model.lllite_conditioning1
    assert len(c.resblocks) == cfg["resblocks"] and (c.aspp is not None) == bool(cfg["aspp"])
    assert c.norm1.num_groups == 8 and c.norm3.num_groups == 8 and c.norm1.eps == 1e-5 and c.out_norm.eps == 1e-5
    if cfg["aspp"]:
        assert [b[0].dilation[0] for b in c.aspp.branches] == list(cfg["aspp"])
        assert c.aspp.branches[0][0].kernel_size == (1, 1) and c.aspp.branches[1][0].padding == (2, 2)
    print(f"{name}.safetensors: {len(weights)} tensors, "
          f"{sum(v.numel() for v in weights.values())} weights, metadata {cfg['metadata']}")
    return patcher, weights


def build_dit():
    """anima.py's tiny Anima, its weights from ../anima/dit.safetensors (the adapter's token table tiled)."""
    import comfy.ops
    from comfy.ldm.anima.model import Anima, LLMAdapter

    ops = comfy.ops.manual_cast
    model = Anima(**DIT, operations=ops)
    model.llm_adapter = LLMAdapter(**ADAPTER, operations=ops)
    stored = load_file(DIT_FILE)
    assert stored["llm_adapter.embed.weight"].shape == (ROWS, 64)
    full = f32(stored)
    full["llm_adapter.embed.weight"] = tile(full["llm_adapter.embed.weight"], T5_VOCAB)
    model.load_state_dict(full, strict=True)
    check_loaded(model, full)
    return model.eval(), stored, full


def node_patches(model_patch, image, mask, strength, sigma_start, sigma_end):
    """The four patch lists apply_patch sets (nodes.py:357-380), built from ComfyUI's classes directly."""
    from comfy.ldm.anima.lllite import AnimaLLLiteAttentionPatch, AnimaLLLiteMLPPatch, AnimaLLLitePatch

    image = image[..., :3]
    if model_patch.model.cond_in_channels == 4 and mask is None:
        mask = torch.zeros_like(image[..., 0])
    elif model_patch.model.cond_in_channels != 4:
        mask = None
    patch = AnimaLLLitePatch(model_patch, image, mask, strength, sigma_start, sigma_end)
    return patch, {
        "post_input": [patch],
        "attn1_patch": [AnimaLLLiteAttentionPatch(patch, {"q": "self_attn_q_proj", "k": "self_attn_k_proj",
                                                          "v": "self_attn_v_proj"})],
        "attn2_patch": [AnimaLLLiteAttentionPatch(patch, {"q": "cross_attn_q_proj"})],
        "mlp_patch": [AnimaLLLiteMLPPatch(patch)],
    }


def sampling_options(patches, sigmas):
    """transformer_options as calc_cond_batch (samplers.py:311-325) and _apply_model (model_base.py:243-246)
    hand them to the DiT (model_patch_data and block_index are _forward's own)."""
    return {"patches": patches, "cond_or_uncond": [0], "uuids": [None], "sigmas": sigmas,
            "prefetch_dynamic_vbars": False}


# ------------------------------------------------------------------------------------------------------ main


def fixture():
    import comfy.model_patcher
    import comfy.ops
    import comfy.supported_models
    import folder_paths
    from comfy.ldm.anima.model import LLMAdapter
    from comfy_extras.nodes_model_patch import AnimaLLLiteApply

    folder_paths.add_model_folder_path("model_patches", OUT, is_default=True)
    patchers, stored = {}, {}
    for i, (name, cfg) in enumerate(LLLITE.items()):
        patchers[name], stored[name] = write_lllite(name, cfg, SEED + i)
    dit, dit_stored, dit_full = build_dit()

    # ComfyUI's own model object under a ModelPatcher, for the node itself.
    config = comfy.supported_models.Anima(dict(DIT))
    config.set_inference_dtype(torch.float32, None)
    based = config.get_model({})
    based.diffusion_model.llm_adapter = LLMAdapter(**ADAPTER, operations=comfy.ops.disable_weight_init)
    based.load_model_weights(dict(dit_full), "")
    check_loaded(based.diffusion_model, dit_full)
    base_patcher = comfy.model_patcher.ModelPatcher(based, load_device=torch.device("cpu"),
                                                    offload_device=torch.device("cpu"))
    ms = base_patcher.get_model_object("model_sampling")
    assert (ms.shift, ms.multiplier) == (3.0, 1.0)
    percent_table = {str(p): float(ms.percent_to_sigma(p)) for p in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)}
    print(f"percent_to_sigma (shift 3): {percent_table}")
    assert percent_table["0.0"] == 1.0 and percent_table["1.0"] == 0.0 and percent_table["0.75"] == 0.5

    g = torch.Generator().manual_seed(SEED + 10)
    io, cases = {}, {}

    def control_image(b, h, w):
        """[B, H, W, 3] in [0, 1] with hard 0/1 edges, so bicubic overshoots and the clamp matters."""
        img = torch.rand(b, h, w, 3, generator=g)
        img[:, h // 4: h // 2, :, 0] = 1.0
        img[:, h // 4: h // 2, : w // 3, 1:] = 0.0
        img[:, :, w // 2: w // 2 + 3] = (torch.arange(3) % 2).float()[None, None, :, None]
        return img

    def mask_of(b, h, w):
        """A rectangle of ones and values at / around the threshold 0.5."""
        m = torch.zeros(b, h, w)
        m[:, h // 5: 3 * h // 5, w // 4: 3 * w // 4] = 1.0
        near = torch.tensor([0.49, 0.5, 0.51, 0.499, 0.501, 0.4999, 0.5001, 0.25, 0.75])
        m[:, h - 3, : near.numel()] = near
        m[:, 2, w - near.numel():] = near.flip(0)
        m[:, 3 * h // 5, w // 4: 3 * w // 4] = 0.5
        return m

    with torch.no_grad():
        # The conditioning CNN alone.
        image = torch.rand(1, 3, 64, 64, generator=g) * 2 - 1
        out = patchers["control"].model.encode_conditioning(image)
        assert out.shape == (1, 16, 16)
        io.update({"cond_control.image": image, "cond_control.out": out})
        cases["cond_control"] = {"model": "control", "call": "AnimaLLLite.encode_conditioning(image)",
                                 "image": list(image.shape), "out": list(out.shape)}

        for name, (which, xs, sigmas, n, img, mask, strength, bounds, percents, reuse) in CASES.items():
            mp = patchers[which]
            if reuse is not None and xs is None:
                x, t, context = io[f"{reuse}.x"], io[f"{reuse}.t"], io[f"{reuse}.context"]
            elif xs is not None:
                x = torch.randn(*xs, generator=g)
                t = torch.tensor(sigmas)
                context = (torch.randn(xs[0], n, 64, generator=g) if reuse is None
                           else io[f"{reuse}.context"].repeat(xs[0], 1, 1))
                if reuse is not None:
                    x[:1] = io[f"{reuse}.x"]
            image = control_image(*img) if img is not None else io[f"{reuse}.image"]
            if isinstance(mask, tuple):
                mask_t = mask_of(*mask)
            else:
                mask_t = None  # "zeros": the node's default; None: a 3-channel model takes none
            patch, patches = node_patches(mp, image, mask_t, strength, *bounds)

            # Capture what the patch feeds the conditioning CNN.
            seen = {}
            model = mp.model

            def recording(inp, _model=model, _seen=seen):
                _seen["cond_image"] = inp.clone()
                _seen["cond_emb"] = type(_model).encode_conditioning(_model, inp)
                return _seen["cond_emb"]

            model.encode_conditioning = recording
            try:
                got = dit(x, t, context, transformer_options=sampling_options(patches, t))
            finally:
                del model.encode_conditioning
            plain = dit(x, t, context, transformer_options={})
            assert got.shape == x.shape and torch.isfinite(got).all()
            inside = bounds[1] <= float(t.max()) <= bounds[0]
            assert inside == ("cond_image" in seen), name
            if inside:
                assert rel_err(got, plain) > 1e-2, (name, rel_err(got, plain))
            else:
                assert torch.equal(got, plain), name

            # The node itself, on model_base.Anima under a ModelPatcher, at sampling-time options.
            (patched,) = AnimaLLLiteApply().apply_patch(base_patcher, mp, image, strength, *percents,
                                                        mask=mask_t)
            to = patched.model_options["transformer_options"]
            node_patch = to["patches"]["post_input"][0]
            assert (node_patch.sigma_start, node_patch.sigma_end) == (ms.percent_to_sigma(percents[0]),
                                                                      ms.percent_to_sigma(percents[1]))
            assert [len(to["patches"][k]) for k in ("post_input", "attn1_patch", "attn2_patch", "mlp_patch")] == \
                [1, 1, 1, 1]
            assert to["patches"]["attn1_patch"][0].targets == patches["attn1_patch"][0].targets
            assert to["patches"]["attn2_patch"][0].targets == {"q": "cross_attn_q_proj"}
            options = dict(to, cond_or_uncond=[0], uuids=[None], sigmas=t)
            denoised = based.apply_model(x, t, c_crossattn=context, transformer_options=options)
            err = rel_err(denoised, x - got * t.view(-1, 1, 1, 1, 1))
            print(f"case {name}: AnimaLLLiteApply + model_base.Anima.apply_model vs x - out * sigma: {err:.2e}")
            assert err < 1e-6

            entry = {"model": which, "strength": strength, "sigma_start": bounds[0], "sigma_end": bounds[1],
                     "node_percents": list(percents), "applied": inside, "out": list(got.shape)}
            if reuse is not None:
                entry["inputs_from"] = reuse
            if xs is not None or reuse is None:
                io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context})
                entry.update({"x": list(x.shape), "t": sigmas, "context": list(context.shape)})
            if img is not None:
                io[f"{name}.image"] = image
                entry["image"] = list(image.shape)
            if mask_t is not None:
                io[f"{name}.mask"] = mask_t
                entry["mask"] = list(mask_t.shape)
            entry["mask_rule"] = ("none (3 input channels)" if which == "control" else
                                  "given" if mask_t is not None else "zeros_like(image[..., 0]) (apply_patch)")
            if inside and name in ("control_a", "inpaint_a", "inpaint_resize"):
                io[f"{name}.cond_image"] = seen["cond_image"]
                io[f"{name}.cond_emb"] = seen["cond_emb"]
                entry["cond_image"] = list(seen["cond_image"].shape)
                entry["cond_emb"] = list(seen["cond_emb"].shape)
            io[f"{name}.out"] = got
            cases[name] = entry
            print(f"case {name}: x {tuple(x.shape)}, t {t.tolist()}, image {tuple(image.shape)}, applied {inside}, "
                  f"change vs unpatched {rel_err(got, plain):.3f}, max |out| {got.abs().max():.3f}")

        # The clamp acts in control_a (bicubic overshoots), masked pixels are zeroed in the inpaint input.
        crop = io["control_a.image"].movedim(-1, 1)[..., 8:48]
        raw = F.interpolate(crop, size=(64, 64), mode="bicubic")
        assert raw.max() > 1.0 and raw.min() < 0.0
        ci = io["inpaint_a.cond_image"]
        assert torch.all(ci[:, :3][(ci[:, 3:] > 0).expand(-1, 3, -1, -1)] == 0)

        inclusive_gate_check(dit, patchers["control"], io)
        cross_check(stored, dit_stored, io, cases)

    for k, v in io.items():
        print(f"  {k:26} {str(tuple(v.shape)):20} max |v| {float(v.abs().max()):.3f}")
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({
            "seed": SEED,
            "dit": "../anima/dit.safetensors (llm_adapter.embed.weight: 1000 of 32128 rows; the adapter is unused)",
            "anima_kwargs": DIT, "head_dim": HEAD_DIM,
            "lllite": {k: {"file": f"{k}.safetensors", "cond_in_channels": c["cond_in"], "cond_dim": c["cond_dim"],
                           "cond_emb_dim": c["emb"], "resblocks": c["resblocks"], "aspp_dilations": list(c["aspp"]),
                           "in_dim": c["in_dim"], "mlp_dim": c["mlp_dim"], "modules": c["modules"],
                           "metadata": c["metadata"]} for k, c in LLLITE.items()},
            "storage": "weights bf16, computed in f32 on those values; io.safetensors f32",
            "t_is": "sigma (Anima: multiplier 1); transformer_options sigmas = t",
            "image_is": "ComfyUI IMAGE [B, H, W, 3] in [0, 1]; mask [B, H, W]",
            "cond_image_is": "the conditioning CNN's input [B, C, 8 Hlat, 8 Wlat]: bicubic center-crop resize, "
                             "clamp(0, 1), * 2 - 1; inpaint: image * (mask < 0.5), then channel 3 = mask01 * 2 - 1",
            "percent_to_sigma": percent_table,
            "cases": cases,
        }, f, indent=1)
        f.write("\n")


def inclusive_gate_check(dit, control, io):
    """sigma_end <= sigma <= sigma_start with the f32 sigma widened to f64: the bound equal to it applies the
    patch, a Python 0.6 (below the f32 0.6) does not."""
    x, t, context, image = (io[f"control_a.{k}"] for k in ("x", "t", "context", "image"))
    s = float(t.max())
    for lo, hi, applied in ((s, s, True), (0.0, 0.6, False), (0.6, 1.0, True)):
        _, patches = node_patches(control, image, None, 0.8, hi, lo)
        out = dit(x, t, context, transformer_options=sampling_options(patches, t))
        assert torch.equal(out, io["control_a.out"]) == applied, (lo, hi)
        assert torch.equal(out, io["control_off.out"]) != applied, (lo, hi)
    _, patches = node_patches(control, image, None, 0.0, 1.0, 0.0)
    assert torch.equal(dit(x, t, context, transformer_options=sampling_options(patches, t)), io["control_off.out"])
    print(f"sigma gate: inclusive at sigma == bound ({s!r}); 0.6 as a Python float excludes it; strength 0: off")


# ------------------------------------------------------------------------------- independent implementation


def group_norm(x, groups, w, b, eps=1e-5):
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(-1, keepdim=True)
    var = ((xg - mean) ** 2).mean(-1, keepdim=True)
    xg = (xg - mean) / torch.sqrt(var + eps)
    return xg.reshape(x.shape) * w.view(1, c, 1, 1) + b.view(1, c, 1, 1)


def groups_for(c):
    g = 8
    while g > 1 and c % g:
        g //= 2
    return g


def silu(x):
    return x * torch.sigmoid(x)


def conditioning_reference(sd, x, cfg):
    """The conditioning CNN restated from the math (F.conv2d as the convolution primitive)."""
    p = "lllite_conditioning1."

    def conv(name, h, stride=1, padding=0, dilation=1):
        return F.conv2d(h, sd[name + ".weight"], sd[name + ".bias"], stride, padding, dilation)

    def gn(name, h):
        return group_norm(h, groups_for(h.shape[1]), sd[name + ".weight"], sd[name + ".bias"])

    h = silu(gn(p + "norm1", conv(p + "conv1", x, stride=4)))
    h = silu(gn(p + "norm2", conv(p + "conv2", h, padding=1)))
    h = silu(gn(p + "norm3", conv(p + "conv3", h, stride=4)))
    for i in range(cfg["resblocks"]):
        r = f"{p}resblocks.{i}."
        u = conv(r + "conv1", silu(gn(r + "norm1", h)), padding=1)
        h = h + conv(r + "conv2", silu(gn(r + "norm2", u)), padding=1)
    if cfg["aspp"]:
        a = p + "aspp."
        outs = []
        for j, d in enumerate(cfg["aspp"]):
            pad = 0 if d == 1 else d
            outs.append(silu(gn(f"{a}branches.{j}.1", conv(f"{a}branches.{j}.0", h, padding=pad, dilation=d))))
        pooled = h.mean((2, 3), keepdim=True)
        pooled = silu(gn(a + "global_conv.1", conv(a + "global_conv.0", pooled)))
        outs.append(pooled.expand(-1, -1, h.shape[2], h.shape[3]))
        h = silu(gn(a + "proj.1", conv(a + "proj.0", torch.cat(outs, 1))))
    h = conv(p + "proj", h).flatten(2).transpose(1, 2)
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    return (h - mean) / torch.sqrt(var + 1e-5) * sd[p + "out_norm.weight"] + sd[p + "out_norm.bias"]


def module_reference(sd, name, x, cond, strength):
    """One LLLite module: c = cond + depth_embed; h = silu(down x); gamma, beta = film(c); h = silu(mid([c, h]) *
    (1 + gamma) + beta); x + up(h) * strength."""
    def lin(n, v):
        return v @ sd[f"{name}.{n}.weight"].T + sd[f"{name}.{n}.bias"]

    shape = x.shape
    x = x.reshape(shape[0], -1, shape[-1])
    cond = cond.repeat(x.shape[0] // cond.shape[0], 1, 1)
    c = cond + sd[f"{name}.depth_embed"]
    h = silu(lin("down", x))
    film = lin("cond_to_film", c)
    gamma, beta = film[..., : film.shape[-1] // 2], film[..., film.shape[-1] // 2:]
    h = silu(lin("mid", torch.cat([c, h], -1)) * (1 + gamma) + beta)
    return (x + lin("up", h) * strength).reshape(shape)


def center_crop(img, width, height):
    """common_upscale's crop="center" (Python round, half to even)."""
    oh, ow = img.shape[-2:]
    old, new = ow / oh, width / height
    x = y = 0
    if old > new:
        x = round((ow - ow * (new / old)) / 2)
    elif old < new:
        y = round((oh - oh * (old / new)) / 2)
    return img[..., y: oh - y, x: ow - x]


def bicubic_matrix(n_in, n_out, a=-0.75):
    """torch's bicubic along one axis (align_corners False, no antialias): Keys' cubic with A = -0.75 at source
    (dst + 0.5) * in / out - 0.5, taps clamped to the edge."""
    m = torch.zeros(n_out, n_in, dtype=torch.float64)
    scale = n_in / n_out
    for i in range(n_out):
        src = (i + 0.5) * scale - 0.5
        i0 = math.floor(src)
        t = src - i0
        ws = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
              ((a + 2) * t - (a + 3)) * t * t + 1,
              ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
              ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]
        for k, w in enumerate(ws):
            m[i, min(max(i0 - 1 + k, 0), n_in - 1)] += w
    return m


def nearest_exact_index(n_in, n_out):
    scale = n_in / n_out
    return torch.tensor([min(math.floor((i + 0.5) * scale), n_in - 1) for i in range(n_out)])


def cond_input_reference(image, mask, h, w, masked_input):
    """What AnimaLLLitePatch feeds the CNN, restated: image [B, H, W, 3] in [0, 1], mask [B, H, W] or None."""
    img = center_crop(image.movedim(-1, 1).double(), w, h)
    img = bicubic_matrix(img.shape[-2], h) @ img @ bicubic_matrix(img.shape[-1], w).T
    img = (img.clamp(0, 1) * 2 - 1).float()
    if mask is None:
        return img
    m = center_crop(mask[:, None], w, h)
    m = m[..., nearest_exact_index(m.shape[-2], h), :][..., nearest_exact_index(m.shape[-1], w)]
    m = (m >= 0.5).float()
    if masked_input:
        img = img * (1 - m)
    return torch.cat([img, m * 2 - 1], 1)


def to_diffusers_cosmos(sd):
    """ComfyUI's MiniTrainDIT names to diffusers' CosmosTransformer3DModel (the Cosmos 2.0 rename table of
    diffusers' convert_cosmos_transformer_checkpoint_to_diffusers, restated); the adapter is dropped."""
    renames = [("t_embedder.1", "time_embed.t_embedder"), ("t_embedding_norm", "time_embed.norm"),
               ("x_embedder.proj.1", "patch_embed.proj"), ("final_layer.adaln_modulation.1", "norm_out.linear_1"),
               ("final_layer.adaln_modulation.2", "norm_out.linear_2"), ("final_layer.linear", "proj_out"),
               ("blocks.", "transformer_blocks."), ("adaln_modulation_self_attn.1", "norm1.linear_1"),
               ("adaln_modulation_self_attn.2", "norm1.linear_2"), ("adaln_modulation_cross_attn.1", "norm2.linear_1"),
               ("adaln_modulation_cross_attn.2", "norm2.linear_2"), ("adaln_modulation_mlp.1", "norm3.linear_1"),
               ("adaln_modulation_mlp.2", "norm3.linear_2"), ("self_attn.", "attn1."), ("cross_attn.", "attn2."),
               ("q_proj", "to_q"), ("k_proj", "to_k"), ("v_proj", "to_v"), ("output_proj", "to_out.0"),
               ("q_norm", "norm_q"), ("k_norm", "norm_k"), ("mlp.layer1", "ff.net.0.proj"),
               ("mlp.layer2", "ff.net.2")]
    out = {}
    for k, v in sd.items():
        if k.startswith("llm_adapter."):
            continue
        for a, b in renames:
            k = k.replace(a, b)
        out[k] = v
    return out


def diffusers_dit(dit_stored):
    from diffusers import CosmosTransformer3DModel

    net = CosmosTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=DIT["num_heads"], attention_head_dim=HEAD_DIM,
        num_layers=DIT["num_blocks"], mlp_ratio=DIT["mlp_ratio"], text_embed_dim=DIT["crossattn_emb_channels"],
        adaln_lora_dim=DIT["adaln_lora_dim"], max_size=(128, 240, 240), patch_size=(1, 2, 2),
        rope_scale=(1.0, 4.0, 4.0), concat_padding_mask=True, extra_pos_embed_type=None).eval()
    result = net.load_state_dict(to_diffusers_cosmos(f32(dit_stored)), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    for name, m in net.named_modules():
        if name.endswith(("norm_q", "norm_k")):
            m.eps = 1e-6  # ComfyUI's q_norm / k_norm eps (predict2.py:129, :132)
    return net


def lllite_forward_reference(net, sd, cfg, x, t, context, cond_in, strength):
    """The patched forward: diffusers' DiT with forward pre-hooks that run the independent LLLite modules on the
    inputs of attn1.to_q / to_k / to_v, attn2.to_q and ff.net.0.proj of each block (its index the block's)."""
    cond = conditioning_reference(sd, cond_in, cfg)
    where = {"self_attn_q_proj": "attn1.to_q", "self_attn_k_proj": "attn1.to_k", "self_attn_v_proj": "attn1.to_v",
             "cross_attn_q_proj": "attn2.to_q", "mlp_layer1": "ff.net.0.proj"}
    handles = []
    for i, block in enumerate(net.transformer_blocks):
        for target, path in where.items():
            name = f"lllite_dit_blocks_{i}_{target}"
            if name not in cfg["modules"]:
                continue
            hook = (lambda n: lambda mod, args: (module_reference(sd, n, args[0], cond, strength),))(name)
            handles.append(block.get_submodule(path).register_forward_pre_hook(hook))
    try:
        mask = torch.zeros(1, 1, x.shape[-2], x.shape[-1])
        out = net(x, t, context, padding_mask=mask, return_dict=False)[0]
    finally:
        for h in handles:
            h.remove()
    return out, cond


def cross_check(stored, dit_stored, io, cases):
    import comfy.ops
    from comfy.ldm.anima.lllite import AnimaLLLite

    sds = {k: f32(v) for k, v in stored.items()}
    models = {}
    for k, cfg in LLLITE.items():
        models[k] = AnimaLLLite(stored[k], cfg["metadata"], dtype=torch.float32, operations=comfy.ops.manual_cast)
        models[k].load_state_dict(sds[k], strict=True)
    cfg = LLLITE["control"]
    report("independent conditioning CNN vs ComfyUI, cond_control",
           rel_err(conditioning_reference(sds["control"], io["cond_control.image"], cfg), io["cond_control.out"]),
           1e-5)

    g = torch.Generator().manual_seed(SEED + 20)
    for shape in ((2, 15, 128), (1, 1, 3, 5, 128)):
        x = torch.randn(*shape, generator=g)
        cond = torch.randn(1, 15, 16, generator=g)
        for name in ("lllite_dit_blocks_0_self_attn_k_proj", "lllite_dit_blocks_1_mlp_layer1"):
            got = models["inpaint"].apply(x, cond, int(name.split("_")[3]), name.split("_", 4)[4], 1.3)
            report(f"independent LLLite module vs ComfyUI, {name}, x {shape}",
                   rel_err(module_reference(sds["inpaint"], name, x, cond, 1.3), got), 1e-5)
    assert models["control"].apply(x, cond, 1, "mlp_layer1", 1.3) is x

    net = diffusers_dit(dit_stored)
    for name, case in cases.items():
        if name == "cond_control" or not case["applied"]:
            continue
        src = case.get("inputs_from", name)
        x = io[f"{name}.x"] if f"{name}.x" in io else io[f"{src}.x"]
        t = io[f"{name}.t"] if f"{name}.t" in io else io[f"{src}.t"]
        context = io[f"{name}.context"] if f"{name}.context" in io else io[f"{src}.context"]
        image = io[f"{name}.image"] if f"{name}.image" in io else io[f"{src}.image"]
        mask = io.get(f"{name}.mask")
        which = case["model"]
        if which == "inpaint" and mask is None:
            mask = torch.zeros_like(image[..., 0])
        cfg = LLLITE[which]
        cond_in = cond_input_reference(image, mask if which == "inpaint" else None, 8 * x.shape[-2],
                                       8 * x.shape[-1], cfg["metadata"].get("lllite.inpaint_masked_input") == "true")
        if f"{name}.cond_image" in io:
            report(f"independent crop / bicubic / clamp / mask vs ComfyUI, {name}.cond_image",
                   rel_err(cond_in, io[f"{name}.cond_image"]), 1e-5)
        out, cond = lllite_forward_reference(net, sds[which], cfg, x, t, context, cond_in, case["strength"])
        if f"{name}.cond_emb" in io:
            report(f"independent CNN vs ComfyUI, {name}.cond_emb", rel_err(cond, io[f"{name}.cond_emb"]), 1e-5)
        report(f"diffusers Cosmos DiT + independent LLLite hooks vs ComfyUI, {name}.out",
               rel_err(out, io[f"{name}.out"]), 1e-4)
    x, t, context = io["control_a.x"], io["control_a.t"], io["control_a.context"]
    mask = torch.zeros(1, 1, x.shape[-2], x.shape[-1])
    report("diffusers Cosmos DiT (no hooks) vs ComfyUI, control_off.out (the unpatched model)",
           rel_err(net(x, t, context, padding_mask=mask, return_dict=False)[0], io["control_off.out"]), 1e-4)


def main():
    import_comfyui(node_modules=True)
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    fixture()
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
