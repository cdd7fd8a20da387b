"""``torch.compile`` for training: one place that decides how, and what to do without a compiler.

Inductor fuses the elementwise work around the matmuls (LayerNorm, GELU, softmax, the bf16
casts and the residual adds) into generated C++ (CPU) or Triton (CUDA) kernels. Shapes are
compiled statically: training batches all have one shape (the loader drops the last partial
batch), and a static graph is what ``reduce-overhead`` needs to replay CUDA graphs.
"""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Literal, cast

import torch

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = (
    "default",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
)


def cpu_compiler() -> str | None:
    """The C++ compiler Inductor would use on the CPU, or None if there is none."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def compile_for_training(
    model: torch.nn.Module, mode: str, device: torch.device
) -> torch.nn.Module:
    """``torch.compile(model, mode=mode, dynamic=False)``; on a CPU without a C++ compiler, the
    model itself with a warning (compiling would fail at the first step)."""
    if device.type == "cpu" and cpu_compiler() is None:
        warnings.warn(
            "compile: no C++ compiler (g++, c++ or clang++; or $CXX) found for torch.compile "
            "on the CPU; training eagerly",
            stacklevel=2,
        )
        return model
    if device.type == "cpu" and mode == "reduce-overhead":
        mode = "default"  # CUDA graphs only; on the CPU this mode is the default one
    # torch.compile of a Module returns a Module (an OptimizedModule); the stub says Callable.
    return cast(torch.nn.Module, torch.compile(model, mode=mode, dynamic=False))
