"""Fixtures for Kiln's latent arithmetic and latent files (engine/src/nodes/builtin/latent_ops.rs,
latent_file.rs), from ComfyUI's own nodes at 0f1fa67a: comfy_extras/nodes_latent.py's LatentAdd, LatentSubtract,
LatentMultiply, LatentInterpolate, LatentBatch, LatentBatchSeedBehavior and ReplaceVideoLatentFrames, and
nodes.py's SaveLatent.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/latent_ops.py

Writes engine/tests/fixtures/latent_ops/io.safetensors (f32 values; batch indices as f32 lists):
- inputs `a` [1, 4, 6, 5], `b` [1, 4, 6, 5], `small` [2, 4, 3, 4] (another size and batch: bilinear-resized with
  the centre crop and cut or repeated to the batch), `batch4` [4, 4, 6, 5] (as many samples as channels, where
  LatentInterpolate's norms broadcast sample against channel), `video` [1, 16, 5, 4, 6], `video_b` [1, 16, 5, 4,
  6], `clip` [1, 16, 2, 4, 6] (a video of other frames), `zero_pixel`: `a` with one position zero in every channel;
- `add`, `subtract` (a, b), `add.small` (a, small), `multiply` (a times -1.7), `interpolate.<r>` (a, b at ratios
  0, 0.3, 1), `interpolate.small` (a, small at 0.6), `interpolate.batch4` (batch4 and a at 0.25),
  `interpolate.zero` (zero_pixel and b at 0.4), `interpolate.video` (video, video_b at 0.7), `add.video`;
- `batch` (a, small: small resized, not repeated) with `batch.index`; `batch.indexed` ([LatentFromBatch-like]
  a with batch_index [3] and small with [5, 6]) and `batch.indexed.index`;
- `seed.fixed.index` (small with batch_index [5, 6], fixed: [5, 5]);
- `replace.<i>` (video with clip's frames at index i: 0, 3, -2; at 4 the clip does not fit, which leaves the video
  as it was; at -7, before the first frame, ComfyUI raises).
Also writes engine/tests/fixtures/latent_ops/comfyui.latent (SaveLatent's file for `video` with prompt and
workflow metadata) and legacy.latent (a file without `latent_format_version_0`, which LoadLatent scales by
1 / 0.18215).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/latent_ops"


def latent(samples, **extra):
    return {"samples": samples, **extra}


def main():
    import_comfyui(node_modules=True)
    import folder_paths
    import nodes
    import comfy_extras.nodes_post_processing  # noqa: F401 (imports nodes_latent without the cycle)
    from comfy_extras import nodes_latent as nl

    g = torch.Generator().manual_seed(7)
    io = {name: torch.randn(*shape, generator=g) for name, shape in (
        ("a", (1, 4, 6, 5)), ("b", (1, 4, 6, 5)), ("small", (2, 4, 3, 4)), ("batch4", (4, 4, 6, 5)),
        ("video", (1, 16, 5, 4, 6)), ("video_b", (1, 16, 5, 4, 6)), ("clip", (1, 16, 2, 4, 6)))}
    io["zero_pixel"] = io["a"].clone()
    io["zero_pixel"][:, :, 2, 3] = 0.0
    s = lambda name: latent(io[name])  # noqa: E731
    out = lambda node, *args: node.execute(*args).result[0]  # noqa: E731

    io["add"] = out(nl.LatentAdd, s("a"), s("b"))["samples"]
    io["subtract"] = out(nl.LatentSubtract, s("a"), s("b"))["samples"]
    io["add.small"] = out(nl.LatentAdd, s("a"), s("small"))["samples"]
    io["add.video"] = out(nl.LatentAdd, s("video"), s("video_b"))["samples"]
    io["multiply"] = out(nl.LatentMultiply, s("a"), -1.7)["samples"]
    for ratio in (0.0, 0.3, 1.0):
        io[f"interpolate.{ratio}"] = out(nl.LatentInterpolate, s("a"), s("b"), ratio)["samples"]
    io["interpolate.small"] = out(nl.LatentInterpolate, s("a"), s("small"), 0.6)["samples"]
    io["interpolate.batch4"] = out(nl.LatentInterpolate, s("batch4"), s("a"), 0.25)["samples"]
    io["interpolate.zero"] = out(nl.LatentInterpolate, s("zero_pixel"), s("b"), 0.4)["samples"]
    io["interpolate.video"] = out(nl.LatentInterpolate, s("video"), s("video_b"), 0.7)["samples"]

    batch = out(nl.LatentBatch, s("a"), s("small"))
    io["batch"], io["batch.index"] = batch["samples"], torch.tensor(batch["batch_index"], dtype=torch.float32)
    batch = out(nl.LatentBatch, latent(io["a"], batch_index=[3]), latent(io["small"], batch_index=[5, 6]))
    io["batch.indexed"] = batch["samples"]
    io["batch.indexed.index"] = torch.tensor(batch["batch_index"], dtype=torch.float32)
    seeded = out(nl.LatentBatchSeedBehavior, latent(io["small"], batch_index=[5, 6]), "fixed")
    io["seed.fixed.index"] = torch.tensor(seeded["batch_index"], dtype=torch.float32)
    random = out(nl.LatentBatchSeedBehavior, latent(io["small"], batch_index=[5, 6]), "random")
    assert "batch_index" not in random

    for index in (0, 3, -2, 4):
        io[f"replace.{index}"] = out(nl.ReplaceVideoLatentFrames, s("video"), index, s("clip"))["samples"]
    assert torch.equal(io["replace.4"], io["video"])
    try:  # an index before the first frame: ComfyUI's slice assignment raises
        out(nl.ReplaceVideoLatentFrames, s("video"), -7, s("clip"))
        raise AssertionError("index -7 should raise")
    except RuntimeError:
        pass

    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.float().clone() for k, v in io.items()}, f"{OUT}/io.safetensors")

    # SaveLatent's own file, written into a temporary output folder and moved here.
    import tempfile
    folder_paths.set_output_directory(tempfile.mkdtemp())
    prompt = {"1": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI"}}}
    workflow = {"workflow": {"nodes": [{"id": 1, "type": "SaveLatent"}]}}
    saved = nodes.SaveLatent().save(latent(io["video"]), "latents/ComfyUI", prompt, workflow)
    located = saved["ui"]["latents"][0]
    assert located["filename"] == "ComfyUI_00001_.latent", located
    path = os.path.join(folder_paths.get_output_directory(), located["subfolder"], located["filename"])
    os.replace(path, f"{OUT}/comfyui.latent")
    save_file({"latent_tensor": io["a"].half()}, f"{OUT}/legacy.latent")
    print(json.dumps({k: list(v.shape) for k, v in io.items()}))


if __name__ == "__main__":
    main()
