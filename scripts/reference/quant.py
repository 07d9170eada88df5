"""Records ComfyUI's own reading of its quantized weight formats, the reference Kiln's quantization tests compare
with: engine/models/tests/fixtures/quant/{<case>.safetensors, reference.safetensors, cases.json}.

Each case is one small Linear (a bf16 bias) in a weight format ComfyUI loads, written as ComfyUI's files store
it (weight-formats.md §3, §4): the legacy scaled fp8 (`scaled_fp8` marker, `scale_weight`), the mixed-precision
map (`_quantization_metadata`, `weight_scale`) in e4m3fn and e5m2, int8 (a tensor scale, per-row scales, and
per-row with ConvRot at groups of 64 and 256, quantized by comfy-kitchen's own functions), MXFP8 and NVFP4
(comfy-kitchen's layouts, swizzled block scales). The
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


def comfy_linear(path, x, n=N, k=K):
    with torch.no_grad():
        return comfy_layer(path, n, k)(x)


def comfy_layer(path, n=N, k=K):
    sd, metadata = comfy.utils.load_torch_file(path, return_metadata=True)
    sd, metadata = comfy.utils.convert_old_quants(sd, model_prefix="", metadata=metadata)
    # The operations ComfyUI picks for a quantized model on the CPU: mixed precision, the fp8 formats emulated
    # (dequantized) because the device has no fp8 compute, f32 compute.
    config = type("Config", (), {"quant_config": {"mixed_ops": True}})()
    ops = comfy.ops.pick_operations(torch.float8_e4m3fn, torch.float32, load_device=torch.device("cpu"),
                                    model_config=config)
    layer = ops.Linear(k, n, bias=True)
    missing, unexpected = [], []
    layer._load_from_state_dict(sd, "layer.", {}, True, missing, unexpected, [])
    assert not missing, missing
    return layer


def lora_on_scaled(path, x, g):
    """A LoRA on a per-tensor scaled fp8 weight, as ComfyUI patches one: the weight dequantized, the LoRA
    added by comfy.lora.calculate_weight in f32, then the layer's set_weight, which re-quantizes it with a
    recalculated scale and stochastic rounding seeded from the key."""
    from comfy.weight_adapter.lora import LoRAAdapter
    import comfy.lora

    layer = comfy_layer(path)
    up = torch.randn((N, 2), generator=g) * 0.3
    down = torch.randn((2, K), generator=g) * 0.3
    alpha, strength = 1.0, 0.8
    with torch.no_grad():
        weight = layer.convert_weight(layer.weight).float()
        patches = [(strength, LoRAAdapter(set(), (up, down, alpha, None, None, None)), 1.0, None, None)]
        exact = comfy.lora.calculate_weight(patches, weight.clone(), "layer.weight")
        layer.set_weight(exact.clone(), seed=comfy.utils.string_to_seed("layer.weight"))
        return {"up": up, "down": down, "alpha": torch.tensor([alpha]), "strength": torch.tensor([strength]),
                "exact": exact, "scale": layer.weight._params.scale.reshape(1).float(),
                "weight": layer.convert_weight(layer.weight).float(), "y": layer(x).float()}


def int8(per_row=True, convrot=None):
    """comfy-kitchen's int8 quantizers: a tensor scale, per-row scales, or per-row after ConvRot's rotation."""
    from comfy_kitchen.backends.eager import quantization as eager

    def quantize_layer(w):
        config = {"format": "int8_tensorwise"}
        if convrot:
            q, scale = eager.quantize_int8_convrot_weight(w, convrot)
            config.update({"convrot": True, "convrot_groupsize": convrot})
        elif per_row:
            q, scale = eager.quantize_int8_rowwise(w)
        else:
            q, scale = eager.quantize_int8_tensorwise(w)
        return {"weight": q, "weight_scale": scale.float()}, config

    return quantize_layer


def block_scaled(layout):
    """comfy-kitchen's MXFP8 or NVFP4 layout: the weight and the state-dict tensors it writes beside it."""
    from comfy_kitchen.tensor import TensorCoreMXFP8Layout, TensorCoreNVFP4Layout

    cls = {"TensorCoreMXFP8Layout": TensorCoreMXFP8Layout, "TensorCoreNVFP4Layout": TensorCoreNVFP4Layout}[layout]

    def quantize_layer(w):
        qdata, params = cls.quantize(w)
        tensors = {f"weight{suffix}": t for suffix, t in cls.state_dict_tensors(qdata, params).items()}
        fmt = "mxfp8" if layout == "TensorCoreMXFP8Layout" else "nvfp4"
        return tensors, {"format": fmt}

    return quantize_layer


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
        for key, value in lora_on_scaled(path, x, torch.Generator().manual_seed(7)).items():
            reference[f"lora/{name}/{key}"] = value
        cases.append({"name": name, "file": f"{name}.safetensors"})
    # The formats with their own layouts, at sizes their blocks and rotation groups divide; 160 rows and 5 blocks
    # a row reach every term of the block scales' swizzle (a second 128-row tile, 32-row quarters, 4-block columns).
    for name, n, k, quantize_layer in (("int8_tensorwise", 8, 64, int8(per_row=False)),
                                       ("int8_rowwise", 8, 64, int8(per_row=True)),
                                       ("int8_convrot64", 8, 128, int8(convrot=64)),
                                       ("int8_convrot256", 8, 256, int8(convrot=256)),
                                       ("mxfp8", 160, 160, block_scaled("TensorCoreMXFP8Layout")),
                                       ("nvfp4", 160, 80, block_scaled("TensorCoreNVFP4Layout"))):
        wk = torch.randn((n, k), generator=g) * 0.2
        bk = (torch.randn((n,), generator=g) * 0.1).to(torch.bfloat16)
        # Rows that stress the activation quantization: a wide range, a zero row, a row of one value.
        xk = torch.randn((4, k), generator=g) * torch.tensor([[1.0], [30.0], [0.0], [1.0]])
        xk[3] = 0.7
        tensors, config = quantize_layer(wk)
        tensors = {f"layer.{key}": t for key, t in tensors.items()}
        tensors["layer.bias"] = bk
        metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": {"layer": config}})}
        path = os.path.join(OUT, f"{name}.safetensors")
        save_file(tensors, path, metadata=metadata)
        reference[f"x/{name}"] = xk
        reference[f"y/{name}"] = comfy_linear(path, xk, n, k).float()
        if config["format"] == "int8_tensorwise":
            # ComfyUI's text encoders dequantize instead (full-precision matmuls): comfy-kitchen's dequantization,
            # rotated back for ConvRot, then a plain f32 linear.
            from comfy_kitchen.backends.eager import quantization as eager
            q, scale = tensors["layer.weight"], tensors["layer.weight_scale"]
            if config.get("convrot"):
                w_deq = eager.dequantize_int8_convrot_weight(q, scale, config["convrot_groupsize"])
            else:
                w_deq = eager.dequantize_int8_simple(q, scale)
            reference[f"y_dequantized/{name}"] = torch.nn.functional.linear(xk, w_deq, bk.float())
        cases.append({"name": name, "file": f"{name}.safetensors", "n": n, "k": k, "format": config})
    save_file({k: v.contiguous() for k, v in reference.items()}, os.path.join(OUT, "reference.safetensors"))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"cases": cases, "x_shape": [3, K], "n": N}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
