"""Small statistics the paper-finding studies rest on: Spearman's rank correlation, and whether a
training-loss curve has flattened.

Pure functions on plain numbers, so that a test can check them against values worked out by
hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vitkit.errors import VitkitError


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span (``[10, 20, 20]`` →
    ``[1, 2.5, 2.5]``)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (ties: mean ranks).
    NaN when either side has a single distinct value (no ranking to compare)."""
    if len(x) != len(y):
        raise VitkitError(f"rank correlation of {len(x)} values with {len(y)}")
    if len(x) < 2:
        raise VitkitError(f"rank correlation needs at least 2 pairs, got {len(x)}")
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return math.nan
    return cov / math.sqrt(vx * vy)


def loss_plateau(records: Sequence[dict[str, Any]], key: str = "train_loss") -> dict[str, Any]:
    """How much the training loss still fell at the end of a run, from its metrics records.

    The records carrying ``key`` are split into fifths by step; ``relative_drop`` is the fall of
    the mean loss from the fourth fifth to the last, relative to the fourth fifth's mean: about 0
    when the curve has flattened, 0.1 when the last fifth is still 10 % lower. NaN with fewer than
    5 records."""
    points = [(float(r["step"]), float(r[key])) for r in records if key in r and "step" in r]
    points.sort()
    out: dict[str, Any] = {"records": len(points), "relative_drop": math.nan}
    if len(points) < 5:
        return out
    n = len(points)
    fourth = [v for _, v in points[(3 * n) // 5 : (4 * n) // 5]]
    last = [v for _, v in points[(4 * n) // 5 :]]
    a, b = sum(fourth) / len(fourth), sum(last) / len(last)
    out.update(
        relative_drop=(a - b) / a if a else math.nan,
        last_fifth_loss=b,
        final_loss=points[-1][1],
        final_step=points[-1][0],
    )
    return out
