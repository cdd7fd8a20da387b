"""The bf16 training step on the CPU, each library as it trains, and where the time goes.

vitkit and timm hold the same network and weights (bench/speed.py's ``build``). A step is bf16
autocast forward, cross-entropy, backward and the optimizer's step, with each library's own
optimizer: vitkit's trainer's (``vitkit.train.optim.build_optimizer``: fused AdamW on the CPU
from 1 M parameters) and timm's (``timm.optim.create_optimizer_v2("adamw")``, PyTorch's AdamW at
its CPU default, one parameter at a time); a third row gives timm's model vitkit's optimizer, to
separate the model's share from the optimizer's. Rows interleaved in a shuffled order each round,
medians, each step timed by phase (forward, backward, optimizer). Then one forward + backward
of each model is profiled (``torch.profiler``, self CPU time per op), grouped into matmuls
(oneDNN's bf16 GEMMs: forward, and the two of each backward), attention, casts and copies, and
the rest (LayerNorm, GELU, adds), so a ratio comes with the reason for its size. The host's
bf16 matmul ceiling (bench/ceilings.py) is measured in the same run.

    python bench/train_step_bf16.py --models S/16,B/16 --batch 8 --rounds 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from ceilings import bf16_ceilings  # noqa: E402
from references import import_reference  # noqa: E402
from speed import build, model_cfg  # noqa: E402

from vitkit.hardware import cpu_name  # noqa: E402
from vitkit.registry.counts import count_flops  # noqa: E402
from vitkit.train.optim import build_optimizer  # noqa: E402

GROUPS = (  # (group, substrings of the op's name), first match wins
    ("matmul", ("mm", "linear", "matmul", "mkldnn", "convolution")),
    ("attention", ("attention", "flash", "softmax")),
    ("casts and copies", ("copy_", "_to_copy", "clone", "contiguous")),
)


def group_of(op: str) -> str:
    for name, keys in GROUPS:
        if any(k in op for k in keys):
            return name
    return "other"


def stepper(model: torch.nn.Module, opt: torch.optim.Optimizer, x, y):
    """A step that returns the seconds of its phases: forward, backward, optimizer."""

    def step() -> dict[str, float]:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2}

    return step


def profile(model: torch.nn.Module, x, y) -> dict[str, float]:
    """Self CPU milliseconds of one forward + backward (no optimizer), by op group."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CPU]) as p:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    out: dict[str, float] = defaultdict(float)
    for e in p.key_averages():
        out[group_of(e.key)] += e.self_cpu_time_total / 1e3
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="S/16,B/16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/train_step_bf16"))
    args = ap.parse_args()
    timm = import_reference("timm")
    timm_optim = importlib.import_module("timm.optim")

    ceiling = bf16_ceilings()
    results = []
    for name in args.models.split(","):
        cfg = model_cfg(name)
        models = build(name, torch.device("cpu"), {"timm"})
        torch.manual_seed(1)
        x = torch.randn(args.batch, cfg.in_chans, *cfg.image_size)
        y = torch.randint(cfg.num_classes, (args.batch,))
        for m in models.values():
            m.train()
        steps = {
            "vitkit (its trainer's optimizer)": stepper(
                models["vitkit"], build_optimizer(models["vitkit"], "adamw", 1e-4, 0.05), x, y
            ),
            "timm (timm's optimizer)": stepper(
                models["timm"],
                timm_optim.create_optimizer_v2(models["timm"], "adamw", lr=1e-4, weight_decay=0.05),
                x,
                y,
            ),
        }
        steps["timm with vitkit's optimizer"] = stepper(
            models["timm"], build_optimizer(models["timm"], "adamw", 1e-4, 0.05), x, y
        )
        for s in steps.values():  # warm-up: oneDNN primitives, optimizer state
            s()
        times: dict[str, list[dict[str, float]]] = {k: [] for k in steps}
        rng = random.Random(0)
        for r in range(args.rounds):
            order = list(steps)
            rng.shuffle(order)
            for k in order:
                times[k].append(steps[k]())
            print(f"{name} round {r}: " + ", ".join(
                f"{k} {sum(times[k][-1].values()):.2f} s" for k in order), flush=True)  # fmt: skip
        profiles = {
            "vitkit": profile(models["vitkit"], x, y),
            "timm": profile(models["timm"], x, y),
        }
        flops = 3 * count_flops(cfg) * args.batch

        def med(k: str, phase: str | None = None, times: dict = times) -> float:
            return statistics.median(
                sum(t.values()) if phase is None else t[phase] for t in times[k]
            )

        timm_s = med("timm (timm's optimizer)")
        for k in steps:
            sec = med(k)
            results.append(
                {
                    "model": name,
                    "batch": args.batch,
                    "step": k,
                    "seconds": sec,
                    "phases_s": {ph: med(k, ph) for ph in ("forward", "backward", "optimizer")},
                    "images_per_s": args.batch / sec,
                    "x_timm": timm_s / sec,
                    "of_bf16_ceiling": flops / sec / ceiling["bf16"],
                    "times": times[k],
                }
            )
        results[-3]["profile_ms"] = profiles["vitkit"]
        results[-2]["profile_ms"] = profiles["timm"]
    ceiling_after = bf16_ceilings()["bf16"]
    meta = {
        "cpu": cpu_name(),
        "command": "python bench/train_step_bf16.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "timm": timm.__version__,
        "bf16_ceiling_gflop_s_before_after": [ceiling["bf16"] / 1e9, ceiling_after / 1e9],
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": results}, indent=1))
    out.with_suffix(".md").write_text(report(meta, results))
    print(report(meta, results))


def report(meta: dict, rows: list[dict]) -> str:
    c = meta["bf16_ceiling_gflop_s_before_after"]
    groups = [g for g, _ in GROUPS] + ["other"]
    lines = [
        "# bf16 training step on the CPU: vitkit and timm as each trains",
        "",
        f"CPU: {meta['cpu']}. torch {meta['torch']}, timm {meta['timm']}. Command: "
        f"`{meta['command']}` (rounds interleaved in a shuffled order, median; the same weights "
        f"and batch). bf16 matmul ceiling measured in the run (before / after): {c[0]:.0f} / "
        f"{c[1]:.0f} GFLOP/s; 'of ceiling': analytic FLOPs (3x forward) / time over the "
        "ceiling measured before.",
        "",
        "| model | batch | step | s | forward s | backward s | optimizer s | images/s | x timm "
        "| of ceiling |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['batch']} | {r['step']} | {r['seconds']:.2f} | "
        + " | ".join(f"{r['phases_s'][ph]:.2f}" for ph in ("forward", "backward", "optimizer"))
        + f" | {r['images_per_s']:.2f} | {r['x_timm']:.2f} | {100 * r['of_bf16_ceiling']:.0f} % |"
        for r in rows
    ]
    lines += [
        "",
        "## Where the forward and backward's time goes (self CPU ms of one, profiled)",
        "",
        "| model | model's step | " + " | ".join(groups) + " | all |",
        "| --- | --- | " + " | ".join("---:" for _ in groups) + " | ---: |",
    ]
    for r in rows:
        if "profile_ms" not in r:
            continue
        p = r["profile_ms"]
        total = sum(p.values())
        cells = [f"{p.get(g, 0):.0f} ({100 * p.get(g, 0) / total:.0f} %)" for g in groups]
        lines.append(f"| {r['model']} | {r['step']} | " + " | ".join(cells) + f" | {total:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
