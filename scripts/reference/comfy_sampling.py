"""Records ComfyUI's own samplers and schedulers on a toy model, the reference Kiln's sampler tests compare with:
engine/models/tests/fixtures/comfy_sampling/{comfy_sampling.safetensors,cases.json}.

The reference is ComfyUI itself at the commit Kiln matches (0f1fa67a), imported from a checkout outside the
repository: COMFYUI_DIR names it (extract it as docs/reference/comfyui-reference-install.md says; nothing of it is
copied here). Extra pins beyond scripts/reference/requirements.txt, for ComfyUI's imports:
    pip install scipy==1.17.1 torchsde==0.2.6 trampoline==0.1.2 torchvision==0.29.2 einops==0.8.2 \
        psutil==7.2.2 comfy-aimdo==0.4.13 comfy-kitchen==0.2.31

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/comfy_sampling.py

What runs is ComfyUI's KSAMPLER path for each name of comfy.samplers.SAMPLER_NAMES (noise scaling at the first
sigma, the sampler function, inverse noise scaling at the last), on the flow model sampling (CONST, shift 3,
multiplier 1: Z-Image's) with a toy guider in place of the network: cond x0 = 0.8 x + 0.3 sigma, uncond
x0 = 0.7 x + 0.1 sigma, combined with CFG 2 (ComfyUI's cfg_function), the post-CFG hooks the cfg_pp samplers
install called as sampling_function calls them. The starting noise is torch's CPU randn from SEED; per-step noise
comes from the sampler's own noise sampler with extra_args["seed"] = SEED, as ComfyUI runs it on the CPU. Every
scheduler of comfy.samplers.SCHEDULER_NAMES is recorded for the same model sampling, and KSampler's sigmas for the
samplers whose penultimate sigma it drops.
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

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/comfy_sampling")
COND = (0.8, 0.3)
UNCOND = (0.7, 0.1)
CFG = 2.0
SEED = 77
SHAPE = (1, 16, 4, 4)
STEPS = (2, 3, 4, 8)


class FlowSampling(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
    pass


def model_sampling():
    ms = FlowSampling()
    ms.set_parameters(shift=3.0, multiplier=1.0)
    return ms


class Toy:
    """Stands where ComfyUI's CFGGuider stands for the sampler: called with (x, sigma, model_options, seed)."""

    def __init__(self, ms):
        self.inner_model = type("Inner", (), {"model_sampling": ms})()
        self.model_patcher = type("Patcher", (), {"model": self, "get_model_object": lambda _, name: ms})()
        self.cfg = CFG
        self.calls = 0

    def __call__(self, x, sigma, model_options={}, seed=None):
        self.calls += 1
        s = sigma.reshape(-1, *([1] * (x.ndim - 1)))
        cond = COND[0] * x + COND[1] * s
        uncond = UNCOND[0] * x + UNCOND[1] * s
        # comfy.samplers.cfg_function, then the post-CFG functions as sampling_function runs them.
        denoised = uncond + (cond - uncond) * CFG
        for fn in model_options.get("sampler_post_cfg_function", []):
            args = {"denoised": denoised, "cond": None, "uncond": None, "cond_scale": CFG, "model": None,
                    "uncond_denoised": uncond, "cond_denoised": cond, "sigma": sigma,
                    "model_options": model_options, "input": x}
            denoised = fn(args)
        return denoised


def main():
    os.makedirs(OUT, exist_ok=True)
    ms = model_sampling()
    tensors, cases = {}, {"schedules": [], "runs": []}
    for name in comfy.samplers.SCHEDULER_NAMES:
        for steps in (1, 2, 3, 8, 9, 20):
            key = f"sched/{name}/{steps}"
            tensors[key] = comfy.samplers.calculate_sigmas(ms, name, steps).float()
            cases["schedules"].append({"key": key, "name": name, "steps": steps})
    # ModelSamplingFlux's schedules: Flux's default shift, and the one ModelSamplingFlux gives a 512x768 image.
    for mu in (1.15, 0.7166666666666666):
        class Flux(comfy.model_sampling.ModelSamplingFlux, comfy.model_sampling.CONST):
            pass
        flux = Flux()
        flux.set_parameters(shift=mu)
        for name in comfy.samplers.SCHEDULER_NAMES:
            for steps in (1, 4, 9):
                key = f"flux/{mu}/{name}/{steps}"
                tensors[key] = comfy.samplers.calculate_sigmas(flux, name, steps).float()
                cases["schedules"].append({"key": key, "name": name, "steps": steps, "flux_shift": mu})
    noise = torch.randn(SHAPE, generator=torch.Generator().manual_seed(SEED))
    tensors["noise"] = noise.flatten()
    for name in comfy.samplers.SAMPLER_NAMES:
        for steps in STEPS:
            # The sigmas KSampler gives this sampler with the simple scheduler (one more step, the penultimate
            # dropped, for uni_pc and dpm_2).
            sigmas = comfy.samplers.KSampler.calculate_sigmas(
                type("K", (), {"sampler": name, "scheduler": "simple", "DISCARD_PENULTIMATE_SIGMA_SAMPLERS":
                               comfy.samplers.KSampler.DISCARD_PENULTIMATE_SIGMA_SAMPLERS,
                               "model": type("M", (), {"get_model_object": lambda self, n: ms})()})(), steps)
            toy = Toy(ms)
            sampler = comfy.samplers.sampler_object(name)
            given = sigmas.clone()  # some samplers change the tensor they are given (uni_pc: the last sigma)
            try:
                out = sampler.sample(toy, sigmas, {"seed": SEED, "model_options": {}}, None, noise.clone(),
                                     torch.zeros(SHAPE), None, True)
            except Exception as e:  # recorded, so the test knows which cannot run here
                cases["runs"].append({"sampler": name, "steps": steps, "error": repr(e)})
                continue
            key = f"run/{name}/{steps}"
            tensors[key] = out.flatten().float()
            tensors[f"sigmas/{name}/{steps}"] = given.float()
            tensors[f"sigmas_after/{name}/{steps}"] = sigmas.float()
            cases["runs"].append({"key": key, "sigmas": f"sigmas/{name}/{steps}",
                                  "sigmas_after": f"sigmas_after/{name}/{steps}", "sampler": name,
                                  "steps": steps, "model_calls": toy.calls})
    guidance(tensors, cases)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "comfy_sampling.safetensors"))
    cases.update({"cond": COND, "uncond": UNCOND, "cfg": CFG, "seed": SEED, "shape": SHAPE, "shift": 3.0,
                  "multiplier": 1.0, "samplers": comfy.samplers.SAMPLER_NAMES,
                  "schedulers": comfy.samplers.SCHEDULER_NAMES})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


def guidance(tensors, cases):
    """ComfyUI's cfg_function under the hooks its patch nodes install (CFGNorm, CFGZeroStar, RescaleCFG), run
    through the nodes themselves on a ModelPatcher, on random predictions."""
    import types

    # The node modules import ComfyUI's audio code, which needs torchaudio; nothing here calls it.
    class _Anything(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Anything(f"{self.__name__}.{name}")

        def __call__(self, *args, **kwargs):
            return self

        def __mro_entries__(self, bases):
            return (object,)

    for name in ("torchaudio", "torchaudio.transforms", "torchaudio.functional"):
        sys.modules.setdefault(name, _Anything(name))
    import comfy.model_patcher
    from comfy_extras.nodes_cfg import CFGNorm, CFGZeroStar
    from comfy_extras.nodes_model_advanced import RescaleCFG

    g = torch.Generator().manual_seed(SEED + 2)
    x, cond, uncond = (torch.randn(SHAPE, generator=g) for _ in range(3))
    tensors.update({"guidance/x": x.flatten(), "guidance/cond": cond.flatten(),
                    "guidance/uncond": uncond.flatten()})
    sigma = torch.tensor([0.7])

    def patched(steps):
        m = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
        for kind, value in steps:
            if kind == "norm":
                m = CFGNorm.execute(m, value, False).result[0]
            elif kind == "norm_pre":
                m = CFGNorm.execute(m, value, True).result[0]
            elif kind == "zero_star":
                m = CFGZeroStar.execute(m).result[0]
            else:
                m = RescaleCFG().patch(m, value)[0]
        return m.model_options

    cases["guidance"] = []
    configs = [[], [("norm", 1.0)], [("norm", 0.6)], [("norm_pre", 1.0)], [("norm_pre", 0.7)],
               [("zero_star", None)], [("rescale", 0.7)], [("norm", 1.0), ("zero_star", None)],
               [("rescale", 0.5), ("norm", 1.0)]]
    for i, steps in enumerate(configs):
        for cfg, skipped in ((3.5, False), (1.0, True)):
            un = torch.zeros_like(uncond) if skipped else uncond
            out = comfy.samplers.cfg_function(None, cond, un, cfg, x, sigma, model_options=patched(steps))
            key = f"guidance/out/{i}/{cfg}"
            tensors[key] = out.flatten()
            cases["guidance"].append({"key": key, "hooks": steps, "cfg": cfg, "uncond_skipped": skipped,
                                      "sigma": 0.7})


if __name__ == "__main__":
    main()
