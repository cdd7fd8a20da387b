"""bench/gpu_report.py: the GPU session's report from what bench/gpu.sh left (no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _row(impl: str, mode: str, task: str, rounds: list[float], mfu: float) -> dict:
    batch = 1 if task == "infer_b1" else 256
    return {
        "model": "B/16",
        "impl": impl,
        "precision": "bf16",
        "mode": mode,
        "task": task,
        "batch": batch,
        "median_s": sorted(rounds)[len(rounds) // 2],
        "images_per_s": batch / sorted(rounds)[len(rounds) // 2],
        "mfu": mfu,
        "peak_memory_bytes": 2**30,
        "rounds": rounds,
    }


def _run_file(folder: Path) -> None:
    meta = {
        "device_name": "NVIDIA H100 80GB HBM3",
        "matmul_ceiling_flops": {"bf16": 800e12},
        "command": "bench/speed.py --device cuda --models B/16",
    }
    rows = [  # vitkit/timm round by round: 1.2, 1.0, 1.0 -> median 1.0 (ratio of medians: 1.2)
        _row("vitkit", "compiled", "train", [0.10, 0.08, 0.12], 0.52),
        _row("timm", "compiled", "train", [0.12, 0.08, 0.12], 0.50),
        _row("vitkit", "compiled", "infer_b256", [0.02, 0.02, 0.02], 0.58),
        _row("timm", "compiled", "infer_b256", [0.02, 0.02, 0.02], 0.58),
        _row("vitkit", "compiled", "infer_b1", [0.001] * 3, 0.01),
    ]
    folder.mkdir()
    (folder / "gpu_speed_B16.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (folder / "env.txt").write_text("torch 2.11.0+cu130 cuda 13.0\ntimm     1.0.29\n")
    (folder / "pytest_gpu.txt").write_text(
        "PASSED tests/test_gpu.py::a\nFAILED tests/test_gpu.py::b - assert\n1 failed, 1 passed\n"
    )


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_report.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_the_report_states_the_figures_with_ratios_taken_round_by_round(tmp_path: Path) -> None:
    _run_file(tmp_path / "res")
    done = _report(str(tmp_path / "res"), "--out", str(tmp_path / "gpu_speed"))
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "gpu_speed.json").read_text())
    figures = result["headline"]
    assert figures["train_mfu"] == 0.52
    assert figures["train_vs_timm_compiled"] == pytest.approx(1.0)
    assert figures["infer_mfu"] == 0.58  # the batch-256 row, not batch 1
    train = next(r for r in result["rows"] if r["task"] == "train")
    assert train["mfu_datasheet"] == pytest.approx(0.52 * 800e12 / 989.4e12)
    assert result["side"]["tests"]["failed"] == ["tests/test_gpu.py::b - assert"]
    assert result["side"]["packages"] == ["timm 1.0.29"]
    text = (tmp_path / "gpu_speed.md").read_text()
    assert "- infer_mfu: 0.58" in text.splitlines()


def test_no_speed_results_is_one_line_naming_the_folder(tmp_path: Path) -> None:
    done = _report(str(tmp_path), "--out", str(tmp_path / "gpu_speed"))
    assert done.returncode == 1
    assert done.stderr.strip() == f"gpu_report: no gpu_speed_*.json in {tmp_path}"
    assert not (tmp_path / "gpu_speed.json").exists()
