"""Nothing lost, no silent wrong run: writing never deletes what it did not create, resuming
runs the run that was asked for, a re-run gets its own directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vitkit.cli import main

TINY = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
DIGITS = ["--data", "digits", "--model", "Ti/2", *TINY, "--no-progress", "--batch-size", "32"]
SHORT = [*DIGITS, "--epochs", "1", "--max-steps", "2"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-step bf16 run on digits: checkpoints, metrics, report and plots."""
    out = tmp_path_factory.mktemp("safety") / "run"
    assert main(["train", *SHORT, "--precision", "bf16", "--out-dir", str(out)]) == 0
    return out


# ----- item 1: convert never deletes what it did not write -----------------------------------


def test_convert_onto_its_own_run_is_refused_and_deletes_nothing(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = listing(run)
    for dst in (run, run / "checkpoints"):  # the source itself, a directory inside it
        code, _, err = run_cli(["convert", str(run), str(dst), "--to", "vitkit"], capsys)
        assert code == 2 and "--overwrite" in err and "Traceback" not in err
        assert listing(run) == before
    other = tmp_path / "other"  # an unrelated non-empty directory, in every directory format
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for to in ("vitkit", "hf", "timm"):
        code, _, err = run_cli(["convert", str(run), str(other), "--to", to], capsys)
        assert code == 2 and "not empty" in err
    assert listing(other) == ["notes.txt"]
    npz = tmp_path / "m.npz"
    npz.write_bytes(b"not mine to replace")
    code, _, err = run_cli(["convert", str(run), str(npz), "--to", "npz"], capsys)
    assert code == 2 and npz.read_bytes() == b"not mine to replace"


def test_convert_overwrite_replaces_only_what_it_writes(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = listing(run)
    # never into the run it reads (it made the run read as a checkpoint), --overwrite or not
    code, _, err = run_cli(["convert", str(run), str(run), "--to", "vitkit", "--overwrite"], capsys)
    assert code == 2 and "checkpoint read" in err
    assert listing(run) == before
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "notes.txt").write_text("mine")
    assert main(["convert", str(run), str(hf), "--to", "hf", "--overwrite"]) == 0
    assert (hf / "notes.txt").read_text() == "mine" and (hf / "model.safetensors").is_file()
    capsys.readouterr()


# ----- item 2: --resume of a run without a checkpoint ----------------------------------------


def test_resume_without_a_checkpoint_refuses_or_runs_the_saved_run(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for run in (empty, tmp_path / "missing"):  # never the default recipe instead
        code, _, err = run_cli(["train", "--out-dir", str(run), "--resume", "--smoke"], capsys)
        assert code == 2
        assert f"{run} has no checkpoint to resume; start it again without --resume" in err
    assert listing(empty) == []
    # Killed before its first checkpoint: train_config.json was written before the first step.
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(tiny_run / "train_config.json", killed)
    code, _, err = run_cli(["train", "--out-dir", str(killed), "--resume"], capsys)
    assert code == 0 and "no checkpoint yet" in err
    saved = json.loads((killed / "train_config.json").read_text())
    assert saved["data"] == "digits" and saved["model_overrides"]["width"] == 32
    assert json.loads((killed / "report.json").read_text())["dataset"] == "digits"


# ----- item 3: resuming restores the thread count --------------------------------------------


def test_resume_restores_the_runs_threads(tmp_path: Path) -> None:
    """A run started with --threads 1 resumes with 1 thread wherever it is resumed (here: a
    process now at 2), and ends bitwise where the uninterrupted run ends."""
    import torch

    from vitkit.checkpoints import LATEST, load_checkpoint

    before = torch.get_num_threads()
    full = tmp_path / "full"
    args = [*DIGITS, "--epochs", "1", "--max-steps", "6", "--ckpt-every", "3", "--seed", "1"]
    try:
        assert (
            main(
                ["train", *args, "--threads", "1", "--keep-checkpoints", "9"]
                + ["--out-dir", str(full)]
            )
            == 0
        )
        assert json.loads((full / "train_config.json").read_text())["threads"] == 1
        run = tmp_path / "resumed"  # killed after its first checkpoint (step 3)
        (run / "checkpoints").mkdir(parents=True)
        shutil.copytree(
            full / "checkpoints" / "step_00000003", run / "checkpoints" / "step_00000003"
        )
        (run / "checkpoints" / LATEST).write_text("step_00000003\n")
        torch.set_num_threads(2)  # as a new process on this machine would start
        assert main(["train", "--out-dir", str(run), "--resume"]) == 0
        assert json.loads((run / "report.json").read_text())["threads"] == 1
        a, b = load_checkpoint(full).state_dict, load_checkpoint(run).state_dict
        assert all(torch.equal(a[k], b[k]) for k in a)
        # Asked for another count: it runs, and says in one line that the result will differ.
        again = tmp_path / "again"
        shutil.copytree(run, again)
        with pytest.warns(UserWarning, match="threads 1 -> 2: the result will not be bitwise"):
            assert main(["train", "--out-dir", str(again), "--resume", "--threads", "2"]) == 0
    finally:
        torch.set_num_threads(before)


# ----- item 5: a re-run without --out-dir gets a fresh directory ------------------------------


def test_rerun_without_out_dir_goes_to_a_fresh_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["train", *SHORT], capsys)[0] == 0  # named after the data: runs/digits
    assert not (tmp_path / "runs" / "mnist").exists()  # (not the recipe's runs/mnist)
    first = listing(tmp_path / "runs" / "digits")
    code, out, err = run_cli(["train", *SHORT, "--epochs", "1"], capsys)
    assert code == 0 and "runs/digits already holds a run; this run goes to runs/digits-2" in err
    assert "runs/digits-2/report.json" in out
    assert (tmp_path / "runs" / "digits-2" / "report.json").is_file()
    assert listing(tmp_path / "runs" / "digits") == first  # the first run is untouched
    # An explicit --out-dir that holds a run is still refused without --resume.
    code, _, err = run_cli(["train", *SHORT, "--out-dir", "runs/digits"], capsys)
    assert code == 2 and "already holds a run" in err


# ----- item 6: eval in the run's precision, never over an earlier eval -----------------------


def test_eval_uses_the_runs_precision_and_keeps_earlier_results(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    report = json.loads((run / "report.json").read_text())
    assert report["precision"] == "bf16"
    code, out, _ = run_cli(["eval", "--from", str(run)], capsys)
    assert code == 0 and "(bf16: the run's" in out
    first = json.loads((run / "eval_test" / "eval.json").read_text())
    assert first["precision"] == "bf16"
    assert first["top1"] == pytest.approx(report["test_top1"], abs=1e-12)
    # Again, in fp32: a new directory, the first result stays as it was.
    code, out, _ = run_cli(["eval", "--from", str(run), "--precision", "fp32"], capsys)
    assert code == 0 and "(fp32: as asked)" in out and "eval_test-2" in out
    assert json.loads((run / "eval_test" / "eval.json").read_text()) == first
    assert json.loads((run / "eval_test-2" / "eval.json").read_text())["precision"] == "fp32"
    # An explicit --out holding an evaluation: refused unless --overwrite.
    args = ["eval", "--from", str(run), "--out", str(run / "eval_test")]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "--overwrite" in err
    assert json.loads((run / "eval_test" / "eval.json").read_text()) == first
    assert run_cli([*args, "--overwrite", "--precision", "fp32"], capsys)[0] == 0
    assert json.loads((run / "eval_test" / "eval.json").read_text())["precision"] == "fp32"


def test_consolidate_never_deletes_what_it_did_not_write(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = listing(run)
    code, _, err = run_cli(["consolidate", str(run), str(run)], capsys)
    assert code == 2 and "--overwrite" in err and listing(run) == before
    assert run_cli(["consolidate", str(run), str(tmp_path / "one")], capsys)[0] == 0
    assert listing(tmp_path / "one") == ["config.json", "model.safetensors"]


def test_resuming_in_memory_data_with_workers_does_not_warn(tmp_path: Path) -> None:
    """--num-workers changes nothing for in-memory data (no worker process decodes or
    augments it): resuming with it stays bitwise the same, and says nothing."""
    import warnings

    import torch

    from vitkit.checkpoints import LATEST, load_checkpoint

    full = tmp_path / "full"
    args = [*DIGITS, "--epochs", "1", "--max-steps", "4", "--ckpt-every", "2", "--threads", "1"]
    assert main(["train", *args, "--keep-checkpoints", "9", "--out-dir", str(full)]) == 0
    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000002", run / "checkpoints" / "step_00000002")
    (run / "checkpoints" / LATEST).write_text("step_00000002\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["train", "--out-dir", str(run), "--resume", "--num-workers", "2"]) == 0
    assert not [w for w in caught if "bitwise" in str(w.message)]
    a, b = load_checkpoint(full).state_dict, load_checkpoint(run).state_dict
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("data", "name"),
    [("digits", "digits"), ("/data/flowers/", "flowers"), ("s3://b/x y/", "x_y"), ("/", "data")],
)
def test_a_run_directory_is_named_after_the_data(data: str, name: str) -> None:
    from vitkit.cli.train_options import data_run_name

    assert data_run_name(data) == name
