"""Fixture for Kiln's InfiniteTalk (MultiTalk) audio patch on the Wan 2.1 DiT
(engine/models/tests/fixtures/wan/infinite_talk.safetensors and infinite_talk_released.json): ComfyUI's own code at
0f1fa67a, comfy/ldm/wan/model_multitalk.py (MultiTalkAudioProjModel, SingleStreamMultiAttention,
WanMultiTalkAttentionBlock, get_attn_map_with_target, project_audio_features, MultiTalkCrossAttnPatch,
MultiTalkGetAttnMapPatch, InfiniteTalkOuterSampleWrapper), the WanInfiniteTalkToVideo node's steps
(comfy_extras/nodes_wan.py: linear_interpolation, the "add" speaker combination, the token masks, the patch set-up)
and the tiny Wan DiT of wan.py (its "expert" variant: 36 channels in, no CLIP branch, detected as WAN21_T2V).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/infinite_talk.py
(ComfyUI's imports need the extra pins listed in comfy_sampling.py; torchaudio gets comfyui.py's stand-in.)

The patch at tiny sizes: ComfyUI's MultiTalkModelPatch hard-codes the released widths (40 blocks of 40 heads,
5120 wide, 12 wav2vec2 layers of 768 features), so the same classes are built small: `audio_proj` =
MultiTalkAudioProjModel(seq_len 5, seq_len_vf 8, blocks 3, channels 4, intermediate 16, out 8, 32 context tokens)
(proj1 [16, 60], proj1_vf [16, 96], proj2 [16, 16], proj3 [256, 16], norm [8]) and 2 blocks
WanMultiTalkAttentionBlock(256, 8) whose `audio_cross_attn` is SingleStreamMultiAttention(256, 8, 2 heads of 128,
qkv bias) (the released one: 40 heads of 128). Values random (seed 41), rounded to bf16 and used in f32: biases
0.1 N, 1-D gains 1 + 0.2 N, matrices N / sqrt(fan-in). The container is wrapped in a ModelPatcher as
ModelPatchLoader wraps MultiTalkModelPatch (MultiTalkCrossAttnPatch reads `model_patch.model.blocks[i]`).

Writes infinite_talk.safetensors (every tensor f32; about 1.3 MB, the two blocks' 256 x 256 projections being
1.1 MB of it, as humo.safetensors' are):
- `patch.<name>`: every patch weight, named as the released file (`patch.audio_proj.proj1.weight`,
  `patch.blocks.0.norm_x.weight`, `patch.blocks.0.audio_cross_attn.{q_linear,kv_linear,proj}.{weight,bias}`, ...).
- Feature resampling, as the node does it, for c in `odd` (41 encoder frames) and `even` (40): `states.<c>`
  [4, T, 4] (4 random wav2vec2-like states, state 0 included, stacked and squeezed) and `features.<c>` =
  linear_interpolation(states[1:], 50 -> 25 fps).movedim(0, 1) [20, 3, 4].
- Audio projection, project_audio_features(audio_proj, speakers, start, end): `audio.<c>.<k>` (speaker k's
  features [T, 3, 4] as handed in), `window.<c>` [start, end], `embeds.<c>` [1, N_t, S x 32, 8], for `single`
  (T 30, window 0..13, N_t 4), `padded` (T 10, window 0..13: past the end, padded with frame 0), `late` (T 40,
  window 8..21) and `two` (raw features `raw.two.0` [12, 3, 4] and `raw.two.1` [9, 3, 4] combined as the node's
  "add" mode does, zero-padded to 21 with speaker 2 after speaker 1: `audio.two.0/1` [21, 3, 4]; window 0..17,
  N_t 5, S 2).
- Token masks, as the node builds them: `masks` [2, 50, 70] (values in {-0.5, 0, 0.3, 1}) for a latent 8 x 12
  (image 64 x 96): `token_masks` = (nearest interpolation to 4 x 6 > 0) [2, 24] (0/1).
- Attention map: `map.q`, `map.k` [1, 18, 2, 128] (B, tokens, heads, head dim) on a grid (3, 2, 3), `map.masks`
  [2, 6] (0/1), `map.out` = get_attn_map_with_target(q, k, (3, 2, 3), masks.bool()) [2, 18].
- DiT forward with the patch: ComfyUI's WanModel (wan.py's comfy_net, expert variant) called as
  net(x, t, context, transformer_options=opts): `fwd.x` [1, 36, 3, 4, 6], `fwd.t` [700], `fwd.context` [1, 6, 32],
  `fwd.embeds.single` [1, 3, 32, 8] and `fwd.embeds.two` [1, 3, 64, 8] (project_audio_features on fresh features
  of 9 frames each, window 0..9), `fwd.masks` [2, 6] (0/1 token masks, rows x cols 2 x 3), and the outputs
  [1, 16, 3, 4, 6]: `fwd.out.plain` (no patch), `fwd.out.single` (attn2_patch MultiTalkCrossAttnPatch(patch, 1.0),
  `audio_embeds` single), `fwd.out.scaled` (the same at audio_scale -0.5), `fwd.out.two` (attn1_patch
  MultiTalkGetAttnMapPatch(masks) and attn2_patch MultiTalkCrossAttnPatch(patch, 1.0), `audio_embeds` two).
- Sampling through ComfyUI's own path: a ModelPatcher around model_base.WAN21 from model_config_from_unet on the
  expert weights (f32), patched as WanInfiniteTalkToVideo.execute patches it (clone, transformer_options
  `audio_embeds`, the OUTER_SAMPLE InfiniteTalkOuterSampleWrapper, attn2_patch MultiTalkCrossAttnPatch(patch,
  1.0)), then CFGGuider at cfg 1 (positive = context with concat_latent_image / concat_mask, negative the same with
  zeros), sampler_object("euler"), calculate_sigmas(model_sampling (shift 8), "simple", 2), the given noise,
  latent zeros [1, 16, 3, 4, 6]: `sample.sigmas` [3], `sample.seed` [1] and `sample.noise` (comfy.sample.prepare_noise
  of the zero latent for that seed), `sample.concat` (VAE space) and
  `sample.concat_mask` [1, 1, 3, 4, 6] (frame 0 zero), `sample.context` [1, 6, 32], `sample.embeds` [1, 3, 32, 8]
  (one speaker), `sample.motion.extend` [1, 16, 2, 4, 6] (VAE space), `sample.out.base` (motion = concat's first
  frame, not extending) and `sample.out.extend` (motion = sample.motion.extend, extending: the wrapper puts the
  motion latent back over the first 2 frames), the sampler's latents [1, 16, 3, 4, 6] in VAE space.
  comfyui.py's `--cpu` is all the CPU run needs: model_management then loads every model on the CPU; the one
  change to the detected configuration is `text_dim` 32 (detection leaves WanModel's default 4096). Checked
  against a hand-written loop on the same WanModel: x = sigma_0 * noise; per step the model input is x with its
  first motion frames replaced by Wan21.process_in(motion) (a copy; the apply-model wrapper), with WAN21's
  c_concat [4 x (1 - concat_mask), process_in(concat)] appended, t = 1000 sigma; denoised = input - sigma v;
  Euler x += (x - denoised) / sigma * (sigma_next - sigma); the result through Wan21.process_out, and when
  extending its first motion frames replaced by the motion latent itself. (ComfyUI's patch only handles a batch
  of 1: at cfg > 1, where cond and uncond run as one batch, its kv view fails.)

Writes infinite_talk_released.json: ComfyUI's real MultiTalkModelPatch() (40 blocks, in_dim 5120, out 768) built
on the meta device: {"globals": audio_proj weight -> shape, "block": block 0's weights (without "blocks.0.") ->
shape, "blocks": 40, "keys": the weight count}.
"""

import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import DIM, HEADS, OUT, TEXT, comfy_net, variant, weight_listing, write_listing  # noqa: E402

# The patch's tiny sizes (released: 12 layers of 768 features, 512 intermediate, 768 out, 40 heads, 40 blocks).
FEATURE_LAYERS, FEATURE_WIDTH, HIDDEN, AUDIO_OUT, AUDIO_TOKENS, BLOCKS = 3, 4, 16, 8, 32, 2

# The seed of the sampling runs' noise.
SAMPLE_SEED = 5

def bf16_random(shape, name, g):
    """A bf16-rounded f32 value: biases 0.1 N, 1-D gains 1 + 0.2 N, matrices N / sqrt(fan-in)."""
    if name.endswith("bias"):
        value = 0.1 * torch.randn(shape, generator=g)
    elif len(shape) == 1:
        value = 1.0 + 0.2 * torch.randn(shape, generator=g)
    else:
        value = torch.randn(shape, generator=g) / shape[1] ** 0.5
    return value.to(torch.bfloat16).float()


def tiny_patch(g):
    """The tiny MultiTalk patch (see the module comment) with random weights, in a ModelPatcher."""
    import comfy.model_patcher
    import comfy.ops
    from comfy.ldm.wan.model_multitalk import (MultiTalkAudioProjModel, SingleStreamMultiAttention,
                                               WanMultiTalkAttentionBlock)

    ops = comfy.ops.disable_weight_init

    class Patch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.audio_proj = MultiTalkAudioProjModel(seq_len=5, seq_len_vf=8, blocks=FEATURE_LAYERS,
                                                      channels=FEATURE_WIDTH, intermediate_dim=HIDDEN,
                                                      out_dim=AUDIO_OUT, context_tokens=AUDIO_TOKENS, operations=ops)
            self.blocks = torch.nn.ModuleList()
            for _ in range(BLOCKS):
                block = WanMultiTalkAttentionBlock(DIM, AUDIO_OUT, operations=ops)
                block.audio_cross_attn = SingleStreamMultiAttention(DIM, AUDIO_OUT, num_heads=HEADS, qkv_bias=True,
                                                                    operations=ops)
                self.blocks.append(block)

    patch = Patch().eval()
    weights = {name: bf16_random(tuple(p.shape), name, g) for name, p in patch.state_dict().items()}
    result = patch.load_state_dict(weights, strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(patch, load_device=cpu, offload_device=cpu), weights


def resampling(out, g):
    """The node's resampling of the encoder states: drop state 0, 50 -> 25 per second, frames first."""
    from comfy_extras.nodes_wan import linear_interpolation

    for case, frames in (("odd", 41), ("even", 40)):
        states = torch.randn(FEATURE_LAYERS + 1, frames, FEATURE_WIDTH, generator=g)
        features = linear_interpolation(states[1:], input_fps=50, output_fps=25).movedim(0, 1)
        out[f"states.{case}"] = states
        out[f"features.{case}"] = features
        print(f"resampling {case}: {tuple(states.shape)} -> {tuple(features.shape)}")


def projection(out, audio_proj, g):
    """project_audio_features on one speaker (three windows) and on two combined as the node's "add" mode does."""
    from comfy.ldm.wan.model_multitalk import project_audio_features

    def features(frames):
        return torch.randn(frames, FEATURE_LAYERS, FEATURE_WIDTH, generator=g)

    cases = {"single": ([features(30)], 0, 13), "padded": ([features(10)], 0, 13),
             "late": ([features(40)], 8, 21)}
    raw = [features(12), features(9)]
    out["raw.two.0"], out["raw.two.1"] = raw
    # WanInfiniteTalkToVideo's "add": each speaker zero-padded to the summed length, speaker 2 after speaker 1.
    total, offset, combined = sum(r.shape[0] for r in raw), 0, []
    for r in raw:
        full = torch.zeros(total, *r.shape[1:], dtype=r.dtype)
        full[offset:offset + r.shape[0]] = r
        combined.append(full)
        offset += r.shape[0]
    cases["two"] = (combined, 0, 17)
    with torch.no_grad():
        for case, (speakers, start, end) in cases.items():
            embeds = project_audio_features(audio_proj, speakers, start, end)
            for k, s in enumerate(speakers):
                out[f"audio.{case}.{k}"] = s
            out[f"window.{case}"] = torch.tensor([float(start), float(end)])
            out[f"embeds.{case}"] = embeds
            print(f"projection {case}: {len(speakers)} x {tuple(speakers[0].shape)}, window {start}..{end} -> "
                  f"{tuple(embeds.shape)}")


def token_masks(out, g):
    """The node's token masks: the speakers' image masks nearest-resized to the token grid, then > 0."""
    values = torch.tensor([-0.5, 0.0, 0.3, 1.0])
    masks = values[torch.randint(0, 4, (2, 50, 70), generator=g)]
    # Large blocks so the nearest samples are not all alike: speaker 1 on the left, speaker 2 on the right.
    masks[0, :, :30] = values[torch.randint(2, 4, (50, 30), generator=g)]
    masks[1, :, 40:] = values[torch.randint(2, 4, (50, 30), generator=g)]
    latent_h, latent_w = 8, 12
    tokens = F.interpolate(masks.unsqueeze(0), size=(latent_h // 2, latent_w // 2), mode="nearest")[0]
    tokens = (tokens > 0).view(tokens.shape[0], -1)
    out["masks"] = masks
    out["token_masks"] = tokens.float()
    print(f"token masks: {tokens.sum(1).tolist()} of {tokens.shape[1]} tokens per speaker")


def attention_map(out, g):
    """get_attn_map_with_target on random q, k."""
    from comfy.ldm.wan.model_multitalk import get_attn_map_with_target

    q = torch.randn(1, 18, HEADS, DIM // HEADS, generator=g)
    k = torch.randn(1, 18, HEADS, DIM // HEADS, generator=g)
    masks = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]])
    result = get_attn_map_with_target(q, k, (3, 2, 3), ref_target_masks=masks.bool())
    out.update({"map.q": q, "map.k": k, "map.masks": masks, "map.out": result})
    choice = torch.bincount(result.argmax(0), minlength=2).tolist()
    print(f"attention map: {tuple(result.shape)}, tokens choosing each speaker {choice}")


def forward(out, net, patch, g):
    """ComfyUI's WanModel with the patch, called with fresh transformer_options per call."""
    from comfy.ldm.wan.model_multitalk import (MultiTalkCrossAttnPatch, MultiTalkGetAttnMapPatch,
                                               project_audio_features)

    audio_proj = patch.model.audio_proj
    x = torch.randn(1, 36, 3, 4, 6, generator=g)
    t = torch.tensor([700.0])
    context = torch.randn(1, 6, TEXT, generator=g)
    with torch.no_grad():
        single = project_audio_features(audio_proj, [torch.randn(9, FEATURE_LAYERS, FEATURE_WIDTH, generator=g)],
                                        0, 9)
        two = project_audio_features(audio_proj, [torch.randn(9, FEATURE_LAYERS, FEATURE_WIDTH, generator=g)
                                                  for _ in range(2)], 0, 9)
    assert single.shape == (1, 3, AUDIO_TOKENS, AUDIO_OUT) and two.shape == (1, 3, 2 * AUDIO_TOKENS, AUDIO_OUT)
    masks = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 1.0, 1.0]])

    choices = []

    class Recording(MultiTalkGetAttnMapPatch):
        """The attn1 patch, recording each block's per-token speaker choice (diagnostics only)."""

        def __call__(self, kwargs):
            result = super().__call__(kwargs)
            choices.append(torch.bincount(kwargs["transformer_options"]["x_ref_attn_map"].argmax(0),
                                          minlength=2).tolist())
            return result

    def options(scale=1.0, embeds=single, map_patch=None):
        patches = {"attn2_patch": [MultiTalkCrossAttnPatch(patch, scale)]}
        if map_patch is not None:
            patches["attn1_patch"] = [map_patch]
        return {"patches": patches, "audio_embeds": embeds}

    with torch.no_grad():
        plain = net(x, t, context, transformer_options={})
        one = net(x, t, context, transformer_options=options())
        scaled = net(x, t, context, transformer_options=options(-0.5))
        both = net(x, t, context, transformer_options=options(embeds=two,
                                                               map_patch=MultiTalkGetAttnMapPatch(masks.bool())))
        recorded = net(x, t, context, transformer_options=options(embeds=two, map_patch=Recording(masks.bool())))
    assert torch.equal(recorded, both)
    scale = float(plain.abs().max())
    print(f"forward: max |plain| {scale:.3f}; max |single - plain| {float((one - plain).abs().max()):.4f}, "
          f"|scaled - plain| {float((scaled - plain).abs().max()):.4f}, "
          f"|two - single| {float((both - one).abs().max()):.4f}; per-block speaker choice counts {choices}")
    assert float((one - plain).abs().max()) > 1e-2 * scale and float((both - one).abs().max()) > 1e-2 * scale
    assert all(min(c) > 0 for c in choices), choices
    out.update({"fwd.x": x, "fwd.t": t, "fwd.context": context, "fwd.embeds.single": single,
                "fwd.embeds.two": two, "fwd.masks": masks, "fwd.out.plain": plain, "fwd.out.single": one,
                "fwd.out.scaled": scaled, "fwd.out.two": both})


def sampling(out, expert, net, patch, g):
    """ComfyUI's sampling path with the node's patch and outer-sample wrapper (see the module comment)."""
    import comfy.model_detection
    import comfy.model_patcher
    import comfy.patcher_extension
    import comfy.sample
    import comfy.samplers
    from comfy.ldm.wan.model_multitalk import InfiniteTalkOuterSampleWrapper, MultiTalkCrossAttnPatch
    from comfy.ldm.wan.model_multitalk import project_audio_features

    config = comfy.model_detection.model_config_from_unet(dict(expert), "")
    assert type(config).__name__ == "WAN21_T2V", type(config).__name__
    # Detection leaves the text width at WanModel's default 4096 (umT5-XXL's); the tiny model's is 32.
    config.unet_config["text_dim"] = TEXT
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(expert, "")
    model.load_model_weights({k: v.float() for k, v in expert.items()}, "")
    cpu = torch.device("cpu")
    base = comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)
    assert base.model_dtype() == torch.float32

    sigmas = comfy.samplers.calculate_sigmas(base.get_model_object("model_sampling"), "simple", 2).float()
    # ComfyUI's own noise for the seed (what Kiln's RandomNoise / KSampler make from it).
    noise = comfy.sample.prepare_noise(torch.zeros(1, 16, 3, 4, 6), SAMPLE_SEED)
    concat = torch.randn(1, 16, 3, 4, 6, generator=g)
    concat_mask = torch.ones(1, 1, 3, 4, 6)
    concat_mask[:, :, :1] = 0.0
    context = torch.randn(1, 6, TEXT, generator=g)
    motion_extend = torch.randn(1, 16, 2, 4, 6, generator=g)
    with torch.no_grad():
        embeds = project_audio_features(patch.model.audio_proj,
                                        [torch.randn(9, FEATURE_LAYERS, FEATURE_WIDTH, generator=g)], 0, 9)
    out.update({"sample.sigmas": sigmas, "sample.seed": torch.tensor([float(SAMPLE_SEED)]),
                "sample.noise": noise, "sample.concat": concat,
                "sample.concat_mask": concat_mask, "sample.context": context, "sample.embeds": embeds,
                "sample.motion.extend": motion_extend})

    for case, motion, extend in (("base", concat[:, :, :1], False), ("extend", motion_extend, True)):
        # WanInfiniteTalkToVideo.execute's patching.
        patched = base.clone()
        patched.model_options["transformer_options"]["audio_embeds"] = embeds.to(patched.model_dtype())
        patched.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.OUTER_SAMPLE, "infinite_talk_outer_sample",
                                     InfiniteTalkOuterSampleWrapper(motion, patch, is_extend=extend))
        patched.set_model_patch(MultiTalkCrossAttnPatch(patch, 1.0), "attn2_patch")
        conds = {"concat_latent_image": concat, "concat_mask": concat_mask}
        guider = comfy.samplers.CFGGuider(patched)
        guider.set_conds([[context, dict(conds)]], [[torch.zeros_like(context), dict(conds)]])
        guider.set_cfg(1.0)
        with torch.no_grad():
            result = guider.sample(noise.clone(), torch.zeros(1, 16, 3, 4, 6), comfy.samplers.sampler_object("euler"),
                                   sigmas.clone(), disable_pbar=True, seed=0)
        out[f"sample.out.{case}"] = result.float()
        print(f"sampling {case}: max |out| {float(result.abs().max()):.3f}")
    moved = float((out["sample.out.extend"][:, :, 2:] - out["sample.out.base"][:, :, 2:]).abs().max())
    print(f"sampling: the motion latent moves the last frame by {moved:.4f}")
    hand_check(out, net, patch)


def hand_check(out, net, patch):
    """The sampling runs redone by hand on wan.py's WanModel, to pin down what ComfyUI's path computes (see the
    module comment); must agree within 1e-5 of the output's magnitude."""
    import comfy.latent_formats
    from comfy.ldm.wan.model_multitalk import MultiTalkCrossAttnPatch

    wan21 = comfy.latent_formats.Wan21()
    sigmas, concat = out["sample.sigmas"], out["sample.concat"]
    # WAN21.concat_cond: 4 channels of 1 - concat_mask, then the concat latent in model space.
    c_concat = torch.cat([(1.0 - out["sample.concat_mask"]).repeat(1, 4, 1, 1, 1), wan21.process_in(concat)], dim=1)
    for case, motion in (("base", concat[:, :, :1]), ("extend", out["sample.motion.extend"])):
        x = sigmas[0] * out["sample.noise"]
        for sigma, following in zip(sigmas[:-1], sigmas[1:]):
            x_in = x.clone()
            x_in[:, :, :motion.shape[2]] = wan21.process_in(motion)
            options = {"patches": {"attn2_patch": [MultiTalkCrossAttnPatch(patch, 1.0)]},
                       "audio_embeds": out["sample.embeds"]}
            with torch.no_grad():
                v = net(torch.cat([x_in, c_concat], dim=1), (sigma * 1000.0).reshape(1), out["sample.context"],
                        transformer_options=options)
            denoised = x_in - v * sigma
            x = x + (x - denoised) / sigma * (following - sigma)
        got = wan21.process_out(x)
        if case == "extend":
            got = torch.cat([motion, got[:, :, motion.shape[2]:]], dim=2)
        want = out[f"sample.out.{case}"]
        error = float((got - want).abs().max())
        assert error <= 1e-5 * float(want.abs().max()), (case, error)
        print(f"sampling {case}: the hand-written loop agrees within {error:.2e}")


def released():
    """ComfyUI's real MultiTalkModelPatch on the meta device: the released weight names and shapes."""
    import comfy.ops
    from comfy_extras.nodes_model_patch import MultiTalkModelPatch

    net = MultiTalkModelPatch(device="meta", operations=comfy.ops.disable_weight_init)
    count = len(net.blocks)
    result = weight_listing(net, count)
    print(f"released MultiTalkModelPatch: {result['keys']} weights, {count} blocks")
    write_listing(f"{OUT}/infinite_talk_released.json", result)


def main():
    import_comfyui(node_modules=True)
    g = torch.Generator().manual_seed(41)
    patch, weights = tiny_patch(g)
    out = {f"patch.{k}": v for k, v in weights.items()}
    resampling(out, g)
    projection(out, patch.model.audio_proj, g)
    token_masks(out, g)
    attention_map(out, g)
    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    net = comfy_net("expert", stored, ti2v)
    forward(out, net, patch, g)
    sampling(out, variant(stored, "expert", ti2v), net, patch, g)
    save_file({k: v.float().contiguous() for k, v in out.items()}, f"{OUT}/infinite_talk.safetensors")
    released()


if __name__ == "__main__":
    main()
