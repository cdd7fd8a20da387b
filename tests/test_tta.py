"""Test-time augmentation by shifts (vitkit.eval.tta): the views, the average, and both places
that use it (the trainer's final evaluation, ``vitkit eval --tta-shift``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.eval.tta import ShiftTTA, shifted_views
from vitkit.train.trainer import TrainConfig, Trainer

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def test_views_move_the_content_one_pixel_each_way_with_the_edge_repeated():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    same, right, left, down, up = shifted_views(x, 1)
    assert torch.equal(same, x)
    assert torch.equal(right[0, 0, :, 1:], x[0, 0, :, :3]) and torch.equal(right[..., 0], x[..., 0])
    assert torch.equal(left[0, 0, :, :3], x[0, 0, :, 1:]) and torch.equal(left[..., 3], x[..., 3])
    assert torch.equal(down[0, 0, 1:], x[0, 0, :3]) and torch.equal(down[..., 0, :], x[..., 0, :])
    assert torch.equal(up[0, 0, :3], x[0, 0, 1:]) and torch.equal(up[..., 3, :], x[..., 3, :])
    assert shifted_views(x, 0) == [x]


def test_the_output_is_the_log_of_the_mean_probability_of_the_five_views():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 5))
    x = torch.randn(3, 1, 6, 6)
    want = torch.stack([model(v).softmax(-1) for v in shifted_views(x, 2)]).mean(0)
    got = ShiftTTA(model, 2)(x)
    torch.testing.assert_close(got.softmax(-1), want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(3), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="shift"):
        ShiftTTA(model, 0)


def config(out: Path, **changes: object) -> TrainConfig:
    base = dict(
        data="digits",
        model="Ti/2",
        model_overrides=TINY,
        epochs=1,
        batch_size=32,
        augment="none",
        precision="fp32",
        progress=False,
        run_plots=False,
        out_dir=str(out),
    )
    return TrainConfig(**{**base, **changes})  # type: ignore[arg-type]


def test_the_trainer_reports_the_test_split_with_its_tta(tmp_path: Path):
    trainer = Trainer(config(tmp_path / "r", tta_shift=1))
    report = trainer.fit()
    plain = trainer.evaluate(trainer.test_set)
    shifted = trainer.evaluate(trainer.test_set, tta=True)
    assert report["test_top1"] == shifted.top1 and report["test_loss"] == shifted.loss
    assert shifted.loss != plain.loss  # five views, not one
    with pytest.raises(VitkitError, match="tta_shift must be 0"):
        dataclasses.replace(config(tmp_path / "x"), tta_shift=9)
    with pytest.raises(VitkitError, match="tta_shift must be 0"):
        dataclasses.replace(config(tmp_path / "x"), tta_shift=-1)


def test_eval_tta_shift_from_the_command_line(tmp_path: Path, capsys):
    run = tmp_path / "run"
    args = ["train", "--data", "digits", "--model", "Ti/2", "--no-progress", "--epochs", "1"]
    tiny = [f"-o{k}={v}" for k, v in TINY.items()]
    assert (
        main([*args, *tiny, "--precision", "fp32", "--tta-shift", "1", "--out-dir", str(run)]) == 0
    )
    assert json.loads((run / "train_config.json").read_text())["tta_shift"] == 1
    assert main(["eval", "--from", str(run), "--out", str(tmp_path / "plain")]) == 0
    assert main(["eval", "--from", str(run), "--tta-shift", "1", "--out", str(tmp_path / "t")]) == 0
    plain = json.loads((tmp_path / "plain" / "eval.json").read_text())
    tta = json.loads((tmp_path / "t" / "eval.json").read_text())
    assert plain["tta_shift"] == 0 and tta["tta_shift"] == 1
    assert tta["num_samples"] == plain["num_samples"] and tta["loss"] != plain["loss"]
    report = json.loads((run / "report.json").read_text())  # the run's own final evaluation
    assert report["test_top1"] == tta["top1"] and report["test_loss"] == pytest.approx(tta["loss"])
    capsys.readouterr()
    assert main(["eval", "--from", str(run), "--tta-shift", "-1"]) == 2
    assert "--tta-shift: expected a whole number >= 0" in capsys.readouterr().err
    code = main(["eval", "--from", str(run), "--tta-shift", "9", "--out", str(tmp_path / "n")])
    assert code != 0 and "at most 8 pixels" in capsys.readouterr().err


def test_eval_max_seq_len_on_a_fixed_size_model_is_one_line(tmp_path: Path, capsys):
    run = tmp_path / "run"
    args = ["train", "--data", "digits", "--model", "Ti/2", "--no-progress", "--max-steps", "2"]
    tiny = [f"-o{k}={v}" for k, v in TINY.items()]
    assert main([*args, *tiny, "--precision", "fp32", "--out-dir", str(run)]) == 0
    capsys.readouterr()
    code = main(["eval", "--from", str(run), "--max-seq-len", "16", "--out", str(tmp_path / "e")])
    assert code == 2 and "packs images for a NaFlex model" in capsys.readouterr().err
