"""Fixtures for Kandinsky 5 (engine/models/tests/fixtures/kandinsky5/): its DiT (ComfyUI's comfy/ldm/kandinsky5) and
the text encoder ComfyUI's DualCLIPLoader builds for type `kandinsky5_image` (Qwen2.5-VL 7B's language model plus
CLIP-L's pooled vector), each a tiny random network built by ComfyUI's own classes, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; its extra pins
are listed in comfy_sampling.py; comfy.sd is not imported, so no torchaudio stand-in is needed):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/kandinsky5.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; model.py is comfy/ldm/kandinsky5/model.py):
- model.py:274-308 Kandinsky5.__init__: head_dim = sum(axes_dims) (so the head count is model_dim / sum(axes_dims));
  time_embeddings (:34-50): sinusoid of width model_dim (not time_dim) over freqs exp(-ln(10000) i / (model_dim/2)),
  [cos, sin], of the raw timestep (no factor), then in_layer (model_dim -> time_dim), SiLU, out_layer;
  text_embeddings / pooled_text_embeddings (:53-62): Linear then an affine LayerNorm (eps 1e-5);
  visual_embeddings (:65-85): x [B, C, T, H, W] -> [B, T, H, W, C] -> patches [B, T/pt, H/ph, W/pw, (pt ph pw C)]
  (channel fastest) -> in_layer (visual_embed_dim = C * pt * ph * pw = 64 here; the released image model's is also
  64, the video models' 132 = 33 * 4 with their concat channels).
- model.py:362-387 forward_orig: context = text_embeddings(context); time_embed = time_embeddings(t) +
  pooled_text_embeddings(y); the text blocks (TransformerEncoderBlock :213-236: 6-way modulation shift, scale,
  gate for self-attention then feed-forward; LayerNorm eps 1e-5 without affine; x * (1 + scale) + shift;
  residual + gate * out) run first, on the text alone, with 1-D RoPE; then the visual blocks
  (TransformerDecoderBlock :239-271: 9-way modulation, self-attention with 3-D RoPE, cross-attention to the
  processed text WITHOUT RoPE (:155-158), feed-forward); out_layer (:187-210): 2-way modulation (shift, scale:
  shift first), LayerNorm without affine, Linear to pt ph pw C, un-patched with channel fastest inside a patch.
  Attention (:98-124): q/k/v Linears with biases, per-head RMSNorm on q and k (operations.RMSNorm(head_dim), no eps
  given: torch's default, f32 machine epsilon; comfy/ops.py:680-687), RoPE on q and k after the norm
  (flux/math.py apply_rope1: interleaved pairs), out_layer with bias. FeedForward (:161-184): Linear (no bias),
  exact GELU, Linear (no bias). The chunked paths (> 8192 tokens) are the same math.
- model.py:389-406 _forward: a 4-D latent gets T = 1 (unsqueeze(2)) and the output is squeezed back; x padded to
  the patch (common_dit.pad_to_patch_size); RoPE positions from the UNPADDED h, w rounded to the patch (:321-323).
- model.py:318-360 rope_encode_3d (no rope_options): per axis len' = (len - 1) / rope_scale_factor + 1 and
  positions linspace(0, len' - 1, len), i.e. index / scale: (1, 1, 1) gives integer positions, the video
  default (1, 2, 2) halves the h and w positions (0, 0.5, 1, ...); model_dim 4096 switches to (1, 3.16, 3.16) for
  h * w >= 14080 (not reached here). EmbedND (flux/layers.py:12-26, theta 10000): the axes' frequency pairs
  concatenated t, h, w, each axis' omega 10000^(-2i/d_axis) (flux/math.py:17-29). rope_encode_1d (:311-316): text
  positions 0..L-1 over the whole head (axes_dim [head_dim]).
- model_detection.py:964-980: a file with `visual_transformer_blocks.0.cross_attention.key_norm.weight`;
  model_dim = visual_embeddings.in_layer.bias rows; axes_dims (32, 48, 48) only for model_dim 4096 (Pro video) and
  2560 (Lite image), rope_scale_factor (1, 1, 1) only for 2560; model_dim 1792 (Lite video) gets axes (16, 24, 24);
  other widths get the class defaults (16, 24, 24) and (1, 2, 2). supported_models.py:2141-2162 Kandinsky5Image
  needs model_dim 2560 and visual_embed_dim 64 (shift 3.0, latent format Flux), otherwise :2112 Kandinsky5 (the
  video class: shift 10.0, HunyuanVideo latents). So ComfyUI itself, detecting this tiny file (model_dim 128),
  picks Kandinsky5 (video) with the (16, 24, 24) defaults: the tiny model is built directly with the image
  settings, as the brief asked (recorded in dit_cases.json `comfy_detection`).
- model_base.py:2641-2684 Kandinsky5 / Kandinsky5Image: ModelType.FLOW; encode_adm returns the pooled output as
  `y`; Kandinsky5Image has no concat_cond. model_base.py:210-248 _apply_model: t = model_sampling.timestep(sigma)
  = sigma * 1000 (ModelSamplingDiscreteFlow's multiplier 1000, model_sampling.py:295); CONST: the model gets x as
  is and denoised = x - out * sigma (checked below through Kandinsky5Image.get_model + apply_model).
- Text encoder: sd.py:1959-1961 (CLIPType.KANDINSKY5_IMAGE) -> text_encoders/kandinsky5.py te() /
  Kandinsky5TEModel (:34-57) with Kandinsky5TokenizerImage (:19-22). Tokenizer: QwenImageTokenizer.
  tokenize_with_weights (qwen_image.py:20-49) puts the prompt in the image template (kandinsky5.py:22) and
  tokenizes it with disable_weights=True (a "(red:1.3)" stays literal text), no start/end token, no padding
  (min_length 1, qwen_image.py:11); `l` is ComfyUI's plain CLIP-L SDTokenizer (kandinsky5.py:10-14: start 49406,
  end 49407, padded with 49407 to 77 per section, weights parsed). Kandinsky5Tokenizer (video, :6-16) only
  differs in the template.
- Qwen part: kandinsky5.py:25-31 Qwen25_7BVLIModel = SDClipModel(layer="hidden", layer_idx=-1,
  layer_norm_hidden_state=False, pad 151643, attention masks on and returned); sd1_clip.py:140-143 with
  set_clip_options(:152-164) keeps layer "hidden", layer_idx -1; sd1_clip.py:279-284 calls the transformer with
  intermediate_output=-1, final_layer_norm_intermediate=False and takes outputs[1]; llama.py:884-885 turns -1
  into len(layers) - 1, :921-922 clones x right after that (the last) layer, :927-928 applies the final norm to x
  only, and :937-938 would norm the intermediate only with final_layer_norm_intermediate. CONFIRMED: cond is the
  LAST decoder layer's output WITHOUT the final RMSNorm (`model.norm.weight` is loaded but never affects it).
  Positions 0..N-1 (llama.py:1258-1290: no image, position_ids None -> plain 1-D RoPE; rope_dims unused),
  attention mask all ones (no pad token in the prompt), causal mask finfo.min / 4.
- kandinsky5.py:39-43 encode_token_weights: QwenImageTEModel.encode_token_weights(template_end=-1)
  (qwen_image.py:61-85): template_end = index of the 2nd token 151644 (<|im_start|>), + 3 when followed by 872
  ("user") and 198 ("\\n"); cond = out[:, template_end:] (the prompt tokens and the closing <|im_end|> 151645;
  the image template has no assistant suffix); the attention mask is cut the same way and dropped when all ones
  (always, here: `extra` comes back {}). pooled = CLIP-L's.
- CLIP-L: kandinsky5.py:37 SDClipModel(return_projected_pooled=False) on sd1_clip_config.json (layer "last",
  no attention mask: causal only). sd1_clip.py:27-79 ClipTokenWeightEncoder: each 77-token section encoded;
  pooled = pooled[0:1], the FIRST section's (:48-49), CONFIRMED for `long`; prompt weights only move the per-token
  states z towards an appended empty sequence (:54-63), never the pooled vector: the weighted prompt's pooled is
  the unweighted ids' pooled (checked). The pooled vector (clip_model.py:186-190, :207-210): final_layer_norm of
  the last layer at index num_tokens - 1, num_tokens = process_tokens' mask sum (sd1_clip.py:172-258: 1 up to and
  including the first end token 49407), i.e. the first EOS position, WITHOUT text_projection
  (return_projected_pooled False: outputs[3], sd1_clip.py:289-294). CLIP-L's own cond (l_out) is discarded.
- Loading (kandinsky5.py:53-57): a state dict with `text_model.encoder.layers.1.mlp.fc1.weight` goes to CLIP-L,
  anything else to the Qwen model; both load_state_dict(strict=False) (sd1_clip.py:308-309).

The tiny configs (released Lite image values in brackets):
- DiT (Kandinsky5 kwargs): in/out_visual_dim 16 [16], in_text_dim 96 [3584], in_text_dim2 64 [768], time_dim 64
  [512], model_dim 128 [2560], ff_dim 256 [10240], visual_embed_dim 64 [64], patch (1, 2, 2), 1 text block [2],
  2 visual blocks [50], axes_dims (32, 48, 48) [same] -> head 128 -> ONE head [20 of 128], rope_scale_factor
  (1, 1, 1) [same]. The `video_rope` case builds the same class with axes (16, 24, 24), rope (1, 2, 2) (the class
  defaults, the released video models' settings): head 64 -> 2 heads. Its q/k RMSNorm gains are then 64 wide
  instead of 128, so the same file cannot load: dit_video_norms.safetensors holds those 10 gains (the first 64
  values of each 128-wide gain in dit.safetensors) and every other weight is dit.safetensors' own.
- Qwen2.5-VL language model: ComfyUI's Qwen25_7BVLI with Qwen25_7BVLI_Config overridden to hidden 64 [3584],
  intermediate 128 [18944], 2 layers [28], 2 heads [28] / 1 kv head [4] of head_dim 32 [128] (head_dim and
  rope_dims are class attributes there, set by a subclass: rope_dims [4, 6, 6] scaled from [16, 24, 24], unused
  for text); eps 1e-6, theta 1e6, q/k/v biases, no q/k norm, final norm present (unused, see above), vocabulary
  152064 as released. The vision tower is deleted after construction (text only).
- CLIP-L (clip_model.CLIPTextModel via SDClipModel's model_options["clip_l_model_config"]): hidden 64 [768],
  2 heads [12] of 32, intermediate 128 [3072], 2 layers [12], quick_gelu, 77 positions, LayerNorm eps 1e-5,
  vocabulary 49408 as released (CLIPEmbeddings hard-codes it, clip_model.py:139).
- Embedding tables: the files store only the first 1000 rows of each token table; row r serves every id with
  id % 1000 == r. Kiln's test must tile the stored [1000, 64] table (to >= 152064 rows for Qwen, 49408 for CLIP-L),
  or look up id % 1000: the same thing. Here ComfyUI's modules get the tiled tables (its CLIPEmbeddings cannot be
  smaller than 49408 rows) and run unchanged on the real ids (the template strip, the CLIP mask and the pooled
  position read the real ids).

Shims on ComfyUI (the only places this departs from its code path): llama.Qwen25_7BVLI_Config is swapped for the
tiny subclass while the encoder is built, and CLIP-L's tiny config goes through ComfyUI's own model_options
override (sd1_clip.py:105); the vision tower is deleted; the token tables are tiled as above. The encoder is built
by kandinsky5.te() (what sd.py:1960 builds) and loaded through its load_sd, without the CLIP/ModelPatcher wrapper.

Writes engine/models/tests/fixtures/kandinsky5/:
- dit.safetensors: the DiT under ComfyUI's module names (Kandinsky5.state_dict(), no prefix), every tensor bf16.
  Weights N(0, 1) / sqrt(fan_in), biases 0.1 N, LayerNorm (text_embeddings.norm, pooled_text_embeddings.norm)
  gains 1 + 0.1 N and biases 0.1 N, q/k RMSNorm gains 1 + 0.1 N.
- dit_video_norms.safetensors: `{text,visual}_transformer_blocks.N.{self,cross}_attention.{query,key}_norm.weight`
  [64] bf16 for the video_rope case (see above).
- dit_io.safetensors (f32), per case c: `{c}.x` [B, 16, H, W], `{c}.t` [B] (what the model gets: sigma * 1000),
  `{c}.context` [B, L, 96], `{c}.y` [B, 64], `{c}.out` [B, 16, H, W] = Kandinsky5(x, t, context, y):
  a: x [1,16,8,8], t [750], L 7; b: x [2,16,6,10], t [1000, 200], L 5; video_rope: x [1,16,8,6], t [500], L 4
  (axes (16, 24, 24), rope (1, 2, 2): h positions 0, .5, 1, 1.5 and w positions 0, .5, 1).
  Intermediates for case a: `a.time_embed` [1, 64] (time_embeddings(t) + pooled_text_embeddings(y)),
  `a.text` [1, 7, 128] (the context after text_embeddings and the text block).
- dit_cases.json: per case its config (axes_dims, rope_scale_factor, heads, weight files), t, shapes; the
  Kandinsky5 kwargs; ComfyUI's detection of dit.safetensors.
- te_qwen.safetensors (bf16): model.embed_tokens.weight [1000, 64] (tiled, see above),
  model.layers.N.self_attn.{q_proj [64, 64] (+ bias [64]), k_proj, v_proj [32, 64] (+ bias [32]), o_proj [64, 64]
  (no bias)}.weight, model.layers.N.mlp.{gate_proj, up_proj [128, 64], down_proj [64, 128]}.weight,
  model.layers.N.{input_layernorm, post_attention_layernorm}.weight [64], model.norm.weight [64] (unused by the
  encoder's output, stored as the released file has it).
- te_clip_l.safetensors (bf16), transformers' CLIP-L names as ComfyUI's clip_l.safetensors:
  text_model.embeddings.token_embedding.weight [1000, 64] (tiled), text_model.embeddings.position_embedding.weight
  [77, 64], text_model.encoder.layers.N.{layer_norm1, layer_norm2, self_attn.{q,k,v,out}_proj, mlp.fc1, mlp.fc2}.
  {weight, bias}, text_model.final_layer_norm.{weight, bias}, text_projection.weight [64, 64] (unused:
  return_projected_pooled False).
- te_io.safetensors (f32), per case e: `{e}.cond` [1, N, 64] and `{e}.pooled` [1, 64] =
  Kandinsky5TEModel.encode_token_weights(Kandinsky5TokenizerImage().tokenize_with_weights(prompt)).
- te_cases.json: per case the prompt, `qwen25_7b` (the Qwen ids), `template_end`, `l` ({"ids", "weights"} per
  77-token section), shapes, `had_attention_mask`; for `cat` also `video_qwen_ids` (Kandinsky5Tokenizer's);
  the configs and the embedding-table rule.

Checks: the loaded ComfyUI modules hold exactly the written values; ComfyUI's Kandinsky5Image model
(get_model + apply_model) on case a denoises as x - out * sigma with t = sigma * 1000 (exact); the written files
round-trip. Cross-checks (max |diff| / max |ref|, this run, CPU f32):
- diffusers 0.42.1 Kandinsky5Transformer3DModel (transformers/transformer_kandinsky.py), loaded strictly from the
  same state dict (identical module names; for video_rope with dit_video_norms.safetensors): stock 4.7e-4 (a),
  5.5e-4 (b), 6.7e-4 (video_rope); with F32RotaryProcessor 3.3e-7, 4.3e-7, 4.3e-7. The stock gap is diffusers'
  own: its attention processor rounds the rotated q and k to bf16 even in f32 (transformer_kandinsky.py:309-312,
  `.to(torch.bfloat16)` in apply_rotary); F32RotaryProcessor is that processor without the cast. Reconciled
  conventions: diffusers takes channels-last [B, T, H, W, C] (x.unsqueeze(2).permute and back); the same t
  (sigma * 1000; no time factor on either side); text RoPE positions arange(L); visual positions arange per axis in
  patch units with scale_factor = rope_scale_factor (diffusers divides the angles by the factor, ComfyUI the
  positions: the same); diffusers' in_visual_dim 16 with visual_cond False gives the same 64-wide patch Linear.
- transformers 5.24 Qwen2_5_VLForConditionalGeneration's language model (vocab 1000 fed id % 1000, positions
  arange, eager): a forward hook on its last decoder layer vs ComfyUI's pre-strip output, whole sequence: 2.5e-7 to
  2.9e-7 on the four cases; its last_hidden_state (after model.norm) is > 10% away (asserted), which confirms the
  missing final norm.
- transformers CLIPTextModel (vocab 1000 fed id % 1000): last_hidden_state at the first 49407 of section 0 vs
  ComfyUI's pooled: 0 (bitwise) on the four cases.
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

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/kandinsky5")
SEED = 55
BUDGET = 3_000_000

DIT = dict(in_visual_dim=16, out_visual_dim=16, in_text_dim=96, in_text_dim2=64, time_dim=64, model_dim=128,
           ff_dim=256, visual_embed_dim=64, patch_size=(1, 2, 2), num_text_blocks=1, num_visual_blocks=2)
IMAGE_ROPE = dict(axes_dims=(32, 48, 48), rope_scale_factor=(1.0, 1.0, 1.0))
VIDEO_ROPE = dict(axes_dims=(16, 24, 24), rope_scale_factor=(1.0, 2.0, 2.0))
# name: (batch, h, w, text tokens, t, rope)
DIT_CASES = {
    "a": (1, 8, 8, 7, [750.0], "image"),
    "b": (2, 6, 10, 5, [1000.0, 200.0], "image"),
    "video_rope": (1, 8, 6, 4, [500.0], "video"),
}
ROPES = {"image": IMAGE_ROPE, "video": VIDEO_ROPE}

ROWS = 1000  # stored rows of each token table; row r serves every id with id % ROWS == r
QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
QWEN_HEAD_DIM = 32
QWEN_ROPE_DIMS = [4, 6, 6]
QWEN_VOCAB = 152064
CLIP_L = {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2}
CLIP_VOCAB = 49408
CLIP_BOS, CLIP_EOS = 49406, 49407
IM_START, IM_END = 151644, 151645
LONG = ("a breathtaking panoramic photograph of an ancient stone lighthouse standing on a rugged cliff above a "
        "stormy grey ocean at dusk, towering waves crashing against black volcanic rocks below, sea spray drifting "
        "through the cold salty air, a narrow winding footpath lined with wild heather and yellow gorse leading up "
        "to a weathered wooden door, warm golden light glowing from the lantern room at the top, flocks of white "
        "seagulls circling overhead, dramatic clouds tinted purple and orange by the setting sun, a small red "
        "fishing boat struggling through the swell in the distance, highly detailed, cinematic composition, "
        "volumetric lighting, sharp focus, shot on a medium format camera with a wide angle lens")
PROMPTS = {"cat": "a photo of a cat", "empty": "", "long": LONG, "weighted": "a (red:1.3) cube"}


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
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.GroupNorm))
            or type(m).__name__ == "RMSNorm"}


def f32(sd):
    return {k: v.float() for k, v in sd.items()}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_loaded(module, want, skip=()):
    have = {k: v for k, v in module.state_dict().items() if not k.startswith(skip)}
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


def build_dit(rope):
    import comfy.ops
    from comfy.ldm.kandinsky5.model import Kandinsky5

    return Kandinsky5(**DIT, **ROPES[rope], operations=comfy.ops.manual_cast).eval()


def video_norm_names(weights):
    return [k for k in weights if k.endswith(("query_norm.weight", "key_norm.weight"))]


def dit_fixture():
    import comfy.model_detection
    import comfy.supported_models

    draw = Draw(SEED)
    model = build_dit("image")
    weights = draw_module(draw, model, norm_names(model))
    video_norms = {k: weights[k][:64].clone() for k in video_norm_names(weights)}
    assert len(video_norms) == 10 and all(v.shape == (128,) for k, v in weights.items() if k in video_norms)
    save_file(weights, f"{OUT}/dit.safetensors")
    save_file(video_norms, f"{OUT}/dit_video_norms.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    video_norms = load_file(f"{OUT}/dit_video_norms.safetensors")
    model.load_state_dict(f32(weights), strict=True)
    check_loaded(model, weights)
    video = build_dit("video")
    video.load_state_dict(f32({**weights, **video_norms}), strict=True)
    check_loaded(video, {**weights, **video_norms})
    assert model.text_transformer_blocks[0].self_attention.num_heads == 1
    assert video.text_transformer_blocks[0].self_attention.num_heads == 2
    models = {"image": model, "video": video}

    # What ComfyUI makes of the file (it keys the rope settings on model_dim; see the docstring).
    detected = comfy.model_detection.detect_unet_config(weights, "")
    picked = comfy.model_detection.model_config_from_unet(weights, "")
    print(f"detect_unet_config: {detected}; model config {type(picked).__name__}")
    assert "axes_dims" not in detected and type(picked).__name__ == "Kandinsky5"

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (b, h, w, n, t, rope) in DIT_CASES.items():
            x = torch.randn(b, 16, h, w, generator=g)
            context = torch.randn(b, n, DIT["in_text_dim"], generator=g)
            y = torch.randn(b, DIT["in_text_dim2"], generator=g)
            t = torch.tensor(t)
            out = models[rope](x, t, context, y, transformer_options={})
            assert out.shape == x.shape and torch.isfinite(out).all()
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.y": y,
                       f"{name}.out": out})
            heads = models[rope].text_transformer_blocks[0].self_attention.num_heads
            cases[name] = {"axes_dims": list(ROPES[rope]["axes_dims"]),
                           "rope_scale_factor": list(ROPES[rope]["rope_scale_factor"]),
                           "head_dim": sum(ROPES[rope]["axes_dims"]), "heads": heads,
                           "weights": ["dit.safetensors"] + (["dit_video_norms.safetensors"] if rope == "video"
                                                             else []),
                           "t": t.tolist(), "x": list(x.shape), "context": list(context.shape),
                           "y": list(y.shape), "out": list(out.shape)}
            print(f"DiT case {name}: x {tuple(x.shape)}, t {t.tolist()}, {heads} head(s), out std {out.std():.3f}, "
                  f"max |out| {out.abs().max():.3f}")
        # Intermediates for case a.
        m = model
        io["a.time_embed"] = m.time_embeddings(io["a.t"], torch.float32) + m.pooled_text_embeddings(io["a.y"])
        text = m.text_embeddings(io["a.context"])
        freqs_text = m.rope_encode_1d(text.shape[1], dtype=torch.float32)
        for block in m.text_transformer_blocks:
            text = block(text, io["a.time_embed"], freqs_text, transformer_options={})
        io["a.text"] = text
        cases["a"]["intermediates"] = {"a.time_embed": "time_embeddings(t) + pooled_text_embeddings(y)",
                                       "a.text": "text_embeddings(context) after the text block(s)"}

        # ComfyUI's model_base path: Kandinsky5Image built from the tiny config, denoised = x - out * sigma.
        mc = comfy.supported_models.Kandinsky5Image({"image_model": "kandinsky5", **DIT, **IMAGE_ROPE})
        mc.set_inference_dtype(torch.float32, None)
        based = mc.get_model({})
        based.diffusion_model.load_state_dict(f32(weights), strict=True)
        sigma = io["a.t"] / 1000.0
        assert float(based.model_sampling.timestep(sigma)) == 750.0
        denoised = based.apply_model(io["a.x"], sigma, c_crossattn=io["a.context"], y=io["a.y"])
        err = rel_err(denoised, io["a.x"] - io["a.out"] * sigma.view(-1, 1, 1, 1))
        print(f"Kandinsky5Image.apply_model, case a (sigma 0.75): denoised vs x - out * sigma {err:.2e}")
        assert err < 1e-5
        dit_cross_check(weights, video_norms, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({"seed": SEED, "kandinsky5_kwargs": {**DIT, "patch_size": list(DIT["patch_size"])},
                   "t_is": "sigma * 1000 (ModelSamplingDiscreteFlow multiplier 1000)",
                   "storage": "every tensor bf16; computed in f32 from the stored values",
                   "video_norms": "dit_video_norms.safetensors replaces the 10 q/k RMSNorm gains (head 64) for the "
                                  "video_rope case; each is the first 64 values of dit.safetensors' 128-wide gain",
                   "cases": cases,
                   "comfy_detection": {"detect_unet_config": {k: (list(v) if isinstance(v, tuple) else v)
                                                              for k, v in detected.items()},
                                       "model_config": type(picked).__name__,
                                       "note": "model_dim 128 is neither 2560 nor 4096, so ComfyUI would load this "
                                               "file with the class defaults (axes 16/24/24, rope 1/2/2) as the "
                                               "video Kandinsky5 config; the fixtures use the image settings"}},
                  f, indent=1)
        f.write("\n")


class F32RotaryProcessor:
    """diffusers' Kandinsky5AttnProcessor (transformer_kandinsky.py:283-341) without the bf16 cast of the rotated
    q and k (its apply_rotary ends in `.to(torch.bfloat16)`); otherwise the same operations."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, rotary_emb=None, sparse_params=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        source = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query = attn.to_query(hidden_states)
        key = attn.to_key(source)
        value = attn.to_value(source)
        query = query.reshape(*query.shape[:-1], attn.num_heads, -1)
        key = key.reshape(*key.shape[:-1], attn.num_heads, -1)
        value = value.reshape(*value.shape[:-1], attn.num_heads, -1)
        query = attn.query_norm(query.float()).type_as(query)
        key = attn.key_norm(key.float()).type_as(key)
        if rotary_emb is not None:
            def rotate(x):
                return (rotary_emb * x.reshape(*x.shape[:-1], -1, 1, 2).float()).sum(dim=-1).reshape(*x.shape)

            query, key = rotate(query), rotate(key)
        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=None)
        return attn.out_layer(hidden_states.flatten(-2, -1))


def dit_cross_check(weights, video_norms, io):
    from diffusers import Kandinsky5Transformer3DModel

    print("diffusers Kandinsky5Transformer3DModel:")
    for name, (b, h, w, n, t, rope) in DIT_CASES.items():
        cfg = ROPES[rope]
        net = Kandinsky5Transformer3DModel(
            in_visual_dim=16, in_text_dim=DIT["in_text_dim"], in_text_dim2=DIT["in_text_dim2"],
            time_dim=DIT["time_dim"], out_visual_dim=16, patch_size=DIT["patch_size"], model_dim=DIT["model_dim"],
            ff_dim=DIT["ff_dim"], num_text_blocks=DIT["num_text_blocks"], num_visual_blocks=DIT["num_visual_blocks"],
            axes_dims=cfg["axes_dims"]).eval()
        sd = f32({**weights, **(video_norms if rope == "video" else {})})
        result = net.load_state_dict(sd, strict=True)
        assert not result.missing_keys and not result.unexpected_keys, result
        x = io[f"{name}.x"].unsqueeze(2).permute(0, 2, 3, 4, 1)  # [B, T=1, H, W, C]
        visual_pos = [torch.arange(1), torch.arange(h // 2), torch.arange(w // 2)]
        for label, processor in (("stock", None), ("f32 rotary", F32RotaryProcessor())):
            if processor is not None:
                for module in net.modules():
                    if type(module).__name__ == "Kandinsky5Attention":
                        module.set_processor(processor)
            out = net(x, io[f"{name}.context"], io[f"{name}.t"], io[f"{name}.y"], visual_rope_pos=visual_pos,
                      text_rope_pos=torch.arange(n), scale_factor=cfg["rope_scale_factor"], return_dict=False)
            out = out.permute(0, 4, 1, 2, 3).squeeze(2)
            report(f"diffusers ({label}) vs ComfyUI, DiT case {name}", rel_err(out, io[f"{name}.out"]),
                   3e-2 if processor is None else 1e-5)


# ------------------------------------------------------------------------------------------- the text encoder


def tiny_te():
    """kandinsky5.te()'s model (sd.py:1960's) with the tiny Qwen config (llama.Qwen25_7BVLI builds
    Qwen25_7BVLI_Config(**config_dict) from the module's global; head_dim and rope_dims are class attributes,
    so a subclass sets them) and the tiny CLIP-L config (SDClipModel's model_options override)."""
    import comfy.text_encoders.kandinsky5 as k5
    import comfy.text_encoders.llama as llama

    real = llama.Qwen25_7BVLI_Config
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in QWEN.items()]
    tiny = dataclasses.make_dataclass("TinyQwen25_7BVLI_Config", fields, bases=(real,),
                                      namespace={"head_dim": QWEN_HEAD_DIM, "rope_dims": QWEN_ROPE_DIMS})
    llama.Qwen25_7BVLI_Config = tiny
    try:
        te = k5.te()(device="cpu", dtype=torch.float32,
                     model_options={"clip_l_model_config": dict(CLIP_L)})
    finally:
        llama.Qwen25_7BVLI_Config = real
    qwen = te.qwen25_7b.transformer
    del qwen.visual  # text only
    cfg = qwen.model.config
    assert (cfg.head_dim, cfg.rms_norm_eps, cfg.rope_theta, cfg.vocab_size, cfg.qkv_bias, cfg.q_norm,
            cfg.final_norm, cfg.rope_scale) == (QWEN_HEAD_DIM, 1e-6, 1e6, QWEN_VOCAB, True, None, True, None)
    q = te.qwen25_7b
    assert (q.layer, q.layer_idx, q.layer_norm_hidden_state, q.enable_attention_masks) == ("hidden", -1, False, True)
    c = te.clip_l
    assert (c.layer, c.layer_norm_hidden_state, c.return_projected_pooled, c.enable_attention_masks) == \
        ("last", True, False, False)
    assert c.special_tokens == {"start": CLIP_BOS, "end": CLIP_EOS, "pad": CLIP_EOS}
    return te


def te_fixture():
    import comfy.text_encoders.kandinsky5 as k5

    te = tiny_te()
    qwen, clip = te.qwen25_7b.transformer, te.clip_l.transformer
    draw = Draw(SEED + 2)
    q_sd = draw_module(draw, qwen, norm_names(qwen))
    q_sd["model.embed_tokens.weight"] = q_sd["model.embed_tokens.weight"][:ROWS].clone()
    c_sd = draw_module(draw, clip, norm_names(clip))
    c_sd["text_model.embeddings.token_embedding.weight"] = \
        c_sd["text_model.embeddings.token_embedding.weight"][:ROWS].clone()
    # The released files' layouts: Qwen-Image's `model.*` text keys; CLIP-L's `text_model.*` + text_projection.
    assert all(k.startswith("model.") for k in q_sd) and all(k.startswith(("text_model.", "text_projection"))
                                                             for k in c_sd), (list(q_sd)[:3], list(c_sd)[:3])
    save_file(q_sd, f"{OUT}/te_qwen.safetensors")
    save_file(c_sd, f"{OUT}/te_clip_l.safetensors")
    q_sd, c_sd = load_file(f"{OUT}/te_qwen.safetensors"), load_file(f"{OUT}/te_clip_l.safetensors")

    # Kandinsky5TEModel.load_sd routes each file (kandinsky5.py:53-57); the tables tiled to the real vocabularies.
    q_full = f32(q_sd)
    q_full["model.embed_tokens.weight"] = tile(q_full["model.embed_tokens.weight"], QWEN_VOCAB)
    c_full = f32(c_sd)
    c_full["text_model.embeddings.token_embedding.weight"] = \
        tile(c_full["text_model.embeddings.token_embedding.weight"], CLIP_VOCAB)
    for sd in (q_full, c_full):
        missing, unexpected = te.load_sd(dict(sd))
        assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    check_loaded(qwen, q_full)
    check_loaded(clip, c_full)
    te.eval()

    tokenizer = k5.Kandinsky5TokenizerImage()
    video_tokenizer = k5.Kandinsky5Tokenizer()
    io, cases = {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = tokenizer.tokenize_with_weights(prompt)
            assert set(tokens) == {"qwen25_7b", "l"} and len(tokens["qwen25_7b"]) == 1
            ids = [int(t[0]) for t in tokens["qwen25_7b"][0]]
            assert all(t[1] == 1.0 for t in tokens["qwen25_7b"][0])  # disable_weights
            l_ids = [[int(t[0]) for t in s] for s in tokens["l"]]
            l_weights = [[float(t[1]) for t in s] for s in tokens["l"]]
            cond, pooled, extra = te.encode_token_weights(tokens)
            starts = [i for i, v in enumerate(ids) if v == IM_START]
            template_end = starts[1] + 3
            assert ids[starts[1] + 1: starts[1] + 3] == [872, 198] and ids[-1] == IM_END
            # The Qwen part before the strip: the last layer's output without the final norm.
            z, none, mask_extra = te.qwen25_7b([ids])
            assert none is None and int(mask_extra["attention_mask"].sum()) == len(ids)
            assert torch.equal(cond, z[:, template_end:]), name
            assert cond.shape == (1, len(ids) - template_end, 64) and pooled.shape == (1, 64)
            io[f"{name}.cond"], io[f"{name}.pooled"] = cond, pooled
            cases[name] = {"prompt": prompt, "qwen25_7b": ids, "template_end": template_end,
                           "l": {"ids": l_ids, "weights": l_weights}, "cond_shape": list(cond.shape),
                           "pooled_shape": list(pooled.shape), "had_attention_mask": "attention_mask" in extra,
                           "extra_keys": sorted(extra)}
            print(f"encoder {name}: {len(ids)} Qwen ids, template_end {template_end}, cond {tuple(cond.shape)}, "
                  f"{len(l_ids)} CLIP section(s), extra {sorted(extra)}")

            # CLIP-L's pooled is the first section's, weights ignored (ClipTokenWeightEncoder).
            _, first_pooled = te.clip_l([l_ids[0]])[:2]
            err = rel_err(pooled, first_pooled)
            assert err < 1e-6, (name, err)
            cases[name]["pooled_from"] = "section 0 (its first 49407), weights not applied"

        video_ids = [int(t[0]) for t in video_tokenizer.tokenize_with_weights(PROMPTS["cat"])["qwen25_7b"][0]]
        cases["cat"]["video_qwen_ids"] = video_ids
        assert len(cases["long"]["l"]["ids"]) == 2 and sum(
            1 for s in cases["long"]["l"]["ids"] for i in s if i not in (CLIP_BOS, CLIP_EOS)) > 100
        assert any(w != 1.0 for w in cases["weighted"]["l"]["weights"][0])
        assert not any(c["had_attention_mask"] for c in cases.values())
        # The two sections' pooled vectors differ (so "first section" is a real choice).
        second = te.clip_l([cases["long"]["l"]["ids"][1]])[1]
        assert rel_err(second, io["long.pooled"]) > 1e-2
        # The weighted prompt's pooled equals the same ids unweighted.
        unweighted = {k: [[(t[0], 1.0) for t in s] for s in v]
                      for k, v in tokenizer.tokenize_with_weights(PROMPTS["weighted"]).items()}
        _, pooled_unweighted, _ = te.encode_token_weights(unweighted)
        err = rel_err(io["weighted.pooled"], pooled_unweighted)
        print(f"weighted prompt: pooled vs the same ids unweighted {err:.2e}")
        assert err < 1e-6
        te_cross_check(q_sd, c_sd, cases, te)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "embedding_rows": ROWS,
            "embedding_rule": f"te_qwen / te_clip_l store {ROWS} token-table rows; id i uses row i % {ROWS} (tile the "
                              f"table to {QWEN_VOCAB} / {CLIP_VOCAB} rows); the real ids are used everywhere else",
            "qwen_config": {**QWEN, "head_dim": QWEN_HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                            "qkv_bias": True, "vocab_size": QWEN_VOCAB, "layer": "hidden", "layer_idx": -1,
                            "final_norm_applied": False},
            "clip_l_config": {**CLIP_L, "hidden_act": "quick_gelu", "max_position_embeddings": 77,
                              "layer_norm_eps": 1e-5, "vocab_size": CLIP_VOCAB, "bos": CLIP_BOS, "eos": CLIP_EOS,
                              "pooled": "final_layer_norm(last layer) at the first 49407 of section 0, no projection"},
            "template": tokenizer.llama_template,
            "video_template": video_tokenizer.llama_template,
            "template_end_rule": "index of the 2nd 151644 (<|im_start|>) + 3 when followed by 872, 198",
            "weighted_pooled": "ComfyUI ignores prompt weights for the pooled vector (sd1_clip.py:48-49: pooled of "
                               "section 0 as encoded, weights only applied to the per-token states); the Qwen part "
                               "tokenizes with disable_weights, so '(red:1.3)' is literal text there",
            "cases": cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")


def te_cross_check(q_sd, c_sd, cases, te):
    from transformers import CLIPTextConfig, CLIPTextModel, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=ROWS, **QWEN, rms_norm_eps=1e-6, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=None,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default", "mrope_section": QWEN_ROPE_DIMS}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64),
        attn_implementation="eager")
    lm = Qwen2_5_VLForConditionalGeneration(config).eval().model.language_model
    assert lm.layers[0].self_attn.head_dim == QWEN_HEAD_DIM
    lm.load_state_dict({k[len("model."):]: v for k, v in f32(q_sd).items()}, strict=True)
    seen = {}
    lm.layers[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("h", o[0] if isinstance(o, tuple) else o))

    cm = CLIPTextModel(CLIPTextConfig(vocab_size=ROWS, max_position_embeddings=77, hidden_act="quick_gelu",
                                      layer_norm_eps=1e-5, bos_token_id=CLIP_BOS % ROWS, eos_token_id=CLIP_EOS % ROWS,
                                      pad_token_id=1, attn_implementation="eager", **CLIP_L)).eval()
    strip = "text_model." if "final_layer_norm.weight" in cm.state_dict() else ""
    missing, unexpected = cm.load_state_dict({k[len(strip):]: v for k, v in f32(c_sd).items()
                                              if k != "text_projection.weight"}, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)

    print("transformers:")
    for name, case in cases.items():
        ids = torch.tensor([case["qwen25_7b"]])
        normed = lm(input_ids=ids % ROWS, position_ids=torch.arange(ids.shape[1])[None]).last_hidden_state
        z = te.qwen25_7b([case["qwen25_7b"]])[0]
        report(f"transformers Qwen2.5-VL last layer (hook, no final norm) vs ComfyUI, case {name}",
               rel_err(seen["h"], z), 1e-5)
        # transformers' last_hidden_state (after model.norm) is far from ComfyUI's output: the norm is not applied.
        assert rel_err(normed, z) > 0.1, name
        l_ids = torch.tensor([case["l"]["ids"][0]])
        last = cm(input_ids=l_ids % ROWS).last_hidden_state
        eos = int((l_ids[0] == CLIP_EOS).nonzero()[0])
        pooled = te.clip_l([case["l"]["ids"][0]])[1]
        report(f"transformers CLIPTextModel pooled (first 49407) vs ComfyUI, case {name}",
               rel_err(last[:, eos], pooled), 1e-5)
        assert rel_err(last[:, eos - 1], pooled) > 0.1 and rel_err(last[:, -1], pooled) > 0.1 or eos == 76, name


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
