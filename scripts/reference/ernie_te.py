"""Fixtures for ERNIE-Image's text encoder and prompt enhancer (engine/models/tests/fixtures/ernie_te/): ComfyUI's
CLIPLoader on a Ministral 3 3B file, its CLIPTextEncode conditioning and its TextGenerate, on a tiny random
Ministral 3 3B.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a):
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/ernie_te.py
It takes a few seconds and is reproducible (seeded weights; TextGenerate's sampling is seeded as the node seeds it).

ComfyUI code this relies on (0f1fa67a; ernie.py is comfy/text_encoders/ernie.py, llama.py
comfy/text_encoders/llama.py, flux.py comfy/text_encoders/flux.py, sd1.py comfy/sd1_clip.py, nt.py
comfy_extras/nodes_textgen.py):
- comfy/sd.py detect_te_model: a Llama-shaped file (`model.layers.0.post_attention_layernorm.weight`, no q norm)
  3072 wide is MINISTRAL_3_3B (5120 is Mistral Small; any other width LLAMA3_8), loaded whatever the CLIPLoader
  type (the templates say `flux2`) as ernie.te / ernie.ErnieTokenizer with the file's `tekken_model` as the
  tokenizer. The tiny file is 32 wide, so the script answers MINISTRAL_3_3B while it loads (recorded) and gives
  llama.py's Ministral3_3BConfig the tiny widths; everything else is ComfyUI's path.
- ernie.py: Ministral3_3BModel = SDClipModel(layer "hidden", layer_idx -2, special_tokens start 1 / pad 0,
  layer_norm_hidden_state False, attention masks on): the output of the second-to-last layer (Llama2_'s
  intermediate output at index num_layers - 2), not final-normed. ErnieTokenizer: flux.py's Mistral3Tokenizer
  (start token 1, no end token, min_length 1, pad 11 on the left, weights disabled), no template: [1] + the
  prompt's ids (the special tokens it writes, like `<s>` and `[INST]`, become their ids).
- llama.py Ministral3_3BConfig: head_dim 128, rms eps 1e-5, RoPE theta 1e6 (no scaling read), SiLU MLP, tied head
  (lm_head False), stop token 2. Ministral3_3B is a BaseGenerate: nt.py TextGenerate runs clip.generate on it
  (sd1.py SDClipModel.generate: 1-D positions) and decodes with clip.decode (special tokens skipped).

Tiny model: vocabulary 1512 (the `tekken_model` of engine/models/tests/fixtures/mistral3/weights.safetensors: the
real Tekken vocabulary's first 512 ranks after the 1000 special tokens), hidden 32, intermediate 64, 4 layers,
2 heads of 128 over 1 key/value head; seeded random weights stored as f32 under the released names (the special
tokens' embedding rows scaled by 0.05, so generation picks regular tokens that decode to text).

Writes engine/models/tests/fixtures/ernie_te/:
- weights.safetensors: the tiny file (with `tekken_model`).
- io.safetensors: `cond.<case>` f32 [1, n, 32], the conditioning ComfyUI's CLIPTextEncode gives;
  `logits.<case>` f32 [steps, 1512], each TextGenerate step's logits.
- cases.json: per conditioning case the prompt and ComfyUI's ids; per generation case the widgets, the prompt
  ids, the generated ids and the decoded text.
"""

import dataclasses
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
OUT = os.path.join(ROOT, "engine/models/tests/fixtures/ernie_te")
TEKKEN_FROM = os.path.join(ROOT, "engine/models/tests/fixtures/mistral3/weights.safetensors")
SEED = 4077
TINY = dict(vocab_size=1512, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=1)
PROMPTS = {
    "empty": "",
    "plain": "A close-up portrait of a red fox in a snowy forest, golden hour",
    "weights": "weights (masterpiece:1.2), \\(escaped\\) parens",
    "specials": "<s>[SYSTEM_PROMPT]be brief[/SYSTEM_PROMPT][INST]a cat[/INST]",
    # `<unk>` is the encoder's pad (id 0): ComfyUI's mask hides it and everything after it.
    "written_unk": "before <unk> after",
}
# TextGenerate widgets: prompt, max_length, sampling_mode (with its settings).
GENERATE = {
    "greedy": ("<s>[SYSTEM_PROMPT]Expand the prompt.[/SYSTEM_PROMPT][INST]a red fox[/INST]", 10,
               {"sampling_mode": "off"}),
    "sampled": ("<s>[SYSTEM_PROMPT]Expand the prompt.[/SYSTEM_PROMPT][INST]a red fox[/INST]", 10,
                {"sampling_mode": "on", "temperature": 0.6, "top_k": 64, "top_p": 0.8, "min_p": 0.05,
                 "repetition_penalty": 1.05, "seed": 0}),
    "sampled_seed7": ("a lighthouse at dusk", 8,
                      {"sampling_mode": "on", "temperature": 4.0, "top_k": 50, "top_p": 0.95, "min_p": 0.0,
                       "repetition_penalty": 1.0, "seed": 7}),
}


def weights(tekken):
    g = torch.Generator().manual_seed(SEED)
    h, f, v, layers = TINY["hidden_size"], TINY["intermediate_size"], TINY["vocab_size"], TINY["num_hidden_layers"]
    q, kv = TINY["num_attention_heads"] * 128, TINY["num_key_value_heads"] * 128

    def rand(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    # The special tokens' rows (ids below 1000) small, so the tied head favours the regular tokens, which decode
    # to text.
    table = rand(v, h, scale=1.0)
    table[:1000] *= 0.05
    out = {"model.embed_tokens.weight": table,
           "model.norm.weight": 1.0 + rand(h, scale=0.2)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = 1.0 + rand(h, scale=0.2)
        out[p + "post_attention_layernorm.weight"] = 1.0 + rand(h, scale=0.2)
        out[p + "self_attn.q_proj.weight"] = rand(q, h, scale=h ** -0.5)
        out[p + "self_attn.k_proj.weight"] = rand(kv, h, scale=h ** -0.5)
        out[p + "self_attn.v_proj.weight"] = rand(kv, h, scale=h ** -0.5)
        out[p + "self_attn.o_proj.weight"] = rand(h, q, scale=q ** -0.5)
        out[p + "mlp.gate_proj.weight"] = rand(f, h, scale=h ** -0.5)
        out[p + "mlp.up_proj.weight"] = rand(f, h, scale=h ** -0.5)
        out[p + "mlp.down_proj.weight"] = rand(h, f, scale=f ** -0.5)
    out["tekken_model"] = tekken.clone()
    return out


class Node:
    """Wraps a CLIP for TextGenerate: records the tokens, the generated ids and the decoded text."""

    def __init__(self, clip):
        self.clip, self.calls = clip, {}

    def tokenize(self, text, **kw):
        tokens = self.clip.tokenize(text, **kw)
        self.calls["tokenize"] = tokens
        return tokens

    def generate(self, tokens, **kw):
        ids = self.clip.generate(tokens, **kw)
        self.calls["generate"] = ids
        return ids

    def decode(self, ids, **kw):
        return self.clip.decode(ids, **kw)


def ids_of(tokens):
    (key,) = tokens
    (section,) = tokens[key]
    return [int(t[0]) for t in section]


def main():
    import_comfyui(node_modules=True)
    import comfy.sd
    import comfy.text_encoders.ernie as ernie
    import comfy.text_encoders.llama as llama
    import comfy_extras.nodes_textgen as nt

    os.makedirs(OUT, exist_ok=True)
    tekken = load_file(TEKKEN_FROM)["tekken_model"]
    sd = weights(tekken)
    save_file(sd, f"{OUT}/weights.safetensors")

    # The tiny widths for ComfyUI's Ministral config, and the detection answer the tiny width cannot give.
    fields = [(k, type(v), dataclasses.field(default=v)) for k, v in TINY.items()]
    llama.Ministral3_3BConfig = dataclasses.make_dataclass("TinyMinistral", fields, bases=(llama.Ministral3_3BConfig,))
    real_detect = comfy.sd.detect_te_model
    detected = []

    def detect(state):
        detected.append(str(real_detect(state)))
        return comfy.sd.TEModel.MINISTRAL_3_3B

    comfy.sd.detect_te_model = detect
    clip = comfy.sd.load_text_encoder_state_dicts([dict(sd)], embedding_directory=[],
                                                  clip_type=comfy.sd.CLIPType.FLUX2)
    comfy.sd.detect_te_model = real_detect
    assert isinstance(clip.tokenizer, ernie.ErnieTokenizer), type(clip.tokenizer)
    te = clip.cond_stage_model
    assert isinstance(te, ernie.ErnieTEModel)
    q = te.ministral3_3b
    tr = q.transformer
    assert tr.model.config.rope_theta == 1e6 and tr.model.config.rms_norm_eps == 1e-5 and not tr.model.config.lm_head
    assert list(tr.model.config.stop_tokens) == [2]
    have = tr.state_dict()
    for k, v in sd.items():
        if k != "tekken_model":
            assert torch.equal(have[k].float(), v), k

    io, cases, gens = {}, {}, {}
    with torch.no_grad():
        for name, prompt in PROMPTS.items():
            tokens = clip.tokenize(prompt)
            cond = clip.encode_from_tokens_scheduled(tokens)
            ((c, extra),) = cond
            io[f"cond.{name}"] = c.float().contiguous()
            mask = extra.get("attention_mask")
            cases[name] = {"prompt": prompt, "ids": ids_of(tokens), "shape": list(c.shape),
                           "attention_mask": None if mask is None else mask[0].tolist()}
            print(f"{name}: ids {cases[name]['ids']}, cond {list(c.shape)}, mask {cases[name]['attention_mask']}")

        for name, (prompt, max_length, mode) in GENERATE.items():
            node = Node(clip)
            logits = []
            orig = tr.logits

            def spy(x):
                out = orig(x)
                logits.append(out.float()[0, -1].clone())
                return out

            tr.logits = spy
            try:
                out = nt.TextGenerate.execute(node, prompt, max_length, dict(mode))
            finally:
                del tr.logits
            ids = ids_of(node.calls["tokenize"])
            generated = [int(t) for t in node.calls["generate"]]
            io[f"logits.{name}"] = torch.stack(logits).contiguous()
            gens[name] = {"prompt": prompt, "max_length": max_length, "sampling": mode, "ids": ids,
                          "generated": generated, "text": out.result[0]}
            print(f"{name}: ids {ids}, generated {generated} = {out.result[0]!r}")

    save_file(io, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({"seed": SEED, "config": TINY, "detected_as": detected, "cases": cases, "generate": gens}, f,
                  indent=1, ensure_ascii=False)
        f.write("\n")
    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        print(f"  {name:20} {size:9d} bytes  sha256 {hashlib.sha256(open(f'{OUT}/{name}', 'rb').read()).hexdigest()[:16]}")
    assert total < 2_000_000, total


if __name__ == "__main__":
    main()
