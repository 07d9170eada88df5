"""Summarises one GPU run: Kiln's figures (kiln-gpu.json) as ratios to the PyTorch baseline's (anchor.json) from the
same run, against the targets of issue #10 / performance-anchors.md §4. Prints JSON."""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # a missing or broken file is reported, not fatal
        return {"error": f"{path}: {e}"}


kiln, torch = load(sys.argv[1]), load(sys.argv[2])
machine = open(sys.argv[3]).read() if len(sys.argv) > 3 else ""
summary = {"machine": machine.strip().splitlines()[:3], "kiln": kiln, "torch": torch, "checks": {}}
checks = summary["checks"]


def check(name, value, goal, ok):
    checks[name] = {"value": value, "goal": goal, "met": bool(ok) if value is not None else None}


try:
    for size in ("64MB", "1024MB"):
        k, t = kiln.get(f"h2d_pool_{size}_GBps"), torch.get(f"h2d_pinned_{size}_GBps")
        if k and t:
            check(f"h2d_pool_{size}_vs_torch_pinned", k / t, ">= 0.95", k / t >= 0.95)
    mp = kiln.get("make_pinnable_4GiB", {})
    if mp:
        check("make_pinnable_4GiB_register_s", mp["register_s"], "<= 0.25", mp["register_s"] <= 0.25)
        check("make_pinnable_4GiB_total_s", mp["total_s"], "<= 0.25 (prefault normally in the background)", mp["total_s"] <= 0.25)
    for m in ("M256", "M4096"):
        e = kiln.get(m)
        if not e:
            continue
        check(f"{m}_streamed_over_bound", e["streamed_over_bound"], "<= 1.02", e["streamed_over_bound"] <= 1.02)
        for p in (25, 50, 75):
            q = e.get(f"partial_{p}")
            if q:
                check(f"{m}_partial_{p}_over_nonresident_copy", q["over_nonresident_copy"], "<= 1.05",
                      q["over_nonresident_copy"] <= 1.05)
        t = torch.get(m, {})
        if t.get("tflops_resident"):
            r = e["tflops_resident"] / t["tflops_resident"]
            check(f"{m}_resident_tflops_vs_torch", r, ">= 0.95", r >= 0.95)
        if t.get("streamed_over_bound"):
            checks[f"{m}_torch_streamed_over_bound"] = t["streamed_over_bound"]
    ld, tl = kiln.get("load", {}), torch.get("safetensors_load", {})
    for label in ("cold", "warm"):
        if isinstance(ld.get(label), dict) and isinstance(tl, dict) and isinstance(tl.get(label), dict):
            r = ld[label]["load_GBps"] / tl[label]["load_and_pin_GBps"]
            check(f"load_{label}_vs_torch_load_and_pin", r, ">= 1", r >= 1)
except Exception as e:
    summary["error"] = repr(e)
print(json.dumps(summary, indent=1))
