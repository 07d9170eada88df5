"""Fixtures for LongCat-Image (engine/models/tests/fixtures/longcat_image/): its DiT (ComfyUI's FLUX.1 code with
LongCat's config and RoPE placement) and its text encoder (ComfyUI's LongCat-Image tokenizer and Qwen2.5-VL
encoding: the prompt padded to 512 tokens, quoted text tokenised a character at a time, the template's prefix and
suffix cut off).

Run from the repository root (after flux.py and qwen25vl_vision.py, whose weights it reuses):
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/longcat_image.py

ComfyUI 0f1fa67a is the reference throughout (comfy/ldm/flux/model.py, model_base.LongCatImage,
supported_models.LongCatImage, model_detection's `context_in_dim == 3584 and vec_in_dim is None` rule,
text_encoders/longcat_image.py, llama.py's Qwen25_7BVLI, sd1_clip.py). diffusers' LongCatImageTransformer2DModel
(0.42.1) is the cross-check of the DiT: on the same weights, renamed to its layout, with the ids ComfyUI builds,
it must agree within 1e-5 relative. diffusers' pipeline encodes the prompt differently from ComfyUI (transformers
positions the padded prompt by its attention mask, ComfyUI by the token index), so the encoder's reference is
ComfyUI's alone.

Writes:
- txt_in.safetensors: `txt_in.weight` [128, 3584] and `txt_in.bias` [128] (bf16, seeded). With the FLUX.1
  fixture's weights.safetensors minus `guidance_in.*` and `vector_in.*` it makes a tiny LongCat-Image DiT (hidden
  128, 1 head, 2 double + 2 single blocks): ComfyUI detects that file as `LongCatImage` (checked here).
- io.safetensors (f32):
  - DiT cases c in t2i (B 2, 8x6 latent, N 9 text tokens, sigmas 0.9 and 0.3), ragged (B 1, 5x7 latent, N 4,
    sigma 0.6): `x.<c>`, `sigma.<c>`, `context.<c>` [B, N, 3584], `out.<c>` = the model's output v
    [B, 16, h, w]; `ref.1` [1, 16, 6, 4], `ref.2` [1, 16, 4, 6] and `out.refs_index`, `out.refs_offset`: the
    t2i inputs with both references (repeated to the batch), placed by `index` (as
    FluxKontextMultiReferenceLatentMethod sets it in the Edit template) and by FLUX.1's default `offset`.
  - Encoder cases e: `hidden.<e>` = ComfyUI's conditioning [1, M, 256] from LongCatImageTEModel on the tiny
    Qwen2.5-VL of qwen25vl_vision/weights.safetensors (vocabulary 1024: the token embedding is looked up at
    id % 1024, and Kiln's test feeds the model the same ids), the image of case `edit` being that fixture's
    `image.wide`.
- encoder.json: per encoder case the prompt, whether it has the image, the ids ComfyUI's tokenizer gives
  (an image as 151655, `<|image_pad|>`).
- tokenizer.json: ComfyUI's LongCatImageTokenizer ids for a set of prompts (text-to-image and edit templates,
  quotes in ASCII and Unicode, word-internal apostrophes, an empty prompt, one longer than 512 tokens, one
  already templated).
"""

import functools
import json
import os
import sys
import types

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from flux import CONFIG as FLUX_CONFIG, grid_ids, pack, to_diffusers, unpack  # noqa: E402
from qwen25vl_vision import TEXT, comfy_vision_tower  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/longcat_image"
FLUX_WEIGHTS = "engine/models/tests/fixtures/flux/weights.safetensors"
VISION_FIXTURE = "engine/models/tests/fixtures/qwen25vl_vision"
TEXT_DIM = 3584
IMAGE_PAD = 151655
CONFIG = {**FLUX_CONFIG, "context_in_dim": TEXT_DIM, "vec_in_dim": None, "guidance_embed": False,
          "txt_ids_dims": [1, 2]}
PROMPTS = {
    "plain": "A photo of a cat on a red sofa, soft light.",
    "quotes": "A sign that says 'OPEN 24h' and a banner reading \"Hello, world\" in neon.",
    "unicode_quotes": "A poster with \u201c\u9f99\u732b\u201d and \u2018ok\u2019 on it.",
    # One word with an inner apostrophe (twice): ComfyUI hides such words behind placeholders that are prefixes
    # of each other, so two different ones come back garbled in an order Python's string hashing decides.
    "apostrophe": "The cat's toy is 'lost', the cat's friend said.",
    "empty": "",
    "weights": "(masterpiece:1.2), a \\(cat\\) embedding:foo",
    "templated": "<|im_start|>system\nYou draw.<|im_end|>\n<|im_start|>user\nA dog.<|im_end|>\n",
    "long": " ".join(f"word{i}" for i in range(400)),
}
EDIT_PROMPTS = {"edit": "Make the 'sky' orange.", "edit_empty": ""}


def main():
    import_comfyui(node_modules=True)
    os.makedirs(OUT, exist_ok=True)
    io = {}
    dit_fixture(io)
    encoder_fixture(io)
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    for k, v in io.items():
        print(f"{k:20} {str(tuple(v.shape)):18} max {float(v.abs().max()):.4f}")


def comfy_rope(context_len):
    """What model_base.LongCatImage._apply_model adds to the transformer options (the text length as the rows'
    and columns' shift, 1 on the index axis)."""
    return {"rope_options": {"shift_t": 1.0, "shift_y": float(context_len), "shift_x": float(context_len)}}


def dit_fixture(io):
    import comfy.model_detection
    import comfy.ops
    from comfy.ldm.flux.model import Flux

    flux = load_file(FLUX_WEIGHTS)
    base = {k: v for k, v in flux.items() if not k.startswith(("guidance_in.", "vector_in."))}
    torch.manual_seed(41)
    ops = comfy.ops.disable_weight_init
    model = Flux(**CONFIG, operations=ops).eval()
    txt_in = randomize(model.txt_in, seed=43)
    save_file({f"txt_in.{k}": v for k, v in txt_in.items()}, f"{OUT}/txt_in.safetensors")
    stored = {**base, **{f"txt_in.{k}": v for k, v in txt_in.items()}}
    comfy_names = {k.replace("_norm.scale", "_norm.weight"): v.float() for k, v in stored.items()}
    model.load_state_dict(comfy_names, strict=True)

    # ComfyUI's own loader must see LongCat-Image in that file, and build this config.
    config = comfy.model_detection.model_config_from_unet(dict(stored), "")
    assert type(config).__name__ == "LongCatImage", type(config).__name__
    assert config.unet_config["txt_ids_dims"] == [1, 2] and config.unet_config["vec_in_dim"] is None
    loaded = config.get_model(dict(stored), "", device="cpu")
    # (ComfyUI's load_diffusion_model renames the released `_norm.scale` to `_norm.weight` before this.)
    loaded.load_model_weights({k: v.clone() for k, v in comfy_names.items()}, "")

    g = torch.Generator().manual_seed(5)
    cases = {"t2i": (2, 8, 6, 9, [0.9, 0.3]), "ragged": (1, 5, 7, 4, [0.6])}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas) in cases.items():
            io[f"x.{name}"] = torch.randn(b, 16, h, w, generator=g)
            io[f"context.{name}"] = torch.randn(b, n, TEXT_DIM, generator=g)
            io[f"sigma.{name}"] = torch.tensor(sigmas)
        io["ref.1"] = torch.randn(1, 16, 6, 4, generator=g)
        io["ref.2"] = torch.randn(1, 16, 4, 6, generator=g)
        refs = [io["ref.1"].repeat(2, 1, 1, 1), io["ref.2"].repeat(2, 1, 1, 1)]
        for name in cases:
            io[f"out.{name}"] = call(model, io, name)
        for method in ["index", "offset"]:
            io[f"out.refs_{method}"] = call(model, io, "t2i", refs, method)
        # FLUX.1's default reference method is `offset`.
        assert torch.equal(call(model, io, "t2i", refs), io["out.refs_offset"])

        # The loaded model's _apply_model (ModelSamplingFlux: input x, timestep sigma, denoised x - v sigma) adds
        # the same RoPE options itself.
        loaded.diffusion_model.float()
        x, sigma, context = io["x.t2i"], io["sigma.t2i"], io["context.t2i"]
        denoised = loaded._apply_model(x, sigma, c_crossattn=context, transformer_options={})
        want = x - io["out.t2i"] * sigma.view(-1, 1, 1, 1)
        err = float((denoised - want).abs().max() / want.abs().max())
        print(f"ComfyUI's LongCatImage._apply_model against the direct call: {err:.2e}")
        assert err < 1e-5
        cross_check(stored, io, refs)


def call(model, io, case, refs=None, method=None):
    kwargs = {} if method is None else {"ref_latents_method": method}
    context = io[f"context.{case}"]
    return model(io[f"x.{case}"], io[f"sigma.{case}"], context, y=None, guidance=None, ref_latents=refs,
                 transformer_options=comfy_rope(context.shape[1]), **kwargs)


def cross_check(stored, io, refs):
    """diffusers' LongCatImageTransformer2DModel on the same weights: text ids (0, l, l), the image's
    (1, N + row, N + col), the references' index and offsets on top of ComfyUI's."""
    from diffusers import LongCatImageTransformer2DModel

    state = to_diffusers({k.replace("_norm.scale", "_norm.weight"): v.float() for k, v in stored.items()})
    state = {k.replace("time_text_embed.timestep_embedder", "time_embed.timestep_embedder"): v
             for k, v in state.items()}
    net = LongCatImageTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                                         attention_head_dim=128, num_attention_heads=1,
                                         joint_attention_dim=TEXT_DIM).eval()
    result = net.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    for module in net.modules():
        if isinstance(module, torch.nn.RMSNorm):
            module.eps = None  # ComfyUI's: torch's default, f32 machine epsilon

    def run(case, refs=(), ref_ids=()):
        x, context = io[f"x.{case}"], io[f"context.{case}"]
        n = context.shape[1]
        b, c, h, w = x.shape
        ph, pw = -h % 2, -w % 2
        padded = torch.nn.functional.pad(x, (0, pw, 0, ph), mode="circular")
        tokens = torch.cat([pack(padded)] + [pack(r) for r in refs], dim=1)
        img_ids = torch.cat([grid_ids((h + ph) // 2, (w + pw) // 2, index=1, row0=n, col0=n)] + list(ref_ids))
        l = torch.arange(n).float()
        txt_ids = torch.stack([torch.zeros(n), l, l], dim=-1)
        v = net(tokens, context, io[f"sigma.{case}"], img_ids, txt_ids, return_dict=False)[0]
        k = (h + ph) * (w + pw) // 4
        return unpack(v[:, :k], 16, h + ph, w + pw)[:, :, :h, :w]

    n = io["context.t2i"].shape[1]
    # index: the k-th reference at index 1 + k; offset: index 2, ref.2 below ref.1 (3 tokens down); both shifted.
    index_ids = [grid_ids(3, 2, index=2, row0=n, col0=n), grid_ids(2, 3, index=3, row0=n, col0=n)]
    offset_ids = [grid_ids(3, 2, index=2, row0=n, col0=n), grid_ids(2, 3, index=2, row0=n + 3, col0=n)]
    checks = {"t2i": run("t2i"), "ragged": run("ragged"), "refs_index": run("t2i", refs, index_ids),
              "refs_offset": run("t2i", refs, offset_ids)}
    for case, v in checks.items():
        want = io[f"out.{case}"]
        rel = float((v - want).abs().max() / want.abs().max())
        print(f"diffusers vs ComfyUI, {case:12} relative {rel:.2e}")
        assert rel < 1e-5, case


class ModuloEmbedding(torch.nn.Module):
    """The tiny model's embedding looked up at id % its vocabulary (the real ids reach 151655)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.weight = inner.weight

    def forward(self, x, out_dtype=None):
        return self.inner(x % self.inner.weight.shape[0], out_dtype=out_dtype)


def encoder_fixture(io):
    import comfy.ops
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.longcat_image as longcat

    tokenizer = longcat.LongCatImageTokenizer()
    image = load_file(f"{VISION_FIXTURE}/io.safetensors")["image.wide"]

    def ids(tokens):
        return [IMAGE_PAD if isinstance(t[0], dict) else int(t[0]) for t in tokens["qwen25_7b"][0]]

    tokenized = {name: ids(tokenizer.tokenize_with_weights(p)) for name, p in PROMPTS.items()}
    tokenized.update({f"edit.{name}": ids(tokenizer.tokenize_with_weights(p, images=[image]))
                      for name, p in {"plain": PROMPTS["plain"], "quotes": PROMPTS["quotes"]}.items()})
    with open(f"{OUT}/tokenizer.json", "w") as f:
        json.dump({"prompts": {**PROMPTS, **{f"edit.{k}": PROMPTS[k] for k in ["plain", "quotes"]}},
                   "ids": tokenized}, f, indent=None)
        f.write("\n")
    for name, t in tokenized.items():
        print(f"tokens {name}: {len(t)} ids, first {t[:6]}, pads {t.count(151643)}")

    # ComfyUI's LongCat text encoder with the tiny Qwen2.5-VL in place of the 7B one.
    llama.Qwen25_7BVLI_Config = functools.partial(llama.Qwen25_7BVLI_Config, **TEXT)
    te = longcat.LongCatImageTEModel(device="cpu", dtype=torch.float32)
    inner = te.qwen25_7b.transformer
    stored = load_file(f"{VISION_FIXTURE}/weights.safetensors")
    inner.visual = comfy_vision_tower(types.SimpleNamespace(ops=comfy.ops), stored)
    inner.load_state_dict({k: v.float() for k, v in stored.items()}, strict=True)
    inner.model.embed_tokens = ModuloEmbedding(inner.model.embed_tokens)
    inner.eval()

    cases = {}
    with torch.no_grad():
        for name, prompt in {"t2i": PROMPTS["quotes"], **EDIT_PROMPTS}.items():
            images = [image] if name.startswith("edit") else None
            tokens = tokenizer.tokenize_with_weights(prompt, images=images)
            out, pooled, extra = te.encode_token_weights(tokens)
            assert pooled is None
            io[f"hidden.{name}"] = out.clone()
            cases[name] = {"prompt": prompt, "image": images is not None, "ids": ids(tokens)}
            print(f"hidden {name}: {tuple(out.shape)} from {len(cases[name]['ids'])} ids")
    with open(f"{OUT}/encoder.json", "w") as f:
        json.dump(cases, f, indent=None)
        f.write("\n")


if __name__ == "__main__":
    main()
