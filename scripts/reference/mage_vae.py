"""Fixtures for the Mage-Flow VAE (engine/models/tests/it/mage_vae.rs): ComfyUI's own MageVAE
(comfy/ldm/mage_flow/vae.py), tiny, with random weights, and what it computes.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a):
    COMFYUI_DIR=/work/ref/ComfyUI $(scripts/reference/setup.sh) scripts/reference/mage_vae.py
It takes a few seconds on the CPU and is reproducible (every random value comes from seeded torch generators).

ComfyUI code this relies on:
- sd.py (the `student.dconv_encoder.proj_out.weight` branch of VAE.__init__): the file's keys renamed
  `student.dconv_encoder.` -> `dconv_encoder.` and `pipeline.` -> `decoder_model.`, every
  `decoder_model.y_embedder.encoder.*` and `decoder_model.y_embedder.bottleneck.*` dropped (the Flux2-VAE anchor
  encoder the checkpoint carries), then MageVAE() loaded; latent channels 128, 16x down and up. The branch keeps
  the default process_input (x * 2 - 1) and process_output ((x + 1) / 2 clamped), so MageVAE.encode takes pixels
  in [-1, 1] and MageVAE.decode gives them back unclamped; VAE.encode first centre-crops to multiples of 16.
- MageVAE() takes no arguments (the released widths are the classes' defaults), so the tiny network here is a
  subclass whose __init__ builds the same two submodules, DConvEncoder(**ENCODER) and DConvDenoiser(**DENOISER),
  with small widths. GroupNorm's 32 groups in the CoD decoder are fixed, so the denoiser's hidden width is a
  multiple of 32; the patch (16), the latent channels (128, also the denoiser's bottleneck) and the 32x32 windows
  of the CoD attention are ComfyUI's (sd.py fixes 128 and 16).

The tiny config (released values in brackets): encoder hidden 32 [384], head 48 [768], 2 head blocks [2], 2 blocks
[21], mlp_ratio 2 [4]; denoiser hidden 64 [384], pixel width 8 [32], 1 cond block [21] of 3 [24] (2 pixel
res blocks [3]), mlp_ratio 4 [4].

Weights: every state_dict entry drawn from one seeded generator (ComfyUI's ops leave them uninitialised): weights
N(0, 1) / sqrt(fan_in) (fan_in = numel / rows), biases 0.1 N, norm weights 1 + 0.2 N, norm biases 0.1 N; f32.

Writes engine/models/tests/fixtures/mage_vae/:
- weights.safetensors: the tiny MageVAE's state in the released file's layout (`student.dconv_encoder.*`,
  `pipeline.*`), plus three `pipeline.y_embedder.encoder.*` / `pipeline.y_embedder.bottleneck.*` tensors that
  ComfyUI drops (and so must Kiln).
- io.safetensors (f32): encodes of x1 [1, 3, 32, 32], x2 [2, 3, 48, 32] and x3 [1, 3, 37, 50] (x3's reference is
  of its centre crop to 32x48, offsets (2, 1), as VAE.encode crops), each `encode_{x}` the posterior mean
  [B, 128, H/16, W/16]; decodes of z1 [1, 128, 2, 2], z2 [2, 128, 3, 2] and z3 [1, 128, 34, 3] (two 32-row
  windows of the CoD attention, the second replicate-padded), each `decode_{z}` unclamped.
- released_shapes.json: [[name, shape], ...] of MageVAE() (built on the meta device) under the file's names, and
  three dropped anchor-encoder tensors (their shapes made up), for detection tests.

Checks: the file goes through ComfyUI's own VAE (comfy.sd.VAE with MageVAE swapped for the tiny subclass): it is
recognised, its renames and drops give exactly the tiny module's state (no key missing, none left over); VAE.encode
of the [0, 1] pixels and VAE.decode (clamped to [0, 1]) agree with the recorded MageVAE.encode / decode; the f32
results are within 1e-5 (encodes) and 2e-5 (decodes) of an f64 run (printed).
"""

import json
import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/mage_vae")
SEED = 1717

ENCODER = dict(z_ch=128, hidden_size=32, num_blocks=2, patch_size=16, mlp_ratio=2.0, head_size=48,
               num_head_blocks=2, out_ch_mult=2)
DENOISER = dict(patch_size=16, in_channels=3, hidden_size=64, hidden_size_x=8, mlp_ratio=4.0, num_blocks=3,
                num_cond_blocks=1, bottleneck_dim=128)
# Tensors of the anchor encoder that ComfyUI drops (names as the checkpoint would have them; values unused).
DROPPED = {
    "pipeline.y_embedder.encoder.conv_in.weight": [16, 3, 3, 3],
    "pipeline.y_embedder.encoder.conv_in.bias": [16],
    "pipeline.y_embedder.bottleneck.weight": [128, 16, 1, 1],
}


def raw_name(name):
    """ComfyUI's MageVAE state name -> the released file's."""
    if name.startswith("dconv_encoder."):
        return "student." + name
    assert name.startswith("decoder_model."), name
    return "pipeline." + name[len("decoder_model."):]


def tiny_class():
    from comfy.ldm.mage_flow import vae

    class TinyMageVAE(vae.MageVAE):
        """MageVAE with its two submodules built at the tiny widths (MageVAE() takes no arguments)."""

        def __init__(self):
            torch.nn.Module.__init__(self)
            self.dconv_encoder = vae.DConvEncoder(**ENCODER)
            self.decoder_model = vae.DConvDenoiser(**DENOISER)

    return TinyMageVAE


def draw_weights(module, g):
    norms = {n for n, m in module.named_modules()
             if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.RMSNorm))}
    out = {}
    for name, p in module.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner in norms:
            mean, std = (1.0, 0.2) if name.endswith(".weight") else (0.0, 0.1)
        elif name.endswith(".bias"):
            mean, std = 0.0, 0.1
        else:
            assert p.ndim >= 2, name
            mean, std = 0.0, 1.0 / math.sqrt(p[0].numel())
        out[name] = (mean + std * torch.randn(p.shape, generator=g)).contiguous()
    return out


def rel_err(got, want):
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def main():
    # comfy.sd imports torchaudio (its audio VAEs): the stand-in package does when it is not installed.
    import_comfyui(node_modules=True)
    import comfy.sd
    from comfy.ldm.mage_flow import vae as mage

    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(SEED)
    Tiny = tiny_class()

    # The released names and shapes.
    with torch.device("meta"):
        released = mage.MageVAE()
    shapes = [[raw_name(n), list(p.shape)] for n, p in released.state_dict().items()]
    shapes += [[n, s] for n, s in DROPPED.items()]
    with open(f"{OUT}/released_shapes.json", "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(e) for e in shapes) + "\n]\n")
    by_name = dict((n, s) for n, s in shapes)
    assert by_name["student.dconv_encoder.proj_out.weight"] == [256, 384, 1, 1]
    assert by_name["student.dconv_encoder.patch_cond_embed.weight"] == [768, 3, 16, 16]
    assert by_name["pipeline.y_embedder_x.weight"] == [32 * 256, 384, 1, 1]
    assert by_name["pipeline.x_embedder.embedder.0.weight"] == [32, 3 + 32 + 64]
    assert by_name["pipeline.y_embedder.decoder.conv_in.weight"] == [384, 128, 3, 3]

    vae = Tiny().eval()
    g = torch.Generator().manual_seed(SEED)
    weights = draw_weights(vae, g)
    vae.load_state_dict(weights, strict=True)
    raw = {raw_name(n): v for n, v in weights.items()}
    for n, s in DROPPED.items():
        raw[n] = 0.1 * torch.randn(s, generator=g)
    save_file(raw, f"{OUT}/weights.safetensors")

    # Inputs: pixels in [0, 1] mapped as ComfyUI's process_input maps them.
    g = torch.Generator().manual_seed(SEED + 1)
    pixels = {
        "x1": torch.rand(1, 3, 32, 32, generator=g),
        "x2": torch.rand(2, 3, 48, 32, generator=g),
        "x3": torch.rand(1, 3, 37, 50, generator=g),
    }
    xs = {k: p * 2.0 - 1.0 for k, p in pixels.items()}
    crops = {"x1": xs["x1"], "x2": xs["x2"], "x3": xs["x3"][:, :, 2:34, 1:49]}
    zs = {
        "z1": torch.randn(1, 128, 2, 2, generator=g),
        "z2": torch.randn(2, 128, 3, 2, generator=g),
        "z3": torch.randn(1, 128, 34, 3, generator=g),
    }
    io = {}
    with torch.no_grad():
        for k, x in crops.items():
            io[k] = xs[k]
            io[f"encode_{k}"] = vae.encode(x)
        for k, z in zs.items():
            io[k] = z
            io[f"decode_{k}"] = vae.decode(z)
    assert io["encode_x1"].shape == (1, 128, 2, 2)
    assert io["encode_x2"].shape == (2, 128, 3, 2)
    assert io["encode_x3"].shape == (1, 128, 2, 3)
    assert io["decode_z3"].shape == (1, 3, 544, 48)
    for k, v in io.items():
        assert torch.isfinite(v).all(), k
        print(f"{k}: {list(v.shape)} std {v.std():.3f} max {v.abs().max():.3f}")
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")

    print("CROSS-CHECKS:")
    # The file through ComfyUI's VAE: recognised, renamed, dropped, loaded into exactly the tiny state.
    saved = load_file(f"{OUT}/weights.safetensors")
    real_class = mage.MageVAE
    mage.MageVAE = Tiny
    try:
        wrapper = comfy.sd.VAE(sd=dict(saved), dtype=torch.float32)
    finally:
        mage.MageVAE = real_class
    assert isinstance(wrapper.first_stage_model, Tiny)
    assert (wrapper.latent_channels, wrapper.downscale_ratio, wrapper.upscale_ratio) == (128, 16, 16)
    state = wrapper.first_stage_model.state_dict()
    assert set(state) == set(weights), sorted(set(state) ^ set(weights))[:8]
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    print("  comfy.sd.VAE: the file's renames and drops give the tiny state exactly")
    with torch.no_grad():
        for k, p in pixels.items():
            got = wrapper.encode(p.permute(0, 2, 3, 1))
            err = rel_err(got, io[f"encode_{k}"])
            print(f"  VAE.encode({k} in [0, 1]) vs MageVAE.encode: {err:.2e}")
            assert err < 1e-6, k
        for k, z in zs.items():
            got = wrapper.decode(z).permute(0, 3, 1, 2)
            want = ((io[f"decode_{k}"] + 1.0) / 2.0).clamp(0.0, 1.0)
            err = float((got - want).abs().max())
            print(f"  VAE.decode({k}) vs MageVAE.decode mapped to [0, 1]: {err:.2e}")
            assert err < 1e-6, k
        vae64 = Tiny().eval()
        vae64.load_state_dict(weights, strict=True)
        vae64 = vae64.double()
        for k, x in crops.items():
            err = rel_err(io[f"encode_{k}"], vae64.encode(x.double()))
            print(f"  encode {k}: f32 vs f64 {err:.2e}")
            assert err < 1e-5
        for k, z in zs.items():
            err = rel_err(io[f"decode_{k}"], vae64.decode(z.double()))
            print(f"  decode {k}: f32 vs f64 {err:.2e}")
            assert err < 2e-5

    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        print(f"  {name:30} {size:9d} bytes")
    print(f"  total {total} bytes")
    assert total < 5_000_000


if __name__ == "__main__":
    main()
