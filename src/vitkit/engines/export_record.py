"""What an exported model says about itself, and the check it passed.

Every artefact ``vitkit export`` writes records its source, its sizes, its precision and the
check it passed: an ONNX file in its ``metadata_props`` (:func:`vitkit.engines.onnx_export.
write_metadata`), an engine directory in ``engine.json``, a ``.pt2`` package in a JSON file
inside it (:mod:`vitkit.engines.pt2_package`). The record is one dict (:func:`record`);
:func:`checked` measures the export against vitkit's PyTorch model at several sizes and, where
a position-embedding kernel is not exact in the exported graph, narrows the size range to where
it is (said in one line). ``vitkit inspect`` prints any of them (:func:`describe_export`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vitkit.engines.dynamic_size import (
    ANTIALIAS_GRAPH,
    EXACT,
    SizeRange,
    check_sizes,
    exact_range,
    inexact_line,
)
from vitkit.errors import VitkitError

RECORD_FORMAT = "vitkit-export"


def record(
    ckpt: Any,
    *,
    artefact: str,
    precision: str = "fp32",
    sizes: SizeRange | None = None,
    features: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The self-description of an export of ``ckpt``: enough to run it without vitkit's model
    code (config, preprocessing, classes) and to say what it is."""
    cfg = ckpt.model_config
    return {
        "format": RECORD_FORMAT,
        "artefact": artefact,
        "source": str(ckpt.path),
        "source_format": ckpt.format,
        "model": cfg.to_dict(),
        "preprocess": ckpt.preprocess.to_dict(),
        "class_names": list(ckpt.class_names),
        "meta": {k: v for k, v in ckpt.meta.items() if k in ("dataset",)},
        "precision": precision,
        "image_size": list(cfg.image_size),
        "sizes": sizes.to_dict() if sizes is not None else None,
        "pos_resample": getattr(cfg, "pos_resample", None),
        "antialias_graph": ANTIALIAS_GRAPH,
        "features": features,
        "outputs": features["outputs"] if features else ["logits"],
    }


def checked(
    measure: Callable[[Sequence[tuple[int, int]]], dict[str, float]],
    own: tuple[int, int],
    sizes: SizeRange | None,
    *,
    where: str,
    kernel: str | None,
    against: str = "vitkit PyTorch",
) -> tuple[SizeRange | None, dict[str, Any]]:
    """Check an export with ``measure(sizes) -> {"HxW": relative error}`` at its own size or,
    with ``sizes``, at several (:func:`check_sizes`). Refused in one line where the error is
    over :data:`EXACT` at the own size; over it elsewhere (a kernel not exact in the graph),
    the range is narrowed to where it stays below, said in one line. Returns the range the
    export takes and the check to record."""
    points = check_sizes(sizes, own) if sizes is not None else [own]
    errors = measure(points)
    worst_at = max(errors, key=lambda k: errors[k])
    worst = errors[worst_at]
    check: dict[str, Any] = {
        "against": against,
        "max_relative_error": worst,
        "limit": EXACT,
        "sizes": errors,
    }
    if worst <= EXACT:
        return sizes, check
    first = next(iter(errors))
    if sizes is None or not errors[first] <= EXACT:
        raise VitkitError(
            f"{where}: the export differs from {against} by {worst:.2e} (relative, > {EXACT:g}) "
            f"at {worst_at}"
        )

    def at(side: int) -> float:
        return measure([(side, side)])[f"{side}x{side}"]

    ok = exact_range(sizes, own[0], at)
    if ok is None:  # (the own size passed above: not reached)
        raise VitkitError(f"{where}: the export differs from {against} by {worst:.2e}")
    h, w = (int(v) for v in worst_at.split("x"))
    print(inexact_line(str(kernel), where, worst, (h, w), ok), file=sys.stderr)
    check["narrowed_from"] = sizes.to_dict()
    return ok, check


def describe_export(info: dict[str, Any], path: str | Path) -> str:
    """The record of an export as the lines ``vitkit inspect`` prints."""
    cfg = info.get("model", {})
    sizes = info.get("sizes")
    size = info.get("image_size") or cfg.get("image_size")
    lines = [
        f"{path}: {info.get('artefact', 'export')} written by vitkit export",
        f"  source        {info.get('source')} ({info.get('source_format', '?')})",
        f"  precision     {info.get('precision', info.get('precision'))}",
    ]
    if sizes:
        r = SizeRange.from_dict(sizes)
        lines.append(f"  sizes         dynamic: {r.describe()} (preprocessing: {_px(size)})")
    else:
        lines.append(f"  sizes         fixed {_px(size)}, dynamic batch")
    if info.get("pos_resample"):
        lines.append(f"  E_pos kernel  {info['pos_resample']}")
    lines.append(f"  outputs       {', '.join(info.get('outputs', ['logits']))}")
    check = info.get("check")
    if check:
        at = ", ".join(f"{k}: {v:.1e}" for k, v in check.get("sizes", {}).items())
        limit = check.get("limit")
        bound = f"<= {limit}" if limit is not None else "as measured, no limit"
        what = f" ({check['what']})" if check.get("what") else ""
        lines.append(
            f"  check         against {check.get('against')}{what}: max relative error "
            f"{check.get('max_relative_error', float('nan')):.2e} ({bound}) at {at}"
        )
        if check.get("narrowed_from"):
            lines.append(
                f"                narrowed from {check['narrowed_from']} (kernel not exact)"
            )
    else:
        lines.append("  check         none recorded")
    return "\n".join(lines)


def _px(size: Any) -> str:
    return f"{size[0]}x{size[1]} px" if isinstance(size, (list, tuple)) and len(size) == 2 else "?"


def dumps(info: dict[str, Any]) -> str:
    return json.dumps(info, indent=1)


__all__ = ["RECORD_FORMAT", "checked", "describe_export", "dumps", "record"]
