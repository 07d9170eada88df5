"""Fixtures for Qwen3-VL 4B as a text encoder (engine/models/tests/fixtures/qwen3vl_te/): what ComfyUI's CLIPLoader
builds from `qwen3vl_4b_bf16.safetensors` with type `krea2` (Krea 2) and type `mage` (Mage-Flow), text only, on a
tiny random Qwen3-VL 4B built by ComfyUI's own classes, written in transformers' layout and loaded by ComfyUI's own
loader. Follows scripts/reference/boogu.py (the same language model as Qwen3-VL 8B under type `boogu`).

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd imports
torchaudio, for which comfyui.py puts an empty stand-in on the path when it is missing):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/qwen3vl_te.py
It takes 10 to 30 s on the CPU and is reproducible: a second run writes byte-identical files (every random value
comes from a seeded torch generator; nothing is written from the cross-checks).

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; k2.py is comfy/text_encoders/krea2.py, mf.py
mage_flow.py, q3vl.py qwen3vl.py, ll.py llama.py, sd1.py comfy/sd1_clip.py):
- Loading, sd.py:1705-1706 then :1876-1883: `lm_head.weight` (if any) becomes `model.lm_head.weight`;
  detect_te_model (sd.py:1645-1646) says QWEN3VL_4B when the file has `model.visual.deepstack_merger_list.0.norm
  .weight` and `model.visual.merger.linear_fc2.weight` has 2560 rows (QWEN3VL_8B otherwise). The `krea2` and `mage`
  branches require QWEN3VL_4B (an 8B file with either type falls through to the generic qwen3vl.te branch, :1892-
  1896); both rename `model.language_model.` -> `model.`, `model.visual.` -> `visual.`, `lm_head.` ->
  `model.lm_head.` (state_dict_prefix_replace) and build k2.te / mf.te(**llama_detect) with Krea2Tokenizer /
  MageFlowTokenizer. The text model is q3vl.py Qwen3VL over Qwen3VL_4BConfig (ll.py:283-287 over Qwen3VL_8BConfig
  :276-280 over Qwen3_8BConfig :249-273): vocab 151936, hidden 2560, intermediate 9728, 36 layers, 32 heads / 8 kv
  heads of head_dim 128 (q width 4096 != hidden), eps 1e-6, theta 5e6, q_norm / k_norm RMSNorm(head_dim) per head
  before RoPE, silu MLP, final norm, NO lm_head (lm_head False: the 4B ties it to the table; a file's lm_head is
  left unloaded by the strict=False load), rope_dims [24, 20, 20] interleaved M-RoPE, which for text (one position
  row, q3vl.py:98-99, ll.py:828-829) is plain rotate-half RoPE at 0..N-1 (boogu.py checks that). The vision tower
  (QWEN3VL_VISION["qwen3vl_4b"], q3vl.py:14-20) is always built; text never runs it.
- Krea 2 (k2.py): Krea2Qwen3VLClipModel = Qwen3VLClipModel(layer=KREA2_TAP_LAYERS [2, 5, ..., 35], layer_idx None;
  layer_norm_hidden_state stays False). SDClipModel.forward (sd1.py:260-293) passes the list as
  intermediate_output; Llama2_.forward (ll.py:816-943) appends x.unsqueeze(1) BEFORE layer i runs for each listed
  i (the input of layer i = the output of layer i - 1 = transformers' hidden_states[i], 0 the embeddings), after
  the loop appends the final-normed x only when len(layers) is listed (36 is not), and does NOT norm the stack
  (final_layer_norm_intermediate False): z [B, 12, N, D]. CLIPSetLastLayer cannot change it (a list layer ignores
  set_clip_options). Krea2TEModel.encode_token_weights (k2.py:43-72): template_end = the index of the LAST of the
  first two `<|im_start|>` (151644) ids; if N > template_end + 3 and the next ids are `user` (872) and `\\n` (198),
  template_end += 3; z[:, :, template_end:] then permute(0, 2, 1, 3).reshape(B, N', 12 D): per token the twelve
  taps side by side, tap-major (features [t * D, (t + 1) * D) are tap t). The attention mask is cut the same way and
  dropped when all ones.
- Mage-Flow (mf.py): MageFlowQwen3VLClipModel = Qwen3VLClipModel (layer "hidden", layer_idx -1) with
  layer_norm_hidden_state True: layer 35's output (ll.py:884-885 turns -1 into 35, :921-922 clones it) through the
  final norm (:937-938) = transformers' last_hidden_state. encode_token_weights (mf.py:56-80): the same cut (it tests
  out.shape[1], the sequence, where Krea 2 tests out.shape[2], also the sequence), no flatten: [B, N', D].
- Tokenizers: Krea2Tokenizer / MageFlowTokenizer (k2.py:23-30, mf.py:23-41) over Qwen3VLTokenizer (q3vl.py:161-
  196): the SAME t2i template (KREA2_TEMPLATE == MAGE_T2I_TEMPLATE, Qwen-Image's system prompt, ending
  "<|im_start|>assistant\\n"), thinking=True so no "<think>\\n\\n</think>\\n\\n" (Qwen3VLTokenizer's default
  thinking=False would append it: checked); a text starting with "<|im_start|>" is used as is (no template); no
  drop template for an empty or blank prompt. The templated text goes to SD1Tokenizer with disable_weights=True
  (q3vl.py:187): "(word:1.2)" is literal text, every weight 1.0; escape_important / unescape_important
  (sd1.py:368-376, :584-593) still run, so "\\(" and "\\)" lose their backslash. Qwen3VLSDTokenizer (q3vl.py:147-
  152): transformers' Qwen2Tokenizer on comfy/text_encoders/qwen25_tokenizer, no start / end token, pad 151643, one
  section, min_length 1, never padded, max_length 99999999. The embeddings folder (CLIPLoader passes it; an empty
  one here) makes the text split before a whitespace-preceded "embedding:" and a missing name dropped
  (fixtures `divergent`: Kiln keeps it as text, as it says of zimage_prompt).
- process_tokens (sd1.py:172-258): pad 151643 (`<|endoftext|>`) is also the comparison token (no end token): the
  mask is 1 up to the first `<|endoftext|>`, which is itself masked, and 0 after it; masked keys get finfo.min / 4
  (ll.py:833-843); the masked rows are still computed and returned. CLIP.encode_from_tokens(return_dict=True)
  (sd.py:395-418): {"cond", "pooled_output": None, "attention_mask" (only when it holds a 0)}.

Tiny config (released values in brackets), built by ComfyUI's classes with three swaps, the script's only
departures from its code path, held while ComfyUI builds the model: QWEN3VL_CONFIGS["qwen3vl_4b"] -> a
Qwen3VL_4BConfig subclass (head_dim is a class attribute): hidden 32 [2560], intermediate 64 [9728], 36 layers [36]
(Krea 2 taps up to 35), 4 heads [32] over 2 kv heads [8] of head_dim 16 [128] (q width 64 != hidden 32, as 4096 !=
2560), eps 1e-6, theta 5e6; QWEN3VL_VISION["qwen3vl_4b"] -> a tiny vision tower: hidden 8 [1024], intermediate 16
[4096], depth 2 [24], deepstack mergers after blocks [0, 1] [5, 11, 17], 2 heads [16], patch 2 [16], 16 position
embeddings [2304], temporal patch 2 and spatial merge 2 as released; and q3vl.Qwen3VLVisionModel -> a subclass whose
out_hidden_size is 2560 (ComfyUI sets it to the language model's width, 2560 in the released file, 32 here), so the
file's `model.visual.merger.linear_fc2.weight` has the released 2560 rows and the UNPATCHED detect_te_model says
QWEN3VL_4B (recorded), and the deepstack mergers' linear_fc2 have 2560 rows too (transformers' out_hidden_size: the
file loads strictly into its Qwen3VLModel). detect_te_model itself is not patched.

Writes engine/models/tests/fixtures/qwen3vl_te/ (every tensor f32):
- qwen3vl_4b.safetensors, transformers' / Comfy-Org's layout: model.language_model.embed_tokens.weight [1000, 32]
  (the first 1000 rows: id i uses row i % 1000; tile it to 151936 rows, as common.rs tiled_table does and this
  script does before ComfyUI's loader sees it), model.language_model.layers.N (N = 0..35).self_attn.{q_proj [64, 32],
  k_proj [32, 32], v_proj [32, 32], o_proj [32, 64]}.weight, .self_attn.{q_norm, k_norm}.weight [16],
  .mlp.{gate_proj, up_proj}.weight [64, 32], .mlp.down_proj.weight [32, 64], .{input_layernorm,
  post_attention_layernorm}.weight [32], model.language_model.norm.weight [32]; model.visual.patch_embed.proj.{weight
  [8, 3, 2, 2, 2], bias [8]}, model.visual.pos_embed.weight [16, 8], model.visual.blocks.N (N = 0, 1).{norm1, norm2}
  .{weight, bias} [8], .attn.qkv.{weight [24, 8], bias [24]}, .attn.proj.{weight [8, 8], bias [8]},
  .mlp.linear_fc1.{weight [16, 8], bias [16]}, .mlp.linear_fc2.{weight [8, 16], bias [8]}; model.visual.merger.norm
  .{weight, bias} [8], .linear_fc1.{weight [32, 32], bias [32]}, .linear_fc2.{weight [2560, 32], bias [2560]};
  model.visual.deepstack_merger_list.N (N = 0, 1).norm.{weight, bias} [32], .linear_fc1 as the merger's,
  .linear_fc2.{weight [2560, 32], bias [2560]}; no lm_head. Weights N(0, 1) / sqrt(fan_in), the token table N(0, 1),
  norm gains (q_norm / k_norm included) 1 + 0.1 N, biases 0.1 N.
- te_io.safetensors: `{t}.{case}.cond` for t in krea2 ([1, N', 384] = 12 taps x 32) and mage ([1, N', 32]) =
  CLIP.encode_from_tokens(CLIP.tokenize(prompt), return_dict=True)["cond"]; `{t}.{case}.attention_mask` [1, N']
  (as f32) where ComfyUI returns one (the `endoftext` case).
- te_cases.json: config, layout, detection, tokenizer settings, the template, the rules; `tokenizer_cases` (ids of
  14 prompts, the same through both tokenizers, with the templated text, Qwen2Tokenizer's ids on it and whether they
  agree); `divergent` (ComfyUI's ids where Kiln documents a difference: `embedding:`); `encoder_cases` per type:
  prompt, ids, cond_start (template_end), cond_shape, attention_mask (null when ComfyUI drops it).

Checks: the loaded ComfyUI modules hold exactly the written values (the vision tower's included); the file's names
are exactly transformers' Qwen3VLModel's (with `model.`); detection; every weight 1.0; ids = Qwen2Tokenizer's on the
templated text for every prompt but `embedding:`; cond = ComfyUI's own pre-cut states (SD1ClipModel.
encode_token_weights) cut at the restated template_end and flattened tap-major; two runs write identical files.
Cross-checks (max |diff| / max |ref|, CPU f32, printed at the end of a run): transformers 5.24 Qwen3VLModel (eager;
text_config as above, vocabulary 1000 fed id % 1000; vision_config the tiny tower with out_hidden_size 2560), the
file loaded strictly: Krea 2 = hidden_states[2, 5, ..., 35] (hidden_states[0] is the table's rows) cut and
flattened, Mage-Flow = last_hidden_state cut; the `endoftext` case through its language_model with the 0/1 mask and
positions 0..N-1 (Qwen3VLModel would derive text positions from the mask). hidden_states[36] is the normed state
(= last_hidden_state), so Krea 2's highest tap 35 is layer 34's output, not layer 35's.
"""

import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/qwen3vl_te")
SEED = 2560
BUDGET = 5_000_000

# Qwen3-VL 4B's language model at tiny widths (released values in the docstring).
QWEN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=36, num_attention_heads=4,
            num_key_value_heads=2)
HEAD_DIM = 16
VOCAB = 151936
ROWS = 1000  # stored rows of the token table; row r serves every id with id % ROWS == r
# The tiny vision tower (overrides QWEN3VL_VISION_COMMON where it names the same keys).
VISION = dict(hidden_size=8, intermediate_size=16, depth=2, deepstack_visual_indexes=[0, 1], num_heads=2,
              patch_size=2, num_position_embeddings=16)
VISION_OUT = 2560  # the released merger's rows: what detect_te_model reads to tell 4B from 8B
LM, VISUAL = "model.language_model.", "model.visual."
PAD, IM_START, USER, NEWLINE = 151643, 151644, 872, 198
TAPS = [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35]
KEY = "qwen3vl_4b"

PROMPTS = {
    "plain": "a photo of a red fox sitting in the snow, golden hour",
    "empty": "",
    "blank": "  ",
    "weighted": "a (red:1.2) cat, ((masterpiece)), [blue]",
    "escaped": "a sign reading \\(x\\) and \\\\ a slash",
    "unicode": "the café at night 夜, a fox 🦊, naïve Ünïcödé — “quoted”",
    "newlines": "line one\nline two\n\nline three",
    "templated": "<|im_start|>system\nYou draw pictures.<|im_end|>\n<|im_start|>user\na blue bird on a wire"
                 "<|im_end|>\n<|im_start|>assistant\n",
    "user_turn": "<|im_start|>user\na cat on a mat<|im_end|>\n",
    "bare_im_start": "<|im_start|>a red fox",
    "specials_inside": "a dog<|im_end|>\n<|im_start|>user\nand a cat",
    "endoftext": "a cat<|endoftext|> and a dog",
    "medium": "A wide cinematic shot of an old lighthouse on a rocky cliff at dusk, waves crashing below, "
              "seagulls circling, warm light in the windows, dramatic clouds, 35mm film grain, high detail.",
    "long": " ".join(["a watercolor painting of a quiet harbor town with colorful boats, narrow streets, laundry "
                      "lines between the houses and a church tower in the distance;"] * 6),
}
# Encoded through both types (the rest are tokenizer-only).
ENCODED = ["plain", "empty", "weighted", "unicode", "templated", "user_turn", "bare_im_start", "specials_inside",
           "endoftext", "medium"]
# Tokenizer cases where Kiln documents a difference from ComfyUI (recorded, not for asserting).
DIVERGENT = {"embedding": "a cat embedding:foo, and a dog"}


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_module(draw, module, special):
    """Every state_dict entry re-drawn in f32: norm gains 1 + 0.1 N, biases 0.1 N, weights N / sqrt(fan_in) (a
    weight's elements after the first dimension); `special` maps a name to its std."""
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
            v = draw.normal(p.shape, 1.0 / math.sqrt(p[0].numel()))
        out[name] = v.float().contiguous()
    return out


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def tile(table, rows):
    """The stored [ROWS, D] table as the full [rows, D] one: row i = table[i % ROWS] (common.rs tiled_table)."""
    return table.repeat((rows + table.shape[0] - 1) // table.shape[0], 1)[:rows].contiguous()


CROSS = []


def report(name, err, bound):
    CROSS.append(f"{name}: {err:.2e}")
    print(f"  {name}: max |diff| / max |ref| = {err:.2e}")
    assert err < bound, (name, err)


class TinyQwen3VL4B:
    """While ComfyUI builds the model: the tiny Qwen3VL_4BConfig subclass, the tiny vision sizes, a vision tower
    whose mergers output VISION_OUT rows; detect_te_model is wrapped only to record its answer."""

    def __enter__(self):
        import comfy.sd
        import comfy.text_encoders.llama as llama
        import comfy.text_encoders.qwen3vl as q3vl

        self.q3vl, self.sd = q3vl, comfy.sd
        self.saved = (q3vl.QWEN3VL_CONFIGS[KEY], q3vl.QWEN3VL_VISION[KEY], q3vl.Qwen3VLVisionModel,
                      comfy.sd.detect_te_model)
        fields = [(k, type(v), dataclasses.field(default=v)) for k, v in QWEN.items()]
        q3vl.QWEN3VL_CONFIGS[KEY] = dataclasses.make_dataclass(
            "TinyQwen3VL_4BConfig", fields, bases=(llama.Qwen3VL_4BConfig,), namespace={"head_dim": HEAD_DIM})
        q3vl.QWEN3VL_VISION[KEY] = dict(VISION)
        real_vision = self.saved[2]

        class WideMergerVision(real_vision):
            def __init__(self, config, **kw):
                super().__init__({**config, "out_hidden_size": VISION_OUT}, **kw)

        q3vl.Qwen3VLVisionModel = WideMergerVision
        real_detect = self.saved[3]
        self.detected = []

        def detect(sd):
            found = real_detect(sd)
            self.detected.append(found)
            return found

        comfy.sd.detect_te_model = detect
        return self

    def __exit__(self, *exc):
        q3vl = self.q3vl
        (q3vl.QWEN3VL_CONFIGS[KEY], q3vl.QWEN3VL_VISION[KEY], q3vl.Qwen3VLVisionModel,
         self.sd.detect_te_model) = self.saved
        return False


def write_file():
    """Draws the weights on ComfyUI's own Qwen3VL (its `model.*` / `visual.*` names) and writes them in
    transformers' layout."""
    import comfy.ops
    import comfy.text_encoders.qwen3vl as q3vl

    with TinyQwen3VL4B():
        net = q3vl._make_qwen3vl_model(KEY)({}, torch.float32, "cpu", comfy.ops.manual_cast)
    weights = draw_module(Draw(SEED), net, {"model.embed_tokens.weight": 1.0})
    del net
    assert not any(k.startswith("model.lm_head") for k in weights)  # Qwen3VL_4BConfig: lm_head False
    assert set(k.split(".")[0] for k in weights) == {"model", "visual"}
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:ROWS].clone()
    stored = {(LM + k[len("model."):] if k.startswith("model.") else VISUAL + k[len("visual."):]): v
              for k, v in weights.items()}
    assert stored[VISUAL + "merger.linear_fc2.weight"].shape == (VISION_OUT, 32)
    assert stored[LM + "layers.0.self_attn.q_proj.weight"].shape == (QWEN["num_attention_heads"] * HEAD_DIM, 32)
    save_file(stored, f"{OUT}/qwen3vl_4b.safetensors")
    return load_file(f"{OUT}/qwen3vl_4b.safetensors")


def load(stored, clip_type, embeddings):
    """ComfyUI's CLIPLoader path for one file: load_text_encoder_state_dicts with the embeddings folder."""
    import comfy.sd

    full = dict(stored)
    full[LM + "embed_tokens.weight"] = tile(stored[LM + "embed_tokens.weight"], VOCAB)
    with TinyQwen3VL4B() as shim:
        # (the loader renames the keys of the dict it is given in place: it gets a copy)
        clip = comfy.sd.load_text_encoder_state_dicts([dict(full)], embedding_directory=[embeddings],
                                                      clip_type=clip_type)
    assert shim.detected == [comfy.sd.TEModel.QWEN3VL_4B], shim.detected
    return clip, full


def check_loaded(module, full):
    have = module.state_dict()
    want = {("model." + k[len(LM):] if k.startswith(LM) else "visual." + k[len(VISUAL):]): v for k, v in full.items()}
    assert set(want) == set(have), (sorted(set(want) - set(have))[:3], sorted(set(have) - set(want))[:3], len(have))
    for k, v in want.items():
        assert torch.equal(have[k].float(), v), k


def template_end(ids):
    """Krea2TEModel / MageFlowTEModel.encode_token_weights' cut, restated."""
    end, count = -1, 0
    for i, t in enumerate(ids):
        if t == IM_START and count < 2:
            end, count = i, count + 1
    if len(ids) > end + 3 and ids[end + 1] == USER and ids[end + 2] == NEWLINE:
        end += 3
    return end


def mask_of(ids):
    """process_tokens' mask: 1 up to the first `<|endoftext|>`, 0 from it on (never a left pad here)."""
    first = ids.index(PAD) if PAD in ids else len(ids)
    return [1] * first + [0] * (len(ids) - first)


def main():
    import_comfyui(node_modules=True)
    import comfy.sd
    import comfy.sd1_clip as sd1
    import comfy.text_encoders.krea2 as k2
    import comfy.text_encoders.mage_flow as mf
    import comfy.text_encoders.qwen3vl as q3vl

    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    embeddings = tempfile.mkdtemp(prefix="qwen3vl_te_embeddings_")
    stored = write_file()

    # detect_te_model on the written file itself, and with the merger's rows any other count.
    detected = str(comfy.sd.detect_te_model(stored))
    other = dict(stored)
    other[VISUAL + "merger.linear_fc2.weight"] = other[VISUAL + "merger.linear_fc2.weight"][:32]
    detected_other = str(comfy.sd.detect_te_model(other))
    assert (detected, detected_other) == ("TEModel.QWEN3VL_4B", "TEModel.QWEN3VL_8B")

    clips = {}
    for name, clip_type, model_class, tok_class, clip_class in (
            ("krea2", comfy.sd.CLIPType.KREA2, k2.Krea2TEModel, k2.Krea2Tokenizer, k2.Krea2Qwen3VLClipModel),
            ("mage", comfy.sd.CLIPType.MAGE, mf.MageFlowTEModel, mf.MageFlowTokenizer, mf.MageFlowQwen3VLClipModel)):
        clip, full = load(stored, clip_type, embeddings)
        te = clip.cond_stage_model
        assert type(te).__mro__[1] is model_class, type(te).__mro__
        assert isinstance(clip.tokenizer, tok_class)
        q = getattr(te, KEY)
        assert isinstance(q, clip_class)
        cfg = q.transformer.model.config
        assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta,
                cfg.q_norm, cfg.k_norm, cfg.rope_dims, cfg.interleaved_mrope, cfg.final_norm, cfg.lm_head,
                cfg.qkv_bias) == (32, 64, 36, 4, 2, HEAD_DIM, VOCAB, 1e-6, 5e6, "gemma3", "gemma3", [24, 20, 20],
                                  True, True, False, False), cfg
        if name == "krea2":
            assert (q.layer, q.layer_idx, q.layer_norm_hidden_state) == (TAPS, None, False)
        else:
            assert (q.layer, q.layer_idx, q.layer_norm_hidden_state) == ("hidden", -1, True)
        assert (q.enable_attention_masks, q.return_attention_masks, q.zero_out_masked, q.special_tokens) == \
            (True, True, False, {"pad": PAD})
        check_loaded(q.transformer, full)
        tok = getattr(clip.tokenizer, KEY)
        assert (tok.tokens_start, tok.start_token, tok.end_token, tok.pad_token, tok.min_length, tok.max_length,
                tok.pad_to_max_length, tok.embedding_directory) == \
            (0, None, None, PAD, 1, 99999999, False, [embeddings])
        clips[name] = clip
    assert k2.KREA2_TEMPLATE == mf.MAGE_T2I_TEMPLATE == clips["krea2"].tokenizer.llama_template == \
        clips["mage"].tokenizer.llama_template
    assert k2.KREA2_TAP_LAYERS == TAPS
    template = k2.KREA2_TEMPLATE
    hf = getattr(clips["krea2"].tokenizer, KEY).tokenizer

    def templated(prompt):
        text = prompt if prompt.startswith("<|im_start|>") else template.format(prompt)
        return sd1.unescape_important(sd1.escape_important(text))

    def tokenize(name, prompt):
        out = {}
        for t, clip in clips.items():
            tokens = clip.tokenize(prompt)
            assert set(tokens) == {KEY} and len(tokens[KEY]) == 1, (name, t)
            assert all(float(w) == 1.0 for _, w in tokens[KEY][0]), (name, t)
            out[t] = [int(i) for i, _ in tokens[KEY][0]]
        assert out["krea2"] == out["mage"], name
        return out["krea2"]

    tokenizer_cases = {}
    for name, prompt in PROMPTS.items():
        ids = tokenize(name, prompt)
        text = templated(prompt)
        hf_ids = hf(text)["input_ids"]
        assert ids == hf_ids, name
        tokenizer_cases[name] = {"prompt": prompt, "templated": text, "ids": ids, "equals_hf": ids == hf_ids,
                                 "template_applied": not prompt.startswith("<|im_start|>")}
        print(f"tokens {name}: {len(ids)} ids")
    # Facts: literal weights, escapes, no <think>, the template's head, the blank prompt gets the same template.
    head = hf(template.split("{}")[0])["input_ids"]
    tail = hf(template.split("{}")[1])["input_ids"]
    assert tokenizer_cases["empty"]["ids"] == head + tail and len(head) == 34
    assert head[-3:] == [IM_START, USER, NEWLINE] and head.count(IM_START) == 2
    assert tokenizer_cases["weighted"]["ids"] == hf(template.format(PROMPTS["weighted"]))["input_ids"]
    assert tokenizer_cases["escaped"]["ids"] == hf(template.format("a sign reading (x) and \\\\ a slash"))["input_ids"]
    assert tokenizer_cases["templated"]["ids"] == hf(PROMPTS["templated"])["input_ids"]
    assert "<think>" not in "".join(c["templated"] for c in tokenizer_cases.values())
    thinking_off = q3vl.Qwen3VLTokenizer.tokenize_with_weights(clips["krea2"].tokenizer, PROMPTS["plain"],
                                                               llama_template=template)[KEY][0]
    think_tail = [int(t[0]) for t in thinking_off][len(tokenizer_cases["plain"]["ids"]):]
    assert think_tail == hf("<think>\n\n</think>\n\n")["input_ids"], think_tail
    divergent = {}
    for name, prompt in DIVERGENT.items():
        ids = tokenize(name, prompt)
        literal = hf(templated(prompt))["input_ids"]
        assert ids != literal, name
        divergent[name] = {"prompt": prompt, "ids": ids, "ids_as_literal_text": literal,
                           "why": "SDTokenizer splits the text before a whitespace-preceded 'embedding:' and "
                                  "tokenises each piece alone; with an embeddings folder it looks the name up "
                                  "(up to the first whitespace, '<' or '['; trailing ',' stripped) and drops it "
                                  "when missing, the rest re-joined with single spaces (here the name 'foo' goes, "
                                  "the template's '\\n' after <|im_end|> becomes ' ' and its final '\\n' is "
                                  "stripped). Kiln keeps 'embedding:' as text (qwen3/tokenizer.rs zimage_prompt)"}
        print(f"divergent {name}: ComfyUI {len(ids)} ids, as text {len(literal)}")

    io, encoder_cases, raw = {}, {"krea2": {}, "mage": {}}, {}
    with torch.no_grad():
        for t, clip in clips.items():
            te = clip.cond_stage_model
            for name in ENCODED:
                prompt = PROMPTS[name]
                tokens = clip.tokenize(prompt)
                ids = [int(i) for i, _ in tokens[KEY][0]]
                out = clip.encode_from_tokens(tokens, return_dict=True)
                mask = mask_of(ids)
                start = template_end(ids)
                keys = {"cond", "pooled_output"} | ({"attention_mask"} if 0 in mask[start:] else set())
                assert set(out) == keys and out["pooled_output"] is None, (t, name, sorted(out))
                cond = out["cond"]
                assert cond.dtype == torch.float32 and torch.isfinite(cond).all()
                width = 12 * 32 if t == "krea2" else 32
                assert cond.shape == (1, len(ids) - start, width), (t, name, cond.shape)
                # ComfyUI's own states before the cut (SD1ClipModel's encode_token_weights), cut and flattened.
                z = sd1.SD1ClipModel.encode_token_weights(te, tokens)[0]
                if t == "krea2":
                    assert z.shape == (1, 12, len(ids), 32)
                    want = z[:, :, start:].permute(0, 2, 1, 3).reshape(1, len(ids) - start, 12 * 32)
                else:
                    assert z.shape == (1, len(ids), 32)
                    want = z[:, start:]
                assert torch.equal(cond, want), (t, name)
                raw[(t, name)] = z
                io[f"{t}.{name}.cond"] = cond
                case = {"prompt": prompt, "ids": ids, "cond_start": start, "cond_shape": list(cond.shape),
                        "attention_mask": None}
                if "attention_mask" in out:
                    m = out["attention_mask"]
                    assert m[0].tolist() == mask[start:], (t, name)
                    io[f"{t}.{name}.attention_mask"] = m.float()
                    case["attention_mask"] = m[0].tolist()
                encoder_cases[t][name] = case
                print(f"{t} {name}: {len(ids)} ids, cond from {start}, {list(cond.shape)}, std {cond.std():.3f}, "
                      f"max |cond| {cond.abs().max():.3f}, mask {'kept' if case['attention_mask'] else 'dropped'}")
        assert {n: c["cond_start"] for n, c in encoder_cases["krea2"].items()} == \
            {n: c["cond_start"] for n, c in encoder_cases["mage"].items()}
        # The cut's facts: the template's 34 ids go, an already templated text loses its system turn and user
        # header, a bare <|im_start|> keeps everything.
        starts = {n: c["cond_start"] for n, c in encoder_cases["krea2"].items()}
        assert starts["plain"] == 34 and starts["user_turn"] == 3 and starts["bare_im_start"] == 0, starts
        # Mage-Flow's last layer IS Krea 2's states one layer on, through the final norm: tap 35 is not it.
        cross_check(stored, encoder_cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "seed": SEED,
            "qwen_config": {**QWEN, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
                            "rope_theta": 5e6, "qkv_bias": False, "lm_head": False,
                            "q_norm": "RMSNorm(head_dim, eps 1e-6) per head before RoPE, gain w",
                            "k_norm": "RMSNorm(head_dim, eps 1e-6) per head before RoPE, gain w",
                            "rope": "text only: 1-D rotate-half RoPE at 0..N-1, theta 5e6 (M-RoPE [24, 20, 20] "
                                    "interleaved, one position row)"},
            "vision_config": {**VISION, "out_hidden_size": VISION_OUT, "temporal_patch_size": 2,
                              "spatial_merge_size": 2, "in_channels": 3,
                              "note": "present so the file is a Qwen3-VL file; text never runs it"},
            "layout": {"stored": {"language_model": LM, "vision": VISUAL},
                       "comfy_rename": {"model.language_model.": "model.", "model.visual.": "visual.",
                                        "lm_head.": "model.lm_head."},
                       "detect_te_model": detected,
                       "detect_te_model_if_merger_rows_not_2560": detected_other,
                       "detection_rule": "model.visual.deepstack_merger_list.0.norm.weight present: QWEN3VL_4B when "
                                         "model.visual.merger.linear_fc2.weight has 2560 rows, else QWEN3VL_8B; "
                                         "types krea2 and mage need QWEN3VL_4B"},
            "embedding_rows": ROWS,
            "embedding_rule": f"id i uses row i % {ROWS} of the stored table (tile it to {VOCAB} rows); the real ids "
                              "are used everywhere else (the cut, the mask)",
            "template": template,
            "template_rule": "the same t2i template for krea2 and mage; none when the prompt starts with "
                             "'<|im_start|>'; no drop template (an empty or blank prompt is templated as any); no "
                             "'<think>' block (thinking=True)",
            "weights_rule": "disabled: '(word:1.2)' is literal text, every weight 1.0; '\\\\(' and '\\\\)' lose the "
                            "backslash (escape_important / unescape_important); the ids are Qwen2Tokenizer's on the "
                            "whole templated text",
            "cut_rule": "template_end = index of the last of the first two <|im_start|> (151644); +3 when the ids "
                        "after it are 'user' (872) and '\\n' (198) and there are more than template_end + 3 ids; "
                        "cond = states[template_end:]",
            "krea2": {"taps": TAPS, "tap_numbering": "transformers hidden_states[k]: 0 the embeddings, k the output "
                                                     "of layer k - 1; none through the final norm",
                      "flatten": "[1, 12, N, D] -> [1, N, 12 D]: token n's features t * D + d are tap t's feature d"},
            "mage": {"states": "layer 35's output through the final norm (= last_hidden_state)"},
            "mask_rule": "1 up to the first <|endoftext|> (151643), 0 from it on; masked keys get finfo.min / 4, the "
                         "masked rows are still returned; the cut mask is returned only when it holds a 0",
            "tokenizer_cases": tokenizer_cases,
            "divergent": divergent,
            "encoder_cases": encoder_cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")

    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        digest = hashlib.sha256(open(f"{OUT}/{name}", "rb").read()).hexdigest()[:16]
        print(f"  {name:26} {size:9d} bytes  sha256 {digest}")
    print(f"  total {total} bytes")
    print("CROSS-CHECKS (max |diff| / max |ref|):")
    for line in CROSS:
        print("  " + line)
    assert total < BUDGET, total


def cross_check(stored, encoder_cases, io):
    """transformers' Qwen3VLModel with the file loaded strictly (the token table's 1000 rows fed id % 1000)."""
    from transformers import Qwen3VLConfig, Qwen3VLModel

    config = Qwen3VLConfig(
        text_config=dict(vocab_size=ROWS, **QWEN, head_dim=HEAD_DIM, rms_norm_eps=1e-6, attention_bias=False,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         rope_parameters={"rope_theta": 5e6, "rope_type": "default", "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True}),
        vision_config=dict(**VISION, out_hidden_size=VISION_OUT, in_channels=3, temporal_patch_size=2,
                           spatial_merge_size=2),
        tie_word_embeddings=True)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    net = Qwen3VLModel(config).eval()
    names = {"model." + k for k in net.state_dict()}
    assert names == set(stored), sorted(names ^ set(stored))[:10]
    net.load_state_dict({k[len("model."):]: v for k, v in stored.items()}, strict=True)
    lm = net.language_model
    assert lm.layers[0].self_attn.head_dim == HEAD_DIM and len(lm.layers) == 36
    print("transformers Qwen3VLModel:")
    for t, cases in encoder_cases.items():
        worst, worst_masked = 0.0, 0.0
        for name, case in cases.items():
            ids = torch.tensor([case["ids"]])
            n, start = ids.shape[1], case["cond_start"]
            if case["attention_mask"] is None:
                out = net(input_ids=ids % ROWS, output_hidden_states=True)
            else:
                out = lm(input_ids=ids % ROWS, attention_mask=torch.tensor([mask_of(case["ids"])]),
                         position_ids=torch.arange(n)[None], output_hidden_states=True)
            hs = out.hidden_states
            assert len(hs) == 37 and torch.equal(hs[-1], out.last_hidden_state)
            assert torch.equal(hs[0], lm.embed_tokens(ids % ROWS))
            if t == "krea2":
                want = torch.stack([hs[k] for k in TAPS], 1)[:, :, start:].permute(0, 2, 1, 3).reshape(1, n - start,
                                                                                                       -1)
            else:
                want = out.last_hidden_state[:, start:]
                # The pre-norm output of the last layer is far from it.
                assert rel_err(io[f"{t}.{name}.cond"], hs[35][:, start:]) > 0.1
            err = rel_err(io[f"{t}.{name}.cond"], want)
            if case["attention_mask"] is not None:
                # The mask matters: without it the rows after `<|endoftext|>` are far off.
                free = lm(input_ids=ids % ROWS, position_ids=torch.arange(n)[None], output_hidden_states=True)
                free = (torch.stack([free.hidden_states[k] for k in TAPS], 1)[:, :, start:].permute(0, 2, 1, 3)
                        .reshape(1, n - start, -1) if t == "krea2" else free.last_hidden_state[:, start:])
                assert rel_err(io[f"{t}.{name}.cond"], free) > 1e-2, (t, name)
            if case["attention_mask"] is None:
                worst = max(worst, err)
            else:
                worst_masked = max(worst_masked, err)
        label = "hidden_states[2, 5, ..., 35] cut, tap-major" if t == "krea2" else "last_hidden_state cut"
        report(f"transformers Qwen3VLModel {label} vs ComfyUI {t} cond ({len(cases) - 1} unmasked prompts)",
               worst, 1e-5)
        report(f"transformers Qwen3VLTextModel, 0/1 mask and positions 0..N-1, vs ComfyUI {t} cond (endoftext)",
               worst_masked, 1e-5)
    # The taps are not shifted by one: hidden_states[k + 1] (layer k's output) is far from tap k.
    case = encoder_cases["krea2"]["plain"]
    hs = net(input_ids=torch.tensor([case["ids"]]) % ROWS, output_hidden_states=True).hidden_states
    start = case["cond_start"]
    shifted = torch.stack([hs[k + 1] for k in TAPS], 1)[:, :, start:].permute(0, 2, 1, 3).reshape(1, -1, 12 * 32)
    assert rel_err(io["krea2.plain.cond"], shifted) > 0.1


if __name__ == "__main__":
    main()
