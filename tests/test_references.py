"""The torchvision shim of tests/references.py: it stands in only where torchvision cannot load.

Seen on an H100 machine (torch 2.11 with its own torchvision): the shim defined
``torchvision::nms`` before timm imported the real torchvision, whose C++ registration of the same
operator then aborted the process (bench/speed.py died with "Tried to register an operator ...
multiple times"). Each case runs in its own interpreter, with a stand-in torchvision first on the
path, since operator registrations cannot be undone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

WORKING = """
import torch
_LIB = torch.library.Library("torchvision", "DEF")  # what a working torchvision registers
for op in ("nms", "qnms"):
    _LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
"""
BROKEN = """
raise RuntimeError("operator torchvision::nms does not exist")  # a build for another torch
"""
CHECK = """
import sys, torch
# (without the start-up hook make installs where torchvision cannot load: this is the shim's test)
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "DefineBeforeTorchvision"]
from references import _define_torchvision_ops
_define_torchvision_ops()
print("shim" if __import__("references")._SHIM is not None else "no shim")
print("loaded" if "torchvision" in sys.modules else "not loaded")
torch.ops.torchvision.nms  # defined either way: timm's import of torchvision needs it
"""


def _run(tmp_path: Path, torchvision: str) -> list[str]:
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text(torchvision)
    env = {"PYTHONPATH": f"{tmp_path}:{TESTS}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:2]


def test_a_working_torchvision_registers_its_own_operators_and_gets_no_shim(
    tmp_path: Path,
) -> None:
    assert _run(tmp_path, WORKING) == ["no shim", "loaded"]


def test_a_torchvision_that_cannot_load_gets_the_shim_and_is_forgotten(tmp_path: Path) -> None:
    assert _run(tmp_path, BROKEN) == ["shim", "not loaded"]
