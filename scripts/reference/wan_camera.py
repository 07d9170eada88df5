"""Fixtures for Kiln's `WanCameraEmbedding` (engine/src/nodes/builtin/wan_camera.rs), from ComfyUI's own node
(comfy_extras/nodes_camera_trajectory.py at 0f1fa67a): the Plücker-ray embedding of preset camera motions.

Run from the repository root:
    COMFYUI_DIR=... $(scripts/reference/setup.sh) scripts/reference/wan_camera.py

Writes engine/tests/fixtures/wan_camera/io.safetensors (f32), one `out.<case>` [1, 24, frames, H, W] per case
below: (pose, width, height, length, speed, fx, fy, cx, cy); the sizes are small but keep both branches of the
intrinsics' aspect refit (wider and narrower than 16:9), and the motions cover translation, rotation and none.
"""

import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

OUT = "engine/tests/fixtures/wan_camera"
CASES = {
    "zoom_in": ("Zoom In", 32, 16, 5, 1.0, 0.5, 0.5, 0.5, 0.5),
    "pan_left": ("Pan Left", 16, 24, 9, 1.7, 0.4, 0.6, 0.45, 0.55),
    "clockwise": ("ClockWise (CW)", 48, 16, 5, 2.5, 0.5, 0.5, 0.5, 0.5),
    "static": ("Static", 16, 16, 1, 1.0, 0.5, 0.5, 0.5, 0.5),
}


def main():
    import_comfyui(node_modules=True)
    from comfy_extras.nodes_camera_trajectory import WanCameraEmbedding

    os.makedirs(OUT, exist_ok=True)
    out = {}
    for case, (pose, w, h, length, speed, fx, fy, cx, cy) in CASES.items():
        result = WanCameraEmbedding.execute(pose, w, h, length, speed=speed, fx=fx, fy=fy, cx=cx, cy=cy)
        embedding = result.result[0] if hasattr(result, "result") else result[0]
        out[f"out.{case}"] = embedding.float().contiguous()
        print(f"{case}: {tuple(embedding.shape)}, max |value| {float(embedding.abs().max()):.3f}")
    save_file(out, f"{OUT}/io.safetensors")
    print(f"{OUT}/io.safetensors: {os.path.getsize(f'{OUT}/io.safetensors')} bytes")


if __name__ == "__main__":
    with torch.no_grad():
        main()
