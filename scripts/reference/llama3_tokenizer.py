"""Fixtures for Kiln's Llama 3 tokenizer and HiDream's llama prompt layout (engine/models/tests/fixtures/llama3/).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/llama3_tokenizer.py
(needs `tiktoken` in the venv, `pip install tiktoken` (0.14.0 was used), and ComfyUI's import pins listed in
comfy_sampling.py).

ComfyUI 0f1fa67a is the reference: comfy/text_encoders/hidream.py `HiDreamTokenizer`, whose llama part is
hunyuan_video.py's `LLAMA3Tokenizer(min_length=128, pad_token=128009)`, an `SDTokenizer` (sd1_clip.py) with a start
token and no end token, `max_length` 99999999 and no padding to it. Its tokenizer class is ComfyUI's own pure-Python
byte-level BPE (bpe_tokenizer.py `LlamaTokenizerFast`, not transformers'), reading
comfy/text_encoders/llama_tokenizer/tokenizer.json: the vocabulary, the merges ("a b" strings), the added tokens,
the split regex (which must be Llama 3's) and the start token of its TemplateProcessing post-processor. It never
reads `ignore_merges`: every pre-token is merged pair by pair, even one that is a whole vocabulary entry.

That tokenizer.json is not in the ComfyUI snapshot Kiln matches against; this script writes it there (an input of
the reference, never committed) when it is missing, and checks it when it is present:
- the vocabulary and merges come from transformers' own tiktoken conversion (`TikTokenConverter`, Llama 3's split
  regex) of Meta's rank file, the gzip Kiln bundles (engine/models/data/llama3-tokenizer/tokenizer.model.gz, from
  llama-models 0.3.0; ids = ranks 0..127999, merges = every split of a token into two tokens, by the token's rank,
  then the halves' ranks);
- the added tokens are the 259 that ComfyUI's llama_tokenizer/tokenizer_config.json lists, in id order: 128000..
  128255 with Llama 3.0's names (`<|reserved_special_token_4|>` at 128008 where Meta's Llama 3.1 tokenizer.py has
  `<|eom_id|>`), then `<unk>`, `<image>` and `<pad>` (128256..128258; the file is llava-llama-3's);
- the post-processor puts `<|begin_of_text|>` first, the decoder is byte-level; written as transformers writes it,
  merges in the legacy "a b" form ComfyUI parses.
Written this way the file is 8 197 990 characters, the length of ComfyUI's own llama_tokenizer/tokenizer.json (as
GitHub's comfyanonymous/ComfyUI has it at 9434853a), and the stretches of the two compared by hand (the added
tokens, the end of the vocabulary and start of the merges, characters 6 000 000 on, the end) are identical.

Cross-checks, each asserted: ComfyUI's ids for every vocabulary entry's text equal those of the `tokenizers`
package's BPE built from the same file with `ignore_merges` off (the library Kiln uses); they equal `tiktoken`'s
(Meta's regex and ranks) except for the entries merging cannot reach (588: " việc", " nhiều", "ektedir", ...),
which tiktoken, looking a whole pre-token up first, gives as one id and ComfyUI as several. Every other entry whose
bytes are UTF-8 is its own single id.

Writes tokens.json: {"comfyui": version, "tiktoken": version, "tokenizer_json_sha256": of the file above,
"cases": [{"name", "prompt", "llama": [[[id, weight], ...]]} (+ "t5xxl", "clip_l", "clip_g" for two prompts:
HiDreamTokenizer's "t5xxl", "l" and "g" outputs)], "word_ids": [{"text", "comfyui", "tiktoken"}] (ComfyUI's
tokenizer call without its start token, and tiktoken's `encode` with every special token allowed),
"unreachable": [[text, ComfyUI's ids], ...] for the vocabulary entries above; every other UTF-8 entry's text is
its own id to all three}.
ComfyUI's `HiDreamTokenizer` gets an empty temporary embeddings folder, as a user without the file has.

ComfyUI is called, never copied; nothing of Kiln is imported.
"""

import gzip
import hashlib
import json
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/llama3"
RANKS_GZ = ROOT / "engine/models/data/llama3-tokenizer/tokenizer.model.gz"

# Meta's Llama 3 split regex (llama_models/llama3/tokenizer.py `pat_str`), which ComfyUI requires verbatim.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)

LONG = (
    "anime RPG game style, cute anime girl with gigantic fennec ears and a big fluffy fox tail with long wavy "
    "blonde hair and large blue eyes blonde colored eyelashes wearing a pink sweater a large oversized gold "
    "trimmed black winter coat and a long blue maxi skirt and a red scarf, she is sitting beside a campfire in "
    "the wilderness at night playing guitar with a milky way galaxy sky, (soft golden mist:1.2) over the old "
    "stone pier, warm light on painted wooden houses, nets drying on railings, a lighthouse on the far cliff, "
    "gulls circling over fishing boats resting on calm water at dawn, a quiet harbour town waking up, smoke "
    "rising from chimneys, children running along the beach with a red kite, waves breaking softly on the sand"
)

PROMPTS = [
    ("plain", "a photo of a cat sitting on a windowsill"),
    ("empty", ""),
    ("weights", "a (tiger:1.3) in (the snow:0.8)"),
    ("nested", "((masterpiece)), (best (quality:1.2)), simple (unclosed"),
    ("escaped", "\\(literal\\) parens and \\(not a weight:1.5\\)"),
    ("unicode", "一只可爱的猫 🐱🚀👩‍👩‍👧 Café naïve — việc nhiều điều, ایران"),
    ("digits", "12345 and 3.14159 and 1,000,000"),
    ("newlines", "line one\nline two\n\n  indented\r\nend\n"),
    ("long", LONG),
    ("eot_written", "a cat<|eot_id|> after the end <|begin_of_text|>"),
    ("other_specials", "<|eom_id|> <|reserved_special_token_4|> <|python_tag|> <image>"),
    ("spaces", "a   cat    with  many     spaces   "),
    ("contractions", "It's a tiger's eye, isn't it? THEY'LL"),
    ("embedding", "a cat embedding:foo b"),
]
# The prompts whose CLIP-L, CLIP-G and T5-XXL tokens are recorded too.
ALL_ENCODERS = ("plain", "weights")

WORDS = [
    "a photo of a cat",
    " hello world",
    "12345",
    "Hello, World! It's",
    "  multiple   spaces\n\n",
    "🐱🚀",
    "一只可爱的猫",
    "a cat<|eot_id|>",
    " việc",
]


def comfyui_version(directory):
    """Its `comfyui_version.py` version (the snapshot is not a git checkout)."""
    sys.path.insert(0, directory)
    import comfyui_version

    return comfyui_version.__version__


def rank_file():
    """Meta's rank file, inflated into a temporary file (tiktoken and transformers read a path)."""
    handle = tempfile.NamedTemporaryFile(suffix=".model", delete=False)
    handle.write(gzip.decompress(RANKS_GZ.read_bytes()))
    handle.close()
    return handle.name


def build_tokenizer_json(ranks_path, comfyui):
    """ComfyUI's llama_tokenizer/tokenizer.json as text, rebuilt (see the module docstring)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    config_path = pathlib.Path(comfyui) / "comfy/text_encoders/llama_tokenizer/tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    added = sorted((int(i), entry["content"]) for i, entry in config["added_tokens_decoder"].items())
    assert [i for i, _ in added] == list(range(128000, 128259)), "ComfyUI's added tokens are 128000..128258"
    converter = TikTokenConverter(vocab_file=ranks_path, pattern=PATTERN, extra_special_tokens=[t for _, t in added])
    document = json.loads(converter.converted().to_str())
    assert document["model"]["ignore_merges"] is True
    assert [(t["id"], t["content"]) for t in document["added_tokens"]] == added
    document["model"]["merges"] = [f"{left} {right}" for left, right in document["model"]["merges"]]
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    document["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            bos,
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {
            "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}
        },
    }
    document["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return json.dumps(document, indent=2, ensure_ascii=False)


def install_tokenizer_json(text, comfyui):
    """Writes the file into the ComfyUI checkout when missing; refuses a different one."""
    path = pathlib.Path(comfyui) / "comfy/text_encoders/llama_tokenizer/tokenizer.json"
    if path.exists():
        assert path.read_text(encoding="utf-8") == text, f"{path} differs from the rebuilt file"
    else:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    assert len(text) == 8_197_990, len(text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tiktoken_encoding(ranks_path):
    """Meta's Llama 3 encoding as llama_models/llama3/tokenizer.py builds it (its 3.1 special-token names)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(ranks_path)
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
             "<|eot_id|>", "<|python_tag|>", "<|image|>"]
    named += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]
    specials = {token: len(ranks) + i for i, token in enumerate(named)}
    return tiktoken.Encoding(name="llama3", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials), ranks


def sections(out):
    """ComfyUI's [[(id, weight), ...], ...] as JSON lists of ints and floats."""
    rows = []
    for section in out:
        row = []
        for token, weight in section:
            assert isinstance(token, int), f"not an id: {token!r}"
            row.append([token, float(weight)])
        rows.append(row)
    return rows


def check_vocabulary(comfy_bpe, encoding, ranks, tokenizer_json):
    """Every vocabulary entry's text (the 126 648 that are UTF-8) through ComfyUI's tokenizer, the `tokenizers`
    package's BPE without `ignore_merges` and tiktoken, which gives each its own id; returns [text, ComfyUI's ids]
    for the entries ComfyUI splits."""
    from tokenizers import Tokenizer

    document = json.loads(tokenizer_json)
    document["model"]["ignore_merges"] = False
    document["post_processor"] = None
    library = Tokenizer.from_str(json.dumps(document))
    unreachable, texts = [], 0
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            continue
        texts += 1
        ids = comfy_bpe(text)["input_ids"][1:]
        assert library.encode(text, add_special_tokens=False).ids == ids, (rank, text)
        assert encoding.encode(text) == [rank], (rank, text)
        if ids != [rank]:
            unreachable.append([text, ids])
    print(f"{texts} vocabulary texts, {len(unreachable)} of them ComfyUI merges into several ids")
    assert texts == 126_648
    return unreachable


def main() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from comfyui import import_comfyui

    import_comfyui()
    comfyui = os.environ["COMFYUI_DIR"]
    ranks_path = rank_file()
    text = build_tokenizer_json(ranks_path, comfyui)
    sha = install_tokenizer_json(text, comfyui)

    import comfy.text_encoders.hidream as hidream
    import tiktoken

    encoding, ranks = tiktoken_encoding(ranks_path)
    os.unlink(ranks_path)
    assert len(ranks) == 128_000

    embeddings = tempfile.mkdtemp(prefix="llama3_tokens_embeddings_")
    tokenizer = hidream.HiDreamTokenizer(embedding_directory=embeddings)
    comfy_bpe = tokenizer.llama.tokenizer

    cases = []
    for name, prompt in PROMPTS:
        out = tokenizer.tokenize_with_weights(prompt)
        assert set(out) == {"g", "l", "t5xxl", "llama"}
        case = {"name": name, "prompt": prompt, "llama": sections(out["llama"])}
        if name in ALL_ENCODERS:
            case.update(t5xxl=sections(out["t5xxl"]), clip_l=sections(out["l"]), clip_g=sections(out["g"]))
        cases.append(case)
        print(name, [len(s) for s in case["llama"]])
    os.rmdir(embeddings)
    by = {c["name"]: c["llama"] for c in cases}
    assert len(by["long"]) == 1 and len(by["long"][0]) > 128, "a long prompt is one section, unpadded"
    assert by["empty"] == [[[128000, 1.0]] + [[128009, 1.0]] * 127], "an empty prompt is BOS and 127 pads"

    words = []
    for text_ in WORDS:
        comfy_ids = comfy_bpe(text_)["input_ids"]
        assert comfy_ids[0] == 128000
        tiktoken_ids = encoding.encode(text_, allowed_special="all")
        words.append({"text": text_, "comfyui": comfy_ids[1:], "tiktoken": tiktoken_ids})
    # " việc" is one vocabulary entry that merging cannot reach: tiktoken's one id, ComfyUI's three.
    assert all((w["comfyui"] == w["tiktoken"]) == (w["text"] != " việc") for w in words)

    unreachable = check_vocabulary(comfy_bpe, encoding, ranks, text)

    OUT.mkdir(parents=True, exist_ok=True)
    document = {
        "comfyui": comfyui_version(comfyui),
        "tiktoken": tiktoken.__version__,
        "tokenizer_json_sha256": sha,
        "cases": cases,
        "word_ids": words,
        "unreachable": unreachable,
    }
    out = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    (OUT / "tokens.json").write_text(out + "\n", encoding="utf-8")
    print(f"{len(cases)} prompts, {len(words)} words, {len(unreachable)} unreachable -> {OUT / 'tokens.json'}")


if __name__ == "__main__":
    main()
