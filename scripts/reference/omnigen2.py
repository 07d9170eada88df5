"""Fixtures for OmniGen2 (engine/models/tests/fixtures/omnigen2/): its DiT (ComfyUI's OmniGen2Transformer2DModel,
comfy/ldm/omnigen/omnigen2.py) and its text encoder (Qwen2.5-VL 3B's language model as ComfyUI's
comfy/text_encoders/omnigen2.py builds it, with ComfyUI's Qwen tokenizer and the OmniGen2 chat template), each a
tiny random network built by ComfyUI's own classes, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; the reference
venv of scripts/reference/setup.sh, with comfy-kitchen; comfy.sd imports torchaudio, for which comfyui.py puts
an empty stand-in on the path when it is missing; OMNIGEN2_DIR is optional: a checkout of
VectorSpaceLab/OmniGen2 (0f72fa92, the original diffusers-based code ComfyUI ported) for the DiT cross-check):
    COMFYUI_DIR=/path/to/ComfyUI [OMNIGEN2_DIR=/path/to/OmniGen2] $(scripts/reference/setup.sh) \\
        scripts/reference/omnigen2.py
It takes about 15 s on the CPU and is reproducible: a second run writes byte-identical files (every random value
comes from seeded torch generators; nothing is written from the cross-checks).

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; og2.py is comfy/ldm/omnigen/omnigen2.py):
- Detection, model_detection.py:879-897: the key `time_caption_embed.timestep_embedder.linear_1.bias` alone ->
  image_model "omnigen2" with the released config HARD-CODED, nothing read from the shapes: hidden_size 2520,
  num_layers 32, num_refiner_layers 2, num_attention_heads 21, num_kv_heads 7 (head 120), axes_dim_rope
  [40, 40, 40], axes_lens [1024, 1664, 1664], ffn_dim_multiplier None, multiple_of 256, norm_eps 1e-5,
  text_feat_dim 2048, in_channels 16, patch 2, timestep_scale 1000.0 (NOT the class default 1.0, og2.py:286).
  The tiny file is detected as omnigen2 with those widths (recorded in dit_cases.json `comfy_detection`), which
  cannot load it, so the fixtures build the class directly with the tiny widths and the released constants.
  (Boogu's key is tested first, :869.) supported_models.py:1809-1841 Omnigen2: sampling multiplier 1.0, shift 2.6,
  latent format Flux (latent_formats.py:160-164: scale 0.3611, shift 0.1159), inference dtypes bf16 / f32 (+ fp16
  where extended fp16 is supported).
- model_base.py:2353-2378 Omnigen2: ModelType.FLOW; extra_conds: `attention_mask` passed on only when it holds a
  zero, num_tokens = CONDConstant(max(1, sum(mask))) (else absent: the DiT's num_tokens then comes from nowhere,
  so a cond without a mask cannot run: ComfyUI's CLIPTextEncode always attaches one here). A mask WITH zeros
  (never produced by ComfyUI's encoder for one prompt) reaches og2.py as an additive 0/1 float mask on the context
  refiner and num_tokens < L, and forward then fails (the joint RoPE table is num_tokens + images long, the
  sequence L + images: checked, `mask_with_zeros` in dit_cases.json); the text states as
  CONDRegular (conds of different lengths never share a batch); `reference_latents` (the ReferenceLatent node's
  raw VAE latents, a list) -> `ref_latents` = CONDList([process_latent_in(lat) ...]) = (lat - 0.1159) * 0.3611;
  CONDList.process_cond (conds.py:121-126) repeats each to the batch (repeat_to_batch_size), so the DiT gets every
  reference with the batch's size. model_base.py:210-252 _apply_model: timestep = model_sampling.timestep(sigma) =
  sigma * 1.0 (model_sampling.py:315-316), CONST (:86-101) input x unscaled, denoised = x - out * sigma.
  ModelSamplingDiscreteFlow (:284-326): sigma(t) = 2.6 t / (1 + 1.6 t) (time_snr_shift :279-282); sigmas =
  sigma(i / 1000), i = 1..1000.
- og2.py:414-466 forward(x, timesteps, context, num_tokens, ref_latents, attention_mask): x padded to the patch
  (:416, common_dit.py:5-13, CIRCULAR); t = 1.0 - timesteps (:418: the network sees 1 - sigma); temb =
  timestep_embedder(Timesteps(256, flip_sin_to_cos, shift 0, scale 1000)(t)) (:85-99; lightricks/model.py:52-101:
  freqs exp(-ln(10000) i / 128), emb = 1000 * t * freq, [cos, sin]); TimestepEmbedding Linear(256 -> min(hidden,
  1024)), SiLU, Linear (:28-39); caption_embedder = RMSNorm(text_feat_dim, eps norm_eps, gain), Linear with bias
  (:90-93). Patches (:354-387): rearrange 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' (feature = (ph * 2 + pw) * C +
  c, channel fastest); references padded to the patch circularly too (:362), patchified alike and CONCATENATED along
  the sequence; ref_img_sizes is the same list for every sample (:363).
- RoPE positions (:197-266): caption token i -> (i, i, i) for i < num_tokens (ALL THREE axes, 0-based; Lumina 2's
  NextDiT uses (i + 1, 0, 0)); reference j -> (L + sum_{k<j} max(h_k, w_k), row, col) in patch units (each
  reference's rows / cols from 0; the t offset advances by the LARGER side of each reference, :234); the image
  -> (L + sum_k max(h_k, w_k), row, col). L here is num_tokens, the caption positions' count; the joint sequence is
  [caption, references..., image] (:410, :455). EmbedND (flux/layers.py:12-26) concatenates the axes t, h, w
  (pairs 0..1 t, 2..4 h, 5..7 w for axes (4, 6, 6)); flux/math.py:17-29: omega_i = 1 / 10000^(2i / d_axis)
  (f64), matrix [[cos, -sin], [sin, cos]]; applied to INTERLEAVED pairs (x[2i], x[2i + 1]) of [B, L, heads, head]
  (og2.py:17-21, :136-138; comfy_kitchen apply_rope1), before the heads are moved.
- og2.py:102-147 Attention: to_q / to_k / to_v / to_out.0 Linears WITHOUT bias; norm_q / norm_k = RMSNorm(head, eps
  1e-5, gain) per head; RoPE; SDPA with enable_gqa (q head i uses kv head i // n_rep), scale 1/sqrt(head), mask
  None (the joint layers always get None, :456; the context refiner the text mask, the image / reference refiners
  None: og2.py:384 returns img_mask = ref_img_mask = None).
- og2.py:150-194 OmniGen2TransformerBlock: modulated (noise_refiner, ref_image_refiner, layers): norm1 =
  LuminaRMSNormZero (:42-53: Linear(min(dim, 1024) -> 4 dim, bias)(SiLU(temb)) chunked scale_msa, gate_msa,
  scale_mlp, gate_mlp; x_n = RMSNorm(x) * (1 + scale_msa)); x += tanh(gate_msa) * norm2(attn(x_n)); x +=
  tanh(gate_mlp) * ffn_norm2(ffn(ffn_norm1(x) * (1 + scale_mlp))). No shift anywhere. Unmodulated
  (context_refiner): norm1 is a plain RMSNorm and there are no scales or gates. Every RMSNorm eps norm_eps 1e-5
  with a gain. LuminaFeedForward (:72-82): inner = multiple_of * ceil(4 * dim / multiple_of) (ffn_dim_multiplier
  is accepted and IGNORED, og2.py:151-170; released 4 * 2520 = 10080 -> 10240; 256 here), linear_2(silu(linear_1
  x) * linear_3 x), no biases.
- og2.py:389-412 img_patch_embed_and_refine: x_embedder and ref_image_patch_embedder Linears with bias;
  image_index_embedding[j] ([5, hidden]) added to every token of reference j; the noise_refiner on the image
  alone; the ref_image_refiner on ALL references of a sample as ONE sequence (they attend to each other); then
  cat(references, image). The context_refiner runs on the caption alone (:442-443).
- og2.py:461-466: norm_out = LuminaLayerNormContinuous (:56-69): LayerNorm eps 1e-6 without affine, * (1 + Linear(
  min(dim, 1024) -> dim)(SiLU(temb))) (no shift), Linear(dim -> 4 * 16, bias); the last img_len tokens unpatchified
  ('b (h w) (p1 p2 c) -> b c (h p1) (w p2)'), cropped to the input size and NEGATED (:466: `return -output`).
- Text encoder: a lone file with `model.layers.0.self_attn.k_proj.bias` of 256 rows (2 kv heads x 128) is
  TEModel.QWEN25_3B (sd.py:1625-1631; 512 rows would be QWEN25_7B); sd.py:1821-1823 builds omnigen2.te(
  **llama_detect(sd)) (dtype = model.norm.weight's, hunyuan_video.py:11-23) with Omnigen2Tokenizer, whatever the
  CLIP type. comfy/text_encoders/omnigen2.py:25-27 Qwen25_3BModel: SDClipModel, layer "last" (the output AFTER the
  final model.norm, sd1_clip.py:281-282), special tokens {"pad": 151643} only (no start, no end), attention masks
  enabled and returned, layer_norm_hidden_state False (irrelevant for "last"). llama.py:106-126 Qwen25_3BConfig
  (vocab 151936, hidden 2048, intermediate 11008, 36 layers, 16 heads / 2 kv of head_dim 128, eps 1e-6, theta 1e6,
  q/k/v biases, silu MLP, no q/k norm, final norm, rope_dims None: plain 1-D RoPE at positions 0..N-1, llama.py:
  826-829, rotate-half (precompute_freqs_cis :445-490, apply_rope :492-509); Llama2_ :754-944 with TransformerBlock
  :645-680 (pre-norm x += attn(input_layernorm(x)); x += mlp(post_attention_layernorm(x))), RMSNorm (:429-440)
  gain w (not 1 + w); masks (:833-843): padding keys and the causal triangle each finfo.min / 4, ADDED.
- Tokenizer, omnigen2.py:7-23: Qwen25_3BTokenizer = SDTokenizer(transformers' Qwen2Tokenizer on
  comfy/text_encoders/qwen25_tokenizer, has_start_token False, has_end_token False, pad 151643, min_length 1,
  max_length 99999999 (one section), no padding); Omnigen2Tokenizer.tokenize_with_weights formats the whole
  template '<|im_start|>system\\nYou are a helpful assistant that generates high-quality images based on user
  instructions.<|im_end|>\\n<|im_start|>user\\n{}<|im_end|>\\n' FIRST and then parses weights over the whole
  string (sd1_clip.py:588 token_weights), each weighted segment tokenized on its own (sd1_clip.py:621): so
  "(red:1.3)" is a weight (applied), and "a " / "red" / " cat..." are separate BPE calls: "a red cat" would be
  [64, 2518, 8251], the weighted prompt gives [64, 220, 1151, 8251] ("a", " ", "red", " cat"). The template's
  special tokens are Qwen2Tokenizer's added tokens (151644 <|im_start|>, 151645 <|im_end|>); no token is dropped
  (tokens_start 0) and nothing is added.
- Weights (sd1_clip.py:27-76 ClipTokenWeightEncoder): with any weight != 1, gen_empty_tokens (:15-25) appends
  [151643] * n (pad only: no start / end token) to the batch; process_tokens (:172-258) with cmp token = pad and
  the FIRST token a pad marks it left-padded: its attention mask is ALL ZEROS (llama.py:833-843 then puts
  finfo.min / 4 on every key). That is harmless: every token is the same pad, so every key and value is equal
  and the attention pattern cannot matter; z_empty is one vector (the model on the lone token 151643 at position
  0) repeated n times. cond[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] for w_j != 1 (:62); the returned
  attention_mask is the prompt's own (:75): all ones, so model_base passes num_tokens = its length and no mask.
- sd.py:395-418 CLIP.encode_from_tokens(return_dict=True): {"cond", "pooled_output": None, "attention_mask"}.

The tiny configs (released OmniGen2 / Qwen2.5-VL 3B values in brackets):
- DiT, OmniGen2Transformer2DModel kwargs: patch_size 2, in_channels 16, out_channels None (16), hidden_size 64
  [2520], num_layers 2 [32], num_refiner_layers 2 [2], num_attention_heads 4 [21], num_kv_heads 2 [7] (n_rep 2
  [3]), head 16 [120] = sum(axes_dim_rope) (4, 6, 6) [(40, 40, 40)] (unequal: the axis order is pinned),
  axes_lens (1024, 1664, 1664) (unused by ComfyUI), multiple_of 256 -> FFN inner 256 [10240], ffn_dim_multiplier
  None, norm_eps 1e-5, text_feat_dim 32 [2048] (= the tiny encoder's width: case c feeds its cond), timestep_scale
  1000.0 (as detection sets it), adaLN / timestep width min(64, 1024) = 64 [1024].
- Qwen2.5-VL language model: ComfyUI's Qwen25_3B with Qwen25_3BConfig swapped for a subclass (head_dim is a class
  attribute): hidden 32 [2048], intermediate 64 [11008], 2 layers [36], 4 heads [16] over 2 kv heads [2] of
  head_dim 128 [128] (the released head width: k_proj's bias then has the released 256 rows, which is what ComfyUI's
  detect_te_model reads; so the file goes through ComfyUI's own detection), eps 1e-6, theta 1e6, vocabulary 151936.
- Token table: the file stores only its first 1000 rows ([1000, 32]); row r serves every id with id % 1000 == r.
  Kiln's test must tile the table to 151936 rows (engine/models/tests/it/common.rs tiled_table), as the script does
  before ComfyUI's loader sees it.

Shims on ComfyUI (the only places this departs from its code path): the Qwen25_3BConfig swap above, during
comfy.sd.load_text_encoder_state_dicts (ComfyUI's loader for the written te.safetensors with its table tiled to
151936 rows, detection included); the DiT is built directly (OmniGen2Transformer2DModel(**kwargs,
operations=comfy.ops.manual_cast)) and, for apply_model, through supported_models.Omnigen2(tiny unet_config)
.get_model with the weights loaded into its diffusion_model.

Writes engine/models/tests/fixtures/omnigen2/ (every tensor f32):
- dit.safetensors: OmniGen2Transformer2DModel.state_dict(), ComfyUI's (= the released file's) names, no prefix:
  x_embedder.{weight [64, 64], bias [64]}, ref_image_patch_embedder.{weight [64, 64], bias [64]},
  image_index_embedding [5, 64], time_caption_embed.timestep_embedder.linear_1.{weight [64, 256], bias [64]},
  .linear_2.{weight [64, 64], bias [64]}, time_caption_embed.caption_embedder.0.weight [32] (RMSNorm gain),
  .caption_embedder.1.{weight [64, 32], bias [64]}; {noise_refiner, ref_image_refiner, context_refiner,
  layers}.N (N = 0, 1).attn.{to_q [64, 64], to_k [32, 64], to_v [32, 64], to_out.0 [64, 64]}.weight,
  .attn.{norm_q, norm_k}.weight [16], .feed_forward.{linear_1, linear_3}.weight [256, 64],
  .feed_forward.linear_2.weight [64, 256], .norm2.weight, .ffn_norm1.weight, .ffn_norm2.weight [64];
  modulated blocks (noise_refiner, ref_image_refiner, layers): .norm1.linear.{weight [256, 64], bias [256]},
  .norm1.norm.weight [64]; context_refiner.N.norm1.weight [64]; norm_out.linear_1.{weight [64, 64], bias [64]},
  norm_out.linear_2.{weight [64, 64], bias [64]}. Weights N(0, 1) / sqrt(fan_in), biases 0.1 N, RMSNorm gains
  1 + 0.1 N, image_index_embedding 0.5 N.
- dit_io.safetensors, per case c: `{c}.x` [B, 16, H, W], `{c}.sigma` [B], `{c}.timestep` [B] (=
  model_sampling.timestep(sigma) = sigma: what forward gets), `{c}.context` [B, L, 32], `{c}.ref.{j}` [B, 16, h_j,
  w_j] (reference j as the DiT receives it: in the MODEL's latent space, after process_latent_in, repeated to the
  batch by CONDList.process_cond, not padded), `{c}.ref_latent.{j}` [1, 16, h_j, w_j] (the raw VAE-space latent
  the conditioning holds, before process_latent_in), `{c}.out` [B, 16, H, W] = forward(x, timestep, context, L,
  ref_latents=[ref.0, ...], attention_mask=None) (the negated velocity), `{c}.denoised` =
  model_base.Omnigen2.apply_model(x, sigma, **conds processed to the batch) (= x - out * sigma); intermediates
  (forward hooks on ComfyUI's modules): `{c}.temb` [B, 64] (timestep_embedder output), `{c}.cap_refined`
  [B, L, 64] (after the context_refiner), `{c}.img_refined` [B, H'W'/4, 64] (after the noise_refiner, H', W'
  padded), `{c}.ref_refined` [B, sum_j tokens_j, 64] (after the ref_image_refiner; cases with references).
  Cases: a: x [1,16,8,8], L 5 (randn), sigma 0.7, no reference; b: x [2,16,7,10] (padded to 8 x 10, cropped back),
  L 7, sigmas 0.9 / 0.25, no reference; c: x [1,16,8,6], context = te_io's caption.cond [1, 38, 32], sigma 1.0
  (the network sees t = 0), one reference [1,16,6,10]; d: x [2,16,6,8], L 6, sigmas 0.6 / 0.3, two references
  [1,16,5,6] (padded to 6 x 6) and [1,16,8,4], repeated to batch 2; e: x [2,16,6,6], L 4, sigmas 0.8 / 0.4, one
  reference [2,16,4,6] whose two samples DIFFER (what a CFG batch of two conds with references of the same shape
  concatenates to, conds.py:137-145).
- dit_cases.json: seed, dit_kwargs, head_dim, ffn_inner (and its rule), widths, per case shapes / sigma / timestep
  / internal_t (1 - timestep) / num_tokens / padded sizes / references / token counts / sample 0's RoPE position
  ids (caption, references, image in sequence order), `sampling` (shift, multiplier, sigma(t) for t in 1, .75,
  .5, .25, .001, timestep(sigma), the sigmas table's ends, percent_to_sigma, the simple and normal schedulers'
  4-step sigmas), `latent_format`, `refs_space`, `mask_with_zeros`, `comfy_detection`.
- te.safetensors: Comfy-Org's qwen_2.5_vl_fp16.safetensors layout (its language-model part): model.embed_tokens
  .weight [1000, 32] (the first 1000 rows, see above; N(0, 1)), model.layers.N.self_attn.{q_proj.weight [512, 32],
  q_proj.bias [512], k_proj.weight [256, 32], k_proj.bias [256], v_proj.weight [256, 32], v_proj.bias [256],
  o_proj.weight [32, 512]}, model.layers.N.mlp.{gate_proj, up_proj}.weight [64, 32], .mlp.down_proj.weight
  [32, 64], model.layers.N.{input_layernorm, post_attention_layernorm}.weight [32], model.norm.weight [32], N = 0, 1.
  Weights N(0, 1) / sqrt(fan_in), biases 0.1 N, norm gains 1 + 0.1 N.
- te_io.safetensors, per prompt case e: `{e}.cond` [1, N, 32] and `{e}.attention_mask` [1, N] (as f32, all ones)
  = CLIP.encode_from_tokens(CLIP.tokenize(prompt), return_dict=True); for `weighted` also `weighted.unweighted`
  and `weighted.empty` [1, 29, 32] (z and z_empty of the interpolation; z_empty's 29 rows are one vector).
- te_cases.json: per case the prompt, the templated text, `ids`, `weights`, `tokenize_with_weights` ({"qwen25_3b":
  [[[id, weight], ...]]}, one section, as ComfyUI returns it), `hf_ids` (Qwen2Tokenizer on the templated text in
  one call) and `equals_hf`, cond shape, attention mask, `pooled_output` null, `encode_keys`; the Qwen config, the
  embedding rule, the tokenizer settings, the template, the weighting rule and the empty sequence's mask.
Prompt cases: caption (38 ids), empty (the template alone, 25 ids), weighted ("a (red:1.3) cat": 29 ids, 1.3 on
"red" only), newlines ("\\n" 198, "\\n\\n" 271, byte-level pieces for é and 夜).

Checks: the loaded ComfyUI modules hold exactly the written values; ComfyUI's tokenizer ids equal Qwen2Tokenizer's
on the templated text except for the weighted prompt (segmenting, restated and asserted); the weighted cond equals
the interpolation; apply_model's denoised == x - out * sigma; two runs write identical files. Cross-checks (max
|diff| / max |ref|, CPU f32, torch 2.15, printed at the end of a run):
- diffusers 0.42.1 (pinned) has NO OmniGen2Transformer2DModel (only OmniGen v1's transformer_omnigen.py). With
  OMNIGEN2_DIR, the original VectorSpaceLab/OmniGen2 OmniGen2Transformer2DModel (0f72fa92, diffusers-based, its
  SDPA processor as flash-attn and triton are absent; identical parameter names: loaded strictly from
  dit.safetensors) fed 1 - sigma, an all-ones text mask, x and the references padded circularly, the output
  cropped and negated (its pipeline's convention: t = 0 is noise and the latents step by +dt * prediction; ComfyUI
  does both inside): 2.9e-7 to 3.6e-7 on a, b, c, e, but 4.8e-2 on d: upstream refines each reference ALONE
  (transformer_omnigen2.py:441-473: a batch of references, each masked to its own tokens) where ComfyUI refines a
  sample's references as ONE sequence. With upstream's img_patch_embed_and_refine replaced by ComfyUI's joint
  refinement (restated in joint_ref_refine): 2.7e-7 to 3.7e-7 on all five cases.
- transformers 5.24 Qwen2Model (eager, head_dim 128 explicit, q/k/v biases, theta 1e6, same weights with the token
  table of 1000 rows fed id % 1000): last_hidden_state (= hidden_states[-1], what OmniGen2's pipeline takes) vs
  cond: 2.5e-7 to 3.5e-7 on the four prompts (the weighted one: its unweighted z; the interpolation of its own z
  and z_empty: 3.1e-7); hidden_states[-2] (before the final norm) is > 10% away (asserted). Qwen2_5_VLTextModel
  cannot hold head_dim 128 at hidden 32 (modeling_qwen2_5_vl.py:612-623 derive head_dim = hidden / heads); for text
  alone its three M-RoPE position rows are equal and it is this same decoder. The weighted case's z_empty: 3.6e-7
  under a plain causal mask, 0 (bitwise) under ComfyUI's additive mask for an all-zero padding mask, 5.7e-7 as the
  lone pad token's state repeated.
Other differences from upstream OmniGen2 that the fixtures follow ComfyUI in: ComfyUI's schedule is the fixed
shift 2.6 (sigma = 2.6 s / (1 + 1.6 s)); upstream's scheduler shifts by m = sqrt(latent H * W) / 40 (3.2 at
1024 x 1024), the same formula with m in place of 2.6, so it depends on the resolution. ComfyUI pads x and the
references to the patch; upstream expects multiples of 2 (its pipeline resizes images to multiples of 16 px).
ComfyUI computes the RoPE angles from the positions (f64, then f32), upstream gathers them from tables of
axes_lens rows (positions past them would fail). Upstream masks padded caption tokens everywhere (varlen) and may
give each sample its own references; ComfyUI never masks the joint layers, and one batch shares reference shapes.
Upstream's pipeline runs a dual guidance (text and image scales, three predictions); ComfyUI runs its usual CFG.
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

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/omnigen2")
SEED = 2520
BUDGET = 4_000_000

# OmniGen2Transformer2DModel kwargs: model_detection.py's released constants at tiny widths; 4 heads over 2 kv
# heads (n_rep 2) pin which q heads share a kv head, the unequal axes (4, 6, 6) pin the RoPE axis order.
DIT = dict(patch_size=2, in_channels=16, out_channels=None, hidden_size=64, num_layers=2, num_refiner_layers=2,
           num_attention_heads=4, num_kv_heads=2, multiple_of=256, ffn_dim_multiplier=None, norm_eps=1e-5,
           axes_dim_rope=[4, 6, 6], axes_lens=[1024, 1664, 1664], text_feat_dim=32, timestep_scale=1000.0)
HEAD_DIM = DIT["hidden_size"] // DIT["num_attention_heads"]
FFN_INNER = 256  # multiple_of * ceil(4 * 64 / multiple_of)
REF_LATENT_MEAN = 0.1159  # raw references are drawn around the Flux latent shift, scale ~1 / 0.3611
# name: (batch, h, w, context tokens (None: the text encoder's `caption` cond), sigmas, references
# [(batch, h, w), ...] as the conditioning holds them (raw latents))
DIT_CASES = {
    "a": (1, 8, 8, 5, [0.7], []),
    "b": (2, 7, 10, 7, [0.9, 0.25], []),
    "c": (1, 8, 6, None, [1.0], [(1, 6, 10)]),
    "d": (2, 6, 8, 6, [0.6, 0.3], [(1, 5, 6), (1, 8, 4)]),
    "e": (2, 6, 6, 4, [0.8, 0.4], [(2, 4, 6)]),
}
SAMPLING_TIMESTEPS = [1.0, 0.75, 0.5, 0.25, 0.001]

# Qwen2.5-VL 3B's language model at tiny widths (released values in the docstring).
QWEN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0)
QWEN_HEAD_DIM = 128
QWEN_VOCAB = 151936
ROWS = 1000  # stored rows of the token table; row r serves every id with id % ROWS == r
PAD = 151643
IM_START, IM_END = 151644, 151645
PROMPTS = {
    "caption": "a photo of a red fox sitting in the snow, golden hour",
    "empty": "",
    "weighted": "a (red:1.3) cat",
    "newlines": "line one\nline two\n\nthe café at night 夜",
}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_module(draw, module, special=None):
    """Every state_dict entry re-drawn in f32: RMSNorm gains 1 + 0.1 N, biases 0.1 N, weights and tables
    N / sqrt(last dimension); `special` maps a name to its std (drawn around 0)."""
    special = special or {}
    norms = {n for n, m in module.named_modules()
             if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(m).__name__ == "RMSNorm"}
    out = {}
    for name, p in module.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if name in special:
            v = draw.normal(p.shape, special[name])
        elif owner in norms and name.endswith(".weight"):
            v = draw.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            v = draw.normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
        out[name] = v.float().contiguous()
    return out


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_loaded(module, want):
    have = module.state_dict()
    assert set(want) == set(have), sorted(set(want) ^ set(have))[:10]
    for k in want:
        assert torch.equal(have[k].float(), want[k].float()), k


def tile(table, rows):
    """The stored [ROWS, D] table as the full [rows, D] one: row i = table[i % ROWS] (common.rs tiled_table)."""
    return table.repeat((rows + table.shape[0] - 1) // table.shape[0], 1)[:rows].contiguous()


CROSS = []


def report(name, err, bound):
    CROSS.append(f"{name}: {err:.2e}")
    print(f"  {name}: max |diff| / max |ref| = {err:.2e}")
    assert err < bound, (name, err)


def jsonable(v):
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, tuple):
        return list(v)
    return v


# ------------------------------------------------------------------------------------------- the text encoder


def tiny_config_class(llama):
    """Qwen25_3BConfig with the tiny sizes (llama.Qwen25_3B builds Qwen25_3BConfig(**config_dict) from the module's
    global; head_dim is a class attribute, so a subclass sets it)."""
    real = llama.Qwen25_3BConfig
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in QWEN.items()]
    return dataclasses.make_dataclass("TinyQwen25_3BConfig", fields, bases=(real,),
                                      namespace={"head_dim": QWEN_HEAD_DIM})


def load_te(sd):
    """ComfyUI's own loader for a lone text-encoder file (what CLIPLoader type `omnigen2` runs): detect_te_model
    says QWEN25_3B (k_proj bias of 256 rows), clip_target = omnigen2.te(**llama_detect(sd)) with Omnigen2Tokenizer;
    comfy.sd.CLIP loads the state dict (strict=False)."""
    import comfy.sd
    import comfy.text_encoders.llama as llama

    assert comfy.sd.detect_te_model(sd) == comfy.sd.TEModel.QWEN25_3B
    real = llama.Qwen25_3BConfig
    llama.Qwen25_3BConfig = tiny_config_class(llama)
    try:
        clip = comfy.sd.load_text_encoder_state_dicts([dict(sd)], clip_type=comfy.sd.CLIPType.OMNIGEN2)
    finally:
        llama.Qwen25_3BConfig = real
    return clip


def comfy_mask(n, dtype=torch.float32):
    """ComfyUI's additive mask for an all-zero padding mask of n tokens (llama.py:833-843): finfo.min / 4 on every
    key, plus finfo.min / 4 above the diagonal."""
    m = torch.full((n, n), torch.finfo(dtype).min / 4, dtype=dtype)
    causal = torch.empty(n, n, dtype=dtype).fill_(torch.finfo(dtype).min / 4).triu_(1)
    return (m + causal)[None, None]


def te_fixture():
    import comfy.ops
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.omnigen2 as og2_te

    # Draw the weights on a directly built model (the names and shapes ComfyUI's Qwen25_3B has).
    real = llama.Qwen25_3BConfig
    llama.Qwen25_3BConfig = tiny_config_class(llama)
    try:
        shape_model = llama.Qwen25_3B({}, torch.float32, "cpu", comfy.ops.manual_cast)
    finally:
        llama.Qwen25_3BConfig = real
    weights = draw_module(Draw(SEED + 2), shape_model, {"model.embed_tokens.weight": 1.0})
    del shape_model
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:ROWS].clone()
    assert weights["model.layers.0.self_attn.k_proj.bias"].shape == (256,)
    assert all(k.startswith("model.") for k in weights)
    save_file(weights, f"{OUT}/te.safetensors")
    weights = load_file(f"{OUT}/te.safetensors")
    full = dict(weights)
    full["model.embed_tokens.weight"] = tile(weights["model.embed_tokens.weight"], QWEN_VOCAB)

    clip = load_te(full)
    te = clip.cond_stage_model
    q = te.qwen25_3b
    inner = q.transformer
    cfg = inner.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta,
            cfg.transformer_type, cfg.rms_norm_add, cfg.mlp_activation, cfg.qkv_bias, cfg.q_norm, cfg.rope_dims,
            cfg.final_norm, cfg.lm_head) == \
        (32, 64, 2, 4, 2, QWEN_HEAD_DIM, QWEN_VOCAB, 1e-6, 1e6, "llama", False, "silu", True, None, None, True,
         False)
    assert (q.layer, q.layer_idx, q.enable_attention_masks, q.return_attention_masks, q.zero_out_masked,
            q.special_tokens) == ("last", None, True, True, False, {"pad": PAD})
    check_loaded(inner, full)
    assert isinstance(clip.tokenizer, og2_te.Omnigen2Tokenizer)
    tok = clip.tokenizer.qwen25_3b
    assert (tok.tokens_start, tok.start_token, tok.end_token, tok.pad_token, tok.min_length, tok.max_length,
            tok.pad_to_max_length) == (0, None, None, PAD, 1, 99999999, False)
    hf = tok.tokenizer
    template = clip.tokenizer.llama_template

    io, cases = {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = clip.tokenize(prompt)
            assert set(tokens) == {"qwen25_3b"} and len(tokens["qwen25_3b"]) == 1
            ids = [int(t[0]) for t in tokens["qwen25_3b"][0]]
            w = [float(t[1]) for t in tokens["qwen25_3b"][0]]
            out = clip.encode_from_tokens(tokens, return_dict=True)
            assert set(out) == {"cond", "pooled_output", "attention_mask"}, sorted(out)
            assert out["pooled_output"] is None
            cond, mask = out["cond"], out["attention_mask"]
            assert cond.shape == (1, len(ids), QWEN["hidden_size"]) and mask.shape == (1, len(ids))
            assert cond.dtype == torch.float32 and torch.isfinite(cond).all()
            io[f"{name}.cond"] = cond
            io[f"{name}.attention_mask"] = mask.float()
            text = template.format(prompt)
            hf_ids = hf(text)["input_ids"]
            cases[name] = {"prompt": prompt, "templated": text, "ids": ids, "weights": w,
                           "tokenize_with_weights": {"qwen25_3b": [[[i, x] for i, x in zip(ids, w)]]},
                           "hf_ids": hf_ids, "equals_hf": ids == hf_ids,
                           "cond_shape": list(cond.shape), "attention_mask": mask[0].tolist(),
                           "pooled_output": None, "encode_keys": sorted(out)}
            print(f"encoder {name}: {len(ids)} ids ...{ids[20:]}, weights {sorted(set(w))}, cond std "
                  f"{cond.std():.3f}, max |cond| {cond.abs().max():.3f}")

        # Tokenizer facts.
        assert all(all(c["attention_mask"]) for c in cases.values())
        head = cases["empty"]["ids"]
        assert head[0] == IM_START and head[-2:] == [IM_END, 198] and len(head) == 25
        for name, case in cases.items():
            assert case["ids"][:23] == head[:23] and case["ids"][-2:] == [IM_END, 198], name
            if name != "weighted":
                assert case["equals_hf"] and all(x == 1.0 for x in case["weights"]), name
        w = cases["weighted"]
        assert not w["equals_hf"]
        # ComfyUI's segments: the template's head + "a ", "red" (1.3), " cat" + the template's tail, each on its own.
        pre, post = template.split("{}")
        want = hf(pre + "a ")["input_ids"] + hf("red")["input_ids"] + hf(" cat" + post)["input_ids"]
        assert w["ids"] == want, (w["ids"], want)
        n_pre = len(hf(pre + "a ")["input_ids"])
        assert w["weights"] == [1.0] * n_pre + [1.3] + [1.0] * (len(want) - n_pre - 1)
        assert w["ids"][23:27] == [64, 220, 1151, 8251] and hf(" red")["input_ids"] == [2518]
        assert 271 in cases["newlines"]["ids"] and 198 in cases["newlines"]["ids"][23:-2]

        # The weighted prompt: the unweighted forward moved away from the appended pad-only sequence, whose
        # attention mask is all zeros (process_tokens: the first token is the pad, so it counts as left padding).
        n = len(w["ids"])
        both, _, extra = q([w["ids"], [PAD] * n])
        assert extra["attention_mask"][1].tolist() == [0] * n and extra["attention_mask"][0].tolist() == [1] * n
        wt = torch.tensor(w["weights"])[None, :, None]
        lerp = torch.where(wt != 1.0, (both[0:1] - both[1:2]) * wt + both[1:2], both[0:1])
        err = rel_err(io["weighted.cond"], lerp)
        print(f"weighted prompt: cond vs (z - z_empty) * w + z_empty {err:.2e}")
        assert err < 1e-6
        lone = q([[PAD]])[0]
        assert rel_err(both[1:2], lone.expand(1, n, -1)) < 1e-5  # one vector: the lone pad token's state
        io["weighted.unweighted"] = both[0:1]
        io["weighted.empty"] = both[1:2]
        te_cross_check(weights, cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "seed": SEED + 2,
            "qwen_config": {**QWEN, "head_dim": QWEN_HEAD_DIM, "vocab_size": QWEN_VOCAB, "qkv_bias": True,
                            "o_proj_bias": False, "mlp_activation": "silu", "rope": "1-D rotate-half, positions "
                            "0..N-1", "layer": "last", "final_norm_applied": True, "rms_norm_gain": "w (not 1 + w)"},
            "embedding_rows": ROWS,
            "embedding_rule": f"te.safetensors stores {ROWS} token-table rows; id i uses row i % {ROWS} (tile the "
                              f"table to {QWEN_VOCAB} rows); the real ids are used everywhere else",
            "tokenizer": {"class": "transformers Qwen2Tokenizer on comfy/text_encoders/qwen25_tokenizer",
                          "start_token": None, "end_token": None, "pad_token": PAD, "tokens_start": 0,
                          "min_length": 1, "max_length": 99999999, "im_start": IM_START, "im_end": IM_END,
                          "weights_parsed": True},
            "template": template,
            "weighted_rule": "the template is formatted first, then '(text:w)' parsed over the whole string; each "
                             "segment is tokenized alone; cond[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] where "
                             "w_j != 1; z_empty is the same model on [151643] * n in the same batch, with an "
                             "ALL-ZERO attention mask (the first token is the pad: left padding), harmless since "
                             "all its keys and values are equal: z_empty[j] = the model on the lone token 151643, "
                             "for every j; te_io's weighted.unweighted / weighted.empty are z and z_empty",
            "cases": cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")
    return io


def te_cross_check(weights, cases, io):
    """transformers' Qwen2Model with the same weights (the token table's 1000 rows fed id % 1000)."""
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(vocab_size=ROWS, **{k: v for k, v in QWEN.items() if k != "rope_theta"},
                         head_dim=QWEN_HEAD_DIM, max_position_embeddings=4096, use_sliding_window=False,
                         rope_parameters={"rope_theta": QWEN["rope_theta"], "rope_type": "default"},
                         attn_implementation="eager")
    net = Qwen2Model(config).eval()
    assert net.layers[0].self_attn.head_dim == QWEN_HEAD_DIM
    net.load_state_dict({k[len("model."):]: v for k, v in weights.items()}, strict=True)
    print("transformers:")
    for name, case in cases.items():
        ids = torch.tensor([case["ids"]]) % ROWS
        out = net(input_ids=ids, output_hidden_states=True)
        assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
        report(f"transformers Qwen2Model last_hidden_state vs ComfyUI cond, {name}",
               rel_err(io[f"{name}.cond" if name != "weighted" else "weighted.unweighted"], out.last_hidden_state),
               1e-5)
        if name == "weighted":
            n = ids.shape[1]
            # All n tokens are the same pad, so every key and value is the same and the attention pattern (and
            # with it ComfyUI's all-zero mask) cannot matter: z_empty is one vector, f(pad) at position 0, repeated.
            empty = net(input_ids=torch.full((1, n), PAD) % ROWS).last_hidden_state
            report("transformers Qwen2Model on [151643] * n (plain causal mask) vs ComfyUI's z_empty (all-zero mask)",
                   rel_err(io["weighted.empty"], empty), 1e-5)
            masked = net(input_ids=torch.full((1, n), PAD) % ROWS, attention_mask=comfy_mask(n)).last_hidden_state
            report("transformers Qwen2Model on [151643] * n under ComfyUI's additive mask for an all-zero padding "
                   "mask vs ComfyUI's z_empty", rel_err(io["weighted.empty"], masked), 1e-5)
            single = net(input_ids=torch.tensor([[PAD % ROWS]])).last_hidden_state
            report("transformers Qwen2Model on the single token [151643], repeated, vs ComfyUI's z_empty",
                   rel_err(io["weighted.empty"], single.expand(1, n, -1)), 1e-5)
            wt = torch.tensor(case["weights"])[None, :, None]
            want = torch.where(wt != 1.0, (out.last_hidden_state - empty) * wt + empty, out.last_hidden_state)
            report("transformers weighted interpolation vs ComfyUI cond, weighted", rel_err(io["weighted.cond"], want),
                   1e-5)
        # The final norm IS part of ComfyUI's cond ("last"): the pre-norm state is far from it.
        assert rel_err(io[f"{name}.cond"], out.hidden_states[-2]) > 0.1, name


# ----------------------------------------------------------------------------------------------------- the DiT


def build_dit():
    import comfy.ops
    from comfy.ldm.omnigen.omnigen2 import OmniGen2Transformer2DModel

    return OmniGen2Transformer2DModel(**DIT, operations=comfy.ops.manual_cast, dtype=torch.float32).eval()


def padded(n):
    return n + (-n % 2)


def dit_fixture(te_io):
    import comfy.model_detection
    import comfy.samplers
    import comfy.supported_models

    model = build_dit()
    weights = draw_module(Draw(SEED), model, {"image_index_embedding": 0.5})
    assert weights["layers.0.feed_forward.linear_1.weight"].shape == (FFN_INNER, DIT["hidden_size"])
    assert weights["layers.0.attn.to_k.weight"].shape == (DIT["num_kv_heads"] * HEAD_DIM, DIT["hidden_size"])
    assert weights["time_caption_embed.timestep_embedder.linear_1.weight"].shape == (64, 256)
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    model.load_state_dict(weights, strict=True)
    check_loaded(model, weights)

    detected = comfy.model_detection.detect_unet_config(weights, "")
    picked = comfy.model_detection.model_config_from_unet(weights, "")
    print(f"detect_unet_config: {detected}; model config {type(picked).__name__}")
    assert detected["image_model"] == "omnigen2" and detected["hidden_size"] == 2520
    assert detected["timestep_scale"] == DIT["timestep_scale"]
    assert type(picked).__name__ == "Omnigen2"

    # ComfyUI's model_base path: supported_models.Omnigen2 built from the tiny config.
    mc = comfy.supported_models.Omnigen2({"image_model": "omnigen2", **DIT})
    mc.set_inference_dtype(torch.float32, None)
    based = mc.get_model({})
    based.diffusion_model.load_state_dict(weights, strict=True)
    ms = based.model_sampling
    assert (ms.shift, ms.multiplier) == (2.6, 1.0), (ms.shift, ms.multiplier)
    assert type(mc.latent_format).__name__ == "Flux"
    lf = mc.latent_format

    seen = {}
    hooks = [model.time_caption_embed.register_forward_hook(lambda m, a, o: seen.__setitem__("temb", o[0])),
             model.context_refiner[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("cap", o)),
             model.noise_refiner[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("img", o)),
             model.ref_image_refiner[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("ref", o)),
             model.rope_embedder.rope_embedder.register_forward_hook(lambda m, a, o: seen.__setitem__("ids", a[0]))]

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas, refs) in DIT_CASES.items():
            x = torch.randn(b, 16, h, w, generator=g)
            context = (torch.randn(b, n, DIT["text_feat_dim"], generator=g) if n is not None
                       else te_io["caption.cond"])
            raw = [REF_LATENT_MEAN + torch.randn(rb, 16, rh, rw, generator=g) / lf.scale_factor
                   for rb, rh, rw in refs]
            sigma = torch.tensor(sigmas)
            t = ms.timestep(sigma).float()
            L = context.shape[1]

            # The conds as ComfyUI's sampler builds them: extra_conds, then process_cond to the batch.
            kw = {"cross_attn": context, "attention_mask": torch.ones(1, L, dtype=torch.long), "device": "cpu",
                  "noise": x}
            if raw:
                kw["reference_latents"] = raw
            conds = based.extra_conds(**kw)
            assert set(conds) == {"c_crossattn", "num_tokens"} | ({"ref_latents"} if raw else set()), sorted(conds)
            assert type(conds["c_crossattn"]).__name__ == "CONDRegular" and conds["num_tokens"].cond == L
            conds = {k: v.process_cond(batch_size=b, device="cpu") for k, v in conds.items()}
            ref_in = conds["ref_latents"].cond if raw else None
            if raw:
                assert type(conds["ref_latents"]).__name__ == "CONDList"
                for r, m in zip(raw, ref_in):
                    assert m.shape == (b,) + r.shape[1:]
                    assert torch.equal(m, based.process_latent_in(r).expand(b, -1, -1, -1))
                    assert rel_err(m, (r - lf.shift_factor) * lf.scale_factor) < 1e-6

            seen.clear()
            out = model(x, t, context, L, ref_latents=ref_in, attention_mask=None, transformer_options={})
            assert out.shape == x.shape and torch.isfinite(out).all()
            inter = dict(seen)
            denoised = based.apply_model(x, sigma, c_crossattn=conds["c_crossattn"].cond,
                                         num_tokens=conds["num_tokens"].cond,
                                         **({"ref_latents": ref_in} if raw else {}))
            err = rel_err(denoised, x - out * sigma.view(-1, 1, 1, 1))
            print(f"DiT case {name}: x {tuple(x.shape)}, context {tuple(context.shape)}, sigma {sigmas}, refs "
                  f"{[tuple(r.shape) for r in (ref_in or [])]}, out std {out.std():.3f} max {out.abs().max():.3f}; "
                  f"denoised vs x - out * sigma {err:.2e}")
            assert err < 1e-6
            io.update({f"{name}.x": x, f"{name}.sigma": sigma, f"{name}.timestep": t, f"{name}.context": context,
                       f"{name}.out": out, f"{name}.denoised": denoised, f"{name}.temb": inter["temb"],
                       f"{name}.cap_refined": inter["cap"], f"{name}.img_refined": inter["img"]})
            for j, (r, m) in enumerate(zip(raw, ref_in or [])):
                io[f"{name}.ref.{j}"] = m
                io[f"{name}.ref_latent.{j}"] = r
            if raw:
                io[f"{name}.ref_refined"] = inter["ref"]

            hp, wp = padded(h), padded(w)
            ref_info, shift, ref_tokens = [], L, 0
            for j, m in enumerate(ref_in or []):
                rh, rw = padded(m.shape[2]), padded(m.shape[3])
                ref_info.append({"raw": list(raw[j].shape), "model": list(m.shape), "padded_hw": [rh, rw],
                                 "tokens": rh * rw // 4, "grid": [rh // 2, rw // 2], "rope_t": shift,
                                 "image_index_embedding_row": j})
                shift += max(rh // 2, rw // 2)
                ref_tokens += rh * rw // 4
            ids = inter["ids"][0].tolist()
            img_tokens = hp * wp // 4
            assert len(ids) == L + ref_tokens + img_tokens
            assert all(ids[i] == [i, i, i] for i in range(L))
            assert ids[L + ref_tokens] == [shift, 0, 0] and ids[-1] == [shift, hp // 2 - 1, wp // 2 - 1]
            cases[name] = {"x": list(x.shape), "context": list(context.shape),
                           "context_from": "randn" if n is not None else "te_io caption.cond", "sigma": sigmas,
                           "timestep": t.tolist(), "internal_t": (1.0 - t).tolist(),
                           "time_proj_input": (DIT["timestep_scale"] * (1.0 - t)).tolist(), "num_tokens": L,
                           "padded_hw": [hp, wp], "image_tokens": img_tokens, "image_rope_t": shift,
                           "references": ref_info, "reference_tokens": ref_tokens,
                           "sequence": L + ref_tokens + img_tokens, "out": list(out.shape),
                           "position_ids_sample0": ids}
            if name == "e":
                assert not torch.equal(ref_in[0][0], ref_in[0][1])
                cases[name]["note"] = ("the reference's two samples differ (a CFG batch concatenates two conds' "
                                       "references of the same shape); each sample uses its own")
        for hook in hooks:
            hook.remove()

        # A text mask with zeros (extra_conds passes it on, with num_tokens = its sum) makes forward fail.
        x, context, sigma = io["a.x"], io["a.context"], io["a.sigma"]
        conds = based.extra_conds(cross_attn=context, attention_mask=torch.tensor([[1, 1, 1, 0, 0]]), device="cpu",
                                  noise=x)
        assert set(conds) == {"c_crossattn", "num_tokens", "attention_mask"} and conds["num_tokens"].cond == 3
        try:
            based.apply_model(x, sigma, c_crossattn=context, attention_mask=conds["attention_mask"].cond,
                              num_tokens=3)
            failed = None
        except RuntimeError as e:
            failed = str(e).split("\n")[0]
        assert failed is not None and "size of tensor" in failed, failed
        print(f"case a with a text mask [1, 1, 1, 0, 0]: forward fails ({failed})")
        mask_with_zeros = {"mask": [[1, 1, 1, 0, 0]], "num_tokens": 3, "result": f"RuntimeError: {failed}",
                           "why": "the caption RoPE covers num_tokens positions, the joint table num_tokens + "
                                  "images, the sequence L + images; ComfyUI's encoder never returns a mask with "
                                  "zeros for one prompt, so this path is not reached in practice"}

        # Sampling: ModelSamplingDiscreteFlow, shift 2.6, multiplier 1.
        ts = torch.tensor(SAMPLING_TIMESTEPS)
        sampling = {"type": "ModelSamplingDiscreteFlow + CONST", "shift": ms.shift, "multiplier": ms.multiplier,
                    "timesteps": SAMPLING_TIMESTEPS, "sigma_of_timestep": ms.sigma(ts).tolist(),
                    "timestep_of_sigma": ms.timestep(torch.tensor([0.7, 0.25])).tolist(),
                    "sigmas_len": int(ms.sigmas.shape[0]), "sigmas_first": ms.sigmas[:3].tolist(),
                    "sigmas_last": ms.sigmas[-3:].tolist(), "sigma_min": float(ms.sigma_min),
                    "sigma_max": float(ms.sigma_max),
                    "percent_to_sigma": {str(p): float(ms.percent_to_sigma(p)) for p in (0.0, 0.25, 0.5, 1.0)},
                    "simple_4": comfy.samplers.calculate_sigmas(ms, "simple", 4).tolist(),
                    "normal_4": comfy.samplers.calculate_sigmas(ms, "normal", 4).tolist()}
        want = [2.6 * t / (1 + 1.6 * t) for t in SAMPLING_TIMESTEPS]
        assert max(abs(a - b) for a, b in zip(sampling["sigma_of_timestep"], want)) < 1e-6
        latent = {"class": "Flux", "scale_factor": lf.scale_factor, "shift_factor": lf.shift_factor,
                  "process_in": "(latent - shift_factor) * scale_factor",
                  "process_out": "latent / scale_factor + shift_factor"}
        dit_cross_check(weights, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({"seed": SEED, "dit_kwargs": DIT, "head_dim": HEAD_DIM, "ffn_inner": FFN_INNER,
                   "ffn_rule": "multiple_of * ceil(4 * hidden_size / multiple_of) (ffn_dim_multiplier ignored; "
                               "released 2520 -> 10240)",
                   "timestep_embedder_width": min(DIT["hidden_size"], 1024),
                   "adaln_in": min(DIT["hidden_size"], 1024), "adaln_out": 4 * DIT["hidden_size"],
                   "image_index_embedding_rows": 5, "storage": "every tensor f32",
                   "timestep_is": "model_sampling.timestep(sigma) = sigma (multiplier 1.0); the DiT embeds "
                                  "1 - timestep (og2.py:418) times timestep_scale 1000 and returns the NEGATED "
                                  "output (og2.py:466)",
                   "denoised_is": "x - out * sigma (CONST)",
                   "refs_space": "dit_io {case}.ref.{j} hold the references as the DiT receives them: in the "
                                 "model's latent space (after process_latent_in: (raw - 0.1159) * 0.3611, "
                                 "model_base.py:2370) and repeated to the batch (CONDList.process_cond), unpadded "
                                 "(the DiT pads them circularly to the patch); {case}.ref_latent.{j} are the raw "
                                 "VAE-space latents the conditioning holds",
                   "sequence_order": "[caption (num_tokens), reference 0, reference 1, ..., image]; output = the "
                                     "last image tokens",
                   "sampling": sampling, "latent_format": latent, "cases": cases,
                   "mask_with_zeros": mask_with_zeros,
                   "comfy_detection": {"detect_unet_config": {k: jsonable(v) for k, v in detected.items()},
                                       "model_config": type(picked).__name__,
                                       "note": "the omnigen2 branch reads nothing from the shapes: every width is "
                                               "the released model's, so the tiny file is detected but cannot be "
                                               "built from its detection; the fixtures build the tiny model "
                                               "directly with the released constants (timestep_scale 1000, "
                                               "multiple_of 256, norm_eps 1e-5, axes_lens)"}},
                  f, indent=1)
        f.write("\n")


def upstream_model():
    """The original OmniGen2 transformer (OMNIGEN2_DIR), or None."""
    directory = os.environ.get("OMNIGEN2_DIR")
    if not directory:
        return None
    import warnings

    sys.path.insert(0, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from omnigen2.models.transformers.repo import OmniGen2RotaryPosEmbed
        from omnigen2.models.transformers.transformer_omnigen2 import OmniGen2Transformer2DModel
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in DIT.items()}
    net = OmniGen2Transformer2DModel(**kwargs).eval()
    freqs = OmniGen2RotaryPosEmbed.get_freqs_cis(tuple(DIT["axes_dim_rope"]), tuple(DIT["axes_lens"]), theta=10000)
    return net, freqs


def joint_ref_refine(self, hidden_states, ref_image_hidden_states, padded_img_mask, padded_ref_img_mask,
                     noise_rotary_emb, ref_img_rotary_emb, l_effective_ref_img_len, l_effective_img_len, temb):
    """Upstream's img_patch_embed_and_refine with ComfyUI's reference refinement (og2.py:389-412): all of a
    sample's references refined as one sequence (every sample here has the same lengths, so no padding)."""
    batch = len(hidden_states)
    hidden_states = self.x_embedder(hidden_states)
    ref = self.ref_image_patch_embedder(ref_image_hidden_states)
    for i in range(batch):
        shift = 0
        for j, n in enumerate(l_effective_ref_img_len[i]):
            ref[i, shift:shift + n] = ref[i, shift:shift + n] + self.image_index_embedding[j]
            shift += n
    for layer in self.noise_refiner:
        hidden_states = layer(hidden_states, padded_img_mask, noise_rotary_emb, temb)
    for layer in self.ref_image_refiner:
        ref = layer(ref, padded_ref_img_mask, ref_img_rotary_emb, temb)
    return torch.cat([ref, hidden_states], dim=1)


def dit_cross_check(weights, io):
    import types

    import diffusers

    assert not hasattr(diffusers, "OmniGen2Transformer2DModel")
    CROSS.append(f"diffusers {diffusers.__version__} has no OmniGen2Transformer2DModel (only OmniGen v1's "
                 "OmniGenTransformer2DModel): no diffusers cross-check")
    up = upstream_model()
    if up is None:
        CROSS.append("OMNIGEN2_DIR not set: the upstream OmniGen2 cross-check was skipped")
        print("  OMNIGEN2_DIR not set: upstream cross-check skipped")
        return
    net, freqs = up
    result = net.load_state_dict(weights, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    qk = [m for name, m in net.named_modules() if name.endswith(("norm_q", "norm_k"))]
    assert len(qk) == 2 * 4 * 2 and all(m.eps == 1e-5 for m in qk)

    def pad(t):
        return torch.nn.functional.pad(t, (0, -t.shape[-1] % 2, 0, -t.shape[-2] % 2), mode="circular")

    def run(name):
        x = io[f"{name}.x"]
        b, c, h, w = x.shape
        refs = [io[k] for k in sorted(k for k in io if k.startswith(f"{name}.ref.") and k.count(".") == 2)]
        per_sample = [[pad(r[i:i + 1])[0] for r in refs] for i in range(b)] if refs else None
        context = io[f"{name}.context"]
        # Upstream's pipeline feeds t (0 = noise) = 1 - sigma and steps with +dt * prediction; ComfyUI's forward
        # does 1 - timestep and the negation inside.
        out = net(pad(x), 1.0 - io[f"{name}.sigma"], context, freqs, torch.ones(context.shape[:2], dtype=torch.long),
                  ref_image_hidden_states=per_sample)
        return -out[..., :h, :w]

    stock = {name: rel_err(run(name), io[f"{name}.out"]) for name in DIT_CASES}
    net.img_patch_embed_and_refine = types.MethodType(joint_ref_refine, net)
    for name in DIT_CASES:
        report(f"upstream OmniGen2 (VectorSpaceLab, references refined jointly as ComfyUI does) vs ComfyUI, DiT case "
               f"{name}", rel_err(run(name), io[f"{name}.out"]), 1e-5)
    print(f"  (upstream stock: {', '.join(f'{k} {v:.2e}' for k, v in stock.items())})")
    CROSS.append("upstream OmniGen2 stock (each reference refined alone): "
                 + ", ".join(f"{k} {v:.2e}" for k, v in stock.items()))
    assert stock["d"] > 1e-3 and max(stock[k] for k in ("a", "b", "c", "e")) < 1e-5


def main():
    import_comfyui(node_modules=True)  # comfy.sd imports torchaudio: the stand-in
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    te_io = te_fixture()
    dit_fixture(te_io)
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
