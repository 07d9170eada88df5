"""Fixtures for HunyuanVideo 1.0's text encoders (engine/models/tests/fixtures/hunyuan_video1_te/): what ComfyUI's
DualCLIPLoader builds for type `hunyuan_video` (CLIP-L + LLaVA-Llama 3 8B), its tokenizer HunyuanVideoTokenizer, and
what ComfyUI computes with tiny random networks of both, built by its own classes and loaded by its own loader.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; comfy.sd imports
torchaudio, for which comfyui.py puts an empty stand-in on the path when it is missing; `tiktoken` must be in the
venv, as for llama3_tokenizer.py, whose rebuild of ComfyUI's llama_tokenizer/tokenizer.json this script installs
into the checkout when it is missing, or checks when it is there):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/hunyuan_video1_te.py
It takes about 15 s on the CPU and is reproducible: a second run writes byte-identical files (every random value
comes from a seeded torch generator; nothing is written from the cross-checks).

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; hv.py is comfy/text_encoders/hunyuan_video.py):
- sd.py:1929-1931 (CLIPType.HUNYUAN_VIDEO, two files): clip = hv.hunyuan_video_clip(**llama_detect(clip_data)),
  tokenizer = hv.HunyuanVideoTokenizer. llama_detect (sd.py:1683-1691, hv.py:11-23) only reads the dtype of
  `model.norm.weight` and any quantization metadata. No detect_te_model on this path: HunyuanVideoClipModel.load_sd
  (hv.py:150-154) sends a file holding `text_model.encoder.layers.1.mlp.fc1.weight` to CLIP-L, anything else to the
  Llama model (load_state_dict strict=False).
- Tokenizer (hv.py:37-62): out["l"] = the plain CLIP-L SDTokenizer on the prompt (77-token sections, start 49406,
  end and pad 49407, weights parsed); out["llama"] = LLAMA3Tokenizer(min_length=1) (hv.py:26-28: an SDTokenizer with
  ComfyUI's pure-Python LlamaTokenizerFast, start 128000 (the tokenizer's own, sliced off each piece and put once
  in front), no end token, pad 128258 `<pad>`, max_length 99999999, no padding to it: ONE section, never padded)
  on llama_template.format(prompt): the WHOLE templated text goes through the weight parser (the template has no
  brackets, so only the prompt's `(word:1.2)` give weights; an unclosed bracket runs to the end of the template).
  No "already templated" check (unlike Qwen's tokenizers): a prompt starting with `<|start_header_id|>` is put in
  the template like any other. Both get the embeddings folder (an empty one here): `embedding:name` drops the name.
  `<image>` (128257) would be replaced by image_embeds; CLIPTextEncode passes none, so it stays an id.
- LLAMAModel (hv.py:30-34): SDClipModel(layer "hidden", layer_idx -3, layer_norm_hidden_state False, special tokens
  start 128000 pad 128258, attention masks on and returned), comfy.text_encoders.llama.Llama2 with Llama2Config
  (llama.py:36-56: vocab 128320, hidden 4096, 32 layers, 32 heads, 8 kv heads, head_dim 128, eps 1e-5, theta
  500000, no RoPE scaling, final norm, no lm_head). llama.py:884-885 turns -3 into len(layers) - 3 and :921-922
  clones x right after that layer; the final norm applies to x only. So the states are the output of decoder
  layer index L - 3 (0-based; 29 of 32 released, 1 of this tiny model's 4) = transformers' hidden_states[-3], no
  final norm. Positions 0..N-1.
  process_tokens (sd1_clip.py:172-258): the mask is 1 up to the first 128258 (`<pad>`: the pad is the end token
  when there is none), which is itself masked, and 0 after it; masked keys get finfo.min / 4 (llama.py:833-843),
  masked rows are still computed.
- Weights (sd1_clip.py:27-79): when any Llama weight != 1, the "empty" ids [128000, 128258, 128258, ...] of the
  same length are encoded in the same batch (mask [1, 0, 0, ...]: its pads attend to the start token alone) and
  z[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] where w_j != 1, BEFORE the crop.
- HunyuanVideoClipModel.encode_token_weights (hv.py:102-148), the crop: template_end = 0, user_end = 9999999999999;
  over the Llama ids, every 128006 (`<|start_header_id|>`) followed by 882 ("user") and 128007
  (`<|end_header_id|>`) sets template_end to the index of that 128007 and user_end = -1; a 128009 (`<|eot_id|>`)
  while user_end == -1 sets user_end to its index + 1 (the eot kept). Then, when there are more than
  template_end + 2 ids and the id after template_end is 271 ("\\n\\n"), template_end += 2. cond =
  states[:, template_end:user_end] (Python slicing: user_end -1 would drop the last row); the attention mask is cut
  the same way and dropped when all ones. With ComfyUI's template: cond = the prompt's ids + the closing
  `<|eot_id|>`. A prompt starting with "\\n" merges with the template's "\\n\\n" into another id, so cond then starts
  at the `<|end_header_id|>`; a prompt writing `<|start_header_id|>user<|end_header_id|>` moves the start after
  its own header; a written `<|eot_id|>` after the last user header ends cond there.
- CLIP-L (hv.py:91): SDClipModel(return_projected_pooled=False) on sd1_clip_config.json (layer "last", no attention
  mask); its states are discarded; pooled = final_layer_norm of the last layer at the first 49407 of the FIRST
  section, unprojected, weights not applied.
- CLIP.encode_from_tokens(return_dict=True) (what CLIPTextEncode runs): {"cond", "pooled_output", "attention_mask"
  (only when kept)}.

The tiny configs (released values in brackets), both through ComfyUI's own model_options override (sd1_clip.py:
105-108; the Llama's key is "llama_model_config", CLIP-L's "clip_l_model_config"):
- Llama2Config: hidden 64 [4096], intermediate 128 [14336], 4 layers [32], 2 heads [32] / 1 kv head [8];
  head_dim 128 (a class attribute, kept as released), eps 1e-5, theta 500000, vocabulary 128320 as released.
- CLIP-L: hidden 64 [768], 2 heads of 32 [12 of 64], intermediate 128 [3072], 2 layers [12]; vocabulary 49408.
Each token table stores its first 1000 rows; id i uses row i % 1000 (tile the table to the real vocabulary,
common.rs tiled_table); ComfyUI's modules get the tiled tables and run on the real ids.

Writes engine/models/tests/fixtures/hunyuan_video1_te/ (every tensor f32; weights hold bf16-representable values):
- tokenizer_cases.json: {"template", "embedding_directory": "empty", "cases": {name: {"prompt", "llama_text" (what
  the Llama tokenizer got), "llama": {"ids": [[...]], "weights": [[...]]}, "l": {"ids": [[...]], "weights":
  [[...]]}} (one list per section)}}.
- llama.safetensors: model.embed_tokens.weight [1000, 64], model.layers.N.self_attn.{q_proj [256, 64], k_proj
  [128, 64], v_proj [128, 64], o_proj [64, 256]}.weight, model.layers.N.mlp.{gate_proj, up_proj}.weight [128, 64],
  mlp.down_proj.weight [64, 128], model.layers.N.{input_layernorm, post_attention_layernorm}.weight [64],
  model.norm.weight [64], N = 0..3 (the names of llava_llama3_fp8_scaled.safetensors).
- clip_l.safetensors: transformers' CLIP-L names (text_model.*, text_projection.weight) as in clip_l.safetensors,
  the token table's first 1000 rows.
- te_io.safetensors, per case e of TE_CASES: `{e}.cond` [1, M, 64], `{e}.pooled` [1, 64], `{e}.attention_mask`
  [1, M] (f32 0/1; only when ComfyUI keeps it), `{e}.hidden` [1, N, 64] (the Llama's layer -3 states of all N ids
  before the crop, unweighted).
- te_cases.json: configs, rules, per case the prompt, `ids`/`weights` (the Llama section), `l_ids`, `cond_start`,
  `cond_end` (cond = states[cond_start:cond_end]), `attention_mask` (list or null), shapes, `extra_keys`.

Checks: the loaded ComfyUI modules hold exactly the written values; clip.tokenize gives the tokenizer's tokens;
cond == hidden[:, cond_start:cond_end] for unweighted prompts, and == the weighted rule restated for the weighted
one; the rule restated (`crop`) gives ComfyUI's cut for every tokenizer case; pooled == CLIP-L's first section's.
Cross-checks (max |diff| / max |ref|, CPU f32, printed at the end): transformers LlamaModel hidden_states[-3] vs
ComfyUI's pre-crop states (its hidden_states[-2] and last_hidden_state are > 10% away); transformers
CLIPTextModel's last_hidden_state at the first 49407 vs ComfyUI's pooled.
"""

import json
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
import llama3_tokenizer  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                   "../../engine/models/tests/fixtures/hunyuan_video1_te")
SEED = 1010
BUDGET = 5_000_000

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1)
LLAMA_HEAD_DIM = 128
LLAMA_VOCAB = 128320
CLIP_L = dict(hidden_size=64, num_attention_heads=2, intermediate_size=128, num_hidden_layers=2)
CLIP_VOCAB = 49408
CLIP_BOS, CLIP_EOS = 49406, 49407
ROWS = 1000  # stored rows of each token table; row r serves every id with id % ROWS == r
BOS, PAD = 128000, 128258
START_HEADER, USER, END_HEADER, EOT, DOUBLE_NEWLINE = 128006, 882, 128007, 128009, 271
LAYER_IDX = -3

LONG = ("a breathtaking panoramic shot of an ancient stone lighthouse on a rugged cliff above a stormy grey ocean at "
        "dusk, towering waves crashing against black volcanic rocks, sea spray drifting through the cold air, a "
        "narrow footpath lined with wild heather leading up to a weathered wooden door, warm golden light glowing "
        "from the lantern room, flocks of white seagulls circling overhead, dramatic clouds tinted purple and "
        "orange by the setting sun, a small red fishing boat struggling through the swell in the distance, the "
        "camera slowly pushing in, cinematic, volumetric lighting")
PROMPTS = {
    "plain": "a red fox running through fresh snow at dawn, cinematic lighting",
    "empty": "",
    "weights": "a (red car:1.2) next to a (blue) house, (((shadows)))",
    "brackets": "((masterpiece)), simple (unclosed",
    "escaped": "a \\(literal\\) word and \\(another",
    "long": LONG,
    "newline": "a lake at night\nthe moon rising\n\nstars",
    "leading_newline": "\na lake at night",
    "leading_space": " a lake at night",
    "non_ascii": "a café sign 中文 🎉 naïve, việc in Hà Nội",
    "embedding": "a cat embedding:foo, and a dog",
    "start_header": "<|start_header_id|>user<|end_header_id|>\n\na second user turn",
    "custom_template": "<|start_header_id|>system<|end_header_id|>\n\nDescribe it.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\na fox in the snow<|eot_id|>",
    "start_header_bare": "<|start_header_id|>a fox",
    "eot": "a cat<|eot_id|>a dog",
    "pad": "a cat<pad>a dog",
    "image": "a <image> on a wall",
}
TE_CASES = ["plain", "empty", "weights", "long", "leading_newline", "start_header", "custom_template", "eot", "pad"]


class Draw:
    """The one seeded generator every parameter comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def draw_module(d, module, norms):
    """Every state_dict entry re-drawn in f32 and rounded to bf16 (kept as f32): gains of the named norm modules
    1 + 0.1 N, biases 0.1 N, embedding tables N(0, 1), other weights N / sqrt(fan_in)."""
    out = {}
    for name, p in module.state_dict().items():
        if "position_ids" in name:
            continue
        owner = name.rsplit(".", 1)[0]
        if owner in norms and name.endswith(".weight"):
            v = d.normal(p.shape, 0.1, 1.0)
        elif name.endswith("bias"):
            v = d.normal(p.shape, 0.1)
        elif "embed" in name:
            v = d.normal(p.shape, 1.0)
        else:
            v = d.normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
        out[name] = v.to(torch.bfloat16).float().contiguous()
    return out


def norm_names(module):
    return {n for n, m in module.named_modules()
            if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(m).__name__ == "RMSNorm"}


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


def check_loaded(module, want):
    have = {k: v for k, v in module.state_dict().items() if "position_ids" not in k}
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


def crop(ids):
    """HunyuanVideoClipModel.encode_token_weights' cut (hv.py:111-137) restated: (start, end) of cond in the
    states of `ids` (Python slice semantics resolved)."""
    template_end, user_end = 0, 9999999999999
    for i, v in enumerate(ids):
        if v == START_HEADER and ids[i + 1] == USER and ids[i + 2] == END_HEADER:
            template_end, user_end = i + 2, -1
        if v == EOT and user_end == -1:
            user_end = i + 1
    if len(ids) > template_end + 2 and ids[template_end + 1] == DOUBLE_NEWLINE:
        template_end += 2
    return range(len(ids))[template_end:user_end].start, range(len(ids))[template_end:user_end].stop


# ----------------------------------------------------------------------------------------------------- tokenizer


def install_llama_tokenizer():
    """ComfyUI's llama_tokenizer/tokenizer.json (absent from the snapshot) as llama3_tokenizer.py rebuilds it."""
    comfyui = os.environ["COMFYUI_DIR"]
    ranks_path = llama3_tokenizer.rank_file()
    try:
        text = llama3_tokenizer.build_tokenizer_json(ranks_path, comfyui)
    finally:
        os.unlink(ranks_path)
    return llama3_tokenizer.install_tokenizer_json(text, comfyui)


def tokenizer_fixture(embeddings):
    import comfy.text_encoders.hunyuan_video as hv

    tok = hv.HunyuanVideoTokenizer(embedding_directory=embeddings)
    ll, cl = tok.llama, tok.clip_l
    assert (ll.tokens_start, ll.start_token, ll.end_token, ll.pad_token, ll.min_length, ll.max_length,
            ll.pad_to_max_length, ll.disable_weights) == (1, BOS, None, PAD, 1, 99999999, False, False)
    assert (cl.start_token, cl.end_token, cl.pad_token, cl.max_length, cl.pad_to_max_length) == \
        (CLIP_BOS, CLIP_EOS, CLIP_EOS, 77, True)
    assert ll.embedding_directory == embeddings and cl.embedding_directory == embeddings
    seen = {}
    inner = ll.tokenize_with_weights

    def spy(text, *args, **kwargs):
        seen["llama"] = text
        return inner(text, *args, **kwargs)

    ll.tokenize_with_weights = spy
    cases = {}
    for name, prompt in PROMPTS.items():
        seen.clear()
        out = tok.tokenize_with_weights(prompt)
        assert set(out) == {"l", "llama"} and len(out["llama"]) == 1, name
        assert seen["llama"] == tok.llama_template.format(prompt), name
        cases[name] = {"prompt": prompt, "llama_text": seen["llama"], "llama": pairs(out["llama"]),
                       "l": pairs(out["l"])}
        ids = cases[name]["llama"]["ids"][0]
        print(f"tokens {name}: {len(ids)} Llama ids (cond {crop(ids)}), {len(out['l'])} CLIP-L section(s)")
    ll.tokenize_with_weights = inner

    # What the cases show (restated from ComfyUI's code, asserted here).
    template = cases["empty"]["llama"]["ids"][0]
    assert len(template) == 95 + 1 and template[0] == BOS and template[-3:] == [END_HEADER, DOUBLE_NEWLINE, EOT]
    assert crop(template) == (95, 96)  # the template's closing <|eot_id|> alone
    plain = cases["plain"]["llama"]["ids"][0]
    assert plain[:95] == template[:95] and plain[-1] == EOT and crop(plain) == (95, len(plain))
    assert all(w == 1.0 for c in cases.values() if "(" not in c["prompt"] for w in c["llama"]["weights"][0])
    w = cases["weights"]["llama"]["weights"][0]
    assert {1.2, 1.1} <= set(w) and any(abs(x - 1.331) < 1e-6 for x in w), sorted(set(w))
    # An unclosed bracket is text (weight 1), up to the end of the template.
    assert {round(w, 9) for w in cases["brackets"]["llama"]["weights"][0][95:]} == {1.21, 1.0}
    assert all(w == 1.0 for w in cases["escaped"]["llama"]["weights"][0])
    nl = cases["leading_newline"]["llama"]["ids"][0]
    assert nl[94] != DOUBLE_NEWLINE and crop(nl)[0] == 93 and nl[93] == END_HEADER
    sh = cases["start_header"]["llama"]["ids"][0]
    assert sh.count(START_HEADER) == 3 and crop(sh) == (max(i for i, v in enumerate(sh) if v == END_HEADER) + 2,
                                                        len(sh))
    ct = cases["custom_template"]["llama"]["ids"][0]
    assert ct[-2:] == [EOT, EOT] and crop(ct)[1] == len(ct) - 1  # its own <|eot_id|> ends cond
    assert crop(cases["start_header_bare"]["llama"]["ids"][0])[0] == 95
    eot = cases["eot"]["llama"]["ids"][0]
    assert crop(eot)[1] == eot.index(EOT, 95) + 1 < len(eot)
    assert PAD in cases["pad"]["llama"]["ids"][0] and 128257 in cases["image"]["llama"]["ids"][0]
    assert len(cases["long"]["l"]["ids"]) == 2 and len(cases["long"]["llama"]["ids"]) == 1
    return tok, cases


# ---------------------------------------------------------------------------------------------------- the models


MODEL_OPTIONS = {"llama_model_config": dict(LLAMA), "clip_l_model_config": dict(CLIP_L)}


def load_te(llama_sd, clip_sd):
    """ComfyUI's own DualCLIPLoader path: load_text_encoder_state_dicts([clip_l, llama], HUNYUAN_VIDEO) builds
    hv.hunyuan_video_clip(**llama_detect) and HunyuanVideoTokenizer and loads each file through
    HunyuanVideoClipModel.load_sd; the tiny sizes go through model_options."""
    import comfy.sd

    # long_clipl.model_options_long_clip (sd.py:2017-2019) replaces "clip_l_model_config" with its "model_config"
    # plus the file's max_position_embeddings: the tiny CLIP-L config goes in through "model_config" there.
    # The weights are kept in f32 (model_options "dtype"; on the CPU ComfyUI would store them in f16, computing in
    # f32 all the same: SDClipModel embeds with out_dtype f32 and manual_cast casts each weight to the activations).
    options = {"llama_model_config": dict(LLAMA), "model_config": dict(CLIP_L), "dtype": torch.float32}
    return comfy.sd.load_text_encoder_state_dicts([dict(clip_sd), dict(llama_sd)],
                                                  clip_type=comfy.sd.CLIPType.HUNYUAN_VIDEO, model_options=options)


def models_fixture(tok_cases, embeddings):
    import comfy.text_encoders.hunyuan_video as hv

    shell = hv.hunyuan_video_clip()(device="cpu", dtype=torch.float32, model_options=dict(MODEL_OPTIONS))
    d = Draw(SEED)
    llama_sd = draw_module(d, shell.llama.transformer, norm_names(shell.llama.transformer))
    clip_sd = draw_module(d, shell.clip_l.transformer, norm_names(shell.clip_l.transformer))
    del shell
    assert all(k.startswith("model.") for k in llama_sd) and "model.norm.weight" in llama_sd
    assert llama_sd["model.layers.0.self_attn.q_proj.weight"].shape == (2 * LLAMA_HEAD_DIM, 64)
    assert all(k.startswith(("text_model.", "text_projection")) for k in clip_sd)
    llama_sd["model.embed_tokens.weight"] = llama_sd["model.embed_tokens.weight"][:ROWS].clone()
    table = "text_model.embeddings.token_embedding.weight"
    clip_sd[table] = clip_sd[table][:ROWS].clone()
    save_file(llama_sd, f"{OUT}/llama.safetensors")
    save_file(clip_sd, f"{OUT}/clip_l.safetensors")
    llama_sd, clip_sd = load_file(f"{OUT}/llama.safetensors"), load_file(f"{OUT}/clip_l.safetensors")

    llama_full = dict(llama_sd)
    llama_full["model.embed_tokens.weight"] = tile(llama_sd["model.embed_tokens.weight"], LLAMA_VOCAB)
    clip_full = dict(clip_sd)
    clip_full[table] = tile(clip_sd[table], CLIP_VOCAB)
    clip = load_te(llama_full, clip_full)
    te = clip.cond_stage_model
    assert isinstance(te, hv.HunyuanVideoClipModel) and isinstance(clip.tokenizer, hv.HunyuanVideoTokenizer)
    clip.tokenizer.llama.embedding_directory = clip.tokenizer.clip_l.embedding_directory = embeddings
    ll, cl = te.llama, te.clip_l
    cfg = ll.transformer.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size, cfg.rms_norm_eps, cfg.rope_theta, cfg.qkv_bias,
            cfg.q_norm, cfg.final_norm, cfg.rope_scale, cfg.lm_head) == \
        (64, 128, 4, 2, 1, LLAMA_HEAD_DIM, LLAMA_VOCAB, 1e-5, 500000.0, False, None, True, None, False)
    assert (ll.layer, ll.layer_idx, ll.layer_norm_hidden_state, ll.enable_attention_masks, ll.return_attention_masks,
            ll.zero_out_masked, ll.special_tokens) == \
        ("hidden", LAYER_IDX, False, True, True, False, {"start": BOS, "pad": PAD})
    assert (cl.layer, cl.layer_norm_hidden_state, cl.return_projected_pooled, cl.enable_attention_masks,
            cl.special_tokens) == ("last", True, False, False, {"start": CLIP_BOS, "end": CLIP_EOS, "pad": CLIP_EOS})
    assert te.dtypes == {torch.float32}
    check_loaded(ll.transformer, llama_full)
    check_loaded(cl.transformer, clip_full)

    io, cases = {}, {}
    with torch.no_grad():
        for name in TE_CASES:
            prompt = PROMPTS[name]
            tokens = clip.tokenize(prompt)
            assert pairs(tokens["llama"]) == tok_cases[name]["llama"] and pairs(tokens["l"]) == tok_cases[name]["l"]
            out = clip.encode_from_tokens(tokens, return_pooled=True, return_dict=True)
            cond, pooled = out["cond"], out["pooled_output"]
            ids = tok_cases[name]["llama"]["ids"][0]
            weights = tok_cases[name]["llama"]["weights"][0]
            hidden, none, extra = ll([ids])
            assert none is None
            mask = extra["attention_mask"][0].tolist()
            assert mask == ([1] * ids.index(PAD) + [0] * (len(ids) - ids.index(PAD)) if PAD in ids
                            else [1] * len(ids)), name
            start, end = crop(ids)
            if all(w == 1.0 for w in weights):
                assert torch.equal(cond, hidden[:, start:end]), name
            else:
                empty_ids = [BOS] + [PAD] * (len(ids) - 1)
                both = ll([ids, empty_ids])[0]
                assert rel_err(both[0:1], hidden) < 1e-5
                empty = ll([empty_ids])[0]
                assert rel_err(both[1:2], empty) < 1e-5
                wt = torch.tensor(weights)[None, :, None]
                want = torch.where(wt != 1.0, (both[0:1] - both[1:2]) * wt + both[1:2], both[0:1])
                assert rel_err(cond, want[:, start:end]) < 1e-6, name
                assert rel_err(cond, hidden[:, start:end]) > 1e-3, name
            first_pooled = cl([tok_cases[name]["l"]["ids"][0]])[1]
            assert rel_err(pooled, first_pooled) < 1e-6, name
            io[f"{name}.cond"], io[f"{name}.pooled"], io[f"{name}.hidden"] = cond, pooled, hidden
            case = {"prompt": prompt, "ids": ids, "weights": weights, "l_ids": tok_cases[name]["l"]["ids"],
                    "cond_start": start, "cond_end": end, "cond_shape": list(cond.shape),
                    "pooled_shape": list(pooled.shape), "hidden_shape": list(hidden.shape),
                    "extra_keys": sorted(k for k in out if k not in ("cond", "pooled_output")),
                    "attention_mask": None}
            if "attention_mask" in out:
                am = out["attention_mask"]
                assert am.shape == (1, cond.shape[1]) and am[0].tolist() == mask[start:end] and 0 in mask[start:end]
                io[f"{name}.attention_mask"] = am.float()
                case["attention_mask"] = am[0].tolist()
            else:
                assert all(mask[start:end]), name
            cases[name] = case
            print(f"encoder {name}: {len(ids)} Llama ids, cond [{start}, {end}) {tuple(cond.shape)}, extra "
                  f"{case['extra_keys']}")

        # What the cases show.
        assert cases["empty"]["cond_shape"][1] == 1 and cases["pad"]["attention_mask"] is not None
        assert all(c["attention_mask"] is None for n, c in cases.items() if n != "pad")
        assert cases["leading_newline"]["ids"][cases["leading_newline"]["cond_start"]] == END_HEADER
        assert cases["eot"]["cond_end"] < len(cases["eot"]["ids"])
        assert rel_err(io["long.pooled"], cl([cases["long"]["l_ids"][1]])[1]) > 1e-2  # the first section's
        llama_cross_check(llama_sd, cases, io)
        clip_cross_check(clip_sd, cases, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/te_io.safetensors")
    with open(f"{OUT}/te_cases.json", "w") as f:
        json.dump({
            "seed": SEED,
            "llama_config": {**LLAMA, "head_dim": LLAMA_HEAD_DIM, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                             "qkv_bias": False, "mlp_activation": "silu", "vocab_size": LLAMA_VOCAB,
                             "layer": "hidden", "layer_idx": LAYER_IDX,
                             "layer_taken": f"output of decoder layer {LLAMA['num_hidden_layers'] + LAYER_IDX} "
                                            "(0-based) = transformers hidden_states[-3]",
                             "final_norm_applied": False, "rope": "1-D rotate-half, positions 0..N-1"},
            "clip_l_config": {**CLIP_L, "hidden_act": "quick_gelu", "max_position_embeddings": 77,
                              "layer_norm_eps": 1e-5, "vocab_size": CLIP_VOCAB,
                              "pooled": "final_layer_norm(last layer) at the first 49407 of section 0, no projection, "
                                        "weights not applied"},
            "embedding_rows": ROWS,
            "embedding_rule": f"llama / clip_l store {ROWS} token-table rows; id i uses row i % {ROWS} (tile the "
                              f"tables to {LLAMA_VOCAB} / {CLIP_VOCAB} rows); the real ids are used everywhere else",
            "crop_rule": "template_end = index of the 128007 of the last 128006 882 128007, user_end = index + 1 of "
                         "the first 128009 after it; template_end += 2 when more than template_end + 2 ids and "
                         "ids[template_end + 1] == 271; cond = states[template_end:user_end]",
            "attention_mask_rule": "1 up to the first 128258 (<pad>), which and all after it are 0; cut like cond; "
                                   "dropped when all ones",
            "weight_rule": "z[j] = (z[j] - z_empty[j]) * w_j + z_empty[j] where w_j != 1, z_empty = the model on "
                           "[128000, 128258, ...] (mask [1, 0, ...]), before the crop",
            "te_cases": cases,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")


def llama_cross_check(llama_sd, cases, io):
    """transformers' LlamaModel with the same weights (the token table's 1000 rows fed id % 1000)."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=ROWS, **LLAMA, head_dim=LLAMA_HEAD_DIM, rms_norm_eps=1e-5,
                         max_position_embeddings=8192, hidden_act="silu", attention_bias=False, mlp_bias=False,
                         rope_parameters={"rope_theta": 500000.0, "rope_type": "default"},
                         attn_implementation="eager")
    net = LlamaModel(config).eval()
    assert net.layers[0].self_attn.head_dim == LLAMA_HEAD_DIM
    net.load_state_dict({k[len("model."):]: v for k, v in llama_sd.items()}, strict=True)
    print("transformers LlamaModel:")
    for name, case in cases.items():
        ids = torch.tensor([case["ids"]])
        mask = None
        if PAD in case["ids"]:
            first = case["ids"].index(PAD)
            mask = torch.tensor([[1] * first + [0] * (len(case["ids"]) - first)])
        out = net(input_ids=ids % ROWS, attention_mask=mask, output_hidden_states=True)
        hidden = io[f"{name}.hidden"]
        report(f"transformers LlamaModel hidden_states[-3] vs ComfyUI's layer -3, {name}",
               rel_err(out.hidden_states[-3], hidden), 1e-5)
        assert rel_err(out.last_hidden_state, hidden) > 0.1 and rel_err(out.hidden_states[-2], hidden) > 0.1


def clip_cross_check(clip_sd, cases, io):
    """transformers' CLIPTextModel with the same weights (vocabulary 1000, fed id % 1000)."""
    from transformers import CLIPTextConfig, CLIPTextModel

    cm = CLIPTextModel(CLIPTextConfig(vocab_size=ROWS, max_position_embeddings=77, hidden_act="quick_gelu",
                                      layer_norm_eps=1e-5, bos_token_id=CLIP_BOS % ROWS, eos_token_id=CLIP_EOS % ROWS,
                                      pad_token_id=1, attn_implementation="eager", **CLIP_L)).eval()
    strip = "text_model." if "final_layer_norm.weight" in cm.state_dict() else ""
    missing, unexpected = cm.load_state_dict({k[len(strip):]: v for k, v in clip_sd.items()
                                              if k != "text_projection.weight"}, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
    print("transformers CLIPTextModel:")
    for name, case in cases.items():
        l_ids = torch.tensor([case["l_ids"][0]])
        last = cm(input_ids=l_ids % ROWS).last_hidden_state
        eos = int((l_ids[0] == CLIP_EOS).nonzero()[0])
        report(f"transformers CLIPTextModel at the first 49407 vs ComfyUI's pooled, {name}",
               rel_err(last[:, eos], io[f"{name}.pooled"]), 1e-5)


def main():
    import_comfyui(node_modules=True)  # comfy.sd imports torchaudio: the stand-in
    sha = install_llama_tokenizer()
    print(f"llama_tokenizer/tokenizer.json sha256 {sha}")
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    embeddings = tempfile.mkdtemp(prefix="hunyuan_video1_embeddings_")
    try:
        tok, tok_cases = tokenizer_fixture(embeddings)
        with open(f"{OUT}/tokenizer_cases.json", "w") as f:  # one case a line
            head = json.dumps({"template": tok.llama_template, "embedding_directory": "empty"}, ensure_ascii=False)
            lines = ",\n".join(f" {json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                                for k, v in tok_cases.items())
            f.write(head[:-1] + ', "cases": {\n' + lines + "\n}}\n")
        assert json.load(open(f"{OUT}/tokenizer_cases.json"))["cases"] == tok_cases
        models_fixture(tok_cases, embeddings)
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
