"""Fixtures for Kiln's Qwen3-VL vision tower and for the Qwen3-VL language model reading images (the text encoders
of Krea 2, Mage-Flow and Boogu with reference images), in engine/models/tests/fixtures/qwen3vl_vision/.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/qwen3vl_vision.py
It takes a few seconds on the CPU and is reproducible (every random value comes from seeded torch generators).

The reference is ComfyUI's own classes (comfy/text_encoders/qwen3vl.py `Qwen3VL`, its `Qwen3VLVisionModel` over
qwen35.py's `Qwen35VisionModel`, llama.py's `Llama2_` with `precompute_freqs_cis(interleaved_mrope=True)`,
qwen_vl.py's `process_qwen2vl_images` and `qwen2vl_mrope_position_ids`, sd1_clip.py's `process_tokens`), built at
tiny sizes by patching, while the model is built, `QWEN3VL_VISION["qwen3vl_4b"]` (hidden 32 [released 1024],
intermediate 64 [4096], depth 4 [24], DeepStack after blocks [0, 2] [5, 11, 17]) and `QWEN3VL_VISION_COMMON`
(4 heads [16] of width 8, so each axis of the 2-D RoPE has two frequencies; a position table of 64 = 8 x 8 entries
[2304 = 48 x 48]; patch 16, temporal patch 2 and merge 2 as released); the language model is
`Qwen3VL_4BConfig(**config_dict)` with vocab 256 [151936], hidden 128 [2560], intermediate 64 [9728], 4 layers
[36], 2 query heads [32] over 1 key/value head [8] of the released head_dim 128 (a class attribute; q width 256 !=
hidden 128, as 4096 != 2560), theta 5e6, eps 1e-6, rope_dims [24, 20, 20] interleaved, no lm_head; the merger's
out_hidden_size is the language model's width, as ComfyUI sets it. The weights are drawn in f32 (norm gains
1 + 0.1 N, biases 0.1 N, matrices N * gain / sqrt(fan in) with gain 2 on the tower's qkv and the language model's
q/k projections so attention is far from uniform, the token table N(0, 1), the position table 0.5 N), loaded into
ComfyUI's model strictly, and written in transformers' layout (`model.language_model.*`, `model.visual.*`), which
Kiln's Header reads under ComfyUI's names.

Writes (every tensor f32):
- weights.safetensors: the tiny model in transformers' layout (exactly transformers' Qwen3VLModel's names).
- io.safetensors: for each image case c in wide (100 x 150 -> 96 x 160 pixels: a 6 x 10 patch grid, 3 x 5 tokens:
  the position table is resampled down in rows and up in columns) and small (20 x 30 -> ComfyUI's min_pixels path,
  64 x 96: 4 x 6 patches, 2 x 3 tokens):
  `image.<c>` [1, H, W, 3] (ComfyUI's IMAGE layout, smooth random values in [0, 1]);
  `patches.<c>` [n, 1536] and `grid.<c>` [3] (t, h, w in patches): what Qwen3VL.preprocess_embed passes the tower
  (process_qwen2vl_images(image, patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3), recorded as called);
  `merged.<c>` [n / 4, 128] and `deepstack<k>.<c>` [n / 4, 128] (k = 0, 1): the tower's outputs;
  and for each prompt case p, `tap<t>.<p>` [1, N', 128] for t in TAPS: Llama2_.forward's intermediate_output=TAPS
  with final_layer_norm_intermediate=False (Krea 2's way): tap t is the input of layer t (the output of layer
  t - 1 with DeepStack feature t - 1 already added at the image tokens), tap 4 = the number of layers is the final
  norm's output (= Mage-Flow's / Boogu's layer_idx=-1 with the final norm, checked equal).
- cases.json: the prompt cases as lists of pieces, each a list of token ids (< 256) or {"image": "<c>"} (which
  stands for the image's n / 4 tokens in place of its one <|image_pad|>); the taps; and ComfyUI's M-RoPE position
  ids per case (t, h, w rows), which equal Qwen2.5-VL's rule (text counts up on all three; an image's tokens sit at
  its start plus (0, row, column); the text after it resumes at its start plus its larger side): checked here.

Cross-checks, report only (printed; max |diff| / max |ref|): transformers 5.24's Qwen3VLModel (eager) with the
same weights loaded strictly: the vision tower (merged and DeepStack outputs), and the prompts through
model(input_ids, pixel_values, image_grid_thw, mm_token_type_ids): last_hidden_state against tap 4, and its
hidden_states[t] against tap t (transformers records a layer's output before adding the DeepStack feature,
ComfyUI after, so for t = 1, 2 the feature is added to transformers' state before comparing).
"""

import json
import math
import os
import sys
import types

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/qwen3vl_vision")
SEED = 3030
KEY = "qwen3vl_4b"
LM_CONFIG = dict(vocab_size=256, hidden_size=128, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                 num_key_value_heads=1)
VISION = dict(hidden_size=32, intermediate_size=64, depth=4, deepstack_visual_indexes=[0, 2])
VISION_COMMON = dict(num_heads=4, num_position_embeddings=64)
LM, VISUAL = "model.language_model.", "model.visual."
VISION_START, VISION_END = 250, 251  # stand-ins for <|vision_start|> / <|vision_end|> in the tiny vocabulary
IMAGE_PAD = 151655
HF_IMAGE, HF_VIDEO = 252, 253  # transformers' image / video token ids inside the tiny vocabulary (report only)
IMAGES = {"wide": (100, 150), "small": (20, 30)}
CASES = {
    "one": [[5, 17, 200, VISION_START], {"image": "wide"}, [VISION_END, 42, 7, 100]],
    "two": [[3, VISION_START], {"image": "small"}, [VISION_END, 11, 12, VISION_START], {"image": "wide"},
            [VISION_END, 77, 9]],
    "text": [[5, 17, 200, 42, 7, 100, 3, 11]],
}
TAPS = [1, 2, 3, 4]
GAIN = 2.0


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


class Tiny:
    """While ComfyUI builds the model: the tiny vision sizes (QWEN3VL_VISION / QWEN3VL_VISION_COMMON)."""

    def __enter__(self):
        import comfy.text_encoders.qwen3vl as q3vl

        self.q3vl = q3vl
        self.saved = (q3vl.QWEN3VL_VISION[KEY], dict(q3vl.QWEN3VL_VISION_COMMON))
        q3vl.QWEN3VL_VISION[KEY] = dict(VISION)
        q3vl.QWEN3VL_VISION_COMMON.update(VISION_COMMON)
        return self

    def __exit__(self, *exc):
        self.q3vl.QWEN3VL_VISION[KEY] = self.saved[0]
        self.q3vl.QWEN3VL_VISION_COMMON.clear()
        self.q3vl.QWEN3VL_VISION_COMMON.update(self.saved[1])
        return False


def draw(net, g):
    """Every state_dict entry drawn in f32 (see the module doc)."""
    norms = {n for n, m in net.named_modules()
             if isinstance(m, torch.nn.LayerNorm) or type(m).__name__ in ("RMSNorm", "LayerNorm")}
    out = {}
    for name, p in net.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        normal = torch.randn(p.shape, generator=g)
        if name == "model.embed_tokens.weight":
            v = normal
        elif name == "visual.pos_embed.weight":
            v = 0.5 * normal
        elif owner in norms and name.endswith(".weight"):
            v = 1.0 + 0.1 * normal
        elif name.endswith("bias"):
            v = 0.1 * normal
        else:
            gain = GAIN if any(k in name for k in (".qkv.", ".q_proj.", ".k_proj.")) else 1.0
            v = gain * normal / math.sqrt(p[0].numel())
        out[name] = v.float().contiguous()
    return out


def transformers_layout(weights):
    return {(LM + k[len("model."):] if k.startswith("model.") else VISUAL + k[len("visual."):]): v
            for k, v in weights.items()}


def transformers_model(stored):
    """Report only: transformers' Qwen3VLModel with the stored weights loaded strictly."""
    from transformers import Qwen3VLConfig, Qwen3VLModel

    config = Qwen3VLConfig(
        text_config=dict(**LM_CONFIG, head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=4096,
                         rope_parameters={"rope_theta": 5e6, "rope_type": "default", "mrope_section": [24, 20, 20],
                                          "mrope_interleaved": True}),
        vision_config=dict(**VISION, **VISION_COMMON, out_hidden_size=LM_CONFIG["hidden_size"], patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2),
        image_token_id=HF_IMAGE, video_token_id=HF_VIDEO, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, attn_implementation="eager",
    )
    model = Qwen3VLModel(config).eval()
    model.load_state_dict({k[len("model."):]: v for k, v in stored.items()}, strict=True)
    return model


def main():
    import_comfyui(node_modules=True)
    import comfy.ops
    import comfy.sd1_clip
    import comfy.text_encoders.qwen3vl as q3vl
    import comfy.text_encoders.qwen_vl as qwen_vl

    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    with Tiny():
        te = q3vl._make_qwen3vl_model(KEY)(dict(LM_CONFIG), torch.float32, "cpu", comfy.ops.manual_cast).eval()
    assert te.model.config.head_dim == 128 and te.model.config.rope_dims == [24, 20, 20]
    assert (te.visual.num_heads, te.visual.num_grid_per_side, te.visual.deepstack_visual_indexes) == (4, 8, [0, 2])
    weights = draw(te, g)
    stored = transformers_layout(weights)
    save_file(stored, f"{OUT}/weights.safetensors")
    stored = load_file(f"{OUT}/weights.safetensors")
    te.load_state_dict({("model." + k[len(LM):] if k.startswith(LM) else "visual." + k[len(VISUAL):]): v
                        for k, v in stored.items()}, strict=True)
    print(f"{len(stored)} tensors, {sum(v.numel() for v in stored.values())} values")

    # process_qwen2vl_images as Qwen3VL.preprocess_embed calls it, recorded.
    calls = []
    process = qwen_vl.process_qwen2vl_images

    def recording(*args, **kwargs):
        out = process(*args, **kwargs)
        calls.append((kwargs, out))
        return out

    qwen_vl.process_qwen2vl_images = recording
    hf = transformers_model(stored)
    io, images = {}, {}
    image_g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for c, (h, w) in IMAGES.items():
            image = make_image(h, w, image_g)
            calls.clear()
            merged, extra = te.preprocess_embed({"type": "image", "data": image}, "cpu")
            (kwargs, (patches, grid)), = calls
            assert kwargs == dict(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3), kwargs
            assert torch.equal(extra["grid"], grid) and len(extra["deepstack"]) == 2
            images[c] = image
            io.update({f"image.{c}": image, f"patches.{c}": patches.contiguous(), f"grid.{c}": grid[0].float(),
                       f"merged.{c}": merged.contiguous()})
            for k, d in enumerate(extra["deepstack"]):
                io[f"deepstack{k}.{c}"] = d.contiguous()
            theirs = hf.visual(patches, grid_thw=grid)
            errs = [rel(theirs.pooler_output, merged)] + [rel(t, d) for t, d in
                                                          zip(theirs.deepstack_features, extra["deepstack"])]
            print(f"vision {c}: image {h}x{w} -> grid {grid[0].tolist()}, merged {tuple(merged.shape)} "
                  f"max {float(merged.abs().max()):.3f}, deepstack max "
                  f"{[round(float(d.abs().max()), 3) for d in extra['deepstack']]}; transformers rel err "
                  f"{', '.join(f'{e:.2e}' for e in errs)}")

        captured = []
        compute = te.model.compute_freqs_cis
        te.model.compute_freqs_cis = lambda pos, dev: (captured.append(pos.clone()), compute(pos, dev))[1]
        fake_clip = types.SimpleNamespace(special_tokens={"pad": 151643}, transformer=te)
        positions = {}
        for name, pieces in CASES.items():
            comfy_tokens, ids, grids, expected, at = [], [], [], [], 0
            for piece in pieces:
                if isinstance(piece, dict):
                    c = piece["image"]
                    n = io[f"merged.{c}"].shape[0]
                    rows, cols = int(io[f"grid.{c}"][1]) // 2, int(io[f"grid.{c}"][2]) // 2
                    comfy_tokens.append({"type": "image", "data": images[c]})
                    ids += [IMAGE_PAD] * n
                    grids.append(io[f"grid.{c}"].long()[None])
                    expected += [[at, at + r, at + q] for r in range(rows) for q in range(cols)]
                    at += max(rows, cols)
                else:
                    comfy_tokens += piece
                    ids += piece
                    expected += [[p, p, p] for p in range(at, at + len(piece))]
                    at += len(piece)
            embeds, mask, _, embeds_info = comfy.sd1_clip.SDClipModel.process_tokens(fake_clip, [comfy_tokens], "cpu")
            assert embeds.shape[1] == len(ids) and bool(mask.all())
            captured.clear()
            # (Its forward writes into `embeds` in place, hence the copies.) As ComfyUI's encoder runs it, with
            # process_tokens' all-ones attention mask; Krea 2's taps, and Mage-Flow's normed last layer.
            _, taps = te(None, attention_mask=mask, embeds=embeds.clone(), embeds_info=embeds_info,
                         intermediate_output=list(TAPS), final_layer_norm_intermediate=False)
            _, last = te(None, attention_mask=mask, embeds=embeds.clone(), embeds_info=embeds_info,
                         intermediate_output=-1, final_layer_norm_intermediate=True)
            unmasked = te(None, embeds=embeds.clone(), embeds_info=embeds_info, intermediate_output=list(TAPS),
                          final_layer_norm_intermediate=False)[1]
            assert taps.shape == (1, len(TAPS), len(ids), LM_CONFIG["hidden_size"])
            assert torch.equal(last, taps[:, -1]), "Mage-Flow's state is the last tap"
            assert rel(unmasked, taps) < 1e-6
            if captured[0] is None or captured[0].shape[0] == 1:
                pos = torch.arange(len(ids))[None].repeat(3, 1)
            else:
                pos = captured[0].long()
            assert pos.T.tolist() == expected, name
            positions[name] = pos.tolist()
            for j, t in enumerate(TAPS):
                io[f"tap{t}.{name}"] = taps[:, j].contiguous()

            # Report only: transformers on the same prompt.
            input_ids = torch.tensor([[HF_IMAGE if i == IMAGE_PAD else i for i in ids]])
            kw = {}
            if grids:
                kw = dict(pixel_values=torch.cat([io[f"patches.{p['image']}"] for p in pieces if isinstance(p, dict)]),
                          image_grid_thw=torch.cat(grids), mm_token_type_ids=(input_ids == HF_IMAGE).int())
            out = hf(input_ids=input_ids, output_hidden_states=True, **kw)
            errs = [f"last {rel(out.last_hidden_state, taps[:, -1]):.2e}"]
            visual = input_ids[0] == HF_IMAGE
            deepstack = [torch.cat([io[f"deepstack{k}.{p['image']}"] for p in pieces if isinstance(p, dict)])
                         for k in range(2)] if grids else []
            for j, t in enumerate(TAPS[:-1]):
                state = out.hidden_states[t].clone()
                if t - 1 < len(deepstack):
                    state[0, visual] += deepstack[t - 1]
                errs.append(f"tap {t} {rel(state, taps[:, j]):.2e}")
            print(f"prompt {name}: {len(ids)} tokens, taps max {float(taps.abs().max()):.3f}; transformers rel err "
                  f"{', '.join(errs)}")
            print("    positions (t, h, w):", pos.tolist())

    qwen_vl.process_qwen2vl_images = process
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        f.write(json.dumps({"cases": CASES, "taps": TAPS, "positions": positions}) + "\n")
    total = sum(os.path.getsize(f"{OUT}/{n}") for n in os.listdir(OUT))
    print(f"fixtures: {total} bytes")
    assert total < 5_000_000


if __name__ == "__main__":
    main()
