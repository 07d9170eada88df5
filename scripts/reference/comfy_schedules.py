"""Records the sigmas of ComfyUI's schedule nodes that need no model (LaplaceScheduler, VPScheduler,
ExtendIntermediateSigmas from comfy_extras/nodes_custom_sampler.py, OptimalStepsScheduler from
nodes_optimalsteps.py) and SamplingPercentToSigma's value on a flow model's sampling (shift 3 and 8):
engine/models/tests/fixtures/comfy_sampling/schedules.{safetensors,json}.

ComfyUI at the commit Kiln matches is imported from COMFYUI_DIR (see comfyui.py). Each case calls the node's own
`execute`. The JSON lists the cases (`key`, `node`, the inputs); the safetensors file holds each case's sigmas
(f32) under its key; SamplingPercentToSigma's values (Python floats) are in the JSON.

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/comfy_schedules.py
"""

import json
import os
import sys
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/comfy_sampling"


def main():
    import_comfyui(node_modules=True)
    import comfy.model_sampling
    from comfy_extras import nodes_custom_sampler as cs
    from comfy_extras import nodes_optimalsteps as ops

    tensors, cases = {}, []

    def record(node, fn, **inputs):
        key = f"{node}.{len(cases)}"
        tensors[key] = fn(**inputs).result[0].float().clone()
        cases.append({"key": key, "node": node, **inputs})

    for steps, lo, hi, mu, beta in ((20, 0.0291675, 14.614642, 0.0, 0.5), (7, 0.002, 80.0, 0.3, 1.5),
                                    (1, 0.0291675, 14.614642, 0.0, 0.5), (10, 0.1, 3.0, -1.2, 0.8)):
        record("LaplaceScheduler", cs.LaplaceScheduler.execute, steps=steps, sigma_max=hi, sigma_min=lo, mu=mu,
               beta=beta)
    for steps, beta_d, beta_min, eps_s in ((20, 19.9, 0.1, 0.001), (5, 12.0, 0.3, 0.01), (1, 19.9, 0.1, 0.001)):
        record("VPScheduler", cs.VPScheduler.execute, steps=steps, beta_d=beta_d, beta_min=beta_min, eps_s=eps_s)
    for family in ("FLUX", "Wan", "Chroma"):
        for steps, denoise in ((20, 1.0), (10, 1.0), (40, 1.0), (3, 1.0), (13, 0.6), (8, 0.05), (9, 0.0)):
            record("OptimalStepsScheduler", ops.OptimalStepsScheduler.execute, model_type=family, steps=steps,
                   denoise=denoise)
    base = torch.tensor([14.6, 9.0, 4.5, 2.0, 0.9, 0.3, 0.0])
    tensors["extend.base"] = base
    for steps, start, end, spacing in ((2, -1.0, 12.0, "linear"), (4, -1.0, 1.0, "cosine"),
                                       (3, 8.0, 0.5, "sine"), (1, -1.0, 0.0, "linear"), (5, 4.5, 4.5, "cosine")):
        key = f"ExtendIntermediateSigmas.{len(cases)}"
        tensors[key] = cs.ExtendIntermediateSigmas.execute(base, steps, start, end, spacing).result[0].float()
        cases.append({"key": key, "node": "ExtendIntermediateSigmas", "steps": steps, "start_at_sigma": start,
                      "end_at_sigma": end, "spacing": spacing})

    class Flow(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass

    values = []
    for shift in (3.0, 8.0):
        sampling = Flow(SimpleNamespace(sampling_settings={"shift": shift, "multiplier": 1000}))
        model = SimpleNamespace(get_model_object=lambda name, s=sampling: s)
        for percent in (0.0, 0.25, 0.5, 0.875, 1.0):
            for actual in (False, True):
                value = cs.SamplingPercentToSigma.execute(model, percent, actual).result[0]
                values.append({"shift": shift, "sampling_percent": percent, "return_actual_sigma": actual,
                               "sigma": float(value)})
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, f"{OUT}/schedules.safetensors")
    with open(f"{OUT}/schedules.json", "w") as f:
        json.dump({"schedules": cases, "percent_to_sigma": values}, f, indent=1)
    print(len(cases), "schedules,", len(values), "percent values")


if __name__ == "__main__":
    main()
