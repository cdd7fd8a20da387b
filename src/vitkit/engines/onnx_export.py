"""Export a ViT to ONNX (for onnxruntime, TensorRT, OpenVINO, ...).

``export_onnx`` traces the model with ``torch.onnx.export(..., dynamo=True)`` (needs the
``onnx`` and ``onnxscript`` packages: ``pip install 'vitkit[onnx]'``). The batch dimension is
dynamic; the image size is the model's (the graph is traced there, with the position-embedding
table as it is: for another size, convert with ``vitkit convert --image-size`` first). Input
``pixel_values`` [B, C, H, W] (normalised as the checkpoint's preprocessing says), output
``logits`` (or the pre-logit features for a model without a head). The file is written under a
temporary name and renamed, so an interrupted export leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from vitkit.errors import VitkitError
from vitkit.output_files import disk_bytes, publish, writing
from vitkit.registry.model_config import ModelConfig


def export_onnx(model: nn.Module, path: str | Path, *, opset: int | None = None) -> Path:
    """Write ``model`` (eval mode, fp32) as ONNX with a dynamic batch dimension."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise VitkitError(
            "ONNX export needs the onnx and onnxscript packages: pip install 'vitkit[onnx]'"
        ) from None
    path = Path(path)
    cfg = cast(ModelConfig, model.cfg)  # a vitkit model (ViT or BiT ResNet) carries its config
    model = model.eval().float()
    example = torch.zeros(2, cfg.in_chans, *cfg.image_size)
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
            _without(registry, "torchvision is not installed"),
        ):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (example,),
                str(tmp),
                dynamo=True,
                input_names=["pixel_values"],
                output_names=["logits"],
                dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=4096)}},
                external_data=False,
                **kwargs,
            )
        return publish(tmp, path)


class _Drop(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextlib.contextmanager
def _without(logger: logging.Logger, prefix: str) -> Iterator[None]:
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
