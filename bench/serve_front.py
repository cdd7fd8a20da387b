"""`vitkit serve --workers 2`, its two designs in one interleaved run: the front (one process
owns the socket, HTTP and the batching; two model processes pull batches) against the shared
socket (`--worker-mode socket`: two whole servers the kernel hands connections to). For the
MNIST model and B/16 (random weights, fp32): req/s and p99 at 1, 8 and 64 keep-alive clients,
/health p99 meanwhile (a separate process probing every 50 ms), the CPU-seconds each of the two
processes that run forwards spent (load balance), and the requests lost when process 1 (a
worker, or a model process) is killed with SIGKILL under 8 clients. `--designs
front,socket,one` adds one process (no --workers) to the same interleaved rounds.

    python bench/serve_front.py --rounds 2 --seconds 6 --models mnist,B/16
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import b16_checkpoint, mnist_checkpoint  # noqa: E402
from serve_http import ROOT, run_clients, start_server  # noqa: E402
from serve_workers import cpu  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
PIDS = {
    "front": r"model process (\d+) ready \(pid (\d+)\)",
    "socket": r"worker (\d+) listening \(pid (\d+)\)",
}


def server(ck: Path, design: str) -> tuple[Any, int]:
    """``design``: front or socket (--workers 2), or one (one process, no --workers)."""
    workers = [] if design == "one" else ["--workers", "2", "--worker-mode", design]
    return start_server(
        ["-m", "vitkit", "serve", str(ck), "--port", "0", *workers, "--max-batch", "32",
         "--max-wait-ms", "5", "--timeout", "0", "--precision", "fp32"],
    )  # fmt: skip


def stop(proc: Any) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)


def forward_pids(proc: Any, design: str) -> dict[int, int]:
    if design == "one":
        return {1: proc.pid}
    found = (re.search(PIDS[design], ln) for ln in proc.output)
    return {int(m.group(1)): int(m.group(2)) for m in found if m}


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _probe(port: int, seconds: float, out: Any) -> None:
    """GET /health every 50 ms for ``seconds``: the latencies (ms) to ``out``."""
    import http.client

    lat, until = [], time.perf_counter() + seconds
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while time.perf_counter() < until:
        start = time.perf_counter()
        try:
            conn.request("GET", "/health")
            conn.getresponse().read()
            lat.append((time.perf_counter() - start) * 1000)
        except OSError:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        time.sleep(0.05)
    out.send(lat)


def measure(port: int, pids: dict[int, int], clients: int, seconds: float, req: Any) -> dict:
    import numpy as np

    here, there = multiprocessing.Pipe()
    prober = multiprocessing.get_context("fork").Process(target=_probe, args=(port, seconds, there))
    before = {i: cpu_seconds(p) for i, p in pids.items()}
    prober.start()
    t = asyncio.run(run_clients(port, clients, seconds, req))
    health = here.recv()
    prober.join()
    used = {i: round(cpu_seconds(p) - before[i], 2) for i, p in pids.items()}
    s = t.summary()
    return {
        "req_per_s": s["requests_per_s"],
        "p99_ms": s["p99_ms"],
        "failed": s["failed"],
        "health_p99_ms": round(float(np.percentile(health, 99)), 2) if health else None,
        "cpu_s": used,
    }


def kill_run(ck: Path, design: str, req: Any, seconds: float) -> dict:
    proc, port = server(ck, design)
    try:
        pid = forward_pids(proc, design)[1]

        async def go() -> Any:
            load = asyncio.ensure_future(run_clients(port, 8, seconds, req))
            await asyncio.sleep(seconds / 3)
            os.kill(pid, signal.SIGKILL)
            return await load

        t = asyncio.run(go())
        s = t.summary()
        return {"answered": s["ok"], "lost": s["failed"], "errors": sorted(set(t.errors))[:3]}
    finally:
        stop(proc)


def images(model: str) -> list[bytes]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    side, mode = (28, (28, 28)) if model == "mnist" else (224, (224, 224, 3))
    out = []
    for _ in range(16):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, mode, dtype=np.uint8)).save(b, "PNG")
        out.append(b.getvalue())
    assert side
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0, help="per client count (B/16: x2)")
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--models", default="mnist,B/16")
    ap.add_argument("--designs", default="front,socket", help="front, socket, one")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_front"))
    args = ap.parse_args()
    import numpy as np

    counts = [int(c) for c in args.clients.split(",")]
    designs = tuple(args.designs.split(","))
    work = Path(tempfile.gettempdir())
    out: dict[str, Any] = {"cpu": cpu(), "load_before": os.getloadavg()[0], "models": {}}
    for model in args.models.split(","):
        ck = work / ("vitkit-bench-mnist" if model == "mnist" else "vitkit-bench-b16")
        if not ck.exists():
            (mnist_checkpoint if model == "mnist" else b16_checkpoint)(ck)
        pngs = images(model)
        req = lambda i, p=pngs: ("POST", "/v1/classify", p[i % 16], {"Content-Type": "image/png"})  # noqa: E731
        seconds = args.seconds * (1 if model == "mnist" else 2)
        runs: dict[str, list[dict]] = {d: [] for d in designs}
        for r in range(args.rounds):
            for design in designs if r % 2 == 0 else designs[::-1]:
                proc, port = server(ck, design)
                try:
                    pids = forward_pids(proc, design)
                    asyncio.run(run_clients(port, 8, 2, req))  # (warm)
                    runs[design].append(
                        {str(c): measure(port, pids, c, seconds, req) for c in counts}
                    )
                finally:
                    stop(proc)
        kills = {d: kill_run(ck, d, req, 3 * seconds / 2) for d in designs if d != "one"}
        out["models"][model] = {"runs": runs, "kill_9": kills}
        print(json.dumps(out["models"][model]), flush=True)
    out["load_after"] = os.getloadavg()[0]
    Path(args.out + ".json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        "# vitkit serve --workers 2: the front against the shared socket",
        "",
        f"`python bench/serve_front.py {' '.join(sys.argv[1:])}` on {out['cpu']}, load "
        f"average {out['load_before']:.1f} before, {out['load_after']:.1f} after. fp32, "
        "--max-batch 32, --max-wait-ms 5, no deadline; medians of the interleaved rounds. "
        "CPU-s: what each of the two processes that run forwards (model processes, or "
        "workers) spent at 8 clients; /health p99: a probe every 50 ms meanwhile.",
        "",
        "| model | clients | "
        + " | ".join(f"{d} req/s | {d} p99 ms | {d} /health p99 ms" for d in designs)
        + "".join(f" | front / {d}" for d in designs if d != "front" and "front" in designs)
        + " |",
        "| --- | --- |" + " --- |" * (3 * len(designs) + ("front" in designs) * (len(designs) - 1)),
    ]
    for model, found in out["models"].items():
        for c in counts:

            def med(design: str, key: str, c: int = c, runs: dict = found["runs"]) -> float:
                vals = [run[str(c)][key] for run in runs[design]]
                vals = [v for v in vals if v is not None]
                return float(np.median(vals)) if vals else float("nan")

            cells = [
                f"{med(d, 'req_per_s'):.1f} | {med(d, 'p99_ms'):.0f} | "
                f"{med(d, 'health_p99_ms'):.1f}"
                for d in designs
            ]
            if "front" in designs:
                f = med("front", "req_per_s")
                cells += [f"{f / med(d, 'req_per_s'):.2f}x" for d in designs if d != "front"]
            lines.append(f"| {model} | {c} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | design | CPU-s of process 1 / 2 at 8 clients (each round) | SIGKILL of "
        "process 1 under 8 clients: lost / answered |",
        "| --- | --- | --- | --- |",
    ]
    for model, found in out["models"].items():
        for d in designs:
            if d == "one":
                continue
            shares = "; ".join(
                " / ".join(str(v) for _, v in sorted(run["8"]["cpu_s"].items()))
                for run in found["runs"][d]
                if "8" in run
            )
            k = found["kill_9"][d]
            lines.append(f"| {model} | {d} | {shares} | {k['lost']} / {k['answered']} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
