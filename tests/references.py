"""timm and transformers, imported for parity tests (test-only dependencies).

The CPU build of torch has no ``torchvision::nms`` kernel registry for the torchvision wheel that
timm pulls in, and importing torchvision then fails on registering fake kernels for ``nms`` and
``qnms``. Defining the two operator schemas first (no implementation: nothing here calls them)
lets torchvision, timm and transformers import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

import pytest
import torch

# A test that loads OpenVINO or NNCF: run in a pytest process of its own (tests/conftest.py),
# skipped where OpenVINO is not installed. `pytestmark = OPENVINO`, `pytest.param(..., marks=
# OPENVINO)`, or each mark on a test function.
OPENVINO = [
    pytest.mark.openvino,
    pytest.mark.skipif(
        importlib.util.find_spec("openvino") is None,
        reason="openvino is not installed (the openvino extra)",
    ),
]


def needs_openvino(test):  # type: ignore[no-untyped-def]
    """``test`` marked OPENVINO (a child process; skipped without OpenVINO)."""
    for mark in OPENVINO:
        test = mark(test)
    return test


_SHIM: torch.library.Library | None = None


def _define_torchvision_ops() -> None:
    global _SHIM
    if _SHIM is not None:
        return
    if importlib.util.find_spec("torchvision") is None:
        return  # timm imports without torchvision
    try:  # a torchvision built for this torch registers its own operators: no shim then
        importlib.import_module("torchvision")
        return
    except RuntimeError:  # "operator torchvision::nms does not exist": forget the half import
        for module in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[module]
    _SHIM = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _SHIM.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_reference(name: str) -> ModuleType:
    """``timm`` or ``transformers``; skips the test where the package is not installed."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (a test-only dependency: pip install -e '.[test]')")
    _define_torchvision_ops()  # before the import: timm imports torchvision at import time
    return importlib.import_module(name)


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with every parameter moved by N(0, 0.1²) noise (seeded), in eval mode: weights
    that differ from any initialisation, so a parity test cannot pass on zeros or ones."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    return model.eval()


def load_bench(name: str, module_name: str | None = None) -> ModuleType:
    """bench/NAME.py as a module (the scripts are not a package), its folder importable."""
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(
        module_name or f"{name}_bench", bench / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
