"""The measures the paper-finding studies rest on: Spearman's rank correlation (does a cheap
probe rank models as fine-tuning does; does attention distance grow with depth), gaps paired by
seed (is ViT behind the ResNet on this subset) and interpolation in log compute (which family is
ahead at equal training compute).

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


def json_ready(x: Any) -> Any:
    """``x`` with every NaN or infinite float replaced by None, so that ``json.dumps`` writes
    standard JSON (``null``) instead of ``NaN``, which strict readers refuse."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_ready(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_ready(v) for v in x]
    return x


def percent(x: float, signed: bool = False) -> str:
    """``12.3 %`` (``+12.3 %`` signed) of a fraction, or ``n/a`` for NaN."""
    if math.isnan(x):
        return "n/a"
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def paired_gaps(mine: dict[int, float], theirs: dict[int, float]) -> dict[str, float | int] | None:
    """``mine - theirs`` over the seeds both have (paired by seed): mean, sample std, the number
    of pairs and of pairs where ``mine`` is ahead; None where no seed is shared."""
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    gaps = [mine[s] - theirs[s] for s in seeds]
    mean, std = mean_std(gaps)
    return {"mean": mean, "std": std, "pairs": len(seeds), "wins": sum(g > 0 for g in gaps)}


def interpolate_log(points: Sequence[tuple[float, float]], x: float) -> float:
    """``y`` at ``x`` on the piecewise-linear curve through ``points`` (x, y) in log10 x; NaN
    outside the points' x range (no extrapolation). The points need positive x."""
    pts = sorted(points)
    if not pts or any(px <= 0 for px, _ in pts) or x <= 0:
        raise VitkitError("log interpolation needs positive x values")
    if x < pts[0][0] or x > pts[-1][0]:
        return math.nan
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= x <= x1:
            if x1 == x0:
                return (y0 + y1) / 2
            t = (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))
            return y0 + t * (y1 - y0)
    return pts[0][1]  # a single point, at x
