"""Records the sigma schedules and sampler runs Kiln's sampling tests compare with:
engine/models/tests/fixtures/sampling/{sampling.safetensors,cases.json}.

Extra pin beyond scripts/reference/requirements.txt: k-diffusion==0.1.1.post1 (MIT), installed with
`pip install --no-deps k-diffusion==0.1.1.post1`; only its sampling.py is loaded (by path, with its unused
imports stubbed), so none of its dependencies are needed. mpmath (already pinned) gives the Beta quantiles.

Run from the repository root with the reference venv:
    target/reference-venv/bin/python scripts/reference/sampling.py

Independent implementations where they exist: k-diffusion for the Karras and exponential schedules and the
euler, heun and dpmpp_2m samplers; diffusers' FlowMatchEulerDiscreteScheduler cross-checks flow euler. Where none
exists (the flow sigma table and the simple/normal/sgm_uniform/beta schedules, the rectified-flow
euler_ancestral, lcm, res_multistep), the expected values are computed here from
the formulas in docs/reference/models.md §6 and the papers, with torch float32 ops. The toy denoiser is
x0_hat = 0.8 * x + 0.3 * sigma, elementwise (also in the Rust test). Per-step noise: a torch CPU generator seeded
with seed + 1 (ComfyUI's default noise sampler on the CPU). dpmpp_2m_sde, whose noise comes from torchsde's
Brownian tree, is checked against ComfyUI's own run (comfy_sampling.py) instead.
"""

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import math
import os
import sys
import types

import mpmath
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/sampling")
A, B = 0.8, 0.3
SEED = 77


def load_k_diffusion_sampling():
    path = next(str(f.locate()) for f in importlib.metadata.files("k-diffusion") if f.name == "sampling.py"
                and f.parent.name == "k_diffusion")
    for name in ("scipy", "torchdiffeq", "torchsde"):
        stub = types.ModuleType(name)
        stub.integrate = None
        stub.odeint = None
        stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules.setdefault(name, stub)
    pkg = types.ModuleType("k_diffusion")
    pkg.__path__ = []
    utils = types.ModuleType("k_diffusion.utils")

    def append_dims(x, target_dims):
        return x[(...,) + (None,) * (target_dims - x.ndim)]

    utils.append_dims = append_dims
    pkg.utils = utils
    sys.modules["k_diffusion"] = pkg
    sys.modules["k_diffusion.utils"] = utils
    spec = importlib.util.spec_from_file_location("k_diffusion.sampling", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


K = load_k_diffusion_sampling()


class Flow:
    """The flow model sampling of models.md §6.1 in torch f32."""

    def __init__(self, shift, multiplier=1.0):
        self.shift, self.multiplier = shift, multiplier
        self.sigmas = self.sigma((torch.arange(1, 1001, 1) / 1000) * multiplier)

    def sigma(self, timestep):
        t = timestep / self.multiplier
        if self.shift == 1.0:
            return t
        return self.shift * t / (1 + (self.shift - 1) * t)

    def timestep(self, sigma):
        return sigma * self.multiplier

    def percent_to_sigma(self, p):
        t = 1.0 - p
        return self.shift * t / (1 + (self.shift - 1) * t)


def simple(ms, steps):
    ss = len(ms.sigmas) / steps
    return torch.tensor([float(ms.sigmas[-(1 + int(x * ss))]) for x in range(steps)] + [0.0])


def normal(ms, steps, sgm):
    start, end = ms.timestep(ms.sigmas[-1]), ms.timestep(ms.sigmas[0])
    ts = torch.linspace(start, end, steps + 1)[:-1] if sgm else torch.linspace(start, end, steps)
    return torch.tensor([float(ms.sigma(t)) for t in ts] + [0.0])


def beta(ms, steps, a=0.6, b=0.6):
    mpmath.mp.dps = 40
    out, last = [], -1
    for k in range(steps):
        q = 1 - k * (1.0 / steps)
        x = float(mpmath.findroot(lambda x: mpmath.betainc(a, b, 0, x, regularized=True) - q, (0, 1),
                                  solver="anderson")) if 0 < q < 1 else float(q)
        t = round(x * 999)  # round half to even, as numpy.rint
        if t != last:
            out.append(float(ms.sigmas[int(t)]))
        last = t
    return torch.tensor(out + [0.0])


def schedule(name, ms, steps):
    if name == "simple":
        return simple(ms, steps)
    if name == "sgm_uniform":
        return normal(ms, steps, True)
    if name == "normal":
        return normal(ms, steps, False)
    if name == "beta":
        return beta(ms, steps)
    lo, hi = float(ms.sigmas[0]), float(ms.sigmas[-1])
    if name == "karras":
        return K.get_sigmas_karras(steps, lo, hi)
    return K.get_sigmas_exponential(steps, lo, hi)


def denoiser(x, sigma):
    sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1, *([1] * (x.ndim - 1)))
    return A * x + B * sigma


def noise_sampler(x):
    g = torch.Generator().manual_seed(SEED + 1)
    return lambda: torch.randn(x.shape, dtype=torch.float32, generator=g)


def euler_ancestral_rf(x, sigmas):
    ns = noise_sampler(x)
    for i in range(len(sigmas) - 1):
        d = denoiser(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = d
            continue
        # Rectified-flow ancestral step, eta 1: step down to sigma_down deterministically, then re-noise.
        sd = sigmas[i + 1] * (1 + (sigmas[i + 1] / sigmas[i] - 1) * 1.0)
        a1, ad = 1 - sigmas[i + 1], 1 - sd
        renoise = (sigmas[i + 1] ** 2 - sd ** 2 * a1 ** 2 / ad ** 2) ** 0.5
        r = sd / sigmas[i]
        x = r * x + (1 - r) * d
        x = (a1 / ad) * x + ns() * renoise
    return x


def lcm(x, sigmas):
    ns = noise_sampler(x)
    for i in range(len(sigmas) - 1):
        x = denoiser(x, sigmas[i])
        if sigmas[i + 1] > 0:
            s = sigmas[i + 1]
            x = s * ns() + (1.0 - s) * x
    return x


def res_multistep(x, sigmas):
    # models.md §6.6.
    old = None
    for i in range(len(sigmas) - 1):
        s, sn = sigmas[i], sigmas[i + 1]
        d = denoiser(x, s)
        if old is None or sn == 0:
            x = x + (x - d) / s * (sn - s)
        else:
            h = (s.log() - sn.log())
            h_p = (sigmas[i - 1].log() - s.log())
            c2 = -h_p / h
            phi1 = (-h).expm1() / (-h)
            phi2 = (phi1 - 1.0) / (-h)
            b1 = torch.nan_to_num(phi1 - phi2 / c2, nan=0.0)
            b2 = torch.nan_to_num(phi2 / c2, nan=0.0)
            x = (-h).exp() * x + h * (b1 * d + b2 * old)
        old = d
    return x


def diffusers_flow_euler(x, sigmas):
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0)
    sched.set_timesteps(sigmas=[float(s) for s in sigmas[:-1]])
    sched.sigmas = sigmas.clone()
    sched.timesteps = sigmas[:-1] * 1000
    for i, t in enumerate(sched.timesteps):
        v = (x - denoiser(x, sigmas[i])) / sigmas[i]  # the flow velocity, noise - x0
        x = sched.step(v, t, x).prev_sample
    return x


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors, cases = {}, {"schedules": [], "runs": []}
    for shift in (3.0, 1.0, 2.5):
        tensors[f"table/{shift}"] = Flow(shift).sigmas.float()
    tensors["table/3.0_m1000"] = Flow(3.0, 1000.0).sigmas.float()
    for shift, mult in ((3.0, 1.0), (1.0, 1.0), (3.0, 1000.0)):
        ms = Flow(shift, mult)
        for name in ("simple", "sgm_uniform", "karras", "exponential", "beta", "normal"):
            for steps in (1, 2, 8, 9, 20, 40):
                key = f"sched/{name}/{shift}/{mult}/{steps}"
                tensors[key] = schedule(name, ms, steps).float()
                cases["schedules"].append({"key": key, "name": name, "shift": shift, "multiplier": mult,
                                           "steps": steps})
    # The scheduler nodes' own parameters (KarrasScheduler, ExponentialScheduler, PolyexponentialScheduler) and
    # SDTurboScheduler's timesteps (ComfyUI's formula: 999, 899, ... from 10 - int(10 * denoise), through sigma()).
    cases["node_schedules"] = []
    for name, steps, lo, hi, rho in (("karras", 10, 0.0291675, 14.614642, 7.0), ("karras", 5, 0.01, 1.0, 3.0),
                                     ("exponential", 10, 0.0291675, 14.614642, None),
                                     ("exponential", 7, 0.002, 0.9, None),
                                     ("polyexponential", 10, 0.0291675, 14.614642, 1.0),
                                     ("polyexponential", 6, 0.01, 1.0, 2.5)):
        if name == "karras":
            out = K.get_sigmas_karras(steps, lo, hi, rho)
        elif name == "exponential":
            out = K.get_sigmas_exponential(steps, lo, hi)
        else:
            out = K.get_sigmas_polyexponential(steps, lo, hi, rho)
        key = f"node/{name}/{steps}/{lo}/{hi}/{rho}"
        tensors[key] = out.float()
        cases["node_schedules"].append({"key": key, "name": name, "steps": steps, "sigma_min": lo,
                                        "sigma_max": hi, "rho": rho})
    for shift, mult in ((3.0, 1.0), (1.0, 1000.0)):
        for steps, denoise in ((1, 1.0), (4, 1.0), (3, 0.5), (10, 0.0)):
            start = 10 - int(10 * denoise)
            timesteps = torch.flip(torch.arange(1, 11) * 100 - 1, (0,))[start:start + steps]
            out = torch.cat([Flow(shift, mult).sigma(timesteps).float(), torch.zeros([1])])
            key = f"node/sd_turbo/{shift}/{mult}/{steps}/{denoise}"
            tensors[key] = out
            cases["node_schedules"].append({"key": key, "name": "sd_turbo", "shift": shift,
                                            "multiplier": mult, "steps": steps, "denoise": denoise})
    ms = Flow(3.0)
    x0 = torch.randn((1, 16, 4, 4), generator=torch.Generator().manual_seed(SEED))
    tensors["x0"] = x0.flatten()
    for steps in (2, 4, 8):
        sigmas = simple(ms, steps)
        kd = lambda fn: fn(lambda x, s: denoiser(x, s), x0.clone(), sigmas)
        runs = {
            "euler": kd(K.sample_euler),
            "heun": kd(K.sample_heun),
            "dpmpp_2m": kd(K.sample_dpmpp_2m),
            "euler_ancestral": euler_ancestral_rf(x0.clone(), sigmas),
            "lcm": lcm(x0.clone(), sigmas),
            "res_multistep": res_multistep(x0.clone(), sigmas),
        }
        diff = (diffusers_flow_euler(x0.clone(), sigmas) - runs["euler"]).abs().max().item()
        assert diff < 1e-5, f"diffusers and k-diffusion euler disagree by {diff}"
        for name, out in runs.items():
            key = f"run/{name}/{steps}"
            tensors[key] = out.flatten().float()
            cases["runs"].append({"key": key, "sampler": name, "steps": steps})
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(OUT, "sampling.safetensors"))
    cases.update({"a": A, "b": B, "seed": SEED, "x0_shape": [1, 16, 4, 4]})
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
