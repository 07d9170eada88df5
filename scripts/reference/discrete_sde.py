"""Records ComfyUI's DPM-Solver++ SDE samplers on a discrete-time (ε) model, the reference for Kiln's SDE samplers
off the flow models (engine/models/tests/fixtures/comfy_sampling/discrete_sde.{safetensors,json}).

As scripts/reference/comfy_sampling.py (read it first: the toy guider, the seed, KSampler's sigmas, ComfyUI's
KSAMPLER path with noise scaling and its inverse), but on ComfyUI's `ModelSamplingDiscrete` with `EPS` at its default
schedule (scaled_linear, 0.00085 to 0.012: SD's and SDXL's), where `sigma_to_half_log_snr` is −log σ and no first
sigma is moved. Samplers: dpmpp_sde, dpmpp_2m_sde, dpmpp_2m_sde_heun, dpmpp_3m_sde and their _gpu twins, at 2, 3, 4
and 8 steps of the simple and karras schedulers.

Run from the repository root:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/discrete_sde.py
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui()
import comfy.model_sampling  # noqa: E402
import comfy.samplers  # noqa: E402
from comfy_sampling import SEED, SHAPE, Toy  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/comfy_sampling")
SAMPLERS = ["dpmpp_sde", "dpmpp_sde_gpu", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun",
            "dpmpp_2m_sde_heun_gpu", "dpmpp_3m_sde", "dpmpp_3m_sde_gpu"]


class EpsSampling(comfy.model_sampling.ModelSamplingDiscrete, comfy.model_sampling.EPS):
    pass


def main():
    ms = EpsSampling()
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(SEED))
    tensors, runs = {"noise": noise.flatten()}, []
    for name in SAMPLERS:
        for scheduler in ("simple", "karras"):
            for steps in (2, 3, 4, 8):
                sigmas = comfy.samplers.calculate_sigmas(ms, scheduler, steps).float()
                toy = Toy(ms)
                sampler = comfy.samplers.sampler_object(name)
                given = sigmas.clone()
                out = sampler.sample(toy, sigmas, {"seed": SEED, "model_options": {}}, None, noise.clone(),
                                     torch.zeros(SHAPE), None, True)
                key = f"{name}/{scheduler}/{steps}"
                tensors[f"run/{key}"] = out.flatten().float()
                tensors[f"sigmas/{key}"] = given
                runs.append({"key": key, "sampler": name, "scheduler": scheduler, "steps": steps,
                             "model_calls": toy.calls})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "discrete_sde.safetensors"))
    with open(os.path.join(OUT, "discrete_sde.json"), "w") as f:
        json.dump({"seed": SEED, "runs": runs}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
