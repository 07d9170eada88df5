"""Fixtures for Kiln's Mage-Flow DiT (engine/models/tests/fixtures/mage_flow/), from ComfyUI's own
MageFlowTransformer2DModel (comfy/ldm/mage_flow/model.py at 0f1fa67a).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/mage_flow.py

The timestep reaches the model as ComfyUI's model wrapper hands it over: sigma times the multiplier (1.0), as
f32, then through `model_base.MageFlow.process_timestep` (called here), which casts it to bfloat16; the DiT then
rounds its frequency table to that dtype too. Everything else runs in f32.

Writes:
- weights.safetensors: a tiny random DiT with the released structure (2 double-stream blocks, 2 heads of width
  32, inner width 64, text width 64, RoPE axes (4, 14, 14) = the released (16, 56, 56) scaled to the head,
  patch 1 over 128 channels), ComfyUI's names, bf16 values (qwen_image.py's `randomize`); the reference runs in
  f32 on those values.
- io.safetensors (f32): for each case, `x.<c>` [B, 128, h, w], `sigma.<c>` [B] (f32, before the bf16 cast),
  `context.<c>` [B, N, 64] and ComfyUI's output `out.<c>` [B, 128, h, w]. Cases: even (4x6 latent),
  odd (5x3), batch (two samples at different sigmas, 4x4), refs1 (the even case with `ref.1`) and refs2 (the
  batch case with `ref.1` and `ref.2`, repeated to the batch as ComfyUI repeats a cond). `ref.1` is
  [1, 128, 4, 6], `ref.2` [1, 128, 3, 5]. `features.<c>` [B, 256] for the three plain cases: the timestep
  sinusoid ComfyUI's MageTimestepProjEmbeddings hands its TimestepEmbedding (captured by a hook).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/mage_flow"
CONFIG = dict(in_channels=128, out_channels=128, num_layers=2, attention_head_dim=32, num_attention_heads=2,
              joint_attention_dim=64, axes_dims_rope=(4, 14, 14))


def main():
    import_comfyui()
    import comfy.ops
    from comfy.ldm.mage_flow.model import MageFlowTransformer2DModel
    from comfy.model_base import MageFlow

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(29)
    model = MageFlowTransformer2DModel(**CONFIG, operations=comfy.ops.disable_weight_init).eval()
    stored = randomize(model)
    save_file(stored, f"{OUT}/weights.safetensors")

    def timestep(sigma):
        # ModelSamplingDiscreteFlow.timestep with multiplier 1.0, `.float()` as _apply_model does, then the
        # family's own bf16 cast.
        return MageFlow.process_timestep(None, (sigma * 1.0).float())

    captured = []
    model.time_text_embed.timestep_embedder.register_forward_pre_hook(lambda _, args: captured.append(args[0]))

    g = torch.Generator().manual_seed(5)
    cases = {"even": (1, 4, 6, 5, [0.7]), "odd": (1, 5, 3, 4, [0.43]), "batch": (2, 4, 4, 3, [0.9, 0.2571])}
    io = {}
    with torch.no_grad():
        for name, (b, h, w, n, sigmas) in cases.items():
            x = torch.randn(b, 128, h, w, generator=g)
            context = torch.randn(b, n, 64, generator=g)
            sigma = torch.tensor(sigmas)
            t = timestep(sigma)
            assert t.dtype == torch.bfloat16
            out = model(x, t, context)
            io.update({f"x.{name}": x, f"sigma.{name}": sigma, f"context.{name}": context, f"out.{name}": out,
                       f"features.{name}": captured[-1]})
            print(name, tuple(out.shape), float(out.abs().max()))

        refs = [torch.randn(1, 128, 4, 6, generator=g), torch.randn(1, 128, 3, 5, generator=g)]
        io["ref.1"], io["ref.2"] = refs
        for name, base, used in [("refs1", "even", refs[:1]), ("refs2", "batch", refs)]:
            x, context, sigma = io[f"x.{base}"], io[f"context.{base}"], io[f"sigma.{base}"]
            batched = [r.repeat(x.shape[0], 1, 1, 1) for r in used]
            out = model(x, timestep(sigma), context, ref_latents=batched)
            io[f"out.{name}"] = out
            print(name, tuple(out.shape), float(out.abs().max()),
                  "vs no references:", float((out - io[f"out.{base}"]).abs().max()))

        # Without the bf16 cast the output differs well beyond the tests' tolerance (what the cast is for).
        x, context, sigma = io["x.even"], io["context.even"], io["sigma.even"]
        diff = float((model(x, sigma, context) - io["out.even"]).abs().max())
        print(f"the even case with an f32 timestep: max |difference| {diff:.2e}")
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")


if __name__ == "__main__":
    main()
