# Records the Z-Image NextDiT fixtures of engine/models/tests/it/zimage.rs from diffusers'
# `ZImageTransformer2DModel` (Apache-2.0), never from ComfyUI code.
#
# Run from the repository root:  $(scripts/reference/setup.sh) scripts/reference/zimage.py
# Writes engine/models/tests/fixtures/zimage/:
#   diffusers.safetensors  the tiny model's state dict as diffusers saves it (bf16)
#   comfy.safetensors      the same weights in ComfyUI's layout (fused qkv, renames of models.md §2.3) (bf16)
#   cases.safetensors      inputs and expected outputs (f32), in ComfyUI's convention (models.md §3.4):
#                          `{case}.x` [B,16,h,w], `{case}.sigmas` [B], `{case}.context` [B,N,cap], `{case}.out`
#                          [B,16,h,w] = −v_net, with diffusers called on x as (16,1,h,w) per sample and t = 1 − σ.
#
# The tiny model keeps Z-Image's structure (2 main layers, 2 + 2 refiners, 3 RoPE axes, θ 256, pad multiple 32,
# modulated blocks, caption RMSNorm + Linear, t-embedder) at dim 64 = 2 heads × 32 (axes 8/12/12). Two widths
# differ from a shrunken diffusers model on purpose, to keep the files small and show that Kiln derives them
# from shapes: the t-embedder's hidden width is 128 (diffusers hard-codes 1024; the module is rebuilt with the
# same class), and the FFN is diffusers' int(8·64/3) = 170 (ComfyUI would round it up to 256).
#
# Cases (batch rows share one caption length, so diffusers uses no attention mask — as ComfyUI, which never
# masks):
#   s1   batch 1, σ = 1.0 (t = 0), latent 6×10 (15 image tokens → 17 pad tokens), caption N = 7 (→ 25 pads)
#   s05  the same at σ = 0.5
#   b2   batch 2, σ = [0.3, 0.8], two different latents and captions (N = 7)
#   odd  batch 1, σ = 0.7, latent 5×7: diffusers cannot patchify odd sizes, so the reference is diffusers run on
#        the latent circularly padded to 6×8 (bottom/right, torch `F.pad(mode="circular")`) and cropped back —
#        what ComfyUI's pad-to-patch does around the same network.
import pathlib

import torch
import torch.nn.functional as F
from diffusers import ZImageTransformer2DModel
from diffusers.models.transformers.transformer_z_image import TimestepEmbedder
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parents[2] / "engine/models/tests/fixtures/zimage"
DIM, HEADS, CAP, N = 64, 2, 32, 7
T_HIDDEN = 128


def build() -> ZImageTransformer2DModel:
    torch.manual_seed(0)
    model = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=DIM,
        n_layers=2,
        n_refiner_layers=2,
        n_heads=HEADS,
        n_kv_heads=HEADS,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=CAP,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[8, 12, 12],
        axes_lens=[512, 64, 64],
    )
    model.t_embedder = TimestepEmbedder(min(DIM, 256), mid_size=T_HIDDEN)
    # Random values everywhere (diffusers zero-initialises the pad tokens; norms start at 1): every weight
    # then matters to the output. Scaled so activations stay O(1) through the blocks.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1 or "pad_token" in name:
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
            # Round to bf16 so the f32 reference uses exactly the values the bf16 files hold.
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model.eval()


def to_comfy(sd: dict) -> dict:
    """Diffusers' state dict in ComfyUI's layout (models.md §2.3), by plain tensor ops."""
    out = {}
    glob = {
        "all_x_embedder.2-1.": "x_embedder.",
        "all_final_layer.2-1.": "final_layer.",
    }
    for name, t in sd.items():
        if ".attention.to_k." in name or ".attention.to_v." in name:
            continue
        if ".attention.to_q." in name:
            q = t
            k = sd[name.replace(".to_q.", ".to_k.")]
            v = sd[name.replace(".to_q.", ".to_v.")]
            out[name.replace(".to_q.", ".qkv.")] = torch.cat([q, k, v], dim=0)
            continue
        new = name.replace(".attention.to_out.0.", ".attention.out.")
        new = new.replace(".attention.norm_q.", ".attention.q_norm.")
        new = new.replace(".attention.norm_k.", ".attention.k_norm.")
        for a, b in glob.items():
            if new.startswith(a):
                new = b + new[len(a):]
        out[new] = t
    return out


def run(model, x: torch.Tensor, sigmas: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """ComfyUI's output for x [B,16,h,w] (h, w even), σ [B], context [B,N,CAP]: −v_net."""
    xs = [xi.unsqueeze(1) for xi in x]  # (16, 1, h, w)
    caps = list(context)
    with torch.no_grad():
        v = model(xs, 1.0 - sigmas, caps, return_dict=False)[0]
    return -torch.stack([vi[:, 0] for vi in v])


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    model = build()
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file({k: v.to(torch.bfloat16) for k, v in sd.items()}, OUT / "diffusers.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in to_comfy(sd).items()}, OUT / "comfy.safetensors")

    g = torch.Generator().manual_seed(1)
    cases = {}

    def record(name, x, sigmas, context, out):
        cases[f"{name}.x"] = x
        cases[f"{name}.sigmas"] = sigmas
        cases[f"{name}.context"] = context
        cases[f"{name}.out"] = out

    x = torch.randn(1, 16, 6, 10, generator=g)
    ctx = torch.randn(1, N, CAP, generator=g)
    for name, s in (("s1", 1.0), ("s05", 0.5)):
        sig = torch.tensor([s])
        record(name, x, sig, ctx, run(model, x, sig, ctx))

    x2 = torch.randn(2, 16, 6, 10, generator=g)
    ctx2 = torch.randn(2, N, CAP, generator=g)
    sig2 = torch.tensor([0.3, 0.8])
    out2 = run(model, x2, sig2, ctx2)
    # Batch rows are independent: the batch-2 call equals two batch-1 calls.
    for i in range(2):
        single = run(model, x2[i : i + 1], sig2[i : i + 1], ctx2[i : i + 1])
        assert torch.allclose(single, out2[i : i + 1], atol=1e-5), "batch rows differ"
    record("b2", x2, sig2, ctx2, out2)

    xo = torch.randn(1, 16, 5, 7, generator=g)
    sigo = torch.tensor([0.7])
    padded = F.pad(xo, (0, 1, 0, 1), mode="circular")
    outo = run(model, padded, sigo, ctx)[:, :, :5, :7]
    record("odd", xo, sigo, ctx, outo)

    save_file({k: v.float().clone() for k, v in cases.items()}, OUT / "cases.safetensors")
    for f in sorted(OUT.iterdir()):
        print(f"{f.name}: {f.stat().st_size} bytes")
    print("s1 out std", cases["s1.out"].std().item(), "s05", cases["s05.out"].std().item())


if __name__ == "__main__":
    main()
