"""Fixtures for Boogu-Image (engine/models/tests/fixtures/boogu/): its DiT (ComfyUI's BooguTransformer2DModel,
comfy/ldm/boogu/model.py, an OmniGen2 derivative with double-stream blocks before the single-stream ones) and its
text encoder (Qwen3-VL 8B's language model as ComfyUI's comfy/text_encoders/boogu.py builds it over qwen3vl.py, with
ComfyUI's Qwen tokenizer and BooguTokenizer's templates), each a tiny random network built by ComfyUI's own classes,
and what ComfyUI computes with it. Follows scripts/reference/omnigen2.py (OmniGen2 is Boogu's parent; what is said
there of the shared OmniGen2 parts holds here and is only summarised).

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; the reference
venv of scripts/reference/setup.sh, with comfy-kitchen; comfy.sd imports torchaudio, for which comfyui.py puts an
empty stand-in on the path when it is missing; BOOGU_DIR is optional: a checkout of boogu-project/Boogu-Image
(df9a219f, the original diffusers-based code ComfyUI ported; only its boogu/ package is imported) for the DiT
cross-check):
    COMFYUI_DIR=/path/to/ComfyUI [BOOGU_DIR=/path/to/Boogu-Image] $(scripts/reference/setup.sh) \\
        scripts/reference/boogu.py
It takes about 25 s on the CPU (ComfyUI builds the full-size Qwen3-VL vision tower, unloaded, about 2 GB) and is
reproducible: a second run, with or without BOOGU_DIR, writes byte-identical files (every random value comes from
seeded torch generators; nothing is written from the cross-checks).

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; bg.py is comfy/ldm/boogu/model.py, og2.py
comfy/ldm/omnigen/omnigen2.py):
- Detection, model_detection.py:869-877: the key `double_stream_layers.0.img_instruct_attn.processor.img_to_q.weight`
  -> image_model "boogu" (tested BEFORE omnigen2's key, which a Boogu file also has) with hidden_size = x_embedder
  rows, num_layers = the count of single_stream_layers, num_double_stream_layers, num_refiner_layers (noise_refiner
  count) and instruction_feat_dim (caption_embedder.0 width) read from the file; everything else is the class default
  (bg.py:171-191): num_attention_heads 28, num_kv_heads 7, axes_dim_rope (40, 40, 40), axes_lens (2048, 1664, 1664),
  multiple_of 256, ffn_dim_multiplier None, norm_eps 1e-5, timestep_scale 1000.0, patch 2, in_channels 16. The tiny
  file is detected as boogu (recorded in dit_cases.json `comfy_detection`) but its 4 heads cannot be built from that
  detection, so the fixtures build the class directly with the tiny widths and the defaults.
  supported_models.py:1843-1862 Boogu(Omnigen2): sampling multiplier 1.0, shift 3.16, latent format Flux
  (latent_formats.py:160-164: scale 0.3611, shift 0.1159), the rest inherited from Omnigen2 (:1809-1841).
- model_base.py:2380-2383 Boogu(Omnigen2): Omnigen2's __init__ skipped, BaseModel built with BooguTransformer2DModel,
  ModelType.FLOW; extra_conds is Omnigen2's (:2358-2371): num_tokens = sum(attention_mask), the mask passed on only
  when it holds a zero (and then forward fails: `mask_with_zeros` in dit_cases.json), c_crossattn CONDRegular,
  `reference_latents` -> ref_latents = CONDList(process_latent_in(lat)) = (lat - 0.1159) * 0.3611, repeated to the
  batch by CONDList.process_cond (conds.py:121-126). _apply_model (:210-252): timestep = sigma (multiplier 1),
  denoised = x - out * sigma (CONST). ModelSamplingDiscreteFlow: sigma(t) = 3.16 t / (1 + 2.16 t).
- bg.py:255-318 forward(x, timesteps, context, num_tokens, ref_latents, attention_mask): x padded to the patch
  (circular, common_dit.py:5-13); t = 1 - timesteps (:259); temb, caption = time_caption_embed (og2.py:85-99:
  Timesteps(256, flip_sin_to_cos, scale 1000) -> Linear(256, 64) SiLU Linear; RMSNorm(32, gain) -> Linear(32, 64)
  with bias); patches 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' (og2.py:354-387, references padded and concatenated);
  RoPE positions og2.py:197-266 (caption i -> (i, i, i); reference j -> (L + sum_{k<j} max(h_k, w_k), row, col);
  image -> (L + sum_k max(h_k, w_k), row, col), patch units; axes (4, 6, 6) -> pairs 0..1 t, 2..4 h, 5..7 w, theta
  10000, interleaved pairs (x[2i], x[2i+1]), flux/math.py:17-29); context_refiner on the caption with the text mask
  (None in practice), img_patch_embed_and_refine (og2.py:389-412, reused, bg.py:251-253: x_embedder, ref embedder +
  image_index_embedding[j], noise_refiner on the image alone, ref_image_refiner on ALL of a sample's references as ONE
  sequence, then [references, image]); then the double-stream stage (bg.py:296-306) with the joint table (caption,
  references, image) and, for the image self-attention, its image part rotary_emb[:, L:] (:299), both attention masks
  None; then [caption, references, image] through single_stream_layers (OmniGen2TransformerBlock, og2.py:150-194,
  mask None); norm_out (og2.py:56-69: LayerNorm eps 1e-6 no affine * (1 + Linear(SiLU(temb))), Linear(64 -> 64)); the
  last image tokens unpatchified, cropped, NEGATED (:318).
- bg.py:110-167 BooguDoubleStreamBlock (restated in dit_cases.json `double_stream_block`): five LuminaRMSNormZero
  (og2.py:42-53: Linear(min(dim, 1024) -> 4 dim, bias)(SiLU(temb)) chunked (scale, gate, scale_mlp, gate_mlp), out =
  RMSNorm(x) * (1 + scale)) on the block's input: img_norm1 (attention input, gate_msa, scale_mlp, gate_mlp),
  img_norm2 (MLP input; its SECOND chunk, a gate in OmniGen2's naming, is used as a SHIFT, :144, :158), img_norm3
  (self-attention input, its second chunk the self-attention gate, :145), instruct_norm1, instruct_norm2 (likewise
  :148, :163); the last two chunks of img_norm2, img_norm3 and instruct_norm2 are unused. Joint attention (bg.py:27-
  107): img_to_{q,k,v} on the image stream, instruct_to_{q,k,v} on the caption, concatenated [caption; image stream],
  heads (4 over 2 kv), img_instruct_attn.norm_q / norm_k (RMSNorm(16), eps 1e-5, gain), RoPE, SDPA (GQA: q head i uses
  kv head i // 2, scale 1/4), then instruct_out on the caption rows and img_out on the image rows, THEN
  img_instruct_attn.to_out.0 on both (two projections in series, no biases). Image self-attention: img_self_attn
  (og2.py:102-147 Attention) on img_norm3's output. Residuals (bg.py:156-165): img += tanh(g) * img_attn_norm(joint
  image rows); img += tanh(g_self) * img_self_attn_norm(self); img += tanh(g_mlp) * img_ffn_norm2(img_feed_forward(
  img_ffn_norm1((1 + scale_mlp) * norm2_out + shift))); the caption alike with instruct_attn_norm, instruct_ffn_norm1/2
  and instruct_feed_forward (no self-attention). Every feed-forward is LuminaFeedForward (og2.py:72-82): inner =
  multiple_of * ceil(4 dim / multiple_of) (ffn_dim_multiplier ignored; released 3360 -> 13568 by that rule),
  linear_2(silu(linear_1 x) * linear_3 x), no biases.
- Text encoder: sd.py:1872-1875, CLIPLoader type `boogu` with a QWEN3VL_8B file: the state dict renamed
  (model.language_model. -> model., model.visual. -> visual., lm_head. -> model.lm_head.), boogu.te(**llama_detect)
  (dtype = model.norm.weight's, sd.py:1683-1691) and BooguTokenizer. detect_te_model (sd.py:1645-1646) says
  QWEN3VL_8B only when `model.visual.deepstack_merger_list.0.norm.weight` is present (and model.visual.merger
  .linear_fc2.weight has other than 2560 rows): the vision tower's keys, in transformers' names, which is why the
  file is written in transformers' / Comfy-Org's layout (`model.language_model.*`). boogu.py:36-58: BooguTEModel =
  SD1ClipModel named qwen3vl_8b over BooguQwen3VLClipModel = Qwen3VLClipModel (qwen3vl.py:123-138: SDClipModel,
  layer "hidden", layer_idx -1, special tokens {"pad": 151643} only, attention masks enabled and returned) with
  layer_norm_hidden_state True: the last layer's output through the final norm (Llama2_ forward, llama.py:816-944:
  the intermediate of layer -1 normed; the same as the final state). qwen3vl.py:50-113 Qwen3VL: the decoder Llama2_
  (llama.py:754) with QWEN3VL_CONFIGS["qwen3vl_8b"] = Qwen3VL_8BConfig (llama.py:276-280 over Qwen3_8BConfig :249-273:
  vocab 151936, hidden 4096, intermediate 12288, 36 layers, 32 heads / 8 kv of head_dim 128, eps 1e-6, theta 5e6, no
  q/k/v biases, q_norm / k_norm "gemma3" = RMSNorm(head_dim, eps 1e-6, gain w) per head BEFORE RoPE (llama.py:562-
  565), silu MLP, final norm, lm_head True, rope_dims [24, 20, 20], interleaved_mrope True) AND the vision tower
  (qwen3vl.py:58-59, always built, QWEN3VL_VISION :14-20). Text only (no image embeds): build_image_inputs returns no
  position ids (:70-74, :98-99), Llama2_ uses arange(N) as ONE row (llama.py:828-829), and precompute_freqs_cis
  (:445-490) takes the plain branch (:473-483): 1-D rotate-half RoPE at 0..N-1, theta 5e6 (apply_rope :492-509).
  Checked: ComfyUI's own M-RoPE tables for three equal rows (t, t, t) equal the one-row tables at head 128 and 8, and
  the tiny model run with explicit 3-row positions gives the same conds (te_cases.json `rope_checks`: all 0). Masks
  (llama.py:833-843): padding keys and the causal triangle each finfo.min / 4, added (no padding here).
- Tokenizer, qwen3vl.py:147-196 and boogu.py:20-33: Qwen3VLSDTokenizer = SDTokenizer(transformers' Qwen2Tokenizer on
  comfy/text_encoders/qwen25_tokenizer, no start / end token, pad 151643, min_length 1, max_length 99999999, no
  padding). BooguTokenizer.tokenize_with_weights: the "drop" template (system prompt BOOGU_DROP_SYSTEM, boogu.py:17,
  :27) when text.strip() == "" and no images, else the t2i template (BOOGU_T2I_SYSTEM, :16, :24); thinking=True, so
  Qwen3VLTokenizer (:162-196) appends nothing (its default thinking=False would append "<think>\\n\\n</think>\\n\\n",
  checked); no "<|im_start|>assistant\\n"; a text starting with "<|im_start|>" skips the template. The templated text
  goes to SD1Tokenizer with disable_weights=True (:187): "(red:1.3)" is NOT a weight, it is literal text, every weight
  is 1.0 and the ids are Qwen2Tokenizer's on the whole templated string in one call (checked for every prompt);
  escape_important / unescape_important still run (sd1_clip.py:368-376, :584-593), so "\\(" and "\\)" lose their
  backslash (te_cases.json `tokenizer_only.escaped`). With all weights 1, ClipTokenWeightEncoder (sd1_clip.py:27-76)
  returns the model's output as is; sd.py:395-418 CLIP.encode_from_tokens(return_dict=True): {"cond",
  "pooled_output": None, "attention_mask"}.

The tiny configs (in brackets: BooguTransformer2DModel's defaults, which are the released widths, and Qwen3-VL 8B's):
- DiT, BooguTransformer2DModel kwargs: patch_size 2, in_channels 16, out_channels None (16), hidden_size 64 [3360],
  num_layers 2 (single-stream only) [32], num_double_stream_layers 2 [8], num_refiner_layers 2 [2],
  num_attention_heads 4 [28], num_kv_heads 2 [7] (n_rep 2 [4]), head 16 [120] = sum(axes_dim_rope) (4, 6, 6)
  [(40, 40, 40)] (unequal: the axis order is pinned), axes_lens (2048, 1664, 1664) (unused by ComfyUI), multiple_of
  256 -> FFN inner 256 [13568] (4 * hidden is the floor; any multiple_of dividing 256 gives the same, and 256 is what
  ComfyUI builds every detected file with), ffn_dim_multiplier None, norm_eps 1e-5, instruction_feat_dim 32 [4096]
  (= the tiny encoder's width: case c feeds its cond), timestep_scale 1000.0, adaLN / timestep width min(64, 1024) =
  64 [1024]. 1,079,968 parameters, 4.34 MB in f32: twelve feed-forwards of 49,152 at the 4 * hidden floor and sixteen
  adaLN linears of 16,640 make most of it, and the double-stream blocks alone are 446,592.
- Qwen3-VL language model: ComfyUI's Qwen3VL with QWEN3VL_CONFIGS["qwen3vl_8b"] swapped for a Qwen3VL_8BConfig
  subclass (head_dim is a class attribute): hidden 32 [4096], intermediate 64 [12288], 2 layers [36], 4 heads [32]
  over 2 kv heads [8] of head_dim 8 [128] (q_proj is [32, 32] since 4 * 8 = 32: the q_norm / k_norm width [8] tells
  the head width), eps 1e-6, theta 5e6, vocabulary 151936, rope_dims [24, 20, 20] and interleaved_mrope kept (unused
  for text). The vision tower is ComfyUI's own, full size, built and left unloaded (the text path never runs it);
  lm_head [151936, 32] is built (lm_head True) and unused by the conditioning: neither is in the file.
- Token table: the file stores only its first 1000 rows ([1000, 32]); row r serves every id with id % 1000 == r.
  Kiln's test must tile the table to 151936 rows (engine/models/tests/it/common.rs tiled_table), as the script does
  before ComfyUI's loader sees it.

Shims on ComfyUI (the only places this departs from its code path): the Qwen3VL_8BConfig swap above and
detect_te_model answering QWEN3VL_8B (it answers None for a file without the vision tower; recorded as
te_cases.json `layout.detect_te_model_on_this_file`), both during comfy.sd.load_text_encoder_state_dicts (ComfyUI's
loader for the written te.safetensors with its table tiled to 151936 rows: the rename, te(**llama_detect),
BooguTokenizer, CLIP's strict=False load); the DiT is built directly (BooguTransformer2DModel(**kwargs,
operations=comfy.ops.manual_cast)) and, for apply_model, through supported_models.Boogu(tiny unet_config).get_model
with the weights loaded into its diffusion_model.

Writes engine/models/tests/fixtures/boogu/ (every tensor f32):
- dit.safetensors: BooguTransformer2DModel.state_dict(), ComfyUI's (= the released file's) names, no prefix:
  x_embedder.{weight [64, 64], bias [64]}, ref_image_patch_embedder.{weight [64, 64], bias [64]},
  image_index_embedding [5, 64], time_caption_embed.timestep_embedder.linear_1.{weight [64, 256], bias [64]},
  .linear_2.{weight [64, 64], bias [64]}, time_caption_embed.caption_embedder.0.weight [32] (RMSNorm gain),
  .caption_embedder.1.{weight [64, 32], bias [64]}; {noise_refiner, ref_image_refiner, context_refiner,
  single_stream_layers}.N (N = 0, 1).attn.{to_q [64, 64], to_k [32, 64], to_v [32, 64], to_out.0 [64, 64]}.weight,
  .attn.{norm_q, norm_k}.weight [16], .feed_forward.{linear_1, linear_3}.weight [256, 64], .feed_forward.linear_2
  .weight [64, 256], .norm2.weight, .ffn_norm1.weight, .ffn_norm2.weight [64]; modulated (all but context_refiner):
  .norm1.linear.{weight [256, 64], bias [256]}, .norm1.norm.weight [64]; context_refiner.N.norm1.weight [64];
  double_stream_layers.N (N = 0, 1): .img_instruct_attn.processor.{img_to_q, instruct_to_q, img_out, instruct_out}
  .weight [64, 64], .img_instruct_attn.processor.{img_to_k, img_to_v, instruct_to_k, instruct_to_v}.weight [32, 64],
  .img_instruct_attn.{norm_q, norm_k}.weight [16], .img_instruct_attn.to_out.0.weight [64, 64],
  .img_self_attn.{to_q [64, 64], to_k [32, 64], to_v [32, 64], to_out.0 [64, 64]}.weight, .img_self_attn.{norm_q,
  norm_k}.weight [16], .{img_norm1, img_norm2, img_norm3, instruct_norm1, instruct_norm2}.linear.{weight [256, 64],
  bias [256]} and .norm.weight [64], .{img_attn_norm, img_self_attn_norm, img_ffn_norm1, img_ffn_norm2,
  instruct_attn_norm, instruct_ffn_norm1, instruct_ffn_norm2}.weight [64], .{img_feed_forward, instruct_feed_forward}
  .{linear_1, linear_3}.weight [256, 64] and .linear_2.weight [64, 256]; norm_out.linear_1.{weight [64, 64], bias
  [64]}, norm_out.linear_2.{weight [64, 64], bias [64]}. Weights N(0, 1) / sqrt(fan_in), biases 0.1 N, RMSNorm gains
  1 + 0.1 N, image_index_embedding 0.5 N.
- dit_io.safetensors, per case c: `{c}.x` [B, 16, H, W], `{c}.sigma` [B], `{c}.timestep` [B] (=
  model_sampling.timestep(sigma) = sigma: what forward gets), `{c}.context` [B, L, 32], `{c}.ref.{j}` [B, 16, h_j,
  w_j] (reference j as the DiT receives it: in the MODEL's latent space, after process_latent_in, repeated to the
  batch by CONDList.process_cond, not padded), `{c}.ref_latent.{j}` [1, 16, h_j, w_j] (the raw VAE-space latent
  the conditioning holds), `{c}.out` [B, 16, H, W] = forward(x, timestep, context, L, ref_latents=[ref.0, ...],
  attention_mask=None) (the negated velocity), `{c}.denoised` = model_base.Boogu.apply_model(x, sigma, **conds
  processed to the batch) (= x - out * sigma); intermediates (forward hooks on ComfyUI's modules): `{c}.temb`
  [B, 64], `{c}.cap_refined` [B, L, 64] (after the context_refiner), `{c}.img_refined` [B, H'W'/4, 64] (after the
  noise_refiner, H', W' padded), `{c}.ref_refined` [B, sum_j tokens_j, 64] (after the ref_image_refiner; cases with
  references), `{c}.double_img` [B, sum_j tokens_j + H'W'/4, 64] and `{c}.double_instruct` [B, L, 64] (the two
  streams after the last double-stream block). Cases: a: x [1,16,8,8], L 5 (randn), sigma 0.7, no reference; b: x
  [2,16,7,10] (padded to 8 x 10, cropped back), L 7, sigmas 0.9 / 0.25, no reference; c: x [1,16,8,6], context =
  te_io's caption.cond [1, 44, 32], sigma 1.0 (the network sees t = 0), one reference [1,16,6,10]; d: x [2,16,6,8],
  L 6, sigmas 0.6 / 0.3, two references [1,16,5,6] (padded to 6 x 6) and [1,16,8,4], repeated to batch 2 (where
  ComfyUI and upstream differ, see below).
- dit_cases.json: seed, dit_kwargs, head_dim, ffn_inner (and its rule), num_layers_means, widths, timestep / denoised
  / reference-space / sequence-order notes, `double_stream_block` (the block restated), per case shapes / sigma /
  timestep / internal_t (1 - timestep) / time_proj_input / num_tokens / padded sizes / references (rope_t, grid,
  tokens, image_index_embedding row) / token counts / sample 0's RoPE position ids (caption, references, image in
  sequence order), `sampling` (shift 3.16, multiplier, sigma(t) for t in 1, .75, .5, .25, .001, timestep(sigma), the
  sigmas table's ends, percent_to_sigma, the simple and normal schedulers' 4-step sigmas), `latent_format`,
  `mask_with_zeros`, `comfy_detection`.
- te.safetensors: Comfy-Org's qwen3vl_8b layout (transformers' names) for the language model only:
  model.language_model.embed_tokens.weight [1000, 32] (the first 1000 rows, see above; N(0, 1)),
  model.language_model.layers.N.self_attn.{q_proj.weight [32, 32], k_proj.weight [16, 32], v_proj.weight [16, 32],
  o_proj.weight [32, 32], q_norm.weight [8], k_norm.weight [8]}, model.language_model.layers.N.mlp.{gate_proj,
  up_proj}.weight [64, 32], .mlp.down_proj.weight [32, 64], model.language_model.layers.N.{input_layernorm,
  post_attention_layernorm}.weight [32], model.language_model.norm.weight [32], N = 0, 1; no biases, no lm_head, no
  model.visual.*. ComfyUI holds them as model.* (the rename above). Weights N(0, 1) / sqrt(fan_in), norm gains
  (q_norm and k_norm included) 1 + 0.1 N.
- te_io.safetensors, per prompt case e: `{e}.cond` [1, N, 32] and `{e}.attention_mask` [1, N] (as f32, all ones)
  = CLIP.encode_from_tokens(CLIP.tokenize(prompt), return_dict=True).
- te_cases.json: per case the prompt, which template, the templated text, `ids`, `weights`, `tokenize_with_weights`
  ({"qwen3vl_8b": [[[id, weight], ...]]}, one section, as ComfyUI returns it), `hf_ids` (Qwen2Tokenizer on the
  templated text in one call) and `equals_hf`, cond shape, attention mask, `pooled_output` null, `encode_keys`; the
  Qwen config, `layout` (stored prefix, ComfyUI's rename, detection), the embedding rule, the tokenizer settings, the
  three templates and the rule choosing them, the weighting rule, `rope_checks`, and `tokenizer_only` (ids of
  "a \\(red\\) cat" and of the whitespace prompt "  ", which gets the drop template with the two spaces in it).
Prompt cases: caption (44 ids), empty (the drop template alone, 66 ids), weighted ("a (red:1.3) cat": 40 ids, the
parentheses, colon and digits as text, all weights 1.0), newlines ("\\n" 198, "\\n\\n" 271, byte-level pieces for é
and 夜).

Checks: the loaded ComfyUI modules hold exactly the written values; detect_unet_config's answer; ComfyUI's tokenizer
ids equal Qwen2Tokenizer's on the templated text for every prompt; apply_model's denoised == x - out * sigma; two runs
write identical files. Cross-checks (max |diff| / max |ref|, CPU f32, torch 2.15, printed at the end of a run):
- diffusers 0.42.1 (pinned) has no Boogu transformer. With BOOGU_DIR, the original Boogu-Image
  BooguImageTransformer2DModel (df9a219f, diffusers-based, its CPU SDPA processors as flash-attn is absent; identical
  parameter names: loaded strictly from dit.safetensors; its num_layers = 4, the double and single layers together;
  instruction_feature_configs {instruction_feat_dim 32, reduce_type mean, 1 layer}) fed 1 - sigma, an all-ones text
  mask, x and the references padded circularly, the output cropped and negated: 3.6e-7 to 4.3e-7 on a, b, c, but
  1.2e-1 on d: upstream refines each reference ALONE (transformer_boogu.py img_patch_embed_and_refine: a batch of
  references, each masked to its own tokens) where ComfyUI refines a sample's references as ONE sequence. With
  upstream's img_patch_embed_and_refine replaced by ComfyUI's joint refinement (restated in joint_ref_refine): 3.6e-7
  to 5.0e-7 on all four cases.
- Independently of BOOGU_DIR: double_stream_layers.0 re-implemented in plain torch from the weights alone
  (double_block_reference: its own RMSNorm, RoPE tables from the position ids in f64, GQA by repeating kv heads,
  softmax attention) on the block's real inputs in each case: 8.6e-8 to 1.2e-7.
- transformers 5.24 Qwen3Model (eager, head_dim 8, theta 5e6, plain RoPE) and Qwen3VLTextModel (interleaved M-RoPE,
  mrope_section [2, 1, 1], its own text position rows), same weights with the token table of 1000 rows fed id % 1000:
  last_hidden_state (= hidden_states[-1], what Boogu's pipeline takes) vs cond: 2.0e-7 to 2.7e-7 on the four prompts,
  the two models alike (M-RoPE with equal rows IS the plain RoPE); hidden_states[-2] (before the final norm) is > 10%
  away (asserted).
Other differences from upstream Boogu-Image that the fixtures follow ComfyUI in: ComfyUI's schedule is the fixed
shift 3.16; upstream's scheduler shifts by a resolution-dependent m (time_shift v2: t / (m - m t + t), m =
sqrt(latent H * W) / (2 * time_shift_v2_half_scaling_factor)). ComfyUI pads x and the references to the patch;
upstream expects multiples of 2. Upstream masks padded caption tokens everywhere (varlen) and may give each sample
its own references; ComfyUI never masks the double- or single-stream attention, and one batch shares reference
shapes. Upstream's class default timestep_scale is 1.0 (a released config.json sets its own); ComfyUI always uses
its class default 1000 (detection does not read it).
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

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/boogu")
SEED = 3360
BUDGET = 5_000_000

# BooguTransformer2DModel kwargs: ComfyUI's class defaults (the released constants; model_detection reads only the
# widths and counts) at tiny widths. num_layers counts the SINGLE-stream layers only (upstream's counts both).
DIT = dict(patch_size=2, in_channels=16, out_channels=None, hidden_size=64, num_layers=2, num_double_stream_layers=2,
           num_refiner_layers=2, num_attention_heads=4, num_kv_heads=2, multiple_of=256, ffn_dim_multiplier=None,
           norm_eps=1e-5, axes_dim_rope=[4, 6, 6], axes_lens=[2048, 1664, 1664], instruction_feat_dim=32,
           timestep_scale=1000.0)
HEAD_DIM = DIT["hidden_size"] // DIT["num_attention_heads"]
FFN_INNER = 256  # multiple_of * ceil(4 * 64 / multiple_of): 4 * hidden is the floor
REF_LATENT_MEAN = 0.1159  # raw references are drawn around the Flux latent shift, scale ~1 / 0.3611
# name: (batch, h, w, context tokens (None: the text encoder's `caption` cond), sigmas, references
# [(batch, h, w), ...] as the conditioning holds them (raw latents))
DIT_CASES = {
    "a": (1, 8, 8, 5, [0.7], []),
    "b": (2, 7, 10, 7, [0.9, 0.25], []),
    "c": (1, 8, 6, None, [1.0], [(1, 6, 10)]),
    "d": (2, 6, 8, 6, [0.6, 0.3], [(1, 5, 6), (1, 8, 4)]),
}
SAMPLING_TIMESTEPS = [1.0, 0.75, 0.5, 0.25, 0.001]

# Qwen3-VL 8B's language model at tiny widths (released values in the docstring).
QWEN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=5000000.0)
QWEN_HEAD_DIM = 8
QWEN_VOCAB = 151936
ROWS = 1000  # stored rows of the token table; row r serves every id with id % ROWS == r
LM_PREFIX = "model.language_model."  # the Comfy-Org / transformers layout; ComfyUI's loader renames it to "model."
PAD = 151643
IM_START, IM_END = 151644, 151645
PROMPTS = {
    "caption": "a photo of a red fox sitting in the snow, golden hour",
    "empty": "",
    "weighted": "a (red:1.3) cat",
    "newlines": "line one\nline two\n\nthe café at night 夜",
}
# Tokenizer-only cases (ids recorded, no cond): ComfyUI's escape handling and the whitespace-only prompt.
TOKEN_ONLY = {
    "escaped": "a \\(red\\) cat",
    "whitespace": "  ",
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
    missing = set(want) - set(have)
    assert not missing, sorted(missing)[:10]
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
    """Qwen3VL_8BConfig with the tiny sizes (qwen3vl.Qwen3VL builds QWEN3VL_CONFIGS[model_type](**config_dict);
    head_dim is a class attribute, so a subclass sets it). rope_theta 5e6, rope_dims, interleaved_mrope, q/k norms,
    final norm and lm_head stay as Qwen3VL_8BConfig has them."""
    real = llama.Qwen3VL_8BConfig
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in QWEN.items()]
    return dataclasses.make_dataclass("TinyQwen3VL_8BConfig", fields, bases=(real,),
                                      namespace={"head_dim": QWEN_HEAD_DIM})


class TinyQwen3VL:
    """Swaps ComfyUI's Qwen3VL_8BConfig for the tiny subclass while ComfyUI builds the model, and (optionally) lets
    detect_te_model answer QWEN3VL_8B for a file without the vision tower."""

    def __init__(self, detect=False):
        self.detect = detect

    def __enter__(self):
        import comfy.sd
        import comfy.text_encoders.llama as llama
        import comfy.text_encoders.qwen3vl as qwen3vl

        self.qwen3vl, self.sd = qwen3vl, comfy.sd
        self.real_config = qwen3vl.QWEN3VL_CONFIGS["qwen3vl_8b"]
        self.real_detect = comfy.sd.detect_te_model
        qwen3vl.QWEN3VL_CONFIGS["qwen3vl_8b"] = tiny_config_class(llama)
        if self.detect:
            real_detect = self.real_detect

            def detect(sd):
                found = real_detect(sd)
                self.detected = found
                return comfy.sd.TEModel.QWEN3VL_8B
            comfy.sd.detect_te_model = detect
        return self

    def __exit__(self, *exc):
        self.qwen3vl.QWEN3VL_CONFIGS["qwen3vl_8b"] = self.real_config
        self.sd.detect_te_model = self.real_detect
        return False


def load_te(sd):
    """ComfyUI's own loader for a lone text-encoder file, CLIPLoader type `boogu` (sd.py load_text_encoder_state_dicts:
    the model.language_model. -> model. rename, te(**llama_detect), BooguTokenizer; comfy.sd.CLIP loads the state
    dict with strict=False). detect_te_model needs the vision tower's keys to say QWEN3VL_8B; the fixture has none,
    so the shim answers QWEN3VL_8B (and records what detection said)."""
    import comfy.sd

    with TinyQwen3VL(detect=True) as shim:
        clip = comfy.sd.load_text_encoder_state_dicts([dict(sd)], clip_type=comfy.sd.CLIPType.BOOGU)
    return clip, shim.detected


def te_fixture():
    import comfy.ops
    import comfy.sd
    import comfy.text_encoders.boogu as boogu_te
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.qwen3vl as qwen3vl

    # Draw the weights on ComfyUI's decoder built directly (the names and shapes Qwen3VL's `model` has).
    shape_model = llama.Llama2_(tiny_config_class(llama)(), device="cpu", dtype=torch.float32,
                                ops=comfy.ops.manual_cast)
    weights = draw_module(Draw(SEED + 2), shape_model, {"embed_tokens.weight": 1.0})
    del shape_model
    assert "lm_head.weight" in weights
    del weights["lm_head.weight"]  # unused by the conditioning (see the docstring); not stored
    weights["embed_tokens.weight"] = weights["embed_tokens.weight"][:ROWS].clone()
    assert weights["layers.0.self_attn.q_norm.weight"].shape == (QWEN_HEAD_DIM,)
    stored = {LM_PREFIX + k: v for k, v in weights.items()}
    save_file(stored, f"{OUT}/te.safetensors")
    stored = load_file(f"{OUT}/te.safetensors")
    full = dict(stored)
    full[LM_PREFIX + "embed_tokens.weight"] = tile(stored[LM_PREFIX + "embed_tokens.weight"], QWEN_VOCAB)

    clip, detected = load_te(full)
    print(f"detect_te_model on the tiny file (no vision tower): {detected}")
    te = clip.cond_stage_model
    assert type(te).__mro__[1] is boogu_te.BooguTEModel, type(te).__mro__
    q = te.qwen3vl_8b
    assert isinstance(q, boogu_te.BooguQwen3VLClipModel)
    inner = q.transformer
    cfg = inner.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta,
            cfg.transformer_type, cfg.rms_norm_add, cfg.mlp_activation, cfg.qkv_bias, cfg.q_norm, cfg.k_norm,
            cfg.rope_dims, cfg.interleaved_mrope, cfg.final_norm, cfg.lm_head) == \
        (32, 64, 2, 4, 2, QWEN_HEAD_DIM, QWEN_VOCAB, 1e-6, 5e6, "llama", False, "silu", False, "gemma3", "gemma3",
         [24, 20, 20], True, True, True), cfg
    assert (q.layer, q.layer_idx, q.layer_norm_hidden_state, q.enable_attention_masks, q.return_attention_masks,
            q.zero_out_masked, q.special_tokens) == ("hidden", -1, True, True, True, False, {"pad": PAD})
    check_loaded(inner, {"model." + k[len(LM_PREFIX):]: v for k, v in full.items()})
    assert isinstance(clip.tokenizer, boogu_te.BooguTokenizer)
    tok = clip.tokenizer.qwen3vl_8b
    assert (tok.tokens_start, tok.start_token, tok.end_token, tok.pad_token, tok.min_length, tok.max_length,
            tok.pad_to_max_length) == (0, None, None, PAD, 1, 99999999, False)
    hf = tok.tokenizer
    templates = {"t2i": clip.tokenizer.llama_template, "drop": clip.tokenizer.llama_template_drop,
                 "images": clip.tokenizer.llama_template_images}

    def template_of(prompt):
        return "drop" if prompt.strip() == "" else "t2i"

    io, cases = {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = clip.tokenize(prompt)
            assert set(tokens) == {"qwen3vl_8b"} and len(tokens["qwen3vl_8b"]) == 1
            ids = [int(t[0]) for t in tokens["qwen3vl_8b"][0]]
            w = [float(t[1]) for t in tokens["qwen3vl_8b"][0]]
            out = clip.encode_from_tokens(tokens, return_dict=True)
            assert set(out) == {"cond", "pooled_output", "attention_mask"}, sorted(out)
            assert out["pooled_output"] is None
            cond, mask = out["cond"], out["attention_mask"]
            assert cond.shape == (1, len(ids), QWEN["hidden_size"]) and mask.shape == (1, len(ids))
            assert cond.dtype == torch.float32 and torch.isfinite(cond).all()
            io[f"{name}.cond"] = cond
            io[f"{name}.attention_mask"] = mask.float()
            which = template_of(prompt)
            text = templates[which].format(prompt)
            hf_ids = hf(text)["input_ids"]
            cases[name] = {"prompt": prompt, "template": which, "templated": text, "ids": ids, "weights": w,
                           "tokenize_with_weights": {"qwen3vl_8b": [[[i, x] for i, x in zip(ids, w)]]},
                           "hf_ids": hf_ids, "equals_hf": ids == hf_ids,
                           "cond_shape": list(cond.shape), "attention_mask": mask[0].tolist(),
                           "pooled_output": None, "encode_keys": sorted(out)}
            print(f"encoder {name}: {len(ids)} ids, template {which}, weights {sorted(set(w))}, cond std "
                  f"{cond.std():.3f}, max |cond| {cond.abs().max():.3f}")
        token_only = {}
        for name, prompt in TOKEN_ONLY.items():
            tokens = clip.tokenize(prompt)["qwen3vl_8b"][0]
            ids = [int(t[0]) for t in tokens]
            assert all(float(t[1]) == 1.0 for t in tokens)
            token_only[name] = {"prompt": prompt, "template": template_of(prompt), "ids": ids}

        # Tokenizer facts: one section, every weight 1 (Qwen3VLTokenizer passes disable_weights=True), ids equal
        # Qwen2Tokenizer's on the templated text in one call, the drop template for the empty prompt, no <think>.
        for name, case in cases.items():
            assert all(case["attention_mask"]) and case["equals_hf"], name
            assert all(x == 1.0 for x in case["weights"]), name
            assert case["ids"][0] == IM_START and case["ids"][-2:] == [IM_END, 198], name
            assert "<think>" not in case["templated"] and "<|im_start|>assistant" not in case["templated"], name
        t2i_head = hf(templates["t2i"].split("{}")[0])["input_ids"]
        drop_head = hf(templates["drop"].split("{}")[0])["input_ids"]
        for name in ("caption", "weighted", "newlines"):
            assert cases[name]["ids"][:len(t2i_head)] == t2i_head, name
        assert cases["empty"]["ids"] == drop_head + [IM_END, 198]
        # "(red:1.3)" is literal text: its ids are those of the whole string.
        assert cases["weighted"]["ids"] == hf(templates["t2i"].format("a (red:1.3) cat"))["input_ids"]
        assert 271 in cases["newlines"]["ids"] and 198 in cases["newlines"]["ids"][len(t2i_head):-2]
        # escape_important / unescape_important still run: "\\(" and "\\)" lose their backslashes.
        assert token_only["escaped"]["ids"] == hf(templates["t2i"].format("a (red) cat"))["input_ids"]
        assert token_only["whitespace"]["ids"] == hf(templates["drop"].format("  "))["input_ids"]
        for name, case in token_only.items():
            print(f"tokenizer only {name} {case['prompt']!r}: {len(case['ids'])} ids, template {case['template']}")

        # The thinking default of Qwen3VLTokenizer (thinking=False) would append the empty <think> block.
        plain = qwen3vl.Qwen3VLTokenizer.tokenize_with_weights(
            clip.tokenizer, PROMPTS["caption"], thinking=False, llama_template=templates["t2i"])["qwen3vl_8b"][0]
        think_tail = [int(t[0]) for t in plain][len(cases["caption"]["ids"]):]
        assert think_tail == hf("<think>\n\n</think>\n\n")["input_ids"], think_tail

        rope = te_rope_checks(q, cases, io)
        te_cross_check(weights, cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "seed": SEED + 2,
            "qwen_config": {**QWEN, "head_dim": QWEN_HEAD_DIM, "vocab_size": QWEN_VOCAB, "qkv_bias": False,
                            "o_proj_bias": False, "q_norm": "RMSNorm(head_dim, eps 1e-6) per head, gain w",
                            "k_norm": "RMSNorm(head_dim, eps 1e-6) per head, gain w", "mlp_activation": "silu",
                            "rope": "text only: 1-D rotate-half, positions 0..N-1, theta 5e6 (M-RoPE rope_dims "
                                    "[24, 20, 20] interleaved is unused: one position row)",
                            "layer": "hidden, layer_idx -1, layer_norm_hidden_state True: the last layer's output "
                                     "through the final norm (= the final normed state)",
                            "final_norm_applied": True, "rms_norm_gain": "w (not 1 + w)",
                            "lm_head": "built by ComfyUI (Qwen3VL_8BConfig lm_head True), unused, not stored"},
            "layout": {"stored_prefix": LM_PREFIX,
                       "comfy_rename": {"model.language_model.": "model.", "model.visual.": "visual.",
                                        "lm_head.": "model.lm_head."},
                       "detection": "sd.py detect_te_model says QWEN3VL_8B only when the file has "
                                    "model.visual.deepstack_merger_list.0.norm.weight (and "
                                    "model.visual.merger.linear_fc2.weight with other than 2560 rows); this file "
                                    "holds the language model only",
                       "detect_te_model_on_this_file": str(detected),
                       "vision_tower": "absent from the file; ComfyUI builds it (Qwen3VL always does) and leaves it "
                                       "unloaded: the text-only path never runs it"},
            "embedding_rows": ROWS,
            "embedding_rule": f"te.safetensors stores {ROWS} token-table rows; id i uses row i % {ROWS} (tile the "
                              f"table to {QWEN_VOCAB} rows); the real ids are used everywhere else",
            "tokenizer": {"class": "transformers Qwen2Tokenizer on comfy/text_encoders/qwen25_tokenizer",
                          "start_token": None, "end_token": None, "pad_token": PAD, "tokens_start": 0,
                          "min_length": 1, "max_length": 99999999, "im_start": IM_START, "im_end": IM_END,
                          "weights_parsed": False, "thinking": True,
                          "escapes": "escape_important / unescape_important still run: '\\(' and '\\)' become "
                                     "'(' and ')' (the backslash is dropped)"},
            "templates": templates,
            "template_rule": "prompt.strip() == '' (and no images): the drop template, else the t2i template; the "
                             "images template only with images (not recorded); nothing is appended (thinking=True: no "
                             "'<think>\\n\\n</think>\\n\\n'; no '<|im_start|>assistant\\n')",
            "weighted_rule": "weights are NOT parsed (Qwen3VLTokenizer passes disable_weights=True): '(red:1.3)' is "
                             "literal text, every weight is 1.0, the ids are Qwen2Tokenizer's on the whole templated "
                             "string",
            "rope_checks": rope,
            "cases": cases,
            "tokenizer_only": token_only,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")
    return io


def te_rope_checks(q, cases, io):
    """ComfyUI's own M-RoPE on three equal position rows (what a text token gets in Qwen3-VL's 3-D scheme) against
    the one-row plain RoPE its text path uses: the tables at the real head width and the tiny model's conds."""
    import comfy.text_encoders.llama as llama

    n = 64
    one = torch.arange(n).unsqueeze(0)
    three = one.expand(3, n)
    out = {}
    for head, dims in ((128, [24, 20, 20]), (QWEN_HEAD_DIM, [24, 20, 20])):
        a = llama.precompute_freqs_cis(head, one, 5e6, rope_dims=dims, interleaved_mrope=True)
        b = llama.precompute_freqs_cis(head, three, 5e6, rope_dims=dims, interleaved_mrope=True)
        err = max(float((x.reshape(n, -1) - y.reshape(n, -1)).abs().max()) for x, y in zip(a, b))
        report(f"ComfyUI precompute_freqs_cis, head {head}, interleaved M-RoPE rows (t, t, t) vs 1-D positions t "
               f"(max |diff| of cos/sin)", err, 1e-12)
        out[f"head_{head}_max_abs_diff"] = err
    # The tiny model on each prompt with explicit 3-row positions through ComfyUI's own forward.
    worst = 0.0
    for name, case in cases.items():
        n = len(case["ids"])
        embeds, mask, _, info = q.process_tokens([case["ids"]], "cpu")
        z = q.transformer(None, mask, embeds=embeds, intermediate_output=-1, final_layer_norm_intermediate=True,
                          dtype=torch.float32, embeds_info=info, position_ids=torch.arange(n).unsqueeze(0).expand(3, n),
                          visual_pos_masks=None, deepstack_embeds=None)[1]
        worst = max(worst, rel_err(z, io[f"{name}.cond"]))
    report("ComfyUI's Qwen3-VL on the prompts with M-RoPE position rows (t, t, t) vs its text-path cond", worst, 1e-6)
    out["cond_rel_err_3row_vs_1row"] = worst
    return out


def te_cross_check(weights, cases, io):
    """transformers' Qwen3Model (plain RoPE) and Qwen3VLTextModel (interleaved M-RoPE, text positions) with the same
    weights (the token table's 1000 rows fed id % 1000)."""
    from transformers import Qwen3Config, Qwen3Model, Qwen3VLTextConfig, Qwen3VLTextModel

    sd = dict(weights)
    common = dict(vocab_size=ROWS, **{k: v for k, v in QWEN.items() if k != "rope_theta"}, head_dim=QWEN_HEAD_DIM,
                  max_position_embeddings=4096, attention_bias=False, attn_implementation="eager")
    nets = {
        "Qwen3Model": Qwen3Model(Qwen3Config(**common, use_sliding_window=False, rope_parameters={
            "rope_theta": QWEN["rope_theta"], "rope_type": "default"})),
        "Qwen3VLTextModel": Qwen3VLTextModel(Qwen3VLTextConfig(**common, rope_parameters={
            "rope_theta": QWEN["rope_theta"], "rope_type": "default", "mrope_section": [2, 1, 1],
            "mrope_interleaved": True})),
    }
    print("transformers:")
    for label, net in nets.items():
        net.eval()
        assert net.layers[0].self_attn.head_dim == QWEN_HEAD_DIM
        net.load_state_dict(sd, strict=True)
        for name, case in cases.items():
            ids = torch.tensor([case["ids"]]) % ROWS
            out = net(input_ids=ids, output_hidden_states=True)
            assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
            report(f"transformers {label} last_hidden_state vs ComfyUI cond, {name}",
                   rel_err(io[f"{name}.cond"], out.last_hidden_state), 1e-5)
            # The final norm IS part of ComfyUI's cond: the pre-norm state is far from it.
            if label == "Qwen3Model":
                assert rel_err(io[f"{name}.cond"], out.hidden_states[-2]) > 0.1, name


# ----------------------------------------------------------------------------------------------------- the DiT


def build_dit():
    import comfy.ops
    from comfy.ldm.boogu.model import BooguTransformer2DModel

    return BooguTransformer2DModel(**DIT, operations=comfy.ops.manual_cast, dtype=torch.float32).eval()


def padded(n):
    return n + (-n % 2)


def dit_fixture(te_io):
    import comfy.model_detection
    import comfy.samplers
    import comfy.supported_models

    model = build_dit()
    weights = draw_module(Draw(SEED), model, {"image_index_embedding": 0.5})
    assert weights["single_stream_layers.0.feed_forward.linear_1.weight"].shape == (FFN_INNER, DIT["hidden_size"])
    assert weights["double_stream_layers.0.img_feed_forward.linear_1.weight"].shape == (FFN_INNER, DIT["hidden_size"])
    assert weights["double_stream_layers.0.img_instruct_attn.processor.img_to_k.weight"].shape == \
        (DIT["num_kv_heads"] * HEAD_DIM, DIT["hidden_size"])
    assert weights["time_caption_embed.timestep_embedder.linear_1.weight"].shape == (64, 256)
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    model.load_state_dict(weights, strict=True)
    check_loaded(model, weights)

    detected = comfy.model_detection.detect_unet_config(weights, "")
    picked = comfy.model_detection.model_config_from_unet(weights, "")
    print(f"detect_unet_config: {detected}; model config {type(picked).__name__}")
    assert detected == {"image_model": "boogu", "hidden_size": 64, "num_layers": 2, "num_double_stream_layers": 2,
                        "num_refiner_layers": 2, "instruction_feat_dim": 32}, detected
    assert type(picked).__name__ == "Boogu"

    # ComfyUI's model_base path: supported_models.Boogu built from the tiny config.
    mc = comfy.supported_models.Boogu({"image_model": "boogu", **DIT})
    mc.set_inference_dtype(torch.float32, None)
    based = mc.get_model({})
    assert type(based).__name__ == "Boogu" and type(based.diffusion_model).__name__ == "BooguTransformer2DModel"
    based.diffusion_model.load_state_dict(weights, strict=True)
    ms = based.model_sampling
    assert (ms.shift, ms.multiplier) == (3.16, 1.0), (ms.shift, ms.multiplier)
    assert type(mc.latent_format).__name__ == "Flux"
    lf = mc.latent_format

    seen = {}

    def keep(key, pick=lambda a, o: o):
        return lambda m, a, o: seen.__setitem__(key, pick(a, o))

    last_double = model.double_stream_layers[-1]
    hooks = [model.time_caption_embed.register_forward_hook(keep("temb", lambda a, o: o[0])),
             model.context_refiner[-1].register_forward_hook(keep("cap")),
             model.noise_refiner[-1].register_forward_hook(keep("img")),
             model.ref_image_refiner[-1].register_forward_hook(keep("ref")),
             model.double_stream_layers[0].register_forward_hook(keep("double0_in", lambda a, o: a)),
             model.double_stream_layers[0].register_forward_hook(keep("double0_out")),
             last_double.register_forward_hook(keep("double")),
             model.rope_embedder.rope_embedder.register_forward_hook(keep("ids", lambda a, o: a[0]))]

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases, block_checks = {}, {}, {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas, refs) in DIT_CASES.items():
            x = torch.randn(b, 16, h, w, generator=g)
            context = (torch.randn(b, n, DIT["instruction_feat_dim"], generator=g) if n is not None
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
                       f"{name}.cap_refined": inter["cap"], f"{name}.img_refined": inter["img"],
                       f"{name}.double_img": inter["double"][0], f"{name}.double_instruct": inter["double"][1]})
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
            assert inter["double"][0].shape == (b, ref_tokens + img_tokens, 64)
            assert inter["double"][1].shape == (b, L, 64)
            cases[name] = {"x": list(x.shape), "context": list(context.shape),
                           "context_from": "randn" if n is not None else "te_io caption.cond", "sigma": sigmas,
                           "timestep": t.tolist(), "internal_t": (1.0 - t).tolist(),
                           "time_proj_input": (DIT["timestep_scale"] * (1.0 - t)).tolist(), "num_tokens": L,
                           "padded_hw": [hp, wp], "image_tokens": img_tokens, "image_rope_t": shift,
                           "references": ref_info, "reference_tokens": ref_tokens,
                           "double_stream_image_tokens": ref_tokens + img_tokens,
                           "sequence": L + ref_tokens + img_tokens, "out": list(out.shape),
                           "position_ids_sample0": ids}
            # The double-stream block against the independent re-implementation (plain torch), on block 0's real
            # inputs of this case.
            ins = inter["double0_in"]
            mine = double_block_reference(weights, "double_stream_layers.0.", ins[0], ins[1], ins[4],
                                          inter["ids"], L)
            got = inter["double0_out"]
            block_checks[name] = max(rel_err(got[0], mine[0]), rel_err(got[1], mine[1]))
        for hook in hooks:
            hook.remove()
        report("ComfyUI's BooguDoubleStreamBlock (double_stream_layers.0) vs the independent plain-torch "
               "re-implementation, worst over cases " + ", ".join(f"{k} {v:.1e}" for k, v in block_checks.items()),
               max(block_checks.values()), 1e-5)

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
        assert failed is not None, "a mask with zeros ran"
        print(f"case a with a text mask [1, 1, 1, 0, 0]: forward fails ({failed})")
        mask_with_zeros = {"mask": [[1, 1, 1, 0, 0]], "num_tokens": 3, "result": f"RuntimeError: {failed}",
                           "why": "the caption RoPE covers num_tokens positions, the joint table num_tokens + "
                                  "images, the sequence L + images; ComfyUI's encoder never returns a mask with "
                                  "zeros for one prompt, so this path is not reached in practice"}

        # Sampling: ModelSamplingDiscreteFlow, shift 3.16, multiplier 1.
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
        want = [3.16 * t / (1 + 2.16 * t) for t in SAMPLING_TIMESTEPS]
        assert max(abs(a - b) for a, b in zip(sampling["sigma_of_timestep"], want)) < 1e-6
        latent = {"class": "Flux", "scale_factor": lf.scale_factor, "shift_factor": lf.shift_factor,
                  "process_in": "(latent - shift_factor) * scale_factor",
                  "process_out": "latent / scale_factor + shift_factor"}
        dit_cross_check(weights, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({"seed": SEED, "dit_kwargs": DIT, "head_dim": HEAD_DIM, "ffn_inner": FFN_INNER,
                   "ffn_rule": "multiple_of * ceil(4 * hidden_size / multiple_of), every feed-forward (refiners, "
                               "double-stream img / instruct, single-stream); ffn_dim_multiplier ignored (the "
                               "double-stream blocks do not even receive it); released 3360 -> 13568",
                   "num_layers_means": "single-stream layers only (upstream's num_layers counts double + single)",
                   "timestep_embedder_width": min(DIT["hidden_size"], 1024),
                   "adaln_in": min(DIT["hidden_size"], 1024), "adaln_out": 4 * DIT["hidden_size"],
                   "image_index_embedding_rows": 5, "storage": "every tensor f32",
                   "timestep_is": "model_sampling.timestep(sigma) = sigma (multiplier 1.0); the DiT embeds "
                                  "1 - timestep (model.py:259) times timestep_scale 1000 and returns the NEGATED "
                                  "output (model.py:318)",
                   "denoised_is": "x - out * sigma (CONST)",
                   "refs_space": "dit_io {case}.ref.{j} hold the references as the DiT receives them: in the "
                                 "model's latent space (after process_latent_in: (raw - 0.1159) * 0.3611) and "
                                 "repeated to the batch (CONDList.process_cond), unpadded (the DiT pads them "
                                 "circularly to the patch); {case}.ref_latent.{j} are the raw VAE-space latents the "
                                 "conditioning holds",
                   "sequence_order": "context refiner on [caption]; noise refiner on [image]; ref refiner on "
                                     "[reference 0, reference 1, ...] as one sequence; double-stream blocks on "
                                     "(image stream [references..., image], instruction stream [caption]) with "
                                     "joint attention over [caption, references..., image]; single-stream on "
                                     "[caption, references..., image]; output = the last image tokens",
                   "double_stream_block": DOUBLE_STREAM_RULE,
                   "sampling": sampling, "latent_format": latent, "cases": cases,
                   "mask_with_zeros": mask_with_zeros,
                   "comfy_detection": {"detect_unet_config": {k: jsonable(v) for k, v in detected.items()},
                                       "model_config": type(picked).__name__,
                                       "note": "the boogu branch reads hidden_size, the three layer counts and "
                                               "instruction_feat_dim from the shapes; heads (28), kv heads (7), "
                                               "axes_dim_rope (40, 40, 40), multiple_of (256), norm_eps, "
                                               "timestep_scale (1000) are the class defaults, so the tiny file "
                                               "(4 heads) cannot be built from its detection; the fixtures build the "
                                               "class directly"}},
                  f, indent=1)
        f.write("\n")


DOUBLE_STREAM_RULE = (
    "per block, with temb: (i1, g_msa, s_mlp, g_mlp) = img_norm1(img); (i2, shift, _, _) = img_norm2(img); "
    "(i3, g_self, _, _) = img_norm3(img); (c1, cg_msa, cs_mlp, cg_mlp) = instruct_norm1(txt); (c2, cshift, _, _) = "
    "instruct_norm2(txt), each LuminaRMSNormZero: chunks of Linear(SiLU(temb)) = (scale, gate, scale_mlp, gate_mlp), "
    "out = RMSNorm(x) * (1 + scale); the 'shift' used below is norm2's SECOND chunk and norm2's / norm3's / "
    "instruct_norm2's last two chunks are unused. Joint attention: q, k, v = img_to_{q,k,v}(i1) and "
    "instruct_to_{q,k,v}(c1), concatenated [caption; image stream], heads split, img_instruct_attn.norm_q / norm_k, "
    "RoPE with the joint table, SDPA (GQA), then instruct_out on the caption rows and img_out on the image rows, "
    "then img_instruct_attn.to_out.0 on both. Image self-attention: img_self_attn (to_q/k/v, norm_q/k, to_out.0) "
    "on i3 with the image part of the joint table. img += tanh(g_msa) * img_attn_norm(joint img rows); img += "
    "tanh(g_self) * img_self_attn_norm(self); img += tanh(g_mlp) * img_ffn_norm2(img_feed_forward(img_ffn_norm1("
    "(1 + s_mlp) * i2 + shift))); txt += tanh(cg_msa) * instruct_attn_norm(joint caption rows); txt += tanh(cg_mlp) "
    "* instruct_ffn_norm2(instruct_feed_forward(instruct_ffn_norm1((1 + cs_mlp) * c2 + cshift))). The joint and "
    "self attention both see the block's INPUT states (parallel, not sequential)")


def double_block_reference(w, p, img, txt, temb, ids, L):
    """BooguDoubleStreamBlock re-implemented in plain torch from the weights (no ComfyUI code): RoPE from the
    position ids (axes (4, 6, 6), theta 10000, interleaved pairs), GQA by repeating kv heads."""
    import torch.nn.functional as F

    eps, heads, kv, hd = DIT["norm_eps"], DIT["num_attention_heads"], DIT["num_kv_heads"], HEAD_DIM

    def rms(x, g, e=eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * g

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    def mod(x, name):
        chunks = lin(F.silu(temb), name + ".linear").chunk(4, dim=1)
        return (rms(x, w[name + ".norm.weight"]) * (1 + chunks[0][:, None]),) + chunks[1:]

    def rope_table(pos):
        angles = []
        for axis, d in enumerate(DIT["axes_dim_rope"]):
            omega = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
            angles.append(pos[..., axis:axis + 1].double() * omega)
        return torch.cat(angles, -1)  # [B, N, hd / 2]

    def rope(x, ang):  # x [B, N, H, hd], pairs (2i, 2i + 1)
        xr = x.double().reshape(*x.shape[:-1], hd // 2, 2)
        c, s = ang.cos()[:, :, None], ang.sin()[:, :, None]
        out = torch.stack([xr[..., 0] * c - xr[..., 1] * s, xr[..., 0] * s + xr[..., 1] * c], -1)
        return out.reshape(x.shape).float()

    def attend(q, k, v, ang, qn, kn):
        b, n = q.shape[:2]
        q = rope(rms(q.view(b, n, heads, hd), w[qn], 1e-5), ang)
        k = rope(rms(k.view(b, n, kv, hd), w[kn], 1e-5), ang)
        v = v.view(b, n, kv, hd)
        k = k.repeat_interleave(heads // kv, dim=2)
        v = v.repeat_interleave(heads // kv, dim=2)
        att = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd), -1)
        return torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, n, heads * hd)

    def ffn(x, name):
        return lin(F.silu(lin(x, name + ".linear_1")) * lin(x, name + ".linear_3"), name + ".linear_2")

    ang = rope_table(ids)
    i1, g_msa, s_mlp, g_mlp = mod(img, p + "img_norm1")
    i2, shift, _, _ = mod(img, p + "img_norm2")
    i3, g_self, _, _ = mod(img, p + "img_norm3")
    c1, cg_msa, cs_mlp, cg_mlp = mod(txt, p + "instruct_norm1")
    c2, cshift, _, _ = mod(txt, p + "instruct_norm2")
    a = p + "img_instruct_attn."
    pr = a + "processor."
    q = torch.cat([lin(c1, pr + "instruct_to_q"), lin(i1, pr + "img_to_q")], 1)
    k = torch.cat([lin(c1, pr + "instruct_to_k"), lin(i1, pr + "img_to_k")], 1)
    v = torch.cat([lin(c1, pr + "instruct_to_v"), lin(i1, pr + "img_to_v")], 1)
    joint = attend(q, k, v, ang, a + "norm_q.weight", a + "norm_k.weight")
    joint = lin(torch.cat([lin(joint[:, :L], pr + "instruct_out"), lin(joint[:, L:], pr + "img_out")], 1),
                a + "to_out.0")
    s = p + "img_self_attn."
    self_att = lin(attend(lin(i3, s + "to_q"), lin(i3, s + "to_k"), lin(i3, s + "to_v"), ang[:, L:],
                          s + "norm_q.weight", s + "norm_k.weight"), s + "to_out.0")
    img = img + torch.tanh(g_msa)[:, None] * rms(joint[:, L:], w[p + "img_attn_norm.weight"])
    img = img + torch.tanh(g_self)[:, None] * rms(self_att, w[p + "img_self_attn_norm.weight"])
    mlp = ffn(rms((1 + s_mlp[:, None]) * i2 + shift[:, None], w[p + "img_ffn_norm1.weight"]), p + "img_feed_forward")
    img = img + torch.tanh(g_mlp)[:, None] * rms(mlp, w[p + "img_ffn_norm2.weight"])
    txt = txt + torch.tanh(cg_msa)[:, None] * rms(joint[:, :L], w[p + "instruct_attn_norm.weight"])
    mlp = ffn(rms((1 + cs_mlp[:, None]) * c2 + cshift[:, None], w[p + "instruct_ffn_norm1.weight"]),
              p + "instruct_feed_forward")
    txt = txt + torch.tanh(cg_mlp)[:, None] * rms(mlp, w[p + "instruct_ffn_norm2.weight"])
    return img, txt


def upstream_model():
    """The original Boogu-Image transformer (BOOGU_DIR), or None."""
    directory = os.environ.get("BOOGU_DIR")
    if not directory:
        return None
    import warnings

    sys.path.insert(0, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from boogu.models.transformers.rope import BooguImageRotaryPosEmbed
        from boogu.models.transformers.transformer_boogu import BooguImageTransformer2DModel
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in DIT.items()
              if k not in ("instruction_feat_dim", "num_layers")}
    net = BooguImageTransformer2DModel(
        **kwargs, num_layers=DIT["num_layers"] + DIT["num_double_stream_layers"],
        instruction_feature_configs=dict(instruction_feat_dim=DIT["instruction_feat_dim"], reduce_type="mean",
                                         num_instruction_feat_layers=1)).eval()
    freqs = BooguImageRotaryPosEmbed.get_freqs_cis(tuple(DIT["axes_dim_rope"]), tuple(DIT["axes_lens"]), theta=10000)
    return net, freqs


def joint_ref_refine(self, hidden_states, ref_image_hidden_states, padded_img_mask, padded_ref_img_mask,
                     noise_rotary_emb, ref_img_rotary_emb, l_effective_ref_img_len, l_effective_img_len, temb):
    """Upstream's img_patch_embed_and_refine with ComfyUI's reference refinement (omnigen2.py:389-412, which Boogu
    reuses): all of a sample's references refined as one sequence (every sample here has the same lengths)."""
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

    names = [n for n in dir(diffusers) if "boogu" in n.lower()]
    assert not names, names
    CROSS.append(f"diffusers {diffusers.__version__} has no Boogu transformer: no diffusers cross-check")
    up = upstream_model()
    if up is None:
        CROSS.append("BOOGU_DIR not set: the upstream Boogu-Image cross-check was skipped")
        print("  BOOGU_DIR not set: upstream cross-check skipped")
        return
    net, freqs = up
    result = net.load_state_dict(weights, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    qk = [m for name, m in net.named_modules() if name.endswith(("norm_q", "norm_k"))]
    assert len(qk) == 2 * (3 * 2 + 2 + 2 * 2) and all(m.eps == 1e-5 for m in qk), len(qk)

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
        report(f"upstream Boogu-Image (references refined jointly as ComfyUI does) vs ComfyUI, DiT case {name}",
               rel_err(run(name), io[f"{name}.out"]), 1e-5)
    print(f"  (upstream stock: {', '.join(f'{k} {v:.2e}' for k, v in stock.items())})")
    CROSS.append("upstream Boogu-Image stock (each reference refined alone): "
                 + ", ".join(f"{k} {v:.2e}" for k, v in stock.items()))
    assert stock["d"] > 1e-3 and max(stock[k] for k in ("a", "b", "c")) < 1e-5


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
