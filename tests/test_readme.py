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


def readme_commands() -> list[str]:
    """Every ``vitkit ...`` command of the README's bash blocks (continuations joined, the
    comment cut), except those with a placeholder (``...``)."""
    text = README.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("vitkit ") and "..." not in line:
                commands.append(line)
    return commands


def test_every_readme_command_parses_as_written() -> None:
    """Each command's options exist and take the values shown (argparse, nothing run)."""
    import shlex

    from vitkit.cli import build_parser

    commands = readme_commands()
    assert len(commands) > 20
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit as e:
            raise AssertionError(f"README: {command!r} does not parse") from e


def test_readme_torchrun_on_cpu_command_runs(tmp_path: Path) -> None:
    """The README's two-process CPU command, as written; substitutes: --max-steps 2 and an
    --out-dir here (the recipe's epochs would take minutes)."""
    import shlex
    import subprocess
    import sys

    (command,) = [c for c in readme_commands() if "--nproc-per-node 2" in c]
    args = [*shlex.split(command)[1:], "--max-steps", "2", "--out-dir", str(tmp_path / "run")]
    env = {**os.environ, "PYTHONPATH": str(README.parent / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "vitkit", *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "report.json").is_file()
