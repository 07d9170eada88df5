"""Fixtures for PixelDiT's text encoder (engine/models/tests/fixtures/pixeldit_te/): ComfyUI's CLIPLoader with type
`pixeldit` on a Gemma 2 2B file, its CLIPTextEncode conditioning, on the tiny random Gemma 2 of
engine/models/tests/fixtures/lumina2/te.safetensors (read, not rewritten; written by lumina2.py, whose tiny config
this script imports), loaded by ComfyUI's own loader.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a):
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/pixeldit_te.py
It takes a few seconds and is reproducible.

ComfyUI code this relies on (0f1fa67a; px.py is comfy/text_encoders/pixeldit.py, sd1.py comfy/sd1_clip.py):
- comfy/sd.py: a GEMMA_2_2B file with CLIPType.PIXELDIT -> px.pixeldit_te / px.PixelDiTGemma2Tokenizer (the
  SentencePiece model from the file's `spiece_model`).
- px.py PixelDiTGemma2Tokenizer.tokenize_with_weights: a prompt that is empty or whitespace -> the empty prompt
  with min_length 300 (`<bos>` then 299 pads 0); else the prompt after _PIXELDIT_CHI_PROMPT (unless it already
  starts with its first words), weights disabled, padded with 0 on the right to min_length = (the CHI prompt's
  token count, `<bos>` included) + 298, then cut to that length.
- PixelDiTGemma2_2BModel: layer "last" (the last layer through the final norm), start 2 / pad 0, attention masks
  (keys from the first pad on are masked; the pads' rows are computed and kept). PixelDiTGemma2TE: when the
  states are longer than 300, `<bos>`'s row and the last 299 rows; the same cut of the attention mask.

Writes engine/models/tests/fixtures/pixeldit_te/:
- io.safetensors: `cond.<case>` f32 [1, n, 32] (n <= 300), the conditioning ComfyUI's CLIPTextEncode gives.
- cases.json: per case the prompt, ComfyUI's ids (before the cut), the conditioning's shape and attention mask.
"""

import hashlib
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "../..")
OUT = os.path.join(ROOT, "engine/models/tests/fixtures/pixeldit_te")
WEIGHTS = os.path.join(ROOT, "engine/models/tests/fixtures/lumina2/te.safetensors")
PROMPTS = {
    "empty": "",
    "blank": "   \n ",
    "plain": "A close-up portrait of a red fox in a snowy forest, golden hour",
    "weights": "weights (masterpiece:1.2), \\(escaped\\) parens",
    "own_chi": 'Given a user prompt, generate an "Enhanced prompt" for: a cat',
    "end_of_turn": "a cat<end_of_turn>a dog",
}


def ids_of(tokens):
    (key,) = tokens
    (section,) = tokens[key]
    return [int(t[0]) for t in section]


def main():
    import_comfyui(node_modules=True)
    import comfy.sd
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.pixeldit as px
    import lumina2 as l2

    os.makedirs(OUT, exist_ok=True)
    sd = load_file(WEIGHTS)
    assert comfy.sd.detect_te_model(sd) == comfy.sd.TEModel.GEMMA_2_2B
    real = llama.Gemma2_2B_Config
    llama.Gemma2_2B_Config = l2.tiny_config_class(llama)
    try:
        clip = comfy.sd.load_text_encoder_state_dicts([dict(sd)], clip_type=comfy.sd.CLIPType.PIXELDIT)
    finally:
        llama.Gemma2_2B_Config = real
    assert isinstance(clip.tokenizer, px.PixelDiTGemma2Tokenizer), type(clip.tokenizer)
    assert isinstance(clip.cond_stage_model, px.PixelDiTGemma2TE)
    chi = len(clip.tokenizer.gemma2_2b.tokenizer(px._PIXELDIT_CHI_PROMPT)["input_ids"])
    print(f"CHI prompt: {chi} ids with <bos>; min_length {chi + px._PIXELDIT_MAX_LENGTH - 2}")

    io, cases = {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = clip.tokenize(prompt)
            ((c, extra),) = clip.encode_from_tokens_scheduled(tokens)
            io[f"cond.{name}"] = c.float().contiguous()
            mask = extra.get("attention_mask")
            cases[name] = {"prompt": prompt, "ids": ids_of(tokens), "shape": list(c.shape),
                           "attention_mask": None if mask is None else [int(v) for v in mask[0].tolist()]}
            print(f"{name}: {len(cases[name]['ids'])} ids, cond {list(c.shape)}")

    save_file(io, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({"weights": "engine/models/tests/fixtures/lumina2/te.safetensors",
                   "weights_sha256": hashlib.sha256(open(WEIGHTS, "rb").read()).hexdigest(),
                   "chi_prompt_ids": chi, "max_length": px._PIXELDIT_MAX_LENGTH, "cases": cases}, f, indent=None,
                  ensure_ascii=False)
        f.write("\n")
    for name in sorted(os.listdir(OUT)):
        print(f"  {name:20} {os.path.getsize(f'{OUT}/{name}'):9d} bytes")


if __name__ == "__main__":
    main()
