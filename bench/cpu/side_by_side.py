"""One API-format graph through a running ComfyUI-compatible server (Kiln or ComfyUI itself), timed from the
outside the same way for both: the figures of a side-by-side run (bench/cpu/side-by-side.sh starts the servers;
bench/results/2026-12-05-comfyui-side-by-side-cpu.md).

    python3 bench/cpu/side_by_side.py run --url http://127.0.0.1:8188 --pid PID --graph GRAPH.json \
        --seeds 1,2 --label comfyui --out DIR
    python3 bench/cpu/side_by_side.py compare DIR_A DIR_B      # needs Pillow and numpy

`run` queues the graph once per seed (the first prompt is cold: loaders and text encodes run; later ones are
warm, since both servers cache the outputs of unchanged nodes), follows each prompt on the server's WebSocket,
and writes DIR/report.json and DIR/<seed>/*.png (the images the prompt saved, fetched through /view):
- `seconds`: queue to `execution_success`;
- `nodes`: each executed node's seconds, from its `executing` message to the next one;
- `steps`: for each node that reported progress (the samplers), the seconds of each step, from the node's start
  or the previous `progress` message;
- `rss`: the server process's peak resident memory in GiB over the prompt, sampled from /proc/PID/status every
  50 ms, as anonymous and file-backed pages apart (a server that maps weight files in place has them counted
  as file pages, which the kernel can drop; a copy in the heap is anonymous), and `VmHWM`, the kernel's peak.
`seed` and `noise_seed` inputs of every node are set to the prompt's seed. Only the standard library is used.

`compare` prints, for each PNG of DIR_A's first seed with a namesake in DIR_B's, the PSNR of the 8-bit RGB
values in dB and the largest difference (ComfyUI's reference install notes: >= 50 dB is the aim, identical
files are infinite).
"""

import argparse
import base64
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid


class WebSocket:
    """A client end of RFC 6455, enough to read a server's text messages: frames unmasked from the server,
    control frames answered, binary ones (previews) skipped."""

    def __init__(self, url):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port or 80))
        key = base64.b64encode(os.urandom(16)).decode()
        path = parts.path + ("?" + parts.query if parts.query else "")
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("the server closed the connection during the WebSocket handshake")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise ConnectionError(f"WebSocket upgrade refused: {status.decode(errors='replace')}")

    def _exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the server closed the WebSocket")
            data += chunk
        return data

    def _send(self, opcode, payload):
        mask = os.urandom(4)
        header = bytes([0x80 | opcode])
        if len(payload) < 126:
            header += bytes([0x80 | len(payload)])
        else:
            header += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def receive(self):
        """The next text message, as a string."""
        message, kind = b"", None
        while True:
            first, second = self._exact(2)
            opcode = first & 0x0F
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(length)
            if opcode == 0x8:
                raise ConnectionError("the server closed the WebSocket")
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            if opcode != 0x0:
                message, kind = b"", opcode
            message += payload
            if first & 0x80:
                if kind == 0x1:
                    return message.decode()
                message = b""


class RssSampler(threading.Thread):
    """The peak of a process's anonymous and file-backed resident pages, sampled until stopped."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0, "VmHWM": 0}
        self.running = True

    def read(self):
        values = {}
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in self.peak:
                    values[name] = int(rest.split()[0]) * 1024
        return values

    def run(self):
        while self.running:
            try:
                for name, value in self.read().items():
                    self.peak[name] = max(self.peak[name], value)
            except OSError:
                return
            time.sleep(0.05)

    def stop(self):
        self.running = False
        self.join()
        return {name.lower(): round(value / 2**30, 3) for name, value in self.peak.items()}


def post_json(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def get_json(url):
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def seeded(graph, seed):
    """The graph with every node's `seed` and `noise_seed` input set to `seed` (links left as they are)."""
    graph = json.loads(json.dumps(graph))
    for node in graph.values():
        for name in ("seed", "noise_seed"):
            if isinstance(node.get("inputs", {}).get(name), int):
                node["inputs"][name] = seed
    return graph


def follow(ws, prompt_id, queued):
    """Reads the WebSocket until `prompt_id` ends: its node and step times, and the outcome."""
    nodes, steps, order = {}, {}, []
    current, current_start, last_progress = None, None, {}
    while True:
        message = json.loads(ws.receive())
        now = time.perf_counter()
        kind, data = message.get("type"), message.get("data") or {}
        if data.get("prompt_id") not in (None, prompt_id):
            continue
        if kind == "executing":
            if current is not None:
                nodes[current] = nodes.get(current, 0.0) + now - current_start
            current, current_start = data.get("node"), now
            if current is not None:
                order.append(current)
                last_progress[current] = now
            else:
                return {"seconds": now - queued, "nodes": nodes, "order": order, "steps": steps, "ok": True}
        elif kind == "progress" and data.get("node") is not None:
            node = data["node"]
            steps.setdefault(node, []).append(now - last_progress.get(node, now))
            last_progress[node] = now
        elif kind == "execution_success":
            if current is not None:
                nodes[current] = nodes.get(current, 0.0) + now - current_start
            return {"seconds": now - queued, "nodes": nodes, "order": order, "steps": steps, "ok": True}
        elif kind in ("execution_error", "execution_interrupted"):
            return {"seconds": now - queued, "nodes": nodes, "order": order, "steps": steps, "ok": False,
                    "error": data}


def fetch_images(url, prompt_id, directory):
    """Saves the prompt's output images (its history's `images` entries of type output) into `directory`."""
    history = get_json(f"{url}/history/{prompt_id}").get(prompt_id, {})
    saved = []
    os.makedirs(directory, exist_ok=True)
    for node_id, output in sorted(history.get("outputs", {}).items()):
        for image in output.get("images", []):
            if image.get("type") != "output":
                continue
            query = urllib.parse.urlencode({k: image.get(k, "") for k in ("filename", "subfolder", "type")})
            name = f"{node_id}_{len(saved):03d}.png"
            with urllib.request.urlopen(f"{url}/view?{query}") as response:
                with open(os.path.join(directory, name), "wb") as file:
                    file.write(response.read())
            saved.append(name)
    return saved


def run(args):
    with open(args.graph) as file:
        graph = json.load(file)
    client_id = str(uuid.uuid4())
    ws_url = args.url.replace("http://", "ws://", 1) + f"/ws?clientId={client_id}"
    ws = WebSocket(ws_url)
    prompts = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        sampler = RssSampler(args.pid)
        sampler.start()
        queued = time.perf_counter()
        answer = post_json(f"{args.url}/prompt", {"prompt": seeded(graph, seed), "client_id": client_id})
        prompt_id = answer["prompt_id"]
        outcome = follow(ws, prompt_id, queued)
        outcome["rss_gib"] = sampler.stop()
        outcome["seed"] = seed
        outcome["images"] = fetch_images(args.url, prompt_id, os.path.join(args.out, str(seed)))
        prompts.append(outcome)
        print(json.dumps({"label": args.label, "seed": seed, "seconds": round(outcome["seconds"], 2),
                          "ok": outcome["ok"], "rss_gib": outcome["rss_gib"]}), file=sys.stderr)
        if not outcome["ok"]:
            break
    report = {"label": args.label, "url": args.url, "graph": os.path.basename(args.graph),
              "threads": os.cpu_count(), "prompts": prompts}
    with open(os.path.join(args.out, "report.json"), "w") as file:
        json.dump(report, file, indent=1)


def compare(args):
    import numpy as np
    from PIL import Image

    def first_seed(directory):
        seeds = sorted(d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d)))
        return os.path.join(directory, seeds[0])

    a, b = first_seed(args.a), first_seed(args.b)
    rows = []
    for name in sorted(os.listdir(a)):
        if not name.endswith(".png") or not os.path.exists(os.path.join(b, name)):
            continue
        x = np.asarray(Image.open(os.path.join(a, name)).convert("RGB"), dtype=np.float64)
        y = np.asarray(Image.open(os.path.join(b, name)).convert("RGB"), dtype=np.float64)
        if x.shape != y.shape:
            rows.append({"image": name, "error": f"shapes differ: {x.shape} and {y.shape}"})
            continue
        mse = float(np.mean((x - y) ** 2))
        psnr = float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
        rows.append({"image": name, "psnr_db": round(psnr, 2), "max_diff": int(np.max(np.abs(x - y)))})
    print(json.dumps(rows, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--url", required=True)
    r.add_argument("--pid", type=int, required=True, help="the server's process, for its resident memory")
    r.add_argument("--graph", required=True, help="an API-format graph (JSON)")
    r.add_argument("--seeds", default="1,2")
    r.add_argument("--label", default="")
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = parser.parse_args()
    run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    main()
