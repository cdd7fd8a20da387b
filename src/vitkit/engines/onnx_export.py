"""Export a ViT to ONNX (for onnxruntime, TensorRT, OpenVINO, ...).

``export_onnx`` traces the model with ``torch.onnx.export(..., dynamo=True)`` (needs the
``onnx`` and ``onnxscript`` packages: the ``onnx`` extra). The batch dimension is
dynamic; the image size is the model's, or with ``sizes`` (:mod:`vitkit.engines.dynamic_size`)
any multiple of the patch in a range, the position embeddings resampled inside the graph with
the checkpoint's kernel. Input ``pixel_values`` [B, C, H, W] (normalised as the checkpoint's
preprocessing says), output ``logits`` (or the pre-logit features for a model without a head;
a features export, :mod:`vitkit.engines.feature_export`, names its own). ``metadata`` is kept in
the file's ``metadata_props`` under ``vitkit`` (JSON: the source, sizes, precision and check).
The file is written under a temporary name and renamed, so an interrupted export leaves nothing
half-written.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from vitkit.engines.dynamic_size import SizeRange, relative_error
from vitkit.errors import VitkitError
from vitkit.output_files import disk_bytes, publish, writing
from vitkit.registry.model_config import ModelConfig

METADATA_KEY = "vitkit"


def export_onnx(
    model: nn.Module,
    path: str | Path,
    *,
    opset: int | None = None,
    sizes: SizeRange | None = None,
    outputs: Sequence[str] = ("logits",),
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (eval mode, fp32) as ONNX with a dynamic batch dimension (and with
    ``sizes`` a dynamic height and width); ``outputs``: the names of its outputs."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise VitkitError(
            "ONNX export needs the onnx and onnxscript packages: pip install '.[onnx]' "
            "in vitkit's clone"
        ) from None
    path = Path(path)
    cfg = cast(ModelConfig, model.cfg)  # a vitkit model (ViT or BiT ResNet) carries its config
    model = model.eval().float()
    example = torch.zeros(2, cfg.in_chans, *example_size(cfg.image_size, sizes))
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1, max=4096)}
    dims.update(sizes.dynamic_shapes() if sizes is not None else {})
    path.parent.mkdir(parents=True, exist_ok=True)  # as every writer: missing parents are made
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.onnx")
    kwargs: dict[str, Any] = {} if opset is None else {"opset_version": opset}
    # the exporter's own deprecation chatter and its progress lines ("[torch.onnx] ... ✅"),
    # and its registry's "torchvision is not installed. Skipping torchvision::nms" (one line per
    # torchvision op; a ViT uses none of them)
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    need = disk_bytes(sum(p.numel() * p.element_size() for p in model.parameters()) + 50_000)
    with writing(path, tmp, need=need):  # no room: one line, no temporary file left
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            without_log(registry, "torchvision is not installed"),
        ):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (example,),
                str(tmp),
                dynamo=True,
                input_names=["pixel_values"],
                output_names=list(outputs),
                dynamic_shapes={"x": dims},
                external_data=False,
                **kwargs,
            )
        if metadata is not None:
            write_metadata(tmp, metadata)
        return publish(tmp, path)


def example_size(own: tuple[int, int], sizes: SizeRange | None) -> tuple[int, int]:
    """The size an export is traced at: the model's own, clamped into ``sizes``."""
    if sizes is None:
        return own
    return (
        min(max(own[0] // sizes.step * sizes.step, sizes.min), sizes.max),
        min(max(own[1] // sizes.step * sizes.step, sizes.min), sizes.max),
    )


def write_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """``metadata`` (JSON) into the ONNX file's ``metadata_props`` under ``vitkit``."""
    import onnx

    model = onnx.load(str(path))
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(metadata)
    onnx.save(model, str(path))


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """What :func:`export_onnx` recorded in an ONNX file (None: nothing, or not vitkit's)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # (protobuf's DecodeError and others: one line)
        raise VitkitError(f"{path}: not an ONNX file ({type(e).__name__})") from None
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            try:
                found = json.loads(p.value)
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None


def ort_model(path: str | Path) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise VitkitError("checking an export needs onnxruntime: pip install onnxruntime") from None
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def check_at_sizes(
    model: nn.Module,
    run: Any,
    sizes: Sequence[tuple[int, int]],
    batches: tuple[int, ...] = (3, 1),
    seed: int = 0,
) -> dict[str, float]:
    """The largest relative error of ``run`` (numpy images -> list of numpy outputs) against
    ``model`` (fp32, eval) at each of ``sizes``, on random images (batches of ``batches`` in
    turn): {"HxW": error}."""
    cfg = cast(ModelConfig, model.cfg)
    g = torch.Generator().manual_seed(seed)
    found: dict[str, float] = {}
    for i, (h, w) in enumerate(sizes):
        x = torch.randn(batches[i % len(batches)], cfg.in_chans, h, w, generator=g)
        with torch.inference_mode():
            ref = model.eval().float()(x)
        refs = [ref] if isinstance(ref, Tensor) else list(ref)
        try:
            outs = run(x.numpy())
        except Exception as e:  # (the runtime's own error: one line, naming the size)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise VitkitError(f"the export does not run at {h}x{w}: {first[:300]}") from None
        errs = [relative_error(o, r.numpy()) for o, r in zip(outs, refs)]
        found[f"{h}x{w}"] = max(errs) if len(outs) == len(refs) else float("inf")
    return found


class _Drop(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def without_log(logger: logging.Logger, prefix: str) -> Iterator[None]:
    """``logger``'s records starting with ``prefix`` dropped inside the block."""
    drop = _Drop(prefix)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def check_onnx(
    model: nn.Module, path: str | Path, batch_sizes: tuple[int, ...] = (1, 3), seed: int = 0
) -> float:
    """Max |onnxruntime - PyTorch| over random inputs of several batch sizes; ``inf`` where
    either side is not finite (NaN is a failure, never a difference of 0: Python's ``max``
    and ``>`` both drop a NaN)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise VitkitError("checking an export needs onnxruntime: pip install onnxruntime") from None
    cfg = cast(ModelConfig, model.cfg)  # a vitkit model (ViT or BiT ResNet) carries its config
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for b in batch_sizes:
        x = torch.randn(b, cfg.in_chans, *cfg.image_size, generator=g)
        with torch.inference_mode():
            ref = model.eval().float()(x).numpy()
        out = session.run(None, {"pixel_values": x.numpy()})[0]
        if out.shape != ref.shape or not (np.isfinite(out).all() and np.isfinite(ref).all()):
            return float("inf")
        worst = max(worst, float(np.abs(out - ref).max()))
    return worst
