"""OpenVINO's own outputs checked against vitkit's PyTorch model, as an engine directory of
``vitkit export`` runs them (vitkit.engines.openvino_export, vitkit.engines.int8).

ONNX Runtime's check of the fp32 graph does not speak for OpenVINO: its antialiased bicubic
``Resize`` is not PyTorch's (which is why an export of any size resamples an antialiased E_pos
as matrix products, :func:`vitkit.models.posemb_resample.antialiased`). OpenVINO's fp32 run is
checked at the sizes :func:`vitkit.engines.dynamic_size.check_sizes` picks and the range
narrowed to where it is exact, should it not be (said in one line); bf16's error is recorded
as measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.engines.backends import openvino_runner
from vitkit.engines.dynamic_size import SizeRange, check_sizes


def openvino_fp32_check(
    module: nn.Module, graph: Path, own: tuple[int, int], sizes: SizeRange | None, where: str
) -> tuple[SizeRange | None, dict[str, Any]]:
    """The fp32 graph ``graph`` (ONNX or IR) run by OpenVINO at f32 against ``module``: the
    range where it is exact, and the check (a range over 1e-4 somewhere is narrowed, said in
    one line)."""
    run = openvino_runner(graph, None, "fp32")
    return openvino_check(module, run, own, sizes, "fp32", where)


def openvino_check(
    module: nn.Module,
    run: Callable[[Any], list[Any]],
    own: tuple[int, int],
    sizes: SizeRange | None,
    precision: str,
    where: str,
) -> tuple[SizeRange | None, dict[str, Any]]:
    """OpenVINO (``run``) against ``module`` in PyTorch at the own size or, with ``sizes``, at
    several: fp32 through :func:`vitkit.engines.export_record.checked` (refused or narrowed
    over 1e-4); bf16 recorded as measured (its 8-bit mantissa, no limit)."""
    from vitkit.engines.export_record import checked
    from vitkit.engines.onnx_export import check_at_sizes

    def measure(points: Sequence[tuple[int, int]]) -> dict[str, float]:
        return check_at_sizes(module, run, points)

    what = f"OpenVINO's CPU plugin at {precision}"
    if precision == "fp32":
        kernel = getattr(getattr(module, "cfg", None), "pos_resample", None)
        taken, check = checked(measure, own, sizes, where=where, kernel=kernel)
        return taken, {**check, "what": what}
    errors = measure(check_sizes(sizes, own) if sizes is not None else [own])
    worst = max(errors.values())
    check = {
        "against": "vitkit PyTorch (fp32)",
        "max_relative_error": worst,
        "limit": None,
        "sizes": errors,
        "what": what,
    }
    return sizes, check


__all__ = ["openvino_check", "openvino_fp32_check"]
