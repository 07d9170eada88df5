"""The PyTorch/diffusers side of the FLUX.1 dev benchmark (issue #22): the same synthetic files Kiln runs
(`kiln model synth`: the DiT in ComfyUI's legacy scaled fp8, BFL/ComfyUI names; the Flux VAE in the LDM layout),
loaded into diffusers' `FluxTransformer2DModel` (each quantized Linear weight dequantized as W.float() ·
scale_weight and cast to bf16 on the device, one tensor at a time; names converted by scripts/reference/flux.py's
`to_diffusers`) and `AutoencoderKL` (as torch_zimage.py builds the same `ae.safetensors`), every model resident on
the device, then the FLUX.1 dev template's sampling: `steps` flow-matching Euler steps over ComfyUI's `simple`
schedule of ModelSamplingFlux (μ 1.15), one DiT call each (CFG 1, the zeroed negative skipped) with guidance 3.5,
and the VAE decode. Writes the JSON bench/zimage-gpu/compare.py reads (per-step, decode and end-to-end seconds,
cold and warm; peak device memory; peak host RSS; pinned H2D bandwidth).

The text encoders are left out: the T5 features are random, 256 tokens (T5's minimum length in ComfyUI's Flux
tokenizer) of the DiT's context width, and the pooled CLIP-L vector random of its width (the DiT's cost per step is
the measure; Kiln's report times its encode apart).

Usage: python3 torch_flux.py --models DIR [--size 1024] [--steps 20] [--device cuda|cpu] --out FILE.json
(on the CPU it computes in f32: a dry run with `kiln model synth --size tiny` files).
"""
import math
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "zimage-gpu"))
sys.path.insert(0, str(HERE.parents[1] / "scripts/reference"))
from torch_zimage import (FLUX_SCALE, FLUX_SHIFT, assign, build_vae, cold_and_warm, dequantized, pixels,  # noqa: E402
                          read, setup, step_figures, sync)
import flux  # noqa: E402  (the fixture script: imports no ComfyUI until its main runs)

DIT_FILE = "diffusion_models/flux1-dev-kontext_fp8_scaled.safetensors"
VAE_FILE = "vae/ae.safetensors"
TEXT_TOKENS = 256
MU = 1.15
GUIDANCE = 3.5


def flux_sigmas(mu, steps):
    """ComfyUI's `simple` schedule of ModelSamplingFlux at shift μ: its 10000-entry table
    σ(t) = e^μ / (e^μ + (1/t − 1)), t = (j+1)/10000, read evenly from the top, then 0."""
    table = [math.exp(mu) / (math.exp(mu) + (1 / ((j + 1) / 10000) - 1)) for j in range(10000)]
    return [table[-1 - int(k * 10000 / steps)] for k in range(steps)] + [0.0]


def build_dit(sd, dtype, dev):
    from diffusers import FluxTransformer2DModel

    hidden, in_ch = sd["img_in.weight"].shape
    head_dim = sd["double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
    count = lambda g: len({k.split(".")[1] for k in sd if k.startswith(g + ".")})
    double, single = count("double_blocks"), count("single_blocks")
    mlp = sd["double_blocks.0.img_mlp.0.weight"].shape[0]
    config = dict(patch_size=1, in_channels=in_ch, out_channels=sd["final_layer.linear.weight"].shape[0],
                  num_layers=double, num_single_layers=single, attention_head_dim=head_dim,
                  num_attention_heads=hidden // head_dim, joint_attention_dim=sd["txt_in.weight"].shape[1],
                  pooled_projection_dim=sd["vector_in.in_layer.weight"].shape[1],
                  guidance_embeds="guidance_in.in_layer.weight" in sd,
                  axes_dims_rope=(head_dim // 8, 7 * head_dim // 16, 7 * head_dim // 16))
    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    state = dequantized(sd, dtype, dev)
    converted = flux.to_diffusers(state, hidden=hidden, depth=double, single=single, mlp_ratio=mlp / hidden)
    have, got = sum(t.numel() for t in state.values()), sum(t.numel() for t in converted.values())
    if have != got:
        raise ValueError(f"to_diffusers kept {got} of the file's {have} elements")
    del state
    # Each parameter takes the file's shape (the tiny file's MLP ratio is 2, diffusers builds 4).
    assign(model, converted, dtype)
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise ValueError(f"buffers left on the meta device: {left[:5]}")
    return model.to(dev).eval()


def main():
    args, dev, dtype, models, res = setup("flux-dev-torch", 1024,
                                          f"euler (flux, mu {MU}, simple), cfg 1, guidance {GUIDANCE}",
                                          ("diffusers",))
    h = w = args.size // 8
    sigmas = flux_sigmas(MU, args.steps)
    # The ids FluxPipeline builds: (0, row, col) per packed latent token, zeros for the text.
    img_ids = flux.grid_ids(h // 2, w // 2).to(dev, dtype)
    txt_ids = torch.zeros(TEXT_TOKENS, 3, device=dev, dtype=dtype)
    guidance = torch.full([1], GUIDANCE, device=dev, dtype=torch.float32)
    loaded = {}

    def run(seed, label):
        out = {"label": label, "seed": seed}
        t_all = time.perf_counter()
        if not loaded:
            for key, file, build in (("dit", DIT_FILE, build_dit), ("vae", VAE_FILE, build_vae)):
                t = time.perf_counter()
                loaded[key] = build(read(models / file), dtype, dev)
                sync(dev)
                out[f"load_{key}_s"] = time.perf_counter() - t
        dit, vae = loaded["dit"], loaded["vae"]
        g = torch.Generator("cpu").manual_seed(seed)
        cap = torch.randn(1, TEXT_TOKENS, dit.config.joint_attention_dim, generator=g).to(dev, dtype)
        pooled = torch.randn(1, dit.config.pooled_projection_dim, generator=g).to(dev, dtype)
        with torch.no_grad():
            x = torch.randn(1, 16, h, w, generator=g).to(dev, torch.float32) * sigmas[0]
            steps = []
            t_sample = time.perf_counter()
            for i in range(args.steps):
                t = time.perf_counter()
                sigma, nxt = sigmas[i], sigmas[i + 1]
                # diffusers multiplies timestep and guidance by 1000 itself (FluxPipeline passes t / 1000 = σ
                # and the guidance scale), as ComfyUI's time_factor does.
                v = dit(flux.pack(x).to(dtype), cap, pooled, torch.tensor([sigma], device=dev, dtype=dtype),
                        img_ids, txt_ids, guidance, return_dict=False)[0]
                x = x + (nxt - sigma) * flux.unpack(v.float(), 16, h, w)
                sync(dev)
                steps.append(time.perf_counter() - t)
            out["sample_s"] = time.perf_counter() - t_sample
            t = time.perf_counter()
            image = vae.decode((x / FLUX_SCALE + FLUX_SHIFT).to(dtype)).sample
            image = pixels(image)
            out["decode_s"] = time.perf_counter() - t
        step_figures(out, steps)
        out["seconds"] = time.perf_counter() - t_all
        out["image_shape"] = list(image.shape)
        return out

    cold_and_warm(res, run, loaded, args.out)


if __name__ == "__main__":
    main()
