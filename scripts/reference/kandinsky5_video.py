"""Fixtures for Kandinsky 5 Lite's video DiT (engine/models/tests/fixtures/kandinsky5_video/): ComfyUI's own
comfy/ldm/kandinsky5 Kandinsky5 in the configuration ComfyUI gives kandinsky5lite_t2v_sft_5s.safetensors and
kandinsky5lite_i2v_5s.safetensors, at tiny widths with random weights, called through ComfyUI's model_base
(Kandinsky5.extra_conds / concat_cond / apply_model) exactly as its sampler calls it: text to video, image to video
with an encoded start latent (`time_dim_replace`) and Kandinsky5ImageToVideo's mask, a batch of 2, odd sizes.

Run from the repository root (COMFYUI_DIR is required: the reference is ComfyUI itself, 0f1fa67a; its extra pins
are listed in comfy_sampling.py; ComfyUI's nodes are imported for Kandinsky5ImageToVideo, with the torchaudio
stand-in of comfyui.py when torchaudio is missing):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/kandinsky5_video.py

ComfyUI code this relies on (file:line in the 0f1fa67a checkout; model.py is comfy/ldm/kandinsky5/model.py; the
blocks, attention, embeddings and output layer are the image model's, described in kandinsky5.py):
- model_detection.py:964-980: a file with `visual_transformer_blocks.0.cross_attention.key_norm.weight`;
  model_dim = visual_embeddings.in_layer.bias rows; model_dim 1792 (Lite video) -> axes_dims (16, 24, 24) (head
  64, 28 heads), rope_scale_factor left at the class default (1, 2, 2); 4096 (Pro video) -> axes (32, 48, 48),
  rope default; 2560 (Lite image) -> axes (32, 48, 48), rope (1, 1, 1); any other width keeps both class defaults
  (16, 24, 24) and (1, 2, 2). visual_embed_dim = visual_embeddings.in_layer.weight columns (132 = 4 * 33 for the
  video models, 64 for the image model). Nothing in the file says "image" or "video" except these widths:
  supported_models.py:2141-2162 Kandinsky5Image needs model_dim 2560 AND visual_embed_dim 64; every other
  Kandinsky 5 file is :2112-2138 Kandinsky5 (video): sampling shift 10.0, latent_format HunyuanVideo (16 channels,
  scale 0.476986, no shift; 8x space, 4x time), inference dtypes bf16 / f32, DualCLIPLoader's video template.
- model_base.py:2641-2663 Kandinsky5.concat_cond: image = zeros_like(noise) (16 channels, ALWAYS zeros: the start
  image never goes into the concat channels); mask = concat_mask, else the sampler's denoise_mask, else none:
  none -> zeros [B, 1, T, h, w]; given -> 1 - mask, common_upscale'd (bilinear, center) to the latent's h, w,
  zero-padded at the end of the frame axis up to T, resize_to_batch_size'd to B; returns cat((image, mask), 1): 17
  channels. model_base.py:210-215 _apply_model: xc = cat([x, c_concat], 1): [B, 16 + 16 + 1 = 33, T, h, w], the
  latent first, then the 16 zero channels, then the mask.
- model_base.py:2665-2678 extra_conds: y = pooled_output (encode_adm), c_crossattn = cross_attn, time_dim_replace =
  self.process_latent_in(time_dim_replace) (HunyuanVideo: * 0.476986, VAE space -> model space), a CONDRegular:
  conds.py:33-34 repeat_to_batch_size'd to the batch (utils.py:859-864: repeated, or cut).
- model.py:389-406 _forward: x = pad_to_patch_size(x) (circular, rows and columns to even; frames untouched, patch
  1); time_dim_replace padded the same way, then `x[:, :C_r, :F_r] = time_dim_replace` (C_r = 16, F_r its frames):
  the first 16 channels (the noisy latent) of the first F_r frames are OVERWRITTEN with the clean start latent; the
  16 zero channels and the mask channel are left alone; the model's output is not touched. (The sampler keeps
  denoising those frames; Kandinsky5ImageToVideo's 4th output `cond_latent` lets a workflow paste them back.)
  RoPE from the UNPADDED t, h, w (:403, :321-323: lengths rounded to the patch).
- model.py:318-360 rope_encode_3d: per axis positions linspace(0, (len - 1) / scale, len) in x.dtype: frames 0, 1,
  2, ... (scale 1); rows and columns i / 2 (0, .5, 1, ...: scale 2); only model_dim 4096 with latent h * w >= 14080
  switches to (1, 3.16, 3.16) (:345-347; recorded below on a stand-in, `pro_rope`). img_ids (frames, rows, columns)
  flattened frame-major then row then column, as VisualEmbeddings (:65-85) orders the tokens ([B, T, H, W, C] ->
  patches of (pt ph pw C), channel fastest, so 132 = 2 * 2 * 33 features a patch). OutLayer (:187-210) unpatches
  16 channels ([B, 16, T, H, W]); _forward does NOT crop the padding off: for odd sides the output stays padded
  and apply_model's calculate_denoised then fails on the shape mismatch (see the `odd` case; ComfyUI's Kandinsky 5
  nodes only make even latent sides: width and height step 16).
- Attention: full attention on every token. The 10 s models' NABLA sparse attention (diffusers' attention_type
  "nabla", sparse_params) is not in ComfyUI: it runs them, and the 5 s models (attention_type "regular"), densely.
- nodes_kandinsky5.py:36-51 Kandinsky5ImageToVideo: latent zeros [B, 16, (length - 1) // 4 + 1, h / 8, w / 8];
  with a start image: encoded = vae.encode(start images) (VAE space, [1, 16, (N - 1) // 4 + 1, h, w] for N images),
  concat_mask = ones [1, 1, T, h, w] with the first (N - 1) // 4 + 1 frames 0; both set on positive and negative
  as `time_dim_replace` and `concat_mask`.

The tiny config (released Lite video values in brackets; Kandinsky5 kwargs): in/out_visual_dim 16 [16],
in_text_dim 96 [3584], in_text_dim2 64 [768], time_dim 64 [512], model_dim 128 [1792], ff_dim 256 [7168],
visual_embed_dim 132 [132], patch_size (1, 2, 2), 1 text block [2], 2 visual blocks [32], axes_dims (16, 24, 24)
[same: head 64, so 2 heads here, 28 released], rope_scale_factor (1, 2, 2) [same]. ComfyUI's own detection of the
tiny file gives those axes and scales and the video class (recorded in dit_cases.json `comfy_detection`); the model
is built from the full kwargs (detection does not read the text widths) through supported_models.Kandinsky5 and
model_base.Kandinsky5, so the calls below go through ComfyUI's concat_cond, extra_conds and _apply_model.

Cases (noise, context, pooled, start latent drawn from one seeded generator; sigma as the sampler passes it, the
model getting t = sigma * 1000):
- t2v: B 1, T 3, h 6, w 8, 5 text tokens, sigma 0.8; no concat_mask, no time_dim_replace (mask channel zeros).
- i2v: B 1, T 3, h 8, w 6, 6 tokens, sigma 0.6; Kandinsky5ImageToVideo's conditioning for 1 start image (1 latent
  frame): time_dim_replace [1, 16, 1, 8, 6] (VAE space, the stand-in VAE's encode), concat_mask frame 0 zero.
- batch: B 2, T 2, h 6, w 6, 4 tokens, sigmas (1.0, 0.3) per sample, two prompts; the i2v conditioning with one
  start latent (repeated to the batch by CONDRegular).
- odd: B 1, T 3, h 5, w 7, 5 tokens, sigma 0.5; 5 start images -> 2 latent start frames, concat_mask frames 0-1
  zero; rows and columns padded circularly (x and time_dim_replace). apply_model raises here (the padded output
  against the odd latent), so the diffusion model is called as _apply_model calls it; `out` is [1, 16, 3, 6, 8] as
  ComfyUI returns it, `out_cropped` its [..., :5, :7] (what Kiln's forward returns).

Writes engine/models/tests/fixtures/kandinsky5_video/:
- dit.safetensors: the DiT under ComfyUI's names (Kandinsky5.state_dict(), no prefix), every tensor bf16; weights
  N(0, 1) / sqrt(fan_in), biases 0.1 N, LayerNorm gains 1 + 0.1 N, biases 0.1 N, q/k RMSNorm gains 1 + 0.1 N.
  visual_embeddings.in_layer.weight is [128, 132].
- dit_io.safetensors (f32), per case c, what the diffusion model received (captured by a forward pre-hook on
  model_base's diffusion_model, i.e. after concat_cond, extra_conds, process_cond and _apply_model):
  `{c}.x` [B, 33, T, h, w] (the noisy latent, 16 zero channels, the mask; before the replacement, which happens
  inside the model), `{c}.t` [B] (sigma * 1000), `{c}.context` [B, L, 96], `{c}.y` [B, 64], `{c}.out`
  [B, 16, T, h', w'] (h', w' padded to even), for the image-to-video cases `{c}.time_dim_replace`
  [B, 16, F, h, w] (model space, as the model got it), and the node's inputs `{c}.start_latent` [1, 16, F, h, w]
  (VAE space) and `{c}.concat_mask` [1, 1, T, h, w]; `{c}.sigma` [B]; for the even cases `{c}.denoised`
  (apply_model's x - out * sigma), for `odd` `{c}.out_cropped`.
- dit_cases.json: the kwargs, each case's shapes and notes, ComfyUI's detection of dit.safetensors, the released
  files' tensor shapes (`released`: ComfyUI's Kandinsky5 built on the meta device with the Lite video and the Lite
  image kwargs, the shapes its detection reads back to the same kwargs), and `pro_rope` (rope_encode_3d's scales at
  model_dim 4096 on both sides of h * w = 14080).

Checks: the loaded modules hold the written values; each even case's apply_model output is x - out * sigma;
the mask and the zero channels are where concat_cond puts them; time_dim_replace is the start latent * 0.476986;
the batch case's output is the same with time_dim_replace of batch 1 passed straight to the model (torch
broadcasting); the files round-trip. Cross-check (max |diff| / max |ref|, this run, CPU f32): diffusers 0.42.1
Kandinsky5Transformer3DModel (in_visual_dim 16, visual_cond True: the same 132-wide patch Linear, the same module
names, loaded strictly), its input built independently (not from the captured x) as diffusers' I2V pipeline builds
it (pipeline_kandinsky_i2v.py:700-729: latents[:, :F] = the start latent in model space, cat(latents,
zeros_like(latents), mask with 1 on the start frames), channels last), padded circularly as ComfyUI pads, RoPE
positions arange per axis with scale_factor (1, 2, 2), text positions arange(L). Stock (bf16-rounded rotary, its
own quirk, see kandinsky5.py): t2v 6.7e-4, i2v 3.7e-4, batch 3.9e-4, odd 5.2e-4; with kandinsky5.py's
F32RotaryProcessor: 3.8e-7, 3.5e-7, 3.4e-7, 4.3e-7. (diffusers' pipelines pick scale (1, 3.16, 3.16) for the Lite
models outside 480p (pipeline_kandinsky_i2v.py:206-224); ComfyUI keeps (1, 2, 2) for them at every size: Kiln
follows ComfyUI.)
"""

import json
import os
import sys
import types

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from kandinsky5 import Draw, F32RotaryProcessor, check_loaded, draw_module, f32, norm_names, rel_err  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../engine/models/tests/fixtures/kandinsky5_video")
SEED = 56
BUDGET = 5_000_000
HUNYUAN_SCALE = 0.476986

DIT = dict(in_visual_dim=16, out_visual_dim=16, in_text_dim=96, in_text_dim2=64, time_dim=64, model_dim=128,
           ff_dim=256, visual_embed_dim=132, patch_size=(1, 2, 2), num_text_blocks=1, num_visual_blocks=2,
           axes_dims=(16, 24, 24), rope_scale_factor=(1.0, 2.0, 2.0))
# name: (batch, frames, h, w, text tokens, sigmas, start images (0: text to video))
CASES = {
    "t2v": (1, 3, 6, 8, 5, [0.8], 0),
    "i2v": (1, 3, 8, 6, 6, [0.6], 1),
    "batch": (2, 2, 6, 6, 4, [1.0, 0.3], 1),
    "odd": (1, 3, 5, 7, 5, [0.5], 5),
}
# The released files' kwargs as ComfyUI's detection gives them (model_detection.py:964-980) plus the widths it
# leaves at the class defaults (in_text_dim 3584, in_text_dim2 768, in/out_visual_dim 16, patch (1, 2, 2)).
RELEASED = {
    "lite_video": dict(model_dim=1792, time_dim=512, ff_dim=7168, visual_embed_dim=132, num_text_blocks=2,
                       num_visual_blocks=32, axes_dims=(16, 24, 24)),
    "lite_image": dict(model_dim=2560, time_dim=512, ff_dim=10240, visual_embed_dim=64, num_text_blocks=2,
                       num_visual_blocks=50, axes_dims=(32, 48, 48), rope_scale_factor=(1.0, 1.0, 1.0)),
}

CROSS = []


def report(name, err, bound):
    CROSS.append(f"{name}: {err:.2e}")
    print(f"  {name}: max |diff| / max |ref| = {err:.2e}")
    assert err < bound, (name, err)


def listed(d):
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def stand_in_vae(encoded):
    """What Kandinsky5ImageToVideo needs of a VAE: encode(images) -> the latent (VAE space) drawn for the case."""

    class VAE:
        def encode(self, images):
            assert images.shape[-1] == 3 and (images.shape[0] - 1) // 4 + 1 == encoded.shape[2], images.shape
            return encoded.clone()

    return VAE()


def released_shapes():
    """The released files' tensor names and shapes, from ComfyUI's class on the meta device; detection reads
    them back to the same kwargs and picks the video or image class."""
    import comfy.model_detection
    import comfy.ops
    from comfy.ldm.kandinsky5.model import Kandinsky5

    out = {}
    for name, kwargs in RELEASED.items():
        model = Kandinsky5(**kwargs, device="meta", operations=comfy.ops.disable_weight_init)
        sd = model.state_dict()
        detected = comfy.model_detection.detect_unet_config(sd, "")
        picked = type(comfy.model_detection.model_config_from_unet(sd, "")).__name__
        for k, v in kwargs.items():
            assert detected[k] == v, (name, k, detected[k], v)
        print(f"released {name}: {len(sd)} tensors, detected {listed(detected)} -> {picked}")
        assert picked == ("Kandinsky5" if name == "lite_video" else "Kandinsky5Image")
        out[name] = {"kwargs": listed(kwargs), "model_config": picked,
                     "rope_scale_factor": list(model.rope_scale_factor),
                     "shapes": {k: list(v.shape) for k, v in sd.items()}}
    return out


def pro_rope():
    """rope_encode_3d's row/column scale at model_dim 4096 (the Pro video model) on a stand-in object: the last
    row and column positions for latents just under and at h * w = 14080."""
    from comfy.ldm.kandinsky5.model import Kandinsky5

    out = []
    for model_dim, (h, w) in ((4096, (88, 160)), (4096, (87, 160)), (1792, (88, 160))):
        seen = {}

        def capture(ids):
            seen["ids"] = ids
            return ids.unsqueeze(1)

        stub = types.SimpleNamespace(patch_size=(1, 2, 2), rope_scale_factor=(1.0, 2.0, 2.0), model_dim=model_dim,
                                     rope_embedder_3d=capture)
        Kandinsky5.rope_encode_3d(stub, 1, h, w, dtype=torch.float32)
        ids = seen["ids"][0]
        rows, cols = (h + 1) // 2, (w + 1) // 2
        last_row, last_col = float(ids[-1, 1]), float(ids[-1, 2])
        scale = 3.16 if model_dim == 4096 and h * w >= 14080 else 2.0
        assert abs(last_row - (rows - 1) / scale) < 1e-5 and abs(last_col - (cols - 1) / scale) < 1e-5
        out.append({"model_dim": model_dim, "h": h, "w": w, "scale": [1.0, scale, scale], "last_row": last_row,
                    "last_col": last_col})
        print(f"rope_encode_3d at model_dim {model_dim}, latent {h}x{w}: row/column scale {scale}")
    return out


def main():
    import_comfyui(node_modules=True)
    import comfy.model_detection
    import comfy.supported_models
    from comfy_extras.nodes_kandinsky5 import Kandinsky5ImageToVideo

    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)

    # ComfyUI's model_base path: supported_models.Kandinsky5 (the video class) with the tiny kwargs.
    mc = comfy.supported_models.Kandinsky5({"image_model": "kandinsky5", **DIT})
    mc.set_inference_dtype(torch.float32, None)
    based = mc.get_model({})
    model = based.diffusion_model.eval()
    assert type(based).__name__ == "Kandinsky5" and type(model).__name__ == "Kandinsky5"
    assert model.text_transformer_blocks[0].self_attention.num_heads == 2
    assert tuple(model.rope_scale_factor) == (1.0, 2.0, 2.0)
    weights = draw_module(Draw(SEED), model, norm_names(model))
    assert list(weights["visual_embeddings.in_layer.weight"].shape) == [128, 132]
    save_file(weights, f"{OUT}/dit.safetensors")
    weights = load_file(f"{OUT}/dit.safetensors")
    model.load_state_dict(f32(weights), strict=True)
    check_loaded(model, weights)

    detected = comfy.model_detection.detect_unet_config(weights, "")
    picked = type(comfy.model_detection.model_config_from_unet(weights, "")).__name__
    print(f"detect_unet_config: {listed(detected)}; model config {picked}")
    assert picked == "Kandinsky5" and "axes_dims" not in detected and detected["visual_embed_dim"] == 132

    seen = {}

    def pre_hook(module, args, kwargs):
        seen["x"], seen["t"] = args[0].clone(), args[1].clone()
        seen["kwargs"] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in kwargs.items()}

    def post_hook(module, args, kwargs, output):
        seen["out"] = output.clone()

    model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    model.register_forward_hook(post_hook, with_kwargs=True)

    g = torch.Generator().manual_seed(SEED + 1)
    io, cases = {}, {}
    with torch.no_grad():
        for name, (b, frames, h, w, n, sigmas, images) in CASES.items():
            noise = torch.randn(b, 16, frames, h, w, generator=g)
            context = torch.randn(b, n, DIT["in_text_dim"], generator=g)
            y = torch.randn(b, DIT["in_text_dim2"], generator=g)
            sigma = torch.tensor(sigmas)
            positive = [[context, {"pooled_output": y}]]
            extra = {}
            if images:
                start_frames = (images - 1) // 4 + 1
                start_latent = 2.0 * torch.randn(1, 16, start_frames, h, w, generator=g)
                start_images = torch.rand(images, h * 8, w * 8, 3, generator=g)
                positive, _, _, cond_latent = Kandinsky5ImageToVideo.execute(
                    positive, positive, stand_in_vae(start_latent), w * 8, h * 8, (frames - 1) * 4 + 1, b,
                    start_images)
                assert torch.equal(cond_latent["samples"], start_latent)
                extra = {k: positive[0][1][k] for k in ("time_dim_replace", "concat_mask")}
                mask = extra["concat_mask"]
                assert mask.shape == (1, 1, frames, h, w) and float(mask[:, :, :start_frames].abs().sum()) == 0
                assert float(mask[:, :, start_frames:].min()) == 1.0
                io[f"{name}.start_latent"], io[f"{name}.concat_mask"] = start_latent, mask
            # samplers.py encode_model_conds: the conditioning's entries plus noise and device; then process_cond.
            conds = based.extra_conds(noise=noise, device="cpu", cross_attn=context, pooled_output=y, **extra)
            assert set(conds) == {"c_concat", "y", "c_crossattn"} | ({"time_dim_replace"} if images else set())
            kwargs = {k: c.process_cond(batch_size=b, area=None).cond for k, c in conds.items()}
            seen.clear()
            even = h % 2 == 0 and w % 2 == 0
            if even:
                denoised = based.apply_model(noise, sigma, **kwargs)
            else:
                # ComfyUI's _forward returns the padded output, so calculate_denoised cannot subtract it from the
                # odd-sided latent: apply_model raises. The diffusion model is called as _apply_model calls it.
                try:
                    based.apply_model(noise, sigma, **kwargs)
                    raise AssertionError("apply_model took odd sides")
                except RuntimeError as e:
                    case_error = str(e).splitlines()[0]
                seen.clear()
                xc = torch.cat([noise, kwargs.pop("c_concat")], 1)
                context_in = kwargs.pop("c_crossattn")
                model(xc, based.model_sampling.timestep(sigma).float(), context=context_in, control=None,
                      transformer_options={}, **kwargs)
            x, t, out = seen["x"], seen["t"], seen["out"]
            got = seen["kwargs"]
            assert x.shape == (b, 33, frames, h, w) and torch.equal(x[:, :16], noise)
            assert float(x[:, 16:32].abs().max()) == 0.0
            want_mask = torch.zeros(b, 1, frames, h, w)
            if images:
                want_mask[:, :, :start_frames] = 1.0
            assert torch.equal(x[:, 32:], want_mask), name
            assert torch.equal(t, sigma * 1000) and torch.equal(got["context"], context) and torch.equal(got["y"], y)
            hp, wp = h + h % 2, w + w % 2
            assert out.shape == (b, 16, frames, hp, wp), out.shape
            io.update({f"{name}.x": x, f"{name}.t": t, f"{name}.context": context, f"{name}.y": y,
                       f"{name}.sigma": sigma, f"{name}.out": out})
            case = {"batch": b, "frames": frames, "h": h, "w": w, "text_tokens": n, "sigma": sigmas,
                    "t": t.tolist(), "x": list(x.shape), "out": list(out.shape), "start_images": images}
            if even:
                err = rel_err(denoised, noise - out * sigma.view(-1, 1, 1, 1, 1))
                assert err < 1e-6, (name, err)
                io[f"{name}.denoised"] = denoised
            else:
                case["note"] = ("odd sides: ComfyUI's _forward returns the output padded to even sides and its "
                                f"apply_model then fails ({case_error}); out_cropped is out[..., :h, :w], what "
                                "Kiln's forward returns")
                io[f"{name}.out_cropped"] = out[..., :h, :w].contiguous()
            if images:
                tdr = got["time_dim_replace"]
                assert tdr.shape == (b, 16, start_frames, h, w)
                assert rel_err(tdr, (start_latent * HUNYUAN_SCALE).expand(b, -1, -1, -1, -1)) < 1e-7
                io[f"{name}.time_dim_replace"] = tdr
                case["time_dim_replace"] = list(tdr.shape)
                case["start_frames"] = start_frames
                # The model broadcasts a batch-1 replacement itself.
                direct = model(x.clone(), t, context, y, time_dim_replace=tdr[:1].clone())
                assert torch.equal(direct, out), name
                # The replacement matters.
                plain = model(x.clone(), t, context, y)
                case["out_without_time_dim_replace_rel_diff"] = rel_err(plain, out)
                assert case["out_without_time_dim_replace_rel_diff"] > 1e-2
            cases[name] = case
            print(f"case {name}: x {tuple(x.shape)}, t {t.tolist()}, out {tuple(out.shape)}, "
                  f"std {out.std():.3f}, max |out| {out.abs().max():.3f}")
        cross_check(weights, io)

    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/dit_io.safetensors")
    back = load_file(f"{OUT}/dit_io.safetensors")
    assert all(torch.equal(back[k], io[k].float()) for k in io)
    with open(f"{OUT}/dit_cases.json", "w") as f:
        json.dump({"seed": SEED, "kandinsky5_kwargs": listed(DIT),
                   "t_is": "sigma * 1000 (ModelSamplingDiscreteFlow multiplier 1000)",
                   "storage": "every weight bf16; computed in f32 from the stored values",
                   "x_layout": "channels 0-15 the noisy latent, 16-31 zeros (concat_cond's image), 32 the mask "
                               "(1 - concat_mask: 1 on the start frames; zeros without concat_mask)",
                   "time_dim_replace": "model space (process_latent_in: * 0.476986); the model overwrites x[:, :16, "
                                       ":F] with it after padding",
                   "cases": cases,
                   "comfy_detection": {"detect_unet_config": listed(detected), "model_config": picked},
                   "released": released_shapes(), "pro_rope": pro_rope()}, f, indent=None)
        f.write("\n")
    total = 0
    for name in sorted(os.listdir(OUT)):
        size = os.path.getsize(f"{OUT}/{name}")
        total += size
        print(f"  {name:24} {size:9d} bytes")
        assert size < BUDGET, name
    print("CROSS-CHECKS (max |diff| / max |ref|):")
    for line in CROSS:
        print("  " + line)


def cross_check(weights, io):
    from diffusers import Kandinsky5Transformer3DModel

    print("diffusers Kandinsky5Transformer3DModel (visual_cond):")
    net = Kandinsky5Transformer3DModel(
        in_visual_dim=16, in_text_dim=DIT["in_text_dim"], in_text_dim2=DIT["in_text_dim2"], time_dim=DIT["time_dim"],
        out_visual_dim=16, patch_size=DIT["patch_size"], model_dim=DIT["model_dim"], ff_dim=DIT["ff_dim"],
        num_text_blocks=DIT["num_text_blocks"], num_visual_blocks=DIT["num_visual_blocks"],
        axes_dims=DIT["axes_dims"], visual_cond=True).eval()
    result = net.load_state_dict(f32(weights), strict=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    for label, processor in (("stock", None), ("f32 rotary", F32RotaryProcessor())):
        if processor is not None:
            for module in net.modules():
                if type(module).__name__ == "Kandinsky5Attention":
                    module.set_processor(processor)
        for name, (b, frames, h, w, n, sigmas, images) in CASES.items():
            # The input as diffusers' I2V pipeline builds it, from the case's own parts.
            latents = io[f"{name}.x"][:, :16].clone()
            mask = torch.zeros(b, 1, frames, h, w)
            if images:
                f = (images - 1) // 4 + 1
                latents[:, :, :f] = io[f"{name}.start_latent"] * HUNYUAN_SCALE
                mask[:, :, :f] = 1.0
            x = torch.cat([latents, torch.zeros_like(latents), mask], 1)
            x = torch.nn.functional.pad(x, (0, w % 2, 0, h % 2, 0, 0), mode="circular")  # ComfyUI's padding
            rows, cols = x.shape[-2] // 2, x.shape[-1] // 2
            out = net(x.permute(0, 2, 3, 4, 1), io[f"{name}.context"], io[f"{name}.t"], io[f"{name}.y"],
                      visual_rope_pos=[torch.arange(frames), torch.arange(rows), torch.arange(cols)],
                      text_rope_pos=torch.arange(n), scale_factor=DIT["rope_scale_factor"], return_dict=False)
            out = out.permute(0, 4, 1, 2, 3)
            report(f"diffusers ({label}) vs ComfyUI, case {name}", rel_err(out, io[f"{name}.out"]),
                   3e-2 if processor is None else 1e-5)


if __name__ == "__main__":
    main()
