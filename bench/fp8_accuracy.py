"""Does ``--precision fp8`` cost accuracy? Short training runs on one GPU, same steps: bf16 and
fp8 with each of ``--seeds`` seeds (a seed fixes the initial weights and the data order, so
fp8 seed s is paired with bf16 seed s). Float8 passes when
- loss: its curve stays as close to its bf16 pair as two bf16 seeds stay to each other (mean
  absolute gap over the logged steps, averaged over the pairs: fp8's <= the seeds'), and
- accuracy: the fp8 runs' mean test top-1 is within the bf16 seeds' range (max - min) of the
  bf16 runs' mean.

The model has ViT-B's layer widths (768 wide, MLP 3072, 12 heads) so that the default float8
choice (Linear layers of at least 2**20 weights: qkv and the MLP) applies as in B/16, 6 blocks
deep, on MNIST (patch 4: 50 tokens), eager (the numbers, not the speed, are the point here).

    python bench/fp8_accuracy.py --device cuda --out bench/results/fp8_accuracy
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vitkit.train.train_config import TrainConfig  # noqa: E402

WIDE = {"width": 768, "depth": 6, "num_heads": 12, "mlp_dim": 3072, "patch_size": 4}


def runs(seeds: int) -> list[tuple[str, int]]:
    """bf16 first (the baseline a float8 failure is judged against), then fp8, seed by seed."""
    return [(p, s) for p in ("bf16", "fp8") for s in range(seeds)]


def run_config(args: argparse.Namespace, precision: str, seed: int, out: Path) -> TrainConfig:
    return TrainConfig(
        data=args.data,
        model="Ti/4",
        model_overrides=WIDE,
        epochs=args.epochs,
        batch_size=256,
        lr=args.lr,
        warmup_steps=50,
        precision=precision,  # type: ignore[arg-type]
        seed=seed,
        device=args.device,
        out_dir=str(out / f"{precision}_seed{seed}"),
        log_every=args.log_every,
        progress=False,
        run_plots=False,
        max_steps=args.max_steps,
    )


def losses(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    return [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]


def mean_gap(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> float:
    """Mean |a - b| over the steps both logged."""
    other = dict(b)
    gaps = [abs(loss - other[step]) for step, loss in a if step in other]
    if not gaps:
        raise ValueError("the two runs logged no step in common")
    return statistics.fmean(gaps)


def verdict(curves: dict[str, list], top1: dict[str, float]) -> dict:
    """fp8's distance from its bf16 pairs against the bf16 seeds' own spread (loss, accuracy)."""
    seeds = sorted(int(k.removeprefix("bf16_seed")) for k in curves if k.startswith("bf16_"))
    if len(seeds) < 2:
        raise ValueError("the seeds' spread needs at least two bf16 seeds")
    bf16 = {s: curves[f"bf16_seed{s}"] for s in seeds}
    fp8 = {s: curves[f"fp8_seed{s}"] for s in seeds if f"fp8_seed{s}" in curves}
    if not fp8:
        raise ValueError("no fp8 run to judge")
    seeds_gap = statistics.fmean(
        mean_gap(bf16[a], bf16[b]) for i, a in enumerate(seeds) for b in seeds[i + 1 :]
    )
    fp8_gap = statistics.fmean(mean_gap(fp8[s], bf16[s]) for s in fp8)
    bf16_top1 = [top1[f"bf16_seed{s}"] for s in seeds]
    fp8_top1 = [top1[f"fp8_seed{s}"] for s in fp8]
    seeds_range = max(bf16_top1) - min(bf16_top1)
    top1_gap = abs(statistics.fmean(fp8_top1) - statistics.fmean(bf16_top1))
    return {
        "seeds": len(seeds),
        "loss_gap_bf16_seeds": seeds_gap,
        "loss_gap_fp8_vs_bf16": fp8_gap,
        "top1_mean_bf16": statistics.fmean(bf16_top1),
        "top1_mean_fp8": statistics.fmean(fp8_top1),
        "top1_range_bf16_seeds": seeds_range,
        "top1_gap_fp8_vs_bf16": top1_gap,
        "loss_within_seed_spread": fp8_gap <= seeds_gap,
        # one test image of 10,000 is 1e-4: a tie within that counts as within
        "top1_within_seed_spread": top1_gap <= max(seeds_range, 1e-4),
    }


def plot(curves: dict[str, list], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, points in curves.items():
        ax.plot(*zip(*points), label=name.replace("_", " "), lw=1)
    ax.set(xlabel="step", ylabel="training loss", yscale="log", title="bf16 vs fp8 (same steps)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    from vitkit.train.trainer import Trainer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data", default="mnist")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3, help="bf16 and fp8 runs per seed (>= 2)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "fp8_accuracy"))
    args = ap.parse_args()
    if args.seeds < 2:
        ap.error("--seeds: at least 2 (the bf16 seeds' spread is the yardstick)")
    out = Path(args.out)
    runs_dir = out.parent / (out.name + "_runs")
    curves: dict[str, list] = {}
    top1: dict[str, float] = {}
    seconds: dict[str, float] = {}
    layers: dict[str, int] = {}
    for precision, seed in runs(args.seeds):
        name = f"{precision}_seed{seed}"
        start = time.perf_counter()
        trainer = Trainer(run_config(args, precision, seed, runs_dir))
        report = trainer.fit()
        seconds[name] = time.perf_counter() - start
        layers[name] = len(getattr(trainer, "fp8_layers", []))
        curves[name] = losses(runs_dir / name)
        top1[name] = float(report.get("test_top1", report.get("val_top1", "nan")))
        print(f"{name}: top-1 {top1[name]:.4f}, {seconds[name]:.0f} s", file=sys.stderr)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "model": {"base": "Ti/4", **WIDE},
        "float8_layers": layers,
        "top1": top1,
        "seconds": seconds,
        "verdict": verdict(curves, top1),
        "curves": curves,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(curves, out.with_suffix(".png"))
    v = result["verdict"]
    lines = [
        f"{result['device']}; torch {torch.__version__}; `{result['command']}`",
        "",
        "| run | float8 layers | test top-1 | seconds |",
        "| --- | ---: | ---: | ---: |",
        *(f"| {n} | {layers[n]} | {top1[n]:.4f} | {seconds[n]:.0f} |" for n in top1),
        "",
        f"- mean |loss gap| over the logged steps: bf16 seeds against each other "
        f"{v['loss_gap_bf16_seeds']:.4f}; fp8 against bf16 of the same seed "
        f"{v['loss_gap_fp8_vs_bf16']:.4f}: "
        f"{'within' if v['loss_within_seed_spread'] else 'OUTSIDE'} the seeds' spread",
        f"- test top-1: bf16 mean {v['top1_mean_bf16']:.4f} (seeds' range "
        f"{v['top1_range_bf16_seeds']:.4f}), fp8 mean {v['top1_mean_fp8']:.4f}: gap "
        f"{v['top1_gap_fp8_vs_bf16']:.4f}, "
        f"{'within' if v['top1_within_seed_spread'] else 'OUTSIDE'} the seeds' range",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
