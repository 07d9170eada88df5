"""The PyTorch/diffusers side of the Wan video benchmarks (issue #24): the same synthetic files Kiln runs
(`kiln model synth`, ComfyUI's layout), loaded into diffusers' `WanTransformer3DModel` (renamed as
scripts/reference/wan.py maps them; fp16 and scaled fp8 weights widened to bf16, as diffusers computes) and
`AutoencoderKLWan` (the Wan 2.2 VAE for TI2V 5B, the Wan 2.1 VAE for A14B, renamed as
scripts/reference/wan_vae_video.py maps them), every model resident on the device, then the template's sampling:
`steps` flow-matching Euler steps at shift 8 over ComfyUI's `simple` sigmas, each one DiT call on the
positive+negative batch (CFG 5 for TI2V 5B, 3.5 for A14B), A14B's high-noise expert for the first half of the
steps and the low-noise one after (as the template's two KSamplerAdvanced), and the VAE decode. Writes the JSON
bench/zimage-gpu/compare.py reads (per-step, decode and end-to-end seconds, cold and warm; peak device memory;
peak host RSS; pinned H2D bandwidth).

The text encoder is left out: the prompts' features are random, 512 tokens each (ComfyUI's umT5 tokenizer pads
Wan's prompts to 512; the DiT's cost per step is the measure, Kiln's report times its encode apart). Kiln samples
TI2V 5B with uni_pc: the same DiT calls per step, negligible arithmetic beside them.

Usage: python3 torch_wan.py --workflow wan22-5b|wan22-a14b --models DIR [--size W] [--height H] [--frames N]
[--steps N] [--device cuda|cpu] --out FILE.json (on the CPU it computes in f32: a dry run with tiny files).
"""
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "zimage-gpu"))
sys.path.insert(0, str(HERE.parents[1] / "scripts/reference"))
from torch_zimage import (cold_and_warm, dequantized, flow_sigmas, pixels, read, setup, step_figures,  # noqa: E402
                          sync)

SHIFT = 8.0
HEAD_DIM = 128  # in every release, and in the tiny files
TEXT_TOKENS = 512
# Per workflow: the DiT files (the experts in the order they sample), the VAE file, CFG, the VAE's
# (spatial, temporal) compression and latent channels.
WORKFLOWS = {
    "wan22-5b": dict(dits=["diffusion_models/wan2.2_ti2v_5B_fp16.safetensors"], vae="vae/wan2.2_vae.safetensors",
                     cfg=5.0, spatial=16, channels=48),
    "wan22-a14b": dict(dits=["diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                             "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"],
                       vae="vae/wan_2.1_vae.safetensors", cfg=3.5, spatial=8, channels=16),
}


def build_dit(sd, dtype, dev):
    from diffusers import WanTransformer3DModel
    from wan import comfy_name

    dim = sd["patch_embedding.weight"].shape[0]
    layers = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    with torch.device("meta"):
        model = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=dim // HEAD_DIM, attention_head_dim=HEAD_DIM,
            in_channels=sd["patch_embedding.weight"].shape[1], out_channels=sd["head.head.weight"].shape[0] // 4,
            text_dim=sd["text_embedding.0.weight"].shape[1], freq_dim=256, ffn_dim=sd["blocks.0.ffn.0.weight"].shape[0],
            num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
    state = dequantized(sd, dtype, dev)
    names = {comfy_name(k): k for k in model.state_dict()}
    model.load_state_dict({names[k]: v for k, v in state.items()}, strict=True, assign=True)
    # The RoPE tables are buffers built at construction: rebuild them off the meta device.
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
    model.rope = WanRotaryPosEmbed(HEAD_DIM, (1, 2, 2), 1024)
    return model.to(dev).eval()


def build_vae(sd, dtype, dev):
    from wan_vae_video import comfy_name_22, wan21, wan22
    from wan_vae import comfy_name as comfy_name_21

    base = sd["encoder.conv1.weight"].shape[0]
    if sd["decoder.head.2.weight"].shape[0] == 12:  # the Wan 2.2 VAE: 2×2 patches of RGB
        model, rename = wan22(base, sd["decoder.conv1.weight"].shape[0] // 4), comfy_name_22
    else:
        model, rename = wan21(base), comfy_name_21
    state = {name: sd[rename(name)].reshape(p.shape).to(dtype) for name, p in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model.to(dev, dtype).eval()  # load_state_dict kept the model's f32 parameters


def extra_options(ap):
    ap.add_argument("--workflow", choices=sorted(WORKFLOWS), default="wan22-5b")
    ap.add_argument("--height", type=int)
    ap.add_argument("--frames", type=int, default=5)


def main():
    args, dev, dtype, models, res = setup("wan-torch", 1280, f"euler (flow, shift {SHIFT})", ("diffusers",),
                                          extra_options)
    spec = WORKFLOWS[args.workflow]
    res.update(workflow=args.workflow, height=args.height or args.size, frames=args.frames, cfg=spec["cfg"])
    h = (args.height or args.size) // spec["spatial"]
    w = args.size // spec["spatial"]
    t = (args.frames - 1) // 4 + 1
    sigmas = flow_sigmas(SHIFT, args.steps)
    loaded = {}

    def run(seed, label):
        out = {"label": label, "seed": seed}
        t_all = time.perf_counter()
        if not loaded:
            for i, file in enumerate(spec["dits"]):
                start = time.perf_counter()
                loaded[f"dit{i}"] = build_dit(read(models / file), dtype, dev)
                sync(dev)
                out[f"load_dit{i}_s"] = time.perf_counter() - start
            start = time.perf_counter()
            loaded["vae"] = build_vae(read(models / spec["vae"]), dtype, dev)
            sync(dev)
            out["load_vae_s"] = time.perf_counter() - start
        experts = [loaded[f"dit{i}"] for i in range(len(spec["dits"]))]
        g = torch.Generator("cpu").manual_seed(seed)
        text_dim = experts[0].config.text_dim
        # The positive and the negative prompt, one batch (as ComfyUI batches equal-length prompts).
        context = torch.randn(2, TEXT_TOKENS, text_dim, generator=g).to(dev, dtype)
        with torch.no_grad():
            x = torch.randn(1, spec["channels"], t, h, w, generator=g).to(dev, torch.float32) * sigmas[0]
            steps = []
            t_sample = time.perf_counter()
            for i in range(args.steps):
                start = time.perf_counter()
                dit = experts[min(i * len(experts) // args.steps, len(experts) - 1)]
                sigma, nxt = sigmas[i], sigmas[i + 1]
                timestep = torch.full((2,), sigma * 1000, device=dev, dtype=dtype)
                v = dit(x.to(dtype).expand(2, -1, -1, -1, -1), timestep, context, return_dict=False)[0].float()
                v = v[1] + spec["cfg"] * (v[0] - v[1])
                x = x + (nxt - sigma) * v.unsqueeze(0)
                sync(dev)
                steps.append(time.perf_counter() - start)
            out["sample_s"] = time.perf_counter() - t_sample
            start = time.perf_counter()
            video = loaded["vae"].decode(x.to(dtype)).sample
            video = pixels(video)
            out["decode_s"] = time.perf_counter() - start
        step_figures(out, steps)
        out["seconds"] = time.perf_counter() - t_all
        out["video_shape"] = list(video.shape)
        return out

    cold_and_warm(res, run, loaded, args.out)


if __name__ == "__main__":
    main()
