"""Fixtures for Kiln's T5 v1.1 encoder (Flux.1's T5-XXL) and its bundled tokenizer (engine/models/tests/fixtures/t5/).

Run from the repository root:  [COMFYUI_DIR=...] $(scripts/reference/setup.sh) scripts/reference/t5.py

Writes:
- weights.safetensors: a tiny transformers `T5EncoderModel` with T5 v1.1's structure (gated-GELU(tanh) FFN, RMS
  norms with eps 1e-6, relative position bias with 32 buckets and max distance 128 in block 0 only, no attention
  scaling): d_model 64, 4 heads of width 16, FFN 96, 3 blocks, vocab 512; random weights seeded, stored as bf16
  under the names of ComfyUI's `t5xxl_fp16.safetensors` (`shared.weight`, `encoder.block.*`,
  `encoder.final_layer_norm.weight`; transformers' tied copy `encoder.embed_tokens.weight` is left out).
- hidden.safetensors: for each case, `hidden.<name>` = `last_hidden_state` (after the final norm) [1, N, 64] f32,
  computed in f32 from the bf16-rounded weights with eager attention.
- cases.json: the cases' synthetic token ids (< 512; lengths 1, 5, 40 and 150, the last past the 128 positions
  where the bias buckets stop growing).
- buckets.json: transformers' `T5Attention._relative_position_bucket` (bidirectional, 32 buckets, max distance
  128) for relative positions -300..=300.
- tokenizer_ids.json: for a set of prompts, the ids of ComfyUI's T5 tokenizer (its `t5_tokenizer/tokenizer.json`
  run by the python `tokenizers` library, which is what transformers 4.x's `T5TokenizerFast.from_pretrained` on that
  folder runs), minus the trailing EOS as ComfyUI's SDTokenizer slices them (`[0:-1]`). Checked against the venv's
  transformers `T5TokenizerFast.from_pretrained(folder)` (ComfyUI's call): equal for every prompt without an added
  token (`<pad>`, `</s>`, ...) written in it. transformers 5 rebuilds the pipeline in `T5Tokenizer.__init__`
  (WhitespaceSplit, Metaspace "always") instead of using the file's, which puts a "▁" after a written added
  token; where that gives other ids they are kept as `transformers5`.

With COMFYUI_DIR set, ComfyUI's own `comfy.text_encoders.t5.T5` (manual-cast ops, f32 activations from f32
embeddings, as ComfyUI's SDClipModel runs it) is loaded with the same weights and checked against the
transformers reference; its tokenizer folder is read from there too (default: /tmp/comfy/ComfyUI).

Independent references only (transformers, tokenizers, ComfyUI itself); no Kiln code.
"""

import gzip
import json
import os
import pathlib

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import T5Config, T5EncoderModel, T5TokenizerFast
from transformers.models.t5.modeling_t5 import T5Attention

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/t5"
BUNDLED = ROOT / "engine/models/data/t5-tokenizer/tokenizer.json.gz"
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
COMFY_TOKENIZER = pathlib.Path(COMFYUI_DIR or "/tmp/comfy/ComfyUI") / "comfy/text_encoders/t5_tokenizer"

VOCAB = 512
ADDED = ["<pad>", "</s>", "<unk>", "<extra_id_"]

# The default workflow's prompts (ComfyUI_frontend defaultGraph.ts, nodes 67 and 71), as in qwen3.py.
POSITIVE = (
    "anime RPG game style, cute anime girl with gigantic fennec ears and a big fluffy fox tail with long wavy "
    "blonde hair and large blue eyes blonde colored eyelashes wearing a pink sweater a large oversized gold "
    "trimmed black winter coat and a long blue maxi skirt and a red scarf, she is sitting beside a campfire in "
    "the wilderness at night playing guitar with a milky way galaxy sky"
)
NEGATIVE = "low quality, bad anatomy, extra digits, missing digits, extra limbs, missing limbs"

PROMPTS = [
    # qwen3.py's list.
    "",
    "a photo of a cat",
    "Hello, World! It's 2026; the year's 1st test... isn't it?",
    "一只可爱的猫坐在窗台上，阳光明媚。日本語のテキストも。한국어 문장.",
    "emoji 🐱🚀👩‍👩‍👧 and ✨ sparkles ✨",
    "digits 1234567890 and 3.14159 and 10,000,000",
    "\nleading newline",
    "trailing newline\n",
    "\n\n  both ends with spaces  \n\n",
    "tabs\tand\r\nwindows line ends\r\n",
    "weights (masterpiece:1.2), \\(escaped\\) parens, \\\\(double\\\\) and embedding:foo stay",
    "special tokens in text <|im_end|> and <|endoftext|>",
    "Café naïve façade — NFC: e\u0301 vs \u00e9",
    "   ",
    POSITIVE,
    NEGATIVE,
    # T5-specific.
    "multiple    spaces   between  words",
    "   leading spaces",
    "trailing spaces   ",
    "  both  ",
    "Crème brûlée, Ångström, smørrebrød, Straße, İstanbul",
    "NFKC: ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３, ligature ﬁne, ① ② ③, ㎏ ㍻, x² H₂O, ½ ™ …",
    "nbsp\u00a0and\u3000ideographic space, zero\u200bwidth",
    "<pad> and </s> written in text",
    "a cat</s>a dog<pad>",
    "<extra_id_0> sentinel <extra_id_99>",
    "<unk> itself",
    "▁already▁escaped ▁",
    "numbers: 0 7 42 1,024 3.5e-7 -12 +3 2026-12-02 12:30",
    "UPPER lower MiXeD",
    "quotes \"double\" 'single' `back` «guillemets» “curly”",
]


def model_fixture() -> dict:
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        num_heads=4,
        d_ff=96,
        num_layers=3,
        feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        layer_norm_epsilon=1e-6,
        dropout_rate=0.0,
        is_encoder_decoder=False,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    assert config.dense_act_fn == "gelu_new" and config.is_gated_act
    model = T5EncoderModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                # Norm weights away from 1 so a norm applied with the wrong weight (or not at all) shows.
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("relative_attention_bias.weight"):
                p.copy_(torch.randn_like(p))
            elif name == "shared.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            # Kiln reads the bf16 file and widens exactly: compute from the same values.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    state = {k: v for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    assert not any("relative_attention_bias" in k for k in state if not k.startswith("encoder.block.0."))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, OUT / "weights.safetensors")

    gen = torch.Generator().manual_seed(1)
    cases = {
        "len1": [7],
        "len5": [1, 0, 511, 42, 1],
        "len40": torch.randint(0, VOCAB, (40,), generator=gen).tolist(),
        "len150": torch.randint(0, VOCAB, (150,), generator=gen).tolist(),
    }
    outputs = {}
    with torch.no_grad():
        for name, ids in cases.items():
            out = model(input_ids=torch.tensor([ids])).last_hidden_state
            outputs[f"hidden.{name}"] = out.to(torch.float32).contiguous()
    save_file(outputs, OUT / "hidden.safetensors")
    (OUT / "cases.json").write_text(json.dumps(cases) + "\n")
    check_comfyui_model(config, state, cases, outputs)
    return cases


def check_comfyui_model(config, state, cases, outputs) -> None:
    """ComfyUI's T5 as its SDClipModel runs it (manual-cast ops, f32 embeddings in, f32 activations) gives the
    transformers reference."""
    if not COMFYUI_DIR:
        print("COMFYUI_DIR not set: the model is not checked against ComfyUI's T5")
        return
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from comfyui import import_comfyui

    import_comfyui()
    import comfy.ops
    import comfy.text_encoders.t5

    comfy_config = {
        "d_ff": config.d_ff,
        "d_kv": config.d_kv,
        "d_model": config.d_model,
        "dense_act_fn": "gelu_pytorch_tanh",
        "is_gated_act": True,
        "model_type": "t5",
        "num_heads": config.num_heads,
        "num_layers": config.num_layers,
        "vocab_size": config.vocab_size,
    }
    model = comfy.text_encoders.t5.T5(comfy_config, torch.bfloat16, "cpu", comfy.ops.manual_cast)
    missing, unexpected = model.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    worst = 0.0
    with torch.no_grad():
        for name, ids in cases.items():
            embeds = model.get_input_embeddings()(torch.tensor([ids]), out_dtype=torch.float32)
            out, _ = model(None, None, embeds=embeds, dtype=torch.float32)
            want = outputs[f"hidden.{name}"]
            err = ((out - want).abs().max() / want.abs().max()).item()
            worst = max(worst, err)
            assert err < 1e-5, (name, err)
    print(f"ComfyUI's T5 agrees with transformers' (max relative error {worst:.2e})")


def buckets_fixture() -> None:
    positions = torch.arange(-300, 301)
    buckets = T5Attention._relative_position_bucket(
        positions, bidirectional=True, num_buckets=32, max_distance=128
    )
    data = {"relative_positions": positions.tolist(), "buckets": buckets.tolist()}
    (OUT / "buckets.json").write_text(json.dumps(data) + "\n")


def tokenizer_fixture() -> None:
    comfy = Tokenizer.from_file(str(COMFY_TOKENIZER / "tokenizer.json"))
    bundled = Tokenizer.from_str(gzip.decompress(BUNDLED.read_bytes()).decode("utf-8"))
    assert json.loads(bundled.to_str()) == json.loads(comfy.to_str()), "the bundled tokenizer is not ComfyUI's"
    hf = T5TokenizerFast.from_pretrained(str(COMFY_TOKENIZER))
    cases = []
    for prompt in PROMPTS:
        full = comfy.encode(prompt).ids
        assert full[-1] == 1, (prompt, full)
        assert bundled.encode(prompt).ids == full, prompt
        case = {"prompt": prompt, "ids": full[:-1]}
        theirs = hf(prompt)["input_ids"]
        if theirs != full:
            assert any(token in prompt for token in ADDED), (prompt, theirs, full)
            case["transformers5"] = theirs[:-1]
        cases.append(case)
    assert cases[0]["ids"] == [], cases[0]
    lines = ",\n".join(" " + json.dumps(case, ensure_ascii=False) for case in cases)
    (OUT / "tokenizer_ids.json").write_text("[\n" + lines + "\n]\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer_fixture()
    buckets_fixture()
    model_fixture()


if __name__ == "__main__":
    main()
