"""Learning-rate schedules as pure functions ``step -> lr`` (no optimizer, no state)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from vitkit.errors import VitkitError

Decay = Literal["cosine", "linear", "constant"]
Schedule = Callable[[int], float]


def warmup_decay(
    base_lr: float,
    total_steps: int,
    warmup_steps: int = 0,
    decay: Decay = "cosine",
    end_lr: float = 0.0,
) -> Schedule:
    """Linear warmup from 0 to ``base_lr`` over ``warmup_steps``, then decay to ``end_lr`` at
    ``total_steps`` (cosine, linear, or constant). Step ``s`` is the s-th optimizer update
    (0-based), so the first update uses ``base_lr / warmup_steps``, as in big_vision."""
    if total_steps <= 0:
        raise VitkitError(f"total_steps must be positive, got {total_steps}")
    if not 0 <= warmup_steps <= total_steps:
        raise VitkitError(f"warmup_steps {warmup_steps} must lie in [0, {total_steps}]")
    if decay not in ("cosine", "linear", "constant"):
        raise VitkitError(f"unknown decay {decay!r}: expected cosine, linear or constant")

    def lr(step: int) -> float:
        if step < warmup_steps:
            return base_lr * (step + 1) / warmup_steps
        if decay == "constant":
            return base_lr
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        factor = cosine if decay == "cosine" else 1.0 - progress
        return end_lr + (base_lr - end_lr) * factor

    return lr
