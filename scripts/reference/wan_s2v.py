"""Fixtures for Kiln's Wan 2.2 S2V (sound-to-video) DiT (engine/models/tests/fixtures/wan/s2v_weights.safetensors,
s2v.safetensors and s2v_released.json): ComfyUI's own code at 0f1fa67a, comfy/ldm/wan/model.py (WanModel_S2V with
CausalAudioEncoder / MotionEncoder_tc / CausalConv1d, AudioInjector_WAN with AdaLayerNorm, FramePackMotioner, and
the base WanModel's forward, rope_encode, repeat_e, Head and unpatchify), called as comfy/model_base.py's WAN22_S2V
calls it, and the audio bucketing of comfy_extras/nodes_wan.py's wan_sound_to_video (linear_interpolation,
get_audio_embed_bucket_fps, get_sample_indices).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan_s2v.py
(ComfyUI's imports need the extra pins listed in comfy_sampling.py; torchaudio gets comfyui.py's stand-in.)

The tiny model, its own weights (not wan.py's): WanModel_S2V(patch (1, 2, 2), in 16, dim 128 = 1 head of 128 (so
the released RoPE split 44/42/42 holds), ffn 64, freq 256, text 32, out 16, 5 blocks, eps 1e-6, audio_dim 8,
4 audio tokens, enable_adain, cond_dim 16, audio_inject_layers [0, 4], adain_mode "attn_norm", framepack_drop_mode
"padd"): injector 0 sits after block 0 and injector 1 after block 4 (the released list is [0, 4, 8, 12, 16, 20, 24,
27, 30, 33, 36, 39]: injector i after that list's i-th block). WanModel_S2V hard-codes 25 wav2vec2 layers in its
`casual_audio_encoder`; it is swapped for CausalAudioEncoder(dim 8, 3 layers, out 128, 4 tokens, need_global), the
same class. ComfyUI's detection (model_config_from_unet) gives WAN22_S2V for the file (it reads dim, heads = dim /
128, ffn, blocks, in and out; it leaves text_dim, audio_dim, the inject layers and the audio layer count at
WanModel_S2V's released defaults, so ComfyUI's own loader cannot build the tiny model; the check through
model_base.WAN22_S2V below sets them by hand).

Writes s2v_weights.safetensors: every weight of the module, ComfyUI's names (the state_dict's, no prefix), bf16;
values random (seed 41): biases 0.1 N, 1-D gains 1 + 0.2 N, modulation tables (`blocks.*.modulation`,
`head.modulation`) N / sqrt(128), `trainable_cond_mask.weight` and `casual_audio_encoder.encoder.padding_tokens`
0.5 N, `casual_audio_encoder.weights` N, every other matrix or kernel N / sqrt(fan-in). The references run in f32
on exactly these bf16 values. About 3.6 MB: the 5 blocks are 1.5 MB and the frame packer's `proj_4x` kernel
[128, 16, 4, 8, 8] alone 1 MB, at the shapes asked for.

Writes s2v.safetensors (every tensor f32):
- shared inputs (seed 7): `x` [1, 16, 3, 8, 8], `t` [1] (700), `context` [1, 6, 32], `audio` [1, 3, 8, 16]
  (B, encoder layers, width, audio frames: the model keeps the first 4 x latent frames = 12), `reference`
  [1, 16, 1, 8, 8], `motion` [1, 16, 5, 8, 8] (fewer than the packer's 19 frames: it zero-pads in front),
  `motion_long` [1, 16, 21, 8, 8] (it keeps the last 19), `control` [1, 16, 3, 8, 8]. `reference`, `motion`,
  `motion_long` and `control` are random tensors taken to be in model space already (WAN22_S2V.extra_conds hands
  the net process_latent_in of the node's latents; these stand for that result).
- outputs [1, 16, 3, 8, 8] of net(x, t, context, audio_embed=, reference_latent=, reference_motion=,
  control_video=, transformer_options={}) (WanModel.forward -> _forward -> WanModel_S2V.forward_orig): `out.full`
  (audio, reference, motion, control), `out.long_motion` (motion_long for motion), `out.no_motion` (no
  reference_motion: the timesteps are not interleaved), `out.no_audio` (no audio_embed), `out.plain` (x, t and
  context alone).
- batch 2: `x2` [2, 16, 3, 8, 8] (sample 0 is `x`), `t2` [2] (700, 300), `context2` [2, 6, 32] (sample 0 is
  `context`), and `out.batch2` [2, 16, 3, 8, 8] with audio, reference, motion and control of batch 1 repeated to
  2 by CONDRegular.process_cond (so out.batch2[0] equals out.full[0], checked).
- node pieces, ComfyUI's functions as wan_sound_to_video runs them: `bucket.states` [3, 41, 8] (3 random
  wav2vec2-like states of 41 frames, i.e. torch.cat of 3 [1, 41, 8]), `interp` [3, 24, 8] =
  linear_interpolation(states, 50 -> 30 fps), and per case c: `bucket.embed.<c>` [1, 3, 8, 4 x latent_t] =
  get_audio_embed_bucket_fps(interp, fps 16, batch_frames 4 x latent_t, m 0, video_rate 30)[0].unsqueeze(0)
  .permute(0, 2, 3, 1)[..., offset:offset + batch_frames], `bucket.repeats.<c>` [1] (its min_batch_num),
  `bucket.length.<c>` [1], `bucket.offset.<c>` [1]: `first` (length 9, offset 0), `next` (length 9, offset 12:
  the Extend node after 3 latent frames) and `long` (length 13, offset 0; frames past the 24 audio frames are
  zeros). get_sample_indices rounds with numpy (half to even: 7.5 -> 8, 22.5 -> 22).
- `control_default` [1, 16, 3, 8, 8] = Wan21().process_out(zeros), the node's control_video when none is given
  (each channel's latents_mean); WAN22_S2V's process_latent_in of it is exactly zero, so the model then adds
  cond_encoder's bias alone to every video token (not the same as no control_video, which skips cond_encoder).

Checked: ComfyUI's apply_model on model_base.WAN22_S2V (detected config, text_dim / audio_dim / inject layers set,
the tiny audio encoder swapped in, the same weights) with extra_conds from the VAE-space latents (process_out of
the fixtures' model-space ones) reproduces out.full at sigma 0.7 within 1e-5 of its magnitude.

Writes s2v_released.json: ComfyUI's real WanModel_S2V at the released S2V 14B configuration (detection's dim 5120,
40 heads, ffn 13824, 40 blocks, in 16, out 16; WanModel_S2V's defaults otherwise: text 4096, freq 256, audio_dim
1024, 4 audio tokens, 25 audio layers, adain, cond_dim 16, the 12 inject layers) built on the meta device:
{"globals": every weight outside `blocks.` -> shape, "block": block 0's weights (without "blocks.0.") -> shape,
"blocks": 40, "keys": the weight count}; every block has the same weights.
"""

import math
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import weight_listing, write_listing  # noqa: E402

OUT = "engine/models/tests/fixtures/wan"
DIM, FFN, HEADS, LAYERS, TEXT = 128, 64, 1, 5, 32
AUDIO_LAYERS, AUDIO_WIDTH, AUDIO_TOKENS, INJECT = 3, 8, 4, [0, 4]
# The released S2V 14B: what detection reads from the file, WanModel_S2V's defaults for the rest.
RELEASED = dict(model_type="s2v", patch_size=(1, 2, 2), in_dim=16, dim=5120, ffn_dim=13824, freq_dim=256,
                text_dim=4096, out_dim=16, num_heads=40, num_layers=40, eps=1e-6)
# node cases: (length, frame_offset)
BUCKETS = {"first": (9, 0), "next": (9, 12), "long": (13, 0)}


def tiny_net():
    """The tiny WanModel_S2V of the module comment (empty weights)."""
    import comfy.ops
    from comfy.ldm.wan.model import WanModel_S2V

    ops = comfy.ops.disable_weight_init
    net = WanModel_S2V(model_type="s2v", patch_size=(1, 2, 2), in_dim=16, dim=DIM, ffn_dim=FFN, freq_dim=256,
                       text_dim=TEXT, out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6,
                       audio_dim=AUDIO_WIDTH, num_audio_token=AUDIO_TOKENS, enable_adain=True, cond_dim=16,
                       audio_inject_layers=INJECT, adain_mode="attn_norm", framepack_drop_mode="padd",
                       operations=ops)
    net.casual_audio_encoder = tiny_audio_encoder()
    return net.eval()


def tiny_audio_encoder():
    """The tiny CausalAudioEncoder swapped in for the released 25-layer one (empty weights)."""
    import comfy.ops
    from comfy.ldm.wan.model import CausalAudioEncoder

    return CausalAudioEncoder(dim=AUDIO_WIDTH, num_layers=AUDIO_LAYERS, out_dim=DIM, num_token=AUDIO_TOKENS,
                              need_global=True, operations=comfy.ops.disable_weight_init)


def random_value(name, shape, g):
    """A bf16-rounded value for a weight (see the module comment)."""
    if name.endswith("bias"):
        value = 0.1 * torch.randn(shape, generator=g)
    elif name == "casual_audio_encoder.weights":
        value = torch.randn(shape, generator=g)
    elif name in ("trainable_cond_mask.weight", "casual_audio_encoder.encoder.padding_tokens"):
        value = 0.5 * torch.randn(shape, generator=g)
    elif name.endswith("modulation"):
        value = torch.randn(shape, generator=g) / DIM ** 0.5
    elif len(shape) == 1:
        value = 1.0 + 0.2 * torch.randn(shape, generator=g)
    else:
        value = torch.randn(shape, generator=g) / math.prod(shape[1:]) ** 0.5
    return value.to(torch.bfloat16).contiguous()


def detection_check(weights):
    """ComfyUI's detection on the file: WAN22_S2V, with the widths it reads."""
    import comfy.model_detection

    config = comfy.model_detection.model_config_from_unet(dict(weights), "")
    assert type(config).__name__ == "WAN22_S2V", type(config).__name__
    unet = config.unet_config
    assert (unet["model_type"], unet["dim"], unet["num_heads"], unet["ffn_dim"], unet["num_layers"], unet["in_dim"],
            unet["out_dim"]) == ("s2v", DIM, HEADS, FFN, LAYERS, 16, 16), unet
    print(f"ComfyUI detects the file as {type(config).__name__}: {unet}")
    return config


def cases(net, g):
    """The DiT cases (see the module comment)."""
    import comfy.conds
    import comfy.ldm.wan.model as wan_model

    io = {"x": torch.randn(1, 16, 3, 8, 8, generator=g), "t": torch.tensor([700.0]),
          "context": torch.randn(1, 6, TEXT, generator=g),
          "audio": torch.randn(1, AUDIO_LAYERS, AUDIO_WIDTH, 16, generator=g),
          "reference": torch.randn(1, 16, 1, 8, 8, generator=g),
          "motion": torch.randn(1, 16, 5, 8, 8, generator=g),
          "motion_long": torch.randn(1, 16, 21, 8, 8, generator=g),
          "control": torch.randn(1, 16, 3, 8, 8, generator=g)}
    io["x2"] = torch.cat([io["x"], torch.randn(1, 16, 3, 8, 8, generator=g)])
    io["t2"] = torch.tensor([700.0, 300.0])
    io["context2"] = torch.cat([io["context"], torch.randn(1, 6, TEXT, generator=g)])

    # Records (timestep entries, tokens) of each repeat_e call, to report how timesteps map to tokens.
    seen = []
    original = wan_model.repeat_e

    def recording(e, x):
        seen.append((e.size(1), x.size(1)))
        return original(e, x)

    def call(x, t, context, audio=True, reference=True, motion="motion", control=True, extra=None):
        kwargs = {}
        if audio:
            kwargs["audio_embed"] = io["audio"]
        if reference:
            kwargs["reference_latent"] = io["reference"]
        if motion is not None:
            kwargs["reference_motion"] = io[motion]
        if control:
            kwargs["control_video"] = io["control"]
        if x.shape[0] > 1:
            kwargs = {k: comfy.conds.CONDRegular(v).process_cond(x.shape[0]).cond for k, v in kwargs.items()}
        seen.clear()
        wan_model.repeat_e = recording
        try:
            with torch.no_grad():
                result = net(x, t, context, transformer_options={}, **kwargs)
        finally:
            wan_model.repeat_e = original
        if extra is not None:
            extra.extend(sorted(set(seen)))
        return result

    shapes = {}
    for case, args in (("full", {}), ("long_motion", {"motion": "motion_long"}), ("no_motion", {"motion": None}),
                       ("no_audio", {"audio": False}),
                       ("plain", {"audio": False, "reference": False, "motion": None, "control": False})):
        shapes[case] = []
        io[f"out.{case}"] = call(io["x"], io["t"], io["context"], extra=shapes[case], **args)
    io["out.batch2"] = call(io["x2"], io["t2"], io["context2"])
    for case, pairs in shapes.items():
        print(f"S2V {case:11}: repeat_e (timestep entries, tokens) {pairs}")

    # Diagnostics only (not stored): the full case without the reference or without the control video.
    no_reference = call(io["x"], io["t"], io["context"], reference=False)
    no_control = call(io["x"], io["t"], io["context"], control=False)
    full = io["out.full"]
    scale = float(full.abs().max())
    moves = {"audio": io["out.no_audio"], "motion": io["out.no_motion"], "long motion": io["out.long_motion"],
             "reference": no_reference, "control": no_control, "all": io["out.plain"]}
    print(f"S2V: max |out.full| {scale:.3f}; max |full - without| per conditioning: " +
          ", ".join(f"{k} {float((full - v).abs().max()):.4f}" for k, v in moves.items()))
    for k, v in moves.items():
        assert float((full - v).abs().max()) > 1e-2 * scale, k
    batch = float((io["out.batch2"][:1] - full).abs().max())
    print(f"S2V batch2: sample 0 vs out.full {batch:.2e}; max |sample 1| {float(io['out.batch2'][1].abs().max()):.3f}")
    assert batch <= 1e-5 * scale
    return io


def model_base_check(config, weights, io):
    """out.full again through ComfyUI's model_base.WAN22_S2V: extra_conds from VAE-space latents, apply_model."""
    import comfy.latent_formats

    config.unet_config.update(text_dim=TEXT, audio_dim=AUDIO_WIDTH, audio_inject_layers=INJECT)
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(weights, "")
    model.diffusion_model.casual_audio_encoder = tiny_audio_encoder()
    model.load_model_weights({k: v.float() for k, v in weights.items()}, "")
    model.eval()
    wan21 = comfy.latent_formats.Wan21()
    conds = model.extra_conds(noise=io["x"], device="cpu", audio_embed=io["audio"],
                              reference_latents=[wan21.process_out(io["reference"])],
                              reference_motion=wan21.process_out(io["motion"]),
                              control_video=wan21.process_out(io["control"]))
    sigma = io["t"] / 1000.0
    with torch.no_grad():
        denoised = model.apply_model(io["x"], sigma, c_crossattn=io["context"],
                                     **{k: v.cond for k, v in conds.items()})
    v = (io["x"] - denoised) / sigma
    want = io["out.full"]
    error = float((v - want).abs().max())
    print(f"model_base.WAN22_S2V apply_model agrees with out.full within {error:.2e}; conds {sorted(conds)}")
    assert error <= 1e-5 * float(want.abs().max()), error


def buckets(io, g):
    """The node's audio bucketing (see the module comment)."""
    import comfy.latent_formats
    from comfy_extras.nodes_wan import get_audio_embed_bucket_fps, linear_interpolation

    states = [torch.randn(1, 41, AUDIO_WIDTH, generator=g) for _ in range(AUDIO_LAYERS)]
    feat = torch.cat(states)
    io["bucket.states"] = feat
    feat = linear_interpolation(feat, input_fps=50, output_fps=30)
    io["interp"] = feat
    for case, (length, offset) in BUCKETS.items():
        latent_t = ((length - 1) // 4) + 1
        batch_frames = latent_t * 4
        bucket, repeats = get_audio_embed_bucket_fps(feat, fps=16, batch_frames=batch_frames, m=0, video_rate=30)
        bucket = bucket.unsqueeze(0).permute(0, 2, 3, 1)
        embed = bucket[:, :, :, offset:offset + batch_frames]
        io[f"bucket.embed.{case}"] = embed
        io[f"bucket.repeats.{case}"] = torch.tensor([float(repeats)])
        io[f"bucket.length.{case}"] = torch.tensor([float(length)])
        io[f"bucket.offset.{case}"] = torch.tensor([float(offset)])
        zero = [i for i in range(embed.shape[-1]) if not embed[..., i].any()]
        print(f"bucket {case}: length {length}, offset {offset}: bucket {tuple(bucket.shape)}, repeats {repeats} -> "
              f"{tuple(embed.shape)}; zero frames {zero}")
    io["control_default"] = comfy.latent_formats.Wan21().process_out(torch.zeros(1, 16, 3, 8, 8))
    assert not comfy.latent_formats.Wan21().process_in(io["control_default"]).any()
    print(f"interp {tuple(io['interp'].shape)}; control default = latents_mean, model space exactly zero")


def released():
    """s2v_released.json: ComfyUI's WanModel_S2V at the released 14B configuration on the meta device."""
    import comfy.ops
    from comfy.ldm.wan.model import WanModel_S2V

    net = WanModel_S2V(**RELEASED, device="meta", operations=comfy.ops.disable_weight_init)
    count = RELEASED["num_layers"]
    result = weight_listing(net, count)
    print(f"released WanModel_S2V: {result['keys']} weights, {count} blocks, {len(result['globals'])} outside them")
    write_listing(f"{OUT}/s2v_released.json", result)


def main():
    import_comfyui(node_modules=True)
    os.makedirs(OUT, exist_ok=True)
    net = tiny_net()
    g = torch.Generator().manual_seed(41)
    weights = {k: random_value(k, tuple(v.shape), g) for k, v in net.state_dict().items()}
    result = net.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    mix = torch.nn.functional.silu(weights["casual_audio_encoder.weights"].float())
    print(f"audio layer weights {weights['casual_audio_encoder.weights'].flatten().tolist()}: silu sum "
          f"{float(mix.sum()):.3f}")
    config = detection_check(weights)

    g = torch.Generator().manual_seed(7)
    io = cases(net, g)
    model_base_check(config, weights, io)
    buckets(io, g)

    save_file(weights, f"{OUT}/s2v_weights.safetensors")
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/s2v.safetensors")
    released()

    back = load_file(f"{OUT}/s2v_weights.safetensors")
    assert back.keys() == weights.keys() and all(torch.equal(back[k], weights[k]) for k in back)
    back = load_file(f"{OUT}/s2v.safetensors")
    assert back.keys() == io.keys() and all(torch.equal(back[k], io[k].float()) for k in back)
    for name in ("s2v_weights.safetensors", "s2v.safetensors", "s2v_released.json"):
        print(f"{name}: {os.path.getsize(f'{OUT}/{name}')} bytes")


if __name__ == "__main__":
    main()
