"""CPU attention: PyTorch's fused kernel against plain matmuls + softmax, and what it buys.

``Attention.forward`` on the CPU (eager) computes softmax(q k^T / sqrt(d)) v with plain matmuls
for sequences of at most ``EXPLICIT_CPU_MAX_TOKENS`` tokens over at least
``EXPLICIT_CPU_MIN_ROWS`` (batch x heads) rows, and calls ``scaled_dot_product_attention``
otherwise. This bench measures both on the attention alone, over a table of shapes (inference
and forward + backward), and on whole training steps of the MNIST recipes' models (forward,
backward, clipping, AdamW) with the rule switched off and on, interleaved round by round;
medians. Writes JSON and a markdown table.

    python bench/cpu_attention.py                 # about 3 minutes on 2 cores
    python bench/cpu_attention.py --rounds 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import vitkit.models.cpu_attention as routing  # noqa: E402
import vitkit.models.vit as vm  # noqa: E402
from vitkit.hardware import cpu_name  # noqa: E402
from vitkit.registry.model_config import model_config  # noqa: E402
from vitkit.train.optim import build_optimizer  # noqa: E402
from vitkit.train.recipes import get_recipe  # noqa: E402

SHAPES = [  # [batch, heads, tokens, head dim]
    (128, 4, 17, 16),  # the default MNIST model's training batch (patch 7)
    (128, 4, 50, 16),  # mnist-best's (49 tokens + class token)
    (128, 3, 50, 32),  # mnist-long's (width 96)
    (64, 3, 65, 64),  # Ti/4 on 32 px (CIFAR)
    (16, 4, 50, 16),
    (4, 4, 50, 16),
    (1, 4, 50, 16),
    (32, 3, 197, 64),  # Ti/16 at 224 px
    (32, 12, 197, 64),  # B/16 at 224 px
]
RECIPES = ["mnist", "mnist-best", "mnist-long"]


def median_ms(fn: Callable[[], object], n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(-1) @ v


def attention_row(shape: tuple[int, int, int, int], rounds: int) -> dict:
    q, k, v = (torch.randn(shape) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    g = torch.randn(shape)
    n = 5 if shape[2] > 128 else 20
    runs: dict[str, list[float]] = {}
    for _ in range(rounds):
        with torch.inference_mode():
            runs.setdefault("infer_fused", []).append(
                median_ms(lambda: F.scaled_dot_product_attention(q, k, v), n)
            )
            runs.setdefault("infer_explicit", []).append(median_ms(lambda: explicit(q, k, v), n))
        runs.setdefault("train_fused", []).append(
            median_ms(lambda: F.scaled_dot_product_attention(qg, kg, vg).backward(g), n)
        )
        runs.setdefault("train_explicit", []).append(
            median_ms(lambda: explicit(qg, kg, vg).backward(g), n)
        )
    row: dict = {"shape": list(shape)}
    row.update({k: statistics.median(v) for k, v in runs.items()})
    b, h, t, _ = shape
    row["routed_explicit"] = routing.plain_cpu_attention(b * h, t)
    return row


def training_steps(rounds: int, steps: int) -> list[dict]:
    setups = []
    for name in RECIPES:
        r = get_recipe(name).config
        cfg = model_config(r.model, num_classes=10, in_chans=1, image_size=28, **r.model_overrides)
        torch.manual_seed(0)
        model = vm.VisionTransformer(cfg)
        opt = build_optimizer(model, "adamw", 1e-3, 0.05)
        x, y = torch.randn(r.batch_size, 1, 28, 28), torch.randint(0, 10, (r.batch_size,))
        setups.append((name, model, opt, x, y))
    limit = routing.EXPLICIT_CPU_MAX_TOKENS
    speeds: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(rounds):
            for name, model, opt, x, y in setups:

                def step(model=model, opt=opt, x=x, y=y) -> None:
                    loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                for mode, lim in (("fused", 0), ("explicit", limit)):
                    routing.EXPLICIT_CPU_MAX_TOKENS = lim
                    step()
                    t = time.perf_counter()
                    for _ in range(steps):
                        step()
                    speeds.setdefault((name, mode), []).append(
                        x.shape[0] * steps / (time.perf_counter() - t)
                    )
    finally:
        routing.EXPLICIT_CPU_MAX_TOKENS = limit
    out = []
    for name, *_ in setups:
        fused = statistics.median(speeds[(name, "fused")])
        expl = statistics.median(speeds[(name, "explicit")])
        out.append({"recipe": name, "fused_img_s": fused, "explicit_img_s": expl})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8, help="timed training steps per measurement")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results/cpu_attention")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [attention_row(s, args.rounds) for s in SHAPES]
    steps = training_steps(args.rounds, args.steps)
    meta = {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "rounds": args.rounds,
        "rule": {
            "max_tokens": routing.EXPLICIT_CPU_MAX_TOKENS,
            "min_rows": routing.EXPLICIT_CPU_MIN_ROWS,
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "attention": shapes, "training_steps": steps}, indent=1)
    )
    lines = [
        "# CPU attention: fused kernel vs plain matmuls",
        "",
        f"CPU: {meta['cpu']} ({args.threads} threads, OMP_WAIT_POLICY="
        f"{meta['omp_wait_policy']}), torch {torch.__version__}, fp32, medians of "
        f"{args.rounds} interleaved rounds. Command: `python bench/cpu_attention.py "
        f"--rounds {args.rounds} --threads {args.threads}`. vitkit routes to plain matmuls when "
        f"tokens <= {routing.EXPLICIT_CPU_MAX_TOKENS} and batch x heads >= "
        f"{routing.EXPLICIT_CPU_MIN_ROWS} (eager CPU).",
        "",
        "## Attention alone (ms; speed-up = fused / explicit time)",
        "",
        "| [batch, heads, tokens, head dim] | inference fused | explicit | speed-up "
        "| fwd+bwd fused | explicit | speed-up | vitkit uses |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in shapes:
        lines.append(
            f"| {r['shape']} | {r['infer_fused']:.2f} | {r['infer_explicit']:.2f} | "
            f"{r['infer_fused'] / r['infer_explicit']:.2f}x | {r['train_fused']:.2f} | "
            f"{r['train_explicit']:.2f} | {r['train_fused'] / r['train_explicit']:.2f}x | "
            f"{'explicit' if r['routed_explicit'] else 'fused'} |"
        )
    lines += [
        "",
        "## Whole training steps (random data, images/s)",
        "",
        "| recipe's model | fused everywhere | as routed | speed-up |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in steps:
        lines.append(
            f"| {r['recipe']} | {r['fused_img_s']:.0f} | {r['explicit_img_s']:.0f} | "
            f"{r['explicit_img_s'] / r['fused_img_s']:.2f}x |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
