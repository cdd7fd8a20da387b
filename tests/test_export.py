"""ONNX export: onnxruntime reproduces PyTorch, with a dynamic batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitkit
from vitkit.checkpoints import save_checkpoint
from vitkit.cli import main

pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(pool="gap", representation_size=16, in_chans=1),
        dict(pool="map", final_norm=False, num_reg_tokens=2),  # SigLIP's MAP head, registers
    ],
    ids=["token", "gap_prelogits_gray", "map_registers_no_final_norm"],
)
def test_export_cli_matches_pytorch_for_any_batch(tmp_path, capsys, kw):
    model = vitkit.create_model(
        "Ti/4", image_size=(16, 24), num_classes=5, width=32, depth=2, num_heads=2, mlp_dim=64, **kw
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    save_checkpoint(tmp_path / "ck", model)
    assert main(["export", str(tmp_path / "ck"), str(tmp_path / "m.onnx")]) == 0
    assert "max abs difference" in capsys.readouterr().out
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for b in (1, 7):
        x = torch.randn(b, model.cfg.in_chans, 16, 24, generator=g)
        out = session.run(None, {"pixel_values": x.numpy()})[0]
        with torch.no_grad():
            assert np.abs(out - model.eval()(x).numpy()).max() <= 1e-4
    assert not list(tmp_path.glob(".m.onnx.tmp*"))
