"""End-to-end runs of the ``vitkit`` command line on tiny data."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from vitkit.checkpoints import LATEST, load_model
from vitkit.cli import main
from vitkit.data import load_dataset, normalize

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = ["-o", "width=32", "-o", "depth=2", "-o", "num_heads=2", "-o", "mlp_dim=64"]
DIGITS = ["--data", "digits", "--model", "Ti/2", *TINY, "--no-progress", "--batch-size", "32"]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    name = (run / "checkpoints" / LATEST).read_text().strip()
    return load_file(str(run / "checkpoints" / name / "model.safetensors"))


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short fp32 training run on scikit-learn's digits, shared by several tests."""
    out = tmp_path_factory.mktemp("run") / "digits"
    args = ["train", *DIGITS, "--epochs", "3", "--lr", "3e-3", "--precision", "fp32"]
    assert main([*args, "--out-dir", str(out)]) == 0
    return out


def test_help_of_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd, must_mention in [
        ([], "train"),
        (["train"], "--resume"),
        (["eval"], "--from"),
        (["predict"], "--top-k"),
        (["models"], "--image-size"),
    ]:
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0
        assert must_mention in capsys.readouterr().out


def test_models_table_lists_pinned_counts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["models"], capsys)
    assert code == 0
    assert "86,567,656" in out and "632,045,800" in out and "vit_b16" in out


def test_train_writes_checkpoint_metrics_plots_and_report(trained_run: Path) -> None:
    report = json.loads((trained_run / "report.json").read_text())
    assert report["steps"] > 0 and 0.0 <= report["test_top1"] <= 1.0
    assert report["test_top1"] > 0.3  # 10 classes: far above chance after 3 short epochs
    for name in ("curves.png", "confusion_test.png", "metrics.jsonl", "train_config.json"):
        assert (trained_run / name).is_file(), name
    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").open()]
    assert any("val_top1" in r for r in records)
    ckpt = trained_run / "checkpoints" / (trained_run / "checkpoints" / LATEST).read_text().strip()
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "config.json",
        "model.safetensors",
        "train_state.json",
        "train_state.safetensors",
    ]


def test_eval_reproduces_the_report(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads((trained_run / "report.json").read_text())
    out_dir = trained_run / "eval_here"
    code, out, _ = run_cli(["eval", "--from", str(trained_run), "--out", str(out_dir)], capsys)
    assert code == 0
    result = json.loads((out_dir / "eval.json").read_text())
    assert result["top1"] == pytest.approx(report["test_top1"], abs=1e-12)
    assert (out_dir / "confusion.png").is_file()
    assert f"{100 * report['test_top1']:.2f}" in out


def test_predict_uses_the_checkpoints_preprocessing(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test_set = load_dataset("digits", "test")
    paths = []
    for i in range(4):
        img, _ = test_set[i]
        p = tmp_path / f"digit{i}.png"
        Image.fromarray(img[0].numpy()).save(p)
        paths.append(str(p))
    code, out, _ = run_cli(["predict", *paths, "--from", str(trained_run), "--json"], capsys)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    model, _ = load_model(trained_run)
    with torch.inference_mode():
        x = torch.stack([test_set[i][0] for i in range(4)]).float()
        expected = model(normalize(x, (0.5,), (0.5,))).softmax(-1)
    for i, line in enumerate(lines):
        assert line["image"] == paths[i]
        top = line["top_k"][0]
        assert top["index"] == int(expected[i].argmax())
        assert top["prob"] == pytest.approx(float(expected[i].max()), abs=1e-5)
        probs = [q["prob"] for q in line["top_k"]]
        assert probs == sorted(probs, reverse=True) and len(probs) == 5


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--model", "vit_q16", "--smoke"], "vit_q16"),
        (["train", "--data", "imagenet_nowhere", "--smoke"], "imagenet_nowhere"),
        (["train", "--recipe", "nope"], "nope"),
        (["predict", "missing.png", "--from", "."], "missing.png"),
        (["eval", "--from", "no_such_checkpoint"], "no_such_checkpoint"),
        (["train", *DIGITS, "--smoke", "--device", "gpu"], "gpu"),
        (["train", *DIGITS, "--smoke", "--accum-steps", "0"], "--accum-steps"),
        (["train", *DIGITS, "--smoke", "--threads", "-1"], "threads"),
        (["train", *DIGITS, "--smoke", "-o", "num_classes=5"], "num_classes=5"),
        (["train", *DIGITS, "--smoke", "--val-size", "2.5"], "--val-size"),
    ],
)
def test_bad_input_is_one_line_with_nonzero_exit(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)
    code, _, err = run_cli(args, capsys)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("vitkit: error:") and needle in lines[0]
    assert "Traceback" not in err


def test_predict_on_a_corrupt_image_names_it(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    code, _, err = run_cli(["predict", str(bad), "--from", str(trained_run)], capsys)
    assert code == 2 and "broken.jpg" in err and len(err.strip().splitlines()) == 1


def test_resume_with_another_architecture_lists_the_differences(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "copy"
    shutil.copytree(trained_run, run)
    args = ["train", *DIGITS, "--epochs", "4", "--out-dir", str(run), "--resume"]
    code, _, err = run_cli([*args, "-o", "depth=3", "-o", "mlp_dim=48"], capsys)
    assert code == 2
    assert "depth: 2 != 3" in err and "mlp_dim: 64 != 48" in err


def _write_image_folder(root: Path, corrupt: int) -> None:
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cats", "dogs"]):
        (root / name).mkdir(parents=True)
        for i in range(12):
            img = rng.integers(0, 80, (20, 20, 3), dtype=np.uint8) + 120 * c
            Image.fromarray(img.astype(np.uint8)).save(root / name / f"{i}.png")
    for i in range(corrupt):
        (root / "dogs" / f"bad{i}.jpg").write_bytes(b"garbage" * 10)


def test_image_folder_corrupt_file_stop_or_skip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "folder"
    _write_image_folder(root, corrupt=1)
    common = ["train", "--data", str(root), "--model", "Ti/8", *TINY, "--image-size", "16"]
    common += ["--epochs", "1", "--batch-size", "4", "--no-progress", "--val-size", "0"]
    code, _, err = run_cli([*common, "--out-dir", str(tmp_path / "a")], capsys)
    errors = [line for line in err.splitlines() if line.startswith("vitkit: error:")]
    assert code == 2 and len(errors) == 1 and "bad0.jpg" in errors[0]
    assert "Traceback" not in err
    code, _, _ = run_cli(
        [*common, "--out-dir", str(tmp_path / "b"), "--on-bad-image", "skip"], capsys
    )
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").open()]
    assert sum(r.get("skipped_images", 0) for r in records) == 1
    # Evaluate on every image of a folder of one's own (same classes, other images).
    own = tmp_path / "own"
    _write_image_folder(own, corrupt=0)
    out = tmp_path / "own_eval"
    args = ["eval", "--from", str(tmp_path / "b"), "--data", str(own), "--split", "all"]
    code, _, _ = run_cli([*args, "--out", str(out)], capsys)
    assert code == 0
    assert json.loads((out / "eval.json").read_text())["num_samples"] == 24


def _resume_args(out: Path) -> list[str]:
    return ["train", *DIGITS, "--epochs", "3", "--ckpt-every", "7", "--out-dir", str(out)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_from_any_checkpoint_is_bitwise_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    """Resuming from a mid-epoch or an epoch-end checkpoint ends with the same weights."""
    full = tmp_path / "full"
    args = [*_resume_args(full), "--precision", "fp32", "-o", "dropout=0.1"]
    args[args.index("fp32")] = precision
    assert main([*args, "--keep-checkpoints", "100"]) == 0
    reference = final_weights(full)
    steps = sorted((full / "checkpoints").glob("step_*"))
    per_epoch = json.loads((full / "report.json").read_text())["steps"] // 3
    mid = [p for p in steps if int(p.name[5:]) % per_epoch]
    at_end = [p for p in steps if int(p.name[5:]) % per_epoch == 0]
    for ckpt in (mid[1], at_end[0]):  # one inside an epoch, one at an epoch boundary
        run = tmp_path / f"from_{ckpt.name}"
        (run / "checkpoints").mkdir(parents=True)
        shutil.copytree(ckpt, run / "checkpoints" / ckpt.name)
        (run / "checkpoints" / LATEST).write_text(ckpt.name + "\n")
        resumed = [a if a != str(full) else str(run) for a in args]
        assert main([*resumed, "--resume"]) == 0
        assert_bitwise_equal(final_weights(run), reference)
    capsys.readouterr()


def test_killed_run_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """A real SIGKILL in the middle of training, then --resume: bitwise the same weights."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_WAIT_POLICY": "PASSIVE"}
    cmd = [sys.executable, "-m", "vitkit"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run([*cmd, *_resume_args(full)], env=env, check=True, capture_output=True)
    total = json.loads((full / "report.json").read_text())["steps"]

    proc = subprocess.Popen([*cmd, *_resume_args(killed)], env=env, stderr=subprocess.DEVNULL)
    latest = killed / "checkpoints" / LATEST
    deadline = time.time() + 120
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at = int(latest.read_text().strip()[5:])
    assert at < total, "the run finished before it could be killed; make it longer"
    assert not (killed / "report.json").exists()

    subprocess.run(
        [*cmd, *_resume_args(killed), "--resume"], env=env, check=True, capture_output=True
    )
    assert_bitwise_equal(final_weights(killed), final_weights(full))
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").open()]
    assert steps == sorted(steps)  # records written after the checkpoint were dropped


def test_resume_continues_the_saved_run_and_refuses_other_settings(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "again"
    shutil.copytree(trained_run, run)
    before = final_weights(run)
    # A finished run: --resume alone (no other flags) rebuilds its settings and does no step.
    code, out, _ = run_cli(["train", "--out-dir", str(run), "--resume"], capsys)
    assert code == 0 and "test accuracy" in out
    assert_bitwise_equal(final_weights(run), before)
    code, _, err = run_cli(["train", "--out-dir", str(run), "--resume", "--lr", "0.5"], capsys)
    assert code == 2 and "lr: 0.003 -> 0.5" in err


def test_eval_uses_the_runs_validation_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "seeded"
    args = ["train", *DIGITS, "--epochs", "1", "--precision", "fp32", "--seed", "3"]
    assert main([*args, "--val-size", "300", "--out-dir", str(run)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    val_top1 = [r["val_top1"] for r in records if "val_top1" in r][-1]
    out_dir = tmp_path / "ev"
    args = ["eval", "--from", str(run), "--split", "val", "--out", str(out_dir)]
    code, _, _ = run_cli(args, capsys)
    assert code == 0
    result = json.loads((out_dir / "eval.json").read_text())
    assert result["num_samples"] == 300 and result["top1"] == pytest.approx(val_top1, abs=1e-12)


def test_image_folder_with_only_a_train_subfolder(tmp_path: Path) -> None:
    _write_image_folder(tmp_path / "data" / "train", corrupt=0)
    test_set = load_dataset(str(tmp_path / "data"), "test", image_size=16)
    assert test_set.info.class_names == ("cats", "dogs")


def test_image_folder_with_workers_resumes_bitwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers augment with their own generators: a mid-epoch resume must replay them."""
    root = tmp_path / "folder"
    _write_image_folder(root, corrupt=0)
    args = ["train", "--data", str(root), "--model", "Ti/8", *TINY, "--image-size", "16"]
    args += ["--epochs", "2", "--batch-size", "2", "--no-progress", "--val-size", "0"]
    args += ["--num-workers", "2", "--ckpt-every", "3", "--precision", "fp32"]
    full = tmp_path / "full"
    assert main([*args, "--out-dir", str(full), "--keep-checkpoints", "100"]) == 0
    ckpt = sorted((full / "checkpoints").glob("step_*"))[1]  # step 6, inside epoch 1
    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, run / "checkpoints" / ckpt.name)
    (run / "checkpoints" / LATEST).write_text(ckpt.name)
    shutil.copy(full / "train_config.json", run / "train_config.json")
    assert main([*args, "--out-dir", str(run), "--keep-checkpoints", "100", "--resume"]) == 0
    assert_bitwise_equal(final_weights(run), final_weights(full))
    capsys.readouterr()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], None),
        (["--compile"], "default"),
        (["--compile", "max-autotune"], "max-autotune"),
        (["--compile", "none"], None),
    ],
)
def test_compile_option(given: list[str], expected: str | None) -> None:
    from vitkit.cli import build_parser
    from vitkit.cli.train_options import train_config_from_args

    cfg = train_config_from_args(build_parser().parse_args(["train", *DIGITS, *given]))
    assert cfg.compile == expected


def test_unknown_compile_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["train", *DIGITS, "--smoke", "--compile", "fastest"], capsys)
    assert code != 0 and "compile must be one of" in err
