"""Fixtures for Kiln's Flux VAE (engine/models/tests/it/flux_vae.rs), from diffusers' AutoencoderKL.

Run from the repository root:
    $(scripts/reference/setup.sh) scripts/reference/flux_vae.py

Writes engine/models/tests/fixtures/flux_vae/:
- weights.safetensors: a tiny random AutoencoderKL with the Flux VAE's structure (4 levels, GroupNorm 32,
  latent 16, mid attention, no quant convs) in ComfyUI's (LDM) key layout, converted here with plain renames
  and reshapes. 3x3 conv kernels are stored as fp8 e4m3 and everything else as bf16, to stay within the
  1 MB fixture budget; the reference runs in f32 on exactly those rounded values.
- diffusers_names.json: {diffusers name: [LDM name, diffusers shape]} for every weight, so the test
  rebuilds the same weights in diffusers' layout (the weights are stored once, not twice).
- flux_names.json: the same map for the real Flux VAE (widths 128/256/512/512, 2 resnets a level), names and
  shapes only: the test writes header-only (sparse) files from it to check detection on real shapes.
- io.safetensors (f32): decode of z1 [1,16,4,4] and z2 [2,16,3,5]; encode (latent_dist.mean) of x1
  [1,3,32,32] and of x2 [1,3,35,38], the latter first centre-cropped to 32x32 as ComfyUI's VAE.encode does.

Widths are (32, 64, 32, 32) with one resnet per encoder level: the smallest Flux-shaped net (4 levels, 32
GroupNorm groups dividing every width) that still has width changes (nin_shortcut) and fits the budget.
"""

import json
import os

import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file

OUT = "engine/models/tests/fixtures/flux_vae"
WIDTHS = (32, 64, 32, 32)
LAYERS = 1


def ldm_name(name: str, levels: int) -> str:
    """diffusers AutoencoderKL name -> ComfyUI/LDM name (models.md section 5.1)."""
    parts = name.split(".")
    side = parts[0]
    rest = ".".join(parts[1:])
    renames = [
        ("mid_block.resnets.0.", "mid.block_1."),
        ("mid_block.resnets.1.", "mid.block_2."),
        ("mid_block.attentions.0.group_norm.", "mid.attn_1.norm."),
        ("mid_block.attentions.0.to_q.", "mid.attn_1.q."),
        ("mid_block.attentions.0.to_k.", "mid.attn_1.k."),
        ("mid_block.attentions.0.to_v.", "mid.attn_1.v."),
        ("mid_block.attentions.0.to_out.0.", "mid.attn_1.proj_out."),
        ("conv_norm_out.", "norm_out."),
    ]
    for old, new in renames:
        if rest.startswith(old):
            rest = new + rest[len(old):]
    p = rest.split(".")
    if p[0] == "down_blocks":
        i = int(p[1])
        if p[2] == "resnets":
            rest = ".".join(["down", str(i), "block"] + p[3:])
        else:  # downsamplers.0.conv
            rest = ".".join(["down", str(i), "downsample"] + p[4:])
    elif p[0] == "up_blocks":
        i = levels - 1 - int(p[1])
        if p[2] == "resnets":
            rest = ".".join(["up", str(i), "block"] + p[3:])
        else:  # upsamplers.0.conv
            rest = ".".join(["up", str(i), "upsample"] + p[4:])
    rest = rest.replace("conv_shortcut", "nin_shortcut")
    return f"{side}.{rest}"


def flux_shaped(widths, layers):
    """diffusers' AutoencoderKL with the Flux VAE's structure (models.md section 7)."""
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=16,
        block_out_channels=widths,
        layers_per_block=layers,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        norm_num_groups=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=True,
    ).eval()


def write_names(path, names):
    """{diffusers name: [LDM name, diffusers shape]}, one entry a line."""
    with open(path, "w") as f:
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(names.items())]
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    # The real Flux VAE's names and shapes (no weights: built on the meta device), for detection tests.
    with torch.device("meta"):
        real = flux_shaped((128, 256, 512, 512), 2)
    write_names(
        f"{OUT}/flux_names.json",
        {n: [ldm_name(n, 4), list(p.shape)] for n, p in real.state_dict().items()},
    )

    torch.manual_seed(11)
    vae = flux_shaped(WIDTHS, LAYERS)

    # Random affine norms too (default init is 1/0); round every weight to its stored type.
    stored = {}
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            if p.ndim == 4 and p.shape[-1] == 3:
                s = p.to(torch.float8_e4m3fn)
            else:
                s = p.to(torch.bfloat16)
            p.copy_(s.float())
            stored[name] = s

    levels = len(WIDTHS)
    ldm, names = {}, {}
    for name, s in stored.items():
        new = ldm_name(name, levels)
        if ".mid.attn_1." in new and new.endswith(".weight") and s.ndim == 2:
            s = s.reshape(*s.shape, 1, 1)
        assert new not in ldm, new
        ldm[new] = s.contiguous()
        names[name] = [new, list(stored[name].shape)]

    save_file(ldm, f"{OUT}/weights.safetensors")
    write_names(f"{OUT}/diffusers_names.json", names)

    g = torch.Generator().manual_seed(12)
    z1 = torch.randn(1, 16, 4, 4, generator=g)
    z2 = torch.randn(2, 16, 3, 5, generator=g)
    x1 = torch.rand(1, 3, 32, 32, generator=g) * 2 - 1
    x2 = torch.rand(1, 3, 35, 38, generator=g) * 2 - 1
    # ComfyUI's centre crop to multiples of 8: offset (dim % 8) // 2.
    x2_cropped = x2[:, :, 1:33, 3:35]
    with torch.no_grad():
        io = {
            "z1": z1,
            "z2": z2,
            "x1": x1,
            "x2": x2,
            "decode_z1": vae.decode(z1).sample,
            "decode_z2": vae.decode(z2).sample,
            "encode_x1": vae.encode(x1).latent_dist.mean,
            "encode_x2": vae.encode(x2_cropped).latent_dist.mean,
        }
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    total = sum(os.path.getsize(f"{OUT}/{f}") for f in os.listdir(OUT))
    print(f"{len(ldm)} weights; fixtures {total} bytes")
    for k, v in io.items():
        print(k, list(v.shape), float(v.abs().max()))


if __name__ == "__main__":
    main()
