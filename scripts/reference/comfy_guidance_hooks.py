"""Records ComfyUI's sampling_function / cfg_function under the hooks of the Mahiro node (post-CFG,
comfy_extras/nodes_mahiro.py) and the TCFG node (pre-CFG, comfy_extras/nodes_tcfg.py) at 0f1fa67a, each run
through the node on a ModelPatcher, on random predictions of shape [2, 4, 3, 5] (two samples: Mahiro's similarity
is averaged over both; TCFG damps each sample alone): engine/models/tests/fixtures/comfy_sampling/
guidance_hooks.safetensors holds `x`, `cond`, `uncond`; Mahiro's `out.<cfg>` for cfg 3.5, and 1.0 with the
unconditional prediction skipped (zeros), and after CFGZeroStar (`out.zero_star.3.5`); TCFG's `tcfg.3.5` (once),
`tcfg.twice.3.5` (the node applied twice) and `tcfg.mahiro.3.5` (TCFG, then Mahiro after CFG).

engine/models/tests/fixtures/comfy_sampling/apg.safetensors records the APG node's pre-CFG hook
(comfy_extras/nodes_apg.py) the same way, then CFG: on `x`, `cond`, `uncond` [2, 4, 3, 5] (norms and projections
over each sample) at cfg 3.5, `apg.default` (eta 1, norm_threshold 5, momentum 0), `apg.eta` (eta 0.3, no norm
threshold), `apg.skipped` (cfg 1, the negative skipped: zeros), `apg.tcfg` (TCFG, then APG) and `apg.then_tcfg`;
on `video.x`, `video.cond`, `video.uncond` [1, 4, 2, 3, 5] (over each channel's frames) `apg.video`; and with
momentum 0.5 at sigmas 0.9, 0.7, 0.5, then 0.95 (a new run: the average starts again), each step's predictions
`step<i>.cond`, `step<i>.uncond` and result `apg.momentum.<i>`.

engine/models/tests/fixtures/comfy_sampling/renorm.safetensors records RenormCFG's CFG function
(comfy_extras/nodes_lumina2.py) through cfg_function on `x`, `cond`, `uncond` [1, 4, 3, 5] (ComfyUI's hook compares
norms with Python's `if`, so one sample) at sigma 0.7 and cfg 3.5: `renorm.capped` (cfg_trunc 100, renorm_cfg 1),
`renorm.loose` (renorm_cfg 2.5: under the cap), `renorm.off` (renorm_cfg 0) and `renorm.truncated` (cfg_trunc 0.5:
the conditional prediction alone).

engine/models/tests/fixtures/comfy_sampling/eps.safetensors records the post-CFG hooks of comfy_extras/nodes_eps.py
through cfg_function on `x`, `cond`, `uncond` [2, 4, 3, 5] at cfg 3.5: `epsilon.<factor>` (Epsilon Scaling, at
sigma 0.7), `tsr.<k>.<tsr_sigma>.<sigma>` (TemporalScoreRescaling on a flow model's sampling, the half-log-SNR
−logit σ; σ 1 has an SNR of 0) and `tsr_eps.<k>.<tsr_sigma>.<sigma>` (on a discrete ε model's, −ln σ).

Run from the repository root:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/comfy_guidance_hooks.py
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/models/tests/fixtures/comfy_sampling"


def main():
    import_comfyui(node_modules=True)
    import comfy.model_patcher
    import comfy.samplers
    from comfy_extras.nodes_cfg import CFGZeroStar
    from comfy_extras.nodes_mahiro import Mahiro
    from comfy_extras.nodes_tcfg import TCFG

    g = torch.Generator().manual_seed(59)
    x, cond, uncond = (torch.randn(2, 4, 3, 5, generator=g) for _ in range(3))
    io = {"x": x, "cond": cond, "uncond": uncond}
    sigma = torch.tensor([0.7])

    def options(zero_star):
        m = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
        if zero_star:
            m = CFGZeroStar.execute(m).result[0]
        return Mahiro.execute(m).result[0].model_options

    for cfg, skipped in ((3.5, False), (1.0, True)):
        un = torch.zeros_like(uncond) if skipped else uncond
        io[f"out.{cfg}"] = comfy.samplers.cfg_function(None, cond, un, cfg, x, sigma, model_options=options(False))
    io["out.zero_star.3.5"] = comfy.samplers.cfg_function(None, cond, uncond, 3.5, x, sigma,
                                                           model_options=options(True))

    def tcfg(times, mahiro):
        m = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
        for _ in range(times):
            m = TCFG.execute(m).result[0]
        if mahiro:
            m = Mahiro.execute(m).result[0]
        # sampling_function's pre-CFG step, then cfg_function, as comfy.samplers runs them.
        args = {"conds": [[{}], [{}]], "conds_out": [cond, uncond], "cond_scale": 3.5, "timestep": sigma,
                "input": x, "sigma": sigma, "model": None, "model_options": m.model_options}
        out = [cond, uncond]
        for fn in m.model_options.get("sampler_pre_cfg_function", []):
            args["conds_out"] = out
            out = fn(args)
        return comfy.samplers.cfg_function(None, out[0], out[1], 3.5, x, sigma, model_options=m.model_options)

    io["tcfg.3.5"] = tcfg(1, False)
    io["tcfg.twice.3.5"] = tcfg(2, False)
    io["tcfg.mahiro.3.5"] = tcfg(1, True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/guidance_hooks.safetensors")
    print({k: list(v.shape) for k, v in io.items()})
    apg(x, cond, uncond)
    renorm()
    eps(x, cond, uncond)


def eps(x, cond, uncond):
    import types

    import comfy.model_patcher
    import comfy.model_sampling
    import comfy.samplers
    from comfy_extras.nodes_eps import EpsilonScaling, TemporalScoreRescaling
    from comfy_sampling import model_sampling

    class EpsSampling(comfy.model_sampling.ModelSamplingDiscrete, comfy.model_sampling.EPS):
        pass

    def run(node_out, ms, sigma):
        m = node_out.result[0]
        model = types.SimpleNamespace(current_patcher=types.SimpleNamespace(get_model_object=lambda name: ms))
        return comfy.samplers.cfg_function(model, cond, uncond, 3.5, x, torch.tensor([sigma]),
                                           model_options=m.model_options)

    def patcher():
        return comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))

    io = {"x": x, "cond": cond, "uncond": uncond}
    flow, discrete = model_sampling(), EpsSampling()
    for factor in (1.005, 0.8):
        io[f"epsilon.{factor}"] = run(EpsilonScaling.execute(patcher(), factor), flow, 0.7)
    for k, tsr_sigma, sigma in ((0.95, 1.0, 0.7), (2.0, 0.5, 0.3), (0.95, 1.0, 1.0)):
        io[f"tsr.{k}.{tsr_sigma}.{sigma}"] = run(TemporalScoreRescaling.execute(patcher(), k, tsr_sigma), flow, sigma)
    io["tsr_eps.0.9.1.5.2.5"] = run(TemporalScoreRescaling.execute(patcher(), 0.9, 1.5), discrete, 2.5)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/eps.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


def renorm():
    import types

    import comfy.model_patcher
    import comfy.samplers
    from comfy_extras.nodes_lumina2 import RenormCFG

    class Stand(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diffusion_model = types.SimpleNamespace(in_channels=4)

    g = torch.Generator().manual_seed(67)
    io = {name: torch.randn(1, 4, 3, 5, generator=g) for name in ("x", "cond", "uncond")}
    sigma = torch.tensor([0.7])
    for case, trunc, renorm_cfg in (("capped", 100.0, 1.0), ("loose", 100.0, 2.5), ("off", 100.0, 0.0),
                                     ("truncated", 0.5, 1.0)):
        m = comfy.model_patcher.ModelPatcher(Stand(), torch.device("cpu"), torch.device("cpu"))
        m = RenormCFG.execute(m, trunc, renorm_cfg).result[0]
        io[f"renorm.{case}"] = comfy.samplers.cfg_function(None, io["cond"], io["uncond"], 3.5, io["x"], sigma,
                                                           model_options=m.model_options)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/renorm.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


def apg(x, cond, uncond):
    import comfy.model_patcher
    import comfy.samplers
    from comfy_extras.nodes_apg import APG
    from comfy_extras.nodes_tcfg import TCFG

    def patched(*nodes):
        m = comfy.model_patcher.ModelPatcher(torch.nn.Linear(1, 1), torch.device("cpu"), torch.device("cpu"))
        for node in nodes:
            m = node(m)
        return m

    def run(m, x, cond, uncond, cfg, sigma, skipped=False):
        # sampling_function's pre-CFG step (its `conds` hold None for a skipped negative), then cfg_function.
        sigma = torch.tensor([sigma])
        un = torch.zeros_like(uncond) if skipped else uncond
        out = [cond, un]
        for fn in m.model_options.get("sampler_pre_cfg_function", []):
            args = {"conds": [[{}], None if skipped else [{}]], "conds_out": out, "cond_scale": cfg,
                    "timestep": sigma, "input": x, "sigma": sigma, "model": None, "model_options": m.model_options}
            out = fn(args)
        return comfy.samplers.cfg_function(None, out[0], out[1], cfg, x, sigma, model_options=m.model_options)

    apg_node = lambda eta, threshold, momentum: lambda m: APG.execute(m, eta, threshold, momentum).result[0]
    tcfg_node = lambda m: TCFG.execute(m).result[0]
    g = torch.Generator().manual_seed(61)
    io = {"x": x, "cond": cond, "uncond": uncond}
    io["apg.default"] = run(patched(apg_node(1.0, 5.0, 0.0)), x, cond, uncond, 3.5, 0.7)
    io["apg.eta"] = run(patched(apg_node(0.3, 0.0, 0.0)), x, cond, uncond, 3.5, 0.7)
    io["apg.skipped"] = run(patched(apg_node(1.0, 5.0, 0.0)), x, cond, uncond, 1.0, 0.7, skipped=True)
    io["apg.tcfg"] = run(patched(tcfg_node, apg_node(1.0, 5.0, 0.0)), x, cond, uncond, 3.5, 0.7)
    io["apg.then_tcfg"] = run(patched(apg_node(1.0, 5.0, 0.0), tcfg_node), x, cond, uncond, 3.5, 0.7)
    for name in ("x", "cond", "uncond"):
        io[f"video.{name}"] = torch.randn(1, 4, 2, 3, 5, generator=g)
    io["apg.video"] = run(patched(apg_node(1.0, 2.0, 0.0)), io["video.x"], io["video.cond"], io["video.uncond"],
                          3.5, 0.7)
    momentum = patched(apg_node(1.0, 5.0, 0.5))
    for i, sigma in enumerate((0.9, 0.7, 0.5, 0.95)):
        io[f"step{i}.cond"] = torch.randn(2, 4, 3, 5, generator=g)
        io[f"step{i}.uncond"] = torch.randn(2, 4, 3, 5, generator=g)
        io[f"apg.momentum.{i}"] = run(momentum, x, io[f"step{i}.cond"], io[f"step{i}.uncond"], 3.5, sigma)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/apg.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
