"""Test-time augmentation by jitters (vitkit.eval.tta): the views (shifts, rotations, zooms),
the average, and both places that use it (the trainer's final evaluation, ``vitkit eval
--tta-shift/--tta-rotate/--tta-zoom``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from vitkit.cli import main
from vitkit.errors import VitkitError
from vitkit.eval.tta import JitterTTA, affine_view, jitter_views, shifted_views
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
    got = JitterTTA(model, shift=2)(x)
    torch.testing.assert_close(got.softmax(-1), want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(3), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="needs a shift"):
        JitterTTA(model, shift=0)


def test_rotations_and_zooms_are_exact_where_bilinear_sampling_is():
    x = torch.randn(2, 3, 6, 8)
    torch.testing.assert_close(affine_view(x), x, rtol=0, atol=1e-6)
    torch.testing.assert_close(affine_view(x, 180.0), x.flip(-1, -2), rtol=0, atol=1e-5)
    square = torch.randn(1, 1, 5, 5)  # +90 degrees: counter-clockwise as displayed
    torch.testing.assert_close(
        affine_view(square, 90.0), square.rot90(1, (-2, -1)), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        affine_view(square, -90.0), square.rot90(-1, (-2, -1)), atol=1e-5, rtol=0
    )
    # a non-square image is rotated in pixel space, not sheared: a point 2 px right of the
    # centre of a 5 x 9 image lands 2 px above it after +90 degrees
    wide = torch.zeros(1, 1, 5, 9)
    wide[0, 0, 2, 6] = 1.0
    turned = affine_view(wide, 90.0)[0, 0]
    assert turned[0, 4] == pytest.approx(1.0, abs=1e-5) and turned.sum() == pytest.approx(1.0)
    # a zoom by s about the centre c maps a linear ramp j -> c + (j - c) / s (bilinear is exact)
    ramp = torch.arange(8.0).expand(1, 1, 4, 8)
    for s in (1.25, 2.0):
        want = 3.5 + (torch.arange(8.0) - 3.5) / s
        torch.testing.assert_close(affine_view(ramp, scale=s)[0, 0, 1], want, atol=1e-5, rtol=0)
    # zooming out uncovers a border: it repeats the edge (the digits' background stays)
    out = affine_view(ramp, scale=0.5)[0, 0, 1]
    assert out[0] == 0.0 and out[-1] == 7.0 and torch.equal(out, out.sort().values)


def test_jitter_tta_averages_nine_views():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 5))
    x = torch.randn(3, 1, 6, 6)
    views = jitter_views(x, 1, 8.0, 0.08)
    assert len(views) == 9 and len(jitter_views(x, 0, 8.0, 0.0)) == 3
    want = torch.stack([model(v).softmax(-1) for v in views]).mean(0)
    got = JitterTTA(model, 1, 8.0, 0.08)(x)
    torch.testing.assert_close(got.softmax(-1), want, rtol=1e-6, atol=1e-7)
    rotated = torch.stack([model(affine_view(x, d)).softmax(-1) for d in (0.0, 8.0, -8.0)])
    torch.testing.assert_close(
        JitterTTA(model, rotate=8.0)(x).exp(), rotated.mean(0), rtol=1e-6, atol=1e-7
    )
    with pytest.raises(ValueError, match="tta_rotate must be 0"):
        JitterTTA(model, rotate=-8.0)


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


def test_the_trainer_reports_the_test_split_with_rotations_and_zooms(tmp_path: Path):
    trainer = Trainer(config(tmp_path / "r", tta_shift=1, tta_rotate=8.0, tta_zoom=0.08))
    report = trainer.fit()
    nine = trainer.evaluate(trainer.test_set, tta=True)
    assert report["test_top1"] == nine.top1 and report["test_loss"] == nine.loss
    trainer.cfg = dataclasses.replace(trainer.cfg, tta_rotate=0.0, tta_zoom=0.0)
    assert trainer.evaluate(trainer.test_set, tta=True).loss != nine.loss  # nine views, not five
    with pytest.raises(VitkitError, match="tta_rotate must be 0"):
        dataclasses.replace(config(tmp_path / "x"), tta_rotate=50.0)
    with pytest.raises(VitkitError, match="tta_zoom must be 0"):
        dataclasses.replace(config(tmp_path / "x"), tta_zoom=-0.1)


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
    assert code != 0 and "--tta-shift must be 0 (off) to 8 pixels" in capsys.readouterr().err
    out = tmp_path / "r"
    assert (
        main(
            [
                "eval",
                "--from",
                str(run),
                "--tta-rotate",
                "8",
                "--tta-zoom",
                "0.08",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rz = json.loads((out / "eval.json").read_text())
    assert (rz["tta_shift"], rz["tta_rotate"], rz["tta_zoom"]) == (0, 8.0, 0.08)
    assert rz["loss"] not in (plain["loss"], tta["loss"])
    code = main(["eval", "--from", str(run), "--tta-zoom", "0.7", "--out", str(tmp_path / "z")])
    assert code != 0 and "--tta-zoom must be 0 (off) to 0.5" in capsys.readouterr().err


def test_eval_max_seq_len_on_a_fixed_size_model_is_one_line(tmp_path: Path, capsys):
    run = tmp_path / "run"
    args = ["train", "--data", "digits", "--model", "Ti/2", "--no-progress", "--max-steps", "2"]
    tiny = [f"-o{k}={v}" for k, v in TINY.items()]
    assert main([*args, *tiny, "--precision", "fp32", "--out-dir", str(run)]) == 0
    capsys.readouterr()
    code = main(["eval", "--from", str(run), "--max-seq-len", "16", "--out", str(tmp_path / "e")])
    assert code == 2 and "packs images for a NaFlex model" in capsys.readouterr().err
