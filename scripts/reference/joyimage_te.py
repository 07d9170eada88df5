"""Fixtures for JoyImage-Edit's text encoder (engine/models/tests/fixtures/joyimage_te/): ComfyUI's
TextEncodeJoyImageEdit node on CLIPLoader type `joyimage` with a Qwen3-VL-8B file, on the tiny random Qwen3-VL of
engine/models/tests/fixtures/qwen3vl_te_images/qwen3vl.safetensors (read, not rewritten; written by
qwen3vl_te_images.py, whose loading helpers this script imports), loaded by ComfyUI's own loader. No VAE: the
node's reference latents are not recorded (Kiln checks VAE encodes elsewhere).

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a):
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/joyimage_te.py
It takes about four minutes on two CPU cores and is reproducible (the inputs come from seeded generators).

ComfyUI code this relies on (0f1fa67a; nj.py is comfy_extras/nodes_joyimage.py, joy.py
comfy/text_encoders/joyimage.py, q3vl.py comfy/text_encoders/qwen3vl.py, qvl.py qwen_vl.py, sd1.py
comfy/sd1_clip.py):
- comfy/sd.py: CLIPType.JOYIMAGE with a file detect_te_model calls QWEN3VL_8B (the tiny file's merger has 16 rows,
  not 2560, so it is 8B as it stands: no mapping) -> joy.te / joy.JoyImageTokenizer, the file's
  `model.language_model.` / `model.visual.` prefixes renamed `model.` / `visual.`.
- nj.py: TextEncodeJoyImageEdit(clip, prompt, vae=None, images={image1..image6}) resizes each image (batch 1 only,
  else ValueError) to the bucket of BUCKETS_1024 whose h / w is nearest the input's (`_find_best_bucket`: min over
  the list in its order, so a tie keeps the earlier bucket) with common_upscale(..., "bilinear", "center")
  (comfy/utils.py: crop the input to the bucket's aspect, x = round((W - W * (na / oa)) / 2) columns off each side
  when the input is wider (oa = W / H > na = bw / bh), else y = round((H - H * (oa / na)) / 2) rows; then
  F.interpolate bilinear, align_corners False, no antialias), keeps channels [:3], and calls
  clip.tokenize(prompt, images=copies) then encode_from_tokens_scheduled.
- joy.py: JoyImageTokenizer always tokenizes with thinking=True (no empty <think> block; a `thinking` kwarg is
  dropped); the text template JOYIMAGE_TEMPLATE_TEXT without images, JOYIMAGE_TEMPLATE_IMAGE (one vision block
  before the prompt in the user turn, repeated per image by q3vl.py's Qwen3VLTokenizer) with images; a prompt
  starting with "<|im_start|>" skips the template (q3vl.py) and each written <|image_pad|> takes the next image
  (images beyond the written slots are dropped, slots beyond the images stay plain token 151655).
  Qwen3VL8B_JoyImage.preprocess_embed: process_qwen2vl_images (qvl.py) with min_pixels 65536, max_pixels
  16777216, patch 16, mean / std 0.5, bicubic (the buckets are multiples of 64 inside those bounds, so this copy is
  the node's copy unchanged: checked), then the vision tower with DeepStack. _JoyImageClipModel: layer "hidden",
  layer_idx -1, layer_norm_hidden_state False (the last decoder layer's output WITHOUT the final norm), pad 151643,
  attention masks on. JoyImageTEModel.encode_token_weights drops the first JOYIMAGE_DROP_IDX = 34 positions of
  the states and of the mask, and raises ValueError when the sequence has <= 34 positions. With the template those
  34 are the system turn (33 ids; its text holds a literal backslash-n, ids 1124 77) and the user turn's
  <|im_start|>, so the conditioning starts at "user\n"; a skipped template is cut at 34 all the same.
- sd1.py process_tokens: a written <|endoftext|> (151643, the pad; no end token) is masked along with every token
  after it (image embeddings spliced in after it stay attended); the mask travels in the conditioning's
  `attention_mask` (int64, all ones in most cases, and kept).

Tiny model (the file's, see qwen3vl_te_images.py; released values in brackets): the language model hidden 16
[4096], intermediate 32, 36 layers [36], 2 heads [32] of head_dim 128 over 1 kv head [8], theta 5e6, M-RoPE [24,
20, 20] interleaved; the tower hidden 128 [1152] in 16 heads, intermediate 32, depth 2 [27], DeepStack after
blocks [0, 1] [8, 16, 24], position table 8 x 8 [48 x 48], patch 16, temporal 2, merge 2; the token table's 1000
stored rows tiled to 151936. ComfyUI runs it in f32 on the CPU.

Inputs: A (212 x 288) and B (256 x 244) are k / 64 images (qwen3vl_te_images.make_image) whose bucket copies are
EXACT: after the centre crop (2 rows, resp. 2 columns off each side) the bilinear resize is exactly 4x (832 x 1152,
1024 x 960), whose weights are multiples of 1 / 8, so every copy value is a multiple of 2^-12 however the sums are
ordered; S (40 x 56, the size qwen3vl_te_images.py uses) takes an uneven 20.8x to 832 x 1152 (not exact). The copies
hold about a million pixels each (3 MB as U8 even), so they are not stored in full: a 1-in-7 subsample, per-channel
sums and (exact copies) integer checksums; see cases.json's `copy_storage`.

Writes engine/models/tests/fixtures/joyimage_te/:
- io.safetensors: `input.<X>` f32 [1, H, W, 3]; `copy.<X>.sub7` f32 = the node's copy[:, ::7, ::7, :];
  `<case>.cond` f32 [1, n - 34, 16] = the node's conditioning tensor; `<case>.attention_mask` f32 [1, n - 34]
  where ComfyUI's mask holds a zero.
- cases.json: the configuration, the weights file and its sha256, `copies` (per input: bucket, crop, copy size,
  vision grid, checksums), `cases` (node runs), `token_cases` (tokenizer only), `buckets` (what
  _find_best_bucket and the centre crop give for a list of sizes).

Cross-checks (asserted): the node's conditioning equals encode_from_tokens on the recorded tokens; it equals the
last layer's pre-norm output of the whole sequence (the model run without the drop) from position 34 on; the
vision copy is the node's copy bit for bit; A's and B's copies are multiples of 2^-12.
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
OUT = os.path.join(HERE, "../../engine/models/tests/fixtures/joyimage_te")
WEIGHTS = os.path.join(HERE, "../../engine/models/tests/fixtures/qwen3vl_te_images/qwen3vl.safetensors")
WEIGHTS_REL = "engine/models/tests/fixtures/qwen3vl_te_images/qwen3vl.safetensors"
SEED = 5120
BUDGET = 5_000_000
IMAGE_PAD = 151655
DROP = 34
SUB = 7
INPUTS = {"A": (212, 288), "B": (256, 244), "S": (40, 56)}
EXACT = ("A", "B")
FOX = "make the fox blue"

# Node runs: prompt, images (input names). `same_as`: a case whose ids and conditioning these equal (asserted;
# the conditioning is not stored twice).
CASES = {
    "text": dict(prompt=FOX, images=[]),
    "one": dict(prompt=FOX, images=["A"]),
    "two": dict(prompt="put the cat from the second image next to the fox", images=["A", "B"]),
    # The node's usual negative: an empty prompt with the same image (the template still applies).
    "empty": dict(prompt="", images=["A"]),
    "small": dict(prompt=FOX, images=["S"]),
    # A written <|endoftext|>: masked with the text after it.
    "endoftext": dict(prompt=FOX + "<|endoftext|> and the sky red", images=["A"]),
    # Prompts starting with <|im_start|> skip the template; the drop of 34 still applies.
    "skip.template_text": dict(prompt=None, template="text", images=[], same_as="text"),
    "skip.template_image": dict(prompt=None, template="image", images=["A"], same_as="one"),
    # A short written user turn with an image: the drop cuts `<|im_start|>user\n<|vision_start|>` and the first
    # 30 image positions.
    "skip.cuts_image": dict(prompt="<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" + FOX
                            + "<|im_end|>\n", images=["A"]),
    # A short written user turn without images: 11 positions, ValueError from JoyImageTEModel.
    "skip.short": dict(prompt="<|im_start|>user\n" + FOX + "<|im_end|>\n<|im_start|>assistant\n", images=[]),
    # A batch of two images on one input: ValueError from the node's resize.
    "batch_of_two": dict(prompt=FOX, images=["A+A"]),
}
# Tokenizer only (clip.tokenize as the node calls it, no resize): prompt, number of images (small stand-ins), kwargs.
TOKEN_CASES = {
    "plain": ("a red fox", 0, {}),
    "weights_literal": ("a (red:1.3) fox, \\(literal\\) [x]", 0, {}),
    "unicode": ("一只红色的狐狸 🦊, café", 0, {}),
    "empty": ("", 0, {}),
    "three_images": ("combine them", 3, {}),
    "thinking_false_ignored": ("a red fox", 1, {"thinking": False}),
    "skip_no_slot": ("<|im_start|>user\na red fox<|im_end|>\n", 1, {}),
    "skip_two_slots_one_image": ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                                 "<|vision_start|><|image_pad|><|vision_end|>a red fox<|im_end|>\n", 1, {}),
    "leading_space_im_start": (" <|im_start|>user\na red fox<|im_end|>\n", 0, {}),
}
# [H, W] inputs for the bucket table.
BUCKET_SIZES = [(1024, 1024), (1200, 800), (800, 1200), (100, 3000), (3000, 100), (37, 50), (50, 37), (40, 56),
                (64, 48), (212, 288), (256, 244), (720, 1280), (1080, 1920), (1, 1), (310, 300), (2048, 512),
                (4000, 100), (833, 1152),
                # Crop offsets near a half: Python's round() is half-to-even on the float it gets: exact 0.5 -> 0
                # and 2.5 -> 2; 0.5000000000000284 -> 1, 0.4999999999999716 -> 0; (999, 1000)'s
                # 0.5000000000000568 -> 1 and (833, 1152)'s 0.49999999999994316 -> 0 (both above).
                (300, 301), (300, 305), (300, 321), (300, 437), (999, 1000)]


def sha(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def ids_of(tokens):
    """(ids, image positions): an image dict is written 151655 and its index listed; a plain 151655 is not."""
    (key,) = tokens
    (section,) = tokens[key]
    ids, where = [], []
    for i, t in enumerate(section):
        if isinstance(t[0], dict):
            ids.append(IMAGE_PAD)
            where.append(i)
        else:
            ids.append(int(t[0]))
        assert float(t[1]) == 1.0
    return ids, where


def vision_copy(copy):
    """JoyImage's preprocess: process_qwen2vl_images with its settings; the resized copy and the grid."""
    import torch.nn.functional as F

    import comfy.text_encoders.qwen_vl as qwen_vl

    _, grid = qwen_vl.process_qwen2vl_images(copy, min_pixels=65536, max_pixels=16777216, patch_size=16,
                                             image_mean=[0.5] * 3, image_std=[0.5] * 3, interpolation="bicubic")
    grid = [int(v) for v in grid[0]]
    h, w = grid[1] * 16, grid[2] * 16
    resized = F.interpolate(copy.permute(0, 3, 1, 2), size=(h, w), mode="bicubic", align_corners=False)
    return resized.permute(0, 2, 3, 1), grid


def copy_record(name, copy, node_input):
    import comfy_extras.nodes_joyimage as nj

    h, w = node_input.shape[1:3]
    bh, bw = nj._find_best_bucket(h, w)
    y, x = crop_of(h, w, bh, bw)
    assert list(copy.shape) == [1, bh, bw, 3]
    resized, grid = vision_copy(copy)
    assert torch.equal(resized, copy), name
    flat = copy.double().reshape(-1)
    rec = {"input": [h, w], "bucket": [bh, bw], "crop": [y, x], "cropped": [h - 2 * y, w - 2 * x],
           "scale": [bh / (h - 2 * y), bw / (w - 2 * x)], "grid": grid, "image_tokens": grid[1] * grid[2] // 4,
           "vision_copy": "the node's copy unchanged (bicubic at the same size; checked bit for bit)",
           "channel_sums": [float(v) for v in copy.double().sum((0, 1, 2))],
           "sha256_f32_le": sha(copy), "exact": name in EXACT}
    if name in EXACT:
        q = flat * 4096
        assert torch.equal(q, q.round()), name
        q = q.round().long()
        weight = torch.arange(q.numel(), dtype=torch.long) % 9973 + 1
        rec["sum4096"] = [int(v) for v in q.view(-1, 3).sum(0)]
        rec["weighted4096"] = int((q * weight).sum())
    return rec


def crop_of(h, w, bh, bw, unrounded=False):
    """common_upscale's centre crop offsets (rows y, columns x off each side); with `unrounded`, the float
    round() gets too (0.0 when no crop)."""
    old, new = w / h, bw / bh
    y = x = 0
    v = 0.0
    if old > new:
        v = (w - w * (new / old)) / 2
        x = round(v)
    elif old < new:
        v = (h - h * (old / new)) / 2
        y = round(v)
    return (y, x, v) if unrounded else (y, x)


class Recorder:
    """Wraps a CLIP: records the node's tokenize calls (text, kwargs, tokens)."""

    def __init__(self, clip):
        self.clip, self.calls = clip, []

    def tokenize(self, text, **kw):
        tokens = self.clip.tokenize(text, **kw)
        self.calls.append((text, kw, tokens))
        return tokens

    def encode_from_tokens_scheduled(self, tokens, **kw):
        return self.clip.encode_from_tokens_scheduled(tokens, **kw)


def pre_norm_states(clip, tokens):
    """The whole sequence's last-layer output before the final norm, run through Llama2_ with the mask."""
    te = clip.cond_stage_model
    q = getattr(te, te.clip)
    (key,) = tokens
    toks = [[t[0] for t in tokens[key][0]]]
    embeds, mask, _, info = q.process_tokens(toks, "cpu")
    x, inter = q.transformer(None, attention_mask=mask, embeds=embeds, intermediate_output=-1,
                             final_layer_norm_intermediate=False, embeds_info=info)
    return inter, mask


def main():
    import_comfyui(node_modules=True)
    import comfy.sd
    import comfy.text_encoders.joyimage as joy
    import comfy_extras.nodes_joyimage as nj
    import qwen3vl_te_images as q3

    os.makedirs(OUT, exist_ok=True)
    stored = {k: v.float() for k, v in load_file(WEIGHTS).items()}
    clip = q3.load(stored, comfy.sd.CLIPType.JOYIMAGE, False)
    assert isinstance(clip.tokenizer, joy.JoyImageTokenizer)
    assert isinstance(clip.cond_stage_model, joy.JoyImageTEModel)
    q = getattr(clip.cond_stage_model, clip.cond_stage_model.clip)
    assert isinstance(q.transformer, joy.Qwen3VL8B_JoyImage) and q.layer == "hidden" and q.layer_idx == -1
    assert q.layer_norm_hidden_state is False and joy.JOYIMAGE_DROP_IDX == DROP

    g = torch.Generator().manual_seed(SEED)
    inputs = {n: q3.make_image(h, w, g) for n, (h, w) in INPUTS.items()}
    inputs["A+A"] = torch.cat([inputs["A"], inputs["A"]])
    io = {f"input.{n}": inputs[n] for n in INPUTS}
    templates = {"text": joy.JOYIMAGE_TEMPLATE_TEXT.format(FOX), "image": joy.JOYIMAGE_TEMPLATE_IMAGE.format(FOX)}

    cases, copies, copy_values = {}, {}, {}
    with torch.no_grad():
        for name, case in CASES.items():
            prompt = case["prompt"] if case["prompt"] is not None else templates[case["template"]]
            rec = Recorder(clip)
            images = {f"image{j + 1}": inputs[n] for j, n in enumerate(case["images"])}
            entry = {"prompt": prompt, "images": case["images"]}
            try:
                out = nj.TextEncodeJoyImageEdit.execute(rec, prompt, None, images or None)
            except ValueError as e:
                out = None
                entry["error"] = f"{type(e).__name__}: {e}"
            if rec.calls:
                (text, kw, tokens), = rec.calls
                assert text == prompt
                ids, where = ids_of(tokens)
                got = list(kw.get("images", []))
                entry.update(ids=ids, image_positions=where, positions=None)
                for n, img in zip(case["images"], got):
                    if n in copy_values:
                        assert torch.equal(copy_values[n], img), n
                    else:
                        copy_values[n] = img
                        copies[n] = copy_record(n, img, inputs[n])
                entry["copy_sizes"] = [list(img.shape[1:3]) for img in got]
                grids = [copies[n]["grid"] for n in case["images"][:len(got)]]
                entry["grids"] = grids
                # Positions after splicing: each image slot becomes grid_h * grid_w / 4 positions.
                n_pos = len(ids) + sum(gr[1] * gr[2] // 4 - 1 for gr in grids)
                entry["positions"] = n_pos
            if out is None:
                print(f"{name}: {entry['error']}")
                cases[name] = entry
                continue
            (c, extra), = out.result[0]
            assert set(extra) == {"pooled_output", "attention_mask"} and extra["pooled_output"] is None, extra.keys()
            mask = extra["attention_mask"]
            assert mask.dtype == torch.int64 and list(mask.shape) == list(c.shape[:2])
            assert c.shape[1] == entry["positions"] - DROP, (c.shape, entry["positions"])
            again = clip.encode_from_tokens(tokens, return_dict=True)
            assert torch.equal(again["cond"], c), name
            full, full_mask = pre_norm_states(clip, tokens)
            assert torch.equal(full[:, DROP:], c), name
            assert torch.equal(full_mask[:, DROP:].long(), mask), name
            masked = not bool((mask == 1).all())
            entry["cond_shape"] = list(c.shape)
            if masked:
                zeros = [i for i, v in enumerate(mask[0].tolist()) if v == 0]
                assert zeros == list(range(zeros[0], mask.shape[1])), zeros
                entry["attention_mask"] = (f"zeros from position {zeros[0]} to the end ({mask.shape[1]}), ones before "
                                           f"(stored as <case>.attention_mask)")
            else:
                entry["attention_mask"] = "all ones (int64 [1, n - 34]), kept in the conditioning"
            entry["mask_zeros_from"] = zeros[0] if masked else None
            entry["dropped_ids"] = [i for i in ids[:DROP]] if not where or where[0] >= DROP else \
                "the first 34 positions, which reach into the image (see image_positions, grids)"
            if "same_as" in case:
                other = cases[case["same_as"]]
                assert other["ids"] == ids and torch.equal(io[f"{case['same_as']}.cond"], c), name
                entry["same_as"] = case["same_as"]
            else:
                io[f"{name}.cond"] = c.float().contiguous()
            if masked:
                io[f"{name}.attention_mask"] = mask.float().contiguous()
            cases[name] = entry
            print(f"{name}: {len(ids)} ids, {entry['positions']} positions, copies {entry['copy_sizes']} grids "
                  f"{entry['grids']}, cond {list(c.shape)}, max |cond| {float(c.abs().max()):.3f}"
                  + (", mask holds zeros" if masked else ""))
        assert "error" in cases["skip.short"] and "error" in cases["batch_of_two"]
        assert "error" not in cases["skip.cuts_image"]

        token_cases = {}
        stand_in = torch.rand(1, 64, 64, 3, generator=g)
        for name, (prompt, count, kw) in TOKEN_CASES.items():
            tokens = clip.tokenize(prompt, images=[stand_in] * count, **kw)
            ids, where = ids_of(tokens)
            token_cases[name] = {"prompt": prompt, "images": count, "kwargs": kw, "ids": ids,
                                 "image_positions": where}
            print(f"tokens {name}: {len(ids)} ids, images at {where}, plain 151655 at "
                  f"{[i for i, t in enumerate(ids) if t == IMAGE_PAD and i not in where]}")

        buckets = []
        for h, w in BUCKET_SIZES:
            bh, bw = nj._find_best_bucket(h, w)
            y, x, v = crop_of(h, w, bh, bw, unrounded=True)
            # The node's own resize on a zero image of that size agrees (the size is all it tells).
            if h * w <= 4_000_000:
                got = nj._resize_reference(torch.zeros(1, h, w, 3))
                assert list(got.shape) == [1, bh, bw, 3]
            buckets.append({"input": [h, w], "bucket": [bh, bw], "crop": [y, x], "cropped": [h - 2 * y, w - 2 * x],
                            "offset_before_round": repr(v)})
        print("buckets", [(b["input"], b["bucket"], b["crop"]) for b in buckets])

    for n, img in copy_values.items():
        io[f"copy.{n}.sub{SUB}"] = img[:, ::SUB, ::SUB, :].contiguous()
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump({
            "seed": SEED, "weights": WEIGHTS_REL,
            "weights_sha256": hashlib.sha256(open(WEIGHTS, "rb").read()).hexdigest(),
            "loader": "CLIPLoader type joyimage; detect_te_model: QWEN3VL_8B as it stands (no mapping)",
            "lm_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 36,
                          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 151936,
                          "rope_theta": 5e6, "rope_dims": [24, 20, 20], "interleaved_mrope": True,
                          "embedding_rows": 1000},
            "vision_config": {"hidden_size": 128, "intermediate_size": 32, "depth": 2,
                              "deepstack_visual_indexes": [0, 1], "num_position_embeddings": 64, "num_heads": 16,
                              "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                              "out_hidden_size": 16},
            "encoder": {"layer": "last decoder layer output, no final norm", "drop_idx": DROP,
                        "vision": {"min_pixels": 65536, "max_pixels": 16777216, "interpolation": "bicubic",
                                   "mean": 0.5, "std": 0.5}},
            "copy_storage": (f"copy.<X>.sub{SUB} = copy[:, ::{SUB}, ::{SUB}, :] (f32); the full copy's f64 channel "
                             "sums; sha256 of its f32 little-endian bytes in [1, H, W, 3] order; for exact copies "
                             "(A, B: multiples of 2^-12) sum4096 = per-channel sums of round(4096 v) and "
                             "weighted4096 = sum over the flat HWC index i of round(4096 v_i) * (i % 9973 + 1)"),
            "copies": copies, "cases": cases, "token_cases": token_cases, "buckets": buckets,
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
