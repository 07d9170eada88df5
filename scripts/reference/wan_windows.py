"""Fixtures for Wan conditioning cut to context windows (engine/src/nodes/builtin/wan_vace.rs, bernini.rs): ComfyUI's
own Wan models, CFGGuider and ContextWindowsManual on wan.py's tiny models.

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py; needs wan.py's fixtures first):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/wan_windows.py

Each model is loaded as ComfyUI's loader does (model_detection; shift 8), and each case samples with CFGGuider
(cfg 2, euler, simple 3 steps) from a zero latent [1, 16, 5, 4, 6] and seeded noise, without windows (`out.plain`)
and with ContextWindowsManual (`out.windows`: 3 frames overlapping by 1, static standard schedule, pyramid fuse,
no FreeNoise, the first frame retained in every window's conditioning, the causal fix). Each file also holds
`context.positive`, `context.negative` [1, 6, 32], `noise` and `sigmas`.

- engine/tests/fixtures/context_windows/vace.safetensors: wan.py's t2v variant with the VACE blocks `vace_weights`
  makes (WAN21_Vace) and what WanVaceToVideo sets: `vace_frames` [1, 32, 5, 4, 6] (inactive and reactive
  latents), `vace_mask` [1, 64, 5, 4, 6], strength 0.8. WAN21_Vace cuts `vace_context` to each window along its
  time axis.
- engine/tests/fixtures/context_windows/bernini.safetensors: the t2v variant (WAN21_T2V) with
  BerniniConditioning's `context_latents`: `context_latent.video` [1, 16, 5, 4, 6] (as long as the latent: cut
  to each window) and `context_latent.image` [1, 16, 1, 4, 6] (one frame: kept whole).
- engine/tests/fixtures/context_windows/camera.safetensors: wan.py's Fun Camera model (the expert variant with
  `camera_weights`: WAN22_Camera, `camera_2.2`) with WanCameraImageToVideo's conditioning: `concat_latent_image`
  [1, 16, 5, 4, 6], `concat_mask` [1, 1, 5, 4, 6] and `camera` [1, 1, 5, 32, 48], which ComfyUI cuts to each
  window along its time axis (the generic branch of `get_resized_cond`).
- engine/tests/fixtures/context_windows/dancer.safetensors: wan_dancer.py's tiny WanDancer (the i2v variant with
  the parts it draws: WAN22_WanDancer, its 32-wide MLPProjs swapped in as there) with WanDancerVideo's
  conditioning at fps 15: `concat_latent_image`, `concat_mask`, `clip`, `clip_ref` [1, 5, 32] and `music`
  [1, 40, 35], on a latent [1, 16, 5, 8, 8]. The music is not as long as the latent, so ComfyUI hands every window
  the whole song (`get_resized_cond`'s `audio_embed` branch), which the model stretches over the window's frames.
- engine/tests/fixtures/context_windows/humo.safetensors: wan.py's HuMo 1.7B (the t2v variant with the audio
  weights of humo.safetensors, its tiny audio modules swapped in as there: WAN21_HuMo) with `audio`
  [1, 5, 8, 5, 4], as many frames as the latent, which WAN21_HuMo cuts to each window (no retained frames).
- engine/tests/fixtures/context_windows/s2v.safetensors: wan_s2v.py's tiny S2V (s2v_weights.safetensors, its tiny
  audio encoder swapped in as there: WAN22_S2V) with WanSoundImageToVideo's conditioning on a latent
  [1, 16, 5, 8, 8]: `audio` [1, 3, 8, 20] (encoder layers, width, audio frames), `reference` [1, 16, 1, 8, 8],
  `motion` [1, 16, 7, 8, 8] and `control` [1, 16, 5, 8, 8] (VAE space). Under windows ComfyUI cuts only the
  control video (its frames are the latent's); the audio (its axis 1 is not the latent's frames), the reference
  and the motion latent reach every window whole, and the model keeps the first 4 audio frames a latent frame.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import (  # noqa: E402
    CLIP, DIM, HEADS, HUMO_AUDIO, HUMO_CHANNELS, HUMO_HIDDEN, HUMO_TOKENS, OUT, TEXT, camera_weights, vace_weights,
    variant)

WINDOWS_OUT = "engine/tests/fixtures/context_windows"
SEED = 11


def tiny_t2v():
    """wan.py's t2v variant (ComfyUI names, bf16) and the TI2V weights the VACE embedding is made of."""
    stored = load_file(f"{OUT}/weights.safetensors")
    ti2v = load_file(f"{OUT}/ti2v.safetensors")
    return variant(stored, "t2v", ti2v), ti2v


def patcher_of(weights, kind, **unet_config):
    """A ModelPatcher around the model ComfyUI's loader builds for `weights` (its config `kind`, with `unet_config`
    where detection assumes the released widths), f32 on the CPU."""
    import comfy.model_detection
    import comfy.model_patcher

    config = comfy.model_detection.model_config_from_unet(dict(weights), "")
    assert type(config).__name__ == kind, type(config).__name__
    # Detection leaves the text width at WanModel's default 4096 (umT5-XXL's); the tiny model's is 32.
    config.unet_config["text_dim"] = TEXT
    config.unet_config.update(unet_config)
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(weights, "")
    model.load_model_weights({k: v.float() for k, v in weights.items()}, "")
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def vace_patcher():
    t2v, ti2v = tiny_t2v()
    weights = {**t2v, **vace_weights(t2v)}
    weights["vace_patch_embedding.weight"] = torch.cat([ti2v["patch_embedding.weight"]] * 2, dim=1)
    weights["vace_patch_embedding.bias"] = ti2v["patch_embedding.bias"]
    return patcher_of(weights, "WAN21_Vace")


def run(patcher, io, extras, name, g, frames=(16, 5, 4, 6), negative_extras=None):
    """Samples `patcher` with `extras` on both sides (or `negative_extras` on the negative), plain and windowed,
    into io and the fixture `name`."""
    import comfy.samplers
    from comfy_extras.nodes_context_windows import ContextWindowsManualNode

    io["context.positive"] = torch.randn(1, 6, TEXT, generator=g)
    io["context.negative"] = torch.randn(1, 6, TEXT, generator=g)
    io["noise"] = torch.randn(1, *frames, generator=torch.Generator().manual_seed(SEED))
    sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", 3)
    io["sigmas"] = sigmas.float()
    positive = [[io["context.positive"], dict(extras)]]
    negative = [[io["context.negative"], dict(extras if negative_extras is None else negative_extras)]]

    def sample(p):
        guider = comfy.samplers.CFGGuider(p)
        guider.set_conds(positive, negative)
        guider.set_cfg(2.0)
        with torch.no_grad():
            out = guider.sample(io["noise"].clone(), torch.zeros_like(io["noise"]),
                                comfy.samplers.sampler_object("euler"), sigmas.clone(), disable_pbar=True, seed=SEED)
        return out.float()

    io["out.plain"] = sample(patcher)
    windowed = ContextWindowsManualNode.execute(patcher, 3, 1, "standard_static", 1, False, "pyramid", 2, False,
                                                "0", False, "", True).result[0]
    io["out.windows"] = sample(windowed)
    gap = (io["out.windows"] - io["out.plain"]).abs().max()
    print(f"{name}: plain max {io['out.plain'].abs().max():.4f}, windows differ from plain by {gap:.4f}")
    assert gap > 1e-3, "the windows should change the result"
    os.makedirs(WINDOWS_OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{WINDOWS_OUT}/{name}.safetensors")
    print(os.path.getsize(f"{WINDOWS_OUT}/{name}.safetensors"), "bytes")


def main():
    import_comfyui(node_modules=True)

    g = torch.Generator().manual_seed(3)
    io = {"vace_frames": torch.randn(1, 32, 5, 4, 6, generator=g),
          "vace_mask": (torch.rand(1, 64, 5, 4, 6, generator=g) > 0.5).float()}
    extras = {"vace_frames": [io["vace_frames"]], "vace_mask": [io["vace_mask"]], "vace_strength": [0.8]}
    run(vace_patcher(), io, extras, "vace", g)

    g = torch.Generator().manual_seed(5)
    io = {"context_latent.video": torch.randn(1, 16, 5, 4, 6, generator=g),
          "context_latent.image": torch.randn(1, 16, 1, 4, 6, generator=g)}
    extras = {"context_latents": [io["context_latent.video"], io["context_latent.image"]]}
    run(patcher_of(tiny_t2v()[0], "WAN21_T2V"), io, extras, "bernini", g)

    g = torch.Generator().manual_seed(9)
    io = {"concat_latent_image": torch.randn(1, 16, 5, 4, 6, generator=g),
          "concat_mask": (torch.rand(1, 1, 5, 4, 6, generator=g) > 0.5).float(),
          "camera": torch.randn(1, 1, 5, 32, 48, generator=g)}
    extras = {"concat_latent_image": io["concat_latent_image"], "concat_mask": io["concat_mask"],
              "camera_conditions": io["camera"]}
    stored = load_file(f"{OUT}/weights.safetensors")
    expert = variant(stored, "expert", load_file(f"{OUT}/ti2v.safetensors"))
    # Detection assumes the released adapter's 24 embedding channels; the tiny one reads 1.
    patcher = patcher_of({**expert, **camera_weights(expert)}, "WAN22_Camera", in_dim_control_adapter=1)
    run(patcher, io, extras, "camera", g)

    dancer()
    humo()
    s2v()
    phantom()
    timestep_range()


class ClipStates:
    """What ComfyUI's CLIPVisionEncode hands on: the penultimate hidden states."""

    def __init__(self, states):
        self.penultimate_hidden_states = states


def dancer_patcher():
    """A ModelPatcher around model_base.WAN22_WanDancer on wan_dancer.py's tiny weights, f32 on the CPU."""
    import comfy.model_detection
    import comfy.model_patcher
    import comfy.ops
    from comfy.ldm.wan.model import MLPProj
    from wan_dancer import MUSIC_FEATURES, MUSIC_WIDTH, dancer_parts, released

    stored = load_file(f"{OUT}/weights.safetensors")
    body = variant(stored, "i2v", load_file(f"{OUT}/ti2v.safetensors"))
    weights = {**{k: v.float() for k, v in body.items()}, **released(dancer_parts())}
    config = comfy.model_detection.model_config_from_unet(dict(weights), "")
    assert type(config).__name__ == "WAN22_WanDancer", type(config).__name__
    config.unet_config.update({"text_dim": TEXT, "music_dim": MUSIC_WIDTH, "music_heads": 4,
                               "music_feature_dim": MUSIC_FEATURES, "music_latent_dim": MUSIC_WIDTH})
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(weights, "")
    settings = {"operations": comfy.ops.disable_weight_init, "device": None, "dtype": torch.float32}
    model.diffusion_model.img_emb = MLPProj(CLIP, DIM, operation_settings=settings)
    model.diffusion_model.img_emb_refimage = MLPProj(CLIP, DIM, operation_settings=settings)
    model.load_model_weights(weights, "")
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def humo_patcher():
    """A ModelPatcher around model_base.WAN21_HuMo on wan.py's tiny HuMo 1.7B, f32 on the CPU."""
    import comfy.model_detection
    import comfy.model_patcher
    import comfy.ops
    from comfy.ldm.wan.model import AudioCrossAttentionWrapper, AudioProjModel

    stored = load_file(f"{OUT}/weights.safetensors")
    fixture = load_file(f"{OUT}/humo.safetensors")
    audio = {k: v for k, v in fixture.items() if k.startswith("audio_proj.") or ".audio_cross_attn_wrapper." in k}
    weights = {**{k: v.float() for k, v in variant(stored, "t2v", load_file(f"{OUT}/ti2v.safetensors")).items()},
               **audio}
    config = comfy.model_detection.model_config_from_unet(dict(weights), "")
    assert type(config).__name__ == "WAN21_HuMo", type(config).__name__
    config.unet_config["text_dim"] = TEXT
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(weights, "")
    ops = comfy.ops.disable_weight_init
    net = model.diffusion_model
    net.audio_proj = AudioProjModel(seq_len=8, blocks=5, channels=HUMO_CHANNELS, intermediate_dim=HUMO_HIDDEN,
                                    output_dim=HUMO_AUDIO, context_tokens=HUMO_TOKENS, operations=ops)
    settings = {"operations": ops, "device": None, "dtype": torch.float32}
    for block in net.blocks:
        block.audio_cross_attn_wrapper = AudioCrossAttentionWrapper(DIM, HUMO_AUDIO, HEADS, True, 1e-6,
                                                                    operation_settings=settings)
    model.load_model_weights(weights, "")
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def humo():
    g = torch.Generator().manual_seed(17)
    io = {"audio": torch.randn(1, 5, 8, 5, HUMO_CHANNELS, generator=g)}
    run(humo_patcher(), io, {"audio_embed": io["audio"]}, "humo", g)


def s2v_patcher():
    """A ModelPatcher around model_base.WAN22_S2V on wan_s2v.py's tiny S2V, f32 on the CPU."""
    import comfy.model_detection
    import comfy.model_patcher
    from wan_s2v import AUDIO_WIDTH, INJECT, tiny_audio_encoder

    weights = load_file(f"{OUT}/s2v_weights.safetensors")
    config = comfy.model_detection.model_config_from_unet(dict(weights), "")
    assert type(config).__name__ == "WAN22_S2V", type(config).__name__
    config.unet_config.update(text_dim=TEXT, audio_dim=AUDIO_WIDTH, audio_inject_layers=INJECT)
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model(weights, "")
    model.diffusion_model.casual_audio_encoder = tiny_audio_encoder()
    model.load_model_weights({k: v.float() for k, v in weights.items()}, "")
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=cpu, offload_device=cpu)


def s2v():
    from wan_s2v import AUDIO_LAYERS, AUDIO_WIDTH

    g = torch.Generator().manual_seed(19)
    io = {"audio": torch.randn(1, AUDIO_LAYERS, AUDIO_WIDTH, 20, generator=g),
          "reference": torch.randn(1, 16, 1, 8, 8, generator=g),
          "motion": torch.randn(1, 16, 7, 8, 8, generator=g),
          "control": torch.randn(1, 16, 5, 8, 8, generator=g)}
    extras = {"audio_embed": io["audio"], "reference_latents": [io["reference"]], "reference_motion": io["motion"],
              "control_video": io["control"]}
    run(s2v_patcher(), io, extras, "s2v", g, frames=(16, 5, 8, 8))


def dancer():
    from wan_dancer import MUSIC_FEATURES

    g = torch.Generator().manual_seed(15)
    io = {"concat_latent_image": torch.randn(1, 16, 5, 8, 8, generator=g),
          "concat_mask": (torch.rand(1, 1, 5, 8, 8, generator=g) > 0.5).float(),
          "clip": torch.randn(1, 5, CLIP, generator=g), "clip_ref": torch.randn(1, 5, CLIP, generator=g),
          "music": torch.randn(1, 40, MUSIC_FEATURES, generator=g)}
    extras = {"concat_latent_image": io["concat_latent_image"], "concat_mask": io["concat_mask"],
              "clip_vision_output": ClipStates(io["clip"]), "clip_vision_output_ref": ClipStates(io["clip_ref"]),
              "audio_embed": io["music"], "fps": 15.0, "audio_inject_scale": 0.7}
    run(dancer_patcher(), io, extras, "dancer", g, frames=(16, 5, 8, 8))


def phantom():
    """ComfyUI's WanPhantomSubjectToVideo (width 48, height 32, length 17) on wan_vae.py's tiny Wan 2.1 VAE (as
    comfy.sd.VAE loads it) with two RGBA subject images [2, 40, 56, 4] of another aspect, which the node fits
    (bilinear, centre crop), encodes one at a time and sets as `time_dim_concat`; then run()'s sampling on the t2v
    variant with the node's `positive` and `negative_img_text` (its subjects blank: zeros in the model's space).
    Under windows the subject frames (2, not the latent's 5) reach every window whole."""
    import comfy.sd
    from comfy_extras.nodes_wan import WanPhantomSubjectToVideo

    vae_weights = load_file("engine/models/tests/fixtures/wan_vae/weights.safetensors")
    vae = comfy.sd.VAE(sd={k: v.float() for k, v in vae_weights.items()})
    g = torch.Generator().manual_seed(21)
    io = {"images": torch.rand(2, 40, 56, 4, generator=g)}
    out = WanPhantomSubjectToVideo.execute([[torch.zeros(1, 1, TEXT), {}]], [[torch.zeros(1, 1, TEXT), {}]], vae,
                                           48, 32, 17, 1, io["images"]).result
    positive, negative_text, negative_img_text, latent = out
    io["subjects"] = positive[0][1]["time_dim_concat"].float()
    io["blank"] = negative_img_text[0][1]["time_dim_concat"].float()
    assert torch.equal(negative_text[0][1]["time_dim_concat"], positive[0][1]["time_dim_concat"])
    assert tuple(io["subjects"].shape) == (1, 16, 2, 4, 6), io["subjects"].shape
    assert tuple(latent["samples"].shape) == (1, 16, 5, 4, 6), latent["samples"].shape
    run(patcher_of(tiny_t2v()[0], "WAN21_T2V"), io, {"time_dim_concat": io["subjects"]}, "phantom", g,
        negative_extras={"time_dim_concat": io["blank"]})


def timestep_range():
    """ComfyUI's CFGGuider (cfg 2, euler, simple 5 steps) on the t2v variant with ConditioningSetTimestepRange's
    `start_percent` / `end_percent` (ComfyUI turns them into sigmas with the model's percent_to_sigma; a prompt
    outside its range at a step is left out of that step's mean, and a side with none in range predicts zeros):
    two positive prompts over [0, 0.5] and [0.5, 1], a third over the whole run, and a negative over [0.3, 1],
    absent from the first steps. Writes engine/tests/fixtures/context_windows/timestep_range.safetensors:
    `context.p0`, `context.p1`, `context.p2`, `context.negative` [1, 6, 32], `noise` [1, 16, 3, 4, 6], `sigmas`,
    `out` (no windows: the file sits with the other Wan sampling fixtures); then, with context windows that split
    the first two positive prompts among them and a plain negative, `split.noise` [1, 16, 5, 4, 6] and
    `split.out`."""
    import comfy.samplers

    patcher = patcher_of(tiny_t2v()[0], "WAN21_T2V")
    g = torch.Generator().manual_seed(23)
    io = {name: torch.randn(1, 6, TEXT, generator=g) for name in ("context.p0", "context.p1", "context.p2",
                                                                   "context.negative")}
    io["noise"] = torch.randn(1, 16, 3, 4, 6, generator=torch.Generator().manual_seed(SEED))
    sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", 5)
    io["sigmas"] = sigmas.float()
    positive = [[io["context.p0"], {"start_percent": 0.0, "end_percent": 0.5}],
                [io["context.p1"], {"start_percent": 0.5, "end_percent": 1.0}],
                [io["context.p2"], {}]]
    negative = [[io["context.negative"], {"start_percent": 0.3, "end_percent": 1.0}]]
    guider = comfy.samplers.CFGGuider(patcher)
    guider.set_conds(positive, negative)
    guider.set_cfg(2.0)
    with torch.no_grad():
        io["out"] = guider.sample(io["noise"].clone(), torch.zeros_like(io["noise"]),
                                  comfy.samplers.sampler_object("euler"), sigmas.clone(), disable_pbar=True,
                                  seed=SEED).float()
    # Context windows that split the positive's prompts among them (split_conds_to_windows): on a 5-frame
    # latent, windows of 3 overlapping by 1 take p0 (first half of the run) and p1 (second half) in turn; a
    # window whose prompt is out of range at a step predicts zeros there.
    from comfy_extras.nodes_context_windows import ContextWindowsManualNode

    io["split.noise"] = torch.randn(1, 16, 5, 4, 6, generator=torch.Generator().manual_seed(SEED))
    split = ContextWindowsManualNode.execute(patcher, 3, 1, "standard_static", 1, False, "pyramid", 2, False, "0",
                                             True, "", True).result[0]
    guider = comfy.samplers.CFGGuider(split)
    guider.set_conds(positive[:2], [[io["context.negative"], {}]])
    guider.set_cfg(2.0)
    with torch.no_grad():
        io["split.out"] = guider.sample(io["split.noise"].clone(), torch.zeros_like(io["split.noise"]),
                                        comfy.samplers.sampler_object("euler"), sigmas.clone(), disable_pbar=True,
                                        seed=SEED).float()
    save_file({k: v.contiguous() for k, v in io.items()}, f"{WINDOWS_OUT}/timestep_range.safetensors")
    print("timestep_range: out max", float(io["out"].abs().max()), "split max", float(io["split.out"].abs().max()))


if __name__ == "__main__":
    if sys.argv[1:] == ["phantom"]:
        import_comfyui(node_modules=True)
        phantom()
    elif sys.argv[1:] == ["timestep_range"]:
        import_comfyui(node_modules=True)
        timestep_range()
    else:
        main()
