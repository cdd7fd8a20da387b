"""``--resume auto``: one command that starts a run in an empty directory, continues it from
its latest checkpoint when it exists (to the uninterrupted run's weights, bit for bit), and
refuses a directory that holds something else; what it did, in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from vitkit.checkpoints import LATEST, load_checkpoint
from vitkit.cli import main

TINY = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
COMMAND = ["train", "--data", "digits", "--model", "Ti/2", *TINY, "--no-progress"]
COMMAND += ["--batch-size", "32", "--epochs", "1", "--max-steps", "6", "--ckpt-every", "3"]
COMMAND += ["--keep-checkpoints", "9", "--threads", "1", "--resume", "auto"]


def test_the_same_command_starts_then_continues_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = tmp_path / "full"  # absent: started
    assert main([*COMMAND, "--out-dir", str(full)]) == 0
    err = capsys.readouterr().err
    assert f"{full}: holds no run yet; starting it (--resume auto)" in err
    assert "continuing" not in err
    empty = tmp_path / "empty"  # an empty directory: started too
    empty.mkdir()
    assert main([*COMMAND, "--max-steps", "1", "--out-dir", str(empty)]) == 0
    assert "starting it" in capsys.readouterr().err and (empty / "report.json").is_file()

    # Killed after its first checkpoint (step 3): the same command continues it from there.
    killed = tmp_path / "killed"
    (killed / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "train_config.json", killed)
    ckpt = full / "checkpoints" / "step_00000003"
    shutil.copytree(ckpt, killed / "checkpoints" / ckpt.name)
    (killed / "checkpoints" / LATEST).write_text(ckpt.name + "\n")
    assert main([*COMMAND, "--out-dir", str(killed)]) == 0
    err = capsys.readouterr().err
    assert f"{killed}: continuing the run from step_00000003 (step 3)" in err
    assert "starting" not in err
    a, b = load_checkpoint(full).state_dict, load_checkpoint(killed).state_dict
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_directory_holding_something_else_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main([*COMMAND, "--out-dir", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{other}: holds files that are not a vitkit run (notes.txt)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    # --resume alone still asks for an existing run; any other word is refused by the parser.
    assert main(["train", "--smoke", "--resume", "--out-dir", str(tmp_path / "none")]) == 2
    assert "has no checkpoint to resume" in capsys.readouterr().err
    assert main(["train", "--smoke", "--resume", "always", "--out-dir", str(tmp_path)]) == 2
    assert "invalid choice: 'always'" in capsys.readouterr().err
