"""``vitkit export --precision bf16``: an engine directory that OpenVINO runs at bf16, with its
accuracy against fp32 recorded in ``engine.json`` (vitkit.engines.bf16 for why bf16; the
directory itself: vitkit.engines.openvino_export)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.engines.dynamic_size import SizeRange
from vitkit.engines.openvino_export import OPENVINO_FILES, export_openvino
from vitkit.errors import VitkitError

BF16_FILES = OPENVINO_FILES


def export_bf16(
    model: nn.Module,
    ckpt: Any,
    out: str | Path,
    *,
    engine: str = "openvino",
    measure: Callable[[nn.Module], dict[str, Any] | None] | None = None,
    overwrite: bool = False,
    sizes: SizeRange | None = None,
    features: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (fp32, eval) into the engine directory ``out`` for ``engine`` at bf16:
    OpenVINO IR of the fp32 graph (``model.xml`` + ``model.bin``) that OpenVINO's CPU plugin
    runs with its bf16 inference precision, and ``engine.json`` recording ``precision: bf16``
    and ``versus_fp32``: what ``measure(bf16 engine model)`` returns (top-1 beside fp32's and
    the agreement; null where nothing was measured). Refused on a CPU without native bf16
    (OpenVINO would run fp32 there and the accuracy would not be bf16's)."""
    if engine != "openvino":
        raise VitkitError(
            f"--precision bf16 writes a model for openvino, not {engine} (PyTorch converts a "
            "checkpoint to bf16 as it loads it: vitkit predict --precision bf16)"
        )
    return export_openvino(
        model, ckpt, out, precision="bf16", measure=measure, overwrite=overwrite, sizes=sizes,
        features=features,
    )  # fmt: skip


__all__ = ["BF16_FILES", "export_bf16"]
