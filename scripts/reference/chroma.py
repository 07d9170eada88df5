"""Fixtures for Chroma (engine/models/tests/fixtures/chroma/): its DiT (ComfyUI's comfy/ldm/chroma, a FLUX.1 whose
modulations all come from one "distilled guidance" MLP) and its T5-XXL prompt layout (CLIPLoader type `chroma`:
ComfyUI's PixArt tokenizer, with T5TokenizerOptions' minimum padding and length).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/chroma.py

ComfyUI 0f1fa67a is the reference (comfy/ldm/chroma/model.py and layers.py, model_base.Chroma,
supported_models.Chroma, text_encoders/pixart_t5.py, sd1_clip.py). ComfyUI's detection hard-codes the released
widths of the guidance MLP (in 64, hidden 5120, out 3072, 5 layers), so the tiny model is built directly; the
stored names are the released file's (`.scale` for the RMS norms' gains, which ComfyUI's
`process_unet_state_dict` renames to `.weight`), checked by loading them strictly.

Writes:
- weights.safetensors: a tiny random Chroma DiT, bf16: hidden 128 = 1 head x 128 (RoPE axes 16, 56, 56, theta
  10000), MLP ratio 4, 2 double + 2 single blocks without modulation weights, 2x2 patches of 16 channels, text
  width 32, qkv biases, the guidance MLP in 64 -> 48 hidden (2 layers) -> 128. Seeded; norm gains 1 + 0.2 N,
  biases 0.1 N, weights N / sqrt(fan-in).
- io.safetensors (f32), for each case c: `x.<c>` [B, 16, h, w], `sigma.<c>` [B], `guidance.<c>` [B] (Chroma's
  default 0 where a conditioning sets none), `context.<c>` [B, N, 32], `out.<c>` = ComfyUI's output [B, 16, h, w].
  Cases: even (B 1, 8x6, N 7, sigma 0.7, guidance 0), odd (B 2, 6x10, N 5, sigmas 0.9 and 0.25, guidances 0 and
  3), ragged (B 1, 5x7 padded circularly to 6x8, N 4, sigma 0.5, guidance 0).
- tokens.json: ComfyUI's PixArtTokenizer (the T5 tokenizer ComfyUI ships) for prompts with and without weights,
  and with T5TokenizerOptions' `t5xxl_min_padding` / `t5xxl_min_length`: per case the (id, weight) pairs, and the
  empty prompt's ids that weighting moves from (PixArt's `gen_empty_tokens`: pads only, no end token).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/chroma"
CONFIG = dict(in_channels=64, out_channels=64, context_in_dim=32, hidden_size=128, mlp_ratio=4.0, num_heads=1,
              depth=2, depth_single_blocks=2, axes_dim=[16, 56, 56], theta=10000, patch_size=2, qkv_bias=True,
              in_dim=64, out_dim=128, hidden_dim=48, n_layers=2, txt_ids_dims=[], vec_in_dim=None)
PROMPTS = {
    "plain": ("a tiger's eye, close up", {}),
    "weighted": ("a (tiger:1.3) in (the snow:0.8)", {}),
    "min_padding": ("a tiger", {"t5xxl_min_padding": 3}),
    "min_length": ("a (tiger:1.2)", {"t5xxl_min_length": 12}),
    "both": ("a tiger", {"t5xxl_min_padding": 2, "t5xxl_min_length": 4}),
    "empty": ("", {}),
}


def released_name(name):
    """The released file's names: RMS norm gains as `.scale`."""
    if name.endswith(".weight") and ("_norm." in name or ".norms." in name):
        return name[: -len(".weight")] + ".scale"
    return name


def main():
    import_comfyui()
    import comfy.ops
    from comfy.ldm.chroma.model import Chroma

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(47)
    model = Chroma(**CONFIG, operations=comfy.ops.disable_weight_init).eval()
    stored = randomize(model)
    save_file({released_name(k): v for k, v in stored.items()}, f"{OUT}/weights.safetensors")
    # ComfyUI's own renaming of the released names loads strictly into the module.
    import comfy.supported_models
    renamed = comfy.supported_models.Chroma.process_unet_state_dict(
        None, {released_name(k): v.float() for k, v in stored.items()})
    model.load_state_dict(renamed, strict=True)

    g = torch.Generator().manual_seed(9)
    cases = {"even": (1, 8, 6, 7, [0.7], [0.0]), "odd": (2, 6, 10, 5, [0.9, 0.25], [0.0, 3.0]),
             "ragged": (1, 5, 7, 4, [0.5], [0.0])}
    io = {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas, guidances) in cases.items():
            io[f"x.{name}"] = torch.randn(b, 16, h, w, generator=g)
            io[f"context.{name}"] = torch.randn(b, n, 32, generator=g)
            io[f"sigma.{name}"] = torch.tensor(sigmas)
            io[f"guidance.{name}"] = torch.tensor(guidances)
            io[f"out.{name}"] = model(io[f"x.{name}"], io[f"sigma.{name}"], io[f"context.{name}"],
                                      io[f"guidance.{name}"], transformer_options={})
            print(f"{name}: out {tuple(io[f'out.{name}'].shape)} max {float(io[f'out.{name}'].abs().max()):.3f}")
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    tokens_fixture()


def tokens_fixture():
    import comfy.text_encoders.pixart_t5 as pixart
    from comfy.sd1_clip import gen_empty_tokens

    tokenizer = pixart.PixArtTokenizer()
    out = {}
    for name, (prompt, options) in PROMPTS.items():
        tokens = tokenizer.tokenize_with_weights(prompt, tokenizer_options=options)["t5xxl"]
        assert len(tokens) == 1, name
        pairs = [[int(t), float(w)] for t, w in tokens[0]]
        empty = gen_empty_tokens({"pad": 0}, len(pairs))
        out[name] = {"prompt": prompt, "options": options, "tokens": pairs, "empty": [int(t) for t in empty]}
        print(name, pairs)
    with open(f"{OUT}/tokens.json", "w") as f:
        json.dump(out, f, indent=None)
        f.write("\n")


if __name__ == "__main__":
    main()
