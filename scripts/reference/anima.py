"""Fixtures for Anima (engine/models/tests/fixtures/anima/): its DiT (ComfyUI's comfy/ldm/anima: Cosmos Predict2's
MiniTrainDIT plus the LLMAdapter that turns Qwen3 0.6B states and T5 ids into the DiT's context) and its text
encoder (ComfyUI's AnimaTokenizer / AnimaTEModel: Qwen3 0.6B, with T5 ids riding along), each a tiny random
network built by ComfyUI's own classes, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; its extra pins
are listed in comfy_sampling.py, comfy-kitchen 0.2.31 among them, as ComfyUI's requirements.txt pins it; comfy.sd
is not imported, so no torchaudio stand-in is needed):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/anima.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; predict2.py is comfy/ldm/cosmos/predict2.py,
anima.py is comfy/ldm/anima/model.py, pos.py is comfy/ldm/cosmos/position_embedding.py):
- Detection, model_detection.py:816-867: `blocks.0.mlp.layer1.weight` is Cosmos Predict2, and with
  `llm_adapter.blocks.0.cross_attn.q_proj.weight` image_model "anima"; max_img_h/w 240, max_frames 128,
  in_channels = x_embedder.proj.1 columns / 4 - 1, out 16, patch 2 / 1, model_channels = x_embedder rows,
  concat_padding_mask, crossattn_emb_channels 1024 (hard-coded), rope3d, pos_emb_learnable, "crop", fps 1..30,
  use_adaln_lora with adaln_lora_dim 256 (hard-coded), num_heads 16 for 2048 wide (40 for 5120; any other width
  gets the class default 16), in_channels 16 -> extra_per_block_abs_pos_emb False and rope extrapolation (h, w, t)
  (4, 4, 1), extra_* ratios 1, rope_enable_fps_modulation False. supported_models.py:1131-1161 Anima: sampling
  multiplier 1.0, shift 3.0, latent format Wan21; model_base.py:1477-1500 model_base.Anima: ModelType.FLOW (the
  model's timestep is sigma * 1.0 = sigma, model_sampling.py:315-316; denoised = x - out * sigma).
- model_base.py:1481-1500 extra_conds (inference mode): cross_attn = preprocess_text_embeds(cross_attn,
  t5xxl_ids.unsqueeze(0) [1, L], t5xxl_weights.unsqueeze(0).unsqueeze(-1) [1, L, 1]), so the DiT's forward gets
  the adapter's output as context and no t5xxl_ids (anima.py:210-214 would run the adapter itself otherwise).
- anima.py:198-208 preprocess_text_embeds: out = llm_adapter(text_embeds, text_ids); out *= weights (after the
  adapter's final norm); zero rows appended up to 512 when shorter (never cut when longer).
- anima.py:143-190 LLMAdapter: x = in_proj(embed(ids)) (in_proj is Identity when model_dim == target_dim, as
  released: 1024/1024/1024); target positions arange(L), source positions arange(S); blocks; norm(out_proj(x))
  (out_proj Linear with bias, then RMSNorm eps 1e-6). anima.py:90-136 TransformerBlock (layer_norm False):
  x += self_attn(RMSNorm(x)) with RoPE at the target positions on q and k; x += cross_attn(RMSNorm(x), source)
  with RoPE on q at the TARGET positions and on k at the SOURCE positions (:128, :132); x += Linear(bias) ->
  exact GELU (nn.GELU()) -> Linear(bias) of RMSNorm(x); all RMSNorms eps 1e-6 with gains. anima.py:42-84
  Attention: q/k/v/o Linears without bias; q_norm / k_norm = RMSNorm(head_dim, eps 1e-6) per head BEFORE RoPE;
  RoPE (anima.py:7-39) rotate-half: x * cos + cat(-x2, x1) * sin with cos/sin = cat(freqs, freqs), inv_freq =
  1 / 10000^(2i / head_dim) computed in f32 (autocast off); plain SDPA, no mask (masks None from extra_conds).
- predict2.py:853-932 MiniTrainDIT._forward: x [B, C, T, H, W] padded to the patch (common_dit.py:5-13:
  pad_to_patch_size, CIRCULAR) and the output cropped back (:931); a zero padding-mask channel appended as channel
  C (:806-815, padding_mask None); PatchEmbed (:300-309) "b c (t r) (h m) (w n) -> b t h w (c r m n)": per patch
  the features are channel-major (feature = c * 4 + m * 2 + n for r = 1; the mask channel is features 64..67),
  Linear without bias; RoPE table from pos_embedder (:823-824) on the patched grid; timesteps (:879-882):
  Timesteps (:219-238) = [cos, sin] (COS FIRST) of t * exp(-ln(10000) i / (D/2)), i < D/2, D = model_channels,
  computed in f32 of the raw timestep (no factor); TimestepEmbedding (:241-269) with use_adaln_lora: linear_1
  (no bias) -> SiLU -> linear_2 (no bias, D -> 3D) is adaln_lora_B_T_3D, and the embedding passed on is the
  SINUSOID itself, which t_embedding_norm (RMSNorm eps 1e-6 with gain, :737, :882) normalises; the residual
  stream goes to f32 only when it is f16 (:918-919); blocks; final_layer on x.to(context dtype) (:930);
  unpatchify (:829-837) "B T H W (p1 p2 t C) -> B C (T t) (H p1) (W p2)": channels LAST (fastest) in the patch
  vector, then t, then (p1, p2) row-major.
- predict2.py:403-591 Block (use_adaln_lora): for self-attention, cross-attention and MLP each
  (shift, scale, gate) = chunk3(Linear(lora_dim -> 3D)(Linear(D -> lora_dim)(SiLU(t_emb))) + adaln_lora_B_T_3D);
  LayerNorm eps 1e-6 without affine; x_mod = norm(x) * (1 + scale) + shift; x += gate * f(x_mod). FinalLayer
  (:337-400): (shift, scale) = chunk2(Linear(Linear(SiLU(t_emb))) + adaln_lora[..., :2D]) (SHIFT FIRST),
  LayerNorm eps 1e-6 no affine, * (1 + scale) + shift, Linear (no bias) to p*p*t*C_out. GPT2FeedForward (:22-38):
  Linear (no bias) -> exact GELU -> Linear (no bias).
- predict2.py:71-216 Attention: q/k/v Linears without bias, "b ... (h d) -> b ... h d" (heads major in the
  projection's output); self-attention (is_selfattn) with a RoPE table: comfy.quant_ops.ck.rms_rope_split_half(q,
  k, rope, q_norm.weight, k_norm.weight, eps 1e-6) (:184-189); cross-attention: q_norm(q), k_norm(k) only, NO RoPE
  (:190-192, "only apply to self-attention!"); v unnormalised (v_norm Identity); SDPA with scale 1/sqrt(head_dim),
  no mask; output_proj without bias.
- comfy_kitchen 0.2.31 (installed from PyPI at ComfyUI's pin; on CPU its registry picks the eager backend,
  comfy_kitchen/backends/eager/rope.py): rms_rope_split_half = for q and k separately
  x_n = F.rms_norm(x, (head_dim,), weight=scale, eps) in x's dtype (over the whole head), then
  apply_rope_split_half1 in the TABLE's dtype (f32): with m = table[pos, i] (a 2x2 matrix, i < head_dim/2),
  out[i] = m00 * x_n[i] + m01 * x_n[i + D/2], out[i + D/2] = m10 * x_n[i] + m11 * x_n[i + D/2], cast back to x's
  dtype. The table (pos.py:150-163) stores m = [[cos, -sin], [sin, cos]], so it is rotate-half RoPE:
  out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i] sin + x[i + D/2] cos.
- pos.py:57-163 VideoRopePosition3DEmb (head_dim = model_channels / num_heads, predict2.py:755): dim_h = dim_w =
  head_dim // 6 * 2, dim_t = head_dim - 2 dim_h (42/42/44 for the released 128; 20/20/24 for the tiny 64);
  per-axis frequencies 1 / theta_a^(2j / dim_a), j < dim_a / 2, theta_a = 10000 * ratio_a^(dim_a / (dim_a - 2))
  (NTK factor from Python floats; the power and everything after in f32); positions 0..n-1 per axis (t scaled by
  fps only when fps is given and fps modulation is on: never for images); the pair index concatenates the axes in
  the order t, h, w (pos.py:154-161: dim_t/2 pairs of t, then dim_h/2 of h, then dim_w/2 of w); rows in (t h w)
  order, i.e. the patched tokens' order. Returned [(T H W), head_dim/2, 2, 2] in f32; _forward feeds it as
  [1, L, 1, D/2, 2, 2] (:908).

The tiny configs (released values in brackets):
- DiT: MiniTrainDIT / Anima kwargs exactly as detection gives the released file except: model_channels 128 [2048],
  num_blocks 2 [28], num_heads 2 [16] -> head_dim 64 [128], crossattn_emb_channels 64 [1024], adaln_lora_dim 32
  [256]. The brief asked for model_channels 256 with 2 heads of 128; that DiT alone is 2.7 MB in bf16 even with
  ONE block (its t_embedder.1.linear_2 is 256 x 768 and one block is 1.05 M weights), over the folder's 3 MB, so
  the head is 64 here, and the released head's RoPE table (head_dim 128: 42/42/44 and its NTK factors) is
  recorded on its own by ComfyUI's VideoRopePosition3DEmb (`rope128.*` below).
- LLMAdapter: Anima.__init__ builds LLMAdapter() with its defaults (1024 wide, 6 layers, 16 heads, vocabulary
  32128); it is REPLACED after construction by LLMAdapter(source_dim=64, target_dim=64, model_dim=64,
  num_layers=2, num_heads=2 (head_dim 32), use_self_attn=True, layer_norm=False) with the same operations; its
  embedding keeps the real 32128 rows (tiled, below).
- Text encoder: ComfyUI's Qwen3_06B with Qwen3_06BConfig overridden to hidden 64 [1024], intermediate 128 [3072],
  2 layers [28], 2 heads [16] / 1 kv head [8] of head_dim 32 [128]; vocabulary 151936, eps 1e-6, theta 1e6,
  q/k norm "gemma3" (RMSNorm over head_dim, gain as is), no q/k/v bias, final norm, no lm_head as released.
- Embedding tables: the files store only the first 1000 rows of each token table (llm_adapter.embed.weight,
  model.embed_tokens.weight); row r serves every id with id % 1000 == r. Kiln's test must tile the stored table
  to 32128 / 151936 rows, or look up id % 1000: the same thing. ComfyUI's modules get the tiled tables and run
  unchanged on the real ids.

Text encoder path (sd.py:1650-1660 detect_te_model: a Qwen3 file (`model.layers.0.self_attn.q_norm.weight`) of
width 1024 is TEModel.QWEN3_06B, whatever CLIPLoader's type; sd.py:1900-1902 loads it as anima.te() with
AnimaTokenizer). comfy/text_encoders/anima.py:
- :8-11 Qwen3Tokenizer: SDTokenizer on qwen25_tokenizer, no start/end token, no padding to a max length,
  min_length 1 padded with 151643; weights PARSED (disable_weights False): "(red:1.3)" is split out, each
  segment tokenized separately (so "a " gives [64, 220]: a separate space token), parentheses and ":1.3" gone.
  :18-28 AnimaTokenizer then sets every Qwen weight to 1.0 (:26). :13-16 T5XXLTokenizer: T5TokenizerFast, no
  start token, end token 1, weights parsed and kept, min_length 1, no max-length padding.
- :39-41 Qwen3_06BModel: SDClipModel(layer "last", layer_idx None, pad 151643, layer_norm_hidden_state False,
  attention masks enabled AND returned, zero_out_masked False): cond = the final output after model.norm
  (llama.py:927-928; sd1_clip.py:281-282 takes outputs[0] for layer "last").
- :44-52 AnimaTEModel.encode_token_weights: sd1_clip.py:27-76 ClipTokenWeightEncoder (all Qwen weights are 1.0,
  so no empty-sequence interpolation), extra = {"attention_mask": [1, N] (process_tokens' mask), "t5xxl_ids":
  int32 [L], "t5xxl_weights": f32 [L]} (the first T5 section only).
- The empty prompt: Qwen ids [151643] (min_length 1 pads with the pad token); sd1_clip.py:190-200 process_tokens
  marks a pad at index 0 as left padding: mask [[0]]; llama.py:833-843 turns it into an additive finfo.min / 4 on
  that key; with one query and one key the softmax is 1 anyway, so cond [1, 1, 64] is the plain forward of the
  151643 embedding (not zeroed: zero_out_masked is False); extra's attention_mask is [[0]], which model_base.Anima
  ignores. T5 ids [1], weights [1.0].

Writes engine/models/tests/fixtures/anima/:
- dit.safetensors (bf16): Anima.state_dict() names, no prefix (the tiny DiT plus `llm_adapter.*`), EXCEPT
  llm_adapter.embed.weight [1000, 64] (the first 1000 of 32128 rows). Weights N(0, 1) / sqrt(fan_in), embedding
  N / sqrt(width), biases 0.1 N, RMSNorm gains 1 + 0.1 N (the LayerNorms have no parameters).
- dit_io.safetensors (f32):
  adapter cases e in (adapter_a, adapter_b): `{e}.source` [1, S, 64], `{e}.ids` [1, L] (real T5 ids as f32),
  `{e}.weights` [1, L, 1], `{e}.out` [1, 512, 64] = Anima.preprocess_text_embeds(source, ids (int64),
  weights): adapter_a: S 9, the T5 ids and weights AnimaTokenizer gives "a (red:1.3) cube, (blue:0.8)" (L 8,
  ids 1131 and 1692 above 1000, weights 1.3 and 0.8); adapter_b: S 3, ids [3, 9, 1712, 31999, 1], weights 1.
  DiT cases c in (a, b, c): `{c}.x` [B, 16, 1, H, W], `{c}.t` [B] (sigma: what the model gets), `{c}.context`
  [B, N, 64], `{c}.out` [B, 16, 1, H, W] = Anima.forward(x, t, context) (no t5xxl_ids: context used as is):
  a: x [1,16,1,8,8], t [0.75], context = adapter_a.out [1, 512, 64] (the adapter's real output, 504 zero rows);
  b: x [2,16,1,6,10], t [1.0, 0.2], context randn [2, 20, 64]; c: x [1,16,1,5,7] (padded circularly to 6 x 8,
  output cropped), t [0.5], context randn [1, 7, 64].
  Intermediates for case a: `a.rope` [16, 32, 2, 2] (pos_embedder's table for the 1 x 4 x 4 grid), `a.t_emb`
  [1, 1, 128] (t_embedding_norm(sinusoid), what the blocks get), `a.adaln_lora` [1, 1, 384].
  `rope128.table` [T H W, 64, 2, 2]: VideoRopePosition3DEmb at the released head_dim 128 (ratios 4, 4, 1) for a
  T 2 x H 3 x W 5 grid (fps None), to pin the released 42/42/44 split.
- dit_cases.json: the kwargs, the adapter config, per case shapes and t, ComfyUI's detection of dit.safetensors.
- te.safetensors (bf16), the released Qwen3 file's names: model.embed_tokens.weight [1000, 64],
  model.layers.N.self_attn.{q_proj [64, 64], k_proj [32, 64], v_proj [32, 64], o_proj [64, 64]}.weight,
  model.layers.N.self_attn.{q_norm, k_norm}.weight [32], model.layers.N.mlp.{gate_proj, up_proj [128, 64],
  down_proj [64, 128]}.weight, model.layers.N.{input_layernorm, post_attention_layernorm}.weight [64],
  model.norm.weight [64].
- te_io.safetensors (f32), per prompt case e (cat, weighted, empty): `{e}.cond` [1, N, 64] =
  AnimaTEModel.encode_token_weights(AnimaTokenizer().tokenize_with_weights(prompt))[0], `{e}.attention_mask`
  [1, N], `{e}.t5xxl_ids` [L] (as f32), `{e}.t5xxl_weights` [L].
- te_cases.json: per case the prompt, `qwen3_06b` (ids; weights all 1.0), `t5xxl` ({"ids", "weights"}),
  `had_attention_mask`, the mask, shapes; the config and the embedding rule.

Checks: the loaded ComfyUI modules hold exactly the written values (the token tables tiled); Anima.forward with
t5xxl_ids / t5xxl_weights equals forward on preprocess_text_embeds' output; ComfyUI's own model_base.Anima (built by
supported_models.Anima.get_model, its adapter replaced the same way, weights loaded through load_model_weights)
gives, under inference mode, extra_conds' c_crossattn == adapter_a.out and apply_model's denoised ==
x - out * sigma. Cross-checks (max |diff| / max |ref|, printed at the end):
- the LLMAdapter against an independent torch implementation written below from the math (stored 1000-row table
  looked up at id % 1000);
- the DiT against diffusers 0.42.1 CosmosTransformer3DModel (transformers/transformer_cosmos.py) with
  num_attention_heads 2, attention_head_dim 64, text_embed_dim 64, adaln_lora_dim 32, rope_scale (1, 4, 4),
  concat_padding_mask True (a zero padding mask), extra_pos_embed_type None; names mapped as diffusers'
  single_file_utils.convert_cosmos_transformer_checkpoint_to_diffusers maps Cosmos 2.0; the q/k RMSNorm eps set
  to ComfyUI's 1e-6 (diffusers' Attention builds them with its default 1e-5); odd sizes padded circularly and
  cropped as ComfyUI does. rope128.table against diffusers' CosmosRotaryPosEmbed(128, rope_scale (1, 4, 4)).
- the encoder against transformers' Qwen3Model (vocab 1000 fed id % 1000, positions 0..N-1, eager):
  last_hidden_state (after the final norm: ComfyUI's layer "last") vs cond.
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

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/anima")
SEED = 1477
BUDGET = 3_000_000

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
PAD_TO = 512
# name: (batch, h, w, context tokens, sigmas); case a's context is adapter_a.out
DIT_CASES = {"a": (1, 8, 8, None, [0.75]), "b": (2, 6, 10, 20, [1.0, 0.2]), "c": (1, 5, 7, 7, [0.5])}
ROPE128_GRID = (2, 3, 5)

ROWS = 1000  # stored rows of each token table; row r serves every id with id % ROWS == r
T5_VOCAB = 32128
QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
QWEN_HEAD_DIM = 32
QWEN_VOCAB = 151936
QWEN_PAD = 151643
PROMPTS = {"cat": "a photo of a cat", "weighted": "a (red:1.3) cube, (blue:0.8)", "empty": ""}
ADAPTER_B_IDS = [3, 9, 1712, 31999, 1]


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_module(draw, module, norms):
    """Every state_dict entry re-drawn and rounded to bf16: gains of the named norm modules 1 + 0.1 N, biases
    0.1 N, embeddings and weights N / sqrt(fan_in) (embedding tables: / sqrt(width))."""
    out = {}
    for name, p in module.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner in norms and name.endswith(".weight"):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
        out[name] = v.to(torch.bfloat16).contiguous()
    return out


def norm_names(module):
    return {n for n, m in module.named_modules()
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(m).__name__ == "RMSNorm"}


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


# ----------------------------------------------------------------------------------------------------- the DiT


def tiny_adapter(ops):
    from comfy.ldm.anima.model import LLMAdapter

    return LLMAdapter(**ADAPTER, operations=ops)


def build_dit(ops):
    """ComfyUI's Anima with the tiny kwargs; its default (1024-wide) LLMAdapter replaced by the tiny one."""
    from comfy.ldm.anima.model import Anima

    model = Anima(**DIT, operations=ops)
    assert model.llm_adapter.embed.weight.shape == (T5_VOCAB, 1024) and len(model.llm_adapter.blocks) == 6
    model.llm_adapter = tiny_adapter(ops)
    return model.eval()


def full_dit_weights(stored):
    """The stored file as the module's state dict: the adapter's token table tiled to 32128 rows."""
    sd = f32(stored)
    sd["llm_adapter.embed.weight"] = tile(sd["llm_adapter.embed.weight"], T5_VOCAB)
    return sd


def dit_call(model, x, t, context, **kwargs):
    return model(x, t, context, transformer_options={}, **kwargs)


def dit_fixture():
    import comfy.model_detection
    import comfy.ops
    import comfy.supported_models
    from comfy.ldm.cosmos.position_embedding import VideoRopePosition3DEmb

    ops = comfy.ops.manual_cast
    model = build_dit(ops)
    draw = Draw(SEED)
    weights = draw_module(draw, model, norm_names(model))
    weights["llm_adapter.embed.weight"] = weights["llm_adapter.embed.weight"][:ROWS].clone()
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    full = full_dit_weights(weights)
    model.load_state_dict(full, strict=True)
    check_loaded(model, full)
    blk = model.blocks[0]
    assert (blk.self_attn.n_heads, blk.self_attn.head_dim, blk.self_attn.q_norm.eps) == (2, HEAD_DIM, 1e-6)
    assert blk.self_attn.is_selfattn and not blk.cross_attn.is_selfattn
    assert model.llm_adapter.blocks[0].self_attn.head_dim == 32 and isinstance(model.llm_adapter.in_proj,
                                                                                torch.nn.Identity)
    pe = model.pos_embedder
    assert (pe.h_ntk_factor, pe.w_ntk_factor, pe.t_ntk_factor) == (4.0 ** (20 / 18), 4.0 ** (20 / 18), 1.0)

    detected = comfy.model_detection.detect_unet_config(weights, "")
    picked = comfy.model_detection.model_config_from_unet(weights, "")
    print(f"detect_unet_config: {detected}; model config {type(picked).__name__}")
    assert detected["image_model"] == "anima" and type(picked).__name__ == "Anima"

    import comfy.text_encoders.anima as anima_te

    tokens = anima_te.AnimaTokenizer().tokenize_with_weights(PROMPTS["weighted"])["t5xxl"][0]
    adapter_cases = {
        "adapter_a": (9, [int(t[0]) for t in tokens], [float(t[1]) for t in tokens]),
        "adapter_b": (3, ADAPTER_B_IDS, [1.0] * len(ADAPTER_B_IDS)),
    }
    assert adapter_cases["adapter_a"][1][-1] == 1 and sum(i > ROWS for i in adapter_cases["adapter_a"][1]) >= 2
    assert 1.3 in adapter_cases["adapter_a"][2] and 0.8 in adapter_cases["adapter_a"][2]

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (s, ids, w) in adapter_cases.items():
            source = torch.randn(1, s, ADAPTER["source_dim"], generator=g)
            ids_t = torch.tensor([ids])
            w_t = torch.tensor(w).view(1, -1, 1)
            out = model.preprocess_text_embeds(source, ids_t, t5xxl_weights=w_t)
            assert out.shape == (1, PAD_TO, 64) and torch.all(out[:, len(ids):] == 0)
            io.update({f"{name}.source": source, f"{name}.ids": ids_t.float(), f"{name}.weights": w_t,
                       f"{name}.out": out})
            cases[name] = {"source": list(source.shape), "ids": ids, "weights": w, "out": list(out.shape)}
            print(f"adapter case {name}: source {tuple(source.shape)}, ids {ids}, weights {w}, "
                  f"max |out| {out.abs().max():.3f}")

        for name, (b, h, w, n, sigmas) in DIT_CASES.items():
            x = torch.randn(b, 16, 1, h, w, generator=g)
            context = io["adapter_a.out"].clone() if n is None else torch.randn(b, n, 64, generator=g)
            t = torch.tensor(sigmas)
            out = dit_call(model, x, t, context)
            assert out.shape == x.shape and torch.isfinite(out).all()
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.out": out})
            cases[name] = {"x": list(x.shape), "t": sigmas, "context": list(context.shape), "out": list(out.shape)}
            print(f"DiT case {name}: x {tuple(x.shape)}, t {sigmas}, context {tuple(context.shape)}, "
                  f"out std {out.std():.3f}, max |out| {out.abs().max():.3f}")
        cases["a"]["context_is"] = "adapter_a.out"

        # Anima.forward running the adapter itself (t5xxl_ids given) is the same computation.
        src, ids, w = io["adapter_a.source"], io["adapter_a.ids"].long(), io["adapter_a.weights"]
        via = dit_call(model, io["a.x"], io["a.t"], src, t5xxl_ids=ids, t5xxl_weights=w)
        assert torch.equal(via, io["a.out"])

        # Intermediates for case a (MiniTrainDIT._forward's own steps, predict2.py:862-882).
        xp = io["a.x"]
        x_emb, rope, _ = model.prepare_embedded_sequence(xp, fps=None, padding_mask=None)
        t_emb, adaln_lora = model.t_embedder[1](model.t_embedder[0](io["a.t"].unsqueeze(1)))
        io["a.rope"] = rope
        io["a.t_emb"] = model.t_embedding_norm(t_emb)
        io["a.adaln_lora"] = adaln_lora
        assert rope.shape == (16, HEAD_DIM // 2, 2, 2) and rope.dtype == torch.float32
        assert io["a.t_emb"].shape == (1, 1, 128) and adaln_lora.shape == (1, 1, 384)
        # t_emb is the normalised sinusoid [cos, sin] (use_adaln_lora passes the sinusoid through).
        half = 64
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half) * 0.75
        assert torch.equal(t_emb[0, 0], torch.cat([freqs.cos(), freqs.sin()]))
        # The padding-mask channel: feature columns 64..67 of x_embedder see zeros; the patch order.
        manual = torch.cat([xp, torch.zeros_like(xp[:, :1])], 1)  # [B, 17, 1, 8, 8]
        patches = manual.reshape(1, 17, 1, 1, 4, 2, 4, 2).permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(1, 1, 4, 4, 68)
        err = rel_err(patches @ f32(weights)["x_embedder.proj.1.weight"].T, x_emb)
        assert err < 1e-6, err
        cases["a"]["intermediates"] = {
            "a.rope": "pos_embedder table [(t h w), head_dim/2, 2, 2], m = [[cos, -sin], [sin, cos]], pairs t|h|w",
            "a.t_emb": "t_embedding_norm(sinusoid [cos, sin]): what the blocks and final layer get",
            "a.adaln_lora": "t_embedder.1 linear_2(silu(linear_1(sinusoid)))"}

        # The released head's table.
        t_, h_, w_ = ROPE128_GRID
        rope128 = VideoRopePosition3DEmb(head_dim=128, len_h=120, len_w=120, len_t=128, h_extrapolation_ratio=4.0,
                                         w_extrapolation_ratio=4.0, t_extrapolation_ratio=1.0,
                                         enable_fps_modulation=False)
        assert rope128.h_ntk_factor == 4.0 ** (42 / 40) and rope128.t_ntk_factor == 1.0
        io["rope128.table"] = rope128(torch.zeros(1, t_, h_, w_, 1), fps=None)
        assert io["rope128.table"].shape == (t_ * h_ * w_, 64, 2, 2)

        check_rms_rope_split_half()
        comfy_model_base_check(weights, io)
        adapter_cross_check(weights, io, adapter_cases)
        dit_cross_check(weights, io)

    for k, v in io.items():
        print(f"  {k:20} {str(tuple(v.shape)):20} max |v| {float(v.abs().max()):.3f}")
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({
            "seed": SEED, "anima_kwargs": DIT, "head_dim": HEAD_DIM,
            "llm_adapter": {**ADAPTER, "head_dim": ADAPTER["model_dim"] // ADAPTER["num_heads"], "vocab": T5_VOCAB,
                            "rope_theta": 10000, "eps": 1e-6, "pad_to": PAD_TO},
            "embedding_rule": f"llm_adapter.embed.weight stores {ROWS} of {T5_VOCAB} rows; id i uses row i % {ROWS}",
            "t_is": "sigma (supported_models.Anima multiplier 1.0)",
            "storage": "every tensor bf16; computed in f32 from the stored values",
            "rope128": {"grid_t_h_w": list(ROPE128_GRID), "head_dim": 128, "ratios_h_w_t": [4.0, 4.0, 1.0],
                        "split_t_h_w": [44, 42, 42]},
            "cases": cases,
            "comfy_detection": {"detect_unet_config": detected, "model_config": type(picked).__name__,
                                "note": "detection hard-codes crossattn_emb_channels 1024 and adaln_lora_dim 256 "
                                        "and gives 16 heads to any width but 2048 / 5120, so ComfyUI cannot load "
                                        "this tiny file by detection; the fixture builds Anima directly"},
        }, f, indent=1)
        f.write("\n")


def check_rms_rope_split_half():
    """The kitchen op ComfyUI calls, against the split-half rule written out (see the docstring)."""
    import comfy.quant_ops

    g = torch.Generator().manual_seed(SEED + 5)
    q, k = torch.randn(2, 6, 2, 64, generator=g), torch.randn(2, 6, 2, 64, generator=g)
    sq, sk = 1 + 0.1 * torch.randn(64, generator=g), 1 + 0.1 * torch.randn(64, generator=g)
    table = torch.randn(6, 32, 2, 2, generator=g)
    got_q, got_k = comfy.quant_ops.ck.rms_rope_split_half(q, k, table.unsqueeze(1).unsqueeze(0), sq, sk, 1e-6)

    def manual(x, s):
        xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * s
        a, b = xn[..., :32], xn[..., 32:]
        m = table[None, :, None]
        return torch.cat([m[..., 0, 0] * a + m[..., 0, 1] * b, m[..., 1, 0] * a + m[..., 1, 1] * b], -1)

    err = max(rel_err(got_q, manual(q, sq)), rel_err(got_k, manual(k, sk)))
    print(f"ck.rms_rope_split_half vs out[i] = m00 x[i] + m01 x[i+D/2], out[i+D/2] = m10 x[i] + m11 x[i+D/2]: "
          f"{err:.2e}")
    assert err < 1e-6


def comfy_model_base_check(weights, io):
    """ComfyUI's own model object: supported_models.Anima -> model_base.Anima, loaded by load_model_weights."""
    import comfy.ops
    import comfy.supported_models

    config = comfy.supported_models.Anima({k: v for k, v in DIT.items()})
    config.set_inference_dtype(torch.float32, None)
    based = config.get_model({})
    assert type(based).__name__ == "Anima" and float(based.model_sampling.timestep(torch.tensor(0.75))) == 0.75
    based.diffusion_model.llm_adapter = tiny_adapter(comfy.ops.disable_weight_init)
    based.load_model_weights(full_dit_weights(weights), "")
    check_loaded(based.diffusion_model, full_dit_weights(weights))
    with torch.inference_mode():
        conds = based.extra_conds(cross_attn=io["adapter_a.source"], t5xxl_ids=io["adapter_a.ids"][0].int(),
                                  t5xxl_weights=io["adapter_a.weights"][0, :, 0], device="cpu")
        c = conds["c_crossattn"].cond
        assert torch.equal(c, io["adapter_a.out"]), rel_err(c, io["adapter_a.out"])
        for name in DIT_CASES:
            x, sigma = io[f"{name}.x"], io[f"{name}.t"]
            denoised = based.apply_model(x, sigma, c_crossattn=io[f"{name}.context"])
            err = rel_err(denoised, x - io[f"{name}.out"] * sigma.view(-1, 1, 1, 1, 1))
            print(f"model_base.Anima.apply_model, case {name}: denoised vs x - out * sigma {err:.2e}")
            assert err < 1e-6
    print("model_base.Anima.extra_conds: c_crossattn == adapter_a.out (bitwise)")


# ---------------------------------------------------------------------- independent LLMAdapter (from the math)


def adapter_reference(sd, source, ids, weights):
    """The LLMAdapter restated: token table at id % ROWS, RMSNorm eps 1e-6, rotate-half RoPE (theta 10000, f32),
    q/k RMSNorm before RoPE, cross-attention RoPE q at target / k at source positions, exact GELU MLP, out_proj
    then norm, weights multiplied after, zero rows up to 512."""
    p = "llm_adapter."
    heads, hd = ADAPTER["num_heads"], ADAPTER["model_dim"] // ADAPTER["num_heads"]

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rope(n):
        inv = 1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None]
        ang = torch.cat([ang, ang], -1)
        return ang.cos(), ang.sin()

    def rotate(x, cs):
        cos, sin = cs
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def attn(pre, x, ctx, cs_q, cs_k):
        b, n, _ = x.shape
        m = ctx.shape[1]
        q = (x @ sd[pre + "q_proj.weight"].T).view(b, n, heads, hd).transpose(1, 2)
        k = (ctx @ sd[pre + "k_proj.weight"].T).view(b, m, heads, hd).transpose(1, 2)
        v = (ctx @ sd[pre + "v_proj.weight"].T).view(b, m, heads, hd).transpose(1, 2)
        q = rotate(rms(q, sd[pre + "q_norm.weight"]), cs_q)
        k = rotate(rms(k, sd[pre + "k_norm.weight"]), cs_k)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
        return a.transpose(1, 2).reshape(b, n, heads * hd) @ sd[pre + "o_proj.weight"].T

    x = sd[p + "embed.weight"][ids % ROWS]
    cs_t, cs_s = rope(x.shape[1]), rope(source.shape[1])
    for i in range(ADAPTER["num_layers"]):
        bp = f"{p}blocks.{i}."
        h = rms(x, sd[bp + "norm_self_attn.weight"])
        x = x + attn(bp + "self_attn.", h, h, cs_t, cs_t)
        h = rms(x, sd[bp + "norm_cross_attn.weight"])
        x = x + attn(bp + "cross_attn.", h, source, cs_t, cs_s)
        h = rms(x, sd[bp + "norm_mlp.weight"])
        h = torch.nn.functional.gelu(h @ sd[bp + "mlp.0.weight"].T + sd[bp + "mlp.0.bias"])
        x = x + h @ sd[bp + "mlp.2.weight"].T + sd[bp + "mlp.2.bias"]
    out = rms(x @ sd[p + "out_proj.weight"].T + sd[p + "out_proj.bias"], sd[p + "norm.weight"]) * weights
    return torch.nn.functional.pad(out, (0, 0, 0, PAD_TO - out.shape[1]))


def adapter_cross_check(weights, io, adapter_cases):
    sd = f32(weights)
    assert sd["llm_adapter.embed.weight"].shape == (ROWS, 64)
    for name in adapter_cases:
        ref = adapter_reference(sd, io[f"{name}.source"], io[f"{name}.ids"].long(), io[f"{name}.weights"])
        report(f"independent LLMAdapter vs ComfyUI, {name}", rel_err(ref, io[f"{name}.out"]), 1e-5)


# ------------------------------------------------------------------------------------------ diffusers' Cosmos


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


def dit_cross_check(weights, io):
    from diffusers import CosmosTransformer3DModel
    from diffusers.models.transformers.transformer_cosmos import CosmosRotaryPosEmbed

    net = CosmosTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=DIT["num_heads"], attention_head_dim=HEAD_DIM,
        num_layers=DIT["num_blocks"], mlp_ratio=DIT["mlp_ratio"], text_embed_dim=DIT["crossattn_emb_channels"],
        adaln_lora_dim=DIT["adaln_lora_dim"], max_size=(128, 240, 240), patch_size=(1, 2, 2),
        rope_scale=(1.0, 4.0, 4.0), concat_padding_mask=True, extra_pos_embed_type=None).eval()
    result = net.load_state_dict(to_diffusers_cosmos(f32(weights)), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    qk = [m for name, m in net.named_modules() if name.endswith(("norm_q", "norm_k"))]
    assert len(qk) == 4 * DIT["num_blocks"] and all(m.eps == 1e-5 for m in qk)

    def run(name):
        x = io[f"{name}.x"]
        b, c, t, h, w = x.shape
        padded = torch.nn.functional.pad(x, (0, -w % 2, 0, -h % 2, 0, 0), mode="circular")
        mask = torch.zeros(1, 1, padded.shape[-2], padded.shape[-1])
        out = net(padded, io[f"{name}.t"], io[f"{name}.context"], padding_mask=mask, return_dict=False)[0]
        return out[..., :h, :w]

    stock = {name: rel_err(run(name), io[f"{name}.out"]) for name in DIT_CASES}
    for m in qk:
        m.eps = 1e-6  # ComfyUI's q_norm / k_norm eps (predict2.py:130, :133)
    for name in DIT_CASES:
        report(f"diffusers CosmosTransformer3DModel (q/k norm eps 1e-6) vs ComfyUI, DiT case {name}",
               rel_err(run(name), io[f"{name}.out"]), 1e-5)
    print(f"  (diffusers with its own q/k eps 1e-5: {', '.join(f'{k} {v:.2e}' for k, v in stock.items())})")

    t_, h_, w_ = ROPE128_GRID
    cos, sin = CosmosRotaryPosEmbed(hidden_size=128, rope_scale=(1.0, 4.0, 4.0))(torch.zeros(1, 1, t_, 2 * h_, 2 * w_))
    table = io["rope128.table"]
    want = torch.stack([cos[:, :64], -sin[:, :64], sin[:, :64], cos[:, :64]], -1).view_as(table)
    assert torch.equal(cos[:, :64], cos[:, 64:]) and torch.equal(sin[:, :64], sin[:, 64:])
    report("diffusers CosmosRotaryPosEmbed(128, rope_scale (1, 4, 4)) vs ComfyUI rope128.table",
           rel_err(table, want), 1e-6)


# ------------------------------------------------------------------------------------------- the text encoder


def tiny_te():
    """anima.te()'s model (sd.py:1901's) with the tiny Qwen3 config (llama.Qwen3_06B builds
    Qwen3_06BConfig(**config_dict) from the module's global; head_dim is a class attribute, so a subclass sets
    it)."""
    import comfy.text_encoders.anima as anima_te
    import comfy.text_encoders.llama as llama

    real = llama.Qwen3_06BConfig
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in QWEN.items()]
    tiny = dataclasses.make_dataclass("TinyQwen3_06BConfig", fields, bases=(real,),
                                      namespace={"head_dim": QWEN_HEAD_DIM})
    llama.Qwen3_06BConfig = tiny
    try:
        te = anima_te.te()(device="cpu", dtype=torch.float32)
    finally:
        llama.Qwen3_06BConfig = real
    cfg = te.qwen3_06b.transformer.model.config
    assert (cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta, cfg.vocab_size, cfg.qkv_bias, cfg.q_norm, cfg.k_norm,
            cfg.rms_norm_add, cfg.final_norm, cfg.lm_head, cfg.rope_scale) == \
        (QWEN_HEAD_DIM, 1e-6, 1e6, QWEN_VOCAB, False, "gemma3", "gemma3", False, True, False, None)
    q = te.qwen3_06b
    assert (q.layer, q.layer_idx, q.layer_norm_hidden_state, q.enable_attention_masks, q.return_attention_masks,
            q.zero_out_masked, q.special_tokens) == ("last", None, False, True, True, False, {"pad": QWEN_PAD})
    return te


def te_fixture():
    import comfy.text_encoders.anima as anima_te

    te = tiny_te()
    inner = te.qwen3_06b.transformer
    draw = Draw(SEED + 2)
    weights = draw_module(draw, inner, norm_names(inner))
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:ROWS].clone()
    assert all(k.startswith("model.") for k in weights), list(weights)[:3]
    save_file(weights, f"{OUT}/te.safetensors")
    weights = load_file(f"{OUT}/te.safetensors")
    full = f32(weights)
    full["model.embed_tokens.weight"] = tile(full["model.embed_tokens.weight"], QWEN_VOCAB)
    missing, unexpected = te.load_sd(dict(full))
    assert not missing and not unexpected, (missing, unexpected)
    check_loaded(inner, full)
    te.eval()

    tokenizer = anima_te.AnimaTokenizer()
    io, cases = {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = tokenizer.tokenize_with_weights(prompt)
            assert set(tokens) == {"qwen3_06b", "t5xxl"} and len(tokens["qwen3_06b"]) == 1
            assert len(tokens["t5xxl"]) == 1
            ids = [int(t[0]) for t in tokens["qwen3_06b"][0]]
            assert all(t[1] == 1.0 for t in tokens["qwen3_06b"][0])
            t5_ids = [int(t[0]) for t in tokens["t5xxl"][0]]
            t5_w = [float(t[1]) for t in tokens["t5xxl"][0]]
            cond, pooled, extra = te.encode_token_weights(tokens)
            assert pooled is None and set(extra) == {"attention_mask", "t5xxl_ids", "t5xxl_weights"}, extra.keys()
            assert extra["t5xxl_ids"].dtype == torch.int32 and extra["t5xxl_ids"].tolist() == t5_ids
            assert extra["t5xxl_weights"].dtype == torch.float32
            assert torch.allclose(extra["t5xxl_weights"], torch.tensor(t5_w))
            mask = extra["attention_mask"]
            assert cond.shape == (1, len(ids), 64) and mask.shape == (1, len(ids))
            io[f"{name}.cond"] = cond
            io[f"{name}.attention_mask"] = mask.float()
            io[f"{name}.t5xxl_ids"] = extra["t5xxl_ids"].float()
            io[f"{name}.t5xxl_weights"] = extra["t5xxl_weights"]
            cases[name] = {"prompt": prompt, "qwen3_06b": ids, "t5xxl": {"ids": t5_ids, "weights": t5_w},
                           "had_attention_mask": True, "attention_mask": mask[0].tolist(),
                           "cond_shape": list(cond.shape)}
            print(f"encoder {name}: Qwen ids {ids}, mask {mask[0].tolist()}, T5 ids {t5_ids}, weights {t5_w}, "
                  f"cond {tuple(cond.shape)}")
        assert cases["empty"]["qwen3_06b"] == [QWEN_PAD] and cases["empty"]["attention_mask"] == [0]
        assert cases["empty"]["t5xxl"] == {"ids": [1], "weights": [1.0]}
        assert all(all(cases[n]["attention_mask"]) for n in ("cat", "weighted"))
        # The empty prompt's masked single token: the same as the unmasked forward (one key, softmax 1).
        plain = inner(torch.tensor([[QWEN_PAD]]), None, dtype=torch.float32)[0]
        assert rel_err(io["empty.cond"], plain) < 1e-6
        te_cross_check(weights, cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "embedding_rows": ROWS,
            "embedding_rule": f"te.safetensors stores {ROWS} of {QWEN_VOCAB} token-table rows; id i uses row "
                              f"i % {ROWS}; the real ids are used everywhere else",
            "qwen_config": {**QWEN, "head_dim": QWEN_HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                            "qk_norm": "RMSNorm(head_dim), gain as is", "qkv_bias": False,
                            "vocab_size": QWEN_VOCAB, "layer": "last", "final_norm_applied": True},
            "pad": QWEN_PAD,
            "tokenizer": "Qwen: weights parsed, segments tokenized separately, then every weight set to 1.0; no "
                         "start/end; min_length 1 padded with 151643. T5: weights kept, end token 1, no start, "
                         "min_length 1.",
            "empty_prompt": "Qwen ids [151643] with mask [0] (a leading pad is left padding); cond is the plain "
                            "forward of that one token (one key: softmax 1); T5 ids [1], weights [1.0]",
            "cases": cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")


def te_cross_check(weights, cases, io):
    """transformers' Qwen3Model on the stored 1000-row table (ids % 1000), no mask (the prompts' masks are all
    ones; the empty prompt's single masked key changes nothing)."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(vocab_size=ROWS, **QWEN, head_dim=QWEN_HEAD_DIM, rms_norm_eps=1e-6,
                         max_position_embeddings=4096, attention_bias=False,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, attn_implementation="eager")
    net = Qwen3Model(config).eval()
    assert net.rotary_emb.inv_freq[1] == 1e6 ** (-2 / QWEN_HEAD_DIM)
    net.load_state_dict({k[len("model."):]: v for k, v in f32(weights).items()}, strict=True)
    for name, case in cases.items():
        ids = torch.tensor([case["qwen3_06b"]]) % ROWS
        h = net(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None]).last_hidden_state
        report(f"transformers Qwen3Model last_hidden_state vs ComfyUI cond, case {name}",
               rel_err(h, io[f"{name}.cond"]), 1e-5)


def main():
    import_comfyui()
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    dit_fixture()
    te_fixture()
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
