"""A converted family model through the whole CLI: a DeiT-III tiny (random weights) written as
a timm hub folder is fine-tuned on digits with ``vitkit finetune`` and exported with ``vitkit
export``; onnxruntime reproduces the fine-tuned model, and the family's switches survive."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoints import Checkpoint, load_checkpoint, read_checkpoint, write_checkpoint
from vitkit.cli import main
from vitkit.models.vit import build_model
from vitkit.registry.model_config import PreprocessConfig, model_config

pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")


@pytest.mark.slow
def test_deit3_timm_folder_finetunes_and_exports(tmp_path, capsys):
    cfg = model_config(
        "deit3_small_patch16_224",
        image_size=16,
        patch_size=4,
        width=32,
        depth=2,
        num_heads=2,
        mlp_dim=64,
        num_classes=7,
    )
    model = build_model(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    src = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    write_checkpoint(src, tmp_path / "deit3", "timm")
    assert read_checkpoint(tmp_path / "deit3").format == "timm"
    out = tmp_path / "ft"
    args = ["finetune", "--from", str(tmp_path / "deit3"), "--data", "digits", "--smoke"]
    args += ["--max-steps", "3", "--out-dir", str(out), "--no-progress", "--threads", "1"]
    assert main(args) == 0
    tuned = load_checkpoint(out)
    assert tuned.model_config.family_switches == cfg.family_switches  # layer scale, E_pos
    assert tuned.model_config.num_classes == 10 and tuned.model_config.image_size == (16, 16)
    assert not torch.equal(
        tuned.state_dict["blocks.0.ls1.gamma"], src.state_dict["blocks.0.ls1.gamma"]
    )
    capsys.readouterr()
    assert main(["export", str(out), str(tmp_path / "m.onnx")]) == 0
    assert "max relative difference" in capsys.readouterr().out
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    ours = vitkit.load(out)
    x = torch.randn(3, 3, 16, 16, generator=g)
    got = session.run(None, {"pixel_values": x.numpy()})[0]
    with torch.no_grad():
        assert np.abs(got - ours(x).numpy()).max() <= 1e-4


def test_a_distilled_deit_finetunes_with_both_heads_replaced(tmp_path, capsys):
    """DeiT's distillation head is a second classifier: fine-tuning to other classes replaces
    it with the class head (it stopped with 'shape mismatches: head_dist.bias')."""
    cfg = model_config(
        "deit_tiny_distilled_patch16_224",
        image_size=16,
        patch_size=4,
        width=32,
        depth=1,
        num_heads=2,
        mlp_dim=64,
        num_classes=7,
    )
    assert cfg.dist_token
    model = build_model(cfg)
    src = Checkpoint(Path("mem"), cfg, PreprocessConfig.for_model(cfg), model.state_dict())
    write_checkpoint(src, tmp_path / "deit", "vitkit")
    out = tmp_path / "ft"
    args = ["finetune", "--from", str(tmp_path / "deit"), "--data", "digits", "--smoke"]
    args += ["--max-steps", "2", "--out-dir", str(out), "--no-progress", "--threads", "1"]
    assert main(args) == 0, capsys.readouterr().err
    tuned = load_checkpoint(out).state_dict
    assert tuned["head.weight"].shape == tuned["head_dist.weight"].shape == (10, 32)
    assert tuned["head_dist.bias"].shape == (10,)
