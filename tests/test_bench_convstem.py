"""bench/mnist_convstem.py (issue 28's conv-stem probe) trains the stem it describes, and its
checkpoint loads back only through the script's model: the swap is real, not a renamed root."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitkit.models.vit
import vitkit.train.run
from vitkit.checkpoints import load_checkpoint
from vitkit.errors import VitkitError

BENCH = Path(__file__).resolve().parents[1] / "bench" / "mnist_convstem.py"


def test_the_probe_trains_the_conv_stem_and_only_its_model_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    args = ["train", "--smoke", "--compile", "none", "--threads", "1", "--no-progress"]
    done = subprocess.run(
        [sys.executable, str(BENCH), *args, "--out-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test accuracy" in done.stdout
    with pytest.raises(VitkitError, match="unexpected keys: patch_embed.stem.0.weight"):
        load_checkpoint(run / "checkpoints")  # vitkit's own hybrid (7x7 root) does not fit it
    for module in (vitkit.models.vit, vitkit.train.run):  # undone after the test
        monkeypatch.setattr(module, "build_model", module.build_model)
    spec = importlib.util.spec_from_file_location("mnist_convstem", BENCH)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    probe.install()
    ckpt = load_checkpoint(run / "checkpoints")
    sd = ckpt.state_dict
    assert sd["patch_embed.stem.0.weight"].shape == (32, 1, 3, 3)  # 3x3 stride-2, 1 -> 32
    assert sd["patch_embed.stem.3.weight"].shape == (64, 32, 3, 3)  # 32 -> 64
    assert "patch_embed.stem.1.running_var" in sd  # BatchNorm, not the root's GroupNorm
    model = vitkit.models.vit.build_model(ckpt.model_config)
    model.load_state_dict(sd)
    x = torch.zeros(2, 1, *ckpt.model_config.image_size)
    assert model.eval()(x).shape == (2, 10)
