"""Fixtures for HunyuanVideo 1.5's text encoders (engine/models/tests/fixtures/hunyuan_video15_te/): what ComfyUI's
DualCLIPLoader builds for type `hunyuan_video_15` (Qwen2.5-VL 7B's language model + the byT5-small "glyph"
encoder), its tokenizer HunyuanVideo15Tokenizer, and what ComfyUI computes with tiny random networks of both
built by its own classes and loaded by its own loader.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd imports
torchaudio, for which comfyui.py puts an empty stand-in on the path when it is missing):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/hunyuan_video15_te.py
It takes about 20 s on the CPU and is reproducible: a second run writes byte-identical files (every random value
comes from seeded torch generators; nothing is written from the cross-checks).

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; hi.py is comfy/text_encoders/hunyuan_image.py,
qi.py qwen_image.py, hv.py hunyuan_video.py, all under comfy/text_encoders/):
- sd.py:1953-1955 (CLIPType.HUNYUAN_VIDEO_15, two files): clip = hi.te(**llama_detect(clip_data)) (byt5 True),
  tokenizer = hv.HunyuanVideo15Tokenizer. No detect_te_model on this path: HunyuanImageTEModel.load_sd
  (hi.py:88-92) sends a file holding `encoder.block.0.layer.0.SelfAttention.o.weight` to the byT5 model, anything
  else to the Qwen model, both load_state_dict(strict=False). (A lone file is detected by sd.py:1600-1603: byT5
  glyph = `encoder.block.0.layer.0.SelfAttention.k.weight` of 384 rows; the tiny byT5's has 32, so ComfyUI alone
  would call it T5_BASE; and Qwen2.5 7B = `model.layers.0.self_attn.k_proj.bias` of 512 rows, the tiny one's 32.)
- Tokenizer. hv.py:79-85 HunyuanVideo15Tokenizer = HunyuanImageTokenizer (hi.py:13-39) with the video template
  (hv.py:82) and prevent_empty_text=True. QwenImageTokenizer.tokenize_with_weights (qi.py:20-49): a text starting
  with `<|im_start|>` or `<|start_header_id|>` is used AS IS (no template); "" becomes " " (prevent_empty_text)
  for the Qwen part only; otherwise template.format(text); then SDTokenizer.tokenize_with_weights with
  disable_weights=True: "(red car:1.2)" stays literal text, every Qwen weight is 1.0 (but the escape step still
  runs: "\\(" and "\\)" lose their backslash). Qwen25_7BVLITokenizer (qi.py:8-11): no start/end token, pad
  151643, min_length 1, max_length 99999999 -> ONE batch, never padded. The byT5 text (hi.py:20-38): re.findall of
  `\\"(.*?)\\"`, `‘(.*?)’`, `“(.*?)”` on the ORIGINAL text (not templated, "" stays ""), in that order of
  patterns (all ASCII-double-quoted passages first, then ‘’, then “”; not text order); `.` does not match a
  newline; each passage as 'Text "{}". ' joined with nothing (so the string ends with a space); `byt5` is absent
  when nothing matched. ByT5SmallTokenizer (hi.py:8-11): transformers ByT5Tokenizer on byt5_tokenizer/, no start
  token, has_end_token (default True): the tokenizer's own `</s>` (1) is sliced off each piece and one `</s>` (1)
  closes the batch; pad 0 (pad_with_end False); min_length 1; max_length 99999999 -> one batch; weights ARE
  parsed here (disable_weights is not passed to it): `(big:1.3)` inside quotes gives those bytes weight 1.3,
  `(x)` 1.1.
- SDTokenizer (sd1_clip.py:572-675) does not split words at spaces: each weighted segment is tokenized whole,
  but split further before every `embedding:` that follows whitespace, the pieces tokenized APART. Embeddings are
  never looked up here (Qwen25_7BVLITokenizer and ByT5SmallTokenizer do not pass their embedding_directory on to
  SDTokenizer: it is None even though the server gives one), so `embedding:foo` stays text, yet the split still
  happens: in the `embedding` case the Qwen ids hold " cat", " " (220), "embedding" (94611) where the whole text
  would give " cat", " embedding" (`qwen_equals_whole_text` false; every other case is the Qwen2 tokenizer on the
  whole templated text, after the escape step). For byT5 segmenting changes nothing (bytes are bytes; a special
  token cannot span a weight bracket, which is all a border could do).
- byT5 ids (transformers ByT5Tokenizer): byte b -> b + 3; `<pad>` 0, `</s>` 1, `<unk>` 2 written in the text are
  those ids; `<extra_id_N>` (N = 0..124) -> 259 + N (added_tokens.json), `<extra_id_125>` is plain bytes.
- Qwen part (hi.py:41-48): SDClipModel(layer "hidden", layer_idx -3, layer_norm_hidden_state False, pad 151643,
  attention masks on and returned). llama.py:884-885 turns -3 into len(layers) - 3 and :921-922 clones x right
  after that layer; :927-928 applies the final norm to x only; final_layer_norm_intermediate False. So cond is
  the output of decoder layer index L - 3 (0-based; 25 of 28 released, 1 of this tiny model's 4), i.e.
  transformers' hidden_states[-3], WITHOUT the final RMSNorm. Positions 0..N-1 (text only: plain 1-D RoPE).
  process_tokens (sd1_clip.py:172-258): the mask is 1 up to the first 151643 (<|endoftext|>), which is itself
  masked (end token None -> the pad counts as the end), and 0 after it; the masked keys get finfo.min / 4 added
  (llama.py:833-843), their rows are still computed (zero_out_masked False).
- HunyuanImageTEModel.encode_token_weights (hi.py:65-76): template_end = 36 when the first Qwen id is 27 ("<",
  a text starting with `<|start_header_id|>`) and there are more than 36 ids; else -1, and
  QwenImageTEModel.encode_token_weights (qi.py:61-85) sets it to the index of the 2nd 151644 (<|im_start|>; the
  1st if there is only one; it stays -1 if there is none), + 3 when followed by 872 ("user") and 198 ("\\n");
  cond = out[:, template_end:] (the END of the sequence is never cut: with the video template cond is the
  prompt's ids + `<|im_end|> \\n <|im_start|> assistant \\n`, 5 ids). A prompt starting with "\\n" makes the
  template's "user\\n" + "\\n..." tokenize to 872, 271 ("\\n\\n"), so the + 3 does not happen and cond starts at
  the <|im_start|>. template_end -1 keeps the LAST id only. The attention mask is cut the same way and dropped
  when it is all ones (so `attention_mask` is only present when the prompt holds <|endoftext|>).
- byT5 part (hi.py:50-54): SDClipModel(layer "last", the glyph config byt5_config_small_glyph.json, special
  tokens end 1 pad 0, comfy.text_encoders.t5.T5, attention masks on, zero_out_masked True, not returned).
  T5 (t5.py): 1-D relative position bias (32 buckets, max distance 128, bidirectional) in block 0 only, reused by
  every block; attention NOT scaled by 1/sqrt(d_kv) (t5.py:164 multiplies k back); gated gelu(tanh) FFN; T5
  RMSNorm (no mean, eps 1e-6) before each sub-block; the final norm IS applied (layer "last" = outputs[0]).
  The mask is 1 up to and including the first 1 (`</s>`, normally the closing one), 0 after; masked rows are
  zeroed. extra["conditioning_byt5small"] = that model's encode_token_weights(tokens["byt5"])[0] [1, M, 32]
  (M = the byT5 ids, `</s>` included). Weights (sd1_clip.py:27-79): when any weight != 1, an "empty" sequence
  [1, 0, 0, ...] of the same length is encoded in the same batch; its mask is [1, 0, ...], so after zeroing
  z_empty[j] = 0 for j >= 1 (z_empty[0] = the lone `</s>`'s state); out[j] = (z[j] - z_empty[j]) * w_j +
  z_empty[j] where w_j != 1; since every byT5 text starts with 'Text "' (weight 1), this is exactly z[j] * w_j.
  cond and the byT5 states are not concatenated; pooled is None.
- CLIP.encode_from_tokens(return_dict=True) (sd.py:395-418, what CLIPTextEncode runs): {"cond", "pooled_output":
  None, "conditioning_byt5small" (when quoted text), "attention_mask" (when kept)}.

The tiny configs (released values in brackets):
- Qwen2.5-VL language model: ComfyUI's Qwen25_7BVLI with Qwen25_7BVLI_Config overridden: hidden 64 [3584],
  intermediate 128 [18944], 4 layers [28], 2 heads [28] / 1 kv head [4] of head_dim 32 [128] (class attributes,
  set by a subclass; rope_dims [4, 6, 6], unused for text); eps 1e-6, theta 1e6, q/k/v biases, no o bias, final
  norm present (unused), vocabulary 152064. The vision tower is built (its weights are not in the file; ComfyUI
  warns) and unused.
- byT5: byt5_config_small_glyph.json with d_model 32 [1472], d_ff 64 [3584], d_kv 8 [64], num_heads 4 [6],
  num_layers 2 [12] set through SDClipModel's own override (sd1_clip.py:105-108: ByT5SmallModel gets the
  model_options without a model_name, so its override key is "_model_config"); vocabulary 1510, gelu_pytorch_tanh,
  gated, model_type t5 kept from the file. NB inner = d_kv * heads = 32 = d_model here; released 384 != 1472.

Writes engine/models/tests/fixtures/hunyuan_video15_te/ (every tensor f32; weights hold bf16-representable values):
- tokenizer_cases.json: {"template", "embedding_directory": "empty", "cases": {name: {"prompt", "qwen_text" (what
  the Qwen tokenizer got), "qwen25_7b": {"ids": [[...]], "weights": [[...]]} (one list per batch),
  "qwen_equals_whole_text", and when quoted text: "byt5_text", "byt5": {"ids": [[...]], "weights": [[...]]}}}}.
- qwen.safetensors: model.embed_tokens.weight [1000, 64] (the first 1000 rows; id i uses row i % 1000: tile the
  table to 152064 rows, common.rs tiled_table), model.layers.N.self_attn.{q_proj.weight [64, 64], q_proj.bias
  [64], k_proj.weight [32, 64], k_proj.bias [32], v_proj.weight [32, 64], v_proj.bias [32], o_proj.weight
  [64, 64]}, model.layers.N.mlp.{gate_proj, up_proj}.weight [128, 64], mlp.down_proj.weight [64, 128],
  model.layers.N.{input_layernorm, post_attention_layernorm}.weight [64], model.norm.weight [64], N = 0..3
  (the language-model names of qwen_2.5_vl_7b_fp8_scaled.safetensors).
- byt5.safetensors: ComfyUI's T5 names (those of byt5_small_glyphxl_fp16.safetensors): shared.weight [1510, 32],
  encoder.block.N.layer.0.SelfAttention.{q, k, v}.weight [32, 32], .o.weight [32, 32],
  encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight [32, 4] (block 0 only),
  encoder.block.N.layer.0.layer_norm.weight [32], encoder.block.N.layer.1.DenseReluDense.{wi_0, wi_1}.weight
  [64, 32], .wo.weight [32, 64], encoder.block.N.layer.1.layer_norm.weight [32], encoder.final_layer_norm.weight
  [32], N = 0, 1.
- byt5_io.safetensors, per case c of byt5_cases: `{c}.out` [1, M, 32] = ByT5SmallModel.encode_token_weights(
  tokenizer_cases[c].byt5); for `weights` also `weights.unweighted` (the same ids, all weights 1) and
  `weights.empty` [1, M, 32] (z_empty: row 0 the lone `</s>`'s state, the rest 0).
- te_io.safetensors, per case e of te_cases: `{e}.cond` [1, N, 64], `{e}.attention_mask` [1, N] (f32 0/1; only
  when ComfyUI keeps it), `{e}.conditioning_byt5small` [1, M, 32] (only with quoted text), `{e}.hidden` [1, T, 64]
  (the Qwen model's layer-(-3) states of ALL T ids before the cut).
- te_cases.json: configs, rules, per case the prompt, `ids` (the Qwen ids), `cond_start` (where cond starts in
  ids), `template_end` (ComfyUI's variable), shapes, `extra_keys`, `attention_mask` (list or null),
  `byt5_ids`/`byt5_weights` (or null); `byt5_cases` with ids, weights and shapes.

Checks: the loaded ComfyUI modules hold exactly the written values; the CLIP path's tokens equal the tokenizer's
(no `embedding:` there); cond == hidden[:, cond_start:]; the weighted byT5 output == unweighted * w exactly;
conditioning_byt5small == byt5 out for the same ids. Cross-checks (max |diff| / max |ref|, CPU f32, printed at the
end): transformers Qwen2Model hidden_states[-3] vs ComfyUI's pre-cut states (its last_hidden_state is > 10% away);
transformers T5EncoderModel last_hidden_state vs ComfyUI's byT5 output.
"""

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   "../../engine/models/tests/fixtures/hunyuan_video15_te")
SEED = 1515
BUDGET = 5_000_000

QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1)
QWEN_HEAD_DIM = 32
QWEN_ROPE_DIMS = [4, 6, 6]
QWEN_VOCAB = 152064
ROWS = 1000  # stored rows of the Qwen token table; row r serves every id with id % ROWS == r
PAD = 151643
IM_START, IM_END = 151644, 151645
BYT5 = dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2)
BYT5_VOCAB = 1510
LAYER_IDX = -3

REFINER = ("<|start_header_id|>system<|end_header_id|>\n\nDescribe the image by detailing the color, shape, size, "
           "texture, quantity, text, spatial relationships of the objects and background:<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\na red fox in the snow<|eot_id|>")
PROMPTS = {
    "plain": "a red fox running through fresh snow at dawn, cinematic lighting",
    "empty": "",
    "double_quote": 'a neon sign that says "OPEN 24 HOURS" above a diner door',
    "chinese_quotes": "a scroll with ‘福’ on it and a banner reading “新年快乐”",
    "several_quotes": '“second” then ‘third’ then "first" and "fourth" on signs',
    "weights": 'a poster reading "(SALE:1.5) (now)" next to a (red car:1.2)',
    "non_ascii": 'a café sign "Café 中文 🎉 naïve" in Paris',
    "extra_id": 'a label "<extra_id_3>A<extra_id_125>" on a box',
    "special_tokens": 'a box labelled "x</s>y<pad>z<unk>"',
    "skip_template": '<|im_start|>system\nDescribe the video.<|im_end|>\n<|im_start|>user\na red fox in "snow"'
                     '<|im_end|>\n<|im_start|>assistant\n',
    "skip_template_single": "<|im_start|>a fox",
    "newline": '\na lake at night\n"moon\nlight" and "stars"',
    "escaped": 'a \\(literal\\) word and "\\(kept\\) (w:0.5)"',
    "embedding": 'a cat embedding:foo, and "sign embedding:bar text"',
    "endoftext": "a cat<|endoftext|>a dog",
    "start_header": REFINER,
    "start_header_short": "<|start_header_id|>a fox",
}
TE_CASES = ["plain", "empty", "double_quote", "weights", "skip_template", "newline", "endoftext", "start_header",
            "start_header_short"]
BYT5_CASES = ["double_quote", "several_quotes", "weights", "special_tokens"]


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw(d, names_shapes, norm, special=None):
    """Every entry drawn in f32 and rounded to bf16 (stored as f32): gains of norms 1 + 0.1 N, biases 0.1 N,
    `special` names N(0, std), weights N / sqrt(last dimension)."""
    special = special or {}
    out = {}
    for name, shape in names_shapes:
        if name in special:
            v = d.normal(shape, special[name])
        elif norm(name):
            v = d.normal(shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = d.normal(shape, 0.1)
        else:
            v = d.normal(shape, 1.0 / math.sqrt(shape[-1]))
        out[name] = v.to(torch.bfloat16).float().contiguous()
    return out


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_loaded(module, want, skip=()):
    have = {k: v for k, v in module.state_dict().items() if not k.startswith(skip)}
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


def pairs(batches):
    """ComfyUI's [[(id, weight), ...], ...] as {"ids": [[...]], "weights": [[...]]}; ids must be ints."""
    for b in batches:
        for t in b:
            assert isinstance(t[0], int), t
    return {"ids": [[int(t[0]) for t in b] for b in batches], "weights": [[float(t[1]) for t in b] for b in batches]}


def tiny_qwen_config(llama):
    """Qwen25_7BVLI_Config with the tiny sizes (llama.Qwen25_7BVLI builds Qwen25_7BVLI_Config(**config_dict) from the
    module's global; head_dim and rope_dims are class attributes, so a subclass sets them)."""
    real = llama.Qwen25_7BVLI_Config
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in QWEN.items()]
    return dataclasses.make_dataclass("TinyQwen25_7BVLI_Config", fields, bases=(real,),
                                      namespace={"head_dim": QWEN_HEAD_DIM, "rope_dims": QWEN_ROPE_DIMS})


# ----------------------------------------------------------------------------------------------------- tokenizer


def tokenizer_fixture(embeddings):
    import comfy.text_encoders.hunyuan_video as hv

    tok = hv.HunyuanVideo15Tokenizer(embedding_directory=embeddings)
    q, b = tok.qwen25_7b, tok.byt5
    assert (q.tokens_start, q.start_token, q.end_token, q.pad_token, q.min_length, q.max_length,
            q.pad_to_max_length) == (0, None, None, PAD, 1, 99999999, False)
    assert (b.tokens_start, b.start_token, b.end_token, b.pad_token, b.min_length, b.max_length, b.pad_to_max_length,
            b.tokenizer_adds_end_token, b.disable_weights) == (0, None, 1, 0, 1, 99999999, False, True, False)
    assert b.tokenizer("")["input_ids"] == [1]
    seen = {}

    def spy(name, inner):
        def call(text, *args, **kwargs):
            seen[name] = text
            return inner(text, *args, **kwargs)
        return call

    q.tokenize_with_weights = spy("qwen", q.tokenize_with_weights)
    b.tokenize_with_weights = spy("byt5", b.tokenize_with_weights)
    cases = {}
    for name, prompt in PROMPTS.items():
        seen.clear()
        out = tok.tokenize_with_weights(prompt)
        case = {"prompt": prompt, "qwen_text": seen["qwen"], "qwen25_7b": pairs(out["qwen25_7b"])}
        assert len(out["qwen25_7b"]) == 1 and all(w == 1.0 for w in case["qwen25_7b"]["weights"][0]), name
        assert set(out) == ({"qwen25_7b", "byt5"} if "byt5" in seen else {"qwen25_7b"}), name
        if "byt5" in seen:
            case["byt5_text"] = seen["byt5"]
            case["byt5"] = pairs(out["byt5"])
            assert len(out["byt5"]) == 1 and case["byt5"]["ids"][0][-1] == 1, name
        # disable_weights: one segment, so the ids are the tokenizer's on the whole text (after the escape step).
        # SDTokenizer still splits before an `embedding:` that follows whitespace, and tokenizes the pieces apart.
        whole = seen["qwen"].replace("\\(", "(").replace("\\)", ")")
        pieces = re.split(r"(?<=\s)(?=embedding:)", whole)
        assert [i for p in pieces for i in q.tokenizer(p)["input_ids"]] == case["qwen25_7b"]["ids"][0], name
        case["qwen_equals_whole_text"] = q.tokenizer(whole)["input_ids"] == case["qwen25_7b"]["ids"][0]
        assert case["qwen_equals_whole_text"] == (len(pieces) == 1), name
        cases[name] = case
        print(f"tokens {name}: {len(case['qwen25_7b']['ids'][0])} Qwen ids"
              + (f", byT5 {case['byt5_text']!r} -> {len(case['byt5']['ids'][0])} ids" if "byt5" in case else ""))

    # What the cases show (restated from ComfyUI's code, asserted here).
    template = tok.llama_template
    assert cases["empty"]["qwen_text"] == template.format(" ") and "byt5" not in cases["empty"]
    assert cases["plain"]["qwen_text"] == template.format(PROMPTS["plain"]) and "byt5" not in cases["plain"]
    assert cases["skip_template"]["qwen_text"] == PROMPTS["skip_template"]
    assert cases["start_header"]["qwen_text"] == REFINER
    assert cases["several_quotes"]["byt5_text"] == 'Text "first". Text "fourth". Text "third". Text "second". '
    assert cases["newline"]["byt5_text"] == 'Text " and ". '
    assert cases["escaped"]["byt5_text"] == 'Text "\\(kept\\) (w:0.5)". '
    w = cases["weights"]["byt5"]
    text = 'Text "SALE now". '
    assert w["ids"][0] == [c + 3 for c in text.encode()] + [1], w
    assert w["weights"][0] == [1.0] * 6 + [1.5] * 4 + [1.0] + [1.1] * 3 + [1.0] * 4, w["weights"]
    for name, case in cases.items():
        if "byt5" in case and name not in ("extra_id", "special_tokens", "weights", "escaped", "embedding"):
            assert case["byt5"]["ids"][0] == [c + 3 for c in case["byt5_text"].encode()] + [1], name
    e = cases["extra_id"]["byt5"]["ids"][0]
    assert e[6] == 259 + 3 and e[7] == ord("A") + 3 and bytes(i - 3 for i in e[8:8 + 14]) == b"<extra_id_125>"
    s = cases["special_tokens"]["byt5"]["ids"][0]
    assert s[6:13] == [ord("x") + 3, 1, ord("y") + 3, 0, ord("z") + 3, 2, ord('"') + 3], s
    assert cases["escaped"]["byt5"]["ids"][0][:14] == [c + 3 for c in b'Text "(kept) '] + [ord("w") + 3]
    # Neither tokenizer passes its embedding_directory on to SDTokenizer: `embedding:` is literal text.
    assert q.embedding_directory is None and b.embedding_directory is None
    assert cases["embedding"]["byt5_text"] == 'Text "sign embedding:bar text". '
    assert cases["embedding"]["qwen_text"] == template.format(PROMPTS["embedding"])
    return tok, cases


# ---------------------------------------------------------------------------------------------------- the models


def shapes():
    """The tiny models' parameter names and shapes, from ComfyUI's own classes."""
    # hi.py uses comfy.text_encoders.t5 without importing it; in the server comfy.sd has imported it.
    import comfy.sd  # noqa: F401
    import comfy.text_encoders.hunyuan_image as hi
    import comfy.text_encoders.llama as llama

    real = llama.Qwen25_7BVLI_Config
    llama.Qwen25_7BVLI_Config = tiny_qwen_config(llama)
    try:
        te = hi.te()(device="cpu", dtype=torch.float32, model_options={"_model_config": dict(BYT5)})
    finally:
        llama.Qwen25_7BVLI_Config = real
    qwen = [(k, tuple(v.shape)) for k, v in te.qwen25_7b.transformer.state_dict().items() if k.startswith("model.")]
    byt5 = [(k, tuple(v.shape)) for k, v in te.byt5_small.transformer.state_dict().items()]
    del te
    return qwen, byt5


def load_te(qwen_sd, byt5_sd):
    """ComfyUI's own DualCLIPLoader path: load_text_encoder_state_dicts([qwen, byt5], HUNYUAN_VIDEO_15) builds
    hi.te(**llama_detect) and HunyuanVideo15Tokenizer and loads each file through HunyuanImageTEModel.load_sd; the
    tiny Qwen config is swapped in while it builds, the tiny byT5 sizes go through model_options."""
    import comfy.sd
    import comfy.text_encoders.llama as llama

    real = llama.Qwen25_7BVLI_Config
    llama.Qwen25_7BVLI_Config = tiny_qwen_config(llama)
    try:
        clip = comfy.sd.load_text_encoder_state_dicts([dict(qwen_sd), dict(byt5_sd)],
                                                      clip_type=comfy.sd.CLIPType.HUNYUAN_VIDEO_15,
                                                      model_options={"_model_config": dict(BYT5)})
    finally:
        llama.Qwen25_7BVLI_Config = real
    return clip


def models_fixture(tok, tok_cases):
    import comfy.text_encoders.hunyuan_image as hi
    import comfy.text_encoders.hunyuan_video as hv

    qwen_shapes, byt5_shapes = shapes()
    d = Draw(SEED)
    qwen_sd = draw(d, qwen_shapes, lambda n: n.endswith("norm.weight"), {"model.embed_tokens.weight": 1.0})
    qwen_sd["model.embed_tokens.weight"] = qwen_sd["model.embed_tokens.weight"][:ROWS].clone()
    byt5_sd = draw(d, byt5_shapes, lambda n: n.endswith("layer_norm.weight"),
                   {"shared.weight": 1.0, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": 1.0})
    assert "encoder.block.0.layer.0.SelfAttention.o.weight" in byt5_sd and "shared.weight" in byt5_sd
    assert not any("relative_attention_bias" in k for k in byt5_sd if not k.startswith("encoder.block.0."))
    assert qwen_sd["model.layers.0.self_attn.k_proj.bias"].shape == (32,) and "model.norm.weight" in qwen_sd
    save_file(qwen_sd, f"{OUT}/qwen.safetensors")
    save_file(byt5_sd, f"{OUT}/byt5.safetensors")
    qwen_sd, byt5_sd = load_file(f"{OUT}/qwen.safetensors"), load_file(f"{OUT}/byt5.safetensors")

    full = dict(qwen_sd)
    full["model.embed_tokens.weight"] = tile(qwen_sd["model.embed_tokens.weight"], QWEN_VOCAB)
    clip = load_te(full, byt5_sd)
    te = clip.cond_stage_model
    assert isinstance(te, hi.HunyuanImageTEModel) and isinstance(clip.tokenizer, hv.HunyuanVideo15Tokenizer)
    q, b = te.qwen25_7b, te.byt5_small
    cfg = q.transformer.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta, cfg.qkv_bias,
            cfg.q_norm, cfg.final_norm, cfg.rope_scale) == \
        (64, 128, 4, 2, 1, QWEN_HEAD_DIM, QWEN_VOCAB, 1e-6, 1e6, True, None, True, None)
    assert (q.layer, q.layer_idx, q.layer_norm_hidden_state, q.enable_attention_masks, q.return_attention_masks,
            q.zero_out_masked, q.special_tokens) == ("hidden", LAYER_IDX, False, True, True, False, {"pad": PAD})
    assert (b.layer, b.layer_idx, b.enable_attention_masks, b.return_attention_masks, b.zero_out_masked,
            b.special_tokens) == ("last", None, True, False, True, {"end": 1, "pad": 0})
    blk = b.transformer.encoder.block
    assert len(blk) == 2 and b.transformer.shared.weight.shape == (BYT5_VOCAB, 32)
    assert blk[0].layer[0].SelfAttention.num_heads == 4
    assert blk[1].layer[0].SelfAttention.relative_attention_bias is None
    assert type(blk[0].layer[1].DenseReluDense).__name__ == "T5DenseGatedActDense"
    check_loaded(q.transformer, full, skip=("visual.",))
    check_loaded(b.transformer, byt5_sd)

    io, te_cases = {}, {}
    byt5_io, byt5_cases = {}, {}
    with torch.no_grad():
        # byT5 alone, through ByT5SmallModel.encode_token_weights.
        for name in BYT5_CASES:
            tokens = [[(i, w) for i, w in zip(ids, ws)] for ids, ws in
                      zip(tok_cases[name]["byt5"]["ids"], tok_cases[name]["byt5"]["weights"])]
            out, pooled = b.encode_token_weights(tokens)
            assert pooled is None and out.shape == (1, len(tokens[0]), 32)
            byt5_io[f"{name}.out"] = out
            ids = tok_cases[name]["byt5"]["ids"][0]
            weights = tok_cases[name]["byt5"]["weights"][0]
            byt5_cases[name] = {"ids": ids, "weights": weights, "out_shape": list(out.shape)}
            z, _ = b([ids])
            if any(w != 1.0 for w in weights):
                both, _ = b([ids, [1] + [0] * (len(ids) - 1)])
                assert rel_err(both[0:1], z) < 1e-6
                assert torch.equal(both[1, 1:], torch.zeros_like(both[1, 1:]))
                lone, _ = b([[1]])
                assert rel_err(both[1:2, :1], lone) < 1e-6
                wt = torch.tensor(weights)[None, :, None]
                assert torch.equal(out, both[0:1] * wt), name  # exactly z * w
                byt5_io[f"{name}.unweighted"] = both[0:1]
                byt5_io[f"{name}.empty"] = both[1:2]
                byt5_cases[name]["extra"] = ["unweighted", "empty"]
            else:
                assert torch.equal(out, z), name
            if 1 in ids[:-1]:  # a written </s>: everything after it is masked and zeroed
                first = ids.index(1)
                assert torch.equal(out[0, first + 1:], torch.zeros_like(out[0, first + 1:]))
                assert out[0, first].abs().max() > 0
                byt5_cases[name]["zeroed_from"] = first + 1
            print(f"byT5 {name}: {len(ids)} ids, weights {sorted(set(weights))}, out std {out.std():.3f}")

        # The whole encoder as CLIPTextEncode runs it.
        for name in TE_CASES:
            prompt = PROMPTS[name]
            tokens = tok.tokenize_with_weights(prompt)
            assert clip.tokenize(prompt) == tokens, name
            out = clip.encode_from_tokens(tokens, return_pooled=True, return_dict=True)
            cond = out["cond"]
            assert out["pooled_output"] is None
            ids = [int(t[0]) for t in tokens["qwen25_7b"][0]]
            hidden, _, extra = q([ids])
            start = len(ids) - cond.shape[1]
            assert torch.equal(cond, hidden[:, start:]), name
            mask = extra["attention_mask"][0].tolist()
            template_end = hi_template_end(ids)
            assert start == (template_end if template_end >= 0 else len(ids) - 1), (name, start, template_end)
            io[f"{name}.cond"] = cond
            io[f"{name}.hidden"] = hidden
            case = {"prompt": prompt, "ids": ids, "cond_start": start, "template_end": template_end,
                    "cond_shape": list(cond.shape), "hidden_shape": list(hidden.shape),
                    "extra_keys": sorted(k for k in out if k not in ("cond", "pooled_output")),
                    "attention_mask": None, "byt5_ids": None, "byt5_weights": None,
                    "conditioning_byt5small_shape": None}
            if "attention_mask" in out:
                am = out["attention_mask"]
                assert am.shape == (1, cond.shape[1]) and am.tolist()[0] == mask[start:] and 0 in mask[start:]
                io[f"{name}.attention_mask"] = am.float()
                case["attention_mask"] = am[0].tolist()
            else:
                assert all(mask[start:]), name
            if "byt5" in tokens:
                c = out["conditioning_byt5small"]
                b_ids = [int(t[0]) for t in tokens["byt5"][0]]
                b_w = [float(t[1]) for t in tokens["byt5"][0]]
                want, _ = b.encode_token_weights(tokens["byt5"])
                assert torch.equal(c, want) and c.shape == (1, len(b_ids), 32), name
                io[f"{name}.conditioning_byt5small"] = c
                if f"{name}.out" in byt5_io:
                    assert torch.equal(c, byt5_io[f"{name}.out"]), name
                case.update(byt5_ids=b_ids, byt5_weights=b_w, conditioning_byt5small_shape=list(c.shape))
            else:
                assert "conditioning_byt5small" not in out
            te_cases[name] = case
            print(f"encoder {name}: {len(ids)} Qwen ids, cond from {start} (template_end {template_end}), cond "
                  f"{tuple(cond.shape)}, extra {case['extra_keys']}")

        # What the cases show.
        tail = [IM_END, 198, IM_START, 77091, 198]
        for name in ("plain", "empty", "double_quote", "weights"):
            c = te_cases[name]
            assert c["ids"][-5:] == tail and c["ids"][c["cond_start"] - 3:c["cond_start"]] == [IM_START, 872, 198]
        assert te_cases["empty"]["ids"][te_cases["empty"]["cond_start"]:] == [220] + tail  # " "
        nl = te_cases["newline"]
        assert nl["ids"][nl["cond_start"]:nl["cond_start"] + 3] == [IM_START, 872, 271]
        assert te_cases["start_header"]["cond_start"] == 36 and te_cases["start_header"]["ids"][0] == 27
        assert te_cases["start_header_short"]["cond_shape"][1] == 1
        assert te_cases["endoftext"]["attention_mask"] is not None
        assert all(c["attention_mask"] is None for n, c in te_cases.items() if n != "endoftext")
        qwen_cross_check(qwen_sd, te_cases, io)
        byt5_cross_check(byt5_sd, byt5_cases, byt5_io)

    save_file({k: v.float().contiguous() for k, v in byt5_io.items()}, f"{OUT}/byt5_io.safetensors")
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "seed": SEED,
            "qwen_config": {**QWEN, "head_dim": QWEN_HEAD_DIM, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                            "qkv_bias": True, "o_proj_bias": False, "mlp_activation": "silu",
                            "vocab_size": QWEN_VOCAB, "layer": "hidden", "layer_idx": LAYER_IDX,
                            "layer_taken": f"output of decoder layer {QWEN['num_hidden_layers'] + LAYER_IDX} (0-based)"
                                           " = transformers hidden_states[-3]",
                            "final_norm_applied": False, "rope": "1-D rotate-half, positions 0..N-1"},
            "embedding_rows": ROWS,
            "embedding_rule": f"qwen.safetensors stores {ROWS} token-table rows; id i uses row i % {ROWS} (tile the "
                              f"table to {QWEN_VOCAB} rows); the real ids are used everywhere else",
            "byt5_config": {**BYT5, "vocab_size": BYT5_VOCAB, "dense_act_fn": "gelu_pytorch_tanh (tanh approx.)",
                            "is_gated_act": True, "relative_attention_num_buckets": 32,
                            "relative_attention_max_distance": 128, "bias_in": "block 0 only, reused by all",
                            "attention_scale": 1.0, "layer_norm_epsilon": 1e-6, "layer": "last",
                            "final_norm_applied": True, "special_tokens": {"end": 1, "pad": 0},
                            "zero_out_masked": True},
            "template": tok.llama_template,
            "template_end_rule": "HunyuanImageTEModel: 36 if ids[0] == 27 and len(ids) > 36; else the index of the "
                                 "2nd 151644 (the 1st if only one; -1 if none), + 3 when followed by 872, 198; "
                                 "cond = hidden[:, template_end:] (template_end -1 keeps the last id only); the "
                                 "end is never cut",
            "attention_mask_rule": "1 up to the first 151643, which and all after it are 0; cut like cond; dropped "
                                   "when all ones",
            "byt5_weight_rule": "out[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] where w_j != 1, z_empty = the "
                                "model on [1, 0, 0, ...] (mask [1, 0, ...]) zeroed where masked: z_empty[j >= 1] = "
                                "0, and j = 0 is never weighted ('Text \"' first), so out = z * w exactly",
            "byt5_mask_rule": "1 up to and including the first id 1 (</s>), 0 after; masked keys get -finfo.max, "
                              "masked rows are zeroed",
            "te_cases": te_cases,
            "byt5_cases": byt5_cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")


def hi_template_end(ids):
    """The template_end ComfyUI's HunyuanImageTEModel / QwenImageTEModel compute (hi.py:66-70, qi.py:65-79),
    restated; checked against where cond starts."""
    if ids[0] == 27 and len(ids) > 36:
        return 36
    template_end, count = -1, 0
    for i, v in enumerate(ids):
        if v == IM_START and count < 2:
            template_end = i
            count += 1
    if len(ids) > template_end + 3 and ids[template_end + 1] == 872 and ids[template_end + 2] == 198:
        template_end += 3
    return template_end


def qwen_cross_check(qwen_sd, cases, io):
    """transformers' Qwen2Model with the same weights (the token table's 1000 rows fed id % 1000)."""
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(vocab_size=ROWS, **QWEN, head_dim=QWEN_HEAD_DIM, rms_norm_eps=1e-6,
                         max_position_embeddings=4096, use_sliding_window=False,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, attn_implementation="eager")
    net = Qwen2Model(config).eval()
    assert net.layers[0].self_attn.head_dim == QWEN_HEAD_DIM
    net.load_state_dict({k[len("model."):]: v for k, v in qwen_sd.items()}, strict=True)
    print("transformers Qwen2Model:")
    for name, case in cases.items():
        ids = torch.tensor([case["ids"]])
        mask = None
        if case["attention_mask"] is not None:
            first = case["ids"].index(PAD)
            mask = torch.tensor([[1] * first + [0] * (len(case["ids"]) - first)])
        out = net(input_ids=ids % ROWS, attention_mask=mask, output_hidden_states=True)
        hidden = io[f"{name}.hidden"]
        report(f"transformers Qwen2Model hidden_states[-3] vs ComfyUI's layer -3, {name}",
               rel_err(out.hidden_states[-3], hidden), 1e-5)
        assert rel_err(out.last_hidden_state, hidden) > 0.1 and rel_err(out.hidden_states[-2], hidden) > 0.1


def byt5_cross_check(byt5_sd, cases, io):
    """transformers' T5EncoderModel with the same weights."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=BYT5_VOCAB, d_model=BYT5["d_model"], d_kv=BYT5["d_kv"], num_heads=BYT5["num_heads"],
                      d_ff=BYT5["d_ff"], num_layers=BYT5["num_layers"], feed_forward_proj="gated-gelu",
                      relative_attention_num_buckets=32, relative_attention_max_distance=128,
                      layer_norm_epsilon=1e-6, dropout_rate=0.0, is_encoder_decoder=False,
                      tie_word_embeddings=False, attn_implementation="eager")
    assert config.dense_act_fn == "gelu_new" and config.is_gated_act
    net = T5EncoderModel(config).eval()
    missing, unexpected = net.load_state_dict(byt5_sd, strict=False)
    assert not unexpected and set(missing) <= {"encoder.embed_tokens.weight"}, (missing, unexpected)
    assert torch.equal(net.encoder.embed_tokens.weight, byt5_sd["shared.weight"])
    print("transformers T5EncoderModel:")
    for name, case in cases.items():
        ids = case["ids"]
        first = ids.index(1)
        mask = torch.tensor([[1] * (first + 1) + [0] * (len(ids) - first - 1)])
        out = net(input_ids=torch.tensor([ids]), attention_mask=mask).last_hidden_state * mask[..., None]
        want = io[f"{name}.unweighted" if f"{name}.unweighted" in io else f"{name}.out"]
        report(f"transformers T5EncoderModel vs ComfyUI's byT5, {name}", rel_err(out, want), 1e-5)
        if f"{name}.unweighted" in io:
            report(f"transformers T5EncoderModel * weights vs ComfyUI's weighted byT5, {name}",
                   rel_err(out * torch.tensor(case["weights"])[None, :, None], io[f"{name}.out"]), 1e-5)


def main():
    import_comfyui(node_modules=True)  # comfy.sd imports torchaudio: the stand-in
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    embeddings = tempfile.mkdtemp(prefix="hunyuan_video15_embeddings_")
    try:
        tok, tok_cases = tokenizer_fixture(embeddings)
        with open(f"{OUT}/tokenizer_cases.json", "w") as f:  # one case a line
            head = json.dumps({"template": tok.llama_template, "embedding_directory": "empty"}, ensure_ascii=False)
            lines = ",\n".join(f" {json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                                for k, v in tok_cases.items())
            f.write(head[:-1] + ', "cases": {\n' + lines + "\n}}\n")
        assert json.load(open(f"{OUT}/tokenizer_cases.json"))["cases"] == tok_cases
        models_fixture(tok, tok_cases)
    finally:
        shutil.rmtree(embeddings)
    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        assert size < BUDGET, name
        print(f"  {name:30} {size:9d} bytes")
    print(f"  total {total} bytes")
    print("CROSS-CHECKS (max |diff| / max |ref|):")
    for line in CROSS:
        print("  " + line)


if __name__ == "__main__":
    main()
