"""The PyTorch/diffusers side of the Qwen-Image benchmark (issue #23): the same synthetic files Kiln runs
(`kiln model synth`: the MMDiT in fp8 e4m3fn, ComfyUI's names, which are diffusers'; the Wan 2.1 VAE in ComfyUI's
layout), loaded into diffusers' `QwenImageTransformer2DModel` (the fp8 weights widened to bf16, as diffusers
computes) and `AutoencoderKLQwenImage` (keys renamed as scripts/reference/wan_vae.py maps them), every model
resident on the device, then the Lightning workflow's sampling: `steps` flow-matching Euler steps at shift 3.1,
one DiT call each (CFG 1), and the VAE decode. Writes the JSON bench/zimage-gpu/compare.py reads (per-step,
decode and end-to-end seconds, cold and warm; peak device memory; peak host RSS; pinned H2D bandwidth).

The text encoder is left out: the prompt's features are random of the template prompt's length (the DiT's cost
per step is the measure; Kiln's report times its encode apart).

Usage: python3 torch_qwen_image.py --models DIR [--size 1328] [--steps 8] [--device cuda|cpu] --out FILE.json
(on the CPU it computes in f32: a dry run with `kiln model synth --size tiny` files).
"""
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "zimage-gpu"))
sys.path.insert(0, str(HERE.parents[1] / "scripts/reference"))
from torch_zimage import (assign, cold_and_warm, flow_sigmas, pixels, read, setup, step_figures,  # noqa: E402
                          sync)

DIT_FILE = "diffusion_models/qwen_image_fp8_e4m3fn.safetensors"
VAE_FILE = "vae/qwen_image_vae.safetensors"
# Tokens of the bench's prompt in ComfyUI's Qwen-Image template, after the dropped prefix.
PROMPT_TOKENS = 14
SHIFT = 3.1
# ComfyUI's Wan21 latent format: each channel's mean and standard deviation.
WAN_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
            0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
WAN_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
           3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]


def build_dit(sd, dtype, dev):
    from diffusers import QwenImageTransformer2DModel
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    dim, _ = sd["img_in.weight"].shape
    head_dim = sd["transformer_blocks.0.attn.norm_q.weight"].shape[0]
    layers = len({k.split(".")[1] for k in sd if k.startswith("transformer_blocks.")})
    axes = [head_dim // 8, 7 * head_dim // 16, 7 * head_dim // 16]
    with torch.device("meta"):
        model = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=layers, attention_head_dim=head_dim,
            num_attention_heads=dim // head_dim, joint_attention_dim=sd["txt_norm.weight"].shape[0],
            axes_dims_rope=tuple(axes),
        )
    # The RoPE tables are buffers built at construction: rebuild them off the meta device.
    model.pos_embed = QwenEmbedRope(theta=10000, axes_dim=axes, scale_rope=True)
    # Widened on the device, one tensor at a time (the host holds the fp8 file, never a bf16 copy).
    state = {k: sd.pop(k).to(dev).to(dtype) for k in list(sd) if not k.startswith("__")}
    assign(model, state, dtype)
    return model.to(dev).eval()


def build_vae(sd, dtype, dev):
    from diffusers import AutoencoderKLQwenImage
    from wan_vae import comfy_name

    base = sd["encoder.conv1.weight"].shape[0]
    model = AutoencoderKLQwenImage(base_dim=base, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                   temperal_downsample=[False, True, True])
    state = {name: sd[comfy_name(name)].reshape(p.shape).to(dtype) for name, p in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model.to(dev, dtype).eval()  # load_state_dict kept the model's f32 parameters


def main():
    args, dev, dtype, models, res = setup("qwen-image-torch", 1328, f"euler (flow, shift {SHIFT}), cfg 1",
                                          ("diffusers",))
    h = w = args.size // 8
    sigmas = flow_sigmas(SHIFT, args.steps)
    mean = torch.tensor(WAN_MEAN, device=dev).view(1, 16, 1, 1, 1)
    std = torch.tensor(WAN_STD, device=dev).view(1, 16, 1, 1, 1)
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
        text_dim = dit.config.joint_attention_dim
        cap = torch.randn(1, PROMPT_TOKENS, text_dim, generator=g).to(dev, dtype)
        with torch.no_grad():
            x = torch.randn(1, 16, h, w, generator=g).to(dev, torch.float32) * sigmas[0]
            steps = []
            t_sample = time.perf_counter()
            for i in range(args.steps):
                t = time.perf_counter()
                sigma, nxt = sigmas[i], sigmas[i + 1]
                packed = x.view(1, 16, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, -1, 64)
                # No mask, as QwenImagePipeline passes none for a prompt without padding (a mask would
                # keep SDPA off its fastest kernels).
                v = dit(packed.to(dtype), cap, None, torch.tensor([sigma], device=dev, dtype=dtype),
                        img_shapes=[[(1, h // 2, w // 2)]], return_dict=False)[0]
                v = v.view(1, h // 2, w // 2, 16, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, 16, h, w)
                x = x + (nxt - sigma) * v.float()
                sync(dev)
                steps.append(time.perf_counter() - t)
            out["sample_s"] = time.perf_counter() - t_sample
            t = time.perf_counter()
            z = x.unsqueeze(2) * std + mean
            image = vae.decode(z.to(dtype)).sample
            image = pixels(image)
            out["decode_s"] = time.perf_counter() - t
        step_figures(out, steps)
        out["seconds"] = time.perf_counter() - t_all
        out["image_shape"] = list(image.shape)
        return out

    cold_and_warm(res, run, loaded, args.out)


if __name__ == "__main__":
    main()
