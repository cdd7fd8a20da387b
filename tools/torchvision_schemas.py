"""Lets PyPI's torchvision import beside a CPU build of the same PyTorch (so timm and
transformers' ViT classes import too).

PyPI's torchvision is built against PyPI's CUDA build of PyTorch. Beside a CPU build installed
from a local wheel its compiled operators do not load, and ``import torchvision`` then fails on
registering fake kernels for two of them: ``operator torchvision::nms does not exist``. With
this module imported first (``make setup`` installs it with a ``.pth`` start-up line, only where
``import torchvision`` fails), the two operator schemas are defined just before torchvision is
first imported. Nothing else changes: torchvision's Python code, its transforms and everything
timm and transformers use work; calling ``torchvision.ops.nms`` itself raises PyTorch's "no
kernel" error instead of computing anything.

Start-up costs nothing: PyTorch is imported only when torchvision is, which imports it anyway.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

OPERATORS = ("nms", "qnms")
_LIBRARIES: list[Any] = []  # kept alive: a torch.library.Library drops its schemas when freed


class DefineBeforeTorchvision(importlib.abc.MetaPathFinder):
    """A finder that finds nothing: on the first ``import torchvision`` it defines the operator
    schemas torchvision expects, removes itself, and lets the normal finders do the import."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            define_schemas()
        return None


def define_schemas() -> None:
    import torch

    if _LIBRARIES or hasattr(torch.ops.torchvision, "nms") or operators_load():
        return  # defined already, or a torchvision built for this PyTorch defines them
    library = torch.library.Library("torchvision", "DEF")
    for op in OPERATORS:
        library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARIES.append(library)


def operators_load() -> bool:
    """Whether torchvision's compiled operators load beside this PyTorch (then they define the
    schemas themselves, and defining them here first would clash)."""
    import importlib.util
    from pathlib import Path

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return True  # no torchvision: nothing to prepare
    for library in Path(spec.origin).parent.glob("_C*.so"):
        try:
            torch.ops.load_library(str(library))
        except (OSError, RuntimeError):
            return False
        return True
    return False


def install() -> None:
    if "torchvision" not in sys.modules and not any(
        isinstance(f, DefineBeforeTorchvision) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, DefineBeforeTorchvision())


install()
