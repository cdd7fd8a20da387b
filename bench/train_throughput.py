"""Training throughput of a recipe's model: images/s per optimizer step, fp32 vs bf16.

Measures the model's forward + backward + AdamW step on random data of the recipe's shape (the
data pipeline is excluded), interleaving the settings round by round so that machine noise hits
all of them alike, and reports medians. Writes JSON and a markdown table.

    python bench/train_throughput.py                      # the default MNIST recipe
    python bench/train_throughput.py --recipe mnist --threads 1,2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from vitkit.models.vit import VisionTransformer  # noqa: E402
from vitkit.registry.counts import count_flops  # noqa: E402
from vitkit.registry.model_config import model_config  # noqa: E402
from vitkit.train.optim import build_optimizer  # noqa: E402
from vitkit.train.recipes import get_recipe  # noqa: E402


def step_time(model: VisionTransformer, opt: torch.optim.Optimizer, x, y, bf16: bool, n: int):
    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="mnist")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per measurement")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()

    recipe = get_recipe(args.recipe).config
    cfg = model_config(
        recipe.model, num_classes=10, in_chans=1, image_size=28, **recipe.model_overrides
    )
    model = VisionTransformer(cfg)
    opt = build_optimizer(model, "adamw", 1e-3, 0.05)
    b = recipe.batch_size
    x = torch.randn(b, cfg.in_chans, *cfg.image_size)
    y = torch.randint(0, cfg.num_classes, (b,))
    settings = [(t, bf16) for t in map(int, args.threads.split(",")) for bf16 in (False, True)]
    times: dict[tuple[int, bool], list[float]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for threads, bf16 in settings:
            torch.set_num_threads(threads)
            times[(threads, bf16)].append(step_time(model, opt, x, y, bf16, args.steps))
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    train_flops = 3 * count_flops(cfg) * b  # forward + backward (2x forward)
    rows = []
    for (threads, bf16), ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {
                "threads": threads,
                "precision": "bf16" if bf16 else "fp32",
                "median_step_s": med,
                "images_per_s": b / med,
                "gflops_per_s": train_flops / med / 1e9,
                "all_step_s": ts,
            }
        )
    for row in rows:
        fp32 = next(r for r in rows if r["threads"] == row["threads"] and r["precision"] == "fp32")
        row["speedup_vs_fp32"] = row["images_per_s"] / fp32["images_per_s"]
    result = {
        "recipe": args.recipe,
        "model_config": cfg.to_dict(),
        "batch_size": b,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"train_throughput_{args.recipe}.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"Training step, recipe `{args.recipe}` (batch {b}), median of {args.rounds} rounds",
        "",
        "| threads | precision | images/s | GFLOP/s | vs fp32 |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['precision']} | {r['images_per_s']:.0f} | "
            f"{r['gflops_per_s']:.1f} | {r['speedup_vs_fp32']:.2f}x |"
        )
    table = "\n".join(lines) + "\n"
    (out / f"train_throughput_{args.recipe}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
