"""Fixtures for Kiln's Wan Move nodes (engine/src/nodes/builtin/wan_move.rs), from ComfyUI's own code
(comfy_extras/nodes_wanmove.py at 0f1fa67a): `GenerateTracks` (straight and Bézier paths, every interpolation,
spread tracks) and `create_pos_embeddings` + `replace_feature` (the start frame's features written where the
tracks go, what `WanMoveTrackToVideo` does to the encoded start clip).

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan_move.py

Writes engine/tests/fixtures/wan_move/io.safetensors (f32) and cases.json:
- per GenerateTracks case g (its inputs in cases.json): `path.<g>` [frames, tracks, 2];
- per move case m: `latent.<m>` [1, 16, T, h, w] (random), the tracks it reads (`tracks.<m>` [frames, tracks, 2]
  and `visible.<m>` [frames, tracks] as 0/1), and `moved.<m>`, replace_feature's output at `strength`. The tracks
  are chosen so no two land on one latent position of one frame (ComfyUI's random track order would decide
  which wins there), with points off the frame and hidden ones.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/wan_move"

# (width, height, start_x, start_y, end_x, end_y, num_frames, num_tracks, track_spread, bezier, mid_x, mid_y,
#  interpolation): the template's three, and the other interpolations, a single track, a still path.
GENERATE = {
    "template_1": (720, 480, 0.12, 1.0, 0.55, 0.63, 81, 5, 0.012, True, 0.42, 0.96, "linear"),
    "template_2": (720, 480, 0.48, 0.97, 0.96, 0.16, 81, 7, 0.017, True, 0.88, 0.72, "linear"),
    "ease_in": (64, 48, 0.1, 0.2, 0.9, 0.7, 9, 3, 0.05, False, 0.5, 0.5, "ease_in"),
    "ease_out": (64, 48, 0.1, 0.2, 0.9, 0.7, 13, 4, 0.1, True, 0.3, 0.9, "ease_out"),
    "ease_in_out": (48, 32, 0.5, 0.5, 0.2, 0.1, 17, 2, 0.2, False, 0.5, 0.5, "ease_in_out"),
    "constant": (48, 32, 0.3, 0.3, 0.6, 0.6, 5, 3, 0.1, True, 0.5, 0.5, "constant"),
    "still": (48, 32, 0.5, 0.5, 0.5, 0.5, 5, 3, 0.1, False, 0.5, 0.5, "linear"),
    "one": (32, 32, 0.0, 0.0, 1.0, 1.0, 1, 1, 0.0, False, 0.5, 0.5, "linear"),
}

# (width, height, length, strength): the latent is [1, 16, (length - 1) / 4 + 1, height / 8, width / 8].
MOVE = {
    "full": (64, 48, 13, 1.0),
    "half": (48, 32, 9, 0.5),
}


def move_tracks(width, height, length, g):
    """Tracks for a move case: each its own latent row (so no two meet), walking right; one starts hidden,
    one leaves the frame, one is hidden on some frames."""
    n = height // 8
    t = torch.arange(length, dtype=torch.float32)
    xs = torch.stack([3.0 + t * (width / length) + float(i) for i in range(n)], dim=1)
    ys = torch.stack([torch.full((length,), 8.0 * i + 2.0 + float(torch.rand(1, generator=g)) * 4) for i in range(n)],
                     dim=1)
    ys[:, n - 1] += t * 3.0  # leaves the frame at the bottom
    visible = torch.ones(length, n, dtype=torch.bool)
    visible[0, 0] = False  # hidden at the start: its features come from the last row and column
    visible[4:8, 1] = False
    return torch.stack([xs, ys], dim=-1), visible


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_wanmove import GenerateTracks, create_pos_embeddings, replace_feature

    os.makedirs(OUT, exist_ok=True)
    out, described = {}, {"generate": {}, "move": {}}
    for case, args in GENERATE.items():
        (w, h, sx, sy, ex, ey, frames, tracks, spread, bezier, mx, my, interpolation) = args
        result = GenerateTracks.execute(width=w, height=h, start_x=sx, start_y=sy, mid_x=mx, mid_y=my, end_x=ex,
                                        end_y=ey, num_frames=frames, num_tracks=tracks, track_spread=spread,
                                        bezier=bezier, interpolation=interpolation)
        info = result.result[0] if hasattr(result, "result") else result[0]
        out[f"path.{case}"] = info["track_path"].float().contiguous()
        described["generate"][case] = dict(zip(
            ["width", "height", "start_x", "start_y", "end_x", "end_y", "num_frames", "num_tracks",
             "track_spread", "bezier", "mid_x", "mid_y", "interpolation"], args))
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    for case, (w, h, length, strength) in MOVE.items():
        frames = (length - 1) // 4 + 1
        latent = torch.randn(1, 16, frames, h // 8, w // 8, generator=g)
        path, visible = move_tracks(w, h, length, g)
        pos = create_pos_embeddings(path, visible, [4, 8, 8], h, w, track_num=path.shape[1])
        moved = replace_feature(latent.clone(), pos.unsqueeze(0), strength)
        out[f"latent.{case}"] = latent.contiguous()
        out[f"tracks.{case}"] = path.contiguous()
        out[f"visible.{case}"] = visible.float().contiguous()
        out[f"moved.{case}"] = moved.contiguous()
        described["move"][case] = {"width": w, "height": h, "length": length, "strength": strength}
        print(f"{case}: moved {float((moved - latent).abs().max()):.3f}")
    save_file(out, f"{OUT}/io.safetensors")
    with open(f"{OUT}/cases.json", "w") as f:
        json.dump(described, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{OUT}/io.safetensors: {os.path.getsize(f'{OUT}/io.safetensors')} bytes")


if __name__ == "__main__":
    with torch.no_grad():
        main()
