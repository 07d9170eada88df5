"""Fixtures for Kiln's `WanTrackToVideo` (engine/src/nodes/builtin/wan_track.rs), from ComfyUI's own functions
(comfy_extras/nodes_wan.py at 0f1fa67a): `parse_json_tracks`, `pad_pts` and `process_tracks` (a trajectory
editor's points to the rows the model reads) and `patch_motion` (the first latent frame's features carried
along the tracks into the later frames, with the mask of how much each position took).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan_track.py

Writes engine/tests/fixtures/wan_track/io.safetensors (f32) and cases.json. For each case c of CASES (tracks
JSON as a trajectory editor writes it, width, height, length, temperature, topk): `rows.<c>` [1, length, N, 4]
(process_tracks of the parsed, padded tracks), `y.<c>` [1, 16, T, height/8, width/8] (a random latent in model
space), `mask.<c>` [1, 4, T, h, w] and `feature.<c>` [1, 16, T, h, w] (patch_motion's outputs). cases.json holds
each case's tracks text and numbers. The tracks cover a single track (a bare list of points), several tracks
with more and fewer points than the 121 a track is padded or cut to, points outside the frame, single quotes
(the node reads them as double), topk below and above the number of tracks. The temperatures are low (the
default 220 is for 480p latents, whose positions are 20x closer than these tiny ones') so the tracks carry weight.
"""

import json
import math
import os
import random
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/wan_track"


def track(rng, n, width, height, wander):
    """`n` points from a random start, each a small random step from the last (integers, as the editor writes)."""
    x, y = rng.uniform(0, width), rng.uniform(0, height)
    points = []
    for _ in range(n):
        x += rng.uniform(-wander, wander)
        y += rng.uniform(-wander, wander)
        points.append({"x": round(x), "y": round(y)})
    return points


def cases():
    rng = random.Random(5)
    three = [track(rng, 130, 64, 48, 3), track(rng, 40, 64, 48, 2), track(rng, 121, 64, 48, 6)]
    three[1][3] = {"x": -20, "y": 90}  # outside the frame
    single = track(rng, 25, 32, 32, 1)
    two = [track(rng, 90, 48, 32, 2), track(rng, 60, 48, 32, 4)]
    return {
        "three": (json.dumps(three), 64, 48, 9, 20.0, 2),
        "single_quotes": (json.dumps(single).replace('"', "'"), 32, 32, 5, 5.0, 10),
        "two": (json.dumps(two), 48, 32, 13, 2.0, 1),
    }


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_wan import parse_json_tracks, pad_pts, patch_motion, process_tracks

    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(11)
    out, described = {}, {}
    for case, (text, width, height, length, temperature, topk) in cases().items():
        tracks = parse_json_tracks(text)
        if isinstance(tracks[0][0], dict):
            tracks = [tracks]
        assert len(tracks) == 1, case
        rows = process_tracks(np.stack([pad_pts(t) for t in tracks[0]], axis=0), (width, height), length - 1)
        rows = rows.unsqueeze(0)
        frames = (length - 1) // 4 + 1
        y = torch.randn(1, 16, frames, height // 8, width // 8, generator=g)
        mask, feature = patch_motion([rows], y, temperature=temperature, topk=topk, vae_divide=(4, 16))
        out[f"rows.{case}"] = rows.float().contiguous()
        out[f"y.{case}"] = y.contiguous()
        out[f"mask.{case}"] = mask.float().contiguous()
        out[f"feature.{case}"] = feature.float().contiguous()
        described[case] = {"tracks": text, "width": width, "height": height, "length": length,
                           "temperature": temperature, "topk": topk}
        moved = float((feature - y).abs().max())
        print(f"{case}: rows {tuple(rows.shape)}, mask max {float(mask.max()):.3f}, feature moved {moved:.3f}")
    save_file(out, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(described, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{OUT}/io.safetensors: {os.path.getsize(f'{OUT}/io.safetensors')} bytes")


if __name__ == "__main__":
    with torch.no_grad():
        main()
