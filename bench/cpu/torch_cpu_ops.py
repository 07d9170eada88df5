"""torch's figures for the CPU op cases of `cargo bench -p kiln-compute --bench cpu_ops`.

The same cases, timed the same way: one warm-up call, then the median of several. bf16-weight linears are timed
both as a torch user would write them: `F.linear(x_f32, w_bf16.float())` (upcast per call, as ComfyUI's
manual cast does) and `F.linear(x_bf16, w_bf16)` (bf16 activations). Prints one JSON object on stdout.

Usage: python torch_cpu_ops.py [--threads N] [FILTER]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timed(runs, f):
    """Median and fastest seconds of `runs` calls of f after one warm-up call; CPU seconds per run on stderr."""
    f()
    secs = []
    cpu0 = time.process_time()
    for _ in range(runs):
        t = time.perf_counter()
        f()
        secs.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu0) / runs
    print(f"  median {statistics.median(secs):.4f} s (min {min(secs):.4f}, cpu {cpu:.3f})", file=sys.stderr)
    return {"median": statistics.median(secs), "min": min(secs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=0, help="runs per case (default: 5, or 3 for the large cases)")
    ap.add_argument("filter", nargs="?", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = {}

    def run(name, runs, f):
        if args.filter in name:
            results[name] = f(args.runs or runs)
            print(name, file=sys.stderr)

    with torch.inference_mode():
        for n, k in [(3840, 3840), (10240, 3840), (3840, 10240)]:
            w = (torch.rand(n, k) * 2 - 1).bfloat16()
            for m in [256, 4096]:
                x = torch.rand(m, k) * 2 - 1
                xb = x.bfloat16()
                runs = 3 if m >= 4096 else 5
                run(
                    f"linear_bf16_w{n}x{k}_m{m}",
                    runs,
                    lambda r: {
                        "f32_upcast": timed(r, lambda: F.linear(x, w.float())),
                        "bf16": timed(r, lambda: F.linear(xb, w)),
                    },
                )

        # Stored fp8 and f16 weights times a few rows (kiln's `FewRows` cases), upcast on every call as ComfyUI's
        # manual cast does on the CPU: fp8 at Qwen-Image's MMDiT shapes, f16 at Wan 2.2 TI2V 5B's.
        few_rows = [
            (torch.float8_e4m3fn, "fp8", [(3072, 3072), (12288, 3072), (3072, 12288)], [1, 4, 8, 16], 9),
            (torch.float16, "f16", [(3072, 3072), (14336, 3072)], [16, 1024], 5),
        ]
        for dtype, label, shapes, rows, runs in few_rows:
            for n, k in shapes:
                w = ((torch.rand(n, k) * 2 - 1) * 0.5).to(dtype)
                for m in rows:
                    x = torch.rand(m, k) * 2 - 1
                    run(
                        f"linear_{label}_w{n}x{k}_m{m}",
                        runs,
                        lambda r: {"f32_upcast": timed(r, lambda: F.linear(x, w.float()))},
                    )

        heads, d, n = 30, 128, 4096
        q, k, v = (torch.rand(1, heads, n, d) * 2 - 1 for _ in range(3))
        run(f"attention_h{heads}_d{d}_n{n}", 3, lambda r: timed(r, lambda: F.scaled_dot_product_attention(q, k, v)))

        c, hw = 512, 128
        w = torch.rand(c, c, 3, 3) * 2 - 1
        b = torch.rand(c) * 2 - 1
        x = torch.rand(1, c, hw, hw) * 2 - 1
        run(f"conv2d_3x3_c{c}_{hw}x{hw}", 3, lambda r: timed(r, lambda: F.conv2d(x, w, b, padding=1)))
        # The planes of a video VAE's decode of a small clip, as in cpu_ops.
        for c, hw, runs in [(1024, 4, 9), (1024, 8, 9), (512, 16, 5), (256, 32, 5), (128, 64, 5)]:
            w = torch.rand(c, c, 3, 3) * 2 - 1
            x = torch.rand(1, c, hw, hw) * 2 - 1
            run(f"conv2d_3x3_c{c}_{hw}x{hw}", runs, lambda r: timed(r, lambda: F.conv2d(x, w, padding=1)))

    def pick(key):
        return {
            name: {v: t[key] for v, t in r.items()} if "median" not in r else r[key] for name, r in results.items()
        }

    out = {"tool": "torch", "version": torch.__version__, "threads": args.threads}
    print(json.dumps({**out, "seconds": pick("median"), "min_seconds": pick("min")}))


if __name__ == "__main__":
    main()
