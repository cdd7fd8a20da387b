"""`vitkit serve --workers 2` (its default design) on the default MNIST ViT: one /metrics for the
server (20 scrapes after a known number of requests, each must read that number), the requests
lost when process 1 (a model process of the front, or a worker) is killed with SIGKILL under 8
keep-alive clients (the server must keep answering), and req/s at 8 clients against a baseline
source tree, interleaved.

    git archive BASE src | tar -x -C ../baseline
    python bench/serve_workers.py --rounds 2 --seconds 8 --kills 3 --baseline-src ../baseline/src
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import mnist_checkpoint  # noqa: E402
from serve_http import ROOT, run_clients, start_server  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
CLASSIFIED = 'vitkit_requests_total{route="/v1/classify",status="200"}'


def server(ck: Path, src: str) -> tuple[Any, int]:
    return start_server(
        ["-m", "vitkit", "serve", str(ck), "--port", "0", "--workers", "2", "--max-batch", "32",
         "--max-wait-ms", "5", "--timeout", "0"], env={"PYTHONPATH": src},
    )  # fmt: skip


def stop(proc: Any) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


def scraped(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        m = re.search(rf"^{re.escape(CLASSIFIED)} (\S+)$", r.read().decode(), re.M)
    return float(m.group(1)) if m else 0.0


def scrapes(ck: Path, src: str, png: bytes, sent: int = 40) -> list[float]:
    proc, port = server(ck, src)
    try:

        def one(_: int) -> int:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/classify", data=png,
                                         headers={"Content-Type": "image/png"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(one, range(sent))) == [200] * sent
        time.sleep(1.0)
        return [scraped(port) for _ in range(20)]
    finally:
        stop(proc)


def cpu() -> str:
    info = Path("/proc/cpuinfo").read_text()
    get = lambda k: re.search(rf"^{k}\s*: (.*)$", info, re.M).group(1)  # noqa: E731
    family = f"family {get('cpu family')}, model {get('model')}"
    return f"{get('model name')} ({family}), {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--baseline-src", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_workers"))
    args = ap.parse_args()
    import numpy as np
    from PIL import Image

    ck = Path(tempfile.gettempdir()) / "vitkit-bench-mnist"
    if not ck.exists():
        mnist_checkpoint(ck)
    rng = np.random.default_rng(0)
    pngs = []
    for _ in range(16):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)).save(b, "PNG")
        pngs.append(b.getvalue())
    req = lambda i: ("POST", "/v1/classify", pngs[i % 16], {"Content-Type": "image/png"})  # noqa: E731
    trees = {"current": str(ROOT / "src")}
    if args.baseline_src:
        trees["baseline"] = str(Path(args.baseline_src).resolve())
    out: dict[str, Any] = {"cpu": cpu(), "load_before": os.getloadavg()[0]}
    out["scrapes_after_40"] = {k: scrapes(ck, src, pngs[0]) for k, src in trees.items()}
    rates: dict[str, list[float]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for k in list(trees) if r % 2 == 0 else list(reversed(trees)):
            proc, port = server(ck, trees[k])
            asyncio.run(run_clients(port, 8, 2, req))
            t = asyncio.run(run_clients(port, 8, args.seconds, req))
            rates[k].append(len(t.latencies) / t.seconds)
            stop(proc)
    out["req_per_s_8_clients"] = rates
    kills = []
    for _ in range(args.kills):
        proc, port = server(ck, trees["current"])
        # (a model process of the front, or a worker of --worker-mode socket)
        found = (
            re.search(r"(?:model process|worker) (\d+) (?:ready|listening) \(pid (\d+)\)", ln)
            for ln in proc.output
        )
        pids = {int(m.group(1)): int(m.group(2)) for m in found if m}

        async def go(pid: int = pids[1], port: int = port) -> Any:
            load = asyncio.ensure_future(run_clients(port, 8, 12, req))
            await asyncio.sleep(4)
            os.kill(pid, signal.SIGKILL)
            return await load

        t = asyncio.run(go())
        kills.append({"answered": len(t.latencies), "lost": len(t.errors),
                      "errors": sorted(set(t.errors))})  # fmt: skip
        stop(proc)
    out["kill_9_worker_1_of_2"] = kills
    out["load_after"] = os.getloadavg()[0]
    Path(args.out + ".json").write_text(json.dumps(out, indent=1) + "\n")
    # (the baseline tree named as the docstring's command makes it, not by this machine's path)
    command = " ".join(sys.argv[1:]).replace(args.baseline_src or "\0", "../baseline/src")
    med = {k: float(np.median(v)) for k, v in rates.items()}
    lines = [
        "# vitkit serve --workers 2: one /metrics, a killed worker, req/s",
        "",
        f"`python bench/serve_workers.py {command}` on {out['cpu']}, load average "
        f"{out['load_before']:.1f} before, {out['load_after']:.1f} after. The MNIST model.",
        "",
        "| what | " + " | ".join(trees) + " |",
        "| --- | " + " | ".join("---" for _ in trees) + " |",
        "| 20 scrapes of /metrics after 40 requests (distinct values read) | "
        + " | ".join(str(sorted(set(out["scrapes_after_40"][k]))) for k in trees)
        + " |",
        "| req/s at 8 clients, median of interleaved runs | "
        + " | ".join(f"{med[k]:.0f} ({', '.join(f'{x:.0f}' for x in rates[k])})" for k in trees)
        + " |",
        "",
        "SIGKILL of process 1 (a model process, or a worker) after 4 s of 12 s under 8 keep-alive "
        "clients: " + "; ".join(f"{k['lost']} lost, {k['answered']} answered" for k in kills) + ".",
        "",
    ]
    if "baseline" in med:
        lines.append(f"req/s ratio current / baseline: {med['current'] / med['baseline']:.3f}")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
