"""Fixtures for Kiln's Qwen2.5-VL vision tower and for its language model with images in the prompt (the
Qwen-Image-Edit text encoder path), in engine/models/tests/fixtures/qwen25vl_vision/.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/qwen25vl_vision.py

The reference is transformers' `Qwen2_5_VLForConditionalGeneration` (eager attention, f32); ComfyUI's own code at
0f1fa67a (comfy/text_encoders/qwen_vl.py, llama.py's Qwen25_7BVLI, sd1_clip.py's process_tokens) must give the
same on the same weights: the vision tower within 1e-5 and the language model within 1e-4 relative (max |diff| /
max |value|), and the same M-RoPE position ids. Kiln matches ComfyUI, so where the two disagreed ComfyUI's result
would be the one recorded (the script says so when it happens). Images are preprocessed by ComfyUI's
`process_qwen2vl_images` only (bilinear resize of the f32 image, no antialias); transformers' own image processor
(bicubic) is not used for the fixtures, only compared against for the report.

Writes:
- weights.safetensors: a tiny random model with the released structure, stored as bf16 under ComfyUI's names.
  Language model (transformers' `model.language_model.*` renamed to `model.*`): vocab 1024, hidden 256, MLP 128,
  2 layers, 2 query / 1 key-value heads of width 128 (as released), q/k/v biases, eps 1e-6, theta 1e6, M-RoPE
  sections (16, 24, 24). Vision tower (transformers' `model.visual.*` renamed to `visual.*`): patch 14, temporal
  patch 2, width 64 in 16 heads of 4 (2D RoPE over 2 + 2 dims, theta 1e4), SwiGLU MLP 64 with biases, 8 blocks
  with windowed attention (window 112 px = 4x4 merged tokens) except block 7 (full; ComfyUI hard-codes
  [7, 15, 23, 31]), RMS norms eps 1e-6, a 2x2 patch merger (RMS norm, 256 -> 256, exact GELU, 256 -> 256). No
  lm_head. Seeded; norm weights 1 + 0.2 randn, biases 0.2 randn, matrices randn * gain / sqrt(fan in) (gain 2
  on the language model's q/k projections and the tower's fused qkv, so that attention is far from uniform and
  positions and windows matter: the script prints how much plain 1D positions, full attention everywhere or
  swapped h/w RoPE angles would change the outputs), the token embedding randn; the f32 references run on
  exactly the bf16 values.
- io.safetensors (f32), for each image case c in wide (100 x 130: 4 x 5 merged tokens, a partial window
  column), small (20 x 30: ComfyUI's min_pixels path, resized up to 56 x 84), square (170 x 170: 6 x 6 merged
  tokens, partial windows both ways):
  `image.<c>` [1, H, W, 3] (ComfyUI's IMAGE layout, smooth random values in [0, 1]);
  `patches.<c>` [n, 1176] and `grid.<c>` [3] (t, h, w in patches) = ComfyUI's process_qwen2vl_images(image);
  `vision.<c>` [n / 4, 256] = the vision tower's merged output (the image embeds the language model receives);
  and for each prompt case p, `hidden.<p>` [1, N, 256] = the language model's last hidden state (after the final
  norm) with each image's embeds in place of its placeholder.
- edit_prompts.json: the token ids ComfyUI's TextEncodeQwenImageEdit and TextEncodeQwenImageEditPlus nodes
  encode for a few prompts and picture inputs (run with ComfyUI's Qwen-Image tokenizer; an image's placeholder
  as <|image_pad|> = 151655).
- cases.json: the prompt cases as lists of pieces, each a list of token ids or {"image": "<c>"}; token ids < 997
  apart from <|vision_start|> = 999 and <|vision_end|> = 998 (<|image_pad|> = 1000, <|video_pad|> = 997 are
  only used inside transformers). Each image piece stands for that image's n / 4 embeds; positions follow
  Qwen2.5-VL's M-RoPE: text runs 1D, an image's tokens get (t, h, w) = start + (0, row, column), the text after
  it resumes at start + max(rows, columns).
"""

import json
import math
import os
import sys
import types

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/qwen25vl_vision"
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 1000, 997, 999, 998
TEXT = dict(vocab_size=1024, hidden_size=256, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1)
VISION = dict(depth=8, hidden_size=64, num_heads=16, intermediate_size=64, out_hidden_size=256, patch_size=14,
              temporal_patch_size=2, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[7])
IMAGES = {"wide": (100, 130), "small": (20, 30), "square": (170, 170)}
CASES = {
    "one": [[5, 17, 300, VISION_START], {"image": "wide"}, [VISION_END, 42, 7, 600]],
    "two": [[3, VISION_START], {"image": "square"}, [VISION_END, 11, 12, VISION_START], {"image": "small"},
            [VISION_END, 77]],
}
QKV_GAIN = 2.0


def rel(a, b):
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def make_image(h, w, g):
    """[1, h, w, 3] in [0, 1]: per channel 0.5 + four random low-frequency plane waves + a little noise."""
    y = torch.arange(h, dtype=torch.float64)[:, None] / h
    x = torch.arange(w, dtype=torch.float64)[None, :] / w
    channels = []
    for _ in range(3):
        c = torch.full((h, w), 0.5, dtype=torch.float64)
        for _ in range(4):
            fy, fx, phase, amp = torch.rand(4, generator=g, dtype=torch.float64).tolist()
            c += (0.08 + 0.12 * amp) * torch.sin(2 * math.pi * ((6 * fy - 3) * y + (6 * fx - 3) * x + phase))
        c += 0.03 * torch.randn(h, w, generator=g, dtype=torch.float64)
        channels.append(c)
    return torch.stack(channels, -1).clamp(0, 1).float().unsqueeze(0).contiguous()


def build_transformers():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(**TEXT, rms_norm_eps=1e-6, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                         rope_parameters={"rope_theta": 1e6, "rope_type": "default", "mrope_section": [16, 24, 24]}),
        vision_config=VISION,
        image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, attn_implementation="eager",
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    assert model.model.visual.config._attn_implementation == "eager"
    stored = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("lm_head."):
                continue  # ComfyUI's Qwen25_7BVLI has none; the hidden states do not use it
            if name.endswith("bias"):
                value = 0.2 * torch.randn_like(p)
            elif p.ndim == 1:  # every 1D weight is an RMS norm's
                value = 1.0 + 0.2 * torch.randn_like(p)
            elif name.endswith("embed_tokens.weight"):
                value = torch.randn_like(p)
            else:
                gain = QKV_GAIN if any(k in name for k in (".qkv.", ".q_proj.", ".k_proj.")) else 1.0
                value = gain * torch.randn_like(p) / p[0].numel() ** 0.5
            s = value.to(torch.bfloat16)
            p.copy_(s.float())
            if name.startswith("model.language_model."):
                stored["model." + name[len("model.language_model."):]] = s.contiguous()
            elif name.startswith("model.visual."):
                stored["visual." + name[len("model.visual."):]] = s.contiguous()
            else:
                raise KeyError(name)
    assert torch.allclose(model.model.visual.rotary_pos_emb.inv_freq, torch.tensor([1.0]))
    return model, stored


def comfy_vision_tower(comfy, stored, full_attention_everywhere=False):
    from comfy.text_encoders.qwen_vl import Qwen2VLVisionTransformer

    tower = Qwen2VLVisionTransformer(hidden_size=64, output_hidden_size=256, intermediate_size=64, num_heads=16,
                                     num_layers=8, dtype=torch.float32, ops=comfy.ops.disable_weight_init).eval()
    tower.load_state_dict({k[len("visual."):]: v.float() for k, v in stored.items() if k.startswith("visual.")},
                          strict=True)
    assert tower.fullatt_block_indexes[:1] == [7] and tower.window_size == 112
    if full_attention_everywhere:
        tower.fullatt_block_indexes = list(range(8))
    return tower


def compare_hf_processor(image, patches, grid):
    """Report only: transformers' Qwen2VL image processor (bicubic) against ComfyUI's preprocessing."""
    try:
        from transformers import Qwen2VLImageProcessor

        proc = Qwen2VLImageProcessor(min_pixels=3136, max_pixels=12845056)
        out = proc(images=image[0].permute(2, 0, 1), do_rescale=False, return_tensors="pt")
        same_grid = out["image_grid_thw"][0].tolist() == grid.tolist()
        diff = float((out["pixel_values"] - patches).abs().max()) if same_grid else float("nan")
        return f"transformers' processor: grid {out['image_grid_thw'][0].tolist()} (same: {same_grid}), " \
               f"max |patch diff| {diff:.3f} (normalised units)"
    except Exception as e:  # noqa: BLE001 - report only
        return f"transformers' processor not compared ({type(e).__name__}: {e})"


def main():
    import_comfyui(node_modules=True)
    import comfy.ops
    import comfy.sd1_clip
    import comfy.text_encoders.llama as llama
    from comfy.text_encoders.qwen_vl import process_qwen2vl_images

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(2025)
    model, stored = build_transformers()
    save_file(stored, f"{OUT}/weights.safetensors")
    print(f"{len(stored)} weights, e.g.", [k for k in sorted(stored) if ".blocks.0." in k or ".layers.0." in k
                                           or not (".blocks." in k or ".layers." in k)])

    io, vision, grids = {}, {}, {}
    g = torch.Generator().manual_seed(11)
    tower = comfy_vision_tower(comfy, stored)
    tower_full = comfy_vision_tower(comfy, stored, full_attention_everywhere=True)
    with torch.no_grad():
        # Vision tower: transformers against ComfyUI, per image, on ComfyUI's patches.
        for c, (h, w) in IMAGES.items():
            image = make_image(h, w, g)
            patches, grid = process_qwen2vl_images(image)
            grids[c] = grid
            ours = model.model.visual(patches, grid_thw=grid).pooler_output
            theirs = tower(patches, grid)
            err = rel(theirs, ours)
            window_effect = rel(tower_full(patches, grid), ours)
            rope = tower.get_position_embeddings
            # The same with each patch's (h, w) rotary angles swapped.
            tower.get_position_embeddings = lambda thw, dev: rope(thw, dev).unflatten(1, (2, -1)).flip(1).flatten(1)
            swap_effect = rel(tower(patches, grid), ours)
            del tower.get_position_embeddings
            io.update({f"image.{c}": image, f"patches.{c}": patches.contiguous(), f"grid.{c}": grid[0].float(),
                       f"vision.{c}": ours.contiguous()})
            vision[c] = ours
            print(f"vision {c}: image {h}x{w} -> grid {grid[0].tolist()}, patches {tuple(patches.shape)} "
                  f"max {float(patches.abs().max()):.3f}, embeds {tuple(ours.shape)} max {float(ours.abs().max()):.3f}"
                  f" rms {float(ours.pow(2).mean().sqrt()):.3f}; ComfyUI rel err {err:.2e}; "
                  f"full attention in every block would change it by {window_effect:.2e}, swapping the RoPE's h and w "
                  f"by {swap_effect:.2e}")
            print("   ", compare_hf_processor(image, patches, grid[0]))
            assert err < 1e-5, c

        # The language model with the images in the prompt.
        te = llama.Qwen25_7BVLI(TEXT, dtype=torch.float32, device=None, operations=comfy.ops.disable_weight_init)
        te.visual = tower
        te.load_state_dict({k: v.float() for k, v in stored.items()}, strict=True)
        te.eval()
        captured = []
        compute = te.model.compute_freqs_cis
        te.model.compute_freqs_cis = lambda pos, dev: (captured.append(pos.clone()), compute(pos, dev))[1]
        fake_clip = types.SimpleNamespace(special_tokens={"pad": 151643}, transformer=te)

        for name, pieces in CASES.items():
            ids, comfy_tokens, images = [], [], []
            for piece in pieces:
                if isinstance(piece, dict):
                    c = piece["image"]
                    ids += [IMAGE_TOKEN] * vision[c].shape[0]
                    comfy_tokens.append({"type": "image", "data": io[f"image.{c}"]})
                    images.append(c)
                else:
                    assert all(t < VIDEO_TOKEN or t in (VISION_START, VISION_END) for t in piece)
                    ids += piece
                    comfy_tokens += piece
            input_ids = torch.tensor([ids])
            pixel_values = torch.cat([io[f"patches.{c}"] for c in images])
            grid_thw = torch.cat([grids[c] for c in images])
            model.model.rope_deltas = None
            out = model.model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid_thw,
                              mm_token_type_ids=(input_ids == IMAGE_TOKEN).int(), output_hidden_states=True)
            ours = out.hidden_states[-1]
            assert torch.equal(ours, out.last_hidden_state)
            hf_pos, _ = model.model.get_rope_index(input_ids, image_grid_thw=grid_thw,
                                                   mm_token_type_ids=(input_ids == IMAGE_TOKEN).int())
            model.model.rope_deltas = None
            # Without mm_token_type_ids transformers falls back to plain 1D positions: how much that would change.
            plain = model.model(input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid_thw)
            position_effect = rel(plain.last_hidden_state, ours)

            # ComfyUI: process_tokens runs the tower on each image (preprocess_embed) and splices its embeds in
            # where the image's one placeholder was, then Qwen25_7BVLI.forward builds the M-RoPE positions.
            embeds, mask, _, embeds_info = comfy.sd1_clip.SDClipModel.process_tokens(fake_clip, [comfy_tokens], "cpu")
            assert embeds.shape[1] == len(ids) and [e["index"] for e in embeds_info] == \
                [i for i in range(len(ids)) if ids[i] == IMAGE_TOKEN and ids[i - 1] == VISION_START]
            captured.clear()
            # (Its forward writes into `embeds` in place, hence the copies.) Run as ComfyUI's text encoder runs it,
            # with process_tokens' (all-ones) attention mask, and without one.
            theirs = te(None, attention_mask=None, embeds=embeds.clone(), embeds_info=embeds_info)[0]
            theirs_masked = te(None, attention_mask=mask, embeds=embeds.clone(), embeds_info=embeds_info)[0]
            comfy_pos = captured[0]
            same_pos = torch.equal(comfy_pos.long(), hf_pos[:, 0]) and torch.equal(captured[1].long(), hf_pos[:, 0])
            err, err_masked = rel(theirs, ours), rel(theirs_masked, ours)
            print(f"hidden {name}: {tuple(ours.shape)} max {float(ours.abs().max()):.3f}; ComfyUI rel err {err:.2e} "
                  f"(with its all-ones attention mask {err_masked:.2e}); positions equal: {same_pos}; "
                  f"plain 1D positions would change it by {position_effect:.2e}")
            print("    positions (t, h, w):", hf_pos[:, 0].tolist())
            if same_pos and err < 1e-4 and err_masked < 1e-4:
                io[f"hidden.{name}"] = ours.contiguous()
            else:
                print(f"    !!! ComfyUI and transformers differ on {name}; recording ComfyUI's result")
                print("    ComfyUI positions:", comfy_pos.long().tolist())
                io[f"hidden.{name}"] = theirs.contiguous()

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        f.write(json.dumps(CASES, indent=1) + "\n")
    for k, v in io.items():
        print(k, tuple(v.shape), f"{float(v.abs().max()):.4f}")


def edit_prompts():
    """The token ids ComfyUI's Qwen-Image Edit nodes encode (`comfy_extras.nodes_qwen` run with a CLIP whose
    tokenize is ComfyUI's `QwenImageTokenizer` and whose encode records nothing), an image's placeholder
    written as <|image_pad|> (151655): edit_prompts.json."""
    import comfy.text_encoders.qwen_image as qwen_image
    import comfy_extras.nodes_qwen as nodes_qwen

    tokenizer = qwen_image.QwenImageTokenizer()

    class Clip:
        def tokenize(self, text, **kwargs):
            return tokenizer.tokenize_with_weights(text, **kwargs)

        def encode_from_tokens_scheduled(self, tokens):
            self.tokens = tokens
            return []

    def ids(tokens):
        return [151655 if isinstance(t, dict) else int(t) for t, *_ in tokens["qwen25_7b"][0]]

    image = torch.rand(1, 48, 64, 3)
    cases = {
        "edit_image": ("TextEncodeQwenImageEdit", "make the sky (red)", {"image": image}),
        "edit_text": ("TextEncodeQwenImageEdit", "a cat", {}),
        "plus_1_3": ("TextEncodeQwenImageEditPlus", "swap them", {"image1": image, "image3": image}),
        "plus_none": ("TextEncodeQwenImageEditPlus", "a dog", {}),
        "templated": ("TextEncodeQwenImageEditPlus", "<|im_start|>user\nhi<|im_end|>", {}),
    }
    out = {}
    for name, (node, prompt, images) in cases.items():
        clip = Clip()
        getattr(nodes_qwen, node).execute(clip=clip, prompt=prompt, **images)
        out[name] = {"node": node, "prompt": prompt, "images": sorted(images), "ids": ids(clip.tokens)}
        print(name, len(out[name]["ids"]), "ids")
    with open(f"{OUT}/edit_prompts.json", "w") as f:
        f.write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
    edit_prompts()
