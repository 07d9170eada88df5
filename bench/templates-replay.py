#!/usr/bin/env python3
"""Replays the template suite's runs on another machine: every template that ran in `tests/templates/run.mjs`
(its `target/templates/replay.json`: the files it needed and the prompt as it was queued) runs again through a
`kiln` binary here. On the GPU machine this is the CUDA path of every node and family the suite covers, on tiny
synthetic files; `bench/device.sh` runs it as its `templates` part.

    bench/templates-replay.py --kiln PATH --replay replay.json --inputs ROOT --work DIR --out results.json
                              [--budget SECONDS] [--timeout SECONDS]

`--inputs` is where the images and videos the prompts load are found, by their repository-relative paths (the
repository root, or the folder `bench/device-pack.sh` packed them into). Templates run in the order that covers
the most node types first, so a budget cut short still reaches most of them. The results (each template's outcome,
its seconds and, where it failed, the node and the message; the device the server computed on) are rewritten
after every template, with each PNG's min, max and mean; `one_value_images` names the templates whose saved
(not preview) PNGs hold a single value, what a NaN upstream typically leaves (on the CPU, with the suite's tiny
files and input image, none does). Only the standard library: the GPU machine's Python has no extra packages.
"""
import argparse
import json
import math
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path


def tone_wav(rate, seconds):
    """A mono 16-bit PCM WAV of `seconds` of a 440 Hz tone at `rate` Hz (as run.mjs writes it)."""
    samples = rate * seconds
    pcm = b"".join(
        struct.pack("<h", round(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(samples)
    )
    header = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt "
    header += struct.pack("<IHHIIHH", 16, 1, 1, rate, 2 * rate, 2, 16)
    return header + b"data" + struct.pack("<I", len(pcm)) + pcm


def png_stats(data):
    """(min, max, mean) of a PNG's 8-bit samples, or None for a PNG this does not read (16-bit, palette,
    interlaced). A NaN or infinity anywhere upstream typically leaves an image of one value."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    pos, idat, header = 8, [], None
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + size]
        pos += 12 + size
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        return None
    width, height, depth, color, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace:
        return None
    raw, stride = zlib.decompress(b"".join(idat)), width * channels
    prev, lo, hi, total = bytearray(stride), 255, 0, 0
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):  # the scanline's filter undone (PNG spec, section 9)
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        lo, hi, total, prev = min(lo, min(line)), max(hi, max(line)), total + sum(line), line
    return lo, hi, round(total / (width * height * channels), 2)


def breadth_first(templates):
    """The templates ordered so that each next one adds the most node types not yet run (ties by name)."""
    left = sorted(templates, key=lambda t: t["name"])
    seen, order = set(), []
    while left:
        best = max(left, key=lambda t: len({n["class_type"] for n in t["prompt"].values()} - seen))
        left.remove(best)
        order.append(best)
        seen |= {n["class_type"] for n in best["prompt"].values()}
    return order


class Kiln:
    """A `kiln` server on a fresh data folder, its log in `log`."""

    def __init__(self, binary, data, log):
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--data-dir", str(data), "--disable-front-end"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # A byte that is not UTF-8 must not stop the reader: a full pipe would block the server's logging.
            encoding="utf-8",
            errors="replace",
        )
        found = threading.Event()
        self.url = None

        def pump():
            with open(log, "w") as out:
                for line in self.proc.stderr:
                    out.write(line)
                    out.flush()
                    m = re.search(r"listening on (http://\S+)", line)
                    if m and not found.is_set():
                        self.url = m.group(1)
                        found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        found.wait(120)
        if self.url is None:
            self.stop()
            raise SystemExit(f"kiln did not start listening (see {log})")

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.load(r)

    def post(self, path, body):
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                body = r.read()  # /interrupt and /queue answer 200 with an empty body
                return r.status, json.loads(body) if body.strip() else {}
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"error": {"message": text[:300]}}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def prepare(steps, kiln_binary, data, inputs, written, deadline):
    """Writes what `steps` name (run.mjs's `preparations`) into `data`, each file once, by `deadline` (a time);
    None or why not."""
    for step in steps:
        key = step.get("key") or step["to"]
        if key in written:
            continue
        if "synth" in step:
            args = [kiln_binary, "model", "synth", "--size", "tiny", "--models-dir", str(data / "models")]
            left = max(1.0, deadline - time.time())
            done = subprocess.run(args + step["synth"], capture_output=True, text=True, timeout=left)
            if done.returncode != 0:
                return f"kiln model synth {' '.join(step['synth'])}: {done.stderr.strip()[-300:]}"
        else:
            path = data / step["to"]
            path.parent.mkdir(parents=True, exist_ok=True)
            if "copy" in step:
                shutil.copyfile(inputs / step["copy"], path)
            else:
                path.write_bytes(tone_wav(step["tone"]["rate"], step["tone"]["seconds"]))
        written.add(key)
    return None


def run(kiln, prompt, output_nodes, timeout):
    """Queues `prompt` and waits for its history: (outcome, detail, the history entry if there is one)."""
    status, answer = kiln.post("/api/prompt", {"prompt": prompt, "client_id": "kiln-templates-replay"})
    if status != 200:
        errors = "; ".join(
            f"{node} ({e.get('class_type')}): " + "; ".join(f"{x['message']}: {x['details']}" for x in e["errors"])
            for node, e in (answer.get("node_errors") or {}).items()
        )
        return "failed", f"prompt refused ({status}): {answer.get('error', {}).get('message')} {errors}".strip(), None
    pid = answer["prompt_id"]
    end = time.time() + timeout
    while True:
        entry = kiln.get(f"/api/history/{pid}").get(pid)
        if entry:
            break
        if time.time() > end:
            kiln.post("/api/interrupt", {"prompt_id": pid})
            kiln.post("/api/queue", {"delete": [pid]})
            # The next template waits behind it until the interrupt lands (between nodes or steps).
            settle = time.time() + 60
            while kiln.get("/api/queue").get("queue_running") and time.time() < settle:
                time.sleep(0.25)
            return "failed", f"no result within {timeout:.0f} s (interrupted)", None
        time.sleep(0.25)
    if entry["status"]["status_str"] != "success":
        error = next((m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"), None)
        where = f"{error['node_type']} ({error['node_id']}): " if error else ""
        return "failed", where + (error["exception_message"] if error else entry["status"]["status_str"]), entry
    silent = [f"{i} ({n['class_type']})" for i, n in prompt.items() if n["class_type"] in output_nodes and i not in entry["outputs"]]
    if silent:
        return "failed", "no output from " + ", ".join(silent), entry
    return "ran", None, entry


def image_stats(kiln, entry):
    """Each PNG the run saved: its file and its samples' min, max and mean (`png_stats`)."""
    stats = []
    for output in entry["outputs"].values():
        for image in output.get("images", []):
            if not image.get("filename", "").endswith(".png"):
                continue
            query = urllib.parse.urlencode({k: image.get(k, "") for k in ("filename", "subfolder", "type")})
            with urllib.request.urlopen(f"{kiln.url}/api/view?{query}", timeout=30) as r:
                found = png_stats(r.read())
            if found:
                kind = image.get("type", "output")
                stats.append({"file": image["filename"], "type": kind, "min": found[0], "max": found[1], "mean": found[2]})
    return stats


def stop_on_signal(signum, frame):
    """The first SIGINT or SIGTERM stops the replay (its server stopped, its report written); later ones (`timeout`
    signals the command and then its process group) are ignored, so they cannot cut that short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    signal.signal(signal.SIGINT, stop_on_signal)
    signal.signal(signal.SIGTERM, stop_on_signal)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kiln", required=True)
    p.add_argument("--replay", required=True, type=Path)
    p.add_argument("--inputs", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--budget", type=float, default=600.0, help="seconds in all; no template starts after")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a template may run")
    a = p.parse_args()
    start = time.time()
    replay = json.loads(a.replay.read_text())
    shutil.rmtree(a.work, ignore_errors=True)
    data = a.work / "data"
    data.mkdir(parents=True)
    kiln = Kiln(a.kiln, data, a.work / "kiln.log")
    report = {"packages": replay.get("packages"), "templates": [], "not_reached": []}
    order = breadth_first(replay["templates"])
    try:
        report["devices"] = kiln.get("/api/system_stats").get("devices")
        info = kiln.get("/api/object_info")
        output_nodes = {name for name, spec in info.items() if spec.get("output_node")}
        written = set()
        for template in order:
            left = a.budget - (time.time() - start)
            if left < 10:
                break
            begun = time.time()
            try:
                why = prepare(template["steps"], a.kiln, data, a.inputs, written, begun + left - 5)
                left = a.budget - (time.time() - start)
                outcome, detail, entry = ("failed", why, None) if why else run(kiln, template["prompt"], output_nodes, max(1.0, min(a.timeout, left)))
                images = image_stats(kiln, entry) if entry else []
            except Exception as e:  # noqa: BLE001 - the replay's job is to report each template, whatever failed
                outcome, detail, images = "failed", f"{type(e).__name__}: {e}", []
            seconds = round(time.time() - begun, 2)
            # Saved images only: a preview (temp) of a mask or of an edge map of the flat input image is of one
            # value on the CPU too.
            one = [i["file"] for i in images if i["min"] == i["max"] and i["type"] == "output"]
            report["templates"].append(
                {"name": template["name"], "outcome": outcome, "detail": detail, "seconds": seconds, "images": images}
            )
            if one:
                report.setdefault("one_value_images", {})[template["name"]] = one
            flat = f" (images of one value: {', '.join(one)})" if one else ""
            print(f"{template['name']}: {outcome}{': ' + detail if detail else ''} ({seconds} s){flat}", flush=True)
            report["seconds"] = round(time.time() - start, 1)
            a.out.write_text(json.dumps(report, indent=1) + "\n")
            if kiln.proc.poll() is not None:
                report["server_exit"] = kiln.proc.returncode
                break
    finally:
        kiln.stop()
        # Whatever stopped the loop, the templates it did not reach are named.
        done = {t["name"] for t in report["templates"]}
        report["not_reached"] = [t["name"] for t in order if t["name"] not in done]
        ran = sum(t["outcome"] == "ran" for t in report["templates"])
        report["ran"] = ran
        report["seconds"] = round(time.time() - start, 1)
        a.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"ran {ran} of {len(report['templates'])} replayed ({len(report['not_reached'])} not reached) in {report['seconds']} s")
    return 0 if ran == len(report["templates"]) and not report["not_reached"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        print(f"stopped by {stopped}; the report holds what ran")
        sys.exit(130)
