"""Which server stack `vitkit serve` is built on: LitServe (batching built in, inference in a
worker process) against FastAPI + uvicorn with vitkit's request-coalescing queue
(vitkit.serve.batcher, inference on a thread of the server process), serving the same model
(the default MNIST ViT, random weights) with the same batching (up to 32 images, 5 ms wait),
the same concurrent clients on localhost. Stacks are started one at a time, in alternating
order, over several rounds; figures are each stack's over all its rounds, and ratios.

    python bench/serve_stacks.py --rounds 2 --seconds 6 --clients 8,64
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_http import ROOT, Tally, run_clients, start_server  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(ROOT / "src"))
MAX_BATCH, WAIT_MS = 32, 5.0

LITSERVE_SERVER = """
import sys, litserve as ls
from vitkit.cli import build_parser
from vitkit.cli.serve import served_model
from vitkit.serve.served_model import Limits
import base64

class VitAPI(ls.LitAPI):
    def setup(self, device):
        self.served = served_model(build_parser().parse_args(["serve", sys.argv[1]]))
        self.served.warm_up(%(batch)d)
        self.limits = Limits()
    def decode_request(self, request):
        return self.served.prepare(base64.b64decode(request["image"]), self.limits)
    def batch(self, inputs):
        return list(inputs)
    def predict(self, x):
        return list(self.served.probabilities(x))
    def unbatch(self, output):
        return output
    def encode_response(self, p):
        return {"top_k": self.served.top_k(p[None], 5)[0]}

if __name__ == "__main__":
    api = VitAPI(max_batch_size=%(batch)d, batch_timeout=%(wait)f, api_path="/v1/classify")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1,
                          fast_queue=sys.argv[3] == "zmq")
    server.run(host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
               generate_client_file=False)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_litserve(ckpt: Path, queue: str, script: Path) -> tuple[Any, int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ckpt), str(port), queue],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, preexec_fn=os.setsid,
    )  # fmt: skip
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("LitServe did not start")


def stop(proc: Any) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", default="8,64")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_stacks"))
    args = ap.parse_args()
    import numpy as np
    from bench_models import mnist_checkpoint  # noqa: PLC0415
    from PIL import Image

    from vitkit.hardware import cpu_name

    clients = [int(c) for c in args.clients.split(",")]
    work = Path(tempfile.mkdtemp(prefix="serve-stacks-"))
    ckpt = mnist_checkpoint(work / "mnist")
    buf = __import__("io").BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8)).save(
        buf, format="PNG"
    )
    png = buf.getvalue()
    script = work / "litserve_server.py"
    script.write_text(LITSERVE_SERVER % {"batch": MAX_BATCH, "wait": WAIT_MS / 1000})
    raw = ("POST", "/v1/classify", png, {"Content-Type": "image/png"})
    as_json = json.dumps({"image": base64.b64encode(png).decode()}).encode()
    js = ("POST", "/v1/classify", as_json, {"Content-Type": "application/json"})

    def ok(body: bytes, i: int) -> bool:
        return b'"label"' in body

    stacks = {
        "fastapi": lambda: start_server(
            [
                "-m",
                "vitkit",
                "serve",
                str(ckpt),
                "--port",
                "0",
                "--max-batch",
                str(MAX_BATCH),
                "--max-wait-ms",
                str(WAIT_MS),
            ]
        ),  # fmt: skip
        "litserve": lambda: start_litserve(ckpt, "pipe", script),
        "litserve_zmq": lambda: start_litserve(ckpt, "zmq", script),
    }
    body = {"fastapi": raw, "litserve": js, "litserve_zmq": js}
    tallies: dict[str, dict[int, list[Tally]]] = {s: {c: [] for c in clients} for s in stacks}
    for r in range(args.rounds):
        order = list(stacks) if r % 2 == 0 else list(reversed(stacks))
        for name in order:
            proc, port = stacks[name]()
            try:
                req = body[name]
                asyncio.run(run_clients(port, 4, 1.0, lambda i, req=req: req))  # warm-up
                for c in clients:
                    t = asyncio.run(run_clients(port, c, args.seconds, lambda i, req=req: req, ok))
                    tallies[name][c].append(t)
                    s = t.summary()
                    print(f"round {r + 1} {name:13s} {c:3d} clients: {s['requests_per_s']} req/s "
                          f"p50 {s['p50_ms']} ms p95 {s['p95_ms']} ms failed {s['failed']}",
                          flush=True)  # fmt: skip
            finally:
                stop(proc)
    rows = []
    for name in stacks:
        for c in clients:
            merged = Tally()
            for t in tallies[name][c]:
                merged.latencies += t.latencies
                merged.errors += t.errors
                merged.seconds += t.seconds
                for k, v in t.statuses.items():
                    merged.statuses[k] = merged.statuses.get(k, 0) + v
            rows.append({"stack": name, "clients": c, **merged.summary()})
    base = {r["clients"]: r for r in rows if r["stack"] == "fastapi"}
    for r in rows:
        b = base[r["clients"]]
        r["throughput_vs_fastapi"] = round(r["requests_per_s"] / b["requests_per_s"], 3)
        r["p50_vs_fastapi"] = round(r["p50_ms"] / b["p50_ms"], 3)
        r["p95_vs_fastapi"] = round(r["p95_ms"] / b["p95_ms"], 3)
    record = {
        "cpu": cpu_name(),
        "model": "the default MNIST ViT (width 64, depth 6, 4 heads, patch 7; random weights)",
        "batching": {"max_batch": MAX_BATCH, "max_wait_ms": WAIT_MS},
        "rounds": args.rounds,
        "seconds": args.seconds,
        "command": "python bench/serve_stacks.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    lines = [
        "# Server stacks: LitServe against FastAPI + uvicorn",
        "",
        f"CPU: {record['cpu']}. {record['model']}; batches of up to {MAX_BATCH} images, "
        f"{WAIT_MS:g} ms wait; {args.rounds} rounds of {args.seconds:g} s per stack and client "
        "count, stacks one at a time in alternating order; clients on keep-alive connections "
        "on localhost (one asyncio process). FastAPI: `vitkit serve` (raw PNG body); LitServe "
        "0.2.19 (base64 PNG in JSON, its documented way; pipe or ZeroMQ queue).",
        "",
        f"Command: `{record['command']}`",
        "",
        "| stack | clients | req/s | p50 ms | p95 ms | p99 ms | failed | req/s vs FastAPI "
        "| p50 vs FastAPI | p95 vs FastAPI |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['stack']} | {r['clients']} | {r['requests_per_s']} | {r['p50_ms']} | "
            f"{r['p95_ms']} | {r['p99_ms']} | {r['failed']} | {r['throughput_vs_fastapi']} | "
            f"{r['p50_vs_fastapi']} | {r['p95_vs_fastapi']} |"
        )
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
