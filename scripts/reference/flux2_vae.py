"""Fixtures for Kiln's FLUX.2 VAE (engine/models/tests/it/flux2_vae.rs), from diffusers' AutoencoderKLFlux2
and its Flux2Pipeline's latent patchify and BatchNorm.

Run from the repository root:
    $(scripts/reference/setup.sh) scripts/reference/flux2_vae.py

Writes engine/models/tests/fixtures/flux2_vae/:
- weights.safetensors: a tiny random AutoencoderKLFlux2 with the FLUX.2 VAE's structure (4 levels, GroupNorm
  32, z 32, both quant convs, mid attention, the latent BatchNorm of 128 channels) in the released file's key
  layout: ComfyUI's (LDM) names, with BFL's `encoder.quant_conv.*` / `decoder.post_quant_conv.*` and
  `bn.running_mean` / `bn.running_var` / `bn.num_batches_tracked` (int64), converted here with plain renames
  and reshapes. Its decoder is narrower than its encoder (widths 64 and 32 a level, diffusers'
  `decoder_block_out_channels`), as in `full_encoder_small_decoder.safetensors`. Conv and projection weights
  are stored as fp8 e4m3, norms and biases as bf16 and the statistics as f32, to stay within the 1 MB fixture
  budget; the reference runs in f32 on exactly those rounded values.
- diffusers_names.json: {diffusers name: [file name, diffusers shape]} for every weight, so the test rebuilds
  the same weights in diffusers' layout.
- io.safetensors (f32), all latents in the FLUX.2 VAE space (128 channels, patchified and normalised):
  encode of x1 [1,3,32,48] and of x2 [1,3,35,38], the latter first centre-cropped to 32x32 as ComfyUI's
  VAE.encode does at a downscale of 16; decode of z1 [1,128,2,3] and z2 [2,128,1,2].

Encode is the pipeline's `_encode_vae_image` (latent_dist.mean, `_patchify_latents`, then (z - mean) /
sqrt(var + eps)); decode its output path (z * sqrt(var + eps) + mean, `_unpatchify_latents`, vae.decode). With
COMFYUI_DIR set (see comfyui.py), ComfyUI's AutoencoderKL with `batch_norm_latent` and a `decoder_ddconfig` is
built at the same widths (ComfyUI's loader itself fixes the encoder at ch 128, so it cannot load this tiny
file), loaded from the file's keys after ComfyUI's own renames, and checked to give the same outputs.
"""

import os
import sys

import torch
from diffusers import AutoencoderKLFlux2
from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_vae import ldm_name, write_names  # noqa: E402

OUT = "engine/models/tests/fixtures/flux2_vae"
ENCODER = (64, 64, 64, 64)
DECODER = (32, 32, 32, 32)
LAYERS = 1
Z = 32


def file_name(name: str, levels: int) -> str:
    """diffusers AutoencoderKLFlux2 name -> the released FLUX.2 file's name (LDM, BFL's quant convs)."""
    if name.startswith("quant_conv."):
        return "encoder." + name
    if name.startswith("post_quant_conv."):
        return "decoder." + name
    if name.startswith("bn."):
        return name
    return ldm_name(name, levels)


def stored(name: str, p: torch.Tensor) -> torch.Tensor:
    """The value as the fixture stores it: weights of 2 or more dimensions fp8, the statistics as they are,
    the rest (norms, biases) bf16."""
    if name.startswith("bn."):
        return p
    if p.ndim >= 2:
        return p.to(torch.float8_e4m3fn)
    return p.to(torch.bfloat16)


def encode(vae, x):
    """Flux2Pipeline._encode_vae_image (argmax: the mean)."""
    z = vae.encode(x).latent_dist.mean
    z = Flux2Pipeline._patchify_latents(z)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return (z - mean) / std


def decode(vae, z):
    """Flux2Pipeline's decode of its latents (after unpacking)."""
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    z = Flux2Pipeline._unpatchify_latents(z * std + mean)
    return vae.decode(z).sample


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(21)
    vae = AutoencoderKLFlux2(
        block_out_channels=ENCODER,
        decoder_block_out_channels=DECODER,
        layers_per_block=LAYERS,
        latent_channels=Z,
        norm_num_groups=32,
    ).eval()

    # Random affine norms and statistics too (defaults are 1/0); round every weight to its stored type.
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
        vae.bn.running_mean.copy_(0.5 * torch.randn_like(vae.bn.running_mean))
        vae.bn.running_var.copy_(0.5 + torch.rand_like(vae.bn.running_var))
        vae.bn.num_batches_tracked.fill_(1000)
        state = vae.state_dict()
        tensors = {}
        for name, p in state.items():
            s = stored(name, p) if p.is_floating_point() else p
            if p.is_floating_point():
                p.copy_(s.float())
            tensors[name] = s

    levels = len(ENCODER)
    weights, names = {}, {}
    for name, s in tensors.items():
        new = file_name(name, levels)
        if ".mid.attn_1." in new and new.endswith(".weight") and s.ndim == 2:
            s = s.reshape(*s.shape, 1, 1)
        assert new not in weights, new
        weights[new] = s.contiguous()
        names[name] = [new, list(tensors[name].shape)]

    save_file(weights, f"{OUT}/weights.safetensors")
    write_names(f"{OUT}/diffusers_names.json", names)

    g = torch.Generator().manual_seed(22)
    x1 = torch.rand(1, 3, 32, 48, generator=g) * 2 - 1
    x2 = torch.rand(1, 3, 35, 38, generator=g) * 2 - 1
    z1 = torch.randn(1, 4 * Z, 2, 3, generator=g)
    z2 = torch.randn(2, 4 * Z, 1, 2, generator=g)
    # ComfyUI's centre crop to multiples of 16: offset (dim % 16) // 2.
    x2_cropped = x2[:, :, 1:33, 3:35]
    with torch.no_grad():
        io = {
            "x1": x1,
            "x2": x2,
            "z1": z1,
            "z2": z2,
            "encode_x1": encode(vae, x1),
            "encode_x2": encode(vae, x2_cropped),
            "decode_z1": decode(vae, z1),
            "decode_z2": decode(vae, z2),
        }
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    total = sum(os.path.getsize(f"{OUT}/{f}") for f in os.listdir(OUT))
    print(f"{len(weights)} tensors; fixtures {total} bytes")
    for k, v in io.items():
        print(k, list(v.shape), float(v.abs().max()))
    if os.environ.get("COMFYUI_DIR"):
        check_comfyui(weights, io, x2_cropped)


def check_comfyui(weights, io, x2_cropped):
    """ComfyUI's AutoencoderKL (batch_norm_latent, a narrower decoder_ddconfig) on the file's weights, after
    ComfyUI's VAE renames (`encoder.quant_conv.` -> `quant_conv.`, `decoder.post_quant_conv.` ->
    `post_quant_conv.`), gives the recorded outputs."""
    from comfyui import import_comfyui

    import_comfyui()
    import comfy.utils
    from comfy.ldm.models.autoencoder import AutoencoderKL

    sd = {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}
    sd = comfy.utils.state_dict_prefix_replace(
        sd, {"decoder.post_quant_conv.": "post_quant_conv.", "encoder.quant_conv.": "quant_conv."}
    )
    mult = [w // ENCODER[0] for w in ENCODER]
    ddconfig = {
        "double_z": True, "z_channels": Z, "resolution": 256, "in_channels": 3, "out_ch": 3,
        "ch": ENCODER[0], "ch_mult": mult, "num_res_blocks": LAYERS, "attn_resolutions": [],
        "dropout": 0.0, "batch_norm_latent": True,
    }
    decoder_ddconfig = dict(ddconfig, ch=DECODER[0])
    vae = AutoencoderKL(ddconfig=ddconfig, embed_dim=Z, decoder_ddconfig=decoder_ddconfig).eval()
    missing, unexpected = vae.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        runs = {
            "encode_x1": vae.encode(io["x1"]),
            "encode_x2": vae.encode(x2_cropped),
            "decode_z1": vae.decode(io["z1"]),
            "decode_z2": vae.decode(io["z2"]),
        }
    for k, got in runs.items():
        diff = float((got - io[k]).abs().max())
        print(f"ComfyUI {k}: max |difference| {diff:.2e}")
        assert diff < 1e-4, k


if __name__ == "__main__":
    main()
