"""`vitkit serve` against LitServe (batching built in, inference in a worker process), and
against the code before (--baseline-src), serving the same model (the default MNIST ViT and
B/16 at 224 px, random weights, PyTorch fp32) with the same batching (up to 32 images, 5 ms
wait), the same concurrent clients on localhost: the bench's own asyncio client, then wrk (an
outside load generator, where installed) at the same connection count. vitkit runs with its
defaults otherwise (every bound on). Stacks are started one at a time, in alternating order,
over several rounds; figures are each stack's over all its rounds, the server's CPU time a
request, and ratios to LitServe.

    python bench/serve_stacks.py --rounds 3 --seconds 6 --baseline-src ../baseline/src
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
from vitkit.serve.request_images import Limits
import base64

class VitAPI(ls.LitAPI):
    def setup(self, device):
        argv = ["serve", sys.argv[1], "--precision", "fp32"]
        self.served = served_model(build_parser().parse_args(argv))
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


def image_png(model: str) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    shape = (28, 28) if model == "mnist" else (256, 320, 3)
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, shape, dtype=np.uint8)).save(
        buf, format="PNG"
    )
    return buf.getvalue()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` and its descendants have used, the
    exited ones that were waited for included (/proc/PID/stat)."""
    total, todo, tick = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # (it exited meanwhile)
            continue
    return total


def vitkit_server(ckpt: Path, src: Path) -> Any:
    """``vitkit serve`` from the tree ``src`` with its defaults (every bound: --timeout 30,
    decode processes, queue and body limits), the batching of the other stacks."""
    argv = ["-m", "vitkit", "serve", str(ckpt), "--port", "0", "--max-batch", str(MAX_BATCH),
            "--max-wait-ms", str(WAIT_MS), "--precision", "fp32"]  # fmt: skip
    return lambda: start_server(argv, env={"PYTHONPATH": str(src)})


def stack_rows(model: str, work: Path, script: Path, clients: list[int], args: Any) -> list:
    """Every stack at every client count on ``model``: the bench client's figures (all
    rounds merged), wrk's beside them where installed, the server's CPU seconds a request,
    and the ratios to LitServe's."""
    from bench_models import b16_checkpoint, mnist_checkpoint  # noqa: PLC0415
    from serve_scenarios import wrk  # noqa: PLC0415

    make = mnist_checkpoint if model == "mnist" else b16_checkpoint
    ckpt = make(work / model.replace("/", ""))
    png = image_png(model)
    raw = ("POST", "/v1/classify", png, {"Content-Type": "image/png"})
    as_json = json.dumps({"image": base64.b64encode(png).decode()}).encode()
    js = ("POST", "/v1/classify", as_json, {"Content-Type": "application/json"})

    def ok(body: bytes, i: int) -> bool:
        return b'"label"' in body

    every = {
        "vitkit": vitkit_server(ckpt, ROOT / "src"),
        "litserve": lambda: start_litserve(ckpt, "pipe", script),
        "litserve_zmq": lambda: start_litserve(ckpt, "zmq", script),
    }
    if args.baseline_src:
        every["vitkit_before"] = vitkit_server(ckpt, Path(args.baseline_src))
    stacks = {k: every[k] for k in args.stacks.split(",") if k in every}
    body = {k: js if k.startswith("litserve") else raw for k in stacks}
    tallies: dict[str, dict[int, list[Tally]]] = {s: {c: [] for c in clients} for s in stacks}
    wrks: dict[str, dict[int, list[Any]]] = {s: {c: [] for c in clients} for s in stacks}
    cpu: dict[str, dict[int, list[float]]] = {s: {c: [] for c in clients} for s in stacks}
    loads: list[float] = []
    for r in range(args.rounds):
        order = list(stacks) if r % 2 == 0 else list(reversed(stacks))
        for name in order:
            proc, port = stacks[name]()
            try:
                req = body[name]
                asyncio.run(run_clients(port, 4, 1.0, lambda i, req=req: req))  # warm-up
                for c in clients:
                    loads.append(os.getloadavg()[0])
                    before = tree_cpu_s(proc.pid)
                    t = asyncio.run(run_clients(port, c, args.seconds, lambda i, req=req: req, ok))
                    used = tree_cpu_s(proc.pid) - before
                    tallies[name][c].append(t)
                    cpu[name][c].append(used / max(len(t.latencies), 1))
                    w = wrk(port, c, args.seconds, req[2], req[3]["Content-Type"])
                    wrks[name][c].append(w)
                    s = t.summary()
                    print(f"{model} round {r + 1} {name:13s} {c:3d} clients: "
                          f"{s['requests_per_s']} req/s p50 {s['p50_ms']} ms p99 {s['p99_ms']} ms "
                          f"failed {s['failed']}; {1000 * cpu[name][c][-1]:.2f} CPU-ms a "
                          f"request; wrk {w}", flush=True)  # fmt: skip
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
            runs = [w for w in wrks[name][c] if w and "requests_per_s" in w]
            wrk_row = {
                "wrk_requests_per_s": round(sum(w["requests_per_s"] for w in runs) / len(runs), 2)
                if runs else None,
                "wrk_p99_ms": max(w["p99_ms"] for w in runs) if runs else None,
                "wrk_failed": sum(w["failed"] for w in runs) if runs else None,
            }  # fmt: skip
            cpu_ms = round(1000 * sum(cpu[name][c]) / len(cpu[name][c]), 3)
            rows.append({"model": model, "stack": name, "clients": c, **merged.summary(),
                         "server_cpu_ms_per_request": cpu_ms, **wrk_row})  # fmt: skip
    base = {r["clients"]: r for r in rows if r["stack"] == "litserve"}
    for r in rows:
        b = base.get(r["clients"])
        if b is None:
            continue
        r["throughput_vs_litserve"] = round(r["requests_per_s"] / b["requests_per_s"], 3)
        r["p50_vs_litserve"] = round(r["p50_ms"] / b["p50_ms"], 3)
        r["p99_vs_litserve"] = round(r["p99_ms"] / b["p99_ms"], 3)
        if r["wrk_requests_per_s"] and b["wrk_requests_per_s"]:
            r["wrk_vs_litserve"] = round(r["wrk_requests_per_s"] / b["wrk_requests_per_s"], 3)
    for r in rows:
        r["load_average_range"] = [round(min(loads), 2), round(max(loads), 2)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", default="1,8,64", help="client counts on the MNIST model")
    ap.add_argument("--b16-clients", default="1,8", help="client counts on B/16")
    ap.add_argument("--models", default="mnist,B/16")
    ap.add_argument(
        "--stacks",
        default="vitkit,litserve,vitkit_before",
        help="of vitkit, litserve, litserve_zmq, vitkit_before (--baseline-src)",
    )
    ap.add_argument("--baseline-src", help="another vitkit tree's src: the stack vitkit_before")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_stacks"))
    args = ap.parse_args()  # fmt: skip
    from vitkit.hardware import cpu_name

    work = Path(tempfile.mkdtemp(prefix="serve-stacks-"))
    script = work / "litserve_server.py"
    script.write_text(LITSERVE_SERVER % {"batch": MAX_BATCH, "wait": WAIT_MS / 1000})
    rows = []
    for model in args.models.split(","):
        clients = args.clients if model == "mnist" else args.b16_clients
        rows += stack_rows(model, work, script, [int(c) for c in clients.split(",")], args)
    loads = [x for r in rows for x in r["load_average_range"]]
    record = {
        "cpu": cpu_name(),
        "load_average": [min(loads), max(loads)],
        "models": "the default MNIST ViT (width 64, depth 6, 4 heads, patch 7) and B/16 at 224 "
        "px (1000 classes), random weights, PyTorch fp32",
        "batching": {"max_batch": MAX_BATCH, "max_wait_ms": WAIT_MS},
        "rounds": args.rounds,
        "seconds": args.seconds,
        "command": "python bench/serve_stacks.py " + " ".join(sys.argv[1:]),
        "rows": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    models = record["models"][0].upper() + record["models"][1:]
    lines = [
        "# Server stacks: vitkit serve against LitServe",
        "",
        f"CPU: {record['cpu']}; load average (1 min) {min(loads):.1f}-{max(loads):.1f} during "
        f"the runs (the host is shared). {models}; batches of up to {MAX_BATCH} "
        f"images, {WAIT_MS:g} ms wait; {args.rounds} rounds of {args.seconds:g} s per stack "
        "and client count, stacks one at a time in alternating order; clients on keep-alive "
        "connections on localhost (one asyncio process, the bench's own client). vitkit: "
        "`vitkit serve` with its defaults otherwise (30 s --timeout, decode processes, every "
        "bound), raw PNG body; vitkit_before: the same from the code before; LitServe 0.2.19: "
        "base64 PNG in JSON (its documented way), the model in its worker process, pipe queue "
        "(litserve_zmq: ZeroMQ). CPU-ms a request: the server's process tree's CPU time over "
        "the run / requests answered. wrk columns where wrk is installed (one thread, as many "
        "connections as clients).",
        "",
        f"Command: `{record['command']}`",
        "",
        "| model | stack | clients | req/s | p50 ms | p99 ms | failed | CPU-ms a request "
        "| req/s vs LitServe | p99 vs LitServe | wrk req/s | wrk p99 ms |",
        "| --- | --- |" + " ---: |" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['stack']} | {r['clients']} | {r['requests_per_s']} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['failed']} | "
            f"{r['server_cpu_ms_per_request']} | {r.get('throughput_vs_litserve')} | "
            f"{r.get('p99_vs_litserve')} | {r['wrk_requests_per_s']} | {r['wrk_p99_ms']} |"
        )
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
