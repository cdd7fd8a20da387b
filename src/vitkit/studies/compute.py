"""The paper's compute finding in miniature (Sec. 4.4, Figure 5): accuracy against training
compute for the three families, ViT, ResNet (BiT) and hybrids, at several sizes each.

"Vision Transformers dominate ResNets on the performance/compute trade-off. ViT uses
approximately 2-4x less compute to attain the same performance ... hybrids slightly outperform
ViT at small computational budgets, but the difference vanishes for larger models."
:func:`run_compute` trains every model of the study on the same training set for the same
budget (the paper trains all its Figure 5 models for the same 7 or 14 epochs of JFT), with
several seeds; each run's training compute is counted analytically,

    training FLOPs = 3 x forward FLOPs of one image (``count_flops``) x images seen,

(the backward pass costs about twice the forward), and :func:`write_compute` writes the table,
``results.json`` and ``compute.png`` (test top-1 against total training exaFLOPs, log x, one
line per family through its sizes). Runs live in ``OUT/runs/<model>/n<size>/seed<k>`` and are
reused as in every study (:mod:`vitkit.studies.common`). The full-size command (12 models x
3 seeds, the same 10 epochs of 100,000 images each; a GPU):

    vitkit study compute --data shapes-hard --train-size 100000 --seeds 3 --epochs 10 \
        --warmup-steps 200 --device cuda --out-dir runs/compute-shapes-hard

``--smoke`` runs it in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.errors import VitkitError
from vitkit.studies.common import (
    ModelSpec,
    RunResult,
    RunSpec,
    check_labels,
    mean_std,
    run_all,
    summarize,
    write_summary,
)
from vitkit.studies.measures import interpolate_log, json_ready
from vitkit.studies.study_defaults import COMPUTE_COMMAND, COMPUTE_MODELS
from vitkit.train.train_config import TrainConfig

DEFAULT_MODELS = COMPUTE_MODELS  # (vitkit.studies.study_defaults)
# --smoke: seconds on the 8x8 digits, two sizes of ViT so that a family has a line.
SMOKE_MODELS = (
    "Ti/2[width=16,depth=1,num_heads=2,mlp_dim=32,label=vit-s],"
    "Ti/2[width=32,depth=1,num_heads=2,mlp_dim=64,label=vit-m],"
    "bit_r26x1[layers=1,width_factor=0.125,root=small,label=bit],"
    "r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.125,width=16,depth=1,"
    "num_heads=2,mlp_dim=32,label=hybrid]"
)
FULL_COMMAND = COMPUTE_COMMAND
FULL_TRAIN_SIZE = {"mnist": 59_000, "shapes-hard": 100_000}
BACKWARD_FACTOR = 3  # forward + backward ~ 3 forwards (the usual count; the paper's too)


def compute_specs(base: TrainConfig, models: Sequence[ModelSpec], seeds: int) -> list[RunSpec]:
    """Every (seed, model) run on ``base``'s training set, seed-major."""
    if not models or seeds < 1:
        raise VitkitError("a compute study needs at least one model and one seed")
    check_labels(models)
    group = f"n{base.train_size}" if base.train_size is not None else "all"
    return [
        RunSpec(base, m, group, seed, info={"family": m.family})
        for seed in range(seeds)
        for m in models
    ]


def run_compute(
    base: TrainConfig, models: Sequence[ModelSpec], seeds: int, out_dir: str | Path
) -> list[RunResult]:
    """Train (or reuse) every run of the study; one result per run."""
    return run_all(compute_specs(base, models, seeds), out_dir)


def train_exaflops(result: RunResult, batch_size: int) -> float:
    """The run's training compute: 3 x forward FLOPs x images seen, in 10^18."""
    return BACKWARD_FACTOR * result.gflops * 1e9 * result.steps * batch_size / 1e18


def compute_rows(results: Sequence[RunResult], batch_size: int) -> list[dict[str, Any]]:
    """Mean ± std accuracy per model, with its family and mean training exaFLOPs."""
    rows = summarize(results, keep=("family",))
    for row in rows:
        mine = [r for r in results if (r.model, r.group) == (row["model"], row["group"])]
        row["train_exaflops"], row["train_exaflops_std"] = mean_std(
            [train_exaflops(r, batch_size) for r in mine]
        )
    return rows


def compute_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per model, grouped by family, in order of compute."""
    lines = [
        "| family | model | params | GFLOPs / image | steps | training exaFLOPs | test top-1 (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    families = list(dict.fromkeys(r["family"] for r in rows))
    for family in families:
        for r in sorted((x for x in rows if x["family"] == family), key=_compute_key):
            pm = f" ± {100 * r['std']:.2f}" if r["seeds"] > 1 else ""
            lines.append(
                f"| {family} | {r['model']} ({r['short_name']}) | {r['params']:,} | "
                f"{r['gflops']:.3g} | {r['mean_steps']:.0f} | {r['train_exaflops']:.3g} | "
                f"{100 * r['mean']:.2f}{pm} |"
            )
    seeds = sorted({r["seeds"] for r in rows})
    lines += [
        "",
        f"Mean ± sample std over {'/'.join(map(str, seeds))} seed(s). Training compute: "
        f"{BACKWARD_FACTOR} x the analytic forward FLOPs x images seen (steps x batch).",
    ]
    return "\n".join(lines)


def _compute_key(row: dict[str, Any]) -> float:
    return float(row["train_exaflops"])


def compute_verdict(rows: Sequence[dict[str, Any]], baseline: str = "ResNet") -> dict[str, Any]:
    """The numbers the compute verdict rests on (the paper's Fig. 5: at equal pre-training
    compute ViT is ahead of the ResNets, hybrids ahead at small budgets).

    For every model of another family whose training compute lies inside the ``baseline``
    family's range, its mean accuracy minus the baseline family's at the same compute (the
    baseline's curve interpolated linearly in log compute), in the order of compute; empty
    where the study has no baseline family or fewer than two of its models.
    """
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        curves.setdefault(str(r["family"]), []).append((r["train_exaflops"], r["mean"]))
    gaps: dict[str, list[dict[str, Any]]] = {}
    base = curves.get(baseline, [])
    if len(base) >= 2:
        for fam in curves:
            if fam == baseline:
                continue
            points = []
            for r in sorted((x for x in rows if x["family"] == fam), key=_compute_key):
                theirs = interpolate_log(base, r["train_exaflops"])
                if not math.isnan(theirs):
                    points.append(
                        {
                            "model": r["model"],
                            "train_exaflops": r["train_exaflops"],
                            "accuracy": r["mean"],
                            "baseline_accuracy": theirs,
                            "gap": r["mean"] - theirs,
                        }
                    )
            gaps[fam] = points
    best = {fam: max(acc for _, acc in pts) for fam, pts in curves.items()}
    return json_ready({"baseline": baseline, "gaps": gaps, "best_accuracy_per_family": best})


def equal_compute_table(verdict: dict[str, Any]) -> str:
    """Each model minus the baseline family at the same training compute."""
    base = verdict["baseline"]
    lines = [
        f"| family | model | training exaFLOPs | test top-1 (%) | {base} at that compute (%) | "
        "difference (points) |",
        "|---|---|---|---|---|---|",
    ]
    for fam, points in verdict["gaps"].items():
        for p in points:
            lines.append(
                f"| {fam} | {p['model']} | {p['train_exaflops']:.3g} | "
                f"{100 * p['accuracy']:.2f} | {100 * p['baseline_accuracy']:.2f} | "
                f"{100 * p['gap']:+.2f} |"
            )
    lines += [
        "",
        f"{base} accuracy at the same compute: its mean-accuracy curve interpolated linearly "
        "in log compute (models outside its compute range are left out).",
    ]
    return "\n".join(lines)


def write_compute(
    results: Sequence[RunResult], out_dir: str | Path, title: str, batch_size: int
) -> dict[str, Path]:
    """``results.json``, ``table.md`` and ``compute.png`` in ``out_dir``."""
    from vitkit.studies.plots import plot_accuracy_vs_compute

    rows = compute_rows(results, batch_size)
    runs = [r.to_dict() | {"train_exaflops": train_exaflops(r, batch_size)} for r in results]
    verdict = compute_verdict(rows)
    extra = {
        "batch_size": batch_size,
        "flops_per_image_step": BACKWARD_FACTOR,
        "verdict_inputs": verdict,
    }
    table = compute_table(rows)
    if verdict["gaps"]:
        table += "\n\n" + equal_compute_table(verdict)
    paths = write_summary(results, rows, table, out_dir, title, extra, runs=runs)
    paths["plot"] = plot_accuracy_vs_compute(rows, Path(out_dir) / "compute.png", title=title)
    return paths
