"""bench/paper_cpu.sh, the CPU miniature of docs/paper.md: every command it runs is one the CLI
accepts, and a study it does not know is refused with its name."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from vitkit.cli import build_parser

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "paper_cpu.sh"
# the vitkit study of each command the script runs by default, in order (the budget checks:
# selfsup at 2x and 4x the fine-tuning budget, data-scale at 2x the epochs)
STUDIES = (
    "data-scale", "selfsup", "resolution", "compute", "inside", "selfsup", "selfsup", "data-scale",
)  # fmt: skip


def _commands(tmp_out: Path, *studies: str) -> subprocess.CompletedProcess[str]:
    # print each vitkit command instead of running it; OUT: no copy of pre-training runs
    env = {**os.environ, "VITKIT": "echo", "OUT": str(tmp_out)}
    return subprocess.run(
        ["bash", str(SCRIPT), *studies], env=env, capture_output=True, text=True, check=False
    )


def test_every_command_of_the_script_parses(tmp_path: Path) -> None:
    done = _commands(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(STUDIES)
    parser = build_parser()
    for line, study in zip(lines, STUDIES, strict=True):
        args = parser.parse_args(shlex.split(line))
        assert args.study == study
        assert args.seeds == (1 if line is lines[-1] else 3)  # the data-scale check: seed 0
        assert args.out_dir.startswith(str(tmp_path))
    budgets = [shlex.split(line) for line in lines[5:7]]
    assert [b[b.index("--min-steps") + 1] for b in budgets] == ["2000", "4000"]


def test_an_unknown_study_is_refused_by_name(tmp_path: Path) -> None:
    done = _commands(tmp_path, "selfsup", "nope")
    assert done.returncode == 2
    assert "unknown study 'nope'" in done.stderr
