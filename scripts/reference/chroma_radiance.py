"""Fixtures for Chroma Radiance (engine/models/tests/fixtures/chroma_radiance/): ComfyUI's `ChromaRadiance`
(comfy/ldm/chroma_radiance, Chroma's trunk on pixel patches with a NeRF head) built tiny by ComfyUI's own class,
and what ComfyUI computes with it.

Run from the repository root:
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/chroma_radiance.py

ComfyUI 0f1fa67a is the reference: comfy/ldm/chroma_radiance/model.py and layers.py, comfy/ldm/chroma/model.py
(forward_orig, the guidance MLP's modulation table), model_detection.py (the `nerf_blocks.0.norm` rule, the
`__x0__` and `__sequential__` marker keys, the head type from `nerf_final_layer_conv.norm`), supported_models and
model_base `ChromaRadiance` (ModelType.FLUX: the model gets sigma as its timestep), and the `chroma_radiance_options`
that comfy_extras/nodes_chroma_radiance.py's ChromaRadianceOptions puts in transformer_options. ComfyUI's
detection hard-codes the guidance MLP's and the NeRF head's released widths, so the tiny models are built directly
with the kwargs detection would give plus their own widths; the stored names are the released file's spelling
(`.scale` for the trunk's RMS norm gains, which ComfyUI's `process_unet_state_dict` renames to `.weight`),
checked by loading them strictly through that renaming.

Tiny configs (released values in brackets): hidden 128 = 1 head x 128 [3072 = 24 x 128] (Kiln's FLUX trunk, like
ComfyUI's detection, takes heads = hidden / 128 with RoPE axes 16, 56, 56), MLP ratio 2 [4], 1 double + 1 single
block [19 + 38], text width 32 [4096], guidance MLP 64 -> 48 (2 layers) -> 128 [64 -> 5120 (5) -> 3072], patch
16 [16], nerf_max_freqs 8 [8], nerf depth 2 [4]:
- `linear`: nerf hidden 32 [64], nerf MLP ratio 1 [4], the linear final head, no marker keys; NeRF norm gains
  stored as `.weight`.
- `conv`: nerf hidden 16, nerf MLP ratio 2, the conv final head, with `__x0__` and `__sequential__`; every RMS norm
  gain stored as `.scale`.
Weights seeded: norm gains 1 + 0.2 N, biases 0.1 N, weights N / sqrt(fan-in), rounded to bf16 and stored as bf16
(computed in f32 from exactly these values). The marker keys are empty f32 tensors, as ComfyUI's buffers are.

Writes:
- linear.safetensors, conv.safetensors: the two models.
- io.safetensors (f32), per case `{variant}.{case}`: `.x` [B, 3, h, w], `.sigma` [B], `.guidance` [B],
  `.context` [B, N, 32], `.out` = ComfyUI's output [B, 3, h, w].
- cases.json: per case its options (the `chroma_radiance_options` passed; absent keys keep the model's) and
  whether the stored output is ComfyUI's own call (`comfy`) or composed from ComfyUI's parts (`composed`).
  Cases: linear square (32x32), padded (24x40, padded circularly to 32x48), batch (2 samples, two sigmas, guidance
  0 and 3), tiled (48x32, nerf_tile_size 4: tiles of 4 and 2 patches; asserted equal to tile 0 and to the
  default 512), sequential (use_sequential_txt_ids forced on); conv square, batch, tiled (48x48, tile 2; asserted
  equal to tile 0), zero_ids (use_sequential_txt_ids forced off on the `__sequential__` model) and padded_x0
  (24x40 on the x0 model: ComfyUI's own call raises, since `_apply_x0_residual` subtracts the cropped prediction
  from the padded image; asserted. The stored output is (x - raw) / sigma, raw being ComfyUI's output with the
  `__x0__` buffer removed, which is ComfyUI's call for sides that are multiples of the patch, asserted on square).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/chroma_radiance"
BUDGET = 5_000_000
TRUNK = dict(in_channels=3, out_channels=3, context_in_dim=32, hidden_size=128, mlp_ratio=2.0, num_heads=1,
             depth=1, depth_single_blocks=1, axes_dim=[16, 56, 56], theta=10000, patch_size=16, qkv_bias=True,
             in_dim=64, out_dim=128, hidden_dim=48, n_layers=2, txt_ids_dims=[], vec_in_dim=None,
             nerf_depth=2, nerf_max_freqs=8, nerf_tile_size=512, nerf_embedder_dtype=torch.float32)
VARIANTS = {
    "linear": dict(nerf_hidden_size=32, nerf_mlp_ratio=1, nerf_final_head_type="linear", use_x0=False,
                   use_sequential_txt_ids=False),
    "conv": dict(nerf_hidden_size=16, nerf_mlp_ratio=2, nerf_final_head_type="conv", use_x0=True,
                 use_sequential_txt_ids=True),
}
# variant.case: (batch, h, w, text tokens, sigmas, guidances, options)
CASES = {
    "linear.square": (1, 32, 32, 5, [0.7], [0.0], {}),
    "linear.padded": (1, 24, 40, 4, [0.5], [0.0], {}),
    "linear.batch": (2, 32, 32, 6, [0.9, 0.3], [0.0, 3.0], {}),
    "linear.tiled": (2, 48, 32, 3, [0.6, 0.4], [0.0, 0.0], {"nerf_tile_size": 4}),
    "linear.sequential": (1, 32, 48, 5, [0.8], [0.0], {"use_sequential_txt_ids": True}),
    "conv.square": (1, 32, 32, 5, [0.7], [0.0], {}),
    "conv.batch": (2, 32, 32, 4, [0.9, 0.35], [0.0, 2.0], {}),
    "conv.tiled": (1, 48, 48, 3, [0.6], [0.0], {"nerf_tile_size": 2}),
    "conv.zero_ids": (1, 32, 32, 5, [0.55], [0.0], {"use_sequential_txt_ids": False}),
    "conv.padded_x0": (1, 24, 40, 4, [0.5], [0.0], {}),
}


def randomize(module, gen):
    """Seeded bf16-representable parameters (see the docstring), set on `module`; returned in bf16 by name."""
    stored = {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1 and ("norm" in name.split(".")[-2] or ".norms." in name):
                value = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                value = 0.1 * torch.randn(p.shape, generator=gen)
            else:
                fan_in = p[0].numel() if p.ndim > 1 else p.shape[-1]
                value = torch.randn(p.shape, generator=gen) / max(1, fan_in) ** 0.5
            s = value.to(torch.bfloat16)
            p.copy_(s.float())
            stored[name] = s.contiguous()
    return stored


def stored_name(name, variant):
    """The file's names: the trunk's RMS norm gains as `.scale` (the released spelling); in `conv`, every norm's."""
    if not name.endswith(".weight"):
        return name
    trunk_norm = "_norm." in name or ".norms." in name
    if trunk_norm or (variant == "conv" and name.endswith("norm.weight")):
        return name[: -len(".weight")] + ".scale"
    return name


def build(variant, gen):
    import comfy.ops
    import comfy.supported_models
    from comfy.ldm.chroma_radiance.model import ChromaRadiance

    model = ChromaRadiance(**TRUNK, **VARIANTS[variant], operations=comfy.ops.disable_weight_init).eval()
    stored = randomize(model, gen)
    file = {stored_name(k, variant): v for k, v in stored.items()}
    for marker in ("__x0__", "__sequential__"):
        if marker in dict(model.named_buffers()):
            file[marker] = torch.tensor([])
    save_file(file, f"{OUT}/{variant}.safetensors")
    # ComfyUI's own renaming of the stored names loads strictly into the module.
    renamed = comfy.supported_models.Chroma.process_unet_state_dict(None, {k: v.float() for k, v in file.items()})
    model.load_state_dict(renamed, strict=True)
    return model


def call(model, x, sigma, context, guidance, options):
    return model(x, sigma, context, guidance, transformer_options={"chroma_radiance_options": options})


def max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def main():
    import_comfyui()
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(61)
    models = {v: build(v, gen) for v in VARIANTS}
    io, cases = {}, {}
    with torch.no_grad():
        for key, (b, h, w, n, sigmas, guidances, options) in CASES.items():
            variant = key.split(".")[0]
            model = models[variant]
            x = torch.randn(b, 3, h, w, generator=gen)
            context = torch.randn(b, n, TRUNK["context_in_dim"], generator=gen)
            sigma, guidance = torch.tensor(sigmas), torch.tensor(guidances)
            source = "comfy"
            if key == "conv.padded_x0":
                try:
                    call(model, x, sigma, context, guidance, options)
                    raise AssertionError("ComfyUI's x0 residual on padded sides was expected to fail")
                except RuntimeError as e:
                    print(f"{key}: ComfyUI raises as expected: {str(e)[:90]}")
                out = composed_x0(model, x, sigma, context, guidance, options)
                source = "composed"
            else:
                out = call(model, x, sigma, context, guidance, options)
            if "nerf_tile_size" in options:
                for tile in (0, 512):
                    other = call(model, x, sigma, context, guidance, {**options, "nerf_tile_size": tile})
                    err = max_rel(other, out)
                    print(f"  {key}: tile {options['nerf_tile_size']} vs {tile}: {err:.2e}")
                    assert err < 1e-6, (key, tile, err)
            if key == "conv.square":
                err = max_rel(composed_x0(model, x, sigma, context, guidance, options), out)
                print(f"  {key}: (x - raw) / sigma vs ComfyUI's x0 call: {err:.2e}")
                assert err < 1e-6, err
            assert out.shape == x.shape, (key, out.shape)
            for name, t in (("x", x), ("sigma", sigma), ("guidance", guidance), ("context", context),
                            ("out", out)):
                io[f"{key}.{name}"] = t.contiguous()
            cases[key] = {"options": options, "source": source}
            print(f"{key}: out {tuple(out.shape)} max {float(out.abs().max()):.3f}")
    save_file(io, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"total {total} bytes")
    assert total < BUDGET, total


def composed_x0(model, x, sigma, context, guidance, options):
    """(x - raw) / sigma, raw being the model's output with its `__x0__` buffer taken away (then put back)."""
    marker = model._buffers.pop("__x0__")
    try:
        raw = call(model, x, sigma, context, guidance, options)
    finally:
        model._buffers["__x0__"] = marker
    return (x - raw) / sigma.view(-1, 1, 1, 1)


if __name__ == "__main__":
    main()
