"""Fixtures for Kiln's Qwen3 text encoder and its bundled tokenizer (engine/models/tests/fixtures/qwen3/).

Run from the repository root:  $(scripts/reference/setup.sh) scripts/reference/qwen3.py

Writes:
- weights.safetensors: a tiny transformers `Qwen3Model` with the real structure (hidden 64, MLP 128, 3 layers,
  4 query / 2 key-value heads of width 16, eps 1e-6, theta 1e6, vocab 1024), random weights seeded, stored as
  bf16 under the HF names (`model.embed_tokens.weight`, `model.layers.*`, `model.norm.weight`).
- hidden.safetensors: for each case, `hidden.<name>` = `hidden_states[-2]` (the output of layer index 1, no final
  norm) [1, N, 64] f32, computed in f32 from the bf16-rounded weights with eager attention.
- cases.json: the cases' synthetic token ids (< 1024).
- tokenizer_ids.json: for a set of prompts, the ids of the python `tokenizers` library on the bundled
  tokenizer.json (`encode`, no special tokens added) and of the Z-Image template around the prompt after
  ComfyUI's weights-disabled pre-pass (`\\(` and `\\)` lose the backslash) — `zimage`; the latter checked
  against transformers' `Qwen2Tokenizer` built from the vocabulary and merges (the class ComfyUI uses).

Independent references only (transformers, tokenizers); no ComfyUI code.
"""

import gzip
import json
import pathlib

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3Model

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/qwen3"
TOKENIZER = ROOT / "engine/models/data/qwen3-tokenizer/tokenizer.json.gz"

# The default workflow's prompts (ComfyUI_frontend defaultGraph.ts, nodes 67 and 71).
POSITIVE = (
    "anime RPG game style, cute anime girl with gigantic fennec ears and a big fluffy fox tail with long wavy "
    "blonde hair and large blue eyes blonde colored eyelashes wearing a pink sweater a large oversized gold "
    "trimmed black winter coat and a long blue maxi skirt and a red scarf, she is sitting beside a campfire in "
    "the wilderness at night playing guitar with a milky way galaxy sky"
)
NEGATIVE = "low quality, bad anatomy, extra digits, missing digits, extra limbs, missing limbs"

PROMPTS = [
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
]


def unescape_parentheses(prompt: str) -> str:
    """ComfyUI's weighting pre-pass with weights disabled, re-derived: escaped parentheses lose the backslash."""
    return (
        prompt.replace("\\)", "\0\1")
        .replace("\\(", "\0\2")
        .replace("\0\1", ")")
        .replace("\0\2", "(")
    )


def zimage_text(prompt: str) -> str:
    return "<|im_start|>user\n" + unescape_parentheses(prompt) + "<|im_end|>\n<|im_start|>assistant\n"


def transformers_tokenizer(data: dict) -> Qwen2Tokenizer:
    """transformers' Qwen2Tokenizer (the class ComfyUI uses) built from the vocabulary and merges alone, with the
    added tokens registered as special: a second implementation to cross-check the ids with."""
    model = data["model"]
    tok = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m) for m in model["merges"]],
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tok.add_special_tokens({"additional_special_tokens": [a["content"] for a in data["added_tokens"][1:]]})
    return tok


def tokenizer_fixture() -> None:
    data = gzip.decompress(TOKENIZER.read_bytes()).decode("utf-8")
    tok = Tokenizer.from_str(data)
    check = transformers_tokenizer(json.loads(data))
    cases = []
    for prompt in PROMPTS:
        cases.append(
            {
                "prompt": prompt,
                "encode": tok.encode(prompt, add_special_tokens=False).ids,
                "zimage": tok.encode(zimage_text(prompt), add_special_tokens=False).ids,
            }
        )
    for case in cases:
        ids = check(zimage_text(case["prompt"]))["input_ids"]
        assert ids == case["zimage"], (case["prompt"], ids)
    empty = cases[0]["zimage"]
    assert empty == [151644, 872, 198, 151645, 198, 151644, 77091, 198], empty
    lines = ",\n".join(" " + json.dumps(case, ensure_ascii=False) for case in cases)
    (OUT / "tokenizer_ids.json").write_text("[\n" + lines + "\n]\n")


def model_fixture() -> None:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen3Model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # Norm weights away from 1 so a norm applied with the wrong weight (or not at all) shows.
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name == "embed_tokens.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            # Kiln reads the bf16 file and widens exactly: compute from the same values.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    weights = {"model." + k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, OUT / "weights.safetensors")

    gen = torch.Generator().manual_seed(1)
    cases = {
        "len1": [7],
        "len7": torch.randint(0, 1024, (7,), generator=gen).tolist(),
        "len40": torch.randint(0, 1024, (40,), generator=gen).tolist(),
    }
    outputs = {}
    with torch.no_grad():
        for name, ids in cases.items():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            assert len(out.hidden_states) == config.num_hidden_layers + 1
            outputs[f"hidden.{name}"] = out.hidden_states[-2].to(torch.float32).contiguous()
    save_file(outputs, OUT / "hidden.safetensors")
    (OUT / "cases.json").write_text(json.dumps(cases) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer_fixture()
    model_fixture()


if __name__ == "__main__":
    main()
