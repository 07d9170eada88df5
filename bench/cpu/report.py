"""Merges rounds of `cpu_ops` (kiln) and `torch_cpu_ops.py` (torch) output into one JSON and a Markdown table.

Per case and variant, the best median over the rounds (and the fastest single run) is kept. Ratios are
kiln / torch: like for like (kiln with f32 activations against torch's `F.linear(x_f32, w_bf16.float())`,
kiln with bf16 activations against `F.linear(x_bf16, w_bf16)`), and kiln's faster variant against torch's
faster one, which is the figure the goal (kiln <= 1.25x torch) is judged on.

Usage: python report.py --out PATH_WITHOUT_EXTENSION kiln-1.json ... torch-1.json ...
"""

import argparse
import datetime
import json
import os
import subprocess

GOAL = 1.25
# kiln variant -> the torch variant it is compared with like for like.
PAIRS = {"x_f32": "f32_upcast", "x_bf16": "bf16"}


def best(runs, key):
    """Case -> value or {variant: value}: the smallest over the runs."""
    out = {}
    for run in runs:
        for case, v in run[key].items():
            if isinstance(v, dict):
                cur = out.setdefault(case, {})
                for var, s in v.items():
                    cur[var] = min(s, cur.get(var, s))
            else:
                out[case] = min(v, out.get(case, v))
    return out


def fastest(v):
    return min(v.values()) if isinstance(v, dict) else v


def machine():
    model = "unknown"
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return {"nproc": int(nproc or os.cpu_count()), "model_name": model, "isa": isa}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    runs = {"kiln": [], "torch": []}
    for path in args.files:
        with open(path) as f:
            run = json.load(f)
        runs[run["tool"]].append(run)

    tools = {}
    for tool, rs in runs.items():
        tools[tool] = {
            "rounds": len(rs),
            "threads": rs[0]["threads"],
            "seconds": best(rs, "seconds"),
            "min_seconds": best(rs, "min_seconds"),
        }
        if "version" in rs[0]:
            tools[tool]["version"] = rs[0]["version"]
    def ratios_of(key):
        kiln, torch = tools["kiln"][key], tools["torch"][key]
        ratios = {}
        for case in kiln:
            if case not in torch:
                continue
            k, t = kiln[case], torch[case]
            r = {"best": fastest(k) / fastest(t)}
            if isinstance(k, dict):
                for kv, tv in PAIRS.items():
                    r[f"{kv}/{tv}"] = k[kv] / t[tv]
            ratios[case] = r
        return ratios

    kiln, torch = tools["kiln"]["seconds"], tools["torch"]["seconds"]
    ratios = ratios_of("seconds")
    ratios_fastest = ratios_of("min_seconds")

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "goal": f"kiln <= {GOAL}x torch (best variant against best variant)",
        "kiln": tools["kiln"],
        "torch": tools["torch"],
        "ratios_kiln_over_torch": ratios,
        "ratios_kiln_over_torch_fastest_runs": ratios_fastest,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")

    m = result["machine"]
    lines = [
        "# CPU ops: kiln against torch",
        "",
        f"{result['date']}, {m['model_name']}, nproc {m['nproc']} ({', '.join(m['isa'])}), "
        f"{tools['kiln']['threads']} threads each, torch {tools['torch'].get('version', '?')}, "
        f"best median of {tools['kiln']['rounds']} alternating rounds. Produced by `bench/cpu/run.sh`.",
        "",
        "Seconds are medians. Ratios are kiln / torch: bold is kiln's faster variant against torch's faster one "
        "(the goal), then like for like; the last column is the same ratio on each tool's fastest single run, "
        "which other processes on a shared machine disturb least.",
        "",
        "| case | kiln s | torch s | kiln / torch (best vs best) | goal ≤ 1.25× | fastest runs |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(v, names):
        if isinstance(v, dict):
            return "<br>".join(f"{names.get(n, n)} {s:.4f}" for n, s in v.items())
        return f"{v:.4f}"

    kn = {"x_f32": "x f32:", "x_bf16": "x bf16:"}
    tn = {"f32_upcast": "f32 (w.float()):", "bf16": "bf16:"}
    for case, r in ratios.items():
        like = "".join(f"<br>{n}: {r[n]:.2f}×" for n in r if n != "best")
        ok = "yes" if r["best"] <= GOAL else "no"
        fr = ratios_fastest.get(case, {}).get("best", float("nan"))
        lines.append(
            f"| {case} | {fmt(kiln[case], kn)} | {fmt(torch[case], tn)} | **{r['best']:.2f}×**{like} | {ok} | {fr:.2f}× |"
        )
    lines += [
        "",
        "Variants:",
        "- kiln `x f32`: f32 activations (the CPU backend's compute type); the bf16 weight is widened to f32 while",
        "  it is packed for the AVX-512 f32 micro-kernel (`engine/compute/src/backend/cpu/packed_gemm.rs`).",
        "- kiln `x bf16`: bf16 activations times the bf16 weight with AVX512-BF16 (`vdpbf16ps`): exact products,",
        "  f32 accumulation, bf16 output.",
        "- torch `f32 (w.float())`: `F.linear(x_f32, w_bf16.float())`, the weight upcast on every call (what",
        "  ComfyUI's manual cast does); torch `bf16`: `F.linear(x_bf16, w_bf16)` (oneDNN, AVX512-BF16 here).",
        "- attention: `F.scaled_dot_product_attention` on f32 `[1, 30, 4096, 128]`, no mask; kiln's flash-style",
        "  `attention`. conv2d: f32, 3×3, padding 1, with bias.",
        "",
    ]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
