"""The event loop's CPU time a request of `vitkit serve` on the MNIST model: the application
(its Guard, routes, decode, batcher hand-off and answer) driven in-process through ASGI by
concurrent requests of a 28 x 28 PNG, the forward on the model's own thread as the server runs
it; `time.thread_time()` of the event loop's thread over the requests, so the figure is the
HTTP side's cost a request without the socket and the HTTP parser. Each tree (the current one,
and a baseline's `src` with --baseline) runs in a process of its own, in alternating order.

    python bench/serve_request_cpu.py --rounds 3 --baseline ../baseline/src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CHILD = r"""
import asyncio, io, json, sys, time
import numpy as np
from PIL import Image
from vitkit.cli import build_parser
from vitkit.cli.serve import served_model, server_settings
from vitkit.serve.http_app import build_app

ckpt, concurrency, requests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
args = build_parser().parse_args(["serve", ckpt, "--precision", "fp32", "--max-batch", "32",
                                  "--max-wait-ms", "5"])
served = served_model(args)
served.warm_up(32)
app = build_app(served, server_settings(args, None))
buf = io.BytesIO()
Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8)).save(
    buf, format="PNG")
png = buf.getvalue()
headers = [(b"host", b"x"), (b"content-type", b"image/png"),
           (b"content-length", str(len(png)).encode())]


async def one():
    sent, done = [], False
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/classify",
             "raw_path": b"/v1/classify", "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}

    async def receive():
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": png, "more_body": False}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    assert sent[0]["status"] == 200, sent


async def main():
    async with app.router.lifespan_context(app):
        async def client(n):
            for _ in range(n):
                await one()

        await asyncio.gather(*(client(200 // concurrency) for _ in range(concurrency)))
        each = requests // concurrency
        wall, cpu = time.perf_counter(), time.thread_time()
        await asyncio.gather(*(client(each) for _ in range(concurrency)))
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        n = each * concurrency
        print(json.dumps({"event_loop_cpu_us": round(1e6 * cpu / n, 1),
                          "requests_per_s": round(n / wall, 1), "requests": n}))


asyncio.run(main())
"""


def measure(src: Path, ckpt: Path, concurrency: int, requests: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ckpt), str(concurrency), str(requests)],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--baseline", help="another tree's src directory, measured alongside")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_request_cpu"))
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(ROOT / "src"))
    from bench_models import mnist_checkpoint

    from vitkit.hardware import cpu_name

    ckpt = mnist_checkpoint(Path(tempfile.mkdtemp(prefix="request-cpu-")) / "mnist")
    trees = {"current": ROOT / "src"}
    if args.baseline:
        trees["baseline"] = Path(args.baseline)
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
            runs[name].append(measure(trees[name], ckpt, args.concurrency, args.requests))
            print(name, runs[name][-1], flush=True)
    summary = {
        t: {k: round(sorted(x[k] for x in rs)[len(rs) // 2], 1)
            for k in ("event_loop_cpu_us", "requests_per_s")}
        for t, rs in runs.items()
    }  # fmt: skip
    load = os.getloadavg()
    record = {
        "cpu": cpu_name(),
        "load_average": load,
        "model": "the default MNIST ViT, random weights, PyTorch fp32, batches of up to 32, "
        "5 ms wait, a 28 x 28 PNG as the raw body",
        "concurrency": args.concurrency,
        "requests": args.requests,
        "rounds": args.rounds,
        "command": "python bench/serve_request_cpu.py " + " ".join(sys.argv[1:]),
        "median": summary,
        "runs": runs,
    }
    Path(args.out + ".json").write_text(json.dumps(record, indent=1))
    lines = [
        "# The event loop's CPU time a request",
        "",
        f"CPU: {record['cpu']}; load average {', '.join(f'{x:.2f}' for x in load)} at the "
        f"end. The default MNIST ViT, random weights, PyTorch fp32, batches of up to 32 "
        f"images (5 ms wait); {args.concurrency} concurrent requests of a 28 x 28 PNG (the raw "
        f"body) driven in-process through ASGI, {args.requests} timed per run after 200; "
        "`time.thread_time()` of the event loop's thread (the forward runs on the model's "
        f"thread, not counted); the median of {args.rounds} runs per tree, each in a process "
        "of its own, trees in alternating order. req/s here is in-process (no socket): it "
        "shows the cost, not a server's throughput.",
        "",
        f"Command: `{record['command']}`",
        "",
        "| tree | event loop CPU a request (us) | in-process req/s |",
        "| --- | ---: | ---: |",
    ]
    for t, s in summary.items():
        lines.append(f"| {t} | {s['event_loop_cpu_us']} | {s['requests_per_s']} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
