"""Fixtures for Kiln's wav2vec2 audio encoder (ComfyUI's AudioEncoderLoader / AudioEncoderEncode with
wav2vec2_large_english_fp16.safetensors, Wan 2.2 S2V's, or wav2vec2-chinese-base_fp16.safetensors, InfiniteTalk's),
in engine/models/tests/fixtures/wav2vec2/.

Needs `torchaudio==2.11.1` beside the pins requirements.txt and comfy_sampling.py list.

Run from the repository root:
    COMFYUI_DIR=... target/reference-venv/bin/python scripts/reference/wav2vec2.py

The reference is ComfyUI itself at 0f1fa67a: comfy/audio_encoders/wav2vec2.py's Wav2Vec2Model in both of the
configurations comfy/audio_encoders/audio_encoders.py's `load_audio_encoder_from_sd` builds ("large": layer norms
after every convolution, convolution biases, the input normalised, pre-LayerNorm layers; "base": one group norm
after the first convolution, no convolution biases, no input normalisation, post-LayerNorm layers), each with
tiny dims: width 128 in 2 heads of 64 (the released 1024 and 768 split into heads of 64 too), 2 layers, and a
32-channel convolution stack (the constructor hard-codes 512 channels: ComfyUI's own ConvFeatureEncoder and
FeatureProjection built with 32 take their places). The positional convolution keeps the kernel of 128 and the 16
groups ComfyUI hard-codes. The weights are loaded as `load_audio_encoder_from_sd` loads them (the `wav2vec2.`
prefix stripped, strict=False; torch's weight-norm hook takes the legacy `weight_g` / `weight_v` names) and the
model runs as `encode_audio` runs it: `torchaudio.functional.resample(audio, rate, 16000)`, then the model, in f32
(ComfyUI's manual-cast layers cast the weights to the f32 waveform's type; the positional convolution is a plain
torch Conv1d created, and kept by archive_model_dtypes, in f32).

Writes:
- large.safetensors, base.safetensors (f32): each model's weights under the released files' names
  (`wav2vec2.` + the name in ComfyUI's model; the positional convolution's weight norm as
  `encoder.pos_conv_embed.conv.weight_g` [1, 1, 128] and `weight_v` [128, 8, 128]); weights N(0, 1) / sqrt(fan-in),
  biases 0.05 N, norm gains 1 + 0.1 N and biases 0.05 N, the weight norm's gains 1 + 0.2 N.
- io.safetensors (f32):
  `audio` [1, 2, 24000]: a 1 s stereo clip at 24000 Hz (tones, a chirp and a little noise, within [-1, 1]; the
  channels differ, so their mean matters);
  `<config>.state.<i>` [1, 49, 128] for i in 0..=2: ComfyUI's tuple of every layer's state after resampling the
  clip to 16 kHz (its last hidden state, `encoded_audio`, is `<config>.state.2`);
  `batch.audio` [2, 1, 6400] (16 kHz, a loud and a quiet clip) and `<config>.batch.last` [2, 19, 128]: the model on
  a batch (the large model normalises over the whole batch at once).
"""

import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from audio_clips import clip  # noqa: E402

OUT = "engine/models/tests/fixtures/wav2vec2"
WIDTH, HEADS, LAYERS, CONV_DIM = 128, 2, 2, 32
RATE = 24000
# load_audio_encoder_from_sd's two configurations, less the widths.
CONFIGS = {
    "large": dict(conv_norm=True, conv_bias=True, do_normalize=True, do_stable_layer_norm=True),
    "base": dict(conv_norm=False, conv_bias=False, do_normalize=False, do_stable_layer_norm=False),
}
# The weight norm's names in the released files (torch's legacy weight_norm), and in ComfyUI's model.
LEGACY = {
    "encoder.pos_conv_embed.conv.parametrizations.weight.original0": "encoder.pos_conv_embed.conv.weight_g",
    "encoder.pos_conv_embed.conv.parametrizations.weight.original1": "encoder.pos_conv_embed.conv.weight_v",
}


def build(flags):
    import comfy.ops
    from comfy.audio_encoders.wav2vec2 import ConvFeatureEncoder, FeatureProjection, Wav2Vec2Model

    kw = dict(dtype=torch.float32, device="cpu", operations=comfy.ops.manual_cast)
    model = Wav2Vec2Model(embed_dim=WIDTH, num_heads=HEADS, num_layers=LAYERS, **flags, **kw)
    model.feature_extractor = ConvFeatureEncoder(CONV_DIM, conv_norm=flags["conv_norm"],
                                                 conv_bias=flags["conv_bias"], **kw)
    model.feature_projection = FeatureProjection(CONV_DIM, WIDTH, **kw)
    return model.eval()


def weights(model, g):
    """Random values for every tensor of the model's state, under the released files' names."""
    out = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        n = torch.randn(*shape, generator=g)
        if name.endswith("original0"):
            v = 1 + 0.2 * n
        elif name == "masked_spec_embed":
            v = torch.rand(*shape, generator=g)
        elif "norm" in name and name.endswith(".weight"):
            v = 1 + 0.1 * n
        elif name.endswith(".bias"):
            v = 0.05 * n
        else:
            v = n / math.sqrt(math.prod(shape[1:]))
        out["wav2vec2." + LEGACY.get(name, name)] = v.float().contiguous()
    return out


def load(model, sd):
    """load_audio_encoder_from_sd's loading: the prefix stripped, the width read, strict=False."""
    import comfy.utils

    sd = comfy.utils.state_dict_prefix_replace(dict(sd), {"wav2vec2.": ""})
    assert sd["encoder.layer_norm.bias"].shape[0] == WIDTH
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)


def main():
    import_comfyui()
    import torchaudio

    assert torchaudio.__version__.startswith("2.11.1"), torchaudio.__version__
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(23)
    io = {"audio": clip(2, RATE, RATE, g, channel_offset=0.02)[None]}
    io["batch.audio"] = torch.stack([clip(1, 6400, 16000, g), clip(1, 6400, 16000, g, gain=1e-2)])
    resampled = torchaudio.functional.resample(io["audio"], RATE, 16000)
    assert resampled.shape == (1, 2, 16000), resampled.shape

    for config, flags in CONFIGS.items():
        model = build(flags)
        sd = weights(model, g)
        save_file(sd, f"{OUT}/{config}.safetensors")
        # A fresh model, loaded from the file's names as ComfyUI loads them.
        model = build(flags)
        load(model, sd)
        with torch.no_grad():
            last, states = model(resampled)
            batch_last, _ = model(io["batch.audio"])
            # The parametrization's own names load the same weights.
            again = build(flags)
            again.load_state_dict({k: v for k, v in model.state_dict().items()})
            assert torch.equal(again(resampled)[0], last)
        assert len(states) == LAYERS + 1 and torch.equal(states[-1], last), len(states)
        assert last.shape == (1, 49, WIDTH) and batch_last.shape == (2, 19, WIDTH), (last.shape, batch_last.shape)
        for i, s in enumerate(states):
            io[f"{config}.state.{i}"] = s
        io[f"{config}.batch.last"] = batch_last
        if flags["do_normalize"]:
            # The normalisation is over the whole batch: each item alone gives another answer.
            with torch.no_grad():
                alone = model(io["batch.audio"][1:])[0]
            print(f"{config}: quiet item alone vs in the batch {float((alone - batch_last[1:]).abs().max()):.3e}")
        print(f"{config}: last |max| {float(last.abs().max()):.3f}, states "
              + ", ".join(f"{float(s.abs().max()):.3f}" for s in states))

    save_file({k: v.float().contiguous().clone() for k, v in io.items()}, f"{OUT}/io.safetensors")
    sizes = {f: os.path.getsize(f"{OUT}/{f}") for f in sorted(os.listdir(OUT))}
    print(f"fixtures: {sizes}, total {sum(sizes.values())}")


if __name__ == "__main__":
    main()
