"""Records the samplers ComfyUI's parameterised sampler nodes make (SamplerEulerAncestral,
SamplerEulerAncestralCFGPP, SamplerDPMPP_2S_Ancestral, SamplerLMS, SamplerER_SDE, SamplerDPMPP_SDE,
SamplerDPMPP_2M_SDE, SamplerDPMPP_3M_SDE, SamplerSEEDS2, SamplerDPMAdaptative, SamplerSASolver; SamplerEulerCFGpp and
SamplerLCM of comfy_extras/nodes_advanced_samplers.py) run on the toy
model of
comfy_sampling.py: engine/models/tests/fixtures/comfy_sampling/sampler_nodes.{safetensors,json}.

ComfyUI at the commit Kiln matches is imported from COMFYUI_DIR (see comfyui.py; the node module needs the
torchaudio stand-in). Each case builds the SAMPLER with the node's own `execute` and runs it as comfy_sampling.py
runs KSampler's samplers (KSAMPLER.sample: noise scaling at the first sigma, the sampler with extra_args["seed"],
inverse noise scaling at the last), on the simple schedule.

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/comfy_sampler_nodes.py
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui(node_modules=True)
import comfy.samplers  # noqa: E402
from comfy_extras import nodes_advanced_samplers as advanced  # noqa: E402
from comfy_extras import nodes_custom_sampler as nodes  # noqa: E402
from comfy_sampling import OUT, SEED, SHAPE, Toy, model_sampling  # noqa: E402

CASES = [
    ("SamplerEulerAncestral", {"eta": 0.5, "s_noise": 0.8}),
    ("SamplerEulerAncestral", {"eta": 0.0, "s_noise": 1.0}),
    ("SamplerEulerAncestralCFGPP", {"eta": 0.6, "s_noise": 1.3}),
    ("SamplerDPMPP_2S_Ancestral", {"eta": 0.4, "s_noise": 0.9}),
    ("SamplerLMS", {"order": 2}),
    ("SamplerLMS", {"order": 1}),
    ("SamplerER_SDE", {"solver_type": "ER-SDE", "max_stage": 2, "eta": 0.7, "s_noise": 1.1}),
    ("SamplerER_SDE", {"solver_type": "Reverse-time SDE", "max_stage": 3, "eta": 0.5, "s_noise": 1.0}),
    ("SamplerER_SDE", {"solver_type": "ODE", "max_stage": 3, "eta": 1.0, "s_noise": 1.0}),
    ("SamplerER_SDE", {"solver_type": "ER-SDE", "max_stage": 1, "eta": 0.0, "s_noise": 1.0}),
    ("SamplerDPMPP_SDE", {"eta": 0.6, "s_noise": 1.2, "r": 0.3, "noise_device": "cpu"}),
    ("SamplerDPMPP_SDE", {"eta": 0.0, "s_noise": 1.0, "r": 0.5, "noise_device": "gpu"}),
    ("SamplerDPMPP_2M_SDE", {"solver_type": "heun", "eta": 0.7, "s_noise": 0.9, "noise_device": "cpu"}),
    ("SamplerDPMPP_2M_SDE", {"solver_type": "midpoint", "eta": 1.0, "s_noise": 0.0, "noise_device": "gpu"}),
    ("SamplerDPMPP_3M_SDE", {"eta": 0.5, "s_noise": 0.8, "noise_device": "gpu"}),
    ("SamplerDPMPP_3M_SDE", {"eta": 1.0, "s_noise": 1.0, "noise_device": "cpu"}),
    ("SamplerSEEDS2", {"solver_type": "phi_2", "eta": 0.6, "s_noise": 1.3, "r": 0.3}),
    ("SamplerSEEDS2", {"solver_type": "phi_1", "eta": 1.0, "s_noise": 0.0, "r": 0.7}),
    ("SamplerDPMAdaptative", {"order": 2, "rtol": 0.02, "atol": 0.003, "h_init": 0.1, "pcoeff": 0.2,
                              "icoeff": 0.9, "dcoeff": 0.1, "accept_safety": 0.9, "eta": 0.0, "s_noise": 1.0}),
    ("SamplerDPMAdaptative", {"order": 3, "rtol": 0.01, "atol": 0.001, "h_init": 0.3, "pcoeff": 0.0,
                              "icoeff": 1.0, "dcoeff": 0.0, "accept_safety": 0.95, "eta": 0.7, "s_noise": 0.9}),
    ("SamplerSASolver", {"eta": 0.8, "sde_start_percent": 0.1, "sde_end_percent": 0.6, "s_noise": 1.1,
                         "predictor_order": 2, "corrector_order": 2, "use_pece": False, "simple_order_2": True}),
    ("SamplerSASolver", {"eta": 1.0, "sde_start_percent": 0.3, "sde_end_percent": 0.9, "s_noise": 0.7,
                         "predictor_order": 4, "corrector_order": 0, "use_pece": True, "simple_order_2": False}),
    ("SamplerSASolver", {"eta": 0.5, "sde_start_percent": 0.0, "sde_end_percent": 1.0, "s_noise": 1.0,
                         "predictor_order": 1, "corrector_order": 3, "use_pece": True, "simple_order_2": True}),
    ("SamplerEulerCFGpp", {"version": "regular"}),
    ("SamplerEulerCFGpp", {"version": "alternative"}),
    ("SamplerLCM", {"s_noise": 0.7, "s_noise_end": 1.3, "noise_clip_std": 1.5}),
    ("SamplerLCM", {"s_noise": 1.0, "s_noise_end": 1.0, "noise_clip_std": 0.0}),
]
STEPS = (3, 6)


def main():
    ms = model_sampling()
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(SEED))
    tensors, cases = {}, []
    for n, (node, inputs) in enumerate(CASES):
        # SamplerSASolver reads its SDE interval from the MODEL's model sampling.
        extra = {"model": type("M", (), {"get_model_object": lambda self, name: ms})()} \
            if node == "SamplerSASolver" else {}
        sampler = getattr(nodes if hasattr(nodes, node) else advanced, node).execute(**inputs, **extra)[0]
        for steps in STEPS:
            sigmas = comfy.samplers.calculate_sigmas(ms, "simple", steps).float()
            key = f"node/{n}/{steps}"
            toy = Toy(ms)
            out = sampler.sample(toy, sigmas.clone(), {"seed": SEED, "model_options": {}}, None, noise.clone(),
                                 torch.zeros(SHAPE), None, True)
            tensors[key] = out.flatten().float()
            cases.append({"key": key, "node": node, "inputs": inputs, "steps": steps, "model_calls": toy.calls})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "sampler_nodes.safetensors"))
    with open(os.path.join(OUT, "sampler_nodes.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
