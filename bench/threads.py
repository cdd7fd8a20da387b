"""Thread settings on a small CPU machine: how OpenMP threads wait x intra-op threads, on a
quiet machine and on one where another process competes for a core.

PyTorch's CPU build runs its intra-op threads on GNU OpenMP (libgomp). Between parallel regions
an idle thread spins for ``GOMP_SPINCOUNT`` iterations before it sleeps: ``OMP_WAIT_POLICY``
``ACTIVE`` means spinning (almost) forever, ``PASSIVE`` not at all, and unset 300,000 iterations.
A wait setting here is ``ACTIVE``, ``PASSIVE``, ``unset``, or ``spin=N`` (``GOMP_SPINCOUNT=N``
with the policy unset).

Each setting runs in its own process (OpenMP reads its environment when it starts), timing every
training step of the default recipe's model (batch 256, bf16). Settings are interleaved round by
round so machine noise hits all alike. With ``--busy`` every measurement is also repeated while a
second process keeps one core busy (a shared machine). Reports the median step, the 95th
percentile and the slowest step (stalls from spinning threads show up there) and images/s;
writes JSON and a table.

    python bench/threads.py                            # ACTIVE/PASSIVE/unset x 1/2 threads
    python bench/threads.py --waits PASSIVE,spin=10000,unset --threads 2 --busy
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time, torch
import torch.nn.functional as F
from vitkit.registry.model_config import model_config
from vitkit.models.vit import VisionTransformer
from vitkit.train.recipes import MNIST
from vitkit.train.optim import build_optimizer
threads, steps, batch = map(int, sys.argv[1:4])
bf16 = sys.argv[4] == "bf16"
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = model_config(MNIST.model, num_classes=10, in_chans=1, image_size=28, **MNIST.model_overrides)
model = VisionTransformer(cfg)
opt = build_optimizer(model, "adamw", 1e-3, 0.05)
x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
times = []
for i in range(steps + 3):
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = F.cross_entropy(model(x).float(), y)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if i >= 3:
        times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def measure(wait: str, threads: int, args: argparse.Namespace) -> list[float]:
    """Step times of one fresh process with this wait setting and thread count."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    if wait.startswith("spin="):
        env["GOMP_SPINCOUNT"] = wait.removeprefix("spin=")
    elif wait != "unset":
        env["OMP_WAIT_POLICY"] = wait
    cmd = [sys.executable, "-c", WORKER, str(threads), str(args.steps), str(args.batch)]
    out = subprocess.run(
        [*cmd, args.precision], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--waits", default="ACTIVE,PASSIVE,unset")
    ap.add_argument("--busy", action="store_true", help="also measure beside a busy process")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "threads"))
    args = ap.parse_args()
    loads = ["quiet", "busy"] if args.busy else ["quiet"]
    settings = [
        (load, w, int(t))
        for load in loads
        for w in args.waits.split(",")
        for t in args.threads.split(",")
    ]
    steps: dict[tuple[str, str, int], list[float]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for load, wait, threads in settings:
            hog = None
            if load == "busy":  # another process spinning on one core
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                steps[(load, wait, threads)] += measure(wait, threads, args)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for (load, wait, threads), ts in steps.items():
        med = statistics.median(ts)
        rows.append(
            {
                "machine": load,
                "wait": wait,
                "threads": threads,
                "median_step_s": med,
                "p95_step_s": sorted(ts)[int(0.95 * (len(ts) - 1))],
                "max_step_s": max(ts),
                "images_per_s": args.batch / med,
                "steps": ts,
            }
        )
    best = {
        load: max((r for r in rows if r["machine"] == load), key=lambda r: r["images_per_s"])
        for load in loads
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("precision", "batch", "steps", "rounds", "busy")}
    meta["cpu_count"] = os.cpu_count()
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"MNIST-model training step ({args.precision}, batch {args.batch}), {args.rounds} rounds "
        f"x {args.steps} steps per setting, each in its own process, interleaved",
        "",
        "| machine | wait | threads | median step | p95 step | slowest step | images/s | vs best |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        rel = r["images_per_s"] / best[r["machine"]]["images_per_s"]
        lines.append(
            f"| {r['machine']} | {r['wait']} | {r['threads']} | "
            f"{1e3 * r['median_step_s']:.0f} ms | {1e3 * r['p95_step_s']:.0f} ms | "
            f"{1e3 * r['max_step_s']:.0f} ms | {r['images_per_s']:.0f} | {rel:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
