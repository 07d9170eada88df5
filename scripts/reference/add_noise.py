"""Fixtures for Kiln's AddNoise (engine/src/nodes/builtin/custom_sampling.rs), from ComfyUI's own node in
comfy_extras/nodes_custom_sampler.py at 0f1fa67a, on a Wan 2.1 model's sampling (flow, shift 8) and latent format.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/add_noise.py

Writes engine/tests/fixtures/add_noise/io.safetensors (f32): `latent` [2, 16, 3, 4, 6] with `batch_index` [3, 7]
(the noise drawn for samples 3 and 7 of a larger batch), `sigmas` (the simple schedule's 4 steps at shift 8);
`out.span` (AddNoise with seed 11 over all the sigmas: scale |σ₀ − σ_last|), `out.tail` (the last two sigmas),
`out.one` (σ₀ alone), `out.empty` (an all-zero latent, kept out of the model's space) and `out.disabled`
(DisableNoise).
"""

import os
import sys
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/add_noise"


def main():
    import_comfyui(node_modules=True)
    import comfy.latent_formats
    import comfy.model_sampling
    import comfy.samplers
    from comfy_extras import nodes_custom_sampler as cs

    class Flow(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass

    sampling = Flow(SimpleNamespace(sampling_settings={"shift": 8.0, "multiplier": 1000}))
    fmt = comfy.latent_formats.Wan21()
    objects = {"model_sampling": sampling, "process_latent_in": fmt.process_in, "process_latent_out": fmt.process_out}
    model = SimpleNamespace(get_model_object=lambda name: objects[name])
    g = torch.Generator().manual_seed(53)
    latent = torch.randn(2, 16, 3, 4, 6, generator=g)
    sigmas = comfy.samplers.calculate_sigmas(sampling, "simple", 4).float()
    io = {"latent": latent, "batch_index": torch.tensor([3.0, 7.0]), "sigmas": sigmas}
    noise = cs.Noise_RandomNoise(11)
    dict_of = lambda samples: {"samples": samples, "batch_index": [3, 7]}  # noqa: E731
    add = lambda n, s, lat: cs.AddNoise.execute(model, n, s, dict_of(lat)).result[0]["samples"]  # noqa: E731
    io["out.span"] = add(noise, sigmas, latent)
    io["out.tail"] = add(noise, sigmas[-2:], latent)
    io["out.one"] = add(noise, sigmas[:1], latent)
    io["out.empty"] = add(noise, sigmas, torch.zeros_like(latent))
    io["out.disabled"] = add(cs.Noise_EmptyNoise(), sigmas, latent)
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
