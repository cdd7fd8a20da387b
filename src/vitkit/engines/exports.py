"""One exported file, checked and self-describing: ONNX or a ``.pt2`` package, of the classifier
or of the backbone's features (``vitkit export``; engine directories: vitkit.engines.int8).

:func:`export_file` builds what is exported (the model, or its ``forward_intermediates`` as
:class:`~vitkit.engines.feature_export.FeatureOutputs`), writes it under a temporary name,
checks it against the same module in PyTorch at several sizes (with ``sizes``: sizes it was not
traced at among them; :func:`vitkit.engines.export_record.checked`), records the source, sizes,
precision and check inside it, and only then puts it in place.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitkit.engines.dynamic_size import SizeRange
from vitkit.engines.export_record import checked, record
from vitkit.errors import VitkitError
from vitkit.output_files import check_destination, publish, writing

FORMATS = ("onnx", "pt2")


def exported_module(model: nn.Module, features: dict[str, Any] | None) -> nn.Module:
    """``model`` itself, or with ``features`` (FeatureOutputs' arguments) its backbone."""
    if features is None:
        return model
    from vitkit.engines.feature_export import FeatureOutputs

    return FeatureOutputs(model, **features)


def export_file(
    model: nn.Module,
    ckpt: Any,
    out: str | Path,
    *,
    fmt: str = "onnx",
    sizes: SizeRange | None = None,
    features: dict[str, Any] | None = None,
    opset: int | None = None,
    check: bool = True,
    overwrite: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Write ``model`` (a checkpoint's, fp32) to ``out`` as ``fmt`` and return the path and its
    record. ``check`` False: no comparison (ONNX only; a package is always checked)."""
    from vitkit.eval.checkpoint_eval import check_finite_weights

    if fmt not in FORMATS:
        raise VitkitError(f"export format {fmt!r}: one of {', '.join(FORMATS)}")
    out = Path(out)
    check_destination(out, reads=[ckpt.path], overwrite=overwrite)
    check_finite_weights(model, ckpt)
    module = exported_module(model.eval().float(), features)
    described = module.describe() if features is not None else None  # type: ignore[operator]
    info = record(ckpt, artefact=fmt, sizes=sizes, features=described)
    names = list(info["outputs"])
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg = ckpt.model_config
    own = (int(cfg.image_size[0]), int(cfg.image_size[1]))
    if fmt == "pt2":
        from vitkit.engines.pt2_package import add_record, export_pt2

        with writing(out):  # no room: one line naming OUT
            tmp, runner = export_pt2(module, out, info, sizes)

        def run(x: np.ndarray) -> list[np.ndarray]:
            with torch.inference_mode():
                got = runner(torch.from_numpy(x))
            got = [got] if isinstance(got, torch.Tensor) else list(got)
            return [g.numpy() for g in got]

    else:
        from vitkit.engines.onnx_export import export_onnx, ort_model

        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}.onnx")
        with writing(out, tmp), contextlib.redirect_stdout(io.StringIO()):
            export_onnx(module, tmp, opset=opset, sizes=sizes, outputs=names)
        run = _onnx_runner(ort_model, tmp) if check else _unchecked
    with writing(out, tmp):  # any failure: the temporary file goes; no room: one line
        if check or fmt == "pt2":
            measure = _measure(module, run)
            kernel = getattr(cfg, "pos_resample", None)
            taken, info["check"] = checked(measure, own, sizes, where=str(out), kernel=kernel)
            info["sizes"] = taken.to_dict() if taken is not None else None
        else:
            info["check"] = None
        if fmt == "pt2":
            add_record(tmp, info)
        else:
            from vitkit.engines.onnx_export import write_metadata

            write_metadata(tmp, info)
        return publish(tmp, out), info


def read_export(path: str | Path) -> dict[str, Any] | None:
    """The record of an export at ``path`` (an ONNX file, a .pt2 package, an engine
    directory), or None where ``path`` is none of them."""
    path = Path(path)
    if path.is_dir():
        from vitkit.engines.backends import is_engine_dir, read_engine_dir

        if not is_engine_dir(path):
            return None
        info, _ = read_engine_dir(path)
        return {"artefact": f"engine directory ({info.get('engine')})", **info}
    if path.suffix == ".pt2":
        from vitkit.engines.pt2_package import read_record

        return read_record(path)
    if path.suffix == ".onnx":
        from vitkit.engines.onnx_export import read_metadata

        found = read_metadata(path)
        if found is None:
            raise VitkitError(f"{path}: an ONNX file without vitkit's record (not vitkit's export)")
        return found
    return None


def _onnx_runner(load: Any, path: Path) -> Any:
    model = load(path)

    def run(x: np.ndarray) -> list[np.ndarray]:
        return list(model.run(None, {"pixel_values": x}))

    return run


def _unchecked(x: np.ndarray) -> list[np.ndarray]:  # (never called: no check asked)
    raise AssertionError


def _measure(module: nn.Module, run: Any) -> Any:
    from vitkit.engines.onnx_export import check_at_sizes

    def measure(sizes: Sequence[tuple[int, int]]) -> dict[str, float]:
        return check_at_sizes(module, run, sizes)

    return measure


__all__ = ["FORMATS", "export_file", "exported_module", "read_export"]
