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
    assert "max relative difference" in capsys.readouterr().out
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for b in (1, 7):
        x = torch.randn(b, model.cfg.in_chans, 16, 24, generator=g)
        out = session.run(None, {"pixel_values": x.numpy()})[0]
        with torch.no_grad():
            assert np.abs(out - model.eval()(x).numpy()).max() <= 1e-4
    assert not list(tmp_path.glob(".m.onnx.tmp*"))


def test_export_prints_only_its_own_lines(tmp_path):
    """Piped (``vitkit export ... | cat``), export printed torch.onnx's progress lines with
    emoji, and ``export --int8 --static`` ONNX Runtime's pre-processing hint twice; only
    vitkit's lines are printed now (a real process, its output piped)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=10, width=32, depth=1, num_heads=2, mlp_dim=64
    )
    save_checkpoint(tmp_path / "ck", model, meta={"dataset": "digits"})
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    ck = str(tmp_path / "ck")
    for args in (
        [ck, str(tmp_path / "m.onnx")],
        [ck, str(tmp_path / "q"), "--int8", "--engine", "onnxruntime", "--static"],
    ):
        args += ["--calib-images", "8"] if "--int8" in args else []
        cmd = [sys.executable, "-m", "vitkit", "export", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        printed = done.stdout + done.stderr
        assert "[torch.onnx]" not in printed and "pre-processing" not in printed, printed
        assert printed.startswith(("wrote", "calibrating")), printed


def test_export_without_torchvision_says_nothing_of_it(tmp_path):
    """Where torchvision is not installed (vitkit does not need it), torch.onnx's exporter
    logged "torchvision is not installed. Skipping torchvision::nms" and three more such
    lines; export prints only its own lines. torchvision is hidden from the process as
    ``importlib.util.find_spec`` sees a missing package."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model = vitkit.create_model(
        "Ti/4", image_size=8, in_chans=1, num_classes=10, width=32, depth=1, num_heads=2, mlp_dim=64
    )
    save_checkpoint(tmp_path / "ck", model, meta={"dataset": "digits"})
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    program = (
        "import sys; sys.modules['torchvision'] = None; from vitkit.cli import main; "
        "sys.exit(main(['export', sys.argv[1], sys.argv[2]]))"
    )
    cmd = [sys.executable, "-c", program, str(tmp_path / "ck"), str(tmp_path / "m.onnx")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torchvision" not in done.stderr, done.stderr
    assert (tmp_path / "m.onnx").is_file()
