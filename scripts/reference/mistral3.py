"""Fixtures for FLUX.2 dev's text encoder (engine/models/tests/fixtures/mistral3/): Mistral Small 3.x run over
ComfyUI's FLUX.2 template, hidden states 10, 20 and 30 concatenated per token, and its Tekken tokenizer rebuilt
from the JSON a weight file carries as the uint8 tensor `tekken_model`.

Run from the repository root:  COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/mistral3.py

Needs, besides requirements.txt (pip install --no-deps into the reference venv):
  mistral_common==1.13.1 tiktoken==0.14.0 pydantic-extra-types==2.11.1 pycountry==26.2.16 jsonschema==4.26.0
  attrs==26.1.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1

Writes:
- tekken.json.gz: the real Tekken vocabulary as FLUX.2 dev's file embeds it (Mistral Small 3.1's tokenizer, v7):
  mistral_common's `data/tekken_240911.json` (Apache-2.0, Mistral AI; the same 150000 ranked byte strings) with
  the ranks ComfyUI never reads (>= default_vocab_size - default_num_special_tokens = 130072) and the image
  config dropped, version set to v7 and the v7 special tokens written out (mistral_common's
  `Tekkenizer.DEPRECATED_SPECIAL_TOKENS`, ranks 0-19, then `<SPECIAL_20>` ... `<SPECIAL_999>`), as the v7
  file lists them. gzip -9.
- tokenizer_ids.json: for each prompt, `ids` = ComfyUI's own `Flux2Tokenizer` (comfy/text_encoders/flux.py on
  bpe_tokenizer.from_tekken_json) on that JSON: BOS 1, then the FLUX.2 template tokenised as one string.
  `mistral_common` = mistral_common's Tekkenizer on the same JSON, [1, 17] + encode(system) + [18, 3] +
  encode(prompt) + [4] (it reads no special tokens from text): where it differs from ComfyUI's (ComfyUI splits with
  the Llama-3 regex, digits in groups of 3, not the JSON's own pattern), ComfyUI's ids are the truth and the
  entry says `"agrees": false`.
- weights.safetensors: a tiny transformers `MistralModel`, 31 layers (taps 10, 20, 30 inside the stack, none the
  last layer's, which transformers final-norms), hidden 16, MLP 32, 2 query heads over 1 key/value head of width
  128 (ComfyUI's fixed head width), eps 1e-5, theta 1e9, vocab 1512; random seeded weights stored as bf16 under
  the released names (`model.*`), plus `tekken_model`: a small tekken JSON of the same schema (the real
  vocabulary's first 512 ranks, the 1000 special tokens, default_vocab_size 1512).
- hidden.safetensors: for each case `hidden.<name>` = [hidden_states[10] | hidden_states[20] |
  hidden_states[30]] [1, N, 48] f32, computed in f32 from the bf16-rounded weights with eager attention and
  ComfyUI's attention mask (the ids before the first pad id 0 are attended to: `special_tokens={"start": 1,
  "pad": 0}`).
- cases.json: per case the ids (ComfyUI's tokeniser on the small JSON for the templated cases), `attended`.

Independent references: transformers (the model), mistral_common (the vocabulary and a second tokenisation).
ComfyUI's tokenizer is imported from COMFYUI_DIR to record its ids (nothing of it is copied).
"""

import base64
import gzip
import json
import pathlib
import sys

import torch
from safetensors.torch import save_file
from transformers import MistralConfig, MistralModel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import comfyui  # noqa: E402
import qwen3 as q3  # noqa: E402  (the shared prompts)

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/mistral3"

TAPS = [10, 20, 30]
LAYERS = 31
SMALL_REGULAR = 512
SYSTEM = (
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation."
)

# ComfyUI tokenises the text after a whitespace-preceded `embedding:` as a word of its own (and drops the
# `embedding:<name>` when no such file is in its embeddings folder); Kiln keeps it as text, so those prompts are
# left out (the same caveat as its Qwen3 tokenizer).
PROMPTS = [p for p in q3.PROMPTS if "embedding:" not in p] + [
    "weights (masterpiece:1.2), \\(escaped\\) parens, \\\\(double\\\\) stay",
    "numbers 7 42 123 4567 89012 and 2024-12-31",
    "CamelCaseWords and HTTPServer and iPhone",
    "contractions: I'M, you'RE, they'll, WE'VE, it's",
    "[INST] written specials [/INST] and <s> and <unk> and [SYSTEM_PROMPT]",
    "punctuation!!! ... ??? --- ***\n\n\nnew paragraphs\n \n",
    "A close-up portrait of a red fox in a snowy forest, golden hour, 85mm lens, shallow depth of field",
]


def deprecated_specials() -> list[dict]:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    specials = [
        {"rank": t["rank"], "token_str": str(t["token_str"]), "is_control": True}
        for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS
    ]
    specials += [
        {"rank": i, "token_str": f"<SPECIAL_{i}>", "is_control": True} for i in range(len(specials), 1000)
    ]
    return specials


def tekken_json(regular: int | None) -> bytes:
    import mistral_common

    src = pathlib.Path(mistral_common.__file__).parent / "data/tekken_240911.json"
    data = json.loads(src.read_text())
    config = data["config"]
    specials = config["default_num_special_tokens"]
    keep = config["default_vocab_size"] - specials if regular is None else regular
    vocab = [w for w in data["vocab"] if w["rank"] < keep]
    assert [w["rank"] for w in vocab] == list(range(keep))
    assert all(len(base64.b64decode(w["token_bytes"])) == 1 for w in vocab[:256])
    config = dict(config, version="v7", num_vocab_tokens=keep, default_vocab_size=keep + specials)
    out = {"config": config, "vocab": vocab, "special_tokens": deprecated_specials()}
    return json.dumps(out, separators=(",", ":")).encode()


def comfy_tokenizer(data: bytes):
    comfyui.import_comfyui()
    import comfy.text_encoders.flux as flux

    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return flux.Flux2Tokenizer(tokenizer_data={"tekken_model": tensor})


def comfy_ids(tok, prompt: str) -> list[int]:
    out = tok.tokenize_with_weights(prompt)["mistral3_24b"]
    assert len(out) == 1
    return [t for t, _ in out[0]]


def tokenizer_fixture(data: bytes) -> None:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = OUT / "tekken.json"
    path.write_bytes(data)
    reference = Tekkenizer.from_file(str(path))
    path.unlink()
    tok = comfy_tokenizer(data)
    cases = []
    for prompt in PROMPTS:
        ids = comfy_ids(tok, prompt)
        text = q3.unescape_parentheses(prompt)
        other = [1, 17] + reference.encode(SYSTEM, bos=False, eos=False) + [18, 3]
        other += reference.encode(text, bos=False, eos=False) + [4]
        cases.append({"prompt": prompt, "ids": ids, "agrees": ids == other, "mistral_common": other})
    empty = cases[0]["ids"]
    assert empty[:2] == [1, 17] and empty[-3:] == [18, 3, 4], empty
    assert cases[0]["agrees"], "the template alone tokenises the same in ComfyUI and mistral_common"
    lines = ",\n".join(" " + json.dumps(case, ensure_ascii=False) for case in cases)
    (OUT / "tokenizer_ids.json").write_text("[\n" + lines + "\n]\n")
    print("prompts where mistral_common differs from ComfyUI:", [c["prompt"] for c in cases if not c["agrees"]])
    with open(OUT / "tekken.json.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(data)


def comfy_mask(n: int, keep: int) -> torch.Tensor:
    """ComfyUI's additive mask [1, 1, n, n] (f32): finfo.min / 4 on masked keys and above the diagonal, summed."""
    low = torch.finfo(torch.float32).min / 4
    keys = torch.tensor([1.0] * keep + [0.0] * (n - keep))
    mask = (1.0 - keys).reshape(1, 1, 1, n).expand(1, 1, n, n).clone()
    mask = mask.masked_fill(mask.to(torch.bool), low)
    causal = torch.empty(n, n).fill_(low).triu_(1)
    return mask + causal


def attended(ids: list[int]) -> int:
    """How many leading ids ComfyUI's mask keeps: those before the first pad id 0 (never the first, BOS)."""
    return ids.index(0, 1) if 0 in ids[1:] else len(ids)


def model_fixture(small: bytes) -> None:
    vocab = 1000 + SMALL_REGULAR
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=1e9,
        sliding_window=None,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = MistralModel(config).eval()
    rope = getattr(model.rotary_emb, "inv_freq")
    want = 1.0 / (1e9 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    assert torch.allclose(rope, want), "theta 1e9 reached the rotary embedding"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name == "embed_tokens.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    weights = {"model." + k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    weights["tekken_model"] = torch.frombuffer(bytearray(small), dtype=torch.uint8).clone()
    save_file(weights, OUT / "weights.safetensors")

    tok = comfy_tokenizer(small)
    gen = torch.Generator().manual_seed(1)
    real = {
        "template": comfy_ids(tok, "a photo of a cat"),
        # `<unk>` (id 0, ComfyUI's pad for this encoder) written in the prompt masks from there on.
        "written_unk": comfy_ids(tok, "before <unk> after"),
        "random": [1] + torch.randint(1, vocab, (39,), generator=gen).tolist(),
    }
    assert max(max(ids) for ids in real.values()) < vocab
    cases = {}
    outputs = {}
    with torch.no_grad():
        for name, ids in real.items():
            keep = attended(ids)
            x = torch.tensor([ids])
            out = model(input_ids=x, attention_mask=comfy_mask(len(ids), keep), output_hidden_states=True)
            assert len(out.hidden_states) == LAYERS + 1
            both = torch.cat([out.hidden_states[t] for t in TAPS], dim=-1).to(torch.float32).contiguous()
            outputs[f"hidden.{name}"] = both
            cases[name] = {"ids": ids, "attended": keep}
    assert cases["written_unk"]["attended"] < len(cases["written_unk"]["ids"])
    assert cases["template"]["attended"] == len(cases["template"]["ids"])
    save_file(outputs, OUT / "hidden.safetensors")
    (OUT / "cases.json").write_text(json.dumps(cases) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer_fixture(tekken_json(None))
    model_fixture(tekken_json(SMALL_REGULAR))


if __name__ == "__main__":
    main()
