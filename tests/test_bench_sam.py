"""bench/mnist_sam.py (issue 28's late-SAM probe): with rho 0 its step is the recipe's step
(bitwise the same weights as a plain run), and with rho > 0 it is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from vitkit.checkpoints import load_checkpoint

BENCH = Path(__file__).resolve().parents[1] / "bench" / "mnist_sam.py"
SMOKE = ["--smoke", "--compile", "none", "--threads", "1", "--no-progress", "--precision", "fp32"]


def _weights(out: Path, *cmd: str) -> dict[str, torch.Tensor]:
    done = subprocess.run(
        [sys.executable, *cmd, *SMOKE, "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return load_checkpoint(out / "checkpoints").state_dict


def test_sam_with_rho_zero_is_the_plain_step_and_rho_moves_the_weights(tmp_path: Path) -> None:
    plain = _weights(tmp_path / "plain", "-m", "vitkit", "train", "--recipe", "mnist-best")
    zero = _weights(tmp_path / "zero", str(BENCH), "0", "1")
    sam = _weights(tmp_path / "sam", str(BENCH), "0.1", "1")
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    assert any(not torch.equal(plain[k], sam[k]) for k in plain)
