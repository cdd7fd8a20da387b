"""`vitkit eval` over several runs: mean ± std across seeds, as the paper's tables report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main


def test_eval_over_seeds_reports_mean_and_std(tmp_path, capsys):
    for seed in range(3):
        torch.manual_seed(seed)
        model = vitkit.create_model(
            "Ti/2",
            image_size=8,
            in_chans=1,
            num_classes=10,
            width=32,
            depth=1,
            num_heads=2,
            mlp_dim=64,
        )
        with torch.no_grad():
            model.head.weight.normal_()  # a random, non-zero head: accuracies differ per seed
        save_checkpoint(tmp_path / f"s{seed}", model, meta={"dataset": "digits"})
    out = tmp_path / "ev"
    assert (
        main(
            [
                "eval",
                "--from",
                str(tmp_path / "s{seed}"),
                "--seeds",
                "3",
                "--out",
                str(out),
                "--split",
                "test",
            ]
        )
        == 0
    )
    per_run = [json.loads((out / str(i) / "eval.json").read_text())["top1"] for i in range(3)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["top1"]["values"] == pytest.approx([100 * v for v in per_run])
    assert summary["top1"]["mean"] == pytest.approx(100 * float(np.mean(per_run)))
    assert summary["top1"]["std"] == pytest.approx(100 * float(np.std(per_run, ddof=1)))
    assert "over 3 runs" in capsys.readouterr().out
    assert main(["eval", "--from", str(tmp_path / "s0"), "--seeds", "2"]) == 2
