"""Records the noise of ComfyUI's `BrownianTreeNoiseSampler` (torchsde 0.2.6's BrownianTree on the CPU), the
reference Kiln's Brownian tree test compares with, bit for bit: engine/models/tests/fixtures/brownian/
{brownian.safetensors,cases.json}.

Each case builds the sampler as ComfyUI's SDE samplers do (sigma_min, sigma_max, the seed, cpu=True) for a latent
of SHAPE and asks it for the noise of a sequence of steps (sigma, sigma_next): the consecutive steps of a schedule,
the midpoints dpmpp_sde asks for, and steps out of order, which make the tree split where earlier queries did not.
Each step records the tree's increment W(sigma_next) - W(sigma) as well as the noise, W over the step's square root:
torch takes that f32 square root with MKL, which rounds some values one ulp away from the correctly rounded one.

Run from the repository root with the reference venv (ComfyUI from COMFYUI_DIR, see comfy_sampling.py):
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/brownian.py
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui()
from comfy.k_diffusion.sampling import BrownianTreeNoiseSampler  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/brownian")
SHAPE = (1, 16, 4, 4)


def main():
    os.makedirs(OUT, exist_ok=True)
    schedule = torch.tensor([1.0, 0.9, 0.75, 0.5, 0.2, 0.0])
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    cases = [
        {"seed": 77, "steps": [[1.0, 0.9], [0.9, 0.75], [0.75, 0.5], [0.5, 0.2]]},
        {"seed": 77, "steps": [[0.99990004, 0.94868326], [0.94868326, 0.9], [0.9, 0.8215838], [0.8215838, 0.75]]},
        {"seed": (1 << 40) + 3, "steps": [[0.5, 0.2], [1.0, 0.9], [0.75, 0.5], [0.9, 0.75], [0.62, 0.31]]},
        {"seed": 0, "steps": [[0.2, 0.5], [0.3333, 0.3332], [1.0, 0.2]]},
    ]
    tensors = {}
    for c, case in enumerate(cases):
        x = torch.zeros(SHAPE)
        sigmas = schedule
        sampler = BrownianTreeNoiseSampler(x, sigmas[sigmas > 0].min(), sigmas.max(), seed=case["seed"], cpu=True)
        case["keys"] = []
        for s, (sigma, nxt) in enumerate(case["steps"]):
            key = f"case/{c}/{s}"
            # The tree's increment (sorted times, before the sign and the division), then the noise.
            lo, hi = sorted((f32(sigma), f32(nxt)))
            tensors[f"w/{c}/{s}"] = sampler.tree.trees[0](lo, hi).flatten().float()
            tensors[key] = sampler(f32(sigma), f32(nxt)).flatten().float()
            case["keys"].append(key)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "brownian.safetensors"))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"shape": SHAPE, "sigma_min": 0.2, "sigma_max": 1.0, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
