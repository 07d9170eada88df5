"""Fixtures for Kiln's conditioning transforms (engine/src/nodes/builtin/conditioning_ops.rs), from ComfyUI's own
nodes.py at 0f1fa67a: ConditioningAverage and ConditioningConcat.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/conditioning_ops.py

Writes engine/tests/fixtures/conditioning_ops/io.safetensors (f32): prompts `to0` [1, 5, 8] with pooled
`to0.pooled` [1, 3], `to1` [1, 9, 8] without one, `from` [1, 7, 8] with `from.pooled` [1, 3]; for strengths 0.3
and 1.0, `average.<s>.<i>` (each `to` prompt, `from`'s first 5 tokens for to0, its 7 then zeros for to1) and
`average.<s>.<i>.pooled`; `concat.<i>` [1, 5 + 7 or 9 + 7, 8].
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/conditioning_ops"


def main():
    import_comfyui(node_modules=True)
    import nodes

    g = torch.Generator().manual_seed(31)
    io = {"to0": torch.randn(1, 5, 8, generator=g), "to0.pooled": torch.randn(1, 3, generator=g),
          "to1": torch.randn(1, 9, 8, generator=g), "from": torch.randn(1, 7, 8, generator=g),
          "from.pooled": torch.randn(1, 3, generator=g)}
    to = [[io["to0"], {"pooled_output": io["to0.pooled"]}], [io["to1"], {}]]
    source = [[io["from"], {"pooled_output": io["from.pooled"]}]]
    for strength in (0.3, 1.0):
        (out,) = nodes.ConditioningAverage().addWeighted(to, source, strength)
        for i, (tokens, extras) in enumerate(out):
            io[f"average.{strength}.{i}"] = tokens
            io[f"average.{strength}.{i}.pooled"] = extras["pooled_output"]
    (out,) = nodes.ConditioningConcat().concat(to, source)
    for i, (tokens, _) in enumerate(out):
        io[f"concat.{i}"] = tokens
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.float().clone().contiguous() for k, v in io.items()}, f"{OUT}/io.safetensors")
    print({k: list(v.shape) for k, v in io.items()})


if __name__ == "__main__":
    main()
