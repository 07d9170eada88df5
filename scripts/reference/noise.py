"""Records torch's CPU `randn` (f32) for Kiln's noise tests: engine/models/tests/fixtures/noise/randn.safetensors.

Run from the repository root with the reference venv (scripts/reference/setup.sh prints its python):
    target/reference-venv/bin/python scripts/reference/noise.py

Each case seeds a fresh `torch.Generator()` with `manual_seed(seed)` and makes one or more consecutive
`torch.randn(size, generator=g)` calls; tensor `"<case>/<k>"` holds call k's values, flattened. The JSON
`cases.json` lists each case's seed and call sizes, and `prepare_noise` with a batch_index, written from its
documented behaviour (ComfyUI's comfy/sample.py, models.md §6.7) with torch calls.

torch has two f32 normal kernels (n >= 16): the AVX2 one (Cephes polynomials), which torch 2.15 runs on AVX2 and
AVX-512 CPUs, and the scalar libm one (ATEN_CPU_CAPABILITY=default, and non-x86 builds). The script records the
native one into randn.safetensors (on the x86 AVX-512 machine the fixtures were made on: the AVX2 kernel; checked by
comparing with ATEN_CPU_CAPABILITY=avx2) and re-runs itself with ATEN_CPU_CAPABILITY=default into
randn_libm.safetensors.
"""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "../../engine/models/tests/fixtures/noise")

# (name, seed, consecutive call shapes)
CASES = [
    ("seed0_4", 0, [(4,)]),
    ("seed42_4", 42, [(4,)]),
    ("seed0_16", 0, [(16,)]),
    ("seed0_latent", 0, [(1, 16, 8, 8)]),
    ("seed42_latent", 42, [(1, 16, 8, 8)]),
    ("seed123456789_batch2", 123456789, [(2, 16, 4, 6)]),
    ("seed7_17", 7, [(17,)]),
    ("seed7_100", 7, [(100,)]),
    ("seed7_1000", 7, [(1000,)]),
    ("seed99_1", 99, [(1,)]),
    ("seed99_15", 99, [(15,)]),
    ("seed1_small_calls", 1, [(3,), (5,), (2,), (20,), (1,)]),
    ("seed_above_2_32", 2**32 + 5, [(1, 16, 4, 4), (7,)]),
    ("seed5", 5, [(1, 16, 4, 4), (7,)]),
    ("seed_max_u64", 2**64 - 1, [(33,)]),
    ("seed3_many", 3, [(48,), (40,), (13,), (64,)]),
]


def prepare_noise_batch_index(seed, shape, inds):
    """ComfyUI's prepare_noise with noise_inds, re-expressed: draws i = 0..max in sequence, keep requested."""
    g = torch.Generator().manual_seed(seed)
    draws = {}
    for i in range(max(inds) + 1):
        n = torch.randn([1] + list(shape[1:]), dtype=torch.float32, generator=g)
        if i in inds:
            draws[i] = n
    return torch.cat([draws[i] for i in inds], dim=0)


def main():
    os.makedirs(OUT, exist_ok=True)
    libm = os.environ.get("ATEN_CPU_CAPABILITY") == "default"
    tensors = {}
    cases = {}
    for name, seed, shapes in CASES:
        g = torch.Generator()
        g.manual_seed(seed)
        sizes = []
        for k, shape in enumerate(shapes):
            t = torch.randn(shape, dtype=torch.float32, generator=g)
            tensors[f"{name}/{k}"] = t.flatten().contiguous()
            sizes.append(t.numel())
        cases[name] = {"seed": str(seed), "sizes": sizes}
    # The global generator, as ComfyUI uses it (torch.manual_seed returns it).
    gen = torch.manual_seed(2024)
    tensors["global_2024/0"] = torch.randn((1, 16, 4, 4), dtype=torch.float32, generator=gen).flatten()
    cases["global_2024"] = {"seed": "2024", "sizes": [256]}
    # prepare_noise with batch_index.
    bi = [2, 0, 2]
    tensors["batch_index_latent"] = prepare_noise_batch_index(11, (3, 16, 2, 2), bi).flatten()
    tensors["batch_index_small"] = prepare_noise_batch_index(11, (2, 1, 1, 3), [1, 3, 1]).flatten()
    save_file(tensors, os.path.join(OUT, "randn_libm.safetensors" if libm else "randn.safetensors"))
    if libm:
        return
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    code = "import torch; g = torch.Generator().manual_seed(7); print(torch.randn(1000, generator=g).tolist())"
    avx2 = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    native = torch.randn(1000, generator=torch.Generator().manual_seed(7)).tolist()
    kernel = "avx2" if str(native) == avx2.stdout.strip() else "libm"
    subprocess.run([sys.executable, __file__], env=dict(os.environ, ATEN_CPU_CAPABILITY="default"), check=True)
    meta = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_kernel": kernel,
        "cases": cases,
        "batch_index_latent": {"seed": 11, "shape": [3, 16, 2, 2], "batch_index": bi},
        "batch_index_small": {"seed": 11, "shape": [2, 1, 1, 3], "batch_index": [1, 3, 1]},
    }
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
