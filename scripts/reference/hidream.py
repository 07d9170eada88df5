"""Fixtures for HiDream-I1 (engine/models/tests/fixtures/hidream/): its DiT (ComfyUI's comfy/ldm/hidream, an MMDiT
with MoE feed-forwards fed per block by Llama 3.1 layer states) and the Llama states its text encoder hands over.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/hidream.py

ComfyUI 0f1fa67a is the reference (comfy/ldm/hidream/model.py, model_base.HiDream, model_detection's hidream block,
supported_models.HiDream, text_encoders/hidream.py, hunyuan_video.LLAMAModel, llama.py, sd1_clip.py,
clip_model.py). Detection hard-codes the released widths, so the tiny DiT is built directly; its state-dict names
are the released file's, checked by loading the written file back strictly.

Writes:
- weights.safetensors: a tiny random HiDream DiT, bf16 (qwen_image.randomize, seed 31; the text stream's q/k
  RMS gains `*_rms_norm_t.weight`, which randomize's norm rule misses, are redrawn as 1 + 0.2 N): 1 head x 128
  (RoPE axes 64, 32, 32, theta 10000, all of the head), 1 double-stream + 1 single-stream block, 2x2 patches of
  16 channels, MoE feed-forwards with 3 routed experts (top 2) of hidden 512 and a shared expert of hidden 256
  (ComfyUI's SwiGLU rounds int(2/3 * width) up to a multiple of 256), the text stream's dense SwiGLU of hidden
  512, pooled width 20, caption widths T5 32 and Llama 24 (`caption_channels=[32, 24]`: index 0 is T5's, index 1
  the Llama's), `llama_layers=[0, 1]`. `caption_projection.i` projects the Llama layer block i reads
  (i = 0 .. double + single - 1) and the last one (`caption_projection.2`) projects T5.
- io.safetensors (f32), per case c: `x.<c>` [B, 16, h, w]; `sigma.<c>` [B]; `timestep.<c>` [B] = what the
  DiT's forward gets as `t`: ComfyUI's ModelSamplingDiscreteFlow.timestep, sigma x 1000 (HiDream is a FLOW
  model; supported_models.HiDream's `shift: 3.0` is overwritten by a second, empty `sampling_settings`, so its
  default shift is 1, which timestep() does not use anyway); `pooled.<c>` [B, 20] (the `y` the forward gets:
  CLIP-L's and CLIP-G's projected pooled vectors concatenated); `context.<c>` [B, Nt, 32] (T5's states);
  `llama.<c>` [B, 2, Nl, 24] (`encoder_hidden_states_llama3`: Llama layers on dim 1, as the text encoder's
  `ll_out[:, 1:]` has them; the model picks `llama_layers` from dim 1); `image_cond.<c>` [B, 16, h, w] for
  `edit`; `out.<c>` [B, 16, h, w] = the forward's output (already negated, -v, and cropped). Cases: `even`
  (B 1, 8x8, Nt 6, Nl 5, sigma 0.7), `batch` (B 2, 6x10, Nt 4, Nl 3, sigmas 0.9 and 0.3, every input
  different per sample), `ragged` (B 1, 5x7, padded circularly by common_dit.pad_to_patch_size to 6x8, then
  cropped; Nt 3, Nl 4, sigma 0.5), `edit` (B 1, 6x6 with a 6x6 `image_cond` that the model concatenates after x
  along the width, a 3x6 token grid whose RoPE columns run on through the condition; the output is x's 6x6;
  Nt 5, Nl 4, sigma 0.6).
- llama.safetensors: a tiny random Llama (ComfyUI's Llama2 / Llama2Config: vocabulary 300, hidden 64,
  intermediate 96, 3 layers, 2 heads and 1 KV head of 128 (Llama2Config's head width, which Kiln keeps too), RoPE theta 500000 without scaling, RMS eps 1e-5,
  final norm, no biases), bf16 (the values randomize draws are bf16's) (randomize, seed 37: norm gains 1 + 0.2 N, weights
  N / sqrt(fan-in)), under the HF names ComfyUI's module uses (`model.embed_tokens.weight`,
  `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `model.layers.{i}.{input,post_attention}_layernorm.weight`,
  `model.layers.{i}.mlp.{gate,up,down}_proj.weight`, `model.norm.weight`).
- llama_io.safetensors (f32), per case c: `ids.<c>` [1, N] (ids as f32), `mask.<c>` [1, N] (ComfyUI's attention
  mask), `all.<c>` [1, 4, N, 64]: hunyuan_video.LLAMAModel with HiDream's arguments (layer "all", start and pad
  tokens, no end token; here start 1, pad 299) through its encode_token_weights: Llama2_'s intermediate output
  with intermediate_output="all", final_layer_norm_intermediate=False, f32. Index k of `all` is the input of
  layer k: 0 the token embeddings, k = 1 .. L-1 the output of layer k-1, and k = L the last layer's output
  through the final norm (Llama2_ applies `norm` before appending the last entry; HF's hidden_states have the
  same layout). HiDream drops index 0 (`ll_out[:, 1:]` in text_encoders/hidream.py), so the DiT's Llama layer j
  is `all[:, j + 1]` and the released `llama_layers` (0..31, then 31 sixteen times) end on the final-normed
  output. Cases: `padded` (ids 1 3 17 250 33 9 299 299 299, mask 1 up to the first pad, that pad and all after 0:
  sd1_clip.process_tokens compares the pad token when there is no end token and zeroes the first one too) and
  `full` (6 ids without pads, mask all 1). The mask masks keys (added as finfo.min / 4 to the causal mask); the
  padded positions' states are still computed and are handed to the DiT, which gets no text mask. Prompt
  weights are not recorded: ClipTokenWeightEncoder.encode_token_weights loops over dim 1 of this [1, L+1, N, D]
  output as if it were the tokens, so token j's weight moves layer j's states at every position (checked by hand).

CLIP pooled vectors (no fixture): HiDream's CLIP-L is `SDClipModel(return_projected_pooled=True)` and CLIP-G
`SDXLClipG` (always projected). clip_model.CLIPTextModel_ takes the pooled state from the last layer's output
after `final_layer_norm`, at index num_tokens - 1 per sequence, where num_tokens is the sum of process_tokens'
mask (1 up to and including the first end token 49407, 0 after): the first end token's position. CLIPTextModel
returns `text_projection(pooled)` (a bias-free Linear) as the pooled output, and with return_projected_pooled
SDClipModel hands that on (not the unprojected one, which Flux's CLIP-L takes). HiDreamTEModel concatenates
CLIP-L's (768) and CLIP-G's (1280) vectors of the first 77-token section into the DiT's 2048-wide `y`.

Cross-check: diffusers' HiDreamImageTransformer2DModel loads weights.safetensors under the same names and, on the
square `even` case, gives -out (diffusers returns v; its pipeline negates it) within 1e-4 when given the same
`t` (sigma x 1000: the pipeline passes the scheduler's timesteps) and the Llama states with the layers on dim 0
(`llama.movedim(1, 0)`). It is not compared on the others: on a non-square latent diffusers pads the tokens to
max_resolution's 4096 and multiplies the padded keys by 0 (they still get softmax weight), where ComfyUI pads
nothing.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from qwen_image import randomize  # noqa: E402

OUT = "engine/models/tests/fixtures/hidream"
CONFIG = dict(patch_size=2, in_channels=16, out_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=128,
              num_attention_heads=1, caption_channels=[32, 24], text_emb_dim=20, num_routed_experts=3,
              num_activated_experts=2, axes_dims_rope=(64, 32, 32), max_resolution=(128, 128), llama_layers=[0, 1])
# name: batch, h, w, T5 tokens, Llama tokens, sigmas, image_cond (its h, w) or None
CASES = {"even": (1, 8, 8, 6, 5, [0.7], None), "batch": (2, 6, 10, 4, 3, [0.9, 0.3], None),
         "ragged": (1, 5, 7, 3, 4, [0.5], None), "edit": (1, 6, 6, 5, 4, [0.6], (6, 6))}
LLAMA = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
             num_key_value_heads=1, rope_theta=500000.0, rms_norm_eps=1e-5)
LLAMA_HEAD_DIM = 128
START, PAD = 1, 299
LLAMA_CASES = {"padded": [START, 3, 17, 250, 33, 9, PAD, PAD, PAD], "full": [START, 42, 7, 128, 255, 64]}


def main():
    import_comfyui()
    os.makedirs(OUT, exist_ok=True)
    dit_fixtures()
    llama_fixtures()


def dit_fixtures():
    import comfy.model_sampling
    import comfy.ops
    from comfy.ldm.hidream.model import HiDreamImageTransformer2DModel

    def build():
        return HiDreamImageTransformer2DModel(**CONFIG, operations=comfy.ops.disable_weight_init).eval()

    model = build()
    stored = randomize(model, seed=31)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_rms_norm_t.weight"):
                s = (1.0 + 0.2 * torch.randn_like(p)).to(torch.bfloat16)
                p.copy_(s.float())
                stored[name] = s.contiguous()
    save_file(stored, f"{OUT}/weights.safetensors")
    # The file loads strictly into a fresh module (it has no buffers).
    model = build()
    model.load_state_dict({k: v.float() for k, v in load_file(f"{OUT}/weights.safetensors").items()}, strict=True)

    sampling = comfy.model_sampling.ModelSamplingDiscreteFlow()
    routes = {}
    gate = model.double_stream_blocks[0].block.ff_i.gate

    def record(module, inputs, outputs):
        routes.setdefault("idx", outputs[0].clone())

    gate.register_forward_hook(record)

    g = torch.Generator().manual_seed(13)
    io = {}
    with torch.no_grad():
        for name, (b, h, w, nt, nl, sigmas, cond) in CASES.items():
            x = torch.randn(b, 16, h, w, generator=g)
            sigma = torch.tensor(sigmas)
            t = sampling.timestep(sigma)
            pooled = torch.randn(b, 20, generator=g)
            context = torch.randn(b, nt, 32, generator=g)
            llama = torch.randn(b, 2, nl, 24, generator=g)
            io.update({f"x.{name}": x, f"sigma.{name}": sigma, f"timestep.{name}": t, f"pooled.{name}": pooled,
                       f"context.{name}": context, f"llama.{name}": llama})
            image_cond = None
            if cond is not None:
                image_cond = io[f"image_cond.{name}"] = torch.randn(b, 16, *cond, generator=g)
            routes.clear()
            out = model(x, t, y=pooled, context=context, encoder_hidden_states_llama3=llama, image_cond=image_cond,
                        transformer_options={})
            assert out.shape == x.shape, (name, out.shape)
            io[f"out.{name}"] = out
            print(f"{name}: out {tuple(out.shape)} max|out| {float(out.abs().max()):.4f}")
            if name == "even":
                idx = routes["idx"]
                print("  double block 0's image MoE on `even`, top-2 expert picks per expert:",
                      torch.bincount(idx.flatten(), minlength=3).tolist(),
                      "distinct expert pairs:", len({tuple(sorted(r)) for r in idx.tolist()}), "of", idx.shape[0],
                      "tokens")
                assert len({tuple(sorted(r)) for r in idx.tolist()}) > 1
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    diffusers_check(stored, io)


def diffusers_check(stored, io):
    try:
        from diffusers import HiDreamImageTransformer2DModel as Diffusers
    except ImportError:
        print("diffusers has no HiDreamImageTransformer2DModel: cross-check skipped")
        return
    ref = Diffusers(**CONFIG).eval()
    ref.load_state_dict({k: v.float() for k, v in stored.items()}, strict=True)
    with torch.no_grad():
        v = ref(hidden_states=io["x.even"], timesteps=io["timestep.even"], encoder_hidden_states_t5=io["context.even"],
                encoder_hidden_states_llama3=io["llama.even"].movedim(1, 0), pooled_embeds=io["pooled.even"],
                return_dict=False)[0]
    diff = float((-v - io["out.even"]).abs().max())
    print(f"diffusers' HiDreamImageTransformer2DModel on `even` (negated): max |difference| {diff:.2e}")
    assert diff < 1e-4


def tiny_llama_encoder():
    """hunyuan_video.LLAMAModel with HiDreamTEModel's arguments at the tiny widths (Llama2Config's own head width,
    128, which it fixes as a class attribute)."""
    import comfy.text_encoders.hunyuan_video as hunyuan_video

    encoder = hunyuan_video.LLAMAModel(device="cpu", dtype=torch.float32, layer="all", layer_idx=None,
                                       model_options={"vocab_size": LLAMA["vocab_size"],
                                                      "llama_model_config": dict(LLAMA)},
                                       special_tokens={"start": START, "pad": PAD})
    assert encoder.transformer.model.layers[0].self_attn.k_proj.weight.shape == (LLAMA_HEAD_DIM, 64)
    return encoder


def llama_fixtures():
    encoder = tiny_llama_encoder()
    transformer = encoder.transformer
    stored = randomize(transformer, seed=37)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in stored.items()}
    save_file(weights, f"{OUT}/llama.safetensors")
    transformer.load_state_dict(load_file(f"{OUT}/llama.safetensors"), strict=True)
    print(f"llama: {len(weights)} tensors, {sum(v.numel() for v in weights.values())} values")

    io = {}
    with torch.no_grad():
        for name, ids in LLAMA_CASES.items():
            out, pooled, extra = encoder.encode_token_weights([[(i, 1.0) for i in ids]])
            mask = extra["attention_mask"]
            assert out.shape == (1, LLAMA["num_hidden_layers"] + 1, len(ids), 64), out.shape
            # The same as Llama2_'s forward called directly as SDClipModel calls it.
            direct = transformer(None, mask, embeds=transformer.get_input_embeddings()(torch.tensor([ids])),
                                 intermediate_output="all", final_layer_norm_intermediate=False,
                                 dtype=torch.float32)[1]
            assert torch.equal(direct, out)
            # Index 0: the embeddings; the last: the final norm of the last layer's output.
            assert torch.equal(out[:, 0], transformer.get_input_embeddings().weight[ids][None])
            assert torch.equal(out[:, -1], transformer(None, mask, embeds=out[:, 0].clone(), dtype=torch.float32)[0])
            io.update({f"ids.{name}": torch.tensor([ids], dtype=torch.float32), f"mask.{name}": mask.float(),
                       f"all.{name}": out})
            print(f"llama {name}: ids {ids} mask {mask.tolist()[0]} all {tuple(out.shape)} "
                  f"max {float(out.abs().max()):.4f}")
    assert io["mask.padded"].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0, 0]]
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/llama_io.safetensors")


if __name__ == "__main__":
    main()
