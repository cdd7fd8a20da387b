"""tests/conftest.py: a test marked ``openvino`` runs in a child pytest process; a native crash
there is that test's failure naming the signal, and the pytest process lives on (a whole-suite
run once died of a segmentation fault with OpenVINO loaded in it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

TESTS = """
import ctypes, os
import pytest

@pytest.fixture(scope="module")
def shared():
    return os.getpid()

@pytest.mark.openvino
def test_first(shared):
    assert shared == os.getpid() != PARENT

@pytest.mark.openvino
def test_crashes():
    ctypes.string_at(0)  # a segmentation fault

@pytest.mark.openvino
def test_after_the_crash(shared):
    assert shared == os.getpid()

@pytest.mark.openvino
def test_fails():
    assert 1 == 2, "a plain failure, reported as in one process"

@pytest.mark.openvino
@pytest.mark.skipif(True, reason="skipped in the child")
def test_skipped():
    pass

def test_in_the_parent():
    assert os.getpid() == PARENT

def test_unmarked_import_is_refused():
    import nncf  # noqa: F401

@pytest.mark.openvino
def test_marked_last(shared):
    pass
"""
LATER = """
import pytest

@pytest.fixture(scope="module")
def other():
    return 1

def test_in_a_later_file(other):  # this process's fixtures torn down after a child's test
    assert other == 1
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    body = TESTS.replace("PARENT", "int(os.environ['PARENT_PID'])")
    (tmp_path / "test_sample.py").write_text(body)
    (tmp_path / "test_zlater.py").write_text(LATER)
    command = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args]
    script = f"import os, subprocess, sys; os.environ['PARENT_PID'] = str(os.getpid()); " \
             f"os.execv(sys.executable, {[*command, str(tmp_path)]!r})"  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )


def test_a_crash_in_a_child_process_fails_that_test_alone(tmp_path: Path) -> None:
    done = _run(tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # tests failed; the pytest process itself did not die
    assert "PASSED test_sample.py::test_first" in out, out
    assert "FAILED test_sample.py::test_crashes" in out, out
    assert "its pytest child process died of SIGSEGV (Segmentation fault) in this test" in out
    assert "Fatal Python error: Segmentation fault" in out  # the child's faulthandler dump
    assert "PASSED test_sample.py::test_after_the_crash" in out, out  # a fresh child's
    assert "FAILED test_sample.py::test_fails" in out and "a plain failure" in out, out
    assert "SKIPPED [1] test_sample.py" in out and "skipped in the child" in out, out
    assert "PASSED test_sample.py::test_in_the_parent" in out, out
    assert "FAILED test_sample.py::test_unmarked_import_is_refused" in out, out
    assert "nncf imported in the pytest process: mark the test @pytest.mark.openvino" in out
    assert "PASSED test_zlater.py::test_in_a_later_file" in out, out
    assert "3 failed, 5 passed, 1 skipped in" in out, out
