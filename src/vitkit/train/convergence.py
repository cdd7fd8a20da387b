"""Knowing when a run has converged: early stopping on the validation loss, and how much the
training loss still moved at the end of a run.

Early stopping watches the **validation loss**, not top-1: the loss is continuous (a small
validation slice changes its top-1 in steps of one image, so ties and noise would stop or
prolong runs at random) and it turns up as soon as a model starts to overfit, usually before
top-1 drops. After ``patience`` evaluations (one per epoch) without a new minimum the run
stops; the weights of the best evaluation are kept in ``OUT/best`` and the final test accuracy
is theirs (the usual meaning of early stopping: the model you would have kept).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EARLY_STOP_METRIC = "val_loss"
CONVERGENCE_WINDOW = 0.2  # the tail of training the diagnostic looks at


@dataclass
class EarlyStopping:
    """The state of early stopping: the best validation loss so far and how long ago it was."""

    patience: int  # evaluations without improvement before stopping
    best: float = math.inf
    best_epoch: int = 0  # the epoch count after which the best evaluation happened
    bad_evals: int = 0  # evaluations since the best one
    stopped: bool = False

    def update(self, value: float, epoch: int) -> bool:
        """Record one evaluation; True if it is a new best. Sets ``stopped`` when the
        patience is used up. A NaN never improves."""
        improved = value < self.best
        if improved:
            self.best, self.best_epoch, self.bad_evals = value, epoch, 0
        else:
            self.bad_evals += 1
            self.stopped = self.bad_evals >= self.patience
        return improved

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "bad_evals": self.bad_evals,
            "stopped": self.stopped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])
        self.best_epoch = int(state["best_epoch"])
        self.bad_evals = int(state["bad_evals"])
        self.stopped = bool(state["stopped"])


def train_loss_convergence(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How much the training loss still changed over the last 20 % of the steps.

    ``rel_change_last_20pct`` = (mean loss over the last 10 % of steps − mean over the 10 %
    before) / the latter; near 0 the curve has flattened, clearly negative it was still
    falling. None where a window holds no logged training loss (log more often).
    """
    points = [(int(r["step"]), float(r["train_loss"])) for r in records if "train_loss" in r]
    if not points:
        return {"rel_change_last_20pct": None, "train_loss_end": None, "steps": 0}
    last = max(s for s, _ in points)
    mid = last * (1 - CONVERGENCE_WINDOW / 2)
    start = last * (1 - CONVERGENCE_WINDOW)
    end_window = [v for s, v in points if s > mid]
    before = [v for s, v in points if start < s <= mid]
    end = sum(end_window) / len(end_window)
    change = None
    if before:
        prev = sum(before) / len(before)
        change = (end - prev) / prev if prev else None
    return {"rel_change_last_20pct": change, "train_loss_end": end, "steps": last}
