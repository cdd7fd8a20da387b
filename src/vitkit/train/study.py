"""The paper's data-scale finding in miniature (Sec. 4.2, Figures 3 and 4).

"When pre-trained on the smallest dataset, ImageNet, ViT-Large models underperform compared to
ViT-Base models ... with JFT-300M, we see the full benefit of larger models" and, on random JFT
subsets, "ResNets perform better with smaller pre-training datasets but plateau sooner than ViT".
:func:`run_data_scale` trains every model on class-stratified training subsets of growing size,
with several seeds, and evaluates each run on the full test split; :func:`summarize` turns the
runs into mean ± std per (model, size).

Each run is an ordinary :class:`~vitkit.train.trainer.Trainer` run in
``OUT/runs/<model>/n<size>/seed<k>`` (checkpoint, metrics, curves, report). A run whose
``report.json`` exists is read back instead of trained again, so a study that was interrupted
or is given more sizes or seeds only trains what is missing.

Small subsets get the same number of epochs, but at least ``min_steps`` optimizer steps (more
epochs), so that a 1,000-image run is not judged after a handful of updates. The subset of seed
``k`` is drawn with seed ``k``; with one seed the subsets are nested up to rounding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitkit.checkpoints import atomic_write_text
from vitkit.config import config_from_dict, model_config
from vitkit.counts import count_flops, count_params
from vitkit.errors import VitkitError
from vitkit.overrides import parse_key_values
from vitkit.train.trainer import TrainConfig, Trainer


@dataclass(frozen=True)
class ModelSpec:
    """One model of a study: a variant name and config overrides (``depth=4``)."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # the name in the table, plot and run directories; "" = the model's own

    def __post_init__(self) -> None:
        if not self.label:
            cfg = model_config(self.name, **self.overrides)
            object.__setattr__(self, "label", cfg.short_name)
        object.__setattr__(self, "label", re.sub(r"[^A-Za-z0-9.,()+=-]", "-", self.label))


@dataclass(frozen=True)
class RunResult:
    model: str  # the spec's label
    short_name: str  # the model's own name (``BiT-R(1,1,1)x0.25``)
    size: int
    seed: int
    test_top1: float
    params: int
    gflops: float  # forward, one image
    steps: int
    epochs: int
    train_s: float  # wall time of the run (training + evaluation)
    out_dir: str


def epochs_for(size: int, batch_size: int, epochs: int, min_steps: int) -> int:
    """``epochs``, or more where a small subset would give fewer than ``min_steps`` steps."""
    steps_per_epoch = max(size // batch_size, 1)
    return max(epochs, math.ceil(min_steps / steps_per_epoch))


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
    if not models or not sizes or seeds < 1:
        raise VitkitError("a data-scale study needs at least one model, one size and one seed")
    if sorted(set(sizes)) != sorted(sizes):
        raise VitkitError(f"sizes must be distinct, got {list(sizes)}")
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        raise VitkitError(f"two models of the study have the same label: {labels}")
    out = Path(out_dir)
    results: list[RunResult] = []
    total = len(models) * len(sizes) * seeds
    done = 0
    # Seed-major order: an interrupted study has every model at every size for the first seeds.
    for seed in range(seeds):
        for size in sorted(sizes):
            for spec in models:
                done += 1
                run_dir = out / "runs" / spec.label / f"n{size}" / f"seed{seed}"
                cfg = dataclasses.replace(
                    base,
                    model=spec.name,
                    model_overrides=dict(spec.overrides),
                    train_size=size,
                    seed=seed,
                    epochs=epochs_for(size, base.batch_size, base.epochs, min_steps),
                    out_dir=str(run_dir),
                    resume=False,
                )
                report_path = run_dir / "report.json"
                if report_path.is_file():
                    report = json.loads(report_path.read_text())
                    note = "(done before)"
                else:
                    print(
                        f"[{done}/{total}] {spec.label}: {size} images, seed {seed}, "
                        f"{cfg.epochs} epoch{'' if cfg.epochs == 1 else 's'} -> {run_dir}",
                        file=sys.stderr,
                    )
                    report = Trainer(cfg).fit()
                    note = f"({report['wall_s']:.0f} s)"
                result = _result(spec, size, seed, report, run_dir)
                print(
                    f"[{done}/{total}] {spec.label} n={size} seed={seed}: "
                    f"test top-1 {100 * result.test_top1:.2f}% {note}",
                    file=sys.stderr,
                )
                results.append(result)
    return results


def _result(spec: ModelSpec, size: int, seed: int, report: dict, run_dir: Path) -> RunResult:
    split = "test" if "test_top1" in report else "val"
    if f"{split}_top1" not in report:
        raise VitkitError(f"{run_dir}/report.json: the run has no test or val accuracy")
    mc = config_from_dict(report["model_config"])
    return RunResult(
        model=spec.label,
        short_name=mc.short_name,
        size=size,
        seed=seed,
        test_top1=float(report[f"{split}_top1"]),
        params=count_params(mc),
        gflops=count_flops(mc) / 1e9,
        steps=int(report["steps"]),
        epochs=int(report["epochs"]),
        train_s=float(report["wall_s"]),
        out_dir=str(run_dir),
    )


def summarize(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Mean and (sample) standard deviation of test accuracy per (model, size)."""
    groups: dict[tuple[str, int], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.model, r.size), []).append(r)
    rows = []
    for (model, size), runs in groups.items():
        accs = [r.test_top1 for r in runs]
        mean = sum(accs) / len(accs)
        std = (
            math.sqrt(sum((a - mean) ** 2 for a in accs) / (len(accs) - 1))
            if len(accs) > 1
            else 0.0
        )
        rows.append(
            {
                "model": model,
                "short_name": runs[0].short_name,
                "size": size,
                "seeds": len(runs),
                "mean": mean,
                "std": std,
                "params": runs[0].params,
                "gflops": runs[0].gflops,
                "mean_train_s": sum(r.train_s for r in runs) / len(runs),
            }
        )
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Models as rows, sizes as columns: ``98.10 ± 0.12`` (test top-1, %)."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    sizes = sorted({r["size"] for r in rows})
    cell = {(r["model"], r["size"]): r for r in rows}
    head = "| model | params | GFLOPs | " + " | ".join(f"n={s:,}" for s in sizes) + " |"
    lines = [head, "|" + "---|" * (3 + len(sizes))]
    for m in models:
        first = next(r for r in rows if r["model"] == m)
        cells = []
        for s in sizes:
            r = cell.get((m, s))
            if r is None:
                cells.append("")
            else:
                pm = f" ± {100 * r['std']:.2f}" if r["seeds"] > 1 else ""
                cells.append(f"{100 * r['mean']:.2f}{pm}")
        lines.append(
            f"| {m} ({first['short_name']}) | {first['params']:,} | {first['gflops']:.4f} | "
            + " | ".join(cells)
            + " |"
        )
    seeds = sorted({r["seeds"] for r in rows})
    lines.append("")
    lines.append(
        f"Test top-1 (%), mean ± sample std over {'/'.join(map(str, seeds))} seed(s); "
        "GFLOPs: forward, one image."
    )
    return "\n".join(lines)


def write_study(results: Sequence[RunResult], out_dir: str | Path, title: str) -> dict[str, Path]:
    """``results.json`` (every run), ``table.md`` and ``data_scale.png`` in ``out_dir``."""
    from vitkit.plotting import plot_data_scale

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(results)
    paths = {
        "results": out / "results.json",
        "table": out / "table.md",
        "plot": out / "data_scale.png",
    }
    atomic_write_text(
        paths["results"],
        json.dumps({"runs": [dataclasses.asdict(r) for r in results], "summary": rows}, indent=1),
    )
    atomic_write_text(paths["table"], f"# {title}\n\n{markdown_table(rows)}\n")
    plot_data_scale(rows, [dataclasses.asdict(r) for r in results], paths["plot"], title=title)
    return paths


def parse_model_specs(text: str) -> list[ModelSpec]:
    """``"Ti/4[depth=4,width=96],bit_r26x1"`` → model specs; inside brackets a value may hold
    commas (``layers=1,1,1``): a piece without ``=`` continues the previous value."""
    specs, depth, start = [], 0, 0
    pieces = []
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append(text[start:i].strip())
            start = i + 1
        if depth < 0:
            raise VitkitError(f"--models: unbalanced brackets in '{text}'")
    if depth:
        raise VitkitError(f"--models: unbalanced brackets in '{text}'")
    for piece in pieces:
        if not piece:
            continue
        m = re.fullmatch(r"([^\[\]]+?)\s*(?:\[(.*)\])?", piece)
        if not m:
            raise VitkitError(f"--models: cannot read '{piece}' (expected NAME or NAME[K=V,...])")
        items: list[str] = []
        for part in (m[2] or "").split(","):
            if not part.strip():
                continue
            if "=" in part:
                items.append(part)
            elif items:
                items[-1] += "," + part
            else:
                raise VitkitError(f"--models: expected KEY=VALUE in '{piece}', got '{part}'")
        overrides = parse_key_values(items)
        overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
        label = str(overrides.pop("label", ""))
        specs.append(ModelSpec(m[1].strip(), overrides, label))
    if not specs:
        raise VitkitError("--models: no model given")
    return specs
