"""Fixtures for Lumina Image 2.0 (engine/models/tests/fixtures/lumina2/; NetaYume Lumina is a fine-tune of it): its
DiT (ComfyUI's NextDiT, comfy/ldm/lumina/model.py, in the Lumina 2 configuration) and its text encoder (Gemma 2 2B
as ComfyUI's comfy/text_encoders/lumina2.py builds it, with the SentencePiece tokenizer read from the file's
`spiece_model` tensor), each a tiny random network built by ComfyUI's own classes, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; its extra pins
are listed in comfy_sampling.py, comfy-kitchen 0.2.31 among them; comfy.sd (ComfyUI's text-encoder loader) needs
comfyui.py's torchaudio stand-in, and the CLIPTextEncodeLumina2 node module imports comfy_api, which imports PyAV:
`pip install --no-deps av==18.1.0`; sentencepiece and protobuf come from requirements.txt):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/lumina2.py
It takes about 20 s on the CPU and is reproducible: a second run writes byte-identical files (the SentencePiece
model is trained with one thread; every random value comes from seeded torch generators).

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; model.py is comfy/ldm/lumina/model.py):
- Detection, model_detection.py:555-575: `cap_embedder.1.weight` and `noise_refiner.0.attention.k_norm.weight`
  -> image_model "lumina2", patch 2, in_channels 16, dim / cap_feat_dim from cap_embedder.1.weight, n_layers
  counted, qk_norm True; ONLY dim 2304 gets the Lumina 2 settings (n_heads 24, n_kv_heads 8, axes_dims
  [32, 32, 32], axes_lens [300, 512, 512], rope_theta 10000, ffn_dim_multiplier 4.0; clip_text_pooled_proj ->
  NewBie); dim 3840 is Z-Image. Everything else keeps NextDiT's defaults (multiple_of 256, norm_eps 1e-5,
  n_refiner_layers 2, z_image_modulation False, time_scale 1.0, pad_tokens_multiple None). supported_models.py:
  1173-1200 Lumina2: sampling multiplier 1.0, shift 6.0, latent format Flux (latent_formats.py:160-164: scale
  0.3611, shift 0.1159), inference dtypes bf16 / f32; ZImage (:1202) needs dim 3840. The tiny file (dim 64) is
  detected as lumina2 with NO head / rope settings (recorded in dit_cases.json `comfy_detection`): ComfyUI could
  not build it from the file alone (dim // 32 heads != sum of the default axes (16, 56, 56)), so the fixtures
  build NextDiT directly with the Lumina 2 settings.
- model_base.py:1502-1519 Lumina2: ModelType.FLOW; extra_conds wraps the text states in CONDRegular (not
  CONDCrossAttn: conds of different lengths are never padded into one batch, they run as separate batches), passes
  `attention_mask` only when it has a zero and num_tokens = its sum (else the context length). model_base.py:
  210-252 _apply_model: timestep = model_sampling.timestep(sigma) = sigma * 1.0 (model_sampling.py:315-316),
  CONST (:86-101) input x unscaled, denoised = x - out * sigma. ModelSamplingDiscreteFlow (:284-326): sigma(t) =
  6 t / (1 + 5 t) (time_snr_shift :279-282); sigmas = sigma(i / 1000), i = 1..1000.
- model.py:825-874 NextDiT._forward: t = 1.0 - timestep (:830: the network sees 1 - sigma); x padded to the patch
  (:834, common_dit.py:5-13, CIRCULAR); adaln_input = t_embedder(t * time_scale) (:841; mmdit.py:209-229
  TimestepEmbedder: sinusoid of 256 [cos, sin] (diffusionmodules/util.py:229-249, freqs exp(-ln(10000) i / 128), no
  factor on t), Linear(256 -> min(dim, 1024)), SiLU, Linear(-> min(dim, 1024))); patchify_and_embed; the main
  layers on [caption, image] with mask None (:813, :861-863); final_layer; unpatchify (:629-652) and crop to the
  input size (:873); the output is NEGATED (:874: `return -img`).
- model.py:717-815 patchify_and_embed: `cap_mask = None  # TODO?` (:721): the text attention mask is IGNORED
  everywhere, and num_tokens is never used: padded caption tokens attend and are attended to like real ones.
  embed_cap (:654-668): cap_embedder = RMSNorm(cap_feat_dim, eps 1e-5, gain) then Linear with bias (:525-534);
  caption RoPE positions (i + 1, 0, 0) for i = 0..L-1 (:665, 1-based); embed_all (:670-715): patches
  x.view(B, C, H/2, 2, W/2, 2).permute(0, 2, 4, 3, 5, 1) (feature = (ph * 2 + pw) * C + c, channel fastest) ->
  x_embedder Linear with bias (:706); image positions (L + 1, row, col), rows major (:707, pos_ids_x :419-434).
  The context_refiner blocks (no modulation) run on the caption alone, the noise_refiner blocks (modulated) on the
  image alone, then the sequence is cat(caption, image) (:807).
- RoPE: EmbedND (flux/layers.py:12-26) concatenates the axes t, h, w (pairs 0..1 t, 2..4 h, 5..7 w for axes
  (4, 6, 6)); flux/math.py:17-29: omega_i = 1 / theta^(2i / d_axis) (f64), matrix [[cos, -sin], [sin, cos]];
  applied to INTERLEAVED pairs (x[2i], x[2i + 1]) (comfy_kitchen eager rope.py:10-16 apply_rope1).
- model.py:76-180 JointAttention: qkv Linear without bias, split [n_heads, n_kv, n_kv] * head_dim (:145-156);
  q_norm / k_norm = RMSNorm(head_dim) with NO eps (:121-122) -> torch.finfo(float32).eps (:161), then RoPE: for
  n_heads != n_kv_heads comfy_kitchen rms_rope1 on q and on k (:165-166; eager rope.py:67-101: F.rms_norm over
  head_dim with the gain, then apply_rope1); k and v heads repeated with unsqueeze(3).repeat(..., n_rep, 1).
  flatten(2, 3) (:174-177): q head i uses kv head i // n_rep; SDPA scale 1/sqrt(head_dim), no mask (:178); out
  Linear without bias.
- model.py:240-366 JointTransformerBlock: RMSNorms attention_norm1/2, ffn_norm1/2 (eps 1e-5, gains, :283-287);
  adaLN_modulation = SiLU then Linear(min(dim, 1024) -> 4 dim, bias) (:301-311), chunk order scale_msa, gate_msa,
  scale_mlp, gate_mlp (:336); x += tanh(gate_msa) * attention_norm2(attn(attention_norm1(x) * (1 + scale_msa)));
  x += tanh(gate_mlp) * ffn_norm2(ffn(ffn_norm1(x) * (1 + scale_mlp))) (:338-350; modulate :38-40 has NO shift).
  Without modulation (context_refiner, :351-365) the same without scales and gates. FeedForward (:183-237): hidden
  = multiple_of * ceil(int(ffn_dim_multiplier * dim) / multiple_of) (4 * 2304 = 9216 released; 256 here),
  w2(silu(w1 x) * w3 x), no biases. FinalLayer (:368-412): LayerNorm eps 1e-6 without affine, * (1 + scale) with
  scale = Linear(min(dim, 1024) -> dim)(SiLU(adaln_input)) (no shift), then Linear(dim -> 2 * 2 * 16, bias);
  unpatchify: [H/2, W/2, 2, 2, C] -> [C, H, W] (channel fastest inside a patch vector).
- Text encoder (comfy/text_encoders/lumina2.py): a lone file with `model.layers.0.post_feedforward_layernorm.weight`
  and no q_norm is TEModel.GEMMA_2_2B (sd.py:1607-1624); sd.py:1797-1804 builds lumina2.te(**llama_detect(sd))
  (dtype = model.norm.weight's, hunyuan_video.py:11-23) with LuminaTokenizer and tokenizer_data["spiece_model"] =
  the file's uint8 tensor (the serialised SentencePiece ModelProto). lumina2.py:30-32 Gemma2_2BModel: SDClipModel
  with layer "hidden", layer_idx -2, special tokens start 2 / pad 0, layer_norm_hidden_state False, attention masks
  on and returned. sd1_clip.py:260-302: intermediate_output -2 -> layer len - 2 (llama.py:884-885); x cloned right
  after that layer (:921-922); the final norm goes to the last layer's x only (:927-928), not to the intermediate
  (:937: final_layer_norm_intermediate False): cond = the output of decoder layer n - 2 (of 26 released, index 24;
  of 3 here, index 1) WITHOUT model.norm = transformers' hidden_states[-2]. pooled_output None.
- llama.py:346-368 Gemma2_2B_Config (vocab 256000, hidden 2304, intermediate 9216, 26 layers, 8 heads / 4 kv of
  head_dim 256, eps 1e-6, theta 10000, rms_norm_add, gelu tanh, no qkv bias, no q/k norm, sliding_attention None,
  final norm): embed_tokens scaled by hidden ** 0.5 (:747-751, :765-766); RMSNorm (:429-440) uses weight + 1
  (stored weights are offsets from 1); TransformerBlockGemma2 (:682-745) sandwich norms: x += post_attention_norm(
  attn(input_norm(x))); x += post_feedforward_norm(mlp(pre_feedforward_norm(x))); MLP (:618-643) down(gelu_tanh(
  gate x) * up x); Attention (:511-616) q/k/v/o without bias, RoPE rotate-half (precompute_freqs_cis :445-490,
  apply_rope :492-509; NOT the DiT's interleaved pairs), SDPA with enable_gqa (q head i -> kv head i // n_rep),
  default scale 1/sqrt(head_dim) (= Gemma 2 2B's query_pre_attn_scalar 256), NO attention-logit soft-capping, NO
  sliding window; positions 0..N-1 (:829); masks: padding keys and the causal triangle each finfo.min / 4
  (:833-843).
- Tokenizer: lumina2.py:7-14 Gemma2BTokenizer = SDTokenizer(SPieceTokenizer with add_bos True, add_eos False,
  special_tokens {"<end_of_turn>": 107}), no end token, pad 0, no padding to a max length, max_length 99999999 (one
  section, never split), min_length 1. spiece_tokenizer.py:30-48: without "<end_of_turn>" in the text it is
  sp.encode(text) WITH the BOS; with it, re.split on it, each part encoded WITHOUT BOS and 107 put between (no BOS at
  all). sd1_clip.py:497-501: tokenizer('') = [2], so tokens_start = 1 and start_token = 2; :621 drops the first id
  of EVERY tokenizer call: normally the BOS, but for a segment holding "<end_of_turn>" its first REAL token (the
  `end_of_turn` case loses "a"; a segment starting with "<end_of_turn>" would lose the 107 itself); :588
  token_weights parses "(text:w)" and each weighted segment is tokenized on its own (so "a " and "red" give
  separate pieces, no merge across segments, parentheses and ":1.3" gone); the section gets the start token 2 in
  front, nothing at the end. "<start_of_turn>" is no ComfyUI special token: SentencePiece itself maps it (a user
  symbol of the model, 106 in the released and in this model).
- Weights (sd1_clip.py:27-76 ClipTokenWeightEncoder): when any weight != 1, gen_empty_tokens (:15-25) appends
  [2, 0, 0, ...] of the same length to the batch (process_tokens :172-258 masks it as [1, 0, 0, ...]: pad 0 is the
  compare token with no end token); cond[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] for w_j != 1 (:62); the
  returned attention_mask is the prompt's own (:75), all ones for any single prompt, so model_base drops it.
- sd.py:395-418 CLIP.encode_from_tokens(return_dict=True): {"cond", "pooled_output": None, "attention_mask"}.

The tiny configs (released Lumina Image 2.0 / Gemma 2 2B values in brackets):
- DiT, NextDiT kwargs: patch 2, in_channels 16, dim 64 [2304], n_layers 2 [26], n_refiner_layers 2 [2], n_heads 4
  [24], n_kv_heads 2 [8] (n_rep 2 [3]: two kv heads pin which q heads share one, which n_kv_heads 1 could not),
  head_dim 16 [96], axes_dims (4, 6, 6) [(32, 32, 32)] (unequal, so the axis order is pinned), axes_lens
  (300, 512, 512), multiple_of 256, ffn_dim_multiplier 4.0 -> FFN hidden 256 [9216], norm_eps 1e-5, qk_norm,
  cap_feat_dim 32 [2304] (= the tiny encoder's width, so its conds feed the DiT: case c), rope_theta 10000,
  z_image_modulation False (adaLN and t_embedder width min(dim, 1024) = 64 [1024]), time_scale 1.0, no pad tokens.
- Gemma 2: ComfyUI's Gemma2_2B with Gemma2_2B_Config swapped for a subclass (head_dim is a class attribute) for the
  build: hidden 32 [2304], intermediate 64 [9216], 3 layers [26], 4 heads [8] / 2 kv heads [4] of head_dim 16 [256],
  eps 1e-6, theta 10000, vocabulary 600 [256000] = the SentencePiece model's. The full table is stored.
- SentencePiece: BPE trained here on CORPUS with Gemma's settings (pad 0, eos 1, bos 2, unk 3, identity
  normalisation, no dummy prefix, extra whitespace kept, byte fallback, split digits, whitespace-only pieces
  allowed); user symbols <mask> 4, [@BOS@] 5, <unused0..99> 6..105, <start_of_turn> 106, <end_of_turn> 107, "\\n"
  108 as in Gemma's own vocabulary; bytes <0x00>..<0xFF> 109..364; merges and characters 365..599. "<", ">", "é",
  "夜" are not in the corpus: byte fallback (the `netayume` and `newlines` prompts).

Shims on ComfyUI (the only places this departs from its code path): the Gemma2_2B_Config swap above, during
comfy.sd.load_text_encoder_state_dicts (ComfyUI's own loader for the written te.safetensors, detection included);
the DiT is built directly (NextDiT(**kwargs, operations=comfy.ops.manual_cast)) and, for apply_model, through
supported_models.Lumina2(tiny unet_config).get_model with the weights loaded into its diffusion_model.

Writes engine/models/tests/fixtures/lumina2/ (every tensor f32 unless said):
- dit.safetensors: NextDiT.state_dict(), no prefix. x_embedder.{weight [64, 64], bias [64]};
  t_embedder.mlp.0.{weight [64, 256], bias}, t_embedder.mlp.2.{weight [64, 64], bias}; cap_embedder.0.weight [32],
  cap_embedder.1.{weight [64, 32], bias [64]}; {noise_refiner, context_refiner, layers}.N.attention.qkv.weight
  [128, 64] (q 64, k 32, v 32 rows), .attention.out.weight [64, 64], .attention.{q_norm, k_norm}.weight [16],
  .attention_norm1/.attention_norm2/.ffn_norm1/.ffn_norm2.weight [64], .feed_forward.{w1, w3}.weight [256, 64],
  .feed_forward.w2.weight [64, 256]; {noise_refiner, layers}.N.adaLN_modulation.1.{weight [256, 64], bias [256]};
  final_layer.adaLN_modulation.1.{weight [64, 64], bias [64]}, final_layer.linear.{weight [64, 64], bias [64]}.
  Weights N(0, 1) / sqrt(fan_in), biases 0.1 N, RMSNorm gains 1 + 0.1 N.
- dit_io.safetensors, per case c: `{c}.x` [B, 16, H, W], `{c}.sigma` [B], `{c}.timestep` [B] (=
  model_sampling.timestep(sigma) = sigma: what NextDiT.forward gets), `{c}.context` [B, L, 32], `{c}.out`
  [B, 16, H, W] = NextDiT.forward(x, timestep, context, L), `{c}.denoised` = model_base.Lumina2.apply_model(x, sigma,
  c_crossattn=context, num_tokens=L) (= x - out * sigma, exact): a: x [1,16,8,8], L 5 (randn), sigma 0.7;
  b: x [2,16,7,10] (padded circularly to 8 x 10, cropped back), L 7 (randn), sigmas 0.9, 0.25; c: x [1,16,6,6],
  context = te_io's netayume.cond [1, 41, 32], sigma 1.0 (the network sees t = 0). Intermediates for case a:
  `a.adaln_input` [1, 64] (t_embedder output), `a.cap_refined` [1, 5, 64] (after the context_refiner),
  `a.img_refined` [1, 16, 64] (after the noise_refiner).
- dit_cases.json: seed, nextdit_kwargs, head_dim, ffn_hidden, per case shapes / sigma / timestep / internal_t
  (1 - timestep) / num_tokens / padded size / token count (and for b `mask_ignored`), `sampling` (shift,
  multiplier, sigma(t) for t in 1, .75, .5, .25, .001, timestep(sigma), the sigmas table's ends, percent_to_sigma,
  the simple and normal schedulers' 4-step sigmas), `latent_format`, `comfy_detection`.
- te.safetensors: Comfy-Org's gemma_2_2b_fp16.safetensors layout: model.embed_tokens.weight [600, 32] (N / sqrt(32):
  unit scale after the sqrt(32) factor), model.layers.N.self_attn.{q_proj [64, 32], k_proj [32, 32], v_proj
  [32, 32], o_proj [32, 64]}.weight, model.layers.N.mlp.{gate_proj, up_proj [64, 32], down_proj [32, 64]}.weight,
  model.layers.N.{input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
  post_feedforward_layernorm}.weight [32], model.norm.weight [32] (loaded, unused by the cond), N = 0..2; the norm
  weights are OFFSETS (0.1 N; ComfyUI and transformers use 1 + w); spiece_model uint8 [10917] (the serialised
  SentencePiece model).
- te_io.safetensors, per prompt case e: `{e}.cond` [1, N, 32] and `{e}.attention_mask` [1, N] (as f32, all ones)
  = CLIP.encode_from_tokens(CLIP.tokenize(prompt), return_dict=True); for `weighted` also `weighted.unweighted` and
  `weighted.empty` [1, 9, 32] (z and z_empty of the interpolation).
- te_cases.json: per case the prompt, `ids`, `weights`, `tokenize_with_weights` ({"gemma2_2b": [[[id, weight],
  ...]]}, one section, as ComfyUI returns it), `sentencepiece_ids` (sp.encode(prompt) without BOS) and
  `equals_bos_plus_sentencepiece`, cond shape, attention mask, `pooled_output` null, `encode_keys`; the Gemma config,
  the tokenizer settings (with the model's sha256), the corpus, the node's template and system prompts, the
  weighting rule.
Prompt cases: netayume (NetaYume's system prompt + " <Prompt Start> " + a caption, 41 ids), empty ([2]), weighted
("a (red:1.3) cat, (blue sky:0.8)": ids [2, a, ▁, red, ▁cat, ",", ▁, blue, ▁sky], weights 1, 1, 1, 1.3, 1, 1, 1,
0.8, 0.8), end_of_turn ("a cat<end_of_turn>\\n<start_of_turn>model\\nblue sky": "a" dropped), newlines ("\\n" 108,
"\\n\\n" two 108s, byte fallback for é and 夜), node_superior (CLIPTextEncodeLumina2's "superior" system prompt +
" <Prompt Start> a cat").

Checks: the loaded ComfyUI modules hold exactly the written values; the tokenizer ids equal the sentencepiece
package's (BOS-less encode) with the start token 2 in front, except where ComfyUI's segmenting or its <end_of_turn>
path differ, both restated and asserted (comfy_spm_ids); the weighted cond equals the interpolation (0 here);
apply_model's denoised == x - out * sigma (bitwise) and a zero-holding attention mask (as extra_conds passes it)
leaves it bitwise unchanged; two runs write identical files. Cross-checks (max |diff| / max |ref|, CPU f32, torch
2.15, printed at the end of a run):
- transformers 5.24 Gemma2Model (eager, attn_logit_softcapping None, final_logit_softcapping None,
  query_pre_attn_scalar = head_dim 16, same weights, names without "model."): hidden_states[-2] (equal to a hook on
  layers[1]) vs cond: 0 to 3.3e-7 on the six prompts (weighted: the same interpolation of its own z and z_empty,
  z_empty with attention_mask [1, 0, ...]); last_hidden_state (after model.norm) is > 10% away (asserted). With the
  released config's attn_logit_softcapping 50 it is 1.2e-3 away even with these small logits.
- diffusers 0.42.1 Lumina2Transformer2DModel (hidden_size 64, num_attention_heads 4, num_kv_heads 2, multiple_of
  256, ffn_dim_multiplier None (its FFN starts from 4 * dim, ComfyUI's from dim times 4.0: the same 256),
  axes_dim_rope (4, 6, 6), cap_feat_dim 32), loaded strictly from the weights renamed by diffusers'
  convert_lumina2_to_diffusers (restated: it hard-codes the 2304/768/768 qkv split): fed 1 - sigma, an all-ones
  caption mask, x padded circularly and cropped, its output negated (diffusers' pipeline feeds 1 - t and negates;
  ComfyUI's NextDiT does both inside): 2.7e-7 to 3.6e-7 on the three cases with its q/k RMSNorm eps set to
  ComfyUI's f32 epsilon; 2.8e-6 to 3.7e-6 with its own 1e-5. Its caption positions are 0..L-1 with the image at
  L, ComfyUI's 1..L and L + 1: the same RoPE differences, so the same result. With a real caption mask (case b,
  sample 1 keeping 4 of 7 tokens) diffusers drops the masked tokens and is 15% away: ComfyUI never masks.
"""

import dataclasses
import hashlib
import io as bytes_io
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/lumina2")
SEED = 2304
BUDGET = 4_000_000

# NextDiT kwargs: model_detection.py's Lumina 2 settings (dim 2304 branch) at tiny widths; 4 heads over 2 kv heads
# (n_rep 2) pin which q heads share a kv head, the unequal axes (4, 6, 6) pin the RoPE axis order.
DIT = dict(patch_size=2, in_channels=16, dim=64, n_layers=2, n_refiner_layers=2, n_heads=4, n_kv_heads=2,
           multiple_of=256, ffn_dim_multiplier=4.0, norm_eps=1e-5, qk_norm=True, cap_feat_dim=32,
           axes_dims=[4, 6, 6], axes_lens=[300, 512, 512], rope_theta=10000.0, z_image_modulation=False,
           time_scale=1.0, pad_tokens_multiple=None)
HEAD_DIM = DIT["dim"] // DIT["n_heads"]
FFN_HIDDEN = 256  # int(4.0 * 64) = 256, already a multiple of 256
# name: (batch, h, w, context tokens (None: the text encoder's `netayume` cond), sigmas)
DIT_CASES = {"a": (1, 8, 8, 5, [0.7]), "b": (2, 7, 10, 7, [0.9, 0.25]), "c": (1, 6, 6, None, [1.0])}
SAMPLING_TIMESTEPS = [1.0, 0.75, 0.5, 0.25, 0.001]

# Gemma 2 2B at tiny widths (released values in the docstring).
GEMMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0)
GEMMA_HEAD_DIM = 16
END_OF_TURN = 107
USER_SYMBOLS = (["<mask>", "[@BOS@]"] + [f"<unused{i}>" for i in range(100)]
                + ["<start_of_turn>", "<end_of_turn>", "\n"])
SPM_VOCAB = 600
CORPUS = [
    "You are an assistant designed to generate high quality anime images based on textual prompts.",
    "You are an assistant designed to generate superior images with the superior degree of image-text "
    "alignment based on textual prompts or user prompts.",
    "a girl with long silver hair under the night sky, stars, city lights",
    "a photo of a red cat sitting on a blue chair",
    "masterpiece, best quality, highly detailed anime illustration of a boy with green eyes",
    "blue sky with white clouds over the mountains, sunset, cinematic lighting",
    "a dog running in the park near the river at noon",
    "line one, line two, the old tower at the end of the street",
    "the quick brown fox jumps over the lazy dog",
    "two cats and three dogs playing with a yellow ball",
    "portrait of a woman wearing a black dress and a golden necklace",
    "Prompt Start: a small house in a forest, soft light, watercolor",
]
NETAYUME = ("You are an assistant designed to generate high quality anime images based on textual prompts. "
            "<Prompt Start> ")
PROMPTS = {
    "netayume": NETAYUME + "a girl with silver hair under the night sky",
    "empty": "",
    "weighted": "a (red:1.3) cat, (blue sky:0.8)",
    "end_of_turn": "a cat<end_of_turn>\n<start_of_turn>model\nblue sky",
    "newlines": "line one\nline two\n\nthe café at night 夜",
    "node_superior": None,  # CLIPTextEncodeLumina2's form, filled in from ComfyUI's node below
}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_module(draw, module):
    """Every state_dict entry re-drawn in f32: gains of RMSNorms 1 + 0.1 N (Gemma's `add` RMSNorms, which use
    1 + weight, get 0.1 N: the same effective gains), biases 0.1 N, weights and embedding tables
    N / sqrt(last dimension)."""
    norms = {n: getattr(m, "add", False) for n, m in module.named_modules()
             if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(m).__name__ == "RMSNorm"}
    out = {}
    for name, p in module.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner in norms and name.endswith(".weight"):
            v = draw.normal(p.shape, 0.1, 0.0 if norms[owner] else 1.0)
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


def train_spm():
    """A tiny SentencePiece BPE model with Gemma's settings, trained on CORPUS (one thread: deterministic). The user
    symbols reproduce Gemma's low ids: <mask> 4, [@BOS@] 5, <unused0..99> 6..105, <start_of_turn> 106,
    <end_of_turn> 107, "\\n" 108; then the 256 byte pieces <0x00>..<0xFF> 109..364; then merges and characters."""
    import sentencepiece as spm

    f = bytes_io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=f, model_type="bpe", vocab_size=SPM_VOCAB,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
        user_defined_symbols=USER_SYMBOLS, character_coverage=1.0, num_threads=1, minloglevel=2)
    proto = f.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=proto)
    assert sp.get_piece_size() == SPM_VOCAB
    assert [sp.id_to_piece(i) for i in (0, 1, 2, 3, 106, 107, 108, 109, 364)] == \
        ["<pad>", "</s>", "<s>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n", "<0x00>", "<0xFF>"]
    return proto


def tiny_config_class(llama):
    """Gemma2_2B_Config with the tiny sizes (llama.Gemma2_2B builds Gemma2_2B_Config(**config_dict) from the
    module's global; head_dim is a class attribute, so a subclass sets it)."""
    real = llama.Gemma2_2B_Config
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in {**GEMMA, "vocab_size": SPM_VOCAB}.items()]
    return dataclasses.make_dataclass("TinyGemma2_2B_Config", fields, bases=(real,),
                                      namespace={"head_dim": GEMMA_HEAD_DIM})


def load_te(sd):
    """ComfyUI's own loader for a lone text-encoder file (what CLIPLoader type `lumina2` runs): detect_te_model
    says GEMMA_2_2B, clip_target = lumina2.te(**llama_detect(sd)) with LuminaTokenizer, tokenizer_data
    {"spiece_model": sd["spiece_model"]}; comfy.sd.CLIP loads the state dict (strict=False)."""
    import comfy.sd
    import comfy.text_encoders.llama as llama

    assert comfy.sd.detect_te_model(sd) == comfy.sd.TEModel.GEMMA_2_2B
    real = llama.Gemma2_2B_Config
    llama.Gemma2_2B_Config = tiny_config_class(llama)
    try:
        clip = comfy.sd.load_text_encoder_state_dicts([dict(sd)], clip_type=comfy.sd.CLIPType.LUMINA2)
    finally:
        llama.Gemma2_2B_Config = real
    return clip


def comfy_spm_ids(sp, text):
    """ComfyUI's token ids restated from the sentencepiece package (for the cross-check): SPieceTokenizer.__call__
    encodes with BOS unless the text holds "<end_of_turn>", in which case it splits on it, encodes the parts
    WITHOUT BOS and puts 107 between; SDTokenizer then drops the first id of every call (tokens_start 1)."""
    import re

    if "<end_of_turn>" in text:
        ids = []
        for part in re.split("(<end_of_turn>)", text):
            if part == "<end_of_turn>":
                ids.append(END_OF_TURN)
            elif part:
                ids += sp.encode(part, add_bos=False, add_eos=False)
    else:
        ids = sp.encode(text, add_bos=True, add_eos=False)
    return ids[1:]


def te_fixture():
    import comfy.ops
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.lumina2 as lumina2_te
    import sentencepiece as spm
    from comfy_extras.nodes_lumina2 import CLIPTextEncodeLumina2

    PROMPTS["node_superior"] = f"{CLIPTextEncodeLumina2.SYSTEM_PROMPT['superior']} <Prompt Start> a cat"
    proto = train_spm()
    sp = spm.SentencePieceProcessor(model_proto=proto)

    # Draw the weights on a directly built model (the names and shapes ComfyUI's Gemma2_2B has).
    real = llama.Gemma2_2B_Config
    llama.Gemma2_2B_Config = tiny_config_class(llama)
    try:
        shape_model = llama.Gemma2_2B({}, torch.float32, "cpu", comfy.ops.manual_cast)
    finally:
        llama.Gemma2_2B_Config = real
    weights = draw_module(Draw(SEED + 2), shape_model)
    del shape_model
    weights["spiece_model"] = torch.frombuffer(bytearray(proto), dtype=torch.uint8).clone()
    save_file(weights, f"{OUT}/te.safetensors")
    weights = load_file(f"{OUT}/te.safetensors")
    assert weights["spiece_model"].numpy().tobytes() == proto

    clip = load_te(weights)
    te = clip.cond_stage_model
    g2 = te.gemma2_2b
    inner = g2.transformer
    cfg = inner.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta,
            cfg.transformer_type, cfg.rms_norm_add, cfg.mlp_activation, cfg.qkv_bias, cfg.q_norm,
            cfg.sliding_attention, cfg.final_norm) == \
        (32, 64, 3, 4, 2, GEMMA_HEAD_DIM, SPM_VOCAB, 1e-6, 10000.0, "gemma2", True, "gelu_pytorch_tanh", False,
         None, None, True)
    assert (g2.layer, g2.layer_idx, g2.layer_norm_hidden_state, g2.enable_attention_masks,
            g2.return_attention_masks, g2.zero_out_masked, g2.special_tokens) == \
        ("hidden", -2, False, True, True, False, {"start": 2, "pad": 0})
    check_loaded(inner, {k: v for k, v in weights.items() if k != "spiece_model"})
    tok = clip.tokenizer.gemma2_2b
    assert isinstance(clip.tokenizer, lumina2_te.LuminaTokenizer)
    assert (tok.tokens_start, tok.start_token, tok.end_token, tok.pad_token, tok.min_length) == (1, 2, None, 0, 1)
    assert clip.tokenizer.state_dict()["spiece_model"].numpy().tobytes() == proto

    io, cases = {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = clip.tokenize(prompt)
            assert set(tokens) == {"gemma2_2b"} and len(tokens["gemma2_2b"]) == 1
            ids = [int(t[0]) for t in tokens["gemma2_2b"][0]]
            w = [float(t[1]) for t in tokens["gemma2_2b"][0]]
            out = clip.encode_from_tokens(tokens, return_dict=True)
            assert set(out) == {"cond", "pooled_output", "attention_mask"}, sorted(out)
            assert out["pooled_output"] is None
            cond, mask = out["cond"], out["attention_mask"]
            assert cond.shape == (1, len(ids), GEMMA["hidden_size"]) and mask.shape == (1, len(ids))
            assert cond.dtype == torch.float32 and torch.isfinite(cond).all()
            io[f"{name}.cond"] = cond
            io[f"{name}.attention_mask"] = mask.float()
            cases[name] = {"prompt": prompt, "ids": ids, "weights": w,
                           "tokenize_with_weights": {"gemma2_2b": [[[i, x] for i, x in zip(ids, w)]]},
                           "cond_shape": list(cond.shape), "attention_mask": mask[0].tolist(),
                           "pooled_output": None, "encode_keys": sorted(out)}
            print(f"encoder {name}: {len(ids)} ids {ids[:12]}{'...' if len(ids) > 12 else ''}, weights "
                  f"{sorted(set(w))}, cond std {cond.std():.3f}, max |cond| {cond.abs().max():.3f}")

        # Tokenizer facts.
        assert cases["empty"]["ids"] == [2] and cases["empty"]["attention_mask"] == [1]
        assert all(all(c["attention_mask"]) for c in cases.values())
        assert END_OF_TURN in cases["end_of_turn"]["ids"]
        assert any(x != 1.0 for x in cases["weighted"]["weights"])
        assert 108 in cases["newlines"]["ids"] and any(109 <= i <= 364 for i in cases["newlines"]["ids"])
        for name, case in cases.items():
            want = [2] + (comfy_spm_ids(sp, case["prompt"]) if name != "weighted" else
                          [i for seg in ("a ", "red", " cat, ", "blue sky") for i in comfy_spm_ids(sp, seg)])
            assert case["ids"] == want, (name, case["ids"], want)
            plain = sp.encode(case["prompt"], add_bos=False, add_eos=False)
            case["sentencepiece_ids"] = plain
            case["equals_bos_plus_sentencepiece"] = case["ids"] == [2] + plain
        assert not cases["end_of_turn"]["equals_bos_plus_sentencepiece"]
        assert cases["end_of_turn"]["ids"] == [2] + cases["end_of_turn"]["sentencepiece_ids"][1:]
        assert not cases["weighted"]["equals_bos_plus_sentencepiece"]
        assert all(c["equals_bos_plus_sentencepiece"] for n, c in cases.items() if n not in ("end_of_turn",
                                                                                               "weighted"))
        w = cases["weighted"]
        assert w["weights"] == [1.0] + [1.0] * len(comfy_spm_ids(sp, "a ")) + [1.3] * len(comfy_spm_ids(sp, "red")) \
            + [1.0] * len(comfy_spm_ids(sp, " cat, ")) + [0.8] * len(comfy_spm_ids(sp, "blue sky"))

        # The weighted prompt: the unweighted forward moved away from the appended empty sequence
        # (gen_empty_tokens: [2, 0, 0, ...], mask [1, 0, 0, ...]).
        n = len(w["ids"])
        both, _, extra = g2([w["ids"], [2] + [0] * (n - 1)])
        assert extra["attention_mask"][1].tolist() == [1] + [0] * (n - 1)
        wt = torch.tensor(w["weights"])[None, :, None]
        lerp = torch.where(wt != 1.0, (both[0:1] - both[1:2]) * wt + both[1:2], both[0:1])
        err = rel_err(io["weighted.cond"], lerp)
        print(f"weighted prompt: cond vs (z - z_empty) * w + z_empty {err:.2e}")
        assert err < 1e-6
        io["weighted.unweighted"] = both[0:1]
        io["weighted.empty"] = both[1:2]
        te_cross_check(weights, cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "seed": SEED + 2,
            "gemma_config": {**GEMMA, "head_dim": GEMMA_HEAD_DIM, "vocab_size": SPM_VOCAB,
                             "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": GEMMA_HEAD_DIM,
                             "attn_logit_softcapping": None, "sliding_window": None, "rms_norm_add": True,
                             "embed_scale": GEMMA["hidden_size"] ** 0.5, "layer": "hidden", "layer_idx": -2,
                             "output_layer_index": GEMMA["num_hidden_layers"] - 2, "final_norm_applied": False},
            "tokenizer": {"spm_model_type": "bpe", "vocab_size": SPM_VOCAB, "pad_id": 0, "eos_id": 1, "bos_id": 2,
                          "unk_id": 3, "normalization": "identity", "add_dummy_prefix": False,
                          "remove_extra_whitespaces": False, "byte_fallback": True, "split_digits": True,
                          "user_defined_symbols": USER_SYMBOLS, "spiece_model_bytes": len(proto),
                          "spiece_model_sha256": hashlib.sha256(proto).hexdigest(),
                          "comfy_special_tokens": {"<end_of_turn>": END_OF_TURN}, "start_token": 2,
                          "tokens_start": 1, "pad_token": 0, "min_length": 1, "end_token": None},
            "corpus": CORPUS,
            "node_template": "CLIPTextEncodeLumina2: f'{system_prompt} <Prompt Start> {user_prompt}'",
            "node_system_prompts": CLIPTextEncodeLumina2.SYSTEM_PROMPT,
            "weighted_rule": "cond[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] where w_j != 1; z_empty is the "
                             "same model on [2, 0, 0, ...] (mask [1, 0, 0, ...]) in the same batch; "
                             "te_io's weighted.unweighted / weighted.empty are z and z_empty",
            "cases": cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")
    return io


def te_cross_check(weights, cases, io):
    """transformers' Gemma2Model with the same weights: attn_logit_softcapping None (ComfyUI has none),
    query_pre_attn_scalar = head_dim (ComfyUI's SDPA scale 1/sqrt(head_dim)), sliding window past the prompts."""
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(vocab_size=SPM_VOCAB, **{k: v for k, v in GEMMA.items() if k != "rope_theta"},
                          head_dim=GEMMA_HEAD_DIM, hidden_activation="gelu_pytorch_tanh",
                          query_pre_attn_scalar=GEMMA_HEAD_DIM, attn_logit_softcapping=None,
                          final_logit_softcapping=None, sliding_window=4096, max_position_embeddings=8192,
                          rope_parameters={"rope_theta": GEMMA["rope_theta"], "rope_type": "default"},
                          pad_token_id=0, attn_implementation="eager")
    net = Gemma2Model(config).eval()
    net.load_state_dict({k[len("model."):]: v for k, v in weights.items() if k != "spiece_model"}, strict=True)
    seen = {}
    net.layers[GEMMA["num_hidden_layers"] - 2].register_forward_hook(
        lambda m, a, o: seen.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    for name, case in cases.items():
        ids = torch.tensor([case["ids"]])
        out = net(input_ids=ids, output_hidden_states=True)
        hs = out.hidden_states
        assert len(hs) == GEMMA["num_hidden_layers"] + 1
        assert torch.equal(hs[-2], seen["h"])
        if name == "weighted":
            n = ids.shape[1]
            empty = net(input_ids=torch.tensor([[2] + [0] * (n - 1)]),
                        attention_mask=torch.tensor([[1] + [0] * (n - 1)]), output_hidden_states=True)
            wt = torch.tensor(case["weights"])[None, :, None]
            e = empty.hidden_states[-2]
            want = torch.where(wt != 1.0, (hs[-2] - e) * wt + e, hs[-2])
        else:
            want = hs[-2]
        report(f"transformers Gemma2Model hidden_states[-2] vs ComfyUI cond, {name}",
               rel_err(io[f"{name}.cond"], want), 1e-5)
        # The final norm is NOT part of ComfyUI's cond: last_hidden_state is far from it.
        assert rel_err(io[f"{name}.cond"], out.last_hidden_state) > 0.1, name
    # Gemma 2's released config soft-caps the attention logits at 50 (transformers' default); ComfyUI does not.
    capped = Gemma2Model(Gemma2Config(**{**config.to_dict(), "attn_logit_softcapping": 50.0})).eval()
    capped.load_state_dict(net.state_dict(), strict=True)
    h = capped(input_ids=torch.tensor([cases["netayume"]["ids"]]), output_hidden_states=True).hidden_states[-2]
    err = rel_err(h, io["netayume.cond"])
    CROSS.append(f"transformers Gemma2Model WITH attn_logit_softcapping 50 (the released config) vs ComfyUI, "
                 f"netayume: {err:.2e} (tiny logits here; ComfyUI never caps)")
    print(f"  with attn_logit_softcapping 50: {err:.2e}")


# ----------------------------------------------------------------------------------------------------- the DiT


def build_dit():
    import comfy.ops
    from comfy.ldm.lumina.model import NextDiT

    return NextDiT(**DIT, operations=comfy.ops.manual_cast, dtype=torch.float32).eval()


def dit_fixture(te_io):
    import comfy.model_detection
    import comfy.samplers
    import comfy.supported_models

    model = build_dit()
    weights = draw_module(Draw(SEED), model)
    assert weights["layers.0.feed_forward.w1.weight"].shape == (FFN_HIDDEN, DIT["dim"])
    assert weights["layers.0.attention.qkv.weight"].shape == ((DIT["n_heads"] + 2 * DIT["n_kv_heads"]) * HEAD_DIM,
                                                               DIT["dim"])
    assert weights["t_embedder.mlp.0.weight"].shape == (min(DIT["dim"], 1024), 256)
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    model.load_state_dict(weights, strict=True)
    check_loaded(model, weights)

    detected = comfy.model_detection.detect_unet_config(weights, "")
    picked = comfy.model_detection.model_config_from_unet(weights, "")
    print(f"detect_unet_config: {detected}; model config {type(picked).__name__}")
    assert detected["image_model"] == "lumina2" and "n_heads" not in detected
    assert type(picked).__name__ == "Lumina2"

    # ComfyUI's model_base path: supported_models.Lumina2 built from the tiny config.
    mc = comfy.supported_models.Lumina2({"image_model": "lumina2", **DIT})
    mc.set_inference_dtype(torch.float32, None)
    based = mc.get_model({})
    based.diffusion_model.load_state_dict(weights, strict=True)
    ms = based.model_sampling
    assert (type(ms).__name__, ms.shift, ms.multiplier) == ("ModelSampling", 6.0, 1.0), (type(ms), ms.shift)
    assert type(mc.latent_format).__name__ == "Flux"

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas) in DIT_CASES.items():
            x = torch.randn(b, 16, h, w, generator=g)
            context = torch.randn(b, n, DIT["cap_feat_dim"], generator=g) if n is not None else te_io["netayume.cond"]
            sigma = torch.tensor(sigmas)
            t = ms.timestep(sigma).float()
            out = model(x, t, context, context.shape[1], transformer_options={})
            assert out.shape == x.shape and torch.isfinite(out).all()
            conds = based.extra_conds(cross_attn=context, device="cpu", noise=x)
            assert set(conds) == {"c_crossattn", "num_tokens"} and conds["num_tokens"].cond == context.shape[1]
            assert type(conds["c_crossattn"]).__name__ == "CONDRegular"
            denoised = based.apply_model(x, sigma, c_crossattn=conds["c_crossattn"].cond,
                                         num_tokens=conds["num_tokens"].cond)
            err = rel_err(denoised, x - out * sigma.view(-1, 1, 1, 1))
            print(f"DiT case {name}: x {tuple(x.shape)}, context {tuple(context.shape)}, sigma {sigmas}, "
                  f"out std {out.std():.3f} max {out.abs().max():.3f}; denoised vs x - out * sigma {err:.2e}")
            assert err < 1e-6
            io.update({f"{name}.x": x, f"{name}.sigma": sigma, f"{name}.timestep": t, f"{name}.context": context,
                       f"{name}.out": out, f"{name}.denoised": denoised})
            cases[name] = {"x": list(x.shape), "context": list(context.shape), "sigma": sigmas,
                           "timestep": t.tolist(), "internal_t": (1.0 - t).tolist(), "num_tokens": context.shape[1],
                           "padded_hw": [h + (-h % 2), w + (-w % 2)], "tokens": context.shape[1] +
                           (h + (-h % 2)) * (w + (-w % 2)) // 4, "out": list(out.shape),
                           "context_from": "randn" if n is not None else "te_io netayume.cond"}

        # The attention mask is ignored by NextDiT (patchify_and_embed sets cap_mask = None): a mask with zeros,
        # passed as model_base.Lumina2.extra_conds passes it, changes nothing.
        x, context, sigma = io["b.x"], io["b.context"], io["b.sigma"]
        mask = torch.ones(2, context.shape[1])
        mask[1, 4:] = 0
        conds = based.extra_conds(cross_attn=context, attention_mask=mask, device="cpu", noise=x)
        assert set(conds) == {"c_crossattn", "num_tokens", "attention_mask"}
        assert conds["num_tokens"].cond == int(mask.sum())
        masked = based.apply_model(x, sigma, c_crossattn=context, attention_mask=conds["attention_mask"].cond,
                                   num_tokens=conds["num_tokens"].cond)
        assert torch.equal(masked, io["b.denoised"])
        cases["b"]["mask_ignored"] = ("apply_model with attention_mask [[1]*7, [1]*4 + [0]*3] and num_tokens 11 "
                                      "(what extra_conds gives) is bitwise the unmasked denoised")
        print("case b with an attention mask (zeros in sample 1): bitwise identical (mask ignored)")

        # Intermediates for case a (forward hooks on ComfyUI's modules).
        seen = {}
        hooks = [model.t_embedder.register_forward_hook(lambda m, a, o: seen.__setitem__("t", o)),
                 model.context_refiner[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("cap", o)),
                 model.noise_refiner[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("img", o))]
        again = model(io["a.x"], io["a.timestep"], io["a.context"], 5, transformer_options={})
        for hook in hooks:
            hook.remove()
        assert torch.equal(again, io["a.out"])
        io["a.adaln_input"], io["a.cap_refined"], io["a.img_refined"] = seen["t"], seen["cap"], seen["img"]
        cases["a"]["intermediates"] = {
            "a.adaln_input": "t_embedder(1 - timestep) [1, 64]: sinusoid [cos, sin] of 256, Linear, SiLU, Linear",
            "a.cap_refined": "cap_embedder(context) after the context_refiner blocks [1, 5, 64]",
            "a.img_refined": "x_embedder(patches) after the noise_refiner blocks [1, 16, 64]"}

        # Sampling: ModelSamplingDiscreteFlow, shift 6, multiplier 1.
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
        want = [6 * t / (1 + 5 * t) for t in SAMPLING_TIMESTEPS]
        assert max(abs(a - b) for a, b in zip(sampling["sigma_of_timestep"], want)) < 1e-6
        lf = mc.latent_format
        latent = {"class": "Flux", "scale_factor": lf.scale_factor, "shift_factor": lf.shift_factor,
                  "process_in": "(latent - shift_factor) * scale_factor",
                  "process_out": "latent / scale_factor + shift_factor"}
        dit_cross_check(weights, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({"seed": SEED, "nextdit_kwargs": DIT, "head_dim": HEAD_DIM, "ffn_hidden": FFN_HIDDEN,
                   "t_embedder_width": min(DIT["dim"], 1024), "adaln_in": min(DIT["dim"], 1024),
                   "storage": "every tensor f32",
                   "timestep_is": "model_sampling.timestep(sigma) = sigma (multiplier 1.0); NextDiT embeds "
                                  "1 - timestep (model.py:830), time_scale 1.0, and returns the NEGATED "
                                  "final layer output (model.py:874)",
                   "denoised_is": "x - out * sigma (CONST)",
                   "sampling": sampling, "latent_format": latent, "cases": cases,
                   "comfy_detection": {"detect_unet_config": {k: jsonable(v) for k, v in detected.items()},
                                       "model_config": type(picked).__name__,
                                       "note": "dim 64 is not 2304, so detection leaves n_heads, n_kv_heads, "
                                               "axes_dims, axes_lens, rope_theta, ffn_dim_multiplier at NextDiT's "
                                               "defaults (32 heads, axes (16, 56, 56), ...): that config cannot "
                                               "even be built (dim // n_heads != sum(axes_dims)); the fixtures "
                                               "build the tiny model with the Lumina 2 settings directly"}},
                  f, indent=1)
        f.write("\n")


RENAMES = (("final_layer.adaLN_modulation.1", "norm_out.linear_1"), ("final_layer.linear", "norm_out.linear_2"),
           ("attention_norm1", "norm1.norm"), ("attention_norm2", "norm2"),
           ("cap_embedder", "time_caption_embed.caption_embedder"),
           ("t_embedder.mlp.0", "time_caption_embed.timestep_embedder.linear_1"),
           ("t_embedder.mlp.2", "time_caption_embed.timestep_embedder.linear_2"),
           ("attention", "attn"), (".out.", ".to_out.0."), ("k_norm", "norm_k"), ("q_norm", "norm_q"),
           ("w1", "linear_1"), ("w2", "linear_2"), ("w3", "linear_3"), ("adaLN_modulation.1", "norm1.linear"))


def to_diffusers(sd):
    """ComfyUI's NextDiT names to diffusers' Lumina2Transformer2DModel: diffusers'
    single_file_utils.convert_lumina2_to_diffusers restated with the tiny q/k/v split (it hard-codes 2304/768)."""
    q_dim, kv_dim = DIT["n_heads"] * HEAD_DIM, DIT["n_kv_heads"] * HEAD_DIM
    out = {}
    for key, v in sd.items():
        k = key
        for i in range(DIT["n_refiner_layers"]):
            k = k.replace(f"context_refiner.{i}.attention_norm1", f"context_refiner.{i}.norm1")
            k = k.replace(f"context_refiner.{i}.attention_norm2", f"context_refiner.{i}.norm2")
        for a, b in RENAMES:
            k = k.replace(a, b)
        if "qkv" in k:
            q, kk, vv = torch.split(v, [q_dim, kv_dim, kv_dim], dim=0)
            out.update({k.replace("qkv", "to_q"): q, k.replace("qkv", "to_k"): kk, k.replace("qkv", "to_v"): vv})
        else:
            out[k] = v
    return out


def dit_cross_check(weights, io):
    from diffusers import Lumina2Transformer2DModel

    net = Lumina2Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, hidden_size=DIT["dim"], num_layers=DIT["n_layers"],
        num_refiner_layers=DIT["n_refiner_layers"], num_attention_heads=DIT["n_heads"],
        num_kv_heads=DIT["n_kv_heads"], multiple_of=DIT["multiple_of"], ffn_dim_multiplier=None,
        norm_eps=DIT["norm_eps"], axes_dim_rope=tuple(DIT["axes_dims"]), axes_lens=tuple(DIT["axes_lens"]),
        cap_feat_dim=DIT["cap_feat_dim"]).eval()
    result = net.load_state_dict(to_diffusers(weights), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    qk = [m for name, m in net.named_modules() if name.endswith(("norm_q", "norm_k"))]
    assert len(qk) == 2 * 3 * 2 and all(m.eps == 1e-5 for m in qk)

    def run(name, mask=None):
        x = io[f"{name}.x"]
        b, c, h, w = x.shape
        padded = torch.nn.functional.pad(x, (0, -w % 2, 0, -h % 2), mode="circular")
        context = io[f"{name}.context"]
        if mask is None:
            mask = torch.ones(context.shape[:2], dtype=torch.bool)
        # diffusers' pipeline feeds 1 - sigma and negates the output (pipeline_lumina2.py); ComfyUI does both
        # inside NextDiT.
        out = net(padded, 1.0 - io[f"{name}.sigma"], context, mask, return_dict=False)[0]
        return -out[..., :h, :w]

    stock = {name: rel_err(run(name), io[f"{name}.out"]) for name in DIT_CASES}
    for m in qk:
        m.eps = torch.finfo(torch.float32).eps  # ComfyUI's q_norm / k_norm: RMSNorm(head_dim) with eps None
    for name in DIT_CASES:
        report(f"diffusers Lumina2Transformer2DModel (q/k norm eps = f32 eps) vs ComfyUI, DiT case {name}",
               rel_err(run(name), io[f"{name}.out"]), 1e-5)
    print(f"  (diffusers with its own q/k eps 1e-5: {', '.join(f'{k} {v:.2e}' for k, v in stock.items())})")
    CROSS.append("diffusers stock (q/k eps 1e-5): " + ", ".join(f"{k} {v:.2e}" for k, v in stock.items()))
    mask = torch.ones(io["b.context"].shape[:2], dtype=torch.bool)
    mask[1, 4:] = False
    masked = rel_err(run("b", mask), io["b.out"])
    CROSS.append(f"diffusers with a real caption mask on case b (sample 1: 4 of 7 tokens) vs ComfyUI: {masked:.2e} "
                 "(ComfyUI ignores the mask)")
    print(f"  diffusers with a caption mask on case b: {masked:.2e} (ComfyUI has no mask)")
    assert masked > 1e-3


def main():
    import_comfyui(node_modules=True)
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
