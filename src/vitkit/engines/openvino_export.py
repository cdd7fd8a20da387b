"""OpenVINO engine directories at fp32 and bf16: ``vitkit export --engine openvino`` and
``--precision bf16`` (int8: vitkit.engines.int8).

The directory holds OpenVINO IR of the model's fp32 graph (``model.xml`` + ``model.bin``, read
from its ONNX export; with ``--dynamic-size`` height and width dynamic) beside ``engine.json``.
OpenVINO's CPU plugin runs it at its f32 inference precision (fp32) or at bf16 (a CPU with
native bf16 only: elsewhere OpenVINO would silently run fp32). The check recorded is
OpenVINO's own, run as the directory will be run, against vitkit's PyTorch model at the sizes
:func:`vitkit.engines.dynamic_size.check_sizes` picks: fp32 refused in one line over
:data:`~vitkit.engines.dynamic_size.EXACT` (the range narrowed where only some sizes are
over), bf16's rounding recorded as measured, with top-1 beside fp32 where a dataset is given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from vitkit.engines.backends import ENGINE_FILE, EngineModel, openvino_runner, require
from vitkit.engines.dynamic_size import SizeRange
from vitkit.engines.int8 import write_engine_dir
from vitkit.engines.openvino_check import openvino_check, openvino_fp32_check
from vitkit.errors import VitkitError

OPENVINO_FILES = ("model.xml", "model.bin", ENGINE_FILE)
OPENVINO_PRECISIONS = ("fp32", "bf16")


def export_openvino(
    model: nn.Module,
    ckpt: Any,
    out: str | Path,
    *,
    precision: str = "fp32",
    measure: Callable[[nn.Module], dict[str, Any] | None] | None = None,
    overwrite: bool = False,
    sizes: SizeRange | None = None,
    features: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (fp32, eval) into the engine directory ``out`` as OpenVINO IR run at
    ``precision``; engine.json records OpenVINO's check against PyTorch and, for bf16,
    ``versus_fp32``: what ``measure(bf16 engine model)`` returns (top-1 beside fp32's and the
    agreement; null where nothing was measured). ``sizes``: a dynamic height and width;
    ``features``: the backbone's named outputs (vitkit.engines.feature_export)."""
    if precision not in OPENVINO_PRECISIONS:
        raise VitkitError(
            f"an OpenVINO engine directory runs at {' or '.join(OPENVINO_PRECISIONS)} "
            f"(int8: --int8), not {precision}"
        )
    ov = require("openvino")
    if precision == "bf16":
        from vitkit.engines.bf16 import check_bf16_cpu

        check_bf16_cpu()
    from vitkit.engines.exports import exported_module

    module = exported_module(model.eval().float(), features)
    cfg = ckpt.model_config
    own = (int(cfg.image_size[0]), int(cfg.image_size[1]))

    def make(fp32: Path, tmp: Path, taken: SizeRange | None) -> dict[str, Any]:
        ov.save_model(ov.Core().read_model(str(fp32)), str(tmp / "model.xml"), False)
        if precision == "bf16" and taken is not None:  # the sizes where its kernel is exact
            taken, _ = openvino_fp32_check(module, tmp / "model.xml", own, taken, str(out))
        run = openvino_runner(tmp / "model.xml", None, precision)
        taken, check = openvino_check(module, run, own, taken, precision, str(out))
        names = tuple(module.names) if features is not None else ("logits",)  # type: ignore
        em = EngineModel(run, "openvino", precision, taken, str(out), names)
        found: dict[str, Any] = {
            "engine": "openvino",
            "precision": precision,
            "files": {"openvino": "model.xml"},
            "check": check,
            "sizes": taken.to_dict() if taken is not None else None,
        }
        if precision == "bf16":
            found["versus_fp32"] = measure(em) if measure and features is None else None
        return found

    return write_engine_dir(
        model, ckpt, out, OPENVINO_FILES, make, overwrite=overwrite, sizes=sizes,
        features=features,
    )  # fmt: skip


__all__ = ["OPENVINO_FILES", "OPENVINO_PRECISIONS", "export_openvino"]
