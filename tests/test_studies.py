"""The studies (`vitkit study ...`) end to end at their --smoke size, their reuse of finished
runs, and the generated `shapes-hard` data they scale on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vitkit.cli import main
from vitkit.data import load_dataset
from vitkit.data.shapes_hard import CHUNK, HARD_CLASSES, answer_accuracy, make_shapes_hard
from vitkit.errors import VitkitError
from vitkit.studies.common import ModelSpec, RunSpec, parse_model_specs, run_all
from vitkit.train.train_config import TrainConfig

FAST = ["--no-progress", "--precision", "fp32", "--threads", "1"]


def _reports(out: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/seed*/report.json")}


def test_data_scale_smoke_end_to_end_and_reused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ds"
    args = ["study", "data-scale", "--smoke", *FAST, "--out-dir", str(out)]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["trained_runs"] == 6  # vit, bit, hybrid x sizes 100, 200
    assert {(r["model"], r["size"]) for r in results["runs"]} == {
        (m, n) for m in ("vit", "bit", "hybrid") for n in (100, 200)
    }
    assert all("convergence" in r for r in results["runs"])
    verdict = results["verdict_inputs"]
    assert verdict["baseline"] == "bit"  # the ResNet of the study
    assert set(verdict["gap_vs_baseline"]) == {"vit", "hybrid"}
    assert set(verdict["gap_vs_baseline"]["vit"]) == {"100", "200"}
    table = (out / "table.md").read_text()
    assert "n=200" in table and "train-loss change" in table
    for png in ("data_scale.png", "loss_curves.png"):
        assert (out / png).stat().st_size > 10_000
    before = _reports(out)
    assert len(before) == 6
    capsys.readouterr()
    assert main(args) == 0  # the second call trains nothing
    assert "(done before)" in capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["trained_runs"] == 0
    assert _reports(out) == before


def test_data_scale_with_early_stopping(tmp_path: Path) -> None:
    """--early-stop holds a validation split out and each run's report says where it stopped."""
    out = tmp_path / "ds"
    args = ["study", "data-scale", "--smoke", *FAST, "--out-dir", str(out), "--sizes", "160"]
    args += ["--models", "Ti/2[width=16,depth=1,num_heads=2,mlp_dim=32,label=v]"]
    args += ["--epochs", "4", "--early-stop", "1", "--val-size", "100", "--max-steps", "100"]
    args += ["--lr", "0.3"]  # far too large: the validation loss gets worse at once
    assert main(args) == 0
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["best_epoch"] >= 1 and run["stopped_epoch"] <= 4
    assert run["early_stopped"] == (run["stopped_epoch"] < 4)
    assert (Path(run["out_dir"]) / "best").is_dir()
    # the best validation accuracy of the run's evaluations, its own table and verdict
    records = [json.loads(line) for line in (Path(run["out_dir"]) / "metrics.jsonl").open()]
    assert run["best_val_top1"] == max(r["val_top1"] for r in records if "val_top1" in r)
    results = json.loads((out / "results.json").read_text())
    assert results["verdict_inputs_best_val"]["metric"] == "best_val_top1"
    assert "Best validation top-1 during training" in (out / "table.md").read_text()


def test_compute_smoke_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "compute"
    assert main(["study", "compute", "--smoke", *FAST, "--out-dir", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    runs = {r["model"]: r for r in results["runs"]}
    assert set(runs) == {"vit-s", "vit-m", "bit", "hybrid"}
    assert {r["family"] for r in runs.values()} == {"ViT", "ResNet", "Hybrid"}
    # 3 x forward FLOPs x images seen (smoke: 6 steps of 32)
    vit = runs["vit-m"]
    assert vit["train_exaflops"] == pytest.approx(3 * vit["gflops"] * 1e9 * 6 * 32 / 1e18)
    assert runs["vit-m"]["train_exaflops"] > runs["vit-s"]["train_exaflops"]
    assert "training exaFLOPs" in (out / "table.md").read_text()
    assert results["verdict_inputs"]["baseline"] == "ResNet"
    assert (out / "compute.png").stat().st_size > 10_000
    assert "trained now: 4" in capsys.readouterr().out


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """A run directory with checkpoints but no report was killed: the study resumes it."""
    base = TrainConfig(
        data="digits", epochs=2, batch_size=32, train_size=128, val_size=0, augment="none",
        progress=False, precision="fp32",
    )  # fmt: skip
    (spec,) = parse_model_specs("Ti/2[width=16,depth=1,num_heads=2,mlp_dim=32,label=v]")
    run = RunSpec(base, spec, "n128", 0)
    first = run_all([run], tmp_path)[0]
    report = Path(first.out_dir) / "report.json"
    report.unlink()  # as if killed during the final evaluation
    again = run_all([run], tmp_path)[0]
    assert again.trained and again.steps == first.steps == 8
    assert again.test_top1 == pytest.approx(first.test_top1)


def test_run_specs_are_checked(tmp_path: Path) -> None:
    spec = ModelSpec("Ti/2", {"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}, "v")
    with pytest.raises(VitkitError, match="plain directory name"):
        RunSpec(TrainConfig(), spec, "a/b", 0)
    with pytest.raises(VitkitError, match="share a run directory"):
        run_all([RunSpec(TrainConfig(), spec, "g", 0)] * 2, tmp_path)
    assert spec.family == "ViT"
    (bit,) = parse_model_specs("bit_r26x1[layers=1,width_factor=0.125,family=CNN]")
    assert bit.family == "CNN" and "family" not in bit.overrides


def test_shapes_hard_is_deterministic_nested_and_balanced() -> None:
    a = make_shapes_hard("train", CHUNK + 100, seed=3)
    b = make_shapes_hard("train", 500, seed=3)
    assert torch.equal(a.images[:500], b.images) and torch.equal(a.labels[:500], b.labels)
    c = make_shapes_hard("train", 500, seed=4)
    assert not torch.equal(b.images, c.images)
    assert a.info.num_classes == len(HARD_CLASSES) == 12 and not a.info.allow_flip
    counts = torch.bincount(a.labels[:CHUNK], minlength=12)
    assert counts.min() >= CHUNK // 12 - 1
    test = make_shapes_hard("test", 200)
    assert not torch.equal(test.images, make_shapes_hard("val", 200).images)


def test_shapes_hard_splits_through_load_dataset() -> None:
    train = load_dataset("shapes-hard", "train", train_size=300, seed=1)
    assert len(train) == 300 and train.info.name == "shapes-hard"
    assert torch.equal(train.images, make_shapes_hard("train", 300, seed=1).images)
    val = load_dataset("shapes-hard", "val", val_size=50, seed=1)
    assert len(val) == 50
    small = load_dataset("shapes-hard", "val", val_size=0.001, image_size=48, channels=1)
    assert len(small) == 50 and small.images.shape[1:] == (1, 48, 48)
    with pytest.raises(VitkitError, match="no val split"):
        load_dataset("shapes-hard", "val", val_size=0)
    with pytest.raises(VitkitError, match="at least 32"):
        make_shapes_hard("test", 10, image_size=16)
    with pytest.raises(VitkitError, match="number of images"):
        make_shapes_hard("train", 0)


def test_shapes_hard_labels_match_the_scene() -> None:
    """The box kept per image is the largest object's; the label's side is where the
    smallest object is: a flip of the image swaps it (so flipping is off)."""
    d = make_shapes_hard("test", 64)
    w = (d.boxes[:, 2] - d.boxes[:, 0]) / 32
    assert ((w >= 0.32) & (w <= 0.42)).all()


def test_small_subsets_get_more_epochs_and_more_patience() -> None:
    from vitkit.studies.data_scale import epochs_for, patience_for

    # 600 images at batch 256: 2 steps an epoch; 4000 steps need 2000 epochs, and a patience
    # of 10 epochs (20 steps) becomes a quarter of the minimum budget: 500 epochs.
    assert epochs_for(600, 256, 30, 4000) == 2000
    assert patience_for(600, 256, 10, 4000) == 500
    assert patience_for(59_000, 256, 10, 4000) == 10  # 230 steps an epoch: as given
    assert patience_for(600, 256, None, 4000) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without")
def test_the_device_reaches_every_run(tmp_path: Path, capsys) -> None:
    """--device cuda goes through to the runs' TrainConfig (here: refused, no GPU)."""
    args = ["study", "compute", "--smoke", *FAST, "--out-dir", str(tmp_path), "--device", "cuda"]
    assert main(args) == 2
    assert "sees no CUDA GPU" in capsys.readouterr().err


def test_a_data_scale_study_of_the_resnet_alone_has_no_empty_gap_table(tmp_path: Path) -> None:
    """The baseline with nothing to compare it with (a part of a study run on its own, as the
    shapes-hard ResNet runs were): the table has no header-only difference tables."""
    out = tmp_path / "ds"
    args = ["study", "data-scale", "--smoke", *FAST, "--out-dir", str(out), "--sizes", "100"]
    args += ["--models", "bit_r26x1[layers=1,width_factor=0.125,root=small,label=bit]"]
    args += ["--val-size", "50"]
    assert main(args) == 0
    table = (out / "table.md").read_text()
    assert "Best validation top-1 during training" in table
    assert "| minus bit" not in table


def test_shapes_hard_scores_its_two_questions_apart() -> None:
    """A model that knows the shapes but guesses the side (the ResNet's plateau at a training
    loss of ln 2, measured at 10,000 images) scores shape 1.0, side 0.5, top-1 0.5."""
    guesses_side = np.zeros((12, 12), dtype=np.int64)
    for c in range(12):
        guesses_side[c, c] = 3  # right
        guesses_side[c, c ^ 1] = 3  # same shape, other side
    assert answer_accuracy(guesses_side) == pytest.approx(
        {"shape": 1.0, "side": 0.5, "side_given_shape": 0.5}
    )
    c = np.zeros((12, 12), dtype=np.int64)
    c[0, 0] = 6  # square/left right
    c[0, 2] = 2  # square/left called circle/left: shape wrong, side right
    c[1, 4] = 2  # square/right called triangle/left: both wrong
    assert answer_accuracy(c) == pytest.approx({"shape": 0.6, "side": 0.8, "side_given_shape": 1.0})
    with pytest.raises(VitkitError, match="12x12"):
        answer_accuracy(np.ones((10, 10)))
    with pytest.raises(VitkitError, match="no images"):
        answer_accuracy(np.zeros((12, 12)))


def test_eval_of_a_shapes_hard_run_scores_the_questions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    tiny = ["-o", "width=16", "-o", "depth=1", "-o", "num_heads=2", "-o", "mlp_dim=32"]
    args = ["train", "--data", "shapes-hard", "--model", "Ti/8", *tiny, "--train-size", "64"]
    args += ["--val-size", "32", "--max-steps", "2", "--batch-size", "32", "--no-progress"]
    assert main([*args, "--out-dir", str(run)]) == 0
    assert main(["eval", "--from", str(run), "--out", str(tmp_path / "eval")]) == 0
    record = json.loads((tmp_path / "eval" / "eval.json").read_text())
    expect = answer_accuracy(record["confusion"])
    assert record["shapes_hard"] == pytest.approx(expect)
    assert record["top1"] <= min(expect["shape"], expect["side"]) + 1e-12  # right: both right
    assert "side of the smallest right" in capsys.readouterr().out
