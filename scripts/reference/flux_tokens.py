"""Fixtures for Kiln's FLUX.1 prompt weighting and token layout (engine/models/tests/fixtures/flux_tokens/).

Run from the repository root:  COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/flux_tokens.py

Imports ComfyUI itself (comfyui.py; the checkout COMFYUI_DIR names, at the commit Kiln matches), constructs its
`comfy.text_encoders.flux.FluxTokenizer` with an empty temporary `embedding_directory` (so `embedding:name` is
looked up and not found, as for a user without the file) and calls `tokenize_with_weights(prompt)` for each
prompt below: CLIP-L's sections (BOS, weighted tokens, EOS, EOS padding to 77 per section; words of 8 or more
tokens split across sections, shorter ones moved whole) and T5-XXL's (one section, EOS, padded with 0 to 256).

Writes cases.json: {"comfyui": the checkout's commit (its version when not a git checkout), "transformers": the version that produced it,
"cases": [{"prompt", "l": [[[id, weight], ...], ...], "t5xxl": [[[id, weight], ...]]}, ...]}; a non-finite
weight (from `(w:-inf)`) is written as the string Python's repr gives ("-inf"), JSON having no infinities.

Produced with transformers 5.24.0 (ComfyUI's tokenizers are transformers' `CLIPTokenizer` and `T5TokenizerFast`
loaded from its `sd1_tokenizer` and `t5_tokenizer` folders; transformers 5 builds T5's pre-tokenizer itself, which
differs from 4.x only after a written added token such as `</s>` or `<pad>`, and no prompt here writes one of T5's).
The version actually used is recorded in the file.

ComfyUI is called, never copied; nothing of Kiln is imported.
"""

import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/flux_tokens"

# The default workflow's prompts (ComfyUI_frontend defaultGraph.ts, nodes 67 and 71), as in qwen3.py.
POSITIVE = (
    "anime RPG game style, cute anime girl with gigantic fennec ears and a big fluffy fox tail with long wavy "
    "blonde hair and large blue eyes blonde colored eyelashes wearing a pink sweater a large oversized gold "
    "trimmed black winter coat and a long blue maxi skirt and a red scarf, she is sitting beside a campfire in "
    "the wilderness at night playing guitar with a milky way galaxy sky"
)
NEGATIVE = "low quality, bad anatomy, extra digits, missing digits, extra limbs, missing limbs"

# The default workflow's POSITIVE is one CLIP section (under 75 tokens); this one of about 250 words makes
# several CLIP sections, T5 past 256 tokens; a weighted group and punctuation in the middle.
WORDS = (
    "a quiet harbour town at dawn with fishing boats resting on calm water, gulls circling over the old stone "
    "pier, warm light on painted wooden houses, nets drying on railings, a lighthouse on the far cliff"
).split()
LONG = " ".join(WORDS[i % len(WORDS)] for i in range(120)) + (
    ", (soft golden mist over the rooftops:1.3), " + " ".join(WORDS[(7 * i) % len(WORDS)] for i in range(125))
)

LONG_GROUP = "(a very long weighted phrase that has more than eight tokens in it:1.2) tail"
# "cat" is one token in both tokenizers; after BOS and 69 of them the weighted group starts at CLIP position 70,
# so it straddles position 75 (the last before the first section's EOS) and, having 8 or more tokens, is split.
STRADDLE = "cat " * 69 + LONG_GROUP
# A short (under 8 tokens) weighted group starting at position 74 that would end past 75: moved whole to the
# second section.
STRADDLE_SHORT = "cat " * 73 + "(red sports car:1.4) tail"
# Exactly filling the first section (75 tokens, then one more).
FILL_75 = "cat " * 74 + "(dog:0.8)"
FILL_76 = "cat " * 75 + "(dog:0.8)"
# T5: 255 tokens + EOS is exactly 256 (no padding); one more goes past it.
T5_255 = " ".join(["cat"] * 255)
T5_256 = " ".join(["cat"] * 256)

PROMPTS = [
    "",
    "a photo of a cat",
    "a (red:1.5) car",
    "((nested)) and (single) and (x:0.5) and (y:abc)",
    "unclosed (paren and stray ) close",
    "\\(literal\\) parens",
    "weights (masterpiece:1.2), \\(escaped\\) parens, \\\\(double\\\\) and embedding:foo stay",
    "embedding:foo a cat",
    "a cat embedding:foo,<x> b",
    "a cat embedding:foo",
    "a\tembedding:bar\nafter the newline (and embedding:baz[tail]:1.3)",
    POSITIVE,
    NEGATIVE,
    LONG,
    LONG_GROUP,
    STRADDLE,
    STRADDLE_SHORT,
    FILL_75,
    FILL_76,
    T5_255,
    T5_256,
    "(猫:１.５)",
    "(x:1_0)",
    "(x: 2 ) (y:1e-1) (z:.5) (w:-inf) (v:1_.5)",
    "(outer (inner:0.5) outer) ((a (b) c))",
    "line one\nline two\n\n  multiple    spaces   between  words  ",
    "\n\n  both ends with spaces  \n\n",
    "tabs\tand\r\nwindows line ends\r\n",
    "   ",
    "Hello, World! It's 2026; the year's 1st test... isn't it?",
    "一只可爱的猫坐在窗台上，阳光明媚。日本語のテキストも。한국어 문장.",
    "emoji 🐱🚀👩‍👩‍👧 and ✨ sparkles ✨",
    "Café naïve façade — NFC: e\u0301 vs \u00e9",
    "digits 1234567890 and 3.14159 and 10,000,000",
    "special tokens in text <|im_end|> and <|endoftext|>",
]


def sections(out):
    """ComfyUI's [[(id, weight), ...], ...] as JSON lists; ids must be ints (no embedding tensors here)."""
    result = []
    for section in out:
        row = []
        for token, weight in section:
            assert isinstance(token, int), f"not an id: {token!r}"
            weight = float(weight)
            # JSON has no infinities: a non-finite weight is written as Python's repr, a string ("-inf").
            row.append([token, weight if math.isfinite(weight) else repr(weight)])
        result.append(row)
    return result


def comfyui_version(directory):
    """The checkout's commit when it is a git checkout, else its `comfyui_version.py` version."""
    try:
        return subprocess.run(
            ["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        import comfyui_version

        return comfyui_version.__version__


def check_layout(cases):
    """The boundary cases exercise what they are meant to."""
    by = {c["prompt"]: c for c in cases}
    s = by[STRADDLE]["l"]
    assert len(s) == 2 and s[0][75][1] == 1.2 and s[0][76][1] == 1.0 and s[1][1][1] == 1.2, "straddle"
    s = by[STRADDLE_SHORT]["l"]
    assert len(s) == 2 and s[0][73][1] == 1.0 and s[1][1][1] == 1.4, "short straddle"
    assert len(by[FILL_75]["l"]) == 1 and len(by[FILL_76]["l"]) == 2, "fill"
    assert len(by[T5_255]["t5xxl"][0]) == 256 and len(by[T5_256]["t5xxl"][0]) == 257, "t5 length"
    assert len(by[LONG]["l"]) >= 3 and len(by[LONG]["t5xxl"][0]) > 256, "long"


def main() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from comfyui import import_comfyui

    import_comfyui()
    import comfy.text_encoders.flux
    import transformers

    embeddings = tempfile.mkdtemp(prefix="flux_tokens_embeddings_")
    assert os.listdir(embeddings) == []
    tokenizer = comfy.text_encoders.flux.FluxTokenizer(embedding_directory=embeddings)

    cases = []
    for prompt in PROMPTS:
        out = tokenizer.tokenize_with_weights(prompt)
        assert set(out) == {"l", "t5xxl"}
        cases.append({"prompt": prompt, "l": sections(out["l"]), "t5xxl": sections(out["t5xxl"])})
    check_layout(cases)
    os.rmdir(embeddings)

    OUT.mkdir(parents=True, exist_ok=True)
    document = {
        "comfyui": comfyui_version(os.environ["COMFYUI_DIR"]),
        "transformers": transformers.__version__,
        "cases": cases,
    }
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    (OUT / "cases.json").write_text(text + "\n", encoding="utf-8")
    print(f"{len(cases)} prompts -> {OUT / 'cases.json'} (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
