"""Fixtures for HunyuanVideo 1.0's VAE (engine/models/tests/fixtures/kl_video_vae/): the network of
`hunyuan_video_vae_bf16.safetensors`, also Kandinsky 5's video VAE, is ComfyUI's AutoencoderKL with 3-D convolutions
(comfy/sd.py:776-790 builds it for a file with `decoder.conv_in.conv.weight` after the HunyuanVideo 1.5 and CogVideoX
checks); here a tiny random one built by ComfyUI's own classes, and what ComfyUI computes with it.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; nothing here imports
a node module):
    COMFYUI_DIR=/work/ref/ComfyUI $(scripts/reference/setup.sh) scripts/reference/kl_video_vae.py
It takes a few seconds on the CPU and is reproducible: a second run writes byte-identical files (every random value
comes from seeded torch generators).

ComfyUI code this relies on (dm.py is comfy/ldm/modules/diffusionmodules/model.py, ae.py is
comfy/ldm/models/autoencoder.py):
- sd.py:776-790: ddconfig {double_z, z_channels (= decoder.conv_in.conv.weight.shape[1], 16 released), resolution 256,
  in_channels 3, out_ch 3, ch 128, ch_mult [1, 2, 4, 4], num_res_blocks 2, attn_resolutions [], dropout 0, conv3d True,
  time_compress 4}; AutoencoderKL(ddconfig, embed_dim = post_quant_conv.weight.shape[1]). Frames: 4 (t - 1) + 1
  decoded, floor((T + 3) / 4) encoded; 8x in space. VAE.encode only crops (H, W) to multiples of 8 (centred) and maps
  [0, 1] to [-1, 1]; VAE.decode maps back and clamps; neither touches the frames. The latent format's 0.476986 is
  the sampler's (process_latent_in/out), not the VAE's.
- ae.py:204-266 AutoencodingEngineLegacy: encode = quant_conv(Encoder(x)) (a 1x1x1 Conv3d, 2z -> 2 embed) then
  DiagonalGaussianRegularizer (sample False): the MEAN, channels 0..embed; decode = Decoder(post_quant_conv(z)).
- dm.py Encoder / Decoder with conv3d and no attn_resolutions: conv_op = CarriedConv3d (a plain Conv3d without
  padding, state names `<name>.conv.weight`), the mid AttnBlock's q/k/v/proj_out plain 1x1x1 Conv3d (`q.weight`),
  Normalize = GroupNorm(32 groups FIXED, eps 1e-6, affine): over (C/32, T, H, W) of whatever 5-D tensor it gets.
  * conv_carry_causal_3d (dm.py:66-85): every 3x3x3 CarriedConv3d, the strided downsamples included, pads its input
    by REPLICATE: 1 each side in h and w, 2 frames in FRONT (the first frame repeated) when no carry comes in; a
    carried chunk gets the previous chunk's last 2 PADDED input frames in front instead. nin_shortcut (a 1x1x1
    CarriedConv3d) is called directly: no padding, no carry.
  * ResnetBlock (dm.py:174-234, temb_channels 0: no temb_proj): conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))) + shortcut.
  * AttnBlock (dm.py:340-393): GN, q/k/v, ONE head of C channels over ALL T*H*W positions of the 5-D tensor (no
    causal mask between frames), scale C^-0.5, x + proj_out.
  * Downsample (dm.py:143-171): the 3x3x3 conv through conv_carry_causal_3d with stride (1, 2, 2) at encoder level
    0 and 2 (time too) at levels 1 and 2 ((levels - 1 - i) > log2(4) -> spatial only).
  * Upsample (dm.py:109-140): nearest 2x (time too at decoder levels 2 and 1; (1, 2, 2) at level 3); when no carry
    comes in (a clip's first chunk) the FIRST frame is upsampled in space only; then the conv, carried.
  * Encoder.forward (dm.py:633-682): frames past 1 + 4k are dropped; chunks [frame 0], then 8 (2 * time_compress)
    frames at a time (the last 4 when 4 remain), each through conv_in and the levels with the carry; the chunks'
    outputs concatenated; mid (block_1, attn_1, block_2), norm_out, SiLU, conv_out on the WHOLE latent, uncarried.
  * Decoder.forward (dm.py:783-827): conv_in and mid on the WHOLE latent, then CHUNKS OF 2 LATENT FRAMES
    (torch.split(h, 2, dim=2)) through the levels, norm_out, SiLU and conv_out, carried.
  So ComfyUI's chunks are part of its numbers: every GroupNorm of the levels normalises over one chunk's frames, and
  a stride-2 temporal conv after the one-frame first chunk reads windows (x0, x0, x1), (x1, x2, x3), ... (the carry
  is the first chunk's padded (x0, x0)), where a whole-clip causal conv reads (x0, x0, x0), (x0, x1, x2), .... Both
  differences are measured below (ComfyUI chunked vs the same network run on the whole clip).

The tiny config (released values in brackets): ch 32 [128], ch_mult [1, 1, 1, 2] [1, 2, 4, 4] (level widths
[32, 32, 32, 64] [128, 256, 512, 512]), z_channels 4 [16], embed_dim 4 [16], 2 res blocks [2], time_compress 4 [4].
GroupNorm's 32 groups are fixed by Normalize, so every width is a multiple of 32; ch_mult [1, 2, 4, 4] at ch 32 is
15.4M weights (31 MB at bf16), and of the 32-wide nets with a width change (nin_shortcut on both sides) [1, 1, 1, 2]
is the one whose widest level is the middle's, as released. It is 3.1M weights: stored with the 3x3x3 kernels as
fp8 e4m3 and everything else bf16 (3.2 MB); the references run in f32 on exactly those values.

Weights: every state_dict entry drawn from one seeded generator: conv weights N(0, 1) / sqrt(fan_in) (fan_in =
numel / rows), biases 0.1 N, GroupNorm weights 1 + 0.2 N and biases 0.1 N.

Writes engine/models/tests/fixtures/kl_video_vae/:
- vae.safetensors: AutoencoderKL.state_dict() (ComfyUI's names, as the released file has them), 3x3x3 kernels fp8
  e4m3, the rest bf16.
- vae_io.safetensors (f32), per case: `{c}.x`, `{c}.out` (encode: the latent mean; decode: the frames, unclamped).
- vae_cases.json: the config and the cases ([{name, description, op, x_shape, out_shape}]).
- released_shapes.json: [[name, shape], ...] of ComfyUI's AutoencoderKL with sd.py's ddconfig and z = embed = 16
  (built on the meta device): the released file's names and shapes, for detection tests.

Checks: the module holds exactly the written values; a plain-torch restatement of the network written here from the
code above (not calling ComfyUI's modules), run with ComfyUI's chunks, matches ComfyUI on every case exactly (0.0 in
f64 and in f32: the same torch ops in the same order), and ComfyUI's f64 run is 1.5e-6 .. 2.1e-6 from its recorded
f32 one; the same restatement run on the whole clip with diffusers' frame-causal mid attention matches diffusers'
AutoencoderKLHunyuanVideo (an independent implementation of the original network, the weights renamed) on every case,
and diffusers matches ComfyUI exactly where chunks and the mask cannot matter (one frame); ComfyUI's chunked results
differ from the whole-clip ones (printed); 7 frames encode exactly like their first 5. The errors are printed at the
end of a run.
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/kl_video_vae")
SEED = 1010
PER_FILE = 5_000_000

GROUPS = 32
DDCONFIG = {"double_z": True, "z_channels": 4, "resolution": 256, "in_channels": 3, "out_ch": 3, "ch": 32,
            "ch_mult": [1, 1, 1, 2], "num_res_blocks": 2, "attn_resolutions": [], "dropout": 0.0, "conv3d": True,
            "time_compress": 4}
EMBED = 4
RELEASED = {**DDCONFIG, "ch": 128, "ch_mult": [1, 2, 4, 4], "z_channels": 16}
RELEASED_EMBED = 16
WIDTHS = [DDCONFIG["ch"] * m for m in DDCONFIG["ch_mult"]]
LEVELS = len(WIDTHS)
BLOCKS = DDCONFIG["num_res_blocks"]
TEMPORAL_DOWN = [False, True, True]  # encoder levels 0..2
TEMPORAL_UP = {1: True, 2: True, 3: False}  # decoder levels (ComfyUI's i_level)
Z = DDCONFIG["z_channels"]

# name: (op, shape, description)
CASES = {
    "encode_image": ("encode", [1, 3, 1, 32, 48], "an image as a one-frame clip -> [1, 4, 1, 4, 6]"),
    "encode_9f": ("encode", [1, 3, 9, 24, 32], "9 frames -> 3 latent frames (ComfyUI's chunks [0], [1..8])"),
    "encode_5f": ("encode", [1, 3, 5, 32, 24], "5 frames -> 2 latent frames (chunks [0], [1..4])"),
    "encode_13f": ("encode", [1, 3, 13, 24, 24], "13 frames -> 4 latent frames (chunks [0], [1..8], [9..12])"),
    "decode_1f": ("decode", [1, Z, 1, 4, 6], "one latent frame -> 1 frame of 32x48"),
    "decode_3f": ("decode", [1, Z, 3, 3, 4], "3 latent frames -> 9 frames of 24x32 (chunks [0, 1], [2])"),
    "decode_5f": ("decode", [1, Z, 5, 3, 3], "5 latent frames -> 17 frames of 24x24 (chunks [0, 1], [2, 3], [4])"),
}


class Draw:
    """The one seeded generator every value comes from."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, shape, std, mean=0.0):
        return mean + std * torch.randn(shape, generator=self.g)


def build(ddconfig=DDCONFIG, embed=EMBED):
    from comfy.ldm.models.autoencoder import AutoencoderKL

    return AutoencoderKL(ddconfig=dict(ddconfig), embed_dim=embed).eval()


def draw_weights(draw, module):
    """Every state_dict entry drawn (see the docstring's rule) and rounded to its stored type."""
    norms = {n for n, m in module.named_modules() if isinstance(m, torch.nn.GroupNorm)}
    stored = {}
    for name, p in module.state_dict().items():
        owner = name.rsplit(".", 1)[0]
        if owner in norms:
            v = draw.normal(p.shape, 0.2, 1.0) if name.endswith(".weight") else draw.normal(p.shape, 0.1)
        elif name.endswith(".bias"):
            v = draw.normal(p.shape, 0.1)
        else:
            assert p.ndim == 5, name
            v = draw.normal(p.shape, 1.0 / math.sqrt(p[0].numel()))
        kernel = p.ndim == 5 and tuple(p.shape[2:]) == (3, 3, 3)
        stored[name] = v.to(torch.float8_e4m3fn if kernel else torch.bfloat16).contiguous()
    return stored


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max())


CROSS = []


def report(name, err, bound=None, above=None):
    CROSS.append(f"{name}: {err:.2e}")
    print(f"  {name}: max |diff| / max |ref| = {err:.2e}")
    if bound is not None:
        assert err < bound, (name, err)
    if above is not None:
        assert err > above, (name, err)


# ---------------------------------------------------------------------------- the network restated in plain torch
#
# `carry` is None for an uncarried pass (a whole clip, or ComfyUI's middle); else a dict shared by a clip's chunks,
# holding each carried convolution's last two padded input frames under its name.


def r_conv(W, p, x, carry, stride=1):
    """The CarriedConv3d `p` on x: replicate-padded by one in space, and in front by the carried frames (or the
    first frame twice)."""
    x = F.pad(x, (1, 1, 1, 1, 0, 0), mode="replicate")
    front = carry[p] if carry is not None and p in carry else x[:, :, :1].repeat(1, 1, 2, 1, 1)
    x = torch.cat([front, x], 2)
    if carry is not None:
        carry[p] = x[:, :, -2:]
    return F.conv3d(x, W[f"{p}.conv.weight"], W[f"{p}.conv.bias"], stride=stride)


def r_gn(W, p, x):
    return F.group_norm(x, GROUPS, W[f"{p}.weight"], W[f"{p}.bias"], 1e-6)


def r_res(W, p, x, carry):
    h = r_conv(W, f"{p}.conv1", F.silu(r_gn(W, f"{p}.norm1", x)), carry)
    h = r_conv(W, f"{p}.conv2", F.silu(r_gn(W, f"{p}.norm2", h)), carry)
    if f"{p}.nin_shortcut.conv.weight" in W:
        x = F.conv3d(x, W[f"{p}.nin_shortcut.conv.weight"], W[f"{p}.nin_shortcut.conv.bias"])
    return x + h


def r_attn(W, p, x, frame_causal):
    b, c, t, h, w = x.shape
    n = r_gn(W, f"{p}.norm", x)
    q, k, v = (F.conv3d(n, W[f"{p}.{s}.weight"], W[f"{p}.{s}.bias"]).reshape(b, c, -1) for s in "qkv")
    scores = q.transpose(1, 2) @ k / math.sqrt(c)  # [B, L, L], positions in (t, h, w) order
    if frame_causal:
        frame = torch.arange(t).repeat_interleave(h * w)
        scores = scores.masked_fill(frame[None, :] > frame[:, None], float("-inf"))
    o = (v @ torch.softmax(scores, -1).transpose(1, 2)).reshape(b, c, t, h, w)
    return x + F.conv3d(o, W[f"{p}.proj_out.weight"], W[f"{p}.proj_out.bias"])


def r_middle(W, side, x, frame_causal):
    x = r_res(W, f"{side}.mid.block_1", x, None)
    x = r_attn(W, f"{side}.mid.attn_1", x, frame_causal)
    return r_res(W, f"{side}.mid.block_2", x, None)


def r_up(W, p, x, temporal, carry):
    """Nearest 2x (in time too when `temporal`, but a clip's first frame in space only), then the conv."""
    first = carry is None or f"{p}.conv" not in carry
    if temporal:
        head, rest = (x[:, :, :1], x[:, :, 1:]) if first else (x[:, :, :0], x)
        head = head.repeat_interleave(2, 3).repeat_interleave(2, 4)
        rest = rest.repeat_interleave(2, 2).repeat_interleave(2, 3).repeat_interleave(2, 4)
        x = torch.cat([head, rest], 2)
    else:
        x = x.repeat_interleave(2, 3).repeat_interleave(2, 4)
    return r_conv(W, f"{p}.conv", x, carry)


def r_encode(W, x, chunked, frame_causal):
    x = x[:, :, :1 + ((x.shape[2] - 1) // 4) * 4]
    if chunked:
        parts = [x[:, :, :1]] + [c for c in x[:, :, 1:].split(8, 2) if c.shape[2] > 0]
        carry = {}
    else:
        parts, carry = [x], None
    latents = []
    for part in parts:
        h = r_conv(W, "encoder.conv_in", part, carry)
        for i in range(LEVELS):
            for j in range(BLOCKS):
                h = r_res(W, f"encoder.down.{i}.block.{j}", h, carry)
            if i < LEVELS - 1:
                h = r_conv(W, f"encoder.down.{i}.downsample.conv", h, carry,
                           stride=2 if TEMPORAL_DOWN[i] else (1, 2, 2))
        latents.append(h)
    h = r_middle(W, "encoder", torch.cat(latents, 2), frame_causal)
    h = r_conv(W, "encoder.conv_out", F.silu(r_gn(W, "encoder.norm_out", h)), None)
    moments = F.conv3d(h, W["quant_conv.weight"], W["quant_conv.bias"])
    return moments[:, :EMBED]


def r_decode(W, z, chunked, frame_causal):
    h = F.conv3d(z, W["post_quant_conv.weight"], W["post_quant_conv.bias"])
    h = r_conv(W, "decoder.conv_in", h, None)
    h = r_middle(W, "decoder", h, frame_causal)
    parts, carry = (list(h.split(2, 2)), {}) if chunked else ([h], None)
    out = []
    for part in parts:
        x = part
        for i in reversed(range(LEVELS)):
            for j in range(BLOCKS + 1):
                x = r_res(W, f"decoder.up.{i}.block.{j}", x, carry)
            if i > 0:
                x = r_up(W, f"decoder.up.{i}.upsample", x, TEMPORAL_UP[i], carry)
        x = r_conv(W, "decoder.conv_out", F.silu(r_gn(W, "decoder.norm_out", x)), carry)
        out.append(x)
    return torch.cat(out, 2)


# ------------------------------------------------------------------------------------------- diffusers' network


def diffusers_name(name):
    """ComfyUI's name -> diffusers' AutoencoderKLHunyuanVideo name."""
    if name.startswith(("quant_conv.", "post_quant_conv.")):
        return name
    side, rest = name.split(".", 1)
    p = rest.split(".")
    renames = {"mid.block_1": "mid_block.resnets.0", "mid.block_2": "mid_block.resnets.1",
               "mid.attn_1.norm": "mid_block.attentions.0.group_norm", "mid.attn_1.q": "mid_block.attentions.0.to_q",
               "mid.attn_1.k": "mid_block.attentions.0.to_k", "mid.attn_1.v": "mid_block.attentions.0.to_v",
               "mid.attn_1.proj_out": "mid_block.attentions.0.to_out.0", "norm_out": "conv_norm_out"}
    for old, new in renames.items():
        if rest.startswith(old + "."):
            rest = new + rest[len(old):]
            break
    else:
        if p[0] == "down":
            rest = f"down_blocks.{p[1]}." + (f"resnets.{p[3]}." + ".".join(p[4:]) if p[2] == "block"
                                              else "downsamplers.0." + ".".join(p[3:]))
        elif p[0] == "up":
            i = LEVELS - 1 - int(p[1])
            rest = f"up_blocks.{i}." + (f"resnets.{p[3]}." + ".".join(p[4:]) if p[2] == "block"
                                         else "upsamplers.0." + ".".join(p[3:]))
    return f"{side}.{rest.replace('nin_shortcut', 'conv_shortcut')}"


def build_diffusers(weights):
    from diffusers import AutoencoderKLHunyuanVideo

    vae = AutoencoderKLHunyuanVideo(in_channels=3, out_channels=3, latent_channels=Z, block_out_channels=WIDTHS,
                                    layers_per_block=BLOCKS, norm_num_groups=GROUPS, spatial_compression_ratio=8,
                                    temporal_compression_ratio=4).eval()
    # Whole clips, as the original network runs them (its frame tiling starts at 17 frames / 5 latent frames).
    vae.use_framewise_encoding = False
    vae.use_framewise_decoding = False
    want = vae.state_dict()
    sd = {}
    for name, v in weights.items():
        new = diffusers_name(name)
        assert new in want, (name, new)
        sd[new] = v.reshape(want[new].shape)
    assert set(sd) == set(want), sorted(set(sd) ^ set(want))[:8]
    vae.load_state_dict(sd, strict=True)
    return vae


# ------------------------------------------------------------------------------------------------------ the fixture


def main():
    import_comfyui()
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)

    with torch.device("meta"):
        released = build(RELEASED, RELEASED_EMBED)
    released_shapes = [[n, list(p.shape)] for n, p in released.state_dict().items()]
    shape = dict((n, s) for n, s in released_shapes)
    assert shape["decoder.conv_in.conv.weight"] == [512, 16, 3, 3, 3]
    assert shape["post_quant_conv.weight"] == [16, 16, 1, 1, 1]
    assert shape["quant_conv.weight"] == [32, 32, 1, 1, 1]
    assert shape["encoder.down.1.block.0.nin_shortcut.conv.weight"] == [256, 128, 1, 1, 1]
    assert shape["encoder.mid.attn_1.q.weight"] == [512, 512, 1, 1, 1]
    with open(f"{OUT}/released_shapes.json", "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(e) for e in released_shapes) + "\n]\n")

    vae = build()
    stored = draw_weights(Draw(SEED), vae)
    # The same names but for the shortcuts, which sit where the widths change.
    plain = lambda names: [n for n in names if ".nin_shortcut." not in n]  # noqa: E731
    assert plain(n for n, _ in released_shapes) == plain(stored), "the tiny and released nets' names"
    assert sorted({n.split(".nin_shortcut.")[0] for n in stored if ".nin_shortcut." in n}) == [
        "decoder.up.2.block.0", "encoder.down.3.block.0"]
    save_file(stored, f"{OUT}/vae.safetensors")
    stored = load_file(f"{OUT}/vae.safetensors")
    weights = {k: v.float() for k, v in stored.items()}
    vae.load_state_dict(weights, strict=True)
    assert all(torch.equal(vae.state_dict()[k], v) for k, v in weights.items())
    enc = vae.encoder
    assert enc.carried and vae.decoder.carried and enc.time_compress == 4
    strides = [enc.down[i].downsample.conv.conv.stride for i in range(LEVELS - 1)]
    assert strides == [(1, 2, 2), (2, 2, 2), (2, 2, 2)], strides
    scales = {i: vae.decoder.up[i].upsample.scale_factor for i in range(1, LEVELS)}
    assert scales == {1: 2.0, 2: 2.0, 3: (1.0, 2.0, 2.0)}, scales

    draw = Draw(SEED + 1)
    io, cases = {}, []
    with torch.no_grad():
        for name, (op, shape, desc) in CASES.items():
            if op == "encode":
                x = torch.rand(shape, generator=draw.g) * 2 - 1  # [-1, 1] pixels
                out = vae.encode(x)
            else:
                x = draw.normal(shape, 1.0)
                out = vae.decode(x)
            io[f"{name}.x"], io[f"{name}.out"] = x, out
            assert torch.isfinite(out).all()
            print(f"VAE {name}: {list(x.shape)} -> {list(out.shape)} std {out.std():.3f} max {out.abs().max():.3f}")
            cases.append({"name": name, "description": desc, "op": op, "x_shape": list(x.shape),
                          "out_shape": list(out.shape)})
        assert io["encode_image.out"].shape == (1, EMBED, 1, 4, 6)
        assert io["encode_9f.out"].shape == (1, EMBED, 3, 3, 4)
        assert io["encode_5f.out"].shape == (1, EMBED, 2, 4, 3)
        assert io["encode_13f.out"].shape == (1, EMBED, 4, 3, 3)
        assert io["decode_1f.out"].shape == (1, 3, 1, 32, 48)
        assert io["decode_3f.out"].shape == (1, 3, 9, 24, 32)
        assert io["decode_5f.out"].shape == (1, 3, 17, 24, 24)

        # Frames past the last 1 + 4k are dropped: 7 frames encode exactly like their first 5.
        seven = torch.cat([io["encode_5f.x"], io["encode_5f.x"][:, :, :2].flip(2)], 2)
        assert torch.equal(vae.encode(seven), io["encode_5f.out"])

        vae64 = build()
        vae64.load_state_dict(weights, strict=True)
        vae64 = vae64.double()
        w64 = {k: v.double() for k, v in weights.items()}
        diffusers = build_diffusers(weights)
        for name, (op, _, _) in CASES.items():
            x, want = io[f"{name}.x"], io[f"{name}.out"]
            run = r_encode if op == "encode" else r_decode
            ref64 = vae64.encode(x.double()) if op == "encode" else vae64.decode(x.double())
            report(f"{name}: restatement with ComfyUI's chunks vs ComfyUI, both f64",
                   rel_err(run(w64, x.double(), True, False), ref64), 1e-12)
            report(f"{name}: restatement with ComfyUI's chunks vs ComfyUI, both f32",
                   rel_err(run(weights, x, True, False), want), 1e-5)
            report(f"{name}: ComfyUI f64 vs the recorded ComfyUI f32", rel_err(ref64, want.double()), 1e-5)
            theirs = diffusers.encode(x).latent_dist.mean if op == "encode" else diffusers.decode(x).sample
            report(f"{name}: restatement on the whole clip, frame-causal attention, vs diffusers (f32)",
                   rel_err(run(weights, x, False, True), theirs), 1e-5)
            one_frame = x.shape[2] == 1
            report(f"{name}: diffusers vs ComfyUI (f32)", rel_err(theirs, want),
                   bound=1e-5 if one_frame else None, above=None if one_frame else 1e-3)
            if not one_frame:
                # ComfyUI's own math without its chunks (and without a mask): still not its chunked result.
                report(f"{name}: restatement on the whole clip (no mask) vs ComfyUI's chunked (f32)",
                       rel_err(run(weights, x, False, False), want), above=1e-3)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/vae_io.safetensors")
    with open(f"{OUT}/vae_cases.json", "w") as f:
        json.dump({
            "config": {**DDCONFIG, "embed_dim": EMBED, "widths": WIDTHS},
            "released_config": {**RELEASED, "embed_dim": RELEASED_EMBED,
                                "widths": [RELEASED["ch"] * m for m in RELEASED["ch_mult"]]},
            "seed": SEED,
            "storage": "3x3x3 kernels fp8 e4m3, the rest bf16; references in f32 on exactly those values",
            "encode_is": "AutoencoderKL.encode(x): Encoder (ComfyUI's chunks: [frame 0], then 8 frames), quant_conv, "
                         "the mean (channels 0..embed); x in [-1, 1], [B, 3, T, H, W]; no latent scaling",
            "decode_is": "AutoencoderKL.decode(z) = Decoder(post_quant_conv(z)) (chunks of 2 latent frames), unclamped",
            "frames": "latent t = floor((T + 3) / 4) (frames past 1 + 4k dropped); decoded T = 4 (t - 1) + 1",
            "cases": cases}, f, indent=1)
        f.write("\n")

    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        print(f"  {name:30} {size:9d} bytes")
        assert size < PER_FILE, (name, size)
    print(f"  total {total} bytes")
    print("CROSS-CHECKS (max |diff| / max |ref|):")
    for line in CROSS:
        print("  " + line)


if __name__ == "__main__":
    main()
