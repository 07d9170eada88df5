"""Fixtures for regional prompting (engine/src/nodes/builtin/prompt_regions.rs, conditioning_area.rs): ComfyUI's
own area and mask handling at 0f1fa67a, recorded from its nodes (ConditioningSetArea, ConditioningSetAreaPercentage,
ConditioningSetAreaStrength, ConditioningSetMask, ConditioningSetAreaPercentageVideo) and comfy.samplers.

Run from the repository root (ComfyUI at 0f1fa67a, see comfyui.py; needs wan.py's fixtures first):
    COMFYUI_DIR=/path/to/ComfyUI $(scripts/reference/setup.sh) scripts/reference/regions.py

engine/tests/fixtures/regions/resolve.safetensors: what `resolve_areas_and_cond_masks_multidim` makes of an area
or a mask before sampling, and what `get_area_and_mult` makes of it at a step (the block the prompt covers and its
weights):
- `pct2.area`: ConditioningSetAreaPercentage (width 0.25, height 0.5, x 0.75, y 0.3) on latent dims (24, 10):
  sizes then offsets, Python's round (half to even: 0.25·10 → 2, 0.75·10 → 8).
- `pct3.area`: ConditioningSetAreaPercentageVideo (width 0.35, height 0.5, temporal 0.67, x 0.5, y 0.25, z 0.34)
  on (3, 24, 20).
- `mask4.in` [2, 37, 29] resized to (24, 20) (`mask4.out`), `mask5.in` [3, 37, 29] to (3, 24, 20) (`mask5.out`,
  [1, 3, 24, 20]: the mask's batch becomes the frames).
- `bounds.in` [1, 37, 29]: ConditioningSetMask "mask bounds" on (24, 20) (`bounds.area`), a mask that covers a
  corner of less than 8 cells (`bounds_small.in`, `bounds_small.area`: 8 cells, past the edge) and an empty one
  (`bounds_empty.area`).
- `mult.<case>` and `area.<case>` (the covered block's sizes then offsets, clipped to the latent) from
  get_area_and_mult on a zero latent, for: `edge` (ConditioningSetArea width 64, height 96 at x 32, y 48 px, strength 1.5, on
  [2, 3, 24, 20]: feathered on every side), `corner` (96 × 160 at (0, 0): feathered inward only), `outside`
  (320 × 320 at (64, 64): clipped, feathered on its leading sides), `masked` (the `edge` area with ConditioningSetMask of `mask4.in`, strength 0.7, after it:
  no feathering), `mask_only` (the mask alone at strength 0.7), `video_area` (the `edge` area on [1, 3, 3, 24, 20]:
  every frame), `video_pct` (`pct3`'s node at strength 1.3 on [1, 3, 3, 24, 20]) and `video_mask` (`mask5.in` at
  strength 0.6 on it).

engine/tests/fixtures/regions/sampling.safetensors: ComfyUI's CFGGuider (cfg 2, euler, simple 3 steps) on wan.py's
tiny t2v model from a zero latent and seeded noise (seed 11):
- `image.*`: a one-frame latent [1, 16, 1, 24, 24]. Positive: `image.p0` plain; `image.p1` in an area (width 96,
  height 128 at x 64, y 48 px, strength 1.5: feathered); `image.p2` under a soft mask `image.mask2` [1, 40, 40] at
  0.7; `image.p3` in an area (width 48, height 80 at x 144, y 0, strength 0.8) and under `image.mask3` [1, 40, 40].
  Negative: `image.n0` plain; `image.n1` in an area (64 × 64 at (0, 0)). Sampling gives each area of one side a copy of the other side's prompt there
  (`create_cond_with_same_area_if_none`).
- `video.*`: a latent [1, 16, 3, 8, 8]. Positive: `video.p0` plain; `video.p1` in ConditioningSetAreaPercentageVideo
  (width 0.5, height 0.5, temporal 0.67, x 0.5, y 0.25, z 0.34, strength 1.3); `video.p3` under a one-frame mask
  `video.mask3` [1, 20, 20] (every frame). Negative `video.n0` plain.
- `video2d.*`: the same latent; positive `video2d.p0` plain and `video2d.p1` in a (2-D) area (32 × 32 at (16, 16):
  every frame), negative `video2d.n0` plain. (ComfyUI cannot mix areas of two and three dimensions in one run:
  comparing them, `add_area_dims` fails on a tuple.)
Each holds its prompts `[1, 6, 32]`, `noise`, `sigmas` and `out`.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402
from wan import TEXT  # noqa: E402

OUT = "engine/tests/fixtures/regions"
SEED = 11


def area_tensor(area):
    return torch.tensor([float(v) for v in area])


def resolved(cond, dims):
    """The cond dict `cond` as sampling resolves it on a latent of `dims`."""
    import comfy.samplers

    conds = [dict(cond)]
    comfy.samplers.resolve_areas_and_cond_masks_multidim(conds, dims, "cpu")
    return conds[0]


def at_step(cond, shape):
    """get_area_and_mult's block and weights for `cond` (a node's output dict) on a zero latent of `shape`."""
    import comfy.samplers

    c = resolved(cond, shape[2:])
    c["model_conds"] = {}
    c["uuid"] = None
    p = comfy.samplers.get_area_and_mult(c, torch.zeros(shape), torch.tensor([1.0]))
    area = p.area if p.area is not None else list(shape[2:]) + [0] * (len(shape) - 2)
    return area_tensor(area), p.mult.contiguous()


def node_dict(conditioning):
    """The extras a node's output carries (its one prompt's dict)."""
    return dict(conditioning[0][1])


def resolve_cases(io):
    import nodes
    from comfy_extras.nodes_video_model import ConditioningSetAreaPercentageVideo

    base = [[torch.zeros(1, 1, 1), {}]]
    g = torch.Generator().manual_seed(31)
    pct2 = node_dict(nodes.ConditioningSetAreaPercentage().append(base, 0.25, 0.5, 0.75, 0.3, 1.0)[0])
    io["pct2.area"] = area_tensor(resolved(pct2, (24, 10))["area"])
    video = ConditioningSetAreaPercentageVideo()
    pct3 = node_dict(video.append(base, 0.35, 0.5, 0.67, 0.5, 0.25, 0.34, 1.3)[0])
    io["pct3.area"] = area_tensor(resolved(pct3, (3, 24, 20))["area"])

    io["mask4.in"] = torch.rand(2, 37, 29, generator=g)
    masked4 = node_dict(nodes.ConditioningSetMask().append(base, io["mask4.in"], "default", 0.7)[0])
    io["mask4.out"] = resolved(masked4, (24, 20))["mask"].contiguous()
    io["mask5.in"] = torch.rand(3, 37, 29, generator=g)
    masked5 = node_dict(nodes.ConditioningSetMask().append(base, io["mask5.in"], "default", 0.6)[0])
    io["mask5.out"] = resolved(masked5, (3, 24, 20))["mask"].contiguous()

    bounds = torch.zeros(1, 37, 29)
    bounds[0, 5:21, 3:10] = torch.rand(16, 7, generator=g) + 0.1
    io["bounds.in"] = bounds
    for name, mask in (("bounds", bounds), ("bounds_small", None), ("bounds_empty", torch.zeros(1, 37, 29))):
        if mask is None:
            mask = torch.zeros(1, 37, 29)
            mask[0, 33:, 25:] = 1.0
            io["bounds_small.in"] = mask
        c = node_dict(nodes.ConditioningSetMask().append(base, mask, "mask bounds", 1.0)[0])
        io[f"{name}.area"] = area_tensor(resolved(c, (24, 20))["area"])

    edge = node_dict(nodes.ConditioningSetArea().append(base, 64, 96, 32, 48, 1.5)[0])
    cases = {
        "edge": (edge, (2, 3, 24, 20)),
        "corner": (node_dict(nodes.ConditioningSetArea().append(base, 96, 160, 0, 0, 1.5)[0]), (2, 3, 24, 20)),
        "outside": (node_dict(nodes.ConditioningSetArea().append(base, 320, 320, 64, 64, 1.0)[0]), (2, 3, 24, 20)),
        "masked": (node_dict(nodes.ConditioningSetMask().append(
            nodes.ConditioningSetArea().append(base, 64, 96, 32, 48, 1.5)[0], io["mask4.in"], "default", 0.7)[0]),
            (2, 3, 24, 20)),
        "mask_only": (masked4, (2, 3, 24, 20)),
        "video_area": (edge, (1, 3, 3, 24, 20)),
        "video_pct": (pct3, (1, 3, 3, 24, 20)),
        "video_mask": (masked5, (1, 3, 3, 24, 20)),
    }
    for name, (cond, shape) in cases.items():
        io[f"area.{name}"], io[f"mult.{name}"] = at_step(cond, shape)


def sample(patcher, positive, negative, noise, steps=3):
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(patcher.get_model_object("model_sampling"), "simple", steps)
    guider = comfy.samplers.CFGGuider(patcher)
    guider.set_conds(positive, negative)
    guider.set_cfg(2.0)
    with torch.no_grad():
        out = guider.sample(noise.clone(), torch.zeros_like(noise), comfy.samplers.sampler_object("euler"),
                            sigmas.clone(), disable_pbar=True, seed=SEED)
    return out.float(), sigmas.float()


def sampling_cases(io):
    import nodes
    from comfy_extras.nodes_video_model import ConditioningSetAreaPercentageVideo
    from wan_windows import patcher_of, tiny_t2v

    patcher = patcher_of(tiny_t2v()[0], "WAN21_T2V")
    g = torch.Generator().manual_seed(37)

    def prompt(name):
        io[name] = torch.randn(1, 6, TEXT, generator=g)
        return [[io[name], {}]]

    area = nodes.ConditioningSetArea()
    mask = nodes.ConditioningSetMask()

    io["image.mask2"] = torch.rand(1, 40, 40, generator=g)
    io["image.mask3"] = torch.rand(1, 40, 40, generator=g)
    positive = (prompt("image.p0")
                + area.append(prompt("image.p1"), 96, 128, 64, 48, 1.5)[0]
                + mask.append(prompt("image.p2"), io["image.mask2"], "default", 0.7)[0]
                + mask.append(area.append(prompt("image.p3"), 48, 80, 144, 0, 0.8)[0], io["image.mask3"], "default",
                              1.0)[0])
    negative = prompt("image.n0") + area.append(prompt("image.n1"), 64, 64, 0, 0, 1.0)[0]
    io["image.noise"] = torch.randn(1, 16, 1, 24, 24, generator=torch.Generator().manual_seed(SEED))
    io["image.out"], io["image.sigmas"] = sample(patcher, positive, negative, io["image.noise"])
    plain, _ = sample(patcher, prompt("image.plain"), negative[:1], io["image.noise"])
    assert (plain - io["image.out"]).abs().max() > 1e-2, "the regions should change the result"

    io["video.mask3"] = torch.rand(1, 20, 20, generator=g)
    video = ConditioningSetAreaPercentageVideo()
    positive = (prompt("video.p0")
                + video.append(prompt("video.p1"), 0.5, 0.5, 0.67, 0.5, 0.25, 0.34, 1.3)[0]
                + mask.append(prompt("video.p3"), io["video.mask3"], "default", 1.0)[0])
    negative = prompt("video.n0")
    io["video.noise"] = torch.randn(1, 16, 3, 8, 8, generator=torch.Generator().manual_seed(SEED))
    io["video.out"], io["video.sigmas"] = sample(patcher, positive, negative, io["video.noise"])
    positive = prompt("video2d.p0") + area.append(prompt("video2d.p1"), 32, 32, 16, 16, 1.0)[0]
    io["video2d.out"], _ = sample(patcher, positive, prompt("video2d.n0"), io["video.noise"])
    del io["image.plain"]


def main():
    import_comfyui(node_modules=True)
    os.makedirs(OUT, exist_ok=True)
    io = {}
    resolve_cases(io)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/resolve.safetensors")
    print({k: list(v.shape) for k, v in io.items()})
    io = {}
    sampling_cases(io)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/sampling.safetensors")
    print({k: list(v.shape) for k, v in io.items()}, os.path.getsize(f"{OUT}/sampling.safetensors"), "bytes")


if __name__ == "__main__":
    main()
