"""Fixtures for text generation with images on a generic Qwen3-VL encoder (engine/models/tests/fixtures/
qwen3vl_generate/): ComfyUI's TextGenerate node, greedy, on CLIPLoader type `ideogram4` with a Qwen3-VL-4B file,
which falls to comfy/sd.py's generic Qwen3-VL branch; the model is the tiny random Qwen3-VL of
engine/models/tests/fixtures/qwen3vl_te_images/qwen3vl.safetensors (read, not rewritten; written by
qwen3vl_te_images.py, whose loading helpers this script imports), loaded by ComfyUI's own loader.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a):
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/qwen3vl_generate.py
It takes well under a minute on the CPU and is reproducible (the images come from a seeded generator; decoding is
greedy).

ComfyUI code this relies on (0f1fa67a; nt.py is comfy_extras/nodes_textgen.py, q3vl.py
comfy/text_encoders/qwen3vl.py, llama.py comfy/text_encoders/llama.py, qvl.py qwen_vl.py, sd1.py comfy/sd1_clip.py):
- comfy/sd.py: CLIPType.IDEOGRAM4 with QWEN3VL_4B takes the generic branch (only IDEOGRAM4 with QWEN3VL_8B has its
  own): q3vl.te / q3vl.tokenizer(model_type="qwen3vl_4b"). The tiny file's merger has 16 rows, not 2560, so
  detect_te_model calls it QWEN3VL_8B (which, with type ideogram4, would take Ideogram 4's own 8B branch); the
  script maps that answer to QWEN3VL_4B while it loads, as qwen3vl_te_images.py does for krea2 and mage (the one
  departure from ComfyUI's loading path). Qwen3VL_4BConfig: lm_head False (the tied token table is the head),
  stop tokens 151643 and 151645.
- nt.py TextGenerate.execute(clip, prompt, max_length, sampling_mode, image=None, thinking=False,
  use_default_template=True, video=None, audio=None): clip.tokenize(prompt, image=image,
  skip_template=not use_default_template, min_length=1, thinking=thinking, video=None, audio=None); sampling_mode
  {"sampling_mode": "off"} gives do_sample False (temperature 1.0, top_k 50, top_p 1.0, min_p 0, repetition 1.0,
  presence 0, seed None: unused); clip.generate(...); clip.decode(ids) (skip_special_tokens=True).
- q3vl.py Qwen3VLTokenizer: the IMAGE batch is split into one image per <|image_pad|> (a batch of two = two
  images of one size); the template "<|im_start|>user\\n{vision blocks}{prompt}<|im_end|>\\n<|im_start|>assistant
  \\n" (one vision block per image, none without images) followed, when thinking is False, by
  "<think>\\n\\n</think>\\n\\n"; with skip_template (use_default_template False, or a prompt starting with
  <|im_start|>) the prompt is used as written, no think block either way, and images go only to written
  <|image_pad|> slots (none written: the image is silently unused). Qwen3VL.preprocess_embed:
  process_qwen2vl_images (qvl.py) with its defaults (min_pixels 3136, max_pixels 12845056, bilinear) and patch 16,
  mean / std 0.5; the tower with DeepStack.
- q3vl.py Qwen3VLClipModel.generate: process_tokens, build_image_inputs (qvl.py qwen2vl_mrope_position_ids: a
  [3, n] T/H/W position table, text sequential, an image's block at (start, start + row, start + column), the text
  after it from start + max(grid_h, grid_w) / 2; the DeepStack mask and features), then llama.py
  BaseGenerate.generate: execution dtype f32 on the CPU (should_use_bf16 is False there; bf16 on most GPUs), a KV
  cache of n + max_length, step 0 = the prefill of the whole prompt with those 3-D positions and DeepStack (no
  attention mask), later steps one token each at position ids [[p]] (p = max of the table's last column + 1, then
  +1 per step: a [1, 1] table, plain 1-D RoPE, i.e. T = H = W = p); without images the positions are None (1-D
  arange, then the cache length). Logits: BaseQwen3.logits, the final-normed last position times the token
  table; greedy = torch.argmax (the first index of the maximum). Stops after a stop token or max_length tokens.

- JoyImage (CLIPLoader type `joyimage` on the same file, detect_te_model's QWEN3VL_8B as it stands): joyimage.py's
  _JoyImageClipModel has no generate of its own, so TextGenerate runs sd1.py SDClipModel.generate: process_tokens
  (the image tokens spliced in by Qwen3VL8B_JoyImage.preprocess_embed: bicubic, min_pixels 65536, max_pixels
  16777216) and BaseGenerate.generate with no position ids and no DeepStack (1-D arange positions, the image
  tokens inline as text would be). Its tokenizer always tokenizes as thinking (no <think> block), JoyImage's
  template. Asserted from the recorded forward calls. Its Qwen3-VL 8B config has an untied head (lm_head), which the
  tiny file lacks: the script sets it to the tiled token table (what Kiln's head is for a file without one).

Tiny model (the file's, see qwen3vl_te_images.py; released values in brackets): the language model hidden 16
[2560], intermediate 32, 36 layers [36], 2 heads [32] of head_dim 128 over 1 kv head [8], theta 5e6, M-RoPE [24,
20, 20] interleaved, tied head; the tower hidden 128 [1024] in 16 heads, intermediate 32, depth 2 [24], DeepStack
after blocks [0, 1] [5, 11, 17], position table 8 x 8 [48 x 48], patch 16, temporal 2, merge 2; the token table's
1000 stored rows tiled to 151936. So the logits repeat with period 1000 (checked bit for bit over all 151936),
argmax always lands below 1000, the stop tokens are never produced, and every case generates max_length tokens.

Writes engine/models/tests/fixtures/qwen3vl_generate/:
- io.safetensors: `input.<X>` f32 [b, H, W, 3] (the node's IMAGE input); `<case>.copy.<j>` f32 [1, h, w, 3]:
  process_qwen2vl_images' resized copy of image j (before the normalisation); `<case>.logits` f32 [steps, 1000]:
  row s = the logits of step s (row 0 the prefill's last position, row 1 the second step), entries 0..999 of the
  151936 (the rest repeat them); `<case>.position_ids` f32 [3, n]: the prefill's M-RoPE table (image cases).
- `joy.<case>.logits`: the same for the JoyImage cases (`joy_cases` in cases.json; the resized copies are not
  stored, their grids are: the logits check the vision path).
- cases.json: per case the widget values, the images, the prompt ids ComfyUI built (151655 where an image sits,
  `image_positions` its indices), the number of positions after splicing, the grids, the decode position ids, the
  generated ids, the decoded text, per-step top-1 / top-2 margins and their minimum; tokenizer-only cases.

Cross-checks: the KV-cached generation equals a cache-free greedy loop through ComfyUI's own Llama2_ (the whole
sequence re-run each step with the decode positions appended) bit for bit in the chosen ids and to rounding in the
logits (asserted); transformers' Qwen3VLForConditionalGeneration with the same weights, the 1000-row table and ids
mod 1000, same ids and logits (report only).
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
OUT = os.path.join(HERE, "../../engine/models/tests/fixtures/qwen3vl_generate")
WEIGHTS = os.path.join(HERE, "../../engine/models/tests/fixtures/qwen3vl_te_images/qwen3vl.safetensors")
WEIGHTS_REL = "engine/models/tests/fixtures/qwen3vl_te_images/qwen3vl.safetensors"
SEED = 6144
BUDGET = 5_000_000
IMAGE_PAD = 151655
ROWS, VOCAB = 1000, 151936
MAX_LENGTH = 12
MIN_MARGIN = 1e-3
# The node's IMAGE inputs [b, H, W]: A one 96 x 128 image (kept 96 x 128, grid 6 x 8: 12 positions); P a batch of
# two 72 x 104 images (each resized to 64 x 96, grid 4 x 6: 6 positions).
INPUTS = {"A": (1, 96, 128), "P": (2, 72, 104)}
GREEDY = {"sampling_mode": "off"}
RAW_IMAGE = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n" \
            "<|im_start|>assistant\n"
# name: widget values (prompt, image input, thinking, use_default_template); max_length MAX_LENGTH, greedy.
CASES = {
    "text": dict(prompt="Describe a red fox in one sentence.", image=None, thinking=False, use_default_template=True),
    "text.thinking": dict(prompt="Describe a red fox in one sentence.", image=None, thinking=True,
                          use_default_template=True),
    "text.raw": dict(prompt="Describe a red fox in one sentence.", image=None, thinking=False,
                     use_default_template=False),
    "one": dict(prompt="Describe this image.", image="A", thinking=False, use_default_template=True),
    "one.thinking": dict(prompt="Describe this image.", image="A", thinking=True, use_default_template=True),
    "two": dict(prompt="Compare the two images.", image="P", thinking=False, use_default_template=True),
    # The template written out, with the node's template off: the image takes the written slot.
    "one.raw": dict(prompt=RAW_IMAGE, image="A", thinking=False, use_default_template=False),
    # The template off and no slot written: ComfyUI drops the image without a word and generates from the text.
    "one.raw_no_slot": dict(prompt="Describe this image.", image="A", thinking=False, use_default_template=False),
}
# Tokenizer only, as the node calls it: prompt, image input, thinking, use_default_template.
TOKEN_CASES = {
    "empty": ("", None, False, True),
    "empty.thinking": ("", None, True, True),
    "im_start_prompt": ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", None, False, True),
    "two.thinking": ("Compare the two images.", "P", True, True),
    # The template off and nothing written: min_length=1 pads one <|endoftext|>.
    "empty.raw": ("", None, False, False),
}
# JoyImage's encoder (CLIPLoader type `joyimage` on the same file, which ComfyUI calls Qwen3-VL 8B as it stands):
# TextGenerate through SDClipModel.generate, the image tokens inline (no M-RoPE grid, no DeepStack).
JOY_CASES = {
    "joy.text": dict(prompt="Describe a red fox in one sentence.", image=None),
    "joy.one": dict(prompt="Describe this image.", image="A"),
    "joy.two": dict(prompt="Compare the two images.", image="P"),
}
JOY_VISION = dict(min_pixels=65536, max_pixels=16777216, patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                  interpolation="bicubic")


def ids_of(tokens):
    (key,) = tokens
    (section,) = tokens[key]
    ids, where = [], []
    for i, t in enumerate(section):
        if isinstance(t[0], dict):
            ids.append(IMAGE_PAD)
            where.append(i)
        else:
            ids.append(int(t[0]))
    return ids, where


class Node:
    """Wraps a CLIP for TextGenerate: records the tokenize call, the generated ids and the decode."""

    def __init__(self, clip):
        self.clip, self.calls = clip, {}

    def tokenize(self, text, **kw):
        tokens = self.clip.tokenize(text, **kw)
        self.calls["tokenize"] = (text, kw, tokens)
        return tokens

    def generate(self, tokens, **kw):
        ids = self.clip.generate(tokens, **kw)
        self.calls["generate"] = (kw, ids)
        return ids

    def decode(self, ids, **kw):
        text = self.clip.decode(ids, **kw)
        self.calls["decode"] = text
        return text


class Spy:
    """Records each step's logits and the position ids / DeepStack handed to Llama2_.forward."""

    def __init__(self, transformer):
        self.tr = transformer
        self.logits, self.steps = [], []

    def __enter__(self):
        tr = self.tr
        self.orig_logits, self.orig_forward = tr.logits, tr.model.forward

        def logits(x):
            out = self.orig_logits(x)
            self.logits.append(out.float()[0, -1].clone())
            return out

        def forward(*a, **kw):
            p = kw.get("position_ids")
            self.steps.append({"seq": int(kw["embeds"].shape[1]),
                               "position_ids": None if p is None else p.clone(),
                               "deepstack": kw.get("deepstack_embeds") is not None,
                               "dtype": str(kw["embeds"].dtype)})
            return self.orig_forward(*a, **kw)

        tr.logits, tr.model.forward = logits, forward
        return self

    def __exit__(self, *exc):
        del self.tr.logits
        del self.tr.model.forward
        return False


def uncached(q, tokens, generated, steps, grid=True):
    """ComfyUI's own Llama2_ without the cache: for each step the prompt plus the tokens so far, the prefill's
    positions followed by the decode positions (as [3, n] rows T = H = W), DeepStack at the image positions (with
    `grid` False: 1-D positions and no DeepStack, as SDClipModel.generate runs); the last position's logits."""
    (key,) = tokens
    toks = [[t[0] for t in tokens[key][0]]]
    embeds, _, _, info = q.process_tokens(toks, "cpu")
    pos, vis, deep = q.transformer.build_image_inputs(embeds, info) if grid else (None, None, None)
    out = []
    for s in range(len(generated)):
        ids = torch.tensor([generated[:s]], dtype=torch.long)
        # A clone: TransformerBlock writes its output into its input (torch.add(..., out=x)).
        e = torch.cat([embeds, q.transformer.model.embed_tokens(ids, out_dtype=torch.float32)], 1) if s else \
            embeds.clone()
        kw = {}
        if pos is not None:
            extra = torch.tensor([[p[0][0] for p in (st["position_ids"].tolist() for st in steps[1:s + 1])]],
                                 dtype=pos.dtype)
            p = torch.cat([pos, extra.expand(3, -1)], 1)
            vm = torch.cat([vis, torch.zeros(1, s, dtype=torch.bool)], 1)
            kw = dict(position_ids=p, visual_pos_masks=vm, deepstack_embeds=deep)
        x, _ = q.transformer.model(None, embeds=e, **kw)
        out.append(q.transformer.logits(x)[0, -1].float())
    return out


def margins(step_logits):
    ms = []
    for lg in step_logits:
        top = torch.topk(lg[:ROWS], 2).values
        ms.append(float(top[0] - top[1]))
    return ms


def hf_check(stored, cases, io):
    """Report only: transformers' Qwen3VLForConditionalGeneration (eager, f32) on the file's 1000-row table, ids
    mod 1000, ComfyUI's patches; a cache-free greedy loop; max |diff| / max |ref| of the logits."""
    try:
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    except ImportError as e:
        print("transformers cross-check skipped:", e)
        return
    import comfy.text_encoders.qwen_vl as qwen_vl

    hf_image, hf_start, hf_end = IMAGE_PAD % ROWS, 151652 % ROWS, 151653 % ROWS
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=ROWS, hidden_size=16, intermediate_size=32, num_hidden_layers=36,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         rope_parameters={"rope_theta": 5e6, "rope_type": "default", "mrope_section": [24, 20, 20],
                                          "mrope_interleaved": True}),
        vision_config=dict(hidden_size=128, intermediate_size=32, depth=2, deepstack_visual_indexes=[0, 1],
                           num_heads=16, num_position_embeddings=64, out_hidden_size=16, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
        image_token_id=hf_image, video_token_id=997, vision_start_token_id=hf_start, vision_end_token_id=hf_end,
        attn_implementation="eager", tie_word_embeddings=True)
    model = Qwen3VLForConditionalGeneration(config).eval()
    state = {k: v for k, v in stored.items()}
    state["lm_head.weight"] = stored["model.language_model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    for name, case in cases.items():
        patches, grids = [], []
        for j in range(len(case["image_positions"])):
            p, grid = qwen_vl.process_qwen2vl_images(io[f"{name}.copy.{j}"], patch_size=16, image_mean=[0.5] * 3,
                                                     image_std=[0.5] * 3)
            patches.append(p)
            grids.append(grid)
        ids, k = [], 0
        for i, t in enumerate(case["ids"]):
            if i in case["image_positions"]:
                ids += [hf_image] * (int(grids[k][0].prod()) // 4)
                k += 1
            else:
                ids.append(t % ROWS)
        text_ids = [t % ROWS for i, t in enumerate(case["ids"]) if i not in case["image_positions"]]
        if any(t == hf_image for t in text_ids + [t % ROWS for t in case["generated"]]):
            print(f"  transformers {name}: skipped (a text id mod 1000 is the image or video id)")
            continue
        want = io[f"{name}.logits"]
        worst, same = 0.0, True
        for s, gen in enumerate(case["generated"]):
            input_ids = torch.tensor([ids + [t % ROWS for t in case["generated"][:s]]])
            kw = {}
            if grids:
                kw = dict(pixel_values=torch.cat(patches), image_grid_thw=torch.cat(grids),
                          mm_token_type_ids=(input_ids == hf_image).int())
            got = model(input_ids=input_ids, **kw).logits[0, -1].float()
            worst = max(worst, float((got - want[s]).abs().max() / want[s].abs().max()))
            same &= int(got.argmax()) == gen
        print(f"  transformers {name}: same greedy ids {same}, logits max |diff| / max |ref| {worst:.2e}")


def joy_cases(stored, inputs, io):
    """TextGenerate on JoyImage's encoder, greedy: ids, placed images' grids, generated ids and text,
    each step's logits; asserts the prefill ran with no position ids and no DeepStack."""
    import comfy.sd
    import comfy.text_encoders.joyimage as joy
    import comfy.text_encoders.qwen_vl as qwen_vl
    import comfy_extras.nodes_textgen as nt
    import qwen3vl_te_images as q3

    clip = q3.load(stored, comfy.sd.CLIPType.JOYIMAGE, False)
    assert isinstance(clip.tokenizer, joy.JoyImageTokenizer) and isinstance(clip.cond_stage_model, joy.JoyImageTEModel)
    q = clip.cond_stage_model.qwen3vl_8b
    assert isinstance(q, joy._JoyImageClipModel)
    tr = q.transformer
    # Qwen3-VL 8B has an output head of its own (lm_head True); the tiny file has none, so ComfyUI leaves it
    # unset: it is given the (tiled) token table, the head Kiln uses for a file without one.
    assert tr.model.config.lm_head
    with torch.no_grad():
        tr.model.lm_head.weight.copy_(tr.model.embed_tokens.weight)
    cases = {}
    for name, case in JOY_CASES.items():
        node = Node(clip)
        image = inputs[case["image"]] if case["image"] else None
        with Spy(tr) as spy:
            out = nt.TextGenerate.execute(node, case["prompt"], MAX_LENGTH, dict(GREEDY), image=image)
        _, kw, tokens = node.calls["tokenize"]
        _, generated = node.calls["generate"]
        ids, where = ids_of(tokens)
        assert generated == [int(lg.argmax()) for lg in spy.logits] and len(generated) == MAX_LENGTH
        ms = margins(spy.logits)
        assert min(ms) >= MIN_MARGIN, (name, ms)
        (key,) = tokens
        grids = []
        for i in where:
            data = tokens[key][0][i][0]["data"]
            _, grid = qwen_vl.process_qwen2vl_images(data, **JOY_VISION)
            grid = [int(v) for v in grid[0]]
            grids.append(grid)
        n_pos = len(ids) + sum(gr[1] * gr[2] // 4 - 1 for gr in grids)
        assert spy.steps[0]["seq"] == n_pos
        assert all(s["position_ids"] is None and not s["deepstack"] for s in spy.steps), name
        io[f"{name}.logits"] = torch.stack([lg[:ROWS] for lg in spy.logits]).contiguous()
        again = uncached(q, tokens, generated, spy.steps, grid=False)
        worst = max(float((a - b[:VOCAB]).abs().max() / b.abs().max()) for a, b in zip(again, spy.logits))
        assert [int(a.argmax()) for a in again] == generated, name
        assert worst < 1e-4, (name, worst)
        cases[name] = {"widgets": {"prompt": case["prompt"], "max_length": MAX_LENGTH, "sampling_mode": "off",
                                   "thinking": False, "use_default_template": True},
                       "image": case["image"], "image_batch": 0 if image is None else int(image.shape[0]),
                       "ids": ids, "image_positions": where, "grids": grids, "positions": n_pos,
                       "prefill_position_ids": "none: 1-D 0..n-1, no DeepStack", "generated": generated,
                       "text": out.result[0], "margins": ms, "min_margin": min(ms), "uncached_max_rel_diff": worst,
                       "tokenizer_text": clip.tokenizer.qwen3vl_8b.tokenizer.decode(ids)}
        print(f"{name}: {len(ids)} ids ({n_pos} positions, grids {grids}), generated {generated} = "
              f"{out.result[0]!r}, min margin {min(ms):.4f}, cache-free rel diff {worst:.1e}")
    return cases


def main():
    import_comfyui(node_modules=True)
    import comfy.sd
    import comfy.text_encoders.qwen3vl as q3vl
    import comfy.text_encoders.qwen_vl as qwen_vl
    import comfy_extras.nodes_textgen as nt
    import qwen3vl_te_images as q3

    os.makedirs(OUT, exist_ok=True)
    stored = {k: v.float() for k, v in load_file(WEIGHTS).items()}
    clip = q3.load(stored, comfy.sd.CLIPType.IDEOGRAM4, True)
    assert isinstance(clip.tokenizer, q3vl.Qwen3VLTokenizer) and isinstance(clip.cond_stage_model, q3vl.Qwen3VLTEModel)
    assert clip.cond_stage_model.clip == "qwen3vl_4b"
    q = clip.cond_stage_model.qwen3vl_4b
    tr = q.transformer
    assert tr.model_type == "qwen3vl_4b" and not tr.model.config.lm_head
    assert list(tr.model.config.stop_tokens) == [151643, 151645]

    g = torch.Generator().manual_seed(SEED)
    inputs = {n: torch.cat([q3.make_image(h, w, g) for _ in range(b)]) for n, (b, h, w) in INPUTS.items()}
    io = {f"input.{n}": v for n, v in inputs.items()}
    cases = {}
    with torch.no_grad():
        for name, case in CASES.items():
            node = Node(clip)
            image = inputs[case["image"]] if case["image"] else None
            with Spy(tr) as spy:
                out = nt.TextGenerate.execute(node, case["prompt"], MAX_LENGTH, dict(GREEDY), image=image,
                                              thinking=case["thinking"],
                                              use_default_template=case["use_default_template"])
            text, kw, tokens = node.calls["tokenize"]
            gen_kw, generated = node.calls["generate"]
            assert out.result[0] == node.calls["decode"]
            assert gen_kw["do_sample"] is False and kw["skip_template"] == (not case["use_default_template"])
            ids, where = ids_of(tokens)
            assert len(spy.logits) == len(generated) == len(spy.steps) == MAX_LENGTH
            for lg in spy.logits:
                assert lg.shape == (VOCAB,)
                assert torch.equal(lg[:VOCAB - VOCAB % ROWS].view(-1, ROWS), lg[:ROWS].expand(VOCAB // ROWS, -1))
                assert torch.equal(lg[VOCAB - VOCAB % ROWS:], lg[:VOCAB % ROWS])
            assert generated == [int(lg.argmax()) for lg in spy.logits]
            assert all(t < ROWS for t in generated)
            ms = margins(spy.logits)
            assert min(ms) >= MIN_MARGIN, (name, ms)
            # The images ComfyUI's tokenizer placed, their resized copies and grids.
            (key,) = tokens
            grids = []
            for j, i in enumerate(where):
                data = tokens[key][0][i][0]["data"]
                _, grid = qwen_vl.process_qwen2vl_images(data, patch_size=16, image_mean=[0.5] * 3,
                                                         image_std=[0.5] * 3)
                grid = [int(v) for v in grid[0]]
                grids.append(grid)
                copy = torch.nn.functional.interpolate(data.permute(0, 3, 1, 2), size=(grid[1] * 16, grid[2] * 16),
                                                       mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
                io[f"{name}.copy.{j}"] = copy.contiguous()
            n_pos = len(ids) + sum(gr[1] * gr[2] // 4 - 1 for gr in grids)
            first = spy.steps[0]
            assert first["seq"] == n_pos and first["deepstack"] == bool(where)
            assert all(s["seq"] == 1 and not s["deepstack"] for s in spy.steps[1:])
            assert all(s["dtype"] == "torch.float32" for s in spy.steps)
            entry = {"widgets": {"prompt": case["prompt"], "max_length": MAX_LENGTH, "sampling_mode": "off",
                                 "thinking": case["thinking"], "use_default_template": case["use_default_template"]},
                     "image": case["image"], "image_batch": 0 if image is None else int(image.shape[0]),
                     "tokenizer_text": None, "ids": ids, "image_positions": where, "grids": grids,
                     "positions": n_pos}
            if first["position_ids"] is None:
                assert all(s["position_ids"] is None for s in spy.steps)
                entry["prefill_position_ids"] = "none: 1-D 0..n-1"
                entry["decode_position_ids"] = f"none: 1-D, the cache length (n, n + 1, ...), n = {n_pos}"
            else:
                p = first["position_ids"]
                assert list(p.shape) == [3, n_pos]
                io[f"{name}.position_ids"] = p.float().contiguous()
                decode = []
                for s in spy.steps[1:]:
                    assert list(s["position_ids"].shape) == [1, 1]
                    decode.append(int(s["position_ids"][0, 0]))
                start = int(p[:, -1].max()) + 1
                assert decode == list(range(start, start + len(decode)))
                entry["prefill_position_ids"] = f"<case>.position_ids [3, {n_pos}]; last column {p[:, -1].tolist()}"
                entry["decode_position_ids"] = decode
            entry.update(generated=generated, text=out.result[0], margins=ms, min_margin=min(ms))
            io[f"{name}.logits"] = torch.stack([lg[:ROWS] for lg in spy.logits]).contiguous()

            # Cache-free greedy through ComfyUI's own Llama2_.
            again = uncached(q, tokens, generated, spy.steps)
            worst = max(float((a - b[:VOCAB]).abs().max() / b.abs().max()) for a, b in zip(again, spy.logits))
            assert [int(a.argmax()) for a in again] == generated, name
            assert worst < 1e-4, (name, worst)
            entry["uncached_max_rel_diff"] = worst
            cases[name] = entry
            print(f"{name}: {len(ids)} ids ({n_pos} positions, grids {grids}), generated {generated} = "
                  f"{out.result[0]!r}, min margin {min(ms):.4f}, cache-free rel diff {worst:.1e}")

        # The written template is the node's template without the think block: one.thinking's ids and output.
        for k in ("ids", "image_positions", "generated"):
            assert cases["one.raw"][k] == cases["one.thinking"][k], k
        assert cases["one"]["ids"][-4:] == [151667, 271, 151668, 271]  # <think>\n\n</think>\n\n
        assert cases["one.raw_no_slot"]["image_positions"] == [] and cases["one.raw_no_slot"]["grids"] == []

        token_cases = {}
        for name, (prompt, img, thinking, template) in TOKEN_CASES.items():
            node = Node(clip)
            tokens = node.tokenize(prompt, image=inputs[img] if img else None, skip_template=not template,
                                   min_length=1, thinking=thinking, video=None, audio=None)
            ids, where = ids_of(tokens)
            token_cases[name] = {"prompt": prompt, "image": img, "thinking": thinking, "use_default_template": template,
                                 "ids": ids, "image_positions": where}
            print(f"tokens {name}: {ids}")

        joy = joy_cases(stored, inputs, io)

    with torch.no_grad():
        hf_check(stored, cases, io)
    # The text ComfyUI's tokenizer built, for reading (the ids are what counts).
    dec = clip.tokenizer.qwen3vl_4b.tokenizer
    for entry in list(cases.values()) + list(token_cases.values()):
        entry["tokenizer_text"] = dec.decode(entry["ids"])

    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({
            "seed": SEED, "weights": WEIGHTS_REL,
            "weights_sha256": hashlib.sha256(open(WEIGHTS, "rb").read()).hexdigest(),
            "loader": "CLIPLoader type ideogram4; detect_te_model's QWEN3VL_8B mapped to QWEN3VL_4B while loading "
                      "(the generic branch: qwen3vl.te / tokenizer, model_type qwen3vl_4b)",
            "lm_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 36,
                          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": VOCAB,
                          "rope_theta": 5e6, "rope_dims": [24, 20, 20], "interleaved_mrope": True,
                          "rms_norm_eps": 1e-6, "tied_head": True, "embedding_rows": ROWS,
                          "stop_tokens": [151643, 151645]},
            "vision_config": {"hidden_size": 128, "intermediate_size": 32, "depth": 2,
                              "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 64, "num_heads": 16,
                              "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                              "out_hidden_size": 16, "min_pixels": 3136, "max_pixels": 12845056,
                              "interpolation": "bilinear", "mean": 0.5, "std": 0.5},
            "generation": {"do_sample": False, "max_length": MAX_LENGTH, "execution_dtype": "float32 (CPU)",
                           "argmax": "torch.argmax over all 151936: the first index of the maximum",
                           "logits_storage": "<case>.logits [steps, 1000]: logits[k] == logits[k % 1000] exactly"},
            "cases": cases, "token_cases": token_cases,
            "joy_loader": "CLIPLoader type joyimage (detect_te_model's QWEN3VL_8B as it stands): joyimage.te / "
                          "JoyImageTokenizer; TextGenerate through SDClipModel.generate",
            "joy_vision": JOY_VISION, "joy_cases": joy,
        }, f, indent=None, ensure_ascii=False)
        f.write("\n")
    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        digest = hashlib.sha256(open(f"{OUT}/{name}", "rb").read()).hexdigest()[:16]
        print(f"  {name:24} {size:9d} bytes  sha256 {digest}")
    print(f"  total {total} bytes")
    assert total < BUDGET, total


if __name__ == "__main__":
    main()
