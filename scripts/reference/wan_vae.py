"""Fixtures for Kiln's Wan 2.1 VAE (engine/models/tests/it/wan_vae.rs), from diffusers' AutoencoderKLQwenImage.

Run from the repository root:
    $(scripts/reference/setup.sh) scripts/reference/wan_vae.py

Qwen-Image's VAE is the Wan 2.1 causal 3D VAE (same structure, other weights); diffusers carries it as
AutoencoderKLQwenImage. Writes engine/models/tests/fixtures/wan_vae/:
- weights.safetensors: a tiny random one (base dim 8, z 16, dim_mult [1,2,4,4], 2 res blocks, temporal
  downsample [F,T,T] as released) in ComfyUI's (original Wan) key layout, converted here by renames only,
  stored as bf16 (the reference runs in f32 on exactly those rounded values). RMS-norm gammas are random too.
- diffusers_names.json: {diffusers name: [ComfyUI name, shape]} for every weight, so the test rebuilds the
  same weights in diffusers' layout (stored once, not twice).
- wan_names.json: the same map for the released Wan 2.1 / Qwen-Image VAE (base dim 96), names and shapes
  only (built on the meta device), for detection on real shapes.
- io.safetensors (f32): decode (post_quant_conv, then the decoder, no clamp) of z1 [1,16,1,4,4] and z2
  [2,16,1,3,5]; encode (the mean: first 16 channels after quant_conv) of x1 [1,3,1,32,32] and of x2
  [1,3,1,35,38], the latter first centre-cropped to 32x32 as ComfyUI's VAE.encode does.

With COMFYUI_DIR set (a ComfyUI checkout at 0f1fa67a, see comfyui.py), it also runs ComfyUI's own WanVAE
(comfy/ldm/wan/vae.py) on the stored weights and checks it gives the same outputs (within 1e-5; it gave
7.5e-7 at most when the fixtures were written): for single frames ComfyUI and diffusers agree.
"""

import json
import os

import torch
from diffusers import AutoencoderKLQwenImage
from safetensors.torch import save_file

OUT = "engine/models/tests/fixtures/wan_vae"
RES_BLOCKS = 2


def comfy_name(name: str) -> str:
    """diffusers AutoencoderKLQwenImage name -> ComfyUI / original Wan name (models-qwen-image.md 5.2)."""
    top = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}
    for old, new in top.items():
        if name.startswith(old):
            return new + name[len(old):]
    side, rest = name.split(".", 1)
    resnet = [("norm1.gamma", "residual.0.gamma"), ("conv1.", "residual.2."),
              ("norm2.gamma", "residual.3.gamma"), ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut.")]

    def block(r: str) -> str:
        for old, new in resnet:
            if r.startswith(old):
                return new + r[len(old):]
        return r

    p = rest.split(".")
    if p[0] == "conv_in":
        rest = "conv1." + ".".join(p[1:])
    elif p[0] == "norm_out":
        rest = "head.0." + ".".join(p[1:])
    elif p[0] == "conv_out":
        rest = "head.2." + ".".join(p[1:])
    elif p[0] == "mid_block":
        if p[1] == "resnets":
            rest = f"middle.{2 * int(p[2])}." + block(".".join(p[3:]))
        else:  # attentions.0
            rest = "middle.1." + ".".join(p[3:])
    elif p[0] == "down_blocks":
        rest = f"downsamples.{p[1]}." + block(".".join(p[2:]))
    elif p[0] == "up_blocks":
        i = int(p[1])
        if p[2] == "resnets":
            rest = f"upsamples.{i * (RES_BLOCKS + 2) + int(p[3])}." + block(".".join(p[4:]))
        else:  # upsamplers.0
            rest = f"upsamples.{i * (RES_BLOCKS + 2) + RES_BLOCKS + 1}." + ".".join(p[4:])
    else:
        raise ValueError(name)
    return f"{side}.{rest}"


def wan_vae(base_dim):
    return AutoencoderKLQwenImage(
        base_dim=base_dim,
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=RES_BLOCKS,
        attn_scales=[],
        temperal_downsample=[False, True, True],
    ).eval()


def write_names(path, names):
    with open(path, "w") as f:
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(names.items())]
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def decode(vae, z):
    """diffusers' _decode for one latent frame, without its final clamp to [-1, 1]."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    out = vae.decoder(x[:, :, :1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx)
    vae.clear_cache()
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    with torch.device("meta"):
        real = wan_vae(96)
    write_names(f"{OUT}/wan_names.json", {n: [comfy_name(n), list(p.shape)] for n, p in real.state_dict().items()})

    torch.manual_seed(21)
    vae = wan_vae(8)
    stored = {}
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            s = p.to(torch.bfloat16)
            p.copy_(s.float())
            stored[name] = s
    comfy = {comfy_name(n): t.contiguous() for n, t in stored.items()}
    assert len(comfy) == len(stored) == 194, len(comfy)
    save_file(comfy, f"{OUT}/weights.safetensors")
    write_names(f"{OUT}/diffusers_names.json", {n: [comfy_name(n), list(t.shape)] for n, t in stored.items()})

    g = torch.Generator().manual_seed(5)
    z1 = torch.randn(1, 16, 1, 4, 4, generator=g)
    z2 = torch.randn(2, 16, 1, 3, 5, generator=g)
    x1 = torch.rand(1, 3, 1, 32, 32, generator=g) * 2 - 1
    x2 = torch.rand(1, 3, 1, 35, 38, generator=g) * 2 - 1
    with torch.no_grad():
        io = {
            "z1": z1, "z2": z2, "x1": x1, "x2": x2,
            "decode_z1": decode(vae, z1),
            "decode_z2": decode(vae, z2),
            "encode_x1": vae.encode(x1).latent_dist.mean,
            "encode_x2": vae.encode(x2[:, :, :, 1:33, 3:35]).latent_dist.mean,
        }
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    for k, v in io.items():
        print(k, tuple(v.shape), float(v.abs().max()))
    if os.environ.get("COMFYUI_DIR"):
        check_comfyui(comfy, io)


def check_comfyui(comfy, io):
    """ComfyUI's WanVAE on the same (ComfyUI-named) weights gives the recorded outputs."""
    from comfyui import import_comfyui

    import_comfyui()
    from comfy.ldm.wan.vae import WanVAE

    vae = WanVAE(dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=RES_BLOCKS, attn_scales=[],
                 temperal_downsample=[False, True, True]).eval()
    vae.load_state_dict({k: v.float() for k, v in comfy.items()}, strict=True)
    with torch.no_grad():
        runs = {
            "decode_z1": vae.decode(io["z1"]),
            "decode_z2": vae.decode(io["z2"]),
            "encode_x1": vae.encode(io["x1"]),
            "encode_x2": vae.encode(io["x2"][:, :, :, 1:33, 3:35]),
        }
    for k, got in runs.items():
        diff = float((got - io[k]).abs().max())
        print(f"ComfyUI {k}: max |difference| {diff:.2e}")
        assert diff < 1e-5, k


if __name__ == "__main__":
    main()
