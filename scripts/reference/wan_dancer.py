"""Fixtures for Kiln's WanDancer DiT: ComfyUI's own WanDancerModel (comfy/ldm/wan/model_wandancer.py at
0f1fa67a) on wan.py's tiny "i2v" weights (dim 256 = 2 heads x 128, ffn 128, 2 blocks, in 36, out 16, text width
32, CLIP width 32 with 32-wide MLPProjs swapped in for img_emb and img_emb_refimage), plus WanDancer's own parts
drawn here (seed 5, bf16-rounded): patch_embedding_global, head_global, img_emb_refimage, music_projection (35 ->
32), two music encoder layers of width 32 (4 heads of 8; ComfyUI fixes their feed-forward at 1024) and music
injector 0 (the only one a 2-block model reaches: ComfyUI injects after blocks 0, 4, ..., 27). Nothing of ComfyUI's
is reimplemented; the model is called as WAN22_WanDancer's apply_model calls it (net(x, t, context, clip_fea=,
clip_fea_ref=, audio_embed=, fps=, audio_inject_scale=, transformer_options={}), the constants only where the
conditioning sets them).

Run from the repository root with the reference venv:
    COMFYUI_DIR=/tmp/comfy target/reference-venv/bin/python scripts/reference/wan_dancer.py

Writes engine/models/tests/fixtures/wan/dancer.safetensors (f32):
- `w.<name>`: the WanDancer parts in the released files' form (each music encoder layer's q, k and v joined as
  `self_attn.in_proj_weight` / `in_proj_bias`, which ComfyUI's WAN22_WanDancer.process_unet_state_dict splits);
  the body's weights are wan.py's i2v variant.
- inputs (seed 9): `x` [1, 36, 3, 8, 8] (16 tokens a latent frame: two per music row), `t` [1] = 700,
  `context` [1, 6, 32], `clip` [1, 5, 32], `clip_ref` [1, 5, 32], `music` [1, 40, 35]; `x2` [2, 36, 3, 8, 8]
  (sample 0 = x), `t2` [2] = (700, 300), `context2` [2, 6, 32] (sample 0 = context).
- outputs [B, 16, 3, 8, 8]:
  - `out.plain`: x, t, context, clip (no music, no reference, fps 30);
  - `out.music`: with music at fps 30 (the plain patch embedding and head), scale 1;
  - `out.global`: music at fps 15 (the _global patch embedding and head, time positions 0, 2, 4 -> last
    int(2 * 3 + 0.5) - 1 = 5), audio_inject_scale 0.7, clip_ref;
  - `out.fps10`: music at fps 10 (positions 0, 3, 6 -> last int(3 * 3 + 0.5) - 1 = 8), clip_ref;
  - `out.noclip`: music at fps 30 without either CLIP input (context_img_len 0: the image attention reads no
    tokens, where a plain WanModel I2V call reads the text there);
  - `out.batch2`: x2, t2, context2 with music, clip and clip_ref repeated to 2 (CONDRegular.process_cond), fps 15.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import CLIP, DIM, FFN, HEADS, LAYERS, OUT, TEXT, variant  # noqa: E402

MUSIC_WIDTH, MUSIC_FEATURES, MUSIC_FFN, MUSIC_LAYERS = 32, 35, 1024, 2


def drawn(shape, g, fan_in=None, around=0.0):
    """A bf16-rounded random weight: N(around, 1 / fan_in) (0.1 for vectors)."""
    scale = fan_in ** -0.5 if fan_in else 0.1
    return (around + torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).float()


def dancer_parts():
    """WanDancer's own weights, in ComfyUI's module names (q_proj, k_proj, v_proj split)."""
    g = torch.Generator().manual_seed(5)
    w = {}

    def linear(name, rows, cols):
        w[f"{name}.weight"] = drawn((rows, cols), g, cols)
        w[f"{name}.bias"] = drawn((rows,), g)

    def norm(name, width):
        w[f"{name}.weight"] = drawn((width,), g, around=1.0)
        w[f"{name}.bias"] = drawn((width,), g)

    w["patch_embedding_global.weight"] = drawn((DIM, 36, 1, 2, 2), g, 36 * 4)
    w["patch_embedding_global.bias"] = drawn((DIM,), g)
    w["head_global.modulation"] = drawn((1, 2, DIM), g)
    linear("head_global.head", 4 * 16, DIM)
    norm("img_emb_refimage.proj.0", CLIP)
    linear("img_emb_refimage.proj.1", CLIP, CLIP)
    linear("img_emb_refimage.proj.3", DIM, CLIP)
    norm("img_emb_refimage.proj.4", DIM)
    linear("music_projection", MUSIC_WIDTH, MUSIC_FEATURES)
    for layer in range(MUSIC_LAYERS):
        at = f"music_encoder.{layer}"
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(f"{at}.self_attn.{p}", MUSIC_WIDTH, MUSIC_WIDTH)
        linear(f"{at}.linear1", MUSIC_FFN, MUSIC_WIDTH)
        linear(f"{at}.linear2", MUSIC_WIDTH, MUSIC_FFN)
        norm(f"{at}.norm1", MUSIC_WIDTH)
        norm(f"{at}.norm2", MUSIC_WIDTH)
    for p in ("q", "k", "v", "o"):
        linear(f"music_injector.injector.0.{p}", DIM, DIM)
    w["music_injector.injector.0.norm_q.weight"] = drawn((DIM,), g, around=1.0)
    w["music_injector.injector.0.norm_k.weight"] = drawn((DIM,), g, around=1.0)
    return w


def released(parts):
    """The parts as a released file holds them: each music layer's q, k and v joined into in_proj."""
    out = {}
    for name, value in parts.items():
        if ".self_attn.q_proj." in name:
            suffix = name.rsplit(".", 1)[1]
            stem = name.split(".self_attn.")[0] + ".self_attn"
            joined = torch.cat([parts[f"{stem}.{p}_proj.{suffix}"] for p in ("q", "k", "v")])
            out[f"{stem}.in_proj_{suffix}"] = joined
        elif ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        else:
            out[name] = value
    return out


def dancer_net(body, parts):
    """ComfyUI's WanDancerModel at the tiny configuration, f32, loaded through its own state-dict split."""
    import comfy.ops
    import comfy.supported_models
    from comfy.ldm.wan.model import MLPProj
    from comfy.ldm.wan.model_wandancer import WanDancerModel

    ops = comfy.ops.disable_weight_init
    net = WanDancerModel(patch_size=(1, 2, 2), in_dim=36, dim=DIM, ffn_dim=FFN, freq_dim=256, text_dim=TEXT,
                         out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6, operations=ops,
                         music_dim=MUSIC_WIDTH, music_heads=4, music_feature_dim=MUSIC_FEATURES,
                         music_latent_dim=MUSIC_WIDTH).eval()
    settings = {"operations": ops, "device": None, "dtype": None}
    net.img_emb = MLPProj(CLIP, DIM, operation_settings=settings)
    net.img_emb_refimage = MLPProj(CLIP, DIM, operation_settings=settings)
    entry = comfy.supported_models.WAN22_WanDancer({"image_model": "wan2.1", "model_type": "wandancer", "in_dim": 36})
    state = entry.process_unet_state_dict({**{k: v.float() for k, v in body.items()}, **released(parts)})
    result = net.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    unused = [k for k in result.missing_keys if not k.startswith("music_injector.injector.")]
    assert not unused, unused
    return net


def call(net, x, t, context, clip, clip_ref=None, music=None, fps=None, scale=None):
    kwargs = {"clip_fea": clip}
    for name, value in (("clip_fea_ref", clip_ref), ("audio_embed", music), ("fps", fps),
                        ("audio_inject_scale", scale)):
        if value is not None:
            kwargs[name] = value
    with torch.no_grad():
        return net(x, t, context, transformer_options={}, **kwargs)


def main():
    import_comfyui()
    torch.manual_seed(0)
    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    body = variant(stored, "i2v", ti2v)
    parts = dancer_parts()
    net = dancer_net(body, parts)

    g = torch.Generator().manual_seed(9)
    io = {"x": torch.randn(1, 36, 3, 8, 8, generator=g), "t": torch.tensor([700.0]),
          "context": torch.randn(1, 6, TEXT, generator=g), "clip": torch.randn(1, 5, CLIP, generator=g),
          "clip_ref": torch.randn(1, 5, CLIP, generator=g), "music": torch.randn(1, 40, MUSIC_FEATURES, generator=g)}
    io["x2"] = torch.cat([io["x"], torch.randn(1, 36, 3, 8, 8, generator=g)])
    io["t2"] = torch.tensor([700.0, 300.0])
    io["context2"] = torch.cat([io["context"], torch.randn(1, 6, TEXT, generator=g)])
    x, t, context, clip, clip_ref, music = (io[k] for k in ("x", "t", "context", "clip", "clip_ref", "music"))
    io["out.plain"] = call(net, x, t, context, clip)
    io["out.music"] = call(net, x, t, context, clip, music=music, fps=30.0)
    io["out.global"] = call(net, x, t, context, clip, clip_ref, music, fps=15.0, scale=0.7)
    io["out.fps10"] = call(net, x, t, context, clip, clip_ref, music, fps=10.0)
    io["out.noclip"] = call(net, x, t, context, None, music=music, fps=30.0)
    two = lambda v: v.repeat(2, 1, 1)  # noqa: E731
    io["out.batch2"] = call(net, io["x2"], io["t2"], io["context2"], two(clip), two(clip_ref), two(music), fps=15.0)
    for case in ("music", "global", "fps10", "noclip"):
        moved = float((io[f"out.{case}"] - io["out.plain"]).abs().max())
        assert moved > 1e-3, f"{case} does not move the output ({moved})"
    tensors = {k: v.float().contiguous() for k, v in io.items()}
    tensors.update({f"w.{k}": v.contiguous() for k, v in released(parts).items()})
    save_file(tensors, f"{OUT}/dancer.safetensors")
    print(f"wrote {OUT}/dancer.safetensors ({os.path.getsize(f'{OUT}/dancer.safetensors')} bytes)")


if __name__ == "__main__":
    main()
