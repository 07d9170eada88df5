"""Fixtures for Kiln's CLIP text encoder and its bundled tokenizer (engine/models/tests/fixtures/clip_text/).

Run from the repository root:  COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/clip_text.py
COMFYUI_DIR names the ComfyUI checkout (comfyui.py): its `comfy/sd1_tokenizer` folder is loaded with transformers,
and the tiny model is also run through ComfyUI's own `comfy.clip_model.CLIPTextModel` and checked against
transformers' (nothing of ComfyUI is written to the fixtures).

Writes:
- weights.safetensors: a tiny transformers `CLIPTextModel` with the real structure (hidden 128, 2 heads of the real
  width 64, MLP 256 with quick-GELU, 3 layers, LayerNorm eps 1e-5, 77 positions, vocab 1000 with BOS 998 and EOS 999
  so that the pooled vector is taken at the first EOS), random weights seeded, stored as bf16 under ComfyUI's
  `clip_l.safetensors` names (`text_model.*`, plus an unused `text_projection.weight`).
- outputs.safetensors: for each case, `last.<name>` = `last_hidden_state` [1, 77, 128], `pooled.<name>` =
  `pooler_output` [1, 128] and `hidden.<name>.<k>` = `hidden_states[k + 1]` (the output of layer k, before the
  final LayerNorm) [1, 77, 128], all f32, computed in f32 from the bf16-rounded weights with eager attention.
- cases.json: the cases' token ids (BOS, words, EOS, EOS padding to 77).
- tokenizer_ids.json: for a set of prompts, the ids transformers' `CLIPTokenizer` gives when loaded from ComfyUI's
  `comfy/sd1_tokenizer` folder (as ComfyUI's SDTokenizer loads it; no ComfyUI code imported), without the BOS and
  EOS it adds (`tokenizer(text)["input_ids"][1:-1]`, what SDTokenizer keeps of each piece of a prompt).

Also asserts that the vocabulary built from the bundled merges (engine/models/data/clip-tokenizer/merges.txt.gz)
the way OpenAI's CLIP builds it equals that folder's vocab.json, and that the merges equal its merges.txt.

Independent references only (transformers, and optionally ComfyUI itself); no Kiln code.
"""

import gzip
import json
import os
import pathlib
import sys

import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/clip_text"
MERGES = ROOT / "engine/models/data/clip-tokenizer/merges.txt.gz"

# The default workflow's prompts (ComfyUI_frontend defaultGraph.ts, nodes 67 and 71), as qwen3.py has them.
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
    # CLIP-specific: case, contractions, numbers, runs of spaces, accents, emoji, newlines, special tokens.
    "A PHOTO OF A CAT, UPPER Case MiXeD",
    "it's what we'll do, they're here, I've, I'm, he'd, don't, IT'S, WE'LL",
    "'s 'll ''quoted'' `back` rock'n'roll o'clock",
    "1girl, 2boys, 1024x768, 8k uhd, 4.5 stars, 100%, $9.99, 3rd",
    "many     spaces   between      words",
    "résumé, crème brûlée, Ångström, Øresund, ß, İstanbul, ǅ, ﬁne",
    "emoji: 😀😃 👍🏽 🇯🇵 ❤️ and text",
    "line one\nline two\n\nline four\r\nend",
    "<|startoftext|>a<|endoftext|>b <|STARTOFTEXT|> <|EndOfText|>",
    "punctuation!!! ??? ... --- ;;; ::: (((nested))) [[brackets]] {braces} <angle>",
    "masterpiece, best quality, highres, detailed background, cinematic lighting",
    "a\u00a0non-breaking space, a\u2003em space, zero\u200bwidth",
    "control \x01 char and \x7f delete",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "日本語 中文 한국어 Ελληνικά Русский العربية עברית हिन्दी",
]


def bytes_to_unicode() -> dict:
    """OpenAI CLIP's map from byte values to printable characters (re-derived from its description)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def bundled_merges() -> list:
    text = gzip.decompress(MERGES.read_bytes()).decode("utf-8")
    lines = text.split("\n")
    assert lines[0].startswith("#version"), lines[0]
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    assert all(len(m) == 2 for m in merges)
    return merges


def vocab_from_merges(merges: list) -> dict:
    """The vocabulary as OpenAI's CLIP `SimpleTokenizer` builds it: the 256 byte characters, the same with `</w>`,
    one entry per merge, then the two special tokens."""
    chars = list(bytes_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return {token: i for i, token in enumerate(vocab)}


def tokenizer_fixture() -> None:
    directory = os.environ.get("COMFYUI_DIR")
    if not directory:
        sys.exit("set COMFYUI_DIR to a ComfyUI checkout at 0f1fa67a")
    comfy_tokenizer = pathlib.Path(directory) / "comfy/sd1_tokenizer"
    merges = bundled_merges()
    vocab = vocab_from_merges(merges)
    comfy_vocab = json.loads((comfy_tokenizer / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == comfy_vocab, "the vocabulary built from the bundled merges differs from ComfyUI's vocab.json"
    comfy_merges = (comfy_tokenizer / "merges.txt").read_bytes()
    assert gzip.decompress(MERGES.read_bytes()) == comfy_merges, "the bundled merges differ from ComfyUI's"

    tok = CLIPTokenizer.from_pretrained(str(comfy_tokenizer))
    assert tok("")["input_ids"] == [49406, 49407]
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        assert ids[0] == 49406 and ids[-1] == 49407, (prompt, ids)
        cases.append({"prompt": prompt, "ids": ids[1:-1]})
    assert cases[1]["ids"] == [320, 1125, 539, 320, 2368], cases[1]
    lines = ",\n".join(" " + json.dumps(case, ensure_ascii=False) for case in cases)
    (OUT / "tokenizer_ids.json").write_text("[\n" + lines + "\n]\n", encoding="utf-8")


VOCAB = 1000
BOS = 998
EOS = 999
POSITIONS = 77


def comfy_name(name: str) -> str:
    return name if name.startswith("text_model.") else "text_model." + name


def padded(words: list) -> list:
    ids = [BOS] + words + [EOS]
    return ids + [EOS] * (POSITIONS - len(ids))


def comfyui_check(model: CLIPTextModel, config: CLIPTextConfig, cases: dict, outputs: dict) -> None:
    """Runs the same weights through ComfyUI's CLIPTextModel and asserts it agrees with transformers."""
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(ROOT / "scripts/reference"))
    from comfyui import import_comfyui

    import_comfyui()
    import comfy.clip_model
    import comfy.ops

    comfy_config = {
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "eos_token_id": config.eos_token_id,
    }
    comfy_model = comfy.clip_model.CLIPTextModel(comfy_config, torch.float32, "cpu", comfy.ops.manual_cast)
    # ComfyUI's embedding table is built with its fixed default vocabulary size; the tiny one is swapped in.
    comfy_model.text_model.embeddings.token_embedding = comfy.ops.manual_cast.Embedding(
        VOCAB, config.hidden_size, dtype=torch.float32
    )
    state = {comfy_name(k): v for k, v in model.state_dict().items() if v.is_floating_point()}
    missing, unexpected = comfy_model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert missing == ["text_projection.weight"], missing
    with torch.no_grad():
        for name, ids in cases.items():
            for k in range(config.num_hidden_layers):
                last, hidden, _, pooled = comfy_model(
                    torch.tensor([ids]),
                    intermediate_output=k,
                    final_layer_norm_intermediate=False,
                    num_tokens=[ids.index(EOS) + 1],
                )
                for what, got in (("last", last), ("pooled", pooled), (f"hidden.{k}", hidden)):
                    key = f"{what.split('.')[0]}.{name}" + (f".{k}" if what.startswith("hidden") else "")
                    want = outputs[key]
                    err = (got - want).abs().max().item() / want.abs().max().item()
                    assert err < 1e-5, (name, what, err)
    print("ComfyUI's CLIPTextModel agrees with transformers'")


def model_fixture() -> None:
    torch.manual_seed(0)
    config = CLIPTextConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=2,
        max_position_embeddings=POSITIONS,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=1,
        projection_dim=128,
        attn_implementation="eager",
    )
    model = CLIPTextModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith(".weight"):
                # Norm weights away from 1 so a norm applied with the wrong weight (or not at all) shows.
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif "embedding" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            # Kiln reads the bf16 file and widens exactly: compute from the same values.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    # transformers names them from the text tower down (`embeddings.…`); ComfyUI's file has `text_model.` first.
    state = {comfy_name(k): v for k, v in model.state_dict().items() if v.is_floating_point()}
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    # ComfyUI's clip_l.safetensors carries the projection Flux does not use.
    weights["text_projection.weight"] = (torch.randn(128, 128) / 128**0.5).to(torch.bfloat16)
    save_file(weights, OUT / "weights.safetensors")

    gen = torch.Generator().manual_seed(1)
    words = lambda n: torch.randint(0, BOS, (n,), generator=gen).tolist()  # noqa: E731
    cases = {
        "short": padded(words(5)),
        "long": padded(words(50)),
        "full": padded(words(POSITIONS - 2)),
        "empty": padded([]),
    }
    outputs = {}
    with torch.no_grad():
        for name, ids in cases.items():
            assert len(ids) == POSITIONS
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            assert len(out.hidden_states) == config.num_hidden_layers + 1
            outputs[f"last.{name}"] = out.last_hidden_state.to(torch.float32).contiguous()
            outputs[f"pooled.{name}"] = out.pooler_output.to(torch.float32).contiguous()
            # The pooled vector is the final-normed state at the first EOS.
            first_eos = ids.index(EOS)
            assert torch.equal(out.pooler_output[0], out.last_hidden_state[0, first_eos])
            for k in range(config.num_hidden_layers):
                outputs[f"hidden.{name}.{k}"] = out.hidden_states[k + 1].to(torch.float32).contiguous()
    save_file(outputs, OUT / "outputs.safetensors")
    (OUT / "cases.json").write_text(json.dumps(cases) + "\n")
    comfyui_check(model, config, cases, outputs)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer_fixture()
    model_fixture()


if __name__ == "__main__":
    main()
