"""CPU inference, and fp8 on a GPU: ONNX export (``onnx_export``), int8 quantization (``int8``),
running a model under torch, ONNX Runtime or OpenVINO (``backends``), fp32 Linear layers on
oneDNN (``onednn``) and the allocator setting (``allocator``).

The Python way to get the fast model for a checkpoint is :func:`runner`, the one place that
decides how a checkpoint runs (engine, precision, bf16 weights, int8 / fp8, and what a lower
precision is measured against) for ``vitkit predict``, ``eval`` and ``serve`` alike
(:mod:`vitkit.engines.checkpoint_runner`)::

    import vitkit.engines
    from vitkit.eval.predict import predict_files

    run = vitkit.engines.runner("runs/mnist", fast=True)  # or engine=, precision="bf16", ...
    print(run.line)  # e.g. engine: openvino, fp32 (--fast: the fastest exact fp32 path installed)
    top5 = predict_files(run.model, run.checkpoint, ["a.png"], k=5)  # its preprocessing

``precision="auto"`` (serve's default) is decided there too: bf16 where the CPU has it natively
and the model's bf16 top-1 agrees with fp32's on synthetic images, else fp32; ``run.precision``
and ``run.precision_why`` say which and why (:mod:`vitkit.engines.auto_precision`).

``runner`` and ``Runner`` are loaded on first use: ``import vitkit.engines`` imports nothing
(the CLI sets the allocator before PyTorch starts)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Runner", "runner"]

if TYPE_CHECKING:
    from vitkit.engines.checkpoint_runner import Runner, runner


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'vitkit.engines' has no attribute {name!r}")
    return getattr(importlib.import_module("vitkit.engines.checkpoint_runner"), name)
