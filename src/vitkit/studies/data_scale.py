"""The paper's data-scale finding in miniature (Sec. 4.2, Figures 3 and 4).

"When pre-trained on the smallest dataset, ImageNet, ViT-Large models underperform compared to
ViT-Base models ... with JFT-300M, we see the full benefit of larger models" and, on random JFT
subsets, "ResNets perform better with smaller pre-training datasets but plateau sooner than ViT".
:func:`run_data_scale` trains every model on class-stratified training subsets of growing size,
with several seeds, and evaluates each run on the full test split; :func:`write_study` turns the
runs into mean ± std per (model, size), a plot of accuracy against size and, per size, the
training-loss curves of every run (to see that they flattened).

Each run lives in ``OUT/runs/<model>/n<size>/seed<k>`` and is reused once its ``report.json``
exists (:mod:`vitkit.studies.common`). Small subsets get the same number of epochs, but at
least ``min_steps`` optimizer steps (more epochs), so that a 1,000-image run is not judged after
a handful of updates; with early stopping (``TrainConfig.early_stop``) the budget is an upper
bound and each run stops when its validation loss stops improving. The subset of seed ``k`` is
drawn with seed ``k``; with one seed the subsets are nested up to rounding.

To convergence (the paper's Fig. 4 protocol: "we use early-stopping, and report the best
validation accuracy achieved during training"): ``--early-stop P`` stops a run once its
validation loss has not improved for P epochs (more for small subsets: :func:`patience_for`)
and evaluates its best weights; each run's report says how far its training loss still moved
(``convergence``) and ``loss_curves.png`` shows every curve. The full-size commands (3 models x
5 or 4 sizes x 3 seeds; a GPU, see docs/paper.md for the times):

    vitkit study data-scale --data mnist --val-size 1000 --seeds 3 --epochs 30 \
        --min-steps 4000 --warmup-steps 200 --early-stop 10 --device cuda \
        --out-dir runs/data-scale-mnist
    vitkit study data-scale --data shapes-hard --val-size 5000 --seeds 3 --epochs 10 \
        --min-steps 4000 --warmup-steps 200 --early-stop 5 --device cuda \
        --out-dir runs/data-scale-shapes-hard

(MNIST: sizes 600 ... 59,000 = all 60,000 training images but the 1,000 held out for early
stopping; shapes-hard: 1,000 ... 1,000,000.) ``--smoke`` runs the study in seconds.
"""

from __future__ import annotations

import dataclasses
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
    epochs_for,
    markdown_table,
    run_all,
    summarize,
    write_summary,
)
from vitkit.studies.measures import json_ready, paired_gaps, spearman
from vitkit.studies.study_defaults import DATA_SCALE_COMMANDS, DATA_SCALE_MODELS
from vitkit.train.train_config import TrainConfig

FULL_COMMANDS = DATA_SCALE_COMMANDS  # (vitkit.studies.study_defaults)
DEFAULT_MODELS = DATA_SCALE_MODELS
# The full-size study's subset sizes per dataset (MNIST: 59,000 + the 1,000 held out for
# early stopping = all 60,000 training images).
FULL_SIZES = {
    "mnist": (600, 2_000, 6_000, 20_000, 59_000),
    "shapes-hard": (1_000, 10_000, 100_000, 1_000_000),
}
# --smoke: seconds on the 8x8 digits.
SMOKE_MODELS = (
    "Ti/2[width=32,depth=1,num_heads=2,mlp_dim=64,label=vit],"
    "bit_r26x1[layers=1,width_factor=0.125,root=small,label=bit],"
    "r_vit_ti16[patch_size=1,resnet_layers=1,resnet_width_factor=0.125,width=32,depth=1,"
    "num_heads=2,mlp_dim=64,label=hybrid]"
)
SMOKE_SIZES = (100, 200)


def data_scale_specs(
    base: TrainConfig,
    models: Sequence[ModelSpec],
    sizes: Sequence[int],
    seeds: int,
    *,
    min_steps: int = 0,
) -> list[RunSpec]:
    """Every (seed, size, model) run, seed-major: an interrupted study has every model at
    every size for its first seeds."""
    if not models or not sizes or seeds < 1:
        raise VitkitError("a data-scale study needs at least one model, one size and one seed")
    if sorted(set(sizes)) != sorted(sizes):
        raise VitkitError(f"sizes must be distinct, got {list(sizes)}")
    check_labels(models)
    specs = []
    for seed in range(seeds):
        for size in sorted(sizes):
            cfg = dataclasses.replace(
                base,
                train_size=size,
                epochs=epochs_for(size, base.batch_size, base.epochs, min_steps),
                early_stop=patience_for(size, base.batch_size, base.early_stop, min_steps),
            )
            for spec in models:
                info = {"size": size, "data": base.data, "family": spec.family}
                specs.append(RunSpec(cfg, spec, f"n{size}", seed, info=info))
    return specs


def patience_for(size: int, batch_size: int, patience: int | None, min_steps: int) -> int | None:
    """Early-stopping patience (evaluations = epochs) of a run on ``size`` images: ``patience``,
    or more where a small subset's epochs are so short that ``patience`` of them would be fewer
    than a quarter of ``min_steps`` optimizer steps (a 600-image subset would otherwise stop
    within a few dozen noisy steps)."""
    if patience is None:
        return None
    steps_per_epoch = max(size // batch_size, 1)
    return max(patience, math.ceil(min_steps / 4 / steps_per_epoch))


def run_data_scale(
    base: TrainConfig,
    models: Sequence[ModelSpec],
    sizes: Sequence[int],
    seeds: int,
    out_dir: str | Path,
    *,
    min_steps: int = 0,
) -> list[RunResult]:
    """Train every model on every subset size with seeds ``0..seeds-1``; one result per run.

    ``base`` gives the data and the optimisation settings (its ``model``, ``train_size``,
    ``seed`` and ``out_dir`` are set per run). Runs that already have a report are reused.
    """
    specs = data_scale_specs(base, models, sizes, seeds, min_steps=min_steps)
    return run_all(specs, out_dir)


def data_scale_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Mean ± std per (model, size), each row with its ``size``."""
    return summarize(results, keep=("size",))


def write_study(results: Sequence[RunResult], out_dir: str | Path, title: str) -> dict[str, Path]:
    """``results.json`` (every run), ``table.md``, ``data_scale.png`` and ``loss_curves.png``
    (training loss against steps, one panel per size) in ``out_dir``."""
    from vitkit.plotting import plot_data_scale
    from vitkit.studies.plots import plot_loss_curves

    rows = data_scale_rows(results)
    sizes = sorted({r["size"] for r in rows})
    table = markdown_table(rows, [f"n{s}" for s in sizes], lambda g: f"n={int(g[1:]):,}")
    verdict = data_scale_verdict(results)
    if verdict["gap_vs_baseline"]:  # a ResNet and another model to compare with it
        table += "\n\n" + gap_table(verdict)
    extra = {"verdict_inputs": verdict}
    if all("best_val_top1" in r.info for r in results):  # every run was validated
        best_val = data_scale_verdict(results, metric="best_val_top1")
        extra["verdict_inputs_best_val"] = best_val
        table += "\n\n" + best_val_table(results)
        if best_val["gap_vs_baseline"]:
            table += "\n\n" + gap_table(best_val)
    table += "\n\n" + convergence_table(results)
    paths = write_summary(results, rows, table, out_dir, title, extra)
    runs = [r.to_dict() for r in results]
    paths["plot"] = plot_data_scale(rows, runs, Path(out_dir) / "data_scale.png", title=title)
    curves_title = f"{results[0].info.get('data', '?')}: training loss of every run"
    paths["curves"] = plot_loss_curves(
        results, Path(out_dir) / "loss_curves.png", panel_key="size", title=curves_title
    )
    return paths


def data_scale_verdict(
    results: Sequence[RunResult], baseline: str | None = None, metric: str = "test_top1"
) -> dict[str, Any]:
    """The numbers the data-scale verdict rests on (the paper: ViT below the ResNet on small
    data, catching up as data grows).

    Per size, each model's test accuracy minus the ``baseline``'s (default: the first model of
    the ResNet family), paired by seed; per model, Spearman's correlation of the size with that
    mean gap (+1: the gap only grows with data); the best model per size; and per size how many
    runs early-stopped. ``baseline`` is None in the result where the study has no ResNet.
    ``metric="best_val_top1"``: the same for the best validation accuracy of each run.
    """
    acc: dict[str, dict[int, dict[int, float]]] = {}  # model -> size -> seed -> accuracy
    family: dict[str, str] = {}
    for r in results:
        value = r.test_top1 if metric == "test_top1" else r.info.get(metric)
        if value is None:
            raise VitkitError(f"{r.out_dir}: the run has no {metric}")
        acc.setdefault(r.model, {}).setdefault(int(r.info["size"]), {})[r.seed] = float(value)
        family.setdefault(r.model, str(r.info.get("family", "")))
    if baseline is None:
        baseline = next((m for m in acc if family[m] == "ResNet"), None)
    elif baseline not in acc:
        raise VitkitError(f"data-scale baseline '{baseline}' is not a model of the study")
    sizes = sorted({s for per_size in acc.values() for s in per_size})
    gaps: dict[str, dict[str, Any]] = {}
    trend: dict[str, float] = {}
    for model in acc:
        if baseline is None or model == baseline:
            continue
        per = {}
        for size in sizes:
            gap = paired_gaps(acc[model].get(size, {}), acc[baseline].get(size, {}))
            if gap is not None:
                per[str(size)] = gap
        gaps[model] = per
        xs = [float(s) for s in per]
        trend[model] = spearman(xs, [per[s]["mean"] for s in per]) if len(xs) > 1 else math.nan

    def mean_acc(model: str, size: int) -> float:
        runs = acc[model].get(size, {})
        return sum(runs.values()) / len(runs) if runs else -math.inf

    best = {str(size): max(acc, key=lambda m: mean_acc(m, size)) for size in sizes}
    early = {
        str(size): {
            "early_stopped": sum(
                bool(r.info.get("early_stopped")) for r in results if r.info["size"] == size
            ),
            "runs": sum(1 for r in results if r.info["size"] == size),
        }
        for size in sizes
    }
    return json_ready(
        {
            "metric": metric,
            "baseline": baseline,
            "families": family,
            "sizes": sizes,
            "gap_vs_baseline": gaps,
            "gap_trend_spearman": trend,
            "best_model_per_size": best,
            "early_stopping_per_size": early,
        }
    )


def best_val_table(results: Sequence[RunResult]) -> str:
    """Mean ± std of each run's best validation top-1 per (model, size): the paper's Fig. 4
    protocol, beside the test accuracy of the weights kept by early stopping on the loss."""
    rows = summarize(
        [dataclasses.replace(r, test_top1=float(r.info["best_val_top1"])) for r in results],
        keep=("size",),
    )
    sizes = sorted({r["size"] for r in rows})
    table = markdown_table(rows, [f"n{s}" for s in sizes], lambda g: f"n={int(g[1:]):,}")
    return "Best validation top-1 during training (the paper's Fig. 4 protocol):\n\n" + table


def gap_cell(gap: dict[str, Any]) -> str:
    """``+2.50 ± 0.71`` (percentage points); the ± only with 2+ pairs (one difference has no
    spread: a ``± 0.00`` would claim one)."""
    pm = f" ± {100 * gap['std']:.2f}" if gap["pairs"] > 1 else ""
    return f"{100 * gap['mean']:+.2f}{pm}"


def gap_table(verdict: dict[str, Any]) -> str:
    """Each model minus the baseline, per size (percentage points, paired by seed)."""
    sizes = verdict["sizes"]
    lines = [
        f"| minus {verdict['baseline']} | " + " | ".join(f"n={s:,}" for s in sizes) + " | trend |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for model, per in verdict["gap_vs_baseline"].items():
        cells = []
        for s in sizes:
            g = per.get(str(s))
            cells.append("" if g is None else gap_cell(g))
        rho = verdict["gap_trend_spearman"].get(model)
        trend = "n/a" if rho is None else f"{rho:+.2f}"
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {trend} |")
    lines += [
        "",
        f"{'Test' if verdict.get('metric', 'test_top1') == 'test_top1' else 'Best validation'}"
        " top-1 difference in percentage points, mean ± sample std of the per-seed "
        "differences; trend: Spearman's correlation of the size with the mean difference.",
    ]
    return "\n".join(lines)


def convergence_table(results: Sequence[RunResult]) -> str:
    """Per run group: how far the training loss still moved over the last 20 % of training,
    and where early stopping stopped (from each run's report)."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.model, r.group), []).append(r)
    lines = [
        "| model | size | steps | train-loss change, last 20 % | best / stopped epoch |",
        "|---|---|---|---|---|",
    ]
    for (model, group), runs in groups.items():
        changes = [
            r.info["convergence"]["rel_change_last_20pct"]
            for r in runs
            if r.info.get("convergence", {}).get("rel_change_last_20pct") is not None
        ]
        change = ", ".join(f"{100 * c:+.1f} %" for c in changes) or "n/a"
        epochs = ", ".join(
            f"{r.info['best_epoch']}/{r.info['stopped_epoch']}"
            if "best_epoch" in r.info
            else f"-/{r.epochs}"
            for r in runs
        )
        steps = ", ".join(str(r.steps) for r in runs)
        lines.append(f"| {model} | {group[1:]} | {steps} | {change} | {epochs} |")
    lines.append("")
    lines.append(
        "Train-loss change: (mean loss of the last 10 % of logged steps − that of the 10 % "
        "before) / the latter, per seed; near 0 means the curve flattened."
    )
    return "\n".join(lines)
