"""Fixtures for Kiln's Wan-Animate-2 DiT and ComfyUI's context windows: ComfyUI's own code at 0f1fa67a,
comfy/ldm/wan/model_animate2.py (WanAnimate2Model, PoseBranchCache), comfy/model_base.py's WAN_Animate2
(extra_conds, resize_cond_for_context_window), comfy/supported_models.py's WAN_Animate2 (detected from the
metadata ANIMATE2_METADATA on an i2v-shaped file; shift 5), comfy/context_windows.py (the schedules, fuse weights,
ordered_halving, apply_freenoise, IndexListContextHandler), comfy_extras/nodes_context_windows.py
(ContextWindowsManualNode) and comfy_extras/nodes_wan.py (WanAnimate2ToVideo, WanAnimate2Cache). The tiny DiT is
wan.py's "i2v" variant (weights.safetensors without `img_emb.emb_pos`: dim 256 = 2 heads x 128, ffn 128, 2 blocks,
in 36, out 16, text width 32, CLIP width 32 with the 32-wide MLPProj swapped in as wan.py does), in f32 on its
bf16 values. Everything is called, nothing of ComfyUI's is reimplemented here but the hand-written checks.

Run from the repository root with the reference venv:
    COMFYUI_DIR=/tmp/comfy/ComfyUI target/reference-venv/bin/python scripts/reference/wan_animate2.py
(ComfyUI's imports need the extra pins listed in comfy_sampling.py; torchaudio gets comfyui.py's stand-in. The
int8 / int4 cache runs comfy-kitchen's eager backend: comfyui.py's `--cpu` run disables cuda and triton.)

Writes engine/models/tests/fixtures/wan/animate2.safetensors (every tensor f32), WanAnimate2Model called as
WAN_Animate2's apply_model calls it: net(x, t, context, clip_fea=, pose_latents=, clip_fea_pose=, context_pose=,
pose_strength=, reference_strength=, transformer_options=) (WanModel.forward -> WanAnimate2Model._forward ->
forward_orig; the strengths ride **kwargs to forward_orig and are passed only where not 1.0, as WAN_Animate2's
CONDConstant is):
- inputs (seed 11): `x` [1, 36, 3, 4, 6] (noise 16 | mask 4 | image 16; latent frame 0 is the reference-image
  slot, so 3 generation frames and 2 pose frames), `t` [1] = 700, `context` [1, 6, 32], `clip` [1, 5, 32], `pose`
  [1, 16, 2, 4, 6] (pose latents as the model receives them, i.e. already in model space), `context_pose`
  [1, 4, 32], `clip_pose` [1, 5, 32]; `x2` [2, 36, 3, 4, 6] (sample 0 = x), `t2` [2] = (700, 300), `context2`
  [2, 6, 32] (sample 0 = context); `x_odd` [1, 36, 3, 5, 7], `pose_odd` [1, 16, 2, 5, 7]; `t300` [1] = 300.
- outputs [1, 16, 3, 4, 6]: `out.plain` (no pose latents: the pose branch skipped; checked equal to ComfyUI's
  plain WanModel i2v forward on the same weights), `out.pose` (pose, no context_pose / clip_pose: the pose branch
  reads context and clip), `out.pose_own` (pose with context_pose and clip_pose), `out.strengths` (out.pose's
  inputs with pose_strength 0.6 and reference_strength 1.4), `out.plain_ref` (no pose, reference_strength 1.4),
  `out.batch2` [2, 16, 3, 4, 6] (x2, t2, context2 with clip, pose, context_pose and clip_pose repeated to 2 by
  CONDRegular.process_cond; sample 0 equals out.pose_own's, checked), `out.odd` [1, 16, 3, 5, 7] (x_odd,
  pose_odd, context, clip: both circularly padded to 6 x 8 and the output cropped; the pose RoPE's shift_x is the
  padded width's w_patches, 4), `out.pose_own_t300` (out.pose_own's inputs at t300).
- PoseBranchCache round trips (seed 19), `take(0, cpu, float32, 1)` after `put(0, x)` on a fresh
  PoseBranchCache(store_device "cpu", dtype) (after select of a dummy pose): `cache.x` [1, 24, 256] (3 N, channels
  7, 100 and 201 times 40), `cache.int8` (dtype "int8": comfy-kitchen's TensorWiseINT8Layout, per-row (token)
  scales, ConvRot Hadamard groups of 256), `cache.int4` (dtype "int4": TensorCoreConvRotW4A4Layout, ConvRot groups
  of 256, per-row scales absmax / 7, packed signed int4); `cache.x128` [1, 10, 128] (3 N, channel 3 times 40) and
  `cache.x128.int8` (int8; 256 does not divide 128, so the group falls back by /4 to 64).
- cached forwards: a fresh PoseBranchCache("cpu", dtype) as `transformer_options["animate2_cache"]`; called
  with pose_own's inputs at t 700 it fills the cache (block inputs quantized as stored, the branch itself run at full
  precision): `out.cache_fill` (equals out.pose_own exactly, checked); then the same pose inputs at `t300`: the
  slot is found and filled, so each block's pose k/v come from its dequantized stored input (kv_from_input):
  `out.cache_int8_t300`, `out.cache_int4_t300` (a fresh cache for each dtype); and without a cache at t 300:
  `out.pose_own_t300`.

Writes engine/tests/fixtures/context_windows/context_windows.json (plain data from comfy/context_windows.py; sorted
keys, compact):
- `versions`: {"torch", "comfyui"}.
- `schedules`: [{"schedule", "num_frames", "context_length", "context_overlap", "context_stride",
  "closed_loop", "step", "windows": [[frame, ...], ...]}] from the schedule's function with an
  IndexListContextHandler (handler._step = step), for num_frames in {5, 16, 22, 40, 81} and (length, overlap) in
  {(3, 1), (16, 4), (21, 8), (8, 0)}; standard_static and batched once each (stride 1, closed_loop false, step 0:
  they read neither), standard_uniform over stride {1, 3} x step {0, 1, 3, 5} (closed_loop false: not read),
  looped_uniform over stride {1, 3} x closed_loop {false, true} x step {0, 1, 3, 5}.
- `weights`: [{"method", "length", "full_length", "idxs", "context_overlap", "weights"}] from get_context_weights
  for pyramid, flat and overlap-linear, lengths 1..8 and 21, full_length 3 x length, the first (idxs 0..L-1),
  middle (L..2L-1) and last (2L..3L-1) window; pyramid and flat read no overlap (recorded with L // 2),
  overlap-linear at overlaps {1, L // 2, L} (those >= 1, distinct) and 0: where ComfyUI raises (overlap 0 on a
  window before the last: `weights_torch[-0:]` is the whole window), "weights" is null and "error" holds the message.
- `ordered_halving`: [[val, result], ...] for val 0..20.
- `randperm`: [{"n", "seed", "perm"}] for torch.randperm(n, generator=torch.Generator('cpu').manual_seed(seed)),
  n in {1, 2, 3, 5, 13, 100}, seed in {0, 42, 2**40 + 7, 714297762067883}.
- `freenoise`: [{"shape", "dim", "context_length", "context_overlap", "seed", "source_order"}] from
  apply_freenoise on a [1, 1, frames, 1, 1] tensor whose frame i holds i (dim 2): source_order[i] is the original
  frame now at frame i; (frames, length, overlap) in {(22, 21, 8), (5, 3, 1), (40, 16, 4), (81, 16, 4)}, seeds 7
  and 714297762067883.
- `relative`: combine_context_window_results over the standard_static windows of 7 frames, length 4, overlap 2
  ({"num_frames", "context_length", "context_overlap", "windows", "sub_outputs"} where sub_outputs[w][p] =
  (w + 1) * 10 + p is window w's output at position p, each a [1, 1, length] tensor with dim 2), and the fused
  per-frame values: "relative" (RELATIVE's running bias-weighted average, no division), "pyramid", "flat" and
  "overlap-linear" (accum / counts, as IndexListContextHandler.execute finishes them).
- `sampling`: what the sampling runs below did, per run: the model calls in order, each {"sigma", "batch",
  "frames" (the latent frames the net saw), "window" (index_list, or null without windows), "anchor" (the
  causal_window_fix frame prepended, or null), "concat" (for each frame of the c_concat the net was handed, the
  frame of the full c_concat it is), "pose" (the same for the pose latents: pose frame p is latent frame p + 1;
  null without them), "cache" (what the PoseBranchCache did in that call: "fill" = put every block while running
  the branch at full precision, "prepass" = put every block in a pose-only pass, then read them all back
  dequantized, "hit" = read every block back, null = no cache)}.

ComfyUI behaviours the data shows: standard_uniform at stride 3 gives windows with frames past the end and
repeated (e.g. 22 frames, 16 / 4: [13, 15, ..., 33, 13, 15, ..., 21]; shift_window_to_end on a strided window),
recorded as ComfyUI returns them; overlap-linear raises at overlap 0 on any window but the last. In the sampling
runs, cond and uncond go through the net as one batch of 2 (both carry the same pose conds); under context windows
the cache's first step is already the quantized read (prepass), without windows the first step runs the branch
at full precision (fill); with causal_window_fix the window [2, 3, 4] is run as latent frames [1, 2, 3, 4] whose
c_concat is frames [0, 2, 3, 4] (cond_retain "0" overwrites the anchor's with frame 0's) and whose pose latents
are pose frames [1, 2, 3] (slice_cond skips no frame for the anchor); without the fix (windows_uniform) a window
not starting at 0 puts its first frame in the reference slot (no pose for it, its own c_concat). With overlap 1
the shared frame gets equal weights under pyramid and relative alike, so out.windows_relative equals out.windows
(the `relative` JSON case tells them apart).

Writes engine/tests/fixtures/context_windows/sampling.safetensors (f32): windowed sampling through ComfyUI's own
path. A ModelPatcher (load and offload device cpu) around model_base.WAN_Animate2 from model_config_from_unet on
the i2v weights with ANIMATE2_METADATA (text_dim set to 32 as infinite_talk.py does; the 32-wide img_emb swapped in
before the weights load), f32. WanAnimate2ToVideo.execute builds the conditioning (width 48, height 32, length 13,
batch 1; a stand-in VAE returns seeded latents (seed 23) for its three encodes: the reference image, the grey
video and the pose video; clip_vision_output an object with `penultimate_hidden_states`): the node's positive and
negative carry concat_latent_image, concat_mask, clip_vision_output, pose_video_latent, clip_vision_output_pose (=
clip_vision_output, the node's default) and cross_attn_pose (= the positive's context, on both). CFGGuider cfg 2,
sampler_object("euler"), sigmas calculate_sigmas(model_sampling (shift 5), "simple", 3), noise
comfy.sample.prepare_noise(zeros, 7), latent zeros [1, 16, 5, 4, 6] (frame 0 the reference slot, 4 video
frames), seed 7. Tensors: `seed` [1], `sigmas` [4], `noise` [1, 16, 5, 4, 6], `noise.freenoise` (the handler's
FreeNoise shuffle of it for seed 7, length 3, overlap 1: randperm(2) puts frame 1's noise at frame 3 and frame
0's at frame 4; checked to be what the sampler received), `concat_latent_image` [1, 16, 5, 4, 6] (VAE space: the
reference latent then the video's), `concat_mask` [1, 1, 5, 4, 6] (0 at frame 0, 1 elsewhere), `clip` [1, 5, 32]
(penultimate states), `pose_video_latent` [1, 16, 4, 4, 6] (VAE space; WAN_Animate2.extra_conds applies
process_latent_in), `context.positive` [1, 6, 32], `context.negative` [1, 6, 32], and the final latents
[1, 16, 5, 4, 6] (VAE space):
- `out.plain`: no context windows, no cache (checked against a hand-written CFG Euler loop over the net).
- `out.windows`: ContextWindowsManualNode.execute(model, 3, 1, "standard_static", 1, False, "pyramid", 2, True,
  "0", False, "", True), as the Wan Animate 2 template sets it (there 21 / 8 on 22 latent frames).
- `out.windows_cache`: that, then WanAnimate2Cache.execute(model, "cpu", "int8"): the template's order
  (video_wan_animate2.json: LoraLoaderModelOnly -> ContextWindowsManual -> switch -> WanAnimate2Cache ->
  ModelSamplingSD3; the template's cache is on "gpu").
- `out.windows_uniform`: "standard_uniform", fuse "overlap-linear", freenoise False, cond_retain "", causal fix False.
- `out.windows_relative`: "standard_static", fuse "relative", freenoise True, cond_retain "0", causal fix True.
- `out.pose_window`: no windows; the node's pose_start_percent 0.25 and pose_end_percent 0.75 (each prompt split
  into the pose's part and its complements), sampled over `sigmas4` (4 steps, simple, shift 5: 1, 0.9375, 0.8333,
  0.625, 0), whose 0.9375 and 0.625 are the part's ends, where both the pose's and a complement's conditioning
  are in range and ComfyUI averages their predictions.
- `out.windows_latent_retain`: "standard_static", fuse "pyramid", freenoise False, cond_retain "0", causal fix False,
  latent_retain_index_list "0": each window's first latent frame is the whole latent's frame 0 (the x̂₀ of a
  window is computed from the window's own latent, then fused).
- `out.cache`: WanAnimate2Cache(cpu, int8) alone, no windows.
"""

import functools
import json
import os
import sys
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import CLIP, DIM, FFN, HEADS, LAYERS, OUT, TEXT, comfy_net, variant  # noqa: E402

WINDOWS_OUT = "engine/tests/fixtures/context_windows"
# ComfyUI's mark of a Wan-Animate-2 file: its metadata `config`, whose `transformer` entries detection merges in.
ANIMATE2_METADATA = {"config": json.dumps({"transformer": {"model_type": "animate2"}})}
SAMPLE_SEED = 7


def tiny_weights():
    """wan.py's i2v variant (ComfyUI names, bf16)."""
    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    return variant(stored, "i2v", ti2v), stored, ti2v


def clip_proj(ops, dtype=None):
    """The 32-wide MLPProj that replaces ComfyUI's hard-coded 1280-wide one."""
    from comfy.ldm.wan.model import MLPProj

    return MLPProj(CLIP, DIM, operation_settings={"operations": ops, "device": None, "dtype": dtype})


def animate2_net(weights):
    """ComfyUI's WanAnimate2Model at the tiny i2v configuration, f32."""
    import comfy.ops
    from comfy.ldm.wan.model_animate2 import WanAnimate2Model

    ops = comfy.ops.disable_weight_init
    net = WanAnimate2Model(patch_size=(1, 2, 2), in_dim=36, dim=DIM, ffn_dim=FFN, freq_dim=256, text_dim=TEXT,
                           out_dim=16, num_heads=HEADS, num_layers=LAYERS, eps=1e-6, operations=ops).eval()
    net.img_emb = clip_proj(ops)
    result = net.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    return net


def call(net, x, t, context, clip, pose=None, context_pose=None, clip_pose=None, options=None, **strengths):
    """The net as WAN_Animate2's apply_model calls it: pose conds only where set, strengths only where not 1."""
    kwargs = {"clip_fea": clip}
    for name, value in (("pose_latents", pose), ("context_pose", context_pose), ("clip_fea_pose", clip_pose)):
        if value is not None:
            kwargs[name] = value
    kwargs.update({k: v for k, v in strengths.items() if v != 1.0})
    with torch.no_grad():
        return net(x, t, context, transformer_options={} if options is None else options, **kwargs)


def scale_of(t):
    return float(t.abs().max())


def forwards(io, net, plain_net):
    """The DiT cases of animate2.safetensors (see the module comment)."""
    import comfy.conds

    g = torch.Generator().manual_seed(11)
    io.update({"x": torch.randn(1, 36, 3, 4, 6, generator=g), "t": torch.tensor([700.0]),
               "context": torch.randn(1, 6, TEXT, generator=g), "clip": torch.randn(1, 5, CLIP, generator=g),
               "pose": torch.randn(1, 16, 2, 4, 6, generator=g), "context_pose": torch.randn(1, 4, TEXT, generator=g),
               "clip_pose": torch.randn(1, 5, CLIP, generator=g)})
    io["x2"] = torch.cat([io["x"], torch.randn(1, 36, 3, 4, 6, generator=g)])
    io["t2"] = torch.tensor([700.0, 300.0])
    io["context2"] = torch.cat([io["context"], torch.randn(1, 6, TEXT, generator=g)])
    io["x_odd"] = torch.randn(1, 36, 3, 5, 7, generator=g)
    io["pose_odd"] = torch.randn(1, 16, 2, 5, 7, generator=g)
    io["t300"] = torch.tensor([300.0])

    x, t, context, clip = io["x"], io["t"], io["context"], io["clip"]
    own = {"pose": io["pose"], "context_pose": io["context_pose"], "clip_pose": io["clip_pose"]}
    io["out.plain"] = call(net, x, t, context, clip)
    io["out.pose"] = call(net, x, t, context, clip, pose=io["pose"])
    io["out.pose_own"] = call(net, x, t, context, clip, **own)
    io["out.strengths"] = call(net, x, t, context, clip, pose=io["pose"], pose_strength=0.6, reference_strength=1.4)
    io["out.plain_ref"] = call(net, x, t, context, clip, reference_strength=1.4)
    batch = {k: comfy.conds.CONDRegular(v).process_cond(2).cond for k, v in own.items()}
    io["out.batch2"] = call(net, io["x2"], io["t2"], io["context2"],
                            comfy.conds.CONDRegular(clip).process_cond(2).cond, **batch)
    io["out.odd"] = call(net, io["x_odd"], t, context, clip, pose=io["pose_odd"])
    io["out.pose_own_t300"] = call(net, x, io["t300"], context, clip, **own)

    # The plain path is ComfyUI's plain i2v WanModel.
    with torch.no_grad():
        want = plain_net(x, t, context, clip_fea=clip, transformer_options={})
    diff = float((io["out.plain"] - want).abs().max())
    print(f"animate2 without pose vs WanModel i2v: max |difference| {diff:.2e} (max |out| {scale_of(want):.3f})")
    assert diff <= 1e-5 * scale_of(want), diff

    plain = io["out.plain"]
    scale = scale_of(plain)
    moves = {"pose": io["out.pose"], "pose_own": io["out.pose_own"], "strengths": io["out.strengths"],
             "plain_ref": io["out.plain_ref"]}
    print(f"animate2: max |out.plain| {scale:.3f}; max |case - plain|: " +
          ", ".join(f"{k} {float((v - plain).abs().max()):.4f}" for k, v in moves.items()))
    for k, v in moves.items():
        assert float((v - plain).abs().max()) > 1e-2 * scale, k
    assert float((io["out.pose_own"] - io["out.pose"]).abs().max()) > 1e-2 * scale
    assert float((io["out.strengths"] - io["out.pose"]).abs().max()) > 1e-2 * scale
    batch0 = float((io["out.batch2"][:1] - io["out.pose_own"]).abs().max())
    print(f"animate2 batch2: sample 0 vs out.pose_own {batch0:.2e}; odd: max |out| {scale_of(io['out.odd']):.3f}")
    assert batch0 <= 1e-5 * scale


def cache_round_trips(io):
    """PoseBranchCache put / take on its own (see the module comment)."""
    from comfy.ldm.wan.model_animate2 import PoseBranchCache

    g = torch.Generator().manual_seed(19)
    x = 3.0 * torch.randn(1, 24, 256, generator=g)
    x[..., [7, 100, 201]] *= 40.0
    x128 = 3.0 * torch.randn(1, 10, 128, generator=g)
    x128[..., 3] *= 40.0
    io["cache.x"], io["cache.x128"] = x, x128
    cpu = torch.device("cpu")
    for name, source, dtype in (("cache.int8", x, "int8"), ("cache.int4", x, "int4"),
                                ("cache.x128.int8", x128, "int8")):
        cache = PoseBranchCache(store_device="cpu", dtype=dtype)
        cache.select(torch.zeros(1, 16, 2, 4, 6))
        cache.put(0, source)
        params = cache.slot["params"][0]
        got = cache.take(0, cpu, torch.float32, 1)
        assert got.shape == source.shape and got.dtype == torch.float32
        io[name] = got
        error = float((got - source).abs().max())
        print(f"PoseBranchCache {dtype} {tuple(source.shape)}: stored {cache.slot['blocks'][0].dtype} "
              f"{tuple(cache.slot['blocks'][0].shape)}, ConvRot group {params.convrot_groupsize}, max |error| "
              f"{error:.4f} of max |x| {scale_of(source):.1f}")


def cached_forwards(io, net):
    """The net with a PoseBranchCache in transformer_options: a fill at t 700, then a read at t 300."""
    from comfy.ldm.wan.model_animate2 import PoseBranchCache

    x, context, clip = io["x"], io["context"], io["clip"]
    own = {"pose": io["pose"], "context_pose": io["context_pose"], "clip_pose": io["clip_pose"]}
    for dtype in ("int8", "int4"):
        cache = PoseBranchCache(store_device="cpu", dtype=dtype)
        fill = call(net, x, io["t"], context, clip, options={"animate2_cache": cache}, **own)
        assert cache.filled(LAYERS) and len(cache.slots) == 1
        assert torch.equal(fill, io["out.pose_own"]), "the filling call differs from pose_own"
        io["out.cache_fill"] = fill
        got = call(net, x, io["t300"], context, clip, options={"animate2_cache": cache}, **own)
        assert len(cache.slots) == 1
        io[f"out.cache_{dtype}_t300"] = got
        want = io["out.pose_own_t300"]
        print(f"cached forward {dtype}: t 300 from the cache vs without: max |difference| "
              f"{float((got - want).abs().max()):.2e} (max |out| {scale_of(want):.3f})")
        cache.free()


# ---------------------------------------------------------------------------------------------------------------
# context_windows.json

FRAMES = (5, 16, 22, 40, 81)
PAIRS = ((3, 1), (16, 4), (21, 8), (8, 0))
STEPS = (0, 1, 3, 5)


def handler_for(schedule="standard_static", fuse="pyramid", length=1, overlap=0, stride=1, closed_loop=False,
                dim=2):
    import comfy.context_windows as cw

    return cw.IndexListContextHandler(cw.get_matching_context_schedule(schedule), cw.get_matching_fuse_method(fuse),
                                      context_length=length, context_overlap=overlap, context_stride=stride,
                                      closed_loop=closed_loop, dim=dim)


def schedule_cases():
    cases = []
    for schedule in ("standard_static", "standard_uniform", "looped_uniform", "batched"):
        uniform = schedule.endswith("uniform")
        strides = (1, 3) if uniform else (1,)
        loops = (False, True) if schedule == "looped_uniform" else (False,)
        steps = STEPS if uniform else (0,)
        for n in FRAMES:
            for length, overlap in PAIRS:
                for stride in strides:
                    for loop in loops:
                        for step in steps:
                            handler = handler_for(schedule, length=length, overlap=overlap, stride=stride,
                                                  closed_loop=loop)
                            handler._step = step
                            windows = handler.context_schedule.func(n, handler, {})
                            cases.append({"schedule": schedule, "num_frames": n, "context_length": length,
                                          "context_overlap": overlap, "context_stride": stride,
                                          "closed_loop": loop, "step": step,
                                          "windows": [[int(i) for i in w] for w in windows]})
    outside = [c for c in cases if any(not 0 <= i < c["num_frames"] for w in c["windows"] for i in w)]
    uncovered = [c for c in cases if set(range(c["num_frames"])) - {i for w in c["windows"] for i in w}]
    print(f"schedules: {len(cases)} cases; {len(outside)} with frames outside 0..n-1 "
          f"({sorted({c['schedule'] for c in outside})}), {len(uncovered)} leaving frames uncovered "
          f"({sorted({c['schedule'] for c in uncovered})})")
    return cases


def weight_cases():
    import comfy.context_windows as cw

    cases, errors = [], 0
    for method in ("pyramid", "flat", "overlap-linear"):
        for length in list(range(1, 9)) + [21]:
            full = 3 * length
            if method == "overlap-linear":
                overlaps = sorted({o for o in (1, length // 2, length) if o >= 1}) + [0]
            else:
                overlaps = [length // 2]
            for overlap in overlaps:
                for start in (0, length, 2 * length):
                    idxs = list(range(start, start + length))
                    handler = handler_for(fuse=method, length=length, overlap=overlap)
                    case = {"method": method, "length": length, "full_length": full, "idxs": idxs,
                            "context_overlap": overlap}
                    try:
                        w = cw.get_context_weights(length, full, idxs, handler, context_overlap=overlap)
                        case["weights"] = [float(v) for v in w]
                    except RuntimeError as e:
                        case["weights"], case["error"] = None, str(e)
                        errors += 1
                    cases.append(case)
    print(f"weights: {len(cases)} cases, {errors} where ComfyUI raises (overlap-linear, overlap 0, not the last)")
    return cases


def freenoise_cases():
    import comfy.context_windows as cw

    cases = []
    for frames, length, overlap in ((22, 21, 8), (5, 3, 1), (40, 16, 4), (81, 16, 4)):
        for seed in (7, 714297762067883):
            shape = [1, 1, frames, 1, 1]
            marked = torch.arange(frames, dtype=torch.float32).reshape(shape)
            shuffled = cw.apply_freenoise(marked.clone(), 2, length, overlap, seed)
            cases.append({"shape": shape, "dim": 2, "context_length": length, "context_overlap": overlap,
                          "seed": seed, "source_order": [int(v) for v in shuffled.flatten().tolist()]})
    return cases


def relative_case():
    """Every fuse method's result for one standard_static set of windows (see the module comment)."""
    import comfy.context_windows as cw

    frames, length, overlap = 7, 4, 2
    x_in = torch.zeros(1, 1, frames)
    out = {"num_frames": frames, "context_length": length, "context_overlap": overlap}
    for fuse in ("relative", "pyramid", "flat", "overlap-linear"):
        handler = handler_for("standard_static", fuse, length, overlap)
        windows = handler.get_context_windows(None, x_in, {})
        subs = [torch.tensor([(w + 1) * 10.0 + p for p in range(len(win.index_list))]).reshape(1, 1, -1)
                for w, win in enumerate(windows)]
        # IndexListContextHandler.execute's accumulators for one cond.
        accum = [torch.zeros_like(x_in)]
        make = torch.ones if fuse == "relative" else torch.zeros
        counts = [make(cw.get_shape_for_dim(x_in, 2))]
        biases = [[0.0] * frames]
        for w, win in enumerate(windows):
            handler.combine_context_window_results(x_in, [subs[w]], None, win, w, len(windows), torch.tensor([0.5]),
                                                   accum, counts, biases)
        fused = accum[0] if fuse == "relative" else accum[0] / counts[0]
        out[fuse] = [float(v) for v in fused.flatten()]
        out["windows"] = [list(win.index_list) for win in windows]
        out["sub_outputs"] = [[float(v) for v in s.flatten()] for s in subs]
    print(f"relative: windows {out['windows']}; fused relative {out['relative']}, pyramid {out['pyramid']}")
    return out


def context_windows_data():
    import comfy.context_windows as cw

    return {"versions": {"torch": torch.__version__.split("+")[0], "comfyui": "0f1fa67a"},
            "schedules": schedule_cases(), "weights": weight_cases(),
            "ordered_halving": [[v, cw.ordered_halving(v)] for v in range(21)],
            "randperm": [{"n": n, "seed": seed, "perm": torch.randperm(
                n, generator=torch.Generator("cpu").manual_seed(seed)).tolist()}
                for n in (1, 2, 3, 5, 13, 100) for seed in (0, 42, 2 ** 40 + 7, 714297762067883)],
            "freenoise": freenoise_cases(), "relative": relative_case()}


# ---------------------------------------------------------------------------------------------------------------
# sampling.safetensors

class StandInVae:
    """Returns the given latents, in order, for the node's encodes (reference image, grey video, pose video)."""

    def __init__(self, latents, frames):
        self.latents = list(latents)
        self.frames = list(frames)

    def encode(self, pixels):
        assert pixels.shape[0] == self.frames.pop(0), pixels.shape
        return self.latents.pop(0)


def animate2_patcher(weights):
    """A ModelPatcher around model_base.WAN_Animate2 as ComfyUI's loader builds it, f32 on the CPU."""
    import comfy.model_detection
    import comfy.model_management
    import comfy.model_patcher
    import comfy.ops

    config = comfy.model_detection.model_config_from_unet(dict(weights), "", metadata=ANIMATE2_METADATA)
    assert type(config).__name__ == "WAN_Animate2", type(config).__name__
    assert config.sampling_settings["shift"] == 5.0
    assert config.unet_config["model_type"] == "animate2"
    # Detection leaves the text width at WanModel's default 4096 (umT5-XXL's); the tiny model's is 32.
    config.unet_config["text_dim"] = TEXT
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(weights, "")
    ops = comfy.ops.pick_operations(config.unet_config.get("dtype"), model.manual_cast_dtype, model_config=config)
    model.diffusion_model.img_emb = clip_proj(ops, torch.float32)
    comfy.model_management.archive_model_dtypes(model.diffusion_model.img_emb)
    model.load_model_weights({k: v.float() for k, v in weights.items()}, "")
    assert type(model.diffusion_model).__name__ == "WanAnimate2Model"
    cpu = torch.device("cpu")
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    assert patcher.model_dtype() == torch.float32
    return patcher


def frames_of(part, full):
    """Which frame of `full` (dim 2, batch element 0) each frame of `part` is (None where none is)."""
    return [next((j for j in range(full.shape[2]) if torch.allclose(part[:1, :, k], full[:1, :, j], rtol=0,
                                                                     atol=1e-6)), None) for k in range(part.shape[2])]


class Trace:
    """Records each model call of a sampling run: sigma, batch, frames, window, anchor, which full c_concat and
    pose frames the call was handed, and what the pose-branch cache did (PoseBranchCache's put / take counted while
    the call runs)."""

    def __init__(self, concat, pose):
        self.calls = []
        self.concat, self.pose = concat, pose

    def apply_model(self, executor, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={},
                    **kwargs):
        window = transformer_options.get("context_window")
        pose = kwargs.get("pose_latents")
        record = {"sigma": round(float(t[0]), 6), "batch": x.shape[0], "frames": x.shape[2],
                  "window": list(window.index_list) if window is not None else None,
                  "anchor": getattr(window, "causal_anchor_index", None) if window is not None else None,
                  "concat": frames_of(c_concat, self.concat),
                  "pose": None if pose is None else frames_of(pose, self.pose),
                  "puts": 0, "takes": 0}
        self.calls.append(record)
        return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)

    def counting(self, method, key):
        @functools.wraps(method)
        def counted(cache, *args, **kwargs):
            if self.calls:
                self.calls[-1][key] += 1
            return method(cache, *args, **kwargs)
        return counted

    def summary(self):
        out = []
        for c in self.calls:
            puts, takes = c.pop("puts"), c.pop("takes")
            c["cache"] = {(0, 0): None, (LAYERS, 0): "fill", (LAYERS, LAYERS): "prepass",
                          (0, LAYERS): "hit"}[(puts, takes)]
            out.append(c)
        return out


def sample(patcher, positive, negative, noise, sigmas, trace, received=None):
    """CFGGuider (cfg 2, euler) on a clone of the patcher with the trace's apply-model wrapper; returns the final
    latent (VAE space)."""
    import comfy.patcher_extension
    import comfy.samplers
    from comfy.ldm.wan.model_animate2 import PoseBranchCache

    patcher = patcher.clone()
    patcher.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.APPLY_MODEL, "fixture_trace", trace.apply_model)
    if received is not None:
        # Added after the node's FreeNoise wrapper, so it runs inside it: the noise the sampler really gets.
        def record(executor, guider, sigmas, extra_args, callback, noise, *args, **kwargs):
            received.append(noise.clone())
            return executor(guider, sigmas, extra_args, callback, noise, *args, **kwargs)
        patcher.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.SAMPLER_SAMPLE, "fixture_noise", record)
    guider = comfy.samplers.CFGGuider(patcher)
    guider.set_conds(positive, negative)
    guider.set_cfg(2.0)
    originals = {name: getattr(PoseBranchCache, name) for name in ("put", "take")}
    try:
        PoseBranchCache.put = trace.counting(originals["put"], "puts")
        PoseBranchCache.take = trace.counting(originals["take"], "takes")
        with torch.no_grad():
            # The sampler may shuffle the noise in place (FreeNoise): hand it a copy.
            result = guider.sample(noise.clone(), torch.zeros_like(noise), comfy.samplers.sampler_object("euler"),
                                   sigmas.clone(), disable_pbar=True, seed=SAMPLE_SEED)
    finally:
        for name, method in originals.items():
            setattr(PoseBranchCache, name, method)
    return result.float()


def windows_node(patcher, schedule, fuse, freenoise, cond_retain, causal_fix, latent_retain=""):
    from comfy_extras.nodes_context_windows import ContextWindowsManualNode

    return ContextWindowsManualNode.execute(patcher, 3, 1, schedule, 1, False, fuse, 2, freenoise, cond_retain,
                                            False, latent_retain, causal_fix).result[0]


def cache_node(patcher):
    from comfy_extras.nodes_wan import WanAnimate2Cache

    return WanAnimate2Cache.execute(patcher, "cpu", "int8").result[0]


def sampling(weights, net, data):
    """The sampling runs of sampling.safetensors (see the module comment)."""
    import comfy.sample
    import comfy.samplers
    from comfy_extras.nodes_wan import WanAnimate2ToVideo

    base = animate2_patcher(weights)
    g = torch.Generator().manual_seed(23)
    reference = torch.randn(1, 16, 1, 4, 6, generator=g)
    video = torch.randn(1, 16, 4, 4, 6, generator=g)
    pose_latent = torch.randn(1, 16, 4, 4, 6, generator=g)
    clip = torch.randn(1, 5, CLIP, generator=g)
    positive_context = torch.randn(1, 6, TEXT, generator=g)
    negative_context = torch.randn(1, 6, TEXT, generator=g)
    vae = StandInVae([reference, video, pose_latent], [1, 13, 13])
    clip_vision = SimpleNamespace(penultimate_hidden_states=clip)
    positive, negative, latent, trim, _, _ = WanAnimate2ToVideo.execute(
        [[positive_context, {}]], [[negative_context, {}]], vae, 48, 32, 13, 1, 0,
        reference_image=torch.zeros(1, 32, 48, 3), pose_video=torch.zeros(13, 32, 48, 3),
        clip_vision_output=clip_vision).result
    assert trim == 1 and not vae.latents
    cond = positive[0][1]
    assert sorted(cond) == ["clip_vision_output", "clip_vision_output_pose", "concat_latent_image", "concat_mask",
                            "cross_attn_pose", "pose_video_latent"], sorted(cond)
    assert cond["cross_attn_pose"] is positive_context and negative[0][1]["cross_attn_pose"] is positive_context
    zeros = latent["samples"]
    assert zeros.shape == (1, 16, 5, 4, 6) and not zeros.any()

    sigmas = comfy.samplers.calculate_sigmas(base.get_model_object("model_sampling"), "simple", 3).float()
    noise = comfy.sample.prepare_noise(zeros, SAMPLE_SEED)
    concat, pose = model_space(cond["concat_latent_image"], cond["concat_mask"], cond["pose_video_latent"])
    out = {"seed": torch.tensor([float(SAMPLE_SEED)]), "sigmas": sigmas, "noise": noise,
           "concat_latent_image": cond["concat_latent_image"], "concat_mask": cond["concat_mask"], "clip": clip,
           "pose_video_latent": cond["pose_video_latent"], "context.positive": positive_context,
           "context.negative": negative_context}

    runs = {
        "plain": lambda: base,
        "windows": lambda: windows_node(base, "standard_static", "pyramid", True, "0", True),
        "windows_cache": lambda: cache_node(windows_node(base, "standard_static", "pyramid", True, "0", True)),
        "windows_uniform": lambda: windows_node(base, "standard_uniform", "overlap-linear", False, "", False),
        "windows_relative": lambda: windows_node(base, "standard_static", "relative", True, "0", True),
        "windows_latent_retain": lambda: windows_node(base, "standard_static", "pyramid", False, "0", False, "0"),
        "cache": lambda: cache_node(base),
    }
    traces = {}
    for case, build in runs.items():
        patcher = build()
        trace = Trace(concat, pose)
        received = [] if case == "windows" else None
        out[f"out.{case}"] = sample(patcher, positive, negative, noise, sigmas, trace, received)
        if case == "windows":
            handler = patcher.model_options["context_handler"]
            out["noise.freenoise"] = handler._apply_freenoise(noise.clone(), [], SAMPLE_SEED)
            assert torch.equal(received[0], out["noise.freenoise"])
        traces[case] = trace.summary()
        print(f"sampling {case}: max |out| {scale_of(out[f'out.{case}']):.3f}; calls (sigma, window, anchor, "
              f"c_concat frames, pose frames, cache):\n    " +
              "\n    ".join(f"{c['sigma']:.4f} b{c['batch']} {c['window']} {c['anchor']} {c['concat']} {c['pose']} "
                            f"{c['cache']}" for c in traces[case]))
    # The pose in part of sampling: the node splits each prompt into the pose's part and its complements by
    # timestep range; with 4 steps at shift 5 the sigmas 0.9375 and 0.625 are exactly the range's ends, where
    # ComfyUI averages the prediction with the pose and the one without.
    vae = StandInVae([reference, video, pose_latent], [1, 13, 13])
    positive, negative, _, _, _, _ = WanAnimate2ToVideo.execute(
        [[positive_context, {}]], [[negative_context, {}]], vae, 48, 32, 13, 1, 0,
        reference_image=torch.zeros(1, 32, 48, 3), pose_video=torch.zeros(13, 32, 48, 3),
        clip_vision_output=clip_vision, pose_start_percent=0.25, pose_end_percent=0.75).result
    assert len(positive) == 3 and len(negative) == 3
    sigmas4 = comfy.samplers.calculate_sigmas(base.get_model_object("model_sampling"), "simple", 4).float()
    out["sigmas4"] = sigmas4
    out["out.pose_window"] = sample(base, positive, negative, noise, sigmas4, Trace(concat, pose))
    plain = out["out.plain"]
    for case in runs:
        if case != "plain":
            print(f"sampling {case} vs plain: max |difference| {float((out[f'out.{case}'] - plain).abs().max()):.4f}")
    moved = out["noise.freenoise"] - noise
    print(f"FreeNoise moved frames {[i for i in range(5) if moved[:, :, i].abs().max() > 0]}")
    hand_check(out, net)
    data["sampling"] = traces
    return out


def model_space(concat_latent, concat_mask, pose_latent):
    """WAN21's c_concat [4 x (1 - concat_mask), Wan21.process_in(concat)] and the pose latents in model space."""
    import comfy.latent_formats

    wan21 = comfy.latent_formats.Wan21()
    concat = torch.cat([(1.0 - concat_mask).repeat(1, 4, 1, 1, 1), wan21.process_in(concat_latent)], dim=1)
    return concat, wan21.process_in(pose_latent)


def hand_check(out, net):
    """out.plain redone by hand on the WanAnimate2Model: x = sigma_0 noise; per step the net reads
    [x, 4 x (1 - concat_mask), Wan21.process_in(concat)] at t = 1000 sigma with the CLIP states and
    Wan21.process_in(pose) (the pose branch on the positive's context and the CLIP states, for both conds);
    denoised = x - sigma v for each cond, CFG 2 on the denoised, Euler; the result through Wan21.process_out."""
    import comfy.latent_formats

    wan21 = comfy.latent_formats.Wan21()
    concat, pose = model_space(out["concat_latent_image"], out["concat_mask"], out["pose_video_latent"])
    sigmas = out["sigmas"]
    x = sigmas[0] * out["noise"]
    for sigma, following in zip(sigmas[:-1], sigmas[1:]):
        t = (sigma * 1000.0).reshape(1)
        denoised = []
        for context in (out["context.positive"], out["context.negative"]):
            v = call(net, torch.cat([x, concat], dim=1), t, context, out["clip"], pose=pose,
                     context_pose=out["context.positive"], clip_pose=out["clip"])
            denoised.append(x - v * sigma)
        guided = denoised[1] + (denoised[0] - denoised[1]) * 2.0
        x = x + (x - guided) / sigma * (following - sigma)
    got = wan21.process_out(x)
    want = out["out.plain"]
    error = float((got - want).abs().max())
    print(f"sampling plain: the hand-written loop agrees within {error:.2e} (max |out| {scale_of(want):.3f})")
    assert error <= 1e-5 * scale_of(want), error


def main():
    import_comfyui(node_modules=True)
    os.makedirs(WINDOWS_OUT, exist_ok=True)
    weights, stored, ti2v = tiny_weights()
    net = animate2_net(weights)
    plain_net = comfy_net("i2v", stored, ti2v)

    io = {}
    forwards(io, net, plain_net)
    cache_round_trips(io)
    cached_forwards(io, net)
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/animate2.safetensors")

    data = context_windows_data()
    samples = sampling(weights, net, data)
    save_file({k: v.float().contiguous() for k, v in samples.items()}, f"{WINDOWS_OUT}/sampling.safetensors")
    with open(f"{WINDOWS_OUT}/context_windows.json", "w") as f:
        json.dump(data, f, separators=(",", ":"), sort_keys=True)
        f.write("\n")

    for path in (f"{OUT}/animate2.safetensors", f"{WINDOWS_OUT}/context_windows.json",
                 f"{WINDOWS_OUT}/sampling.safetensors"):
        print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
