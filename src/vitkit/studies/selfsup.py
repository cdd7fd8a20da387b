"""Self-supervised pre-training against supervised pre-training and none (the paper's Sec. 4.6).

"With self-supervised pre-training, our smaller ViT-B/16 model achieves 79.9 % accuracy on
ImageNet, a significant improvement of 2 % to training from scratch, but still 4 % behind
supervised pre-training." Here, in miniature, per seed:

1. four starts for one encoder architecture: **scratch** (random init), **supervised**
   pre-training (classification with every label of ``--pretrain-data``), masked patch
   prediction (**mpp**, the paper's objective) and **mae**, both on the images of
   ``--pretrain-data`` without their labels. Pre-training runs live in
   ``OUT/runs/<start>/pretrain/seed<k>`` and are reused once finished;
2. each start fine-tuned with one recipe (the training options; default ``study-selfsup``) on a
   class-stratified ``--fractions`` of the labelled training set (default 1 %, 10 %, 100 %),
   every run at least ``--min-steps`` optimizer steps (more epochs on small fractions), so that
   the from-scratch runs converge too; ``OUT/runs/<start>/labels<fraction>/seed<k>``;
3. test top-1 on the full test split; mean ± std over seeds; the gain of each start over
   scratch (paired by seed); how flat each fine-tuning run's training loss was at its end.

With ``--pretrain-data`` equal to ``--data`` (the default), supervised pre-training has seen
every label of the target, so it is an upper bound for the few-label columns, not the paper's
separate large labelled set; give another dataset to make it one.

:func:`write_selfsup` writes ``results.json`` (every run, the summary, ``verdict_inputs``),
``selfsup.md``, ``selfsup.png`` (accuracy against the labelled fraction, one line per start)
and ``finetune_loss.png`` (every fine-tuning run's training loss, one panel per fraction).

The full-size study (MNIST, 3 seeds; minutes per run on one GPU)::

    vitkit study selfsup --seeds 3 --min-steps 3000 --pretrain-epochs 30 --device cuda \\
        --out-dir runs/study-selfsup

``--smoke`` shrinks every run to a few steps of a tiny model on ``digits`` for the tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.checkpoints import atomic_write_text
from vitkit.errors import VitkitError
from vitkit.studies.common import ModelSpec, RunResult, RunSpec, epochs_for, run_all
from vitkit.studies.measures import json_ready, mean_std, paired_gaps, percent
from vitkit.studies.runs import loss_change, pretrain, weights_of
from vitkit.train.train_config import TrainConfig

STARTS = ("scratch", "supervised", "mpp", "mae")
PRETRAINED = STARTS[1:]


def pretrain_configs(
    base: TrainConfig, data: str, *, epochs: int | None = None, smoke: bool = False
) -> dict[str, TrainConfig]:
    """The pre-training config of every pre-trained start, on ``data``: the recipes
    ``mnist-mpp`` and ``mnist-mae`` and, for supervised, the first MNIST recipe; the device,
    threads and precision of ``base``."""
    from vitkit.train.recipes import MNIST_MAE, MNIST_MPP, MNIST_V1
    from vitkit.train.recipes import smoke as shrink

    same: dict[str, Any] = {
        "data": data,
        "data_root": base.data_root if data == base.data else None,
        "image_size": base.image_size,
        "device": base.device,
        "threads": base.threads,
        "precision": base.precision,
        "progress": base.progress,
    }
    out = {}
    for name, recipe in (("supervised", MNIST_V1), ("mpp", MNIST_MPP), ("mae", MNIST_MAE)):
        cfg = shrink(recipe) if smoke else recipe
        cfg = dataclasses.replace(cfg, **same)
        if epochs is not None:
            cfg = dataclasses.replace(cfg, epochs=epochs)
        out[name] = cfg
    return out


def group_name(fraction: float) -> str:
    return f"labels{fraction:g}"


def run_selfsup(
    base: TrainConfig,
    model: ModelSpec,
    pretrain_cfgs: dict[str, TrainConfig],
    fractions: Sequence[float],
    seeds: int,
    out_dir: str | Path,
    *,
    train_images: int,
    min_steps: int = 0,
) -> tuple[list[RunResult], list[dict[str, Any]]]:
    """Pre-train and fine-tune every start at every fraction with seeds ``0..seeds-1``
    (seed-major); (fine-tuning results, pre-training records). ``train_images``: the size of
    the labelled training set the fractions are taken of."""
    if seeds < 1 or not fractions:
        raise VitkitError("a self-supervision study needs at least one seed and one fraction")
    if any(not 0 < f <= 1 for f in fractions) or len(set(fractions)) != len(fractions):
        raise VitkitError(f"fractions must be distinct and in (0, 1], got {list(fractions)}")
    unknown = set(pretrain_cfgs) - set(PRETRAINED)
    if unknown:
        raise VitkitError(f"unknown pre-training start(s) {sorted(unknown)}: {PRETRAINED}")
    for fraction in fractions:
        n = max(1, round(fraction * train_images))
        if n < base.batch_size:
            raise VitkitError(
                f"{fraction:g} of {train_images} training images is {n}, fewer than one batch "
                f"of {base.batch_size}: lower --batch-size or raise the fraction"
            )
    out = Path(out_dir)
    results: list[RunResult] = []
    pretrained: list[dict[str, Any]] = []
    for seed in range(seeds):
        init: dict[str, str | None] = {"scratch": None}
        for name, cfg in pretrain_cfgs.items():
            run_dir = out / "runs" / name / "pretrain" / f"seed{seed}"
            report, trained = pretrain(dataclasses.replace(cfg, seed=seed), model, run_dir)
            init[name] = str(weights_of(run_dir))
            pretrained.append(
                {
                    "start": name,
                    "seed": seed,
                    "out_dir": str(run_dir),
                    "trained": trained,
                    "wall_s": report.get("wall_s"),
                    "steps": report.get("steps"),
                    **{
                        k: v
                        for k, v in report.items()
                        if k.startswith("test_") and isinstance(v, float)
                    },
                }  # fmt: skip
            )
        specs = []
        for fraction in sorted(fractions):
            n = max(1, round(fraction * train_images))
            cfg = dataclasses.replace(
                base,
                train_size=None if fraction == 1 else fraction,
                epochs=epochs_for(n, base.batch_size, base.epochs, min_steps),
            )
            for start, path in init.items():
                # A pre-trained start takes its architecture from its checkpoint.
                spec = model if path is None else ModelSpec(model.name, {}, model.label)
                spec = dataclasses.replace(spec, label=start)
                specs.append(
                    RunSpec(
                        dataclasses.replace(cfg, init_from=path),
                        spec,
                        group_name(fraction),
                        seed,
                        info={"start": start, "fraction": fraction},
                    )
                )
        results += run_all(specs, out)
    return results, pretrained


def summarize_selfsup(results: Sequence[RunResult]) -> dict[str, Any]:
    """Rows (start, fraction, mean ± std), the gains over scratch and the verdict inputs."""
    by: dict[tuple[str, float], dict[int, RunResult]] = {}
    for r in results:
        by.setdefault((r.info["start"], r.info["fraction"]), {})[r.seed] = r
    rows: list[dict[str, Any]] = []
    for (start, fraction), runs in by.items():
        mean, std = mean_std([r.test_top1 for r in runs.values()])
        changes = [loss_change(r) for r in runs.values()]
        changes = [c for c in changes if not math.isnan(c)]
        rows.append(
            {
                "start": start,
                "method": start,
                "fraction": fraction,
                "seeds": len(runs),
                "mean": mean,
                "std": std,
                "mean_steps": sum(r.steps for r in runs.values()) / len(runs),
                # the training loss's change over a run's last 20 % of steps, the most
                # negative (still falling) of the seeds
                "train_loss_rel_change_worst": min(changes) if changes else math.nan,
            }
        )
    fractions = sorted({f for _, f in by})
    gains: dict[str, dict[str, dict[str, float]]] = {}
    for start in dict.fromkeys(s for s, _ in by):
        if start == "scratch":
            continue
        for f in fractions:
            mine, ref = by.get((start, f), {}), by.get(("scratch", f), {})
            gap = paired_gaps(
                {s: r.test_top1 for s, r in mine.items()}, {s: r.test_top1 for s, r in ref.items()}
            )
            if gap is not None:
                gains.setdefault(start, {})[f"{f:g}"] = {
                    "mean": gap["mean"],
                    "std": gap["std"],
                    "seeds": gap["pairs"],
                    "wins": gap["wins"],
                }

    def worst(starts: set[str]) -> float:
        changes = [r["train_loss_rel_change_worst"] for r in rows if r["start"] in starts]
        changes = [c for c in changes if not math.isnan(c)]
        return min(changes) if changes else math.nan

    verdict = {
        "fractions": fractions,
        "top1": {
            f"{r['start']}@{r['fraction']:g}": {
                "mean": r["mean"],
                "std": r["std"],
                "seeds": r["seeds"],
            }
            for r in rows
        },
        "gain_over_scratch": gains,
        # The training loss's relative change over the last 20 % of a run's steps, the most
        # negative (still falling) over runs: about 0 when every run had flattened.
        "scratch_train_loss_rel_change_worst": worst({"scratch"}),
        "all_train_loss_rel_change_worst": worst({r["start"] for r in rows}),
    }
    return {"rows": rows, "verdict_inputs": verdict}


def reading(verdict: dict[str, Any]) -> str:
    parts = []
    for start, by_fraction in verdict["gain_over_scratch"].items():
        cells = ", ".join(
            f"{100 * float(f):g} %: {100 * g['mean']:+.1f} ± {100 * g['std']:.1f}"
            for f, g in by_fraction.items()
        )
        parts.append(f"{start} {cells}")
    change = verdict["scratch_train_loss_rel_change_worst"]
    return (
        "Gain over scratch (points, by labelled fraction): "
        + "; ".join(parts)
        + f". Scratch runs' training loss changed by at most {percent(change, signed=True)} "
        "over their last 20 % of steps."
    )


def markdown(summary: dict[str, Any], pretrain_data: str, data: str) -> str:
    rows = summary["rows"]
    fractions = sorted({r["fraction"] for r in rows})
    cell = {(r["start"], r["fraction"]): r for r in rows}
    lines = [
        "| start | " + " | ".join(f"{100 * f:g} % labels" for f in fractions) + " |",
        "|---|" + "---:|" * len(fractions),
    ]
    for start in dict.fromkeys(r["start"] for r in rows):
        cells = []
        for f in fractions:
            r = cell.get((start, f))
            cells.append("" if r is None else f"{100 * r['mean']:.2f} ± {100 * r['std']:.2f}")
        lines.append(f"| {start} | " + " | ".join(cells) + " |")
    seeds = sorted({r["seeds"] for r in rows})
    lines += [
        "",
        f"Test top-1 (%) on {data}, mean ± sample std over {'/'.join(map(str, seeds))} seed(s); "
        f"pre-training on {pretrain_data}"
        + (
            " (supervised pre-training saw every label: an upper bound)"
            if pretrain_data == data
            else ""
        )
        + ".",  # fmt: skip
        "",
        f"Reading: {reading(summary['verdict_inputs'])}",
    ]
    return "\n".join(lines)


def write_selfsup(
    results: Sequence[RunResult],
    pretrained: Sequence[dict[str, Any]],
    out_dir: str | Path,
    *,
    data: str,
    pretrain_data: str,
) -> dict[str, Path]:
    """``results.json``, ``selfsup.md``, ``selfsup.png`` and ``finetune_loss.png``."""
    from vitkit.plotting.paper import plot_label_fractions
    from vitkit.studies.plots import plot_loss_curves

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize_selfsup(results)
    paths = {
        "results": out / "results.json",
        "table": out / "selfsup.md",
        "plot": out / "selfsup.png",
        "curves": out / "finetune_loss.png",
    }
    body = {
        "data": data,
        "pretrain_data": pretrain_data,
        "runs": [r.to_dict() for r in results],
        "pretrain_runs": list(pretrained),
        "trained_runs": sum(r.trained for r in results) + sum(p["trained"] for p in pretrained),
        **summary,
    }
    atomic_write_text(paths["results"], json.dumps(json_ready(body), indent=1))
    title = f"Self-supervised vs supervised pre-training vs scratch ({data})"
    atomic_write_text(paths["table"], f"# {title}\n\n{markdown(summary, pretrain_data, data)}\n")
    plot_label_fractions(summary["rows"], paths["plot"], title=title)
    plot_loss_curves(results, paths["curves"], panel_key="fraction", title="fine-tuning loss")
    return paths
