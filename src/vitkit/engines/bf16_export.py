"""``vitkit export --precision bf16``: an engine directory that OpenVINO runs at bf16, with its
accuracy against fp32 recorded in ``engine.json`` (vitkit.engines.bf16 for why bf16)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.engines.backends import ENGINE_FILE, EngineModel, openvino_runner, require
from vitkit.engines.bf16 import check_bf16_cpu
from vitkit.engines.dynamic_size import SizeRange
from vitkit.engines.int8 import write_engine_dir
from vitkit.errors import VitkitError

BF16_FILES = ("model.xml", "model.bin", ENGINE_FILE)


def export_bf16(
    model: nn.Module,
    ckpt: Any,
    out: str | Path,
    *,
    engine: str = "openvino",
    measure: Callable[[nn.Module], dict[str, Any] | None] | None = None,
    overwrite: bool = False,
    sizes: SizeRange | None = None,
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
    require("openvino")
    check_bf16_cpu()
    ov = require("openvino")

    def make(fp32: Path, tmp: Path) -> dict[str, Any]:
        ov.save_model(ov.Core().read_model(str(fp32)), str(tmp / "model.xml"), False)
        run = openvino_runner(tmp / "model.xml", None, "bf16")
        versus = measure(EngineModel(run, "openvino", "bf16")) if measure else None
        return {
            "engine": "openvino",
            "precision": "bf16",
            "files": {"openvino": "model.xml"},
            "versus_fp32": versus,
        }

    return write_engine_dir(model, ckpt, out, BF16_FILES, make, overwrite=overwrite, sizes=sizes)


__all__ = ["BF16_FILES", "export_bf16"]
