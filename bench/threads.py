"""Thread settings on a small CPU machine: OpenMP wait policy x intra-op threads.

Each setting runs in its own process (``OMP_WAIT_POLICY`` is read when OpenMP starts), timing
every training step of a model (default: the MNIST recipe's, batch 128, bf16). Settings are
interleaved round by round so machine noise hits all alike. Reports the median step, the slowest
step (stalls from spinning threads show up there) and images/s; writes JSON and a table.

    python bench/threads.py                            # MNIST model, ACTIVE/PASSIVE x 1/2 threads
    python bench/threads.py --threads 1,2 --rounds 5 --steps 40
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
from vitkit.config import model_config
from vitkit.model import VisionTransformer
from vitkit.recipes import MNIST_MODEL
from vitkit.train.optim import build_optimizer
threads, steps, batch = map(int, sys.argv[1:4])
bf16 = sys.argv[4] == "bf16"
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = model_config("Ti/4", num_classes=10, in_chans=1, image_size=28, **MNIST_MODEL)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--policies", default="ACTIVE,PASSIVE")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "threads"))
    args = ap.parse_args()
    settings = [(p, int(t)) for p in args.policies.split(",") for t in args.threads.split(",")]
    steps: dict[tuple[str, int], list[float]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for policy, threads in settings:
            env = {**os.environ, "OMP_WAIT_POLICY": policy, "PYTHONPATH": str(ROOT / "src")}
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    WORKER,
                    str(threads),
                    str(args.steps),
                    str(args.batch),
                    args.precision,
                ],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            steps[(policy, threads)] += json.loads(out.strip().splitlines()[-1])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for (policy, threads), ts in steps.items():
        med = statistics.median(ts)
        rows.append(
            {
                "omp_wait_policy": policy,
                "threads": threads,
                "median_step_s": med,
                "p95_step_s": sorted(ts)[int(0.95 * (len(ts) - 1))],
                "max_step_s": max(ts),
                "images_per_s": args.batch / med,
                "steps": ts,
            }
        )
    best = max(rows, key=lambda r: r["images_per_s"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: getattr(args, k) for k in ("precision", "batch", "steps", "rounds")}
    meta["cpu_count"] = os.cpu_count()
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"MNIST-model training step ({args.precision}, batch {args.batch}), {args.rounds} rounds "
        f"x {args.steps} steps per setting, each in its own process, interleaved",
        "",
        "| OMP_WAIT_POLICY | threads | median step | p95 step | slowest step | images/s "
        "| vs best |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['omp_wait_policy']} | {r['threads']} | {1e3 * r['median_step_s']:.0f} ms | "
            f"{1e3 * r['p95_step_s']:.0f} ms | {1e3 * r['max_step_s']:.0f} ms | "
            f"{r['images_per_s']:.0f} | {r['images_per_s'] / best['images_per_s']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
