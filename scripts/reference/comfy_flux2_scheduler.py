"""Records ComfyUI's own `Flux2Scheduler` (comfy_extras/nodes_flux.py) for a few step counts and image sizes: the
reference of Kiln's `flux2_sigmas`, written to engine/models/tests/fixtures/comfy_sampling/flux2_scheduler.json
as f32 bit patterns.

ComfyUI at the commit Kiln matches is imported from COMFYUI_DIR (see comfyui.py). Importing a node module imports
ComfyUI's `nodes`, which imports torchaudio; the scheduler does not use it, so when it is not installed an empty
stand-in package is put on the path first.

Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/comfy_flux2_scheduler.py
"""

import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui(node_modules=True)
from comfy_extras.nodes_flux import Flux2Scheduler  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/comfy_sampling")
CASES = [(4, 1024, 1024), (20, 1024, 1024), (1, 64, 64), (9, 1920, 1088), (3, 512, 768), (30, 2048, 2048)]


def bits(value):
    return struct.unpack("<I", struct.pack("<f", value))[0]


def main():
    cases = []
    for steps, width, height in CASES:
        sigmas = Flux2Scheduler.execute(steps, width, height)[0]
        cases.append({"steps": steps, "width": width, "height": height,
                      "sigma_bits": [bits(v) for v in sigmas.float().tolist()]})
    with open(os.path.join(OUT, "flux2_scheduler.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
