"""Exports at any image size: the range of sizes an export takes, and the check at several.

``vitkit export --dynamic-size`` traces the model with its height and width symbolic (each a
multiple of the patch, times a hybrid's ResNet stride), so the position embeddings are resampled
inside the graph by the checkpoint's own kernel (:mod:`vitkit.models.posemb_resample`; rotary
tables are computed from the grid there too). An export is checked against PyTorch at the size
it was traced at and at sizes it was not (the range's ends, non-square ones): the largest
relative error, max |export - PyTorch| / max |PyTorch|, is recorded with the sizes. Where a
kernel is not exact in the exported graph (an error over 1e-4 at some size), the range is
narrowed to the sizes around the checkpoint's own where the error stays below 1e-4, and the
export says so in one line.

An exported model refuses, in one line, a size that is not a multiple of the patch or that lies
outside its range (:meth:`SizeRange.check`): the graph itself would compute something there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vitkit.errors import VitkitError

EXACT = 1e-4  # the largest relative error an export may have against PyTorch

# How a graph of any size holds an antialiased E_pos kernel: two matrix products (exact under
# every runtime), not the runtime's antialiased Resize (OpenVINO's is not PyTorch's); an engine
# directory without it was written with the Resize.
ANTIALIAS_GRAPH = "matrices"


@dataclass(frozen=True)
class SizeRange:
    """Image sides an export takes: multiples of ``step`` from ``min`` to ``max`` px (each of
    the height and the width, independently)."""

    step: int  # the patch (times a hybrid's ResNet stride): the grid is side // step
    min: int
    max: int

    def check(self, size: Sequence[int], where: str) -> None:
        """Refuse ``size`` (H, W) in one line where the export does not take it."""
        h, w = int(size[0]), int(size[1])
        for side, n in (("height", h), ("width", w)):
            if n % self.step:
                raise VitkitError(
                    f"{where}: images {h}x{w}: the {side} {n} is not a multiple of the patch "
                    f"{self.step} (the export takes {self.describe()})"
                )
            if not self.min <= n <= self.max:
                raise VitkitError(
                    f"{where}: images {h}x{w}: the {side} {n} is outside the export's range "
                    f"({self.describe()}; export again with --min-size / --max-size)"
                )

    def describe(self) -> str:
        return f"sides of {self.min} to {self.max} px in steps of {self.step}"

    def to_dict(self) -> dict[str, int]:
        return {"step": self.step, "min": self.min, "max": self.max}

    @classmethod
    def from_dict(cls, d: Any) -> SizeRange:
        try:
            r = cls(int(d["step"]), int(d["min"]), int(d["max"]))
        except (KeyError, TypeError, ValueError) as e:
            raise VitkitError(f"not a size range: {d!r} ({e})") from None
        if not 0 < r.step <= r.min <= r.max or r.min % r.step or r.max % r.step:
            raise VitkitError(f"not a size range: {d!r}")
        return r

    def dynamic_shapes(self) -> dict[int, Any]:
        """torch.export's dims of an image input [B, C, H, W]: H and W multiples of ``step``."""
        import torch

        gh = torch.export.Dim("rows", min=self.min // self.step, max=self.max // self.step)
        gw = torch.export.Dim("columns", min=self.min // self.step, max=self.max // self.step)
        return {2: self.step * gh, 3: self.step * gw}


def size_range(cfg: Any, min_size: int | None = None, max_size: int | None = None) -> SizeRange:
    """The range of a model of config ``cfg`` (default: 2 patches to twice its own size),
    refused in one line where a bound is not a multiple of the patch or the bounds are out of
    order. The low end is at least 2 patches (torch.export specialises a side of 1)."""
    if not hasattr(cfg, "patch_size"):
        raise VitkitError("--dynamic-size: a ViT's export (a BiT ResNet has no patch grid)")
    step = cfg.patch_size[0] * getattr(cfg, "stem_stride", 1)
    if cfg.patch_size[0] != cfg.patch_size[1]:
        raise VitkitError(f"--dynamic-size needs square patches, not {cfg.patch_size}")
    own = max(cfg.image_size)
    lo = 2 * step if min_size is None else min_size
    hi = 2 * (own // step) * step if max_size is None else max_size
    for name, n in (("--min-size", lo), ("--max-size", hi)):
        if n % step:
            raise VitkitError(f"{name} {n} is not a multiple of the patch {step}")
    if lo < 2 * step:
        raise VitkitError(f"--min-size {lo}: at least 2 patches ({2 * step} px) a side")
    if hi < lo:
        raise VitkitError(f"--max-size {hi} is below --min-size {lo}")
    return SizeRange(step, lo, hi)


def check_sizes(sizes: SizeRange, own: tuple[int, int]) -> list[tuple[int, int]]:
    """Where an export is checked: the checkpoint's own size (clamped into the range), the
    range's corners, and non-square sizes between; each at most once."""
    s, lo, hi = sizes.step, sizes.min, sizes.max
    mid = (lo + hi) // 2 // s * s

    def clamp(n: int) -> int:
        return min(max(n // s * s, lo), hi)

    found = [
        (clamp(own[0]), clamp(own[1])),
        (lo, lo),
        (hi, hi),
        (lo, hi),
        (clamp(mid + s), clamp(mid - 2 * s)),
        (clamp(own[0] + 3 * s), clamp(own[1] - s)),
    ]
    return list(dict.fromkeys(found))


def relative_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref|; ``inf`` where either is not finite or the shapes differ."""
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape or not (np.isfinite(out).all() and np.isfinite(ref).all()):
        return float("inf")
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-12)
    return float(np.abs(out - ref).max(initial=0.0)) / scale


def exact_range(sizes: SizeRange, own: int, error: Callable[[int], float]) -> SizeRange | None:
    """The square sides around ``own`` (within ``sizes``) where ``error(side)`` stays below
    :data:`EXACT`, walking out from ``own`` one step at a time; None where ``own`` itself is
    over."""
    s = sizes.step
    start = min(max(own // s * s, sizes.min), sizes.max)
    if not error(start) <= EXACT:
        return None
    lo = hi = start
    while lo - s >= sizes.min and error(lo - s) <= EXACT:
        lo -= s
    while hi + s <= sizes.max and error(hi + s) <= EXACT:
        hi += s
    return SizeRange(s, lo, hi)


def inexact_line(kernel: str, where: str, worst: float, at: tuple[int, int], ok: SizeRange) -> str:
    return (
        f"{where}: the position-embedding kernel {kernel} is not exact in the export (relative "
        f"error {worst:.1e} at {at[0]}x{at[1]}); it stays below {EXACT:g} for {ok.describe()}, "
        "which the export now takes"
    )


__all__ = [
    "ANTIALIAS_GRAPH",
    "EXACT",
    "SizeRange",
    "check_sizes",
    "exact_range",
    "inexact_line",
    "relative_error",
    "size_range",
]
