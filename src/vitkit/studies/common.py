"""What every study shares: model specs, runs that are reused when finished, mean ± std over
seeds, and the json + md files a study writes.

A study is a list of :class:`RunSpec` s — each one :class:`~vitkit.train.train_config.TrainConfig`
(data, recipe), one :class:`ModelSpec`, a group key (``n600``, ``1pct``, ...) and a seed —
handed to :func:`run_all`. Each run is an ordinary training run in
``OUT/runs/<model label>/<group>/seed<k>`` (checkpoint, metrics.jsonl, curves, report.json). A
run whose ``report.json`` exists is read back instead of trained again; a run that was killed
before its report resumes from its last checkpoint. So a study that was interrupted, or is given
more sizes or seeds, only trains what is missing, and the same ``--out-dir`` can be carried
across invocations and machines.

:func:`summarize` groups the results by (model, group) into mean and sample standard deviation;
:func:`write_summary` writes ``results.json`` and ``table.md``. Each study draws its own plot.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitkit.checkpoints import atomic_write_text
from vitkit.errors import VitkitError
from vitkit.registry.counts import count_flops, count_params
from vitkit.registry.model_config import ModelConfig, ResNetConfig, config_from_dict, model_config
from vitkit.registry.overrides import parse_key_values
from vitkit.studies.measures import mean_std
from vitkit.train.train_config import TrainConfig


@dataclass(frozen=True)
class ModelSpec:
    """One model of a study: a variant name and config overrides (``depth=4``)."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # the name in the table, plot and run directories; "" = the model's own
    family: str = ""  # ViT, ResNet or Hybrid (the compute study's lines); "" = from the config

    def __post_init__(self) -> None:
        cfg = model_config(self.name, **self.overrides)
        if not self.label:
            object.__setattr__(self, "label", cfg.short_name)
        object.__setattr__(self, "label", re.sub(r"[^A-Za-z0-9.,()+=-]", "-", self.label))
        if not self.family:
            object.__setattr__(self, "family", model_family(cfg))


def model_family(cfg: ModelConfig) -> str:
    """The paper's three families: ResNet (BiT), Hybrid (ResNet stem + ViT), ViT."""
    if isinstance(cfg, ResNetConfig):
        return "ResNet"
    return "Hybrid" if cfg.is_hybrid else "ViT"


# A run's training: the config in, the report dict out (default: ``Trainer(cfg).fit()``).
FitFn = Callable[[TrainConfig], dict[str, Any]]


@dataclass(frozen=True)
class RunSpec:
    """One run of a study. ``config``'s ``model``, ``model_overrides``, ``seed`` and
    ``out_dir`` are set from ``model``, ``seed`` and the run directory by :func:`run_all`."""

    config: TrainConfig
    model: ModelSpec
    group: str  # the run's column in the table (``n600``); a directory name
    seed: int
    info: dict[str, Any] = field(default_factory=dict)  # copied into the result (``size``)
    fit: FitFn | None = None  # how to train it; None: an ordinary Trainer run
    plots: bool = False  # the run's own curves.png and report.html (the study draws its own)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._=+-]+", self.group):
            raise VitkitError(f"study group '{self.group}' is not a plain directory name")

    def run_dir(self, out: str | Path) -> Path:
        return Path(out) / "runs" / self.model.label / self.group / f"seed{self.seed}"

    def resolved(self, out: str | Path) -> TrainConfig:
        """The run's own config: the model, seed and run directory filled in."""
        return dataclasses.replace(
            self.config,
            model=self.model.name,
            model_overrides=dict(self.model.overrides),
            seed=self.seed,
            out_dir=str(self.run_dir(out)),
            resume=False,
            run_plots=self.plots,  # per-run plots: seconds each; off unless asked
        )


@dataclass(frozen=True)
class RunResult:
    model: str  # the spec's label
    short_name: str  # the model's own name (``BiT-R(1,1,1)x0.25``)
    group: str
    seed: int
    test_top1: float  # on the test split (the val split where the run had no test split)
    params: int
    gflops: float  # forward, one image
    steps: int
    epochs: int
    train_s: float  # wall time of the run (training + evaluation)
    out_dir: str
    trained: bool  # trained by this call (False: its report was read back)
    info: dict[str, Any] = field(default_factory=dict)  # the spec's info + run diagnostics

    def to_dict(self) -> dict[str, Any]:
        """Flat: the info's keys sit next to the fixed fields."""
        d = dataclasses.asdict(self)
        return {**{k: v for k, v in d.items() if k != "info"}, **d["info"]}


def epochs_for(size: int, batch_size: int, epochs: int, min_steps: int) -> int:
    """``epochs``, or more where a small subset would give fewer than ``min_steps`` steps."""
    steps_per_epoch = max(size // batch_size, 1)
    return max(epochs, math.ceil(min_steps / steps_per_epoch))


def default_fit(cfg: TrainConfig) -> dict[str, Any]:
    from vitkit.train.trainer import Trainer

    return Trainer(cfg).fit()


def check_labels(models: Sequence[ModelSpec]) -> None:
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        raise VitkitError(f"two models of the study have the same label: {labels}")


def run_all(specs: Sequence[RunSpec], out_dir: str | Path) -> list[RunResult]:
    """Train (or read back) every run, in the order given; one result per run.

    A run directory with a ``report.json`` is finished and read back; one with checkpoints but
    no report was interrupted and resumes from its newest checkpoint.
    """
    dirs = [s.run_dir(out_dir) for s in specs]
    if len(set(dirs)) != len(dirs):
        raise VitkitError("two runs of the study share a run directory (same model, group, seed)")
    results = []
    for i, spec in enumerate(specs, 1):
        cfg = spec.resolved(out_dir)
        run_dir = Path(cfg.out_dir)
        report_path = run_dir / "report.json"
        where = f"[{i}/{len(specs)}] {spec.model.label} {spec.group} seed {spec.seed}"
        if report_path.is_file():
            report = json.loads(report_path.read_text())
            note, trained = "(done before)", False
        else:
            resume = (run_dir / "checkpoints").is_dir()
            print(
                f"{where}: {cfg.epochs} epoch{'' if cfg.epochs == 1 else 's'}"
                f"{' (resumed)' if resume else ''} -> {run_dir}",
                file=sys.stderr,
            )
            report = (spec.fit or default_fit)(dataclasses.replace(cfg, resume=resume))
            note, trained = f"({report['wall_s']:.0f} s)", True
        result = result_from_report(spec, report, run_dir, trained)
        print(f"{where}: test top-1 {100 * result.test_top1:.2f}% {note}", file=sys.stderr)
        results.append(result)
    return results


def best_val_top1(metrics: Path) -> float | None:
    """The best validation top-1 of a run's evaluations (``metrics.jsonl``), or None where it
    has none: the paper's Fig. 4 protocol ("report the best validation accuracy achieved during
    training"), beside the test accuracy of the weights early stopping kept (best val loss)."""
    if not metrics.is_file():
        return None
    values = []
    for n, line in enumerate(metrics.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise VitkitError(f"{metrics}: line {n} is not JSON ({e.msg})") from None
        if isinstance(record, dict) and isinstance(record.get("val_top1"), (int, float)):
            values.append(float(record["val_top1"]))
    return max(values) if values else None


def result_from_report(
    spec: RunSpec, report: dict[str, Any], run_dir: Path, trained: bool
) -> RunResult:
    split = "test" if "test_top1" in report else "val"
    if f"{split}_top1" not in report:
        raise VitkitError(f"{run_dir}/report.json: the run has no test or val accuracy")
    mc = config_from_dict(report["model_config"])
    info = dict(spec.info)
    for key in ("best_epoch", "stopped_epoch", "early_stopped", "convergence"):
        if key in report:
            info[key] = report[key]
    best_val = best_val_top1(run_dir / "metrics.jsonl")
    if best_val is not None:
        info["best_val_top1"] = best_val
    return RunResult(
        model=spec.model.label,
        short_name=mc.short_name,
        group=spec.group,
        seed=spec.seed,
        test_top1=float(report[f"{split}_top1"]),
        params=count_params(mc),
        gflops=count_flops(mc) / 1e9,
        steps=int(report["steps"]),
        epochs=int(report["epochs"]),
        train_s=float(report["wall_s"]),
        out_dir=str(run_dir),
        trained=trained,
        info=info,
    )


def summarize(results: Sequence[RunResult], keep: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Mean and (sample) standard deviation of test accuracy per (model, group), in the order
    the results came; ``keep`` names info keys copied from the group's first run."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.model, r.group), []).append(r)
    rows = []
    for (model, group), runs in groups.items():
        mean, std = mean_std([r.test_top1 for r in runs])
        first = runs[0]
        rows.append(
            {
                "model": model,
                "short_name": first.short_name,
                "group": group,
                "seeds": len(runs),
                "mean": mean,
                "std": std,
                "params": first.params,
                "gflops": first.gflops,
                "mean_steps": sum(r.steps for r in runs) / len(runs),
                "mean_train_s": sum(r.train_s for r in runs) / len(runs),
                **{k: first.info[k] for k in keep if k in first.info},
            }
        )
    return rows


def accuracy_cell(row: dict[str, Any] | None) -> str:
    """``98.10 ± 0.12`` (test top-1, %), the ± only with 2+ seeds; "" for no row."""
    if row is None:
        return ""
    pm = f" ± {100 * row['std']:.2f}" if row["seeds"] > 1 else ""
    return f"{100 * row['mean']:.2f}{pm}"


def markdown_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], column_title: Callable[[str], str]
) -> str:
    """Models as rows, ``columns`` (group keys) as columns, mean ± std accuracy in the cells."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    cell = {(r["model"], r["group"]): r for r in rows}
    head = "| model | params | GFLOPs | " + " | ".join(column_title(c) for c in columns) + " |"
    lines = [head, "|" + "---|" * (3 + len(columns))]
    for m in models:
        first = next(r for r in rows if r["model"] == m)
        cells = [accuracy_cell(cell.get((m, c))) for c in columns]
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


def write_summary(
    results: Sequence[RunResult],
    rows: Sequence[dict[str, Any]],
    table: str,
    out_dir: str | Path,
    title: str,
    extra: dict[str, Any] | None = None,
    *,
    runs: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Path]:
    """``results.json`` (every run — ``runs``, default the results as dicts —, the summary
    rows, ``extra``) and ``table.md``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "table": out / "table.md"}
    body = {
        "runs": list(runs) if runs is not None else [r.to_dict() for r in results],
        "summary": list(rows),
        "trained_runs": sum(r.trained for r in results),
        **(extra or {}),
    }
    atomic_write_text(paths["results"], json.dumps(body, indent=1))
    atomic_write_text(paths["table"], f"# {title}\n\n{table}\n")
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
        family = str(overrides.pop("family", ""))
        specs.append(ModelSpec(m[1].strip(), overrides, label, family))
    if not specs:
        raise VitkitError("--models: no model given")
    return specs
