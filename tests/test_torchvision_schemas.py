"""timm and transformers import in the environment ``make`` builds, where PyPI's torchvision
cannot load its compiled operators beside a CPU build of PyTorch (tools/torchvision_schemas.py).

Each check runs in a fresh interpreter without the test suite's own shim (tests/references.py).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"

# torchvision on its own: without a start-up hook that `make setup` may have installed
NATIVE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "DefineBeforeTorchvision"]
import torchvision
"""

# what a user's script does first
USER_SCRIPT = """
import timm
import torchvision
from torchvision import transforms
from transformers import ViTForImageClassification

model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3)
print(tuple(model(__import__("torch").zeros(1, 3, 32, 32)).shape), transforms.Resize(8).size)
"""


def _run(code: str, *, hook: bool) -> subprocess.CompletedProcess[str]:
    prefix = f"import sys; sys.path.insert(0, {str(TOOLS)!r}); import torchvision_schemas\n"
    return subprocess.run(
        [sys.executable, "-c", (prefix if hook else "") + code],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _needs_references() -> None:
    for name in ("timm", "torchvision", "transformers"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (a test-only dependency)")


def test_the_hook_lets_timm_torchvision_and_transformers_import() -> None:
    _needs_references()
    done = _run(USER_SCRIPT, hook=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["(1,", "3)", "8"]


def test_the_environment_imports_timm_as_a_user_script_does() -> None:
    """No hook of the test's own: the environment itself (make's start-up hook where needed)."""
    _needs_references()
    done = _run(USER_SCRIPT, hook=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_hook_defines_nothing_where_torchvision_loads_its_operators() -> None:
    """Beside a torchvision built for this PyTorch the schemas come from torchvision itself:
    defining them first would clash with its registration."""
    _needs_references()
    if _run(NATIVE, hook=False).returncode != 0:
        # this PyTorch cannot load torchvision's operators: the hook must then define them
        done = _run(
            "import torch, torchvision; print(hasattr(torch.ops.torchvision, 'nms'))", hook=True
        )
        assert done.returncode == 0 and done.stdout.strip().endswith("True"), done.stderr[-2000:]
        return
    done = _run("import torchvision_schemas as t, torchvision; print(len(t._LIBRARIES))", hook=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("0"), done.stderr[-2000:]
