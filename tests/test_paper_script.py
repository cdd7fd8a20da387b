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
# selfsup at 2x and 4x the fine-tuning budget, data-scale at 2x the epochs), then data-scale
# on shapes-hard, its 2x budget check and its parameter-matched ResNet control
STUDIES = (
    "data-scale", "selfsup", "resolution", "compute", "inside", "selfsup", "selfsup", "data-scale",
    "data-scale", "data-scale", "data-scale",
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
        # the data-scale budget checks and the control: seed 0
        assert args.seeds == (1 if line in (lines[7], lines[9], lines[10]) else 3)
        assert args.out_dir.startswith(str(tmp_path))
    budgets = [shlex.split(line) for line in lines[5:7]]
    assert [b[b.index("--min-steps") + 1] for b in budgets] == ["2000", "4000"]
    shapes = parser.parse_args(shlex.split(lines[8]))
    assert (shapes.data, shapes.sizes) == ("shapes-hard", [1000, 10000, 100000])
    # the control: the 1x budget of the largest size, a ResNet of the ViT's parameter count
    control = parser.parse_args(shlex.split(lines[10]))
    assert (control.sizes, control.epochs, control.min_steps) == ([100000], 10, 1500)
    assert (shapes.epochs, shapes.min_steps) == (10, 1500)
    assert "width_factor=0.25" in control.models and control.out_dir != shapes.out_dir


def test_the_shapes_study_splits_by_sizes_into_one_out_dir(tmp_path: Path) -> None:
    """SIZES runs a part of the shapes-hard study (two processes share the cores); every part
    writes to the same --out-dir, whose full command then reuses the parts' runs."""
    env = {**os.environ, "VITKIT": "echo", "OUT": str(tmp_path), "SIZES": "100000"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    part = build_parser().parse_args(shlex.split(done.stdout))
    full = build_parser().parse_args(shlex.split(_commands(tmp_path, "data-scale-shapes").stdout))
    assert part.sizes == [100000]
    assert part.out_dir == full.out_dir
    assert [m.split("[")[0] for m in part.models.split("],")] == ["Ti/8", "bit_r26x1", "r_vit_ti16"]


def test_an_unknown_study_is_refused_by_name(tmp_path: Path) -> None:
    done = _commands(tmp_path, "selfsup", "nope")
    assert done.returncode == 2
    assert "unknown study 'nope'" in done.stderr


def test_the_shapes_budget_check_trains_the_models_asked_for(tmp_path: Path) -> None:
    """MODELS and SIZES pick the models and sizes of the 2x check (two processes share the
    cores; every part writes to one --out-dir), FACTOR the budget (2 or 4); an unknown model or
    factor is refused by name."""
    env = {**os.environ, "VITKIT": "echo", "OUT": str(tmp_path), "MODELS": "resnet vit"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes-budget"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    args = build_parser().parse_args(shlex.split(done.stdout))
    labels = [m.split("label=")[1].rstrip("]") for m in args.models.split("],")]
    assert labels == ["BiT-ResNet", "ViT"]
    # twice the 1x budget: 10,000 images at twice the minimum steps, 100,000 at twice the epochs
    assert (args.sizes, args.epochs, args.min_steps, args.seeds) == ([10000, 100000], 20, 3000, 1)
    env["SIZES"] = "10000"
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes-budget"], env=env, capture_output=True, text=True
    )
    part = build_parser().parse_args(shlex.split(done.stdout))
    assert (part.sizes, part.out_dir) == ([10000], args.out_dir)
    env["SEEDS"] = "2"  # seeds 0 and 1 (seed 0 reused)
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes-budget"], env=env, capture_output=True, text=True
    )
    assert build_parser().parse_args(shlex.split(done.stdout)).seeds == 2
    del env["SIZES"], env["SEEDS"]
    env["FACTOR"] = "4"  # four times the budget: its own --out-dir
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes-budget"], env=env, capture_output=True, text=True
    )
    four = build_parser().parse_args(shlex.split(done.stdout))
    assert (four.epochs, four.min_steps) == (40, 6000) and four.out_dir.endswith("-4x")
    env["FACTOR"] = "3"
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes-budget"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "FACTOR: '3' is not 2 or 4" in done.stderr
    del env["FACTOR"]
    env["MODELS"] = "vit nope"
    done = subprocess.run(
        ["bash", str(SCRIPT), "data-scale-shapes-budget"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown model 'nope'" in done.stderr
