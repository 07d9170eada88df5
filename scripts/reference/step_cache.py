"""Fixtures for EasyCache and LazyCache (engine/src/nodes/builtin/step_cache.rs): ComfyUI's own nodes
(comfy_extras/nodes_easycache.py at 0f1fa67a) on wan.py's tiny t2v model, sampled by its CFGGuider (euler, simple
12 steps) from a zero latent [1, 16, 3, 16, 16] and seeded noise (seed 11).

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py; needs wan.py's fixtures first):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/step_cache.py

Writes engine/tests/fixtures/step_cache/io.safetensors: `noise`, `sigmas`, the prompts `positive` [1, 6, 32],
`negative` [1, 6, 32] and `negative.long` [1, 9, 32]; for each case `<case>.out` and `<case>.calls` (how many
times the network ran, one count per batch):
- `easy`: EasyCache (threshold 1, start 0.15, end 0.95), cfg 2: both prompts in one batch, ComfyUI's first
  prompt there the negative (its batch puts it first);
- `easy_apart`: the same with `negative.long`: prompts of two lengths run apart, the positive first;
- `easy_cfg1`: cfg 1, the positive alone;
- `lazy`: LazyCache (threshold 1, start 0.15, end 0.95), cfg 2;
- `plain`: no cache (every step runs the network).
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import TEXT  # noqa: E402

OUT = "engine/tests/fixtures/step_cache"
SEED = 11
STEPS = 12


def main():
    import_comfyui(node_modules=True)
    import comfy.samplers
    from comfy_extras.nodes_easycache import EasyCacheNode, LazyCacheNode
    from wan_windows import patcher_of, tiny_t2v

    patcher = patcher_of(tiny_t2v()[0], "WAN21_T2V")
    calls = [0]
    net = patcher.model.diffusion_model
    # The wrappers run inside the module's forward; its blocks run in forward_orig, which a skipped step leaves out.
    run_blocks = net.forward_orig

    def counted(*args, **kwargs):
        calls[0] += 1
        return run_blocks(*args, **kwargs)

    net.forward_orig = counted

    g = torch.Generator().manual_seed(41)
    io = {"positive": torch.randn(1, 6, TEXT, generator=g), "negative": torch.randn(1, 6, TEXT, generator=g),
          "negative.long": torch.randn(1, 9, TEXT, generator=g)}
    io["noise"] = torch.randn(1, 16, 3, 16, 16, generator=torch.Generator().manual_seed(SEED))
    sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", STEPS)
    io["sigmas"] = sigmas.float()

    def sample(name, p, negative="negative", cfg=2.0):
        calls[0] = 0
        guider = comfy.samplers.CFGGuider(p)
        guider.set_conds([[io["positive"], {}]], [[io[negative], {}]])
        guider.set_cfg(cfg)
        with torch.no_grad():
            out = guider.sample(io["noise"].clone(), torch.zeros_like(io["noise"]),
                                comfy.samplers.sampler_object("euler"), sigmas.clone(), disable_pbar=True, seed=SEED)
        io[f"{name}.out"] = out.float()
        io[f"{name}.calls"] = torch.tensor([float(calls[0])])
        print(name, "network calls", calls[0])

    easy = EasyCacheNode.execute(patcher, 1.0, 0.15, 0.95, False).result[0]
    lazy = LazyCacheNode.execute(patcher, 1.0, 0.15, 0.95, False).result[0]
    sample("plain", patcher)
    sample("easy", easy)
    sample("easy_apart", easy, negative="negative.long")
    sample("easy_cfg1", easy, cfg=1.0)
    sample("lazy", lazy)
    assert io["easy.calls"] < io["plain.calls"] and io["lazy.calls"] < io["plain.calls"], "the caches should skip"
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print(os.path.getsize(f"{OUT}/io.safetensors"), "bytes")


if __name__ == "__main__":
    main()
