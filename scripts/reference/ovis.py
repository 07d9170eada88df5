"""Fixtures for Ovis-Image (engine/models/tests/fixtures/ovis/): its DiT (ComfyUI's FLUX.1 code with `yak_mlp` and
`txt_norm`) and its text encoder (ComfyUI's OvisTokenizer / OvisTEModel: Ovis2.5's Qwen3-2B LLM), each a tiny
random network built by ComfyUI's own classes, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; its extra pins
are listed in comfy_sampling.py):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/ovis.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout):
- Detection, model_detection.py:242-336: the FLUX.1 branch (key `double_blocks.0.img_attn.norm.key_norm.*` and
  `img_in.weight`) sets axes_dim [16, 56, 56], theta 10000, mlp_ratio 4, qkv_bias, patch 2, out_channels 16;
  in_channels = img_in columns / 4, hidden = img_in rows, context_in_dim = txt_in columns, vec_in_dim from
  `vector_in.in_layer.weight` (None without it), num_heads = hidden // sum(axes_dim) = hidden // 128 (:293),
  guidance_embed = `guidance_in.in_layer.weight` present (:328), yak_mlp = `double_blocks.0.img_mlp.gate_proj.weight`
  present (:329), txt_norm = `txt_norm.weight` or `.scale` present (:330), and both -> txt_ids_dims [1, 2] (:331).
  The released Ovis-Image has neither `vector_in` nor `guidance_in` (AIDC-AI's OvisImageModel and diffusers'
  OvisImageTransformer2DModel have no such modules), so supported_models.py's list (:2441) picks FluxSchnell
  (:780: image_model flux, guidance_embed False; Flux :734 needs guidance, LongCatImage :2227 needs
  context_in_dim 3584): sampling_settings multiplier 1.0, shift 1.0, get_model -> model_base.Flux with
  ModelType.FLOW (model_base.py:119-121: ModelSamplingDiscreteFlow + CONST, so the model's timestep is
  sigma * 1.0 = sigma, model_sampling.py:315, and denoised = x - out * sigma, model_sampling.py:90-92); latent
  format latent_formats.Flux (latent_formats.py:160: 16 channels, scale 0.3611, shift 0.1159);
  process_unet_state_dict (supported_models.py:750) renames `*_norm.scale` to `*_norm.weight`.
- The call, model_base.py:210-252 and Flux.extra_conds (model_base.py:1023): diffusion_model(x, t=sigma,
  context=c_crossattn, guidance=[3.5] (extra_conds' default; the model ignores it without guidance_embed,
  flux/model.py:171), no y (encode_adm returns the pooled output, None from the Ovis encoder), no attention mask
  (the encoder returns none).
- flux/model.py: Flux.__init__ (:68-145): txt_norm = operations.RMSNorm(context_in_dim) (:98-101, no eps: torch
  uses the f32 machine epsilon ~1.19e-7), applied to the context before txt_in (:180-182); time_in on
  layers.py:29 timestep_embedding(t, 256) with time_factor 1000 (t * 1000 inside: [cos, sin], freqs
  exp(-ln(10000) i / 128)); no vector_in, no guidance_in. _forward (:351-408): x padded circularly to the patch
  (common_dit.py pad_to_patch_size), patched "b c (h ph) (w pw) -> b (h w) (c ph pw)", img ids (0, row, col);
  txt ids (0, l, l) for l = 0..N-1 (txt_ids_dims [1, 2], :400-404); output unpatched and cropped to h, w.
- layers.py: YakMLP (:60-73): down(silu(gate_proj x) * up_proj x), all three with biases, for the double blocks'
  img_mlp / txt_mlp; SingleStreamBlock with yak_mlp (:296-299, :347-348): linear1 gives 3 * hidden + 2 * mlp
  columns, the MLP part's SECOND half is the gate: silu(mlp[..., m:]) * mlp[..., :m]; QKNorm RMSNorms (:91-100,
  no eps); everything else is FLUX.1 (modulation, LayerNorm eps 1e-6 no affine, RoPE over (16, 56, 56)).
- Text encoder, text_encoders/ovis.py: Qwen3Tokenizer (:8-11): Qwen2Tokenizer on qwen25_tokenizer, no start or
  end token, min_length 284 padded with 151643 (<|endoftext|>) at the end, no max length; OvisTokenizer
  (:14-25): the prompt put in llama_template (:17) and tokenized with weights disabled (no "(a:1.2)" parsing);
  Ovis25_2BModel (:28-30): SDClipModel with llama.Ovis25_2B, layer "last", special_tokens {"pad": 151643},
  attention masks on, zero_out_masked True, no attention mask returned; OvisTEModel.encode_token_weights
  (:37-55): template_end = index of the FIRST token 4004 (" background"), +1 if the next token is 25 (":"),
  out = out[:, template_end:] (the ":" row is kept); no 4004 at all leaves template_end -1: only the last row.
- sd1_clip.py:172-258 process_tokens: the mask is 1 up to the first pad token and 0 from it on, whatever follows
  (end token None: the first pad itself is 0, :203-207); pads at the very start are 0 without ending the
  sequence (left_pad, :194-200). sd1_clip.py:260-303 forward: the transformer gets the mask, z = its first output
  (layer "last" :281, i.e. after the final norm), then z *= mask (:286-287, the masked rows become 0).
- llama.py: Ovis25_2BConfig (:300-320: hidden 2048, MLP 6144, 28 layers, 16 heads / 8 kv heads of 128, eps 1e-6,
  theta 1e6, q/k norm "gemma3" = llama.py RMSNorm over head_dim with the weight as is (rms_norm_add False),
  final_norm True, no lm_head; head_dim is a class attribute, not a dataclass field); Llama2_.forward
  (:816-943): additive mask = (1 - mask) over keys, every query row, filled with finfo(f32).min / 4, plus the
  causal triu(1) filled with min / 4 (finite values: a row whose keys are all masked is still defined); positions
  0..N-1 whatever the padding; TransformerBlock (:645-680) pre-norm attention + SwiGLU MLP; q/k norm before RoPE
  (rotate-half, :492-508); the final `norm` applied (:927-928).
- sd.py:1650-1656 detect_te_model: a Qwen3 file (`model.layers.0.self_attn.q_norm.weight`) of width 2048 is
  TEModel.QWEN3_2B, which sd.py:1849-1851 loads as ovis.te / OvisTokenizer.

The tiny configs (real Ovis-Image values in brackets):
- DiT, ComfyUI Flux kwargs: in_channels 16 [16] (img_in [128, 64]), out_channels 16, patch 2, hidden 128 [3072]
  = 1 head [24] of 128 (ComfyUI fixes the head at sum(axes_dim) = 128; 2 heads would be ~4.4 MB even with fp8),
  mlp_ratio 4 (yak MLP width 512 [12288]), depth 1 [6] double + 1 [27] single block, context_in_dim 96 [2048],
  vec_in_dim None, guidance_embed False, qkv_bias, theta 10000, axes (16, 56, 56), yak_mlp, txt_norm, txt_ids_dims
  [1, 2]. detect_unet_config on the written file must give exactly this (checked) and pick FluxSchnell.
- Text encoder: ComfyUI's Ovis25_2B with Ovis25_2BConfig overridden to vocab 1000 [151936], hidden 64 [2048],
  MLP 128 [6144], 2 layers [28], 2 heads [16] / 1 kv head [8] of width 32 [128]; eps 1e-6, theta 1e6 as the real
  config. The token ids stay the real ones (pads 151643, markers 4004 and 25: ComfyUI's mask and template strip
  read them), and the tiny embedding is looked up at id % 1000 (a wrapper around ComfyUI's embedding; Kiln's test
  must do the same).

Writes engine/models/tests/fixtures/ovis/:
- dit.safetensors: the DiT under ComfyUI's module names (no `model.diffusion_model.` prefix; norm gains as
  `.weight`: `txt_norm.weight`, `*.norm.query_norm.weight`, as AIDC-AI's nn.RMSNorm names them): img_in, time_in.
  {in,out}_layer, txt_norm, txt_in, double_blocks.0.{img,txt}_mod.lin, {img,txt}_attn.{qkv, norm.query_norm,
  norm.key_norm, proj}, {img,txt}_mlp.{gate_proj, up_proj, down_proj}, single_blocks.0.{linear1 [1408, 128],
  linear2 [128, 640], norm.{query,key}_norm, modulation.lin}, final_layer.{adaLN_modulation.1, linear}. 2-D
  weights of >= 16384 values are fp8 e4m3, everything else bf16.
- dit_io.safetensors (f32): cases a (x [1,16,8,8], t [0.75], context [1,7,96]), b (x [2,16,6,10], t [1.0, 0.2],
  context [2,5,96]), c (x [1,16,5,7]: padded circularly to 6x8, output cropped; t [0.5], context [1,3,96]):
  `{c}.x`, `{c}.t` (sigma, what the model gets), `{c}.context`, `{c}.out` = Flux.forward(x, t, context, y=None,
  guidance=[3.5] repeated to the batch). Intermediates for case a: `a.txt` [1,7,128] = txt_in(txt_norm(context)),
  `a.vec` [1,128] = time_in(timestep_embedding(t, 256)).
- te.safetensors: the tiny encoder under ComfyUI's (and the released file's) names, bf16: model.embed_tokens.weight
  [1000, 64], model.layers.N.{input_layernorm, post_attention_layernorm}.weight [64],
  model.layers.N.self_attn.{q_proj [64, 64], k_proj [32, 64], v_proj [32, 64], o_proj [64, 64]}.weight,
  model.layers.N.self_attn.{q_norm, k_norm}.weight [32], model.layers.N.mlp.{gate_proj, up_proj [128, 64],
  down_proj [64, 128]}.weight, model.norm.weight [64].
- te_io.safetensors (f32), per encoder case e: `{e}.mask` [1, N] (process_tokens' mask), `{e}.hidden` [1, N, 64]
  (SDClipModel's z: final norm, masked rows zeroed), `{e}.out` = OvisTEModel.encode_token_weights' output
  `hidden[:, template_end:]`.
- te_cases.json: per encoder case its ids (real ids; embedding row id % 1000), mask, template_end and shapes; the
  template; ComfyUI's OvisTokenizer ids (whole padded sequence) and template_end for a set of prompts.

Checks: the loaded ComfyUI models hold exactly the written values; detect_unet_config gives the tiny config and
FluxSchnell, whose loaded model (the file's keys, ComfyUI's loader) gives the recorded outputs and denoises as
x - out * sigma; diffusers' OvisImageTransformer2DModel agrees on the three DiT cases (q/k and context RMSNorm eps
set to ComfyUI's None); transformers' Qwen3Model agrees with the encoder on every unmasked row.
"""

import dataclasses
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from flux import grid_ids, pack, unpack  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/ovis")
SEED = 2025
FP8_MIN = 16384  # 2-D weights with at least this many values are stored fp8 e4m3
HIDDEN, HEADS, CONTEXT = 128, 1, 96
DIT = dict(image_model="flux", in_channels=16, out_channels=16, vec_in_dim=None, context_in_dim=CONTEXT,
           hidden_size=HIDDEN, mlp_ratio=4.0, num_heads=HEADS, depth=1, depth_single_blocks=1,
           axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=False,
           txt_ids_dims=[1, 2], yak_mlp=True, txt_norm=True)
GUIDANCE = 3.5  # model_base.Flux.extra_conds' default; FluxSchnell-type models ignore it
DIT_CASES = {"a": (1, 8, 8, 7, [0.75]), "b": (2, 6, 10, 5, [1.0, 0.2]), "c": (1, 5, 7, 3, [0.5])}

VOCAB = 1000
TE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
          num_key_value_heads=1)
TE_HEAD_DIM = 32
PAD, MARK, COLON = 151643, 4004, 25
PROMPTS = {
    "cat": "a photo of a cat",
    "empty": "",
    "weights": "a (red:1.3) cat, \\(escaped\\) and embedding:foo",
    "special": "text with <|im_end|> inside",
    "long": " ".join(f"word{i}" for i in range(300)),
}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def stored(value):
    big = value.ndim == 2 and value.numel() >= FP8_MIN
    return value.to(torch.float8_e4m3fn if big else torch.bfloat16).contiguous()


def draw_module(draw, module, fp8=True):
    """Every state_dict entry re-drawn: norm gains 1 + 0.1 N, biases 0.1 N, weights N / sqrt(fan_in)."""
    out = {}
    for name, p in module.state_dict().items():
        if name.split(".")[-2].endswith("norm"):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(p[0].numel()))
        out[name] = stored(v) if fp8 else v.to(torch.bfloat16).contiguous()
    return out


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_loaded(module, want):
    have = module.state_dict()
    assert set(want) == set(have), sorted(set(want) ^ set(have))[:10]
    for k in want:
        assert torch.equal(have[k].float(), want[k].float()), k


# ----------------------------------------------------------------------------------------------------- the DiT


def comfy_dit_call(net, x, t, context):
    guidance = torch.full((x.shape[0],), GUIDANCE)
    return net(x, t, context, y=None, guidance=guidance, transformer_options={})


def dit_fixture():
    import comfy.model_detection
    import comfy.ops
    from comfy.ldm.flux.layers import timestep_embedding
    from comfy.ldm.flux.model import Flux

    draw = Draw(SEED)
    ops = comfy.ops.disable_weight_init
    model = Flux(**DIT, operations=ops).eval()
    weights = draw_module(draw, model)
    assert "vector_in.in_layer.weight" not in weights and "guidance_in.in_layer.weight" not in weights
    assert weights["single_blocks.0.linear1.weight"].shape == (3 * HIDDEN + 2 * 4 * HIDDEN, HIDDEN)
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    model.load_state_dict(f32(weights), strict=True)
    check_loaded(model, weights)

    # ComfyUI's detection on the written keys, and its loader.
    detected = comfy.model_detection.detect_unet_config(weights, "")
    print(f"detect_unet_config: {detected}")
    assert detected == DIT, (detected, DIT)
    config = comfy.model_detection.model_config_from_unet(weights, "")
    assert type(config).__name__ == "FluxSchnell", type(config).__name__
    print(f"model config {type(config).__name__}: sampling {config.sampling_settings}, "
          f"latent {type(config.latent_format).__name__} (scale {config.latent_format.scale_factor}, "
          f"shift {config.latent_format.shift_factor})")
    loaded = config.get_model(weights, "", device="cpu")
    loaded.load_model_weights(f32(weights), "")
    loaded.diffusion_model.float()
    check_loaded(loaded.diffusion_model, weights)
    assert float(loaded.model_sampling.timestep(torch.tensor(0.75))) == 0.75

    g = torch.Generator().manual_seed(SEED + 1)
    io = {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas) in DIT_CASES.items():
            io[f"{name}.x"] = torch.randn(b, 16, h, w, generator=g)
            io[f"{name}.t"] = torch.tensor(sigmas)
            io[f"{name}.context"] = 2.0 * torch.randn(b, n, CONTEXT, generator=g)
            io[f"{name}.out"] = comfy_dit_call(model, io[f"{name}.x"], io[f"{name}.t"], io[f"{name}.context"])
        io["a.txt"] = model.txt_in(model.txt_norm(io["a.context"]))
        io["a.vec"] = model.time_in(timestep_embedding(io["a.t"], 256))

        # The loaded model through model_base's _apply_model (timestep = sigma, guidance from extra_conds).
        for name in DIT_CASES:
            x, sigma = io[f"{name}.x"], io[f"{name}.t"]
            denoised = loaded._apply_model(x, sigma, c_crossattn=io[f"{name}.context"],
                                           guidance=torch.full((x.shape[0],), GUIDANCE), transformer_options={})
            want = x - io[f"{name}.out"] * sigma.view(-1, 1, 1, 1)
            err = rel_err(denoised, want)
            print(f"ComfyUI's FluxSchnell _apply_model, case {name}: denoised vs x - out * sigma {err:.2e}")
            assert err < 1e-5
        # guidance is ignored (no guidance_in).
        assert torch.equal(model(io["a.x"], io["a.t"], io["a.context"]), io["a.out"])
        dit_cross_check(weights, io)
    for k, v in io.items():
        print(f"  {k:12} {str(tuple(v.shape)):16} max |v| {float(v.abs().max()):.3f}")
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    return detected, type(config).__name__, config


def to_diffusers_ovis(state):
    """ComfyUI's names to diffusers' OvisImageTransformer2DModel: fused qkv / linear1 split by rows, the double
    blocks' SwiGLU proj = cat(up_proj, gate_proj) (diffusers' SwiGLU: first half * silu(second half)), the single
    blocks' proj_mlp = linear1's MLP rows as they are (first half value, second half gate, as ComfyUI), the final
    modulation's halves swapped (BFL shift | scale, diffusers scale | shift)."""
    h, m = HIDDEN, 4 * HIDDEN
    out = {}

    def put(dst, src):
        for suffix in ["weight", "bias"]:
            if f"{src}.{suffix}" in state:
                out[f"{dst}.{suffix}"] = state[f"{src}.{suffix}"]

    def split(dsts, src, sizes):
        for suffix in ["weight", "bias"]:
            for dst, part in zip(dsts, state[f"{src}.{suffix}"].split(sizes, dim=0)):
                if dst is not None:
                    out[f"{dst}.{suffix}"] = part

    put("x_embedder", "img_in")
    put("context_embedder_norm", "txt_norm")
    put("context_embedder", "txt_in")
    put("timestep_embedder.linear_1", "time_in.in_layer")
    put("timestep_embedder.linear_2", "time_in.out_layer")
    d, s = "transformer_blocks.0", "double_blocks.0"
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
    for ff, mlp in [("ff", "img_mlp"), ("ff_context", "txt_mlp")]:
        for suffix in ["weight", "bias"]:
            out[f"{d}.{ff}.net.0.proj.{suffix}"] = torch.cat(
                [state[f"{s}.{mlp}.up_proj.{suffix}"], state[f"{s}.{mlp}.gate_proj.{suffix}"]])
        put(f"{d}.{ff}.net.2", f"{s}.{mlp}.down_proj")
    d, s = "single_transformer_blocks.0", "single_blocks.0"
    split([f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v", f"{d}.proj_mlp"], f"{s}.linear1", [h, h, h, 2 * m])
    put(f"{d}.attn.norm_q", f"{s}.norm.query_norm")
    put(f"{d}.attn.norm_k", f"{s}.norm.key_norm")
    put(f"{d}.proj_out", f"{s}.linear2")
    put(f"{d}.norm.linear", f"{s}.modulation.lin")
    for suffix in ["weight", "bias"]:
        shift, scale = state[f"final_layer.adaLN_modulation.1.{suffix}"].chunk(2, dim=0)
        out[f"norm_out.linear.{suffix}"] = torch.cat([scale, shift])
    put("proj_out", "final_layer.linear")
    return out


def dit_cross_check(weights, io):
    from diffusers import OvisImageTransformer2DModel

    net = OvisImageTransformer2DModel(patch_size=1, in_channels=64, out_channels=64, num_layers=1,
                                      num_single_layers=1, attention_head_dim=128, num_attention_heads=HEADS,
                                      joint_attention_dim=CONTEXT, axes_dims_rope=(16, 56, 56)).eval()
    result = net.load_state_dict(to_diffusers_ovis(f32(weights)), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    for module in net.modules():
        if isinstance(module, torch.nn.RMSNorm):
            module.eps = None  # ComfyUI's: torch's default, f32 machine epsilon
    for name in DIT_CASES:
        x, context = io[f"{name}.x"], io[f"{name}.context"]
        b, c, h, w = x.shape
        ph, pw = -h % 2, -w % 2
        padded = torch.nn.functional.pad(x, (0, pw, 0, ph), mode="circular")
        n = context.shape[1]
        l = torch.arange(n).float()
        txt_ids = torch.stack([torch.zeros(n), l, l], dim=-1)
        img_ids = grid_ids((h + ph) // 2, (w + pw) // 2)
        v = net(pack(padded), context, io[f"{name}.t"], img_ids, txt_ids, return_dict=False)[0]
        v = unpack(v, 16, h + ph, w + pw)[:, :, :h, :w]
        err = rel_err(v, io[f"{name}.out"])
        print(f"diffusers OvisImageTransformer2DModel vs ComfyUI, case {name}: relative {err:.2e}")
        assert err < 1e-5, name


# ------------------------------------------------------------------------------------------- the text encoder


class ModuloEmbedding(torch.nn.Module):
    """The tiny model's embedding looked up at id % its vocabulary (the real ids reach 151668)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.weight = inner.weight

    def forward(self, x, out_dtype=None):
        return self.inner(x % self.inner.weight.shape[0], out_dtype=out_dtype)


def tiny_te():
    """ComfyUI's OvisTEModel with Ovis25_2BConfig swapped for the tiny one (llama.Ovis25_2B reads the module's
    name at construction; head_dim is a class attribute there, not a dataclass field, so a subclass sets it)."""
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.ovis as ovis

    real = llama.Ovis25_2BConfig
    fields = {k: (type(v), dataclasses.field(default=v)) for k, v in TE.items()}
    tiny = dataclasses.make_dataclass("TinyOvis25Config", [(k, t, f) for k, (t, f) in fields.items()],
                                      bases=(real,), namespace={"head_dim": TE_HEAD_DIM})
    llama.Ovis25_2BConfig = tiny
    try:
        te = ovis.OvisTEModel(device="cpu", dtype=torch.float32)
    finally:
        llama.Ovis25_2BConfig = real
    cfg = te.qwen3_2b.transformer.model.config
    assert (cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta, cfg.q_norm, cfg.rms_norm_add, cfg.final_norm,
            cfg.lm_head, cfg.qkv_bias) == (TE_HEAD_DIM, 1e-6, 1e6, "gemma3", False, True, False, False)
    return te


def te_fixture():
    import comfy.text_encoders.ovis as ovis

    tokenizer = ovis.OvisTokenizer()
    te = tiny_te()
    inner = te.qwen3_2b.transformer
    draw = Draw(SEED + 2)
    weights = draw_module(draw, inner, fp8=False)
    save_file(weights, f"{OUT}/te.safetensors")
    weights = load_file(f"{OUT}/te.safetensors")
    inner.load_state_dict(f32(weights), strict=True)
    check_loaded(inner, weights)
    inner.model.embed_tokens = ModuloEmbedding(inner.model.embed_tokens)
    inner.eval()

    def ids_of(tokens):
        return [int(t[0]) for t in tokens["qwen3_2b"][0]]

    def template_end(ids):
        # OvisTEModel.encode_token_weights' rule, restated to be recorded (checked against its output below)
        end = ids.index(MARK) if MARK in ids else -1
        if end != -1 and len(ids) > end + 1 and ids[end + 1] == COLON:
            end += 1
        return end

    tokenized = {}
    for name, prompt in PROMPTS.items():
        ids = ids_of(tokenizer.tokenize_with_weights(prompt))
        tokenized[name] = {"prompt": prompt, "ids": ids, "length": len(ids), "pads": ids.count(PAD),
                           "template_end": template_end(ids)}
        print(f"tokens {name}: {len(ids)} ids, {ids.count(PAD)} pads, template_end {template_end(ids)}")
    assert tokenized["cat"]["length"] == 284 and tokenized["cat"]["template_end"] == 28

    # The synthetic cases (real-valued ids, content below 1000):
    # a: the template markers at 4, 5 (a second 4004 later, ignored), 5 trailing pads;
    # b: 2 leading pads (masked, do not end the text), 4004 not followed by 25, a pad that ends the text and a
    #    non-pad token after it (masked too), then pads.
    g = torch.Generator().manual_seed(SEED + 3)

    def content(n):
        out = torch.randint(100, VOCAB, (n,), generator=g).tolist()
        return out

    synthetic = {
        "a": content(4) + [MARK, COLON] + content(3) + [MARK] + content(5) + [PAD] * 5,
        "b": [PAD, PAD] + content(3) + [MARK, 7] + content(5) + [PAD] + content(1) + [PAD] * 3,
    }
    cases = {name: {"ids": ids, "description": d} for (name, ids), d in zip(synthetic.items(), [
        "synthetic: 4004, 25 at 4, 5 (strip keeps rows 5..), a second 4004 at 9 (ignored), 5 trailing pads",
        "synthetic: 2 leading pads (mask 0, not an end), 4004 at 5 followed by 7 (strip keeps rows 5..), the "
        "first pad after the text at 12 ends it: the token after it is masked as well"])}
    cases["cat"] = {"ids": tokenized["cat"]["ids"], "description": "ComfyUI's OvisTokenizer on 'a photo of a cat'"}
    cases["empty"] = {"ids": tokenized["empty"]["ids"], "description": "ComfyUI's OvisTokenizer on ''"}

    io = {}
    with torch.no_grad():
        for name, case in cases.items():
            pairs = {"qwen3_2b": [[(i, 1.0) for i in case["ids"]]]}
            # What Ovis25_2BModel computes before the strip (z after zero_out_masked) and its mask.
            embeds, mask, _, _ = te.qwen3_2b.process_tokens([case["ids"]], "cpu")
            hidden, pooled = te.qwen3_2b([case["ids"]])
            assert pooled is None
            out, pooled, extra = te.encode_token_weights(pairs)
            assert pooled is None and extra == {}
            end = template_end(case["ids"])
            assert torch.equal(out, hidden[:, end:]), name
            io[f"{name}.mask"] = mask.float()
            io[f"{name}.hidden"] = hidden
            io[f"{name}.out"] = out
            case.update(mask=mask[0].tolist(), template_end=end, hidden_shape=list(hidden.shape),
                        out_shape=list(out.shape))
            print(f"encoder {name}: {len(case['ids'])} ids, {int(mask.sum())} unmasked, template_end {end}, "
                  f"out {tuple(out.shape)}")
        assert cases["a"]["mask"] == [1] * 15 + [0] * 5
        assert cases["b"]["mask"] == [0, 0] + [1] * 10 + [0] * 5
        assert (cases["a"]["template_end"], cases["b"]["template_end"]) == (5, 5)
        te_cross_check(weights, cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "vocab_mapping": f"the tiny embedding's row for token id i is i % {VOCAB}; the mask and the template "
                             "strip read the real ids",
            "pad": PAD, "template_markers": [MARK, COLON], "min_length": 284,
            "template": tokenizer.llama_template,
            "config": {**TE, "head_dim": TE_HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 1e6},
            "cases": cases,
            "tokenizer": tokenized,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")
    return list(inner.state_dict().keys())


def te_cross_check(weights, cases, io):
    """transformers' Qwen3Model (eager, the mask as a 2-D padding mask, positions 0..N-1) on the same weights:
    every row ComfyUI leaves unmasked must agree."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=TE_HEAD_DIM, rms_norm_eps=1e-6,
                         rope_theta=1e6, max_position_embeddings=4096, attn_implementation="eager")
    net = Qwen3Model(config).eval()
    net.load_state_dict({k[len("model."):]: v for k, v in f32(weights).items()}, strict=True)
    for name, case in cases.items():
        ids = torch.tensor([case["ids"]]) % VOCAB
        mask = io[f"{name}.mask"].long()
        h = net(input_ids=ids, attention_mask=mask, position_ids=torch.arange(ids.shape[1])[None]).last_hidden_state
        rows = mask[0].bool()
        err = rel_err(h[0, rows], io[f"{name}.hidden"][0, rows])
        assert torch.all(io[f"{name}.hidden"][0, ~rows] == 0)
        print(f"transformers Qwen3Model vs ComfyUI, encoder case {name}: relative {err:.2e} on {int(rows.sum())} rows")
        assert err < 1e-5, name


def main():
    import_comfyui()
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    detected, kind, _ = dit_fixture()
    keys = te_fixture()
    print("encoder layer 0 keys:", [k for k in keys if k.startswith("model.layers.0.")])
    total = 0
    for f in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{f}")
        total += size
        print(f"  {f:24} {size / 1024:8.1f} KiB")
    print(f"  total {total / 1024:.1f} KiB")
    assert total < 2.5e6


if __name__ == "__main__":
    main()
