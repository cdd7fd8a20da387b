"""Training runs for studies without the per-run HTML report.

A study trains tens of runs and reports on them itself; each run's ``report.html`` (attention
analysis, rollout examples, filter plots) costs seconds of plotting per run and is read by no
one. :func:`lean_fit` and :func:`lean_pretrain` train exactly as ``Trainer(cfg).fit()`` and
``Pretrainer(cfg).fit()`` do and keep ``report.json``, ``metrics.jsonl``, ``curves.png`` and the
checkpoints; only the HTML report is left out (``vitkit analyze --from RUN`` makes it later).
"""

from __future__ import annotations

from typing import Any

from vitkit.train.config import TrainConfig
from vitkit.train.pretrain import Pretrainer
from vitkit.train.report import write_curves_and_json
from vitkit.train.trainer import Trainer


class _LeanTrainer(Trainer):
    def write_outputs(self, report: dict[str, Any], eval_set: Any, split: str) -> None:
        write_curves_and_json(self.out, report, self.metrics.records())


class _LeanPretrainer(Pretrainer):
    def write_outputs(self, report: dict[str, Any], eval_set: Any, split: str) -> None:
        write_curves_and_json(self.out, report, self.metrics.records())


def lean_fit(cfg: TrainConfig) -> dict[str, Any]:
    """``Trainer(cfg).fit()`` without ``report.html``."""
    return _LeanTrainer(cfg).fit()


def lean_pretrain(cfg: TrainConfig) -> dict[str, Any]:
    """``Pretrainer(cfg).fit()`` without ``report.html``."""
    return _LeanPretrainer(cfg).fit()
