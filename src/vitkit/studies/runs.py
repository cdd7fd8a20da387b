"""What the paper studies read back from their runs: the weights a run's accuracy is of, its
training-loss convergence, and pre-training runs, which are reused as fine-tuning runs are
(:func:`vitkit.studies.common.run_all`) but report no accuracy."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from vitkit.studies.common import ModelSpec, RunResult
from vitkit.train.train_config import TrainConfig


def weights_of(run_dir: str | Path) -> Path:
    """The weights a run's test accuracy is of: ``best/`` when it early-stopped, else its
    last checkpoint."""
    best = Path(run_dir) / "best"
    return best if best.is_dir() else Path(run_dir)


def pretrain(cfg: TrainConfig, model: ModelSpec, run_dir: Path) -> tuple[dict[str, Any], bool]:
    """Pre-train (or read back) one encoder in ``run_dir``; (its report, trained now)."""
    report_path = run_dir / "report.json"
    if report_path.is_file():
        return json.loads(report_path.read_text()), False
    cfg = dataclasses.replace(
        cfg,
        model=model.name,
        model_overrides=dict(model.overrides),
        out_dir=str(run_dir),
        resume=(run_dir / "checkpoints").is_dir(),
    )
    kind = "supervised" if cfg.objective == "classify" else cfg.objective
    print(f"pre-training ({kind}) {model.label} on {cfg.data} -> {run_dir}", file=sys.stderr)
    cfg = dataclasses.replace(cfg, run_plots=False)  # as every run of a study
    if cfg.objective == "classify":
        from vitkit.train.trainer import Trainer

        return Trainer(cfg).fit(), True
    from vitkit.train.pretrain import Pretrainer

    return Pretrainer(cfg).fit(), True


def loss_change(r: RunResult) -> float:
    """The run's training-loss change over its last 20 % of steps (the trainer's convergence
    diagnostic, ``report["convergence"]``); NaN where the report has none."""
    change = (r.info.get("convergence") or {}).get("rel_change_last_20pct")
    return math.nan if change is None else float(change)
