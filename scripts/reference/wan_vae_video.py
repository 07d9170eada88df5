"""Fixtures for Kiln's Wan VAEs on video (engine/models/tests/it/wan_vae_video.rs), from diffusers' AutoencoderKLWan.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan_vae_video.py

Writes engine/models/tests/fixtures/wan_vae_video/:
- wan21.safetensors: a tiny random Wan 2.1 VAE (AutoencoderKLWan base_dim 8, z 16, dim_mult [1,2,4,4], 2 res
  blocks, temporal downsample [F,T,T] as released) in ComfyUI's key layout (wan_vae.py's renames), stored as bf16
  (the references run in f32 on exactly those rounded values). RMS-norm gammas and biases are random too. The brief
  asked for base_dim 32; at f32 that is 56 MB, so base_dim 8 keeps the family's fixtures under 5 MB.
- wan22.safetensors: a tiny random Wan 2.2 VAE (AutoencoderKLWan base_dim 4, decoder_base_dim 8, z 48,
  is_residual, patch_size 2, in/out channels 12, scale_factor_spatial 16), ComfyUI's names, bf16 likewise.
- wan22_diffusers_names.json: {diffusers name: [ComfyUI name, shape]} for the tiny 2.2 VAE, so the test rebuilds
  the same weights in diffusers' layout; wan22_names.json: the same map for the released 2.2 VAE (base 160,
  decoder 256; names and shapes only, built on the meta device), for detection on the real shapes.
- io.safetensors (f32), for each VAE (prefix `wan21_` / `wan22_`):
  decode (post_quant_conv, the decoder one latent frame at a time with its caches, unpatchify; no clamp) of
  z3 [1,C,3,h,w] (9 frames) and z1 [1,C,1,h,w] (one frame);
  encode (the mean: the first C channels after quant_conv; patchify first for 2.2) of x9 [1,3,9,H,W] (3 latent
  frames), x6 [1,3,6,H,W] (2 latent frames: the sixth frame is dropped, as every Wan VAE drops frames past the
  last 4k+1) and x1 [1,3,1,H,W]. 2.1: latents 3x4, clips 24x32; 2.2: latents 2x3, clips 32x48.

With COMFYUI_DIR set (a ComfyUI checkout at 0f1fa67a, see comfyui.py), ComfyUI's own comfy.ldm.wan.vae.WanVAE and
comfy.ldm.wan.vae2_2.WanVAE load the stored (ComfyUI-named) weights strictly and must give the recorded outputs
within 1e-5 (ComfyUI chunks 2.1 differently: encode 1, 2, 2, ... frames and decode 1, 2, 2, ... latent frames;
every chunking is the same causal computation). It also records tiled3d.json: ComfyUI's 3-D tiling
(comfy.utils.tiled_scale_multidim as VAE.decode_tiled_3d and encode_tiled_3d call it for a Wan VAE: frames
4T - 3 and floor((L + 3) / 4), placed at 4x and /4) of stand-in passes, for engine/src/nodes/builtin/tiled.rs.
Each case: direction, tile and overlap per dimension (time, rows, columns), shape [1, C, T, H, W], input and
output (row-major f32). The stand-in up pass keeps latent frame 0 as frame 0 and repeats frame k at frames
4k - 3 .. 4k, repeats each position 2 x 2 and adds the tile's mean; the down pass keeps frame 0, averages frames
4k - 3 .. 4k into latent frame k, averages 2 x 2 blocks and adds the tile's mean.
"""

import json
import math
import os

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

from wan_vae import comfy_name as comfy_name_21

OUT = "engine/models/tests/fixtures/wan_vae_video"
RES_BLOCKS = 2
TEMPORAL = [False, True, True]

RESNET = [("norm1.gamma", "residual.0.gamma"), ("conv1.", "residual.2."), ("norm2.gamma", "residual.3.gamma"),
          ("conv2.", "residual.6."), ("conv_shortcut.", "shortcut.")]


def block(rest: str) -> str:
    for old, new in RESNET:
        if rest.startswith(old):
            return new + rest[len(old):]
    return rest


def comfy_name_22(name: str) -> str:
    """diffusers AutoencoderKLWan (is_residual) name -> ComfyUI / original Wan 2.2 name (models-wan-video.md 4.3)."""
    top = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}
    for old, new in top.items():
        if name.startswith(old):
            return new + name[len(old):]
    side, rest = name.split(".", 1)
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
        if p[2] == "resnets":
            rest = f"downsamples.{p[1]}.downsamples.{p[3]}." + block(".".join(p[4:]))
        else:  # downsampler
            rest = f"downsamples.{p[1]}.downsamples.{RES_BLOCKS}." + ".".join(p[3:])
    elif p[0] == "up_blocks":
        if p[2] == "resnets":
            rest = f"upsamples.{p[1]}.upsamples.{p[3]}." + block(".".join(p[4:]))
        else:  # upsampler
            rest = f"upsamples.{p[1]}.upsamples.{RES_BLOCKS + 1}." + ".".join(p[3:])
    else:
        raise ValueError(name)
    return f"{side}.{rest}"


def wan21(base_dim):
    return AutoencoderKLWan(base_dim=base_dim, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=RES_BLOCKS,
                            attn_scales=[], temperal_downsample=TEMPORAL).eval()


def wan22(base_dim, decoder_base_dim):
    return AutoencoderKLWan(base_dim=base_dim, decoder_base_dim=decoder_base_dim, z_dim=48, dim_mult=[1, 2, 4, 4],
                            num_res_blocks=RES_BLOCKS, attn_scales=[], temperal_downsample=TEMPORAL,
                            is_residual=True, in_channels=12, out_channels=12, patch_size=2,
                            scale_factor_temporal=4, scale_factor_spatial=16).eval()


def write_names(path, names):
    with open(path, "w") as f:
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(names.items())]
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def randomise(vae, seed):
    """Random gammas and biases (after the seeded construction's random weights), every parameter rounded to
    bf16; returns the bf16 tensors by diffusers name."""
    torch.manual_seed(seed)
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
    return stored


def decode(vae, z):
    """diffusers' _decode (one latent frame at a time, the caches carried), without its final clamp."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    chunks = []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        chunks.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                  first_chunk=i == 0))
    out = torch.cat(chunks, 2)
    if vae.config.patch_size is not None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
        out = unpatchify(out, patch_size=vae.config.patch_size)
    vae.clear_cache()
    return out


def encode(vae, x):
    """The latent mean: the first z_dim channels of quant_conv's output (diffusers' _encode chunks 1, 4, 4, ...)."""
    return vae._encode(x)[:, :vae.config.z_dim]


def cases(vae, tag, channels, latent_hw, g):
    h, w = latent_hw
    ratio = vae.config.scale_factor_spatial
    io = {
        "z3": torch.randn(1, channels, 3, h, w, generator=g),
        "z1": torch.randn(1, channels, 1, h, w, generator=g),
        "x9": torch.rand(1, 3, 9, h * ratio, w * ratio, generator=g) * 2 - 1,
        "x6": torch.rand(1, 3, 6, h * ratio, w * ratio, generator=g) * 2 - 1,
        "x1": torch.rand(1, 3, 1, h * ratio, w * ratio, generator=g) * 2 - 1,
    }
    with torch.no_grad():
        io["decode_z3"] = decode(vae, io["z3"])
        io["decode_z1"] = decode(vae, io["z1"])
        for x in ("x9", "x6", "x1"):
            io[f"encode_{x}"] = encode(vae, io[x])
    assert io["decode_z3"].shape[2] == 9 and io["encode_x6"].shape[2] == 2
    return {f"{tag}_{k}": v.contiguous() for k, v in io.items()}


def main():
    os.makedirs(OUT, exist_ok=True)
    with torch.device("meta"):
        real = wan22(160, 256)
    real_names = {n: [comfy_name_22(n), list(p.shape)] for n, p in real.state_dict().items()}
    assert len(real_names) == 196, len(real_names)
    write_names(f"{OUT}/wan22_names.json", real_names)

    torch.manual_seed(21)
    vae21 = wan21(8)
    stored21 = randomise(vae21, 121)
    comfy21 = {comfy_name_21(n): t.contiguous() for n, t in stored21.items()}
    assert len(comfy21) == 194
    save_file(comfy21, f"{OUT}/wan21.safetensors")

    torch.manual_seed(22)
    vae22 = wan22(4, 8)
    stored22 = randomise(vae22, 122)
    comfy22 = {comfy_name_22(n): t.contiguous() for n, t in stored22.items()}
    assert len(comfy22) == 196
    save_file(comfy22, f"{OUT}/wan22.safetensors")
    write_names(f"{OUT}/wan22_diffusers_names.json", {n: [comfy_name_22(n), list(t.shape)] for n, t in stored22.items()})

    g = torch.Generator().manual_seed(7)
    io = cases(vae21, "wan21", 16, (3, 4), g)
    io.update(cases(vae22, "wan22", 48, (2, 3), g))
    save_file(io, f"{OUT}/io.safetensors")
    for k, v in io.items():
        print(k, tuple(v.shape), float(v.abs().max()))
    if os.environ.get("COMFYUI_DIR"):
        check_comfyui(comfy21, comfy22, io)
        write_tiled3d()
    else:
        print("COMFYUI_DIR is not set: ComfyUI's outputs not checked, tiled3d.json not written")


def check_comfyui(comfy21, comfy22, io):
    """ComfyUI's WanVAE (2.1) and vae2_2.WanVAE on the same ComfyUI-named weights give the recorded outputs."""
    from comfyui import import_comfyui

    import_comfyui()
    from comfy.ldm.wan import vae as comfy_vae
    from comfy.ldm.wan import vae2_2 as comfy_vae22

    v21 = comfy_vae.WanVAE(dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=RES_BLOCKS, attn_scales=[],
                           temperal_downsample=TEMPORAL).eval()
    v21.load_state_dict({k: v.float() for k, v in comfy21.items()}, strict=True)
    v22 = comfy_vae22.WanVAE(dim=4, dec_dim=8, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=RES_BLOCKS,
                             attn_scales=[], temperal_downsample=TEMPORAL).eval()
    v22.load_state_dict({k: v.float() for k, v in comfy22.items()}, strict=True)
    for tag, vae in (("wan21", v21), ("wan22", v22)):
        with torch.no_grad():
            runs = {f"decode_{z}": vae.decode(io[f"{tag}_{z}"]) for z in ("z3", "z1")}
            runs.update({f"encode_{x}": vae.encode(io[f"{tag}_{x}"]) for x in ("x9", "x6", "x1")})
        for k, got in runs.items():
            want = io[f"{tag}_{k}"]
            assert got.shape == want.shape, (tag, k, got.shape, want.shape)
            diff = float((got - want).abs().max())
            print(f"ComfyUI {tag} {k}: max |difference| {diff:.2e}")
            assert diff < 1e-5, (tag, k)


TILED = {
    "up": ((3, 4, 4), (1, 2, 2), (1, 2, 7, 5, 6)),
    "down": ((9, 6, 6), (5, 2, 2), (1, 1, 17, 12, 10)),
}


def stand_in(direction):
    def up(x):
        frames = x.repeat_interleave(4, dim=2)[:, :, 3:]
        return frames.repeat_interleave(2, dim=3).repeat_interleave(2, dim=4) + x.mean()

    def down(x):
        groups = [x[:, :, :1]] + [x[:, :, 4 * k - 3:4 * k + 1].mean(dim=2, keepdim=True)
                                  for k in range(1, (x.shape[2] - 1) // 4 + 1)]
        pooled = torch.nn.functional.avg_pool3d(torch.cat(groups, 2), (1, 2, 2))
        return pooled + x.mean()

    return up if direction == "up" else down


def write_tiled3d():
    """ComfyUI's tiled_scale_multidim over (time, rows, columns) with a Wan VAE's ratios, on stand-in passes."""
    import comfy.utils

    torch.manual_seed(9)
    cases = {}
    for direction, (tile, overlap, shape) in TILED.items():
        x = torch.rand(shape)
        if direction == "up":
            amount = (lambda a: max(0, a * 4 - 3), 2, 2)
        else:
            amount = (lambda a: max(0, math.floor((a + 3) / 4)), 2, 2)
        out = comfy.utils.tiled_scale_multidim(x, stand_in(direction), tile=tile, overlap=overlap,
                                               upscale_amount=amount, out_channels=shape[1],
                                               downscale=direction == "down", index_formulas=(4, 2, 2))
        cases[direction] = {"direction": direction, "tile": list(tile), "overlap": list(overlap), "shape": list(shape),
                            "input": x.flatten().tolist(), "output": out.flatten().tolist()}
        print(f"tiled3d {direction}: {tuple(x.shape)} -> {tuple(out.shape)}")
    with open(f"{OUT}/tiled3d.json", "w") as f:
        json.dump(cases, f)
        f.write("\n")


if __name__ == "__main__":
    main()
