"""bench/int8_accuracy.py never replaces a folder it did not create (no onnxruntime needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "int8_accuracy.py"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(BENCH), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_an_existing_work_folder_is_refused_and_kept(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("a user's file")
    done = _bench(str(tmp_path / "run"), "--work", str(work), "--out", str(tmp_path / "r"))
    assert done.returncode == 1
    assert done.stderr.strip() == f"int8_accuracy: {work} exists; pass --overwrite to replace it"
    assert (work / "mine.txt").read_text() == "a user's file"
    assert not (tmp_path / "r.json").exists()


def test_an_unknown_path_is_one_line_naming_the_choices(tmp_path: Path) -> None:
    done = _bench(str(tmp_path / "run"), "--paths", "dynamic,fp8", "--out", str(tmp_path / "r"))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "int8_accuracy: unknown path(s) fp8 "
        "(of dynamic, static, openvino, dynamic-fc2, openvino-fc2, bf16, openvino-bf16)"
    )
    assert not (tmp_path / "r_work").exists()


def test_a_folder_that_is_not_a_finished_run_is_refused_before_any_work(tmp_path: Path) -> None:
    done = _bench(str(tmp_path / "nothing"), "--out", str(tmp_path / "r"))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"int8_accuracy: {tmp_path / 'nothing'}: not a finished vitkit run (no report.json)"
    )
    assert not (tmp_path / "r_work").exists()
