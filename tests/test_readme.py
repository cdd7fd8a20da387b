"""The README's Python example runs as written (so the README stays true)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    match = re.search(r"## Python API\n\n```python\n(.*?)```", text, re.S)
    assert match, "README lost its Python API example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(match.group(1), str(README), "exec"), namespace)  # noqa: S102
    out = namespace["out"]
    assert len(out.hidden_states) == namespace["model"].cfg.depth + 1  # type: ignore[attr-defined]
    assert namespace["bigger"].shape == (1, 10)  # type: ignore[attr-defined]  # 16 px, trained at 8
    # The example shows the library working: far above chance (10 %); the README says 89 %.
    assert namespace["report"]["test_top1"] > 0.8  # type: ignore[index]
    assert os.path.isdir(tmp_path / "runs" / "digits" / "checkpoints")
