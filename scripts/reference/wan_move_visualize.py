"""Fixtures for Kiln's WanMoveVisualizeTracks and WanMoveTracksFromCoords (engine/src/nodes/builtin/wan_move.rs),
from ComfyUI's own comfy_extras/nodes_wanmove.py at 0f1fa67a (PIL 13 draws the circles and trails).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan_move_visualize.py

Writes engine/tests/fixtures/wan_move/visualize.safetensors (f32): `images` [2, 40, 56, 3] (two frames, repeated
by the node to the tracks' 6), the `coords` JSON's tracks as `path` [6, 3, 2] and `visible` [6, 3] (the third
track hidden on frames 2 and 3), and `out` [6, 40, 56, 3]: the frames with each visible point's circle (size
5) and its trail over the last 3 frames (width 7, opacity 0.6).
Also writes visualize.json: {"coords": the JSON string WanMoveTracksFromCoords read, "track_length"}.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/wan_move"


def main():
    import_comfyui(node_modules=True)
    from comfy_extras import nodes_wanmove as wm

    g = torch.Generator().manual_seed(47)
    frames = 6
    tracks = []
    for start, step in (((5.7, 9.2), (6.3, 2.1)), ((50.2, 30.9), (-7.6, -3.3)), ((20.0, 35.5), (2.2, -6.8))):
        tracks.append([{"x": start[0] + step[0] * t, "y": start[1] + step[1] * t} for t in range(frames)])
    coords = json.dumps(tracks).replace('"', "'")
    info, length = wm.WanMoveTracksFromCoords.execute(coords, None).result
    # ComfyUI's mask-made visibility is one flag a frame ([F, 1]), which its visualizer cannot index past
    # the first track; a per-track one as GenerateTracks makes: the third track hidden on frames 2 and 3.
    info["track_visibility"][2:4, 2] = False
    images = torch.rand(2, 40, 56, 3, generator=g)
    out = wm.WanMoveVisualizeTracks.execute(images, 3, 5, 0.6, 7, info).result[0]
    io = {"images": images, "path": info["track_path"].float(), "visible": info["track_visibility"].float(),
          "out": out.float()}
    os.makedirs(OUT, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, f"{OUT}/visualize.safetensors")
    with open(f"{OUT}/visualize.json", "w") as f:
        json.dump({"coords": coords, "track_length": length}, f)
    print({k: list(v.shape) for k, v in io.items()}, length)


if __name__ == "__main__":
    main()
