"""Records ComfyUI's own text generation (`TextGenerate`: `BaseGenerate.generate` and `sample_token` of
comfy/text_encoders/llama.py) on the tiny Qwen3 of engine/models/tests/fixtures/qwen3/weights.safetensors, the
reference Kiln's generation tests compare with: engine/models/tests/fixtures/qwen3/generate.json.

The reference is ComfyUI itself at the commit Kiln matches (0f1fa67a), imported from a checkout outside the
repository (COMFYUI_DIR; see comfyui.py and comfy_sampling.py for the extra pins). The tiny model is ComfyUI's
`Llama2_` with Qwen3-4B's configuration class at the fixture's widths (hidden 64, MLP 128, 3 layers, 4/2 heads of
width 16, vocab 1024), its weights the fixture's bf16 ones, run as ComfyUI runs Qwen3-4B on the CPU: f32
activations (`manual_cast` ops), all layers, the final norm, the tied embedding as the output head, a key/value
cache. The vocabulary has no stop token, so every case generates `max_length` tokens.

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/qwen3_generate.py

Writes, per case: the prompt ids, the settings, ComfyUI's generated ids and the first step's logits; and the
decode cases: ids and the text `tokenizers` decodes them to with special tokens skipped (ComfyUI's decode).
"""

import gzip
import json
import os
import pathlib
import sys

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui()
import comfy.ops  # noqa: E402
from comfy.text_encoders import llama  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "engine/models/tests/fixtures/qwen3"
TOKENIZER = ROOT / "engine/models/data/qwen3-tokenizer/tokenizer.json.gz"


class TinyQwen3(llama.BaseLlama, llama.BaseQwen3, llama.BaseGenerate, torch.nn.Module):
    """ComfyUI's Qwen3_4B at the fixture's widths (its config class fixes head_dim, so it is set here)."""

    def __init__(self):
        super().__init__()
        config = llama.Qwen3_4BConfig(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        config.head_dim = 16
        self.num_layers = config.num_hidden_layers
        self.model = llama.Llama2_(config, device="cpu", dtype=torch.bfloat16, ops=comfy.ops.manual_cast)
        self.dtype = torch.bfloat16


def model():
    m = TinyQwen3()
    weights = load_file(FIXTURES / "weights.safetensors")
    missing, unexpected = m.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    assert not missing, missing
    return m.eval()


CASES = [
    # name, prompt ids, max_length, sampling (None: greedy)
    ("greedy", [11, 500, 7, 999, 42], 12, None),
    ("greedy_one_token_prompt", [3], 6, None),
    (
        "template_defaults",
        [11, 500, 7, 999, 42],
        12,
        dict(temperature=0.7, top_k=64, top_p=0.95, min_p=0.05, repetition_penalty=1.05, seed=0,
             presence_penalty=0.0),
    ),
    # The random model's tied head favours repeating the last token by far; high temperatures flatten the
    # distribution so that the generator, top-k, min-p and top-p all decide.
    (
        "flat_template_filters",
        [11, 500, 7, 999, 42],
        16,
        dict(temperature=8.0, top_k=64, top_p=0.95, min_p=0.05, repetition_penalty=1.05, seed=0,
             presence_penalty=0.0),
    ),
    (
        "flat_no_top_k",
        [200, 201, 202],
        12,
        dict(temperature=10.0, top_k=0, top_p=0.9, min_p=0.0, repetition_penalty=1.0, seed=2**32 + 9,
             presence_penalty=0.5),
    ),
    (
        "flat_everything_kept",
        [9, 8, 7],
        12,
        dict(temperature=12.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=77,
             presence_penalty=0.0),
    ),
    (
        "penalties",
        [5, 6, 7, 8],
        16,
        dict(temperature=4.0, top_k=20, top_p=1.0, min_p=0.1, repetition_penalty=1.5, seed=1234,
             presence_penalty=1.0),
    ),
]

DECODE = [
    [9707, 151645, 151643, 151667, 151668, 198],
    [151667, 198, 9707, 151668, 271, 9707, 151645],
    [14990, 11, 1879, 0, 220, 99, 151700],
]


def main():
    m = model()
    out = {"cases": [], "decode": []}
    for name, ids, max_length, sampling in CASES:
        with torch.no_grad():
            embeds = m.model.embed_tokens(torch.tensor([ids]), out_dtype=torch.float32)
            first_logits = {}
            original = m.logits

            def logits(x, original=original, first_logits=first_logits):
                result = original(x)
                first_logits.setdefault("value", result.float()[0, -1].tolist())
                return result

            m.logits = logits
            settings = sampling or {}
            generated = m.generate(
                embeds,
                do_sample=sampling is not None,
                max_length=max_length,
                temperature=settings.get("temperature", 1.0),
                top_k=settings.get("top_k", 50),
                top_p=settings.get("top_p", 1.0),
                min_p=settings.get("min_p", 0.0),
                repetition_penalty=settings.get("repetition_penalty", 1.0),
                seed=settings.get("seed"),
                presence_penalty=settings.get("presence_penalty", 0.0),
            )
            m.logits = original
        out["cases"].append(
            {
                "name": name,
                "prompt": ids,
                "max_length": max_length,
                "sampling": sampling,
                "generated": generated,
                "first_logits": first_logits["value"],
            }
        )
    tokenizer = Tokenizer.from_str(gzip.decompress(TOKENIZER.read_bytes()).decode())
    for ids in DECODE:
        out["decode"].append({"ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True)})
    (FIXTURES / "generate.json").write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", FIXTURES / "generate.json")


if __name__ == "__main__":
    main()
