"""bench/paper_cpu.sh, the CPU miniature of docs/paper.md: every command it runs is one the CLI
accepts, and a study it does not know is refused with its name."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from vitkit.cli import build_parser

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "paper_cpu.sh"
STUDIES = ("data-scale", "selfsup", "resolution", "compute", "inside")


def _commands(*studies: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VITKIT": "echo"}  # print each vitkit command instead of running it
    return subprocess.run(
        ["bash", str(SCRIPT), *studies], env=env, capture_output=True, text=True, check=False
    )


def test_every_command_of_the_script_parses() -> None:
    done = _commands()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(STUDIES)
    parser = build_parser()
    for line, study in zip(lines, STUDIES, strict=True):
        args = parser.parse_args(shlex.split(line))
        assert args.study == study
        assert args.seeds == 3
        assert args.out_dir.startswith("runs/")


def test_an_unknown_study_is_refused_by_name() -> None:
    done = _commands("selfsup", "nope")
    assert done.returncode == 2
    assert "unknown study 'nope'" in done.stderr
