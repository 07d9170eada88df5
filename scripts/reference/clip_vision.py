"""Fixtures for Kiln's CLIP vision towers (ComfyUI's CLIPVisionLoader / CLIPVisionEncode) and FLUX.1 Redux
(StyleModelLoader / StyleModelApply), in engine/models/tests/fixtures/clip_vision/.

Run from the repository root:
    COMFYUI_DIR=... target/reference-venv/bin/python scripts/reference/clip_vision.py

The reference is ComfyUI itself at 0f1fa67a: comfy/clip_vision.py's ClipVisionModel (built from a tiny config
dict, as its detection picks a released config only for full-depth files) with its clip_preprocess (bicubic
resize with antialiasing, crop "center" or "none", rounding to 8 bits, mean/std normalisation), and nodes.py's
StyleModelApply over comfy/ldm/flux/redux.py's ReduxImageEncoder. transformers' CLIPVisionModelWithProjection and
SiglipVisionModel build the random weights in the Hugging Face `vision_model.*` layout ComfyUI's files have and
are compared against for the report only (SigLIP's LayerNorms differ on purpose: ComfyUI uses torch's default
eps 1e-5 where transformers' config says 1e-6).

Writes:
- clip.safetensors (f16, as the released clip_vision_h): a tiny CLIP ViT with a class token, pre-LayerNorm,
  3 layers 64 wide in 16 heads of 4 (ComfyUI's configs all have 16 heads), MLP 128 with exact GELU (as ViT-H),
  patch 14, image 42 (3 x 3 patches + the class token = 10 positions), post-LayerNorm and a bias-free
  visual_projection to 32.
- siglip.safetensors (f16): a tiny SigLIP tower, no class token, a patch embedding with bias, no pre-LayerNorm,
  3 layers 64 wide in 16 heads of 4, MLP 128 with tanh-approximated GELU, patch 14, image 42 (9 positions), the
  post-LayerNorm over every token, and transformers' attention-pooling head (`vision_model.head.*`), which the
  released file also carries and ComfyUI does not read.
- redux.safetensors (f16): a tiny ReduxImageEncoder, redux_up 64 -> 96 and redux_down 96 -> 32 (SigLIP's width
  in, the tiny FLUX.1 DiT's text width 32 out; the release's are 1152 -> 12288 -> 4096).
- io.safetensors (f32), for each image case c (`wide` 50 x 70 and batch 2; `tall` 61 x 40; `small` 30 x 20,
  upscaled; `exact` 42 x 42, not resized), each tower t in clip, siglip and crop k in center, none:
  `image.<c>` [B, H, W, 3] in [0, 1] (ComfyUI's IMAGE);
  `pixels.<t>.<c>.<k>` [B, 3, 42, 42] = clip_preprocess with the tower's mean and std;
  `last.<t>.<c>.<k>`, `penultimate.<t>.<c>.<k>` [B, N, 64] and `embeds.<t>.<c>.<k>` (CLIP [B, 32], SigLIP
  [B, 9, 64]) = encode_image's last_hidden_state, penultimate_hidden_states, image_embeds;
  and the Redux case: `cond` [1, 5, 32] and `pooled` [1, 64] (a FLUX.1 prompt), `redux.<s>` = StyleModelApply's
  conditioning for the SigLIP output of `wide` (crop center) at s in multiply_0.7 ([1, 5 + 2 x 9, 32]) and
  attn_bias_1 (strength 1: no attention mask, the tokens appended unscaled); its pooled output is unchanged.
"""

import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/clip_vision"
WIDTH, HEADS, MLP, LAYERS, PATCH, SIZE, PROJECTION = 64, 16, 128, 3, 14, 42, 32
REDUX_HIDDEN, TEXT = 96, 32
IMAGES = {"wide": (2, 50, 70), "tall": (1, 61, 40), "small": (1, 30, 20), "exact": (1, 42, 42)}
QK_GAIN = 2.0


def rel(a, b):
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def make_image(b, h, w, g):
    """[b, h, w, 3] in [0, 1]: per channel 0.5 + four random plane waves + a little noise."""
    y = torch.arange(h, dtype=torch.float64)[:, None] / h
    x = torch.arange(w, dtype=torch.float64)[None, :] / w
    images = []
    for _ in range(b):
        channels = []
        for _ in range(3):
            c = torch.full((h, w), 0.5, dtype=torch.float64)
            for _ in range(4):
                fy, fx, phase, amp = torch.rand(4, generator=g, dtype=torch.float64).tolist()
                c += (0.08 + 0.12 * amp) * torch.sin(2 * math.pi * ((8 * fy - 4) * y + (8 * fx - 4) * x + phase))
            c += 0.05 * torch.randn(h, w, generator=g, dtype=torch.float64)
            channels.append(c)
        images.append(torch.stack(channels, -1))
    return torch.stack(images).clamp(0, 1).float().contiguous()


def randomise(model, prefix=""):
    """Weights drawn so every part matters: norm weights 1 + 0.2 randn, biases 0.2 randn, embeddings randn,
    matrices randn * gain / sqrt(fan in) (gain 2 on q and k, so attention is far from uniform). Returns the f16
    state dict (names under `prefix`) and copies its values back into the model."""
    stored = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                value = 0.2 * torch.randn_like(p)
            elif p.ndim == 1 and "norm" in name:
                value = 1.0 + 0.2 * torch.randn_like(p)
            elif "position_embedding" in name or "class_embedding" in name or "probe" in name:
                value = torch.randn_like(p)
            else:
                gain = QK_GAIN if (".q_proj." in name or ".k_proj." in name) else 1.0
                value = gain * torch.randn_like(p) / p[0].numel() ** 0.5
            s = value.to(torch.float16)
            p.copy_(s.float())
            stored[prefix + name] = s.contiguous()
    return stored


def build_clip():
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(hidden_size=WIDTH, intermediate_size=MLP, num_hidden_layers=LAYERS,
                              num_attention_heads=HEADS, patch_size=PATCH, image_size=SIZE,
                              projection_dim=PROJECTION, hidden_act="gelu", layer_norm_eps=1e-5,
                              attn_implementation="eager")
    model = CLIPVisionModelWithProjection(config).eval()
    return model, randomise(model)


def build_siglip():
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(hidden_size=WIDTH, intermediate_size=MLP, num_hidden_layers=LAYERS,
                                num_attention_heads=HEADS, patch_size=PATCH, image_size=SIZE,
                                hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, attn_implementation="eager")
    model = SiglipVisionModel(config).eval()
    # transformers 5 names SigLIP's parameters without the `vision_model.` the released file has.
    names = [n for n, _ in model.named_parameters()]
    return model, randomise(model, "" if names[0].startswith("vision_model.") else "vision_model.")


def comfy_tower(stored, model_type):
    import comfy.clip_vision

    config = {"num_channels": 3, "hidden_size": WIDTH, "image_size": SIZE, "intermediate_size": MLP,
              "model_type": model_type, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
              "patch_size": PATCH}
    if model_type == "clip_vision_model":
        config.update(hidden_act="gelu", projection_dim=PROJECTION)
    else:
        config.update(hidden_act="gelu_pytorch_tanh", image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    tower = comfy.clip_vision.ClipVisionModel(config)
    missing, _ = tower.load_sd({k: v.clone() for k, v in stored.items()})
    assert not missing, missing
    return tower


def main():
    import_comfyui(node_modules=True)
    import comfy.ldm.flux.redux
    import comfy.sd
    import nodes

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(2026)
    hf_clip, clip = build_clip()
    hf_siglip, siglip = build_siglip()
    assert "vision_model.embeddings.class_embedding" in clip and "visual_projection.weight" in clip
    assert "vision_model.embeddings.patch_embedding.bias" in siglip and any(".head." in k for k in siglip)
    save_file(clip, f"{OUT}/clip.safetensors")
    save_file(siglip, f"{OUT}/siglip.safetensors")
    print(f"clip: {len(clip)} tensors; siglip: {len(siglip)} tensors, head: {[k for k in siglip if '.head.' in k]}")

    towers = {"clip": comfy_tower(clip, "clip_vision_model"), "siglip": comfy_tower(siglip, "siglip_vision_model")}
    io = {}
    g = torch.Generator().manual_seed(7)
    outputs = {}
    with torch.no_grad():
        for c, (b, h, w) in IMAGES.items():
            image = make_image(b, h, w, g)
            io[f"image.{c}"] = image
            for t, tower in towers.items():
                for k in ("center", "none"):
                    out = tower.encode_image(image, crop=k == "center")
                    pixels = comfy.clip_model.clip_preprocess(image, size=SIZE, mean=tower.image_mean,
                                                              std=tower.image_std, crop=k == "center").float()
                    io[f"pixels.{t}.{c}.{k}"] = pixels.contiguous()
                    io[f"last.{t}.{c}.{k}"] = out["last_hidden_state"].float().contiguous()
                    io[f"penultimate.{t}.{c}.{k}"] = out["penultimate_hidden_states"].float().contiguous()
                    io[f"embeds.{t}.{c}.{k}"] = out["image_embeds"].float().clone().contiguous()
                    outputs[(t, c, k)] = out
                    # Report only: transformers on ComfyUI's pixels.
                    if t == "clip":
                        hf = hf_clip(pixel_values=pixels, output_hidden_states=True)
                        hf_last, hf_embeds = hf.last_hidden_state, hf.image_embeds
                    else:
                        hf = hf_siglip(pixel_values=pixels, output_hidden_states=True)
                        hf_last, hf_embeds = hf.last_hidden_state, hf.last_hidden_state
                    print(f"{t} {c} {k}: pixels {tuple(pixels.shape)}, last {tuple(out['last_hidden_state'].shape)} "
                          f"max {float(out['last_hidden_state'].abs().max()):.3f}, embeds "
                          f"{tuple(out['image_embeds'].shape)}; transformers' last differs by "
                          f"{rel(hf_last, out['last_hidden_state']):.2e}, embeds by "
                          f"{rel(hf_embeds, out['image_embeds']):.2e}, penultimate by "
                          f"{rel(hf.hidden_states[-2], out['penultimate_hidden_states']):.2e}")

        # Redux on the SigLIP output of `wide`.
        redux = comfy.ldm.flux.redux.ReduxImageEncoder(redux_dim=WIDTH, txt_in_features=TEXT)
        assert redux.redux_up.weight.shape == (3 * TEXT, WIDTH) and 3 * TEXT == REDUX_HIDDEN
        stored = randomise(redux)
        save_file(stored, f"{OUT}/redux.safetensors")
        redux.load_state_dict({k: v.float() for k, v in stored.items()})
        style = comfy.sd.StyleModel(redux)
        cond = torch.randn(1, 5, TEXT, generator=g)
        pooled = torch.randn(1, 64, generator=g)
        io["cond"], io["pooled"] = cond, pooled
        vision = outputs[("siglip", "wide", "center")]
        for name, strength, kind in (("multiply_0.7", 0.7, "multiply"), ("attn_bias_1", 1.0, "attn_bias")):
            (out,) = nodes.StyleModelApply().apply_stylemodel([[cond, {"pooled_output": pooled}]], style, vision,
                                                              strength, kind)
            [(txt, keys)] = out
            assert torch.equal(keys["pooled_output"], pooled) and "attention_mask" not in keys
            io[f"redux.{name}"] = txt.float().contiguous()
            print(f"redux {name}: {tuple(txt.shape)}, appended max {float(txt[:, 5:].abs().max()):.3f}")

    save_file(io, f"{OUT}/io.safetensors")
    sizes = {f: os.path.getsize(f"{OUT}/{f}") for f in os.listdir(OUT)}
    print("wrote", sizes)


if __name__ == "__main__":
    main()
