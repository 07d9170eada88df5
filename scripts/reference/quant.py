"""Records ComfyUI's own reading of its quantized weight formats, the reference Kiln's quantization tests compare
with: engine/models/tests/fixtures/quant/{<case>.safetensors, reference.safetensors, cases.json}.

Each case is one small Linear (8 outputs, 32 inputs, a bf16 bias) in a weight format ComfyUI loads, written as
ComfyUI's files store it (weight-formats.md §3, §4.1): the legacy scaled fp8 (`scaled_fp8` marker,
`scale_weight`), and the mixed-precision map (`_quantization_metadata`, `weight_scale`) in e4m3fn and e5m2. The
reference output is ComfyUI's: the file read by comfy.utils.load_torch_file, its legacy quantization converted by
comfy.utils.convert_old_quants, loaded into the Linear of the operations comfy.ops.pick_operations chooses on the
CPU (mixed precision with the fp8 formats dequantized, f32 compute), and applied to a fixed input.

ComfyUI is imported from a checkout outside the repository (COMFYUI_DIR; see comfy_sampling.py for the extra pins).
Run from the repository root with the reference venv:
    COMFYUI_DIR=/path/to/ComfyUI target/reference-venv/bin/python scripts/reference/quant.py
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
from comfyui import import_comfyui  # noqa: E402

import_comfyui()
import comfy.ops  # noqa: E402
import comfy.utils  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/quant")
N, K = 8, 32


def quantize(w, dtype):
    top = 448.0 if dtype == torch.float8_e4m3fn else 57344.0
    scale = w.abs().max() / top
    return (w / scale).clamp(-top, top).to(dtype), scale.reshape(()).float()


def comfy_linear(path, x):
    sd, metadata = comfy.utils.load_torch_file(path, return_metadata=True)
    sd, metadata = comfy.utils.convert_old_quants(sd, model_prefix="", metadata=metadata)
    # The operations ComfyUI picks for a quantized model on the CPU: mixed precision, the fp8 formats emulated
    # (dequantized) because the device has no fp8 compute, f32 compute.
    config = type("Config", (), {"quant_config": {"mixed_ops": True}})()
    ops = comfy.ops.pick_operations(torch.float8_e4m3fn, torch.float32, load_device=torch.device("cpu"),
                                    model_config=config)
    layer = ops.Linear(K, N, bias=True)
    missing, unexpected = [], []
    layer._load_from_state_dict(sd, "layer.", {}, True, missing, unexpected, [])
    assert not missing, missing
    with torch.no_grad():
        return layer(x)


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    w = torch.randn((N, K), generator=g) * 0.2
    bias = (torch.randn((N,), generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn((3, K), generator=g)
    reference = {"x": x}
    cases = []
    for name, dtype, encoding in (("scaled_fp8", torch.float8_e4m3fn, "legacy"),
                                  ("mixed_e4m3fn", torch.float8_e4m3fn, "metadata"),
                                  ("mixed_e5m2", torch.float8_e5m2, "metadata")):
        q, scale = quantize(w, dtype)
        tensors = {"layer.weight": q, "layer.bias": bias}
        metadata = {}
        if encoding == "legacy":
            tensors["layer.scale_weight"] = scale
            tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
        else:
            tensors["layer.weight_scale"] = scale
            fmt = "float8_e4m3fn" if dtype == torch.float8_e4m3fn else "float8_e5m2"
            metadata["_quantization_metadata"] = json.dumps({"format_version": "1.0",
                                                             "layers": {"layer": {"format": fmt}}})
        path = os.path.join(OUT, f"{name}.safetensors")
        save_file(tensors, path, metadata=metadata)
        reference[f"y/{name}"] = comfy_linear(path, x).float()
        cases.append({"name": name, "file": f"{name}.safetensors"})
    save_file({k: v.contiguous() for k, v in reference.items()}, os.path.join(OUT, "reference.safetensors"))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"cases": cases, "x_shape": [3, K], "n": N}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
