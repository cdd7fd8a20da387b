"""Tests that load OpenVINO or NNCF run in a pytest process of their own.

A test marked ``openvino`` is not run in the pytest process: the first such test of a file
starts ``python -m pytest`` in a child process on every marked test of that file (their module
fixtures shared there, as in one process), and each test's reports come back from the child as
they are made. A native crash in the child (a segmentation fault in OpenVINO's runtime) is then
that test's failure, naming the signal, with the child's last output; the file's tests not yet
run start in a fresh child. The pytest process itself refuses to import OpenVINO or NNCF: a test
that reaches them unmarked fails in one line saying to mark it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from _pytest.reports import TestReport
from _pytest.runner import CallInfo

ISOLATED = ("openvino", "nncf")  # what a marked test may load: the child process's packages
REPORTS = "VITKIT_TEST_REPORTS"  # set in a child: where its reports go, one JSON line each
CHILD_TIMEOUT = 1800  # seconds for one child's tests (a hang fails, never waits for ever)
TAIL = 40  # lines of the child's output in a crashed test's report


def in_child() -> bool:
    return REPORTS in os.environ


class _Refused(importlib.abc.Loader):
    def __init__(self, name: str) -> None:
        self.name = name

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        pytest.fail(
            f"{self.name} imported in the pytest process: mark the test "
            "@pytest.mark.openvino (it then runs in a child process, tests/conftest.py)",
            pytrace=False,
        )


class _KeepOut(importlib.abc.MetaPathFinder):
    """Finds OpenVINO and NNCF as installed (``find_spec`` says whether they are) but refuses
    to execute them in this process."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.partition(".")[0] not in ISOLATED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _Refused(name)
        return spec


def installed(name: str) -> bool:
    """Whether ``name`` is installed, without importing it (OpenVINO stays out of pytest)."""
    return importlib.util.find_spec(name) is not None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "openvino: loads OpenVINO or NNCF: runs in a child pytest process (conftest.py)"
    )
    if not in_child() and not any(isinstance(f, _KeepOut) for f in sys.meta_path):
        sys.meta_path.insert(0, _KeepOut())


# --- the child: each report as one JSON line, written as it is made --------------------------

_CONFIG: list[pytest.Config] = []  # the child's config (its report hooks serialize)


def _write(line: dict[str, Any]) -> None:
    with open(os.environ[REPORTS], "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if in_child():
        _write({"start": nodeid})


def pytest_runtest_logreport(report: TestReport) -> None:
    if in_child():
        config = _CONFIG[0]
        _write({"report": config.hook.pytest_report_to_serializable(config=config, report=report)})


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG[:] = [session.config]


# --- the parent: marked tests grouped by file, each file's run in a child ----------------------


_RESULTS: dict[str, list[Any]] = {}  # nodeid -> its reports (setup, call, teardown)
_GROUPS: dict[str, list[pytest.Item]] = {}  # file -> its marked tests, in order


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _GROUPS.clear()
    for item in items:
        if item.get_closest_marker("openvino") is not None:
            _GROUPS.setdefault(str(item.path), []).append(item)


def _signal_name(rc: int) -> str:
    try:
        return f"{signal.Signals(-rc).name} ({signal.strsignal(-rc)})"
    except ValueError:
        return f"signal {-rc}"


def _failed(item: pytest.Item, text: str, when: str = "call") -> TestReport:
    keywords = {k: 1 for k in item.keywords}
    return TestReport(item.nodeid, item.location, keywords, "failed", text, when, [], 0.0)


def _run_child(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs ``items`` in child pytest processes until each has its reports."""
    todo = list(items)
    while todo:
        work = Path(tempfile.mkdtemp(prefix="vitkit-child-"))
        try:
            reports_file, log = work / "reports.jsonl", work / "output.txt"
            reports_file.touch()
            command = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-rN"]
            command += ["-p", "no:cacheprovider", "--rootdir", str(config.rootpath)]
            command += ["-c", str(config.inipath)] if config.inipath else []
            command += ["--basetemp", str(work / "tmp"), *[i.nodeid for i in todo]]
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
            env[REPORTS] = str(reports_file)  # (a child of an xdist worker is no worker)
            start = time.monotonic()
            with open(log, "wb") as out:
                child = subprocess.Popen(
                    command, cwd=config.rootpath, env=env, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
                try:
                    rc = child.wait(CHILD_TIMEOUT)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                    rc = None
            started: str | None = None
            for line in reports_file.read_text().splitlines():
                record = json.loads(line)
                if "start" in record:
                    started = record["start"]
                    continue
                report = config.hook.pytest_report_from_serializable(
                    config=config, data=record["report"]
                )
                if isinstance(report.longrepr, list):  # a skip's (path, line, reason): JSON's list
                    report.longrepr = tuple(report.longrepr)
                _RESULTS.setdefault(report.nodeid, []).append(report)
                if report.when == "teardown":
                    started = None
            todo = [
                i for i in todo if not any(r.when == "teardown" for r in _RESULTS.get(i.nodeid, []))
            ]
            if not todo:
                if rc is not None and rc < 0:  # every report is in: the process died at its exit
                    last = items[-1]
                    _RESULTS[last.nodeid].append(
                        _failed(last, f"its pytest child process died of {_signal_name(rc)} "
                                      "after this file's tests (at its exit)", "teardown")
                    )  # fmt: skip
                return
            lines = log.read_text(errors="replace").splitlines()
            fatal = [n for n, line in enumerate(lines) if "Fatal Python error" in line]
            # faulthandler's dump, innermost frames first; else the output's end
            tail = "\n".join(lines[fatal[-1] : fatal[-1] + TAIL] if fatal else lines[-TAIL:])
            how = (
                f"did not finish in {CHILD_TIMEOUT} s (killed)"
                if rc is None
                else f"died of {_signal_name(rc)}"
                if rc < 0
                else f"exited with status {rc}"
            )
            crashed = [i for i in todo if i.nodeid == started]
            if not crashed:  # nothing of these ran: a child that cannot even collect them
                for item in todo:
                    _RESULTS[item.nodeid] = [
                        _failed(
                            item,
                            f"its pytest child process {how} before running it "
                            f"({time.monotonic() - start:.0f} s); its output:\n{tail}",
                            "setup",
                        )  # fmt: skip
                    ]
                return
            item = crashed[0]
            _RESULTS[item.nodeid] = [
                r for r in _RESULTS.get(item.nodeid, []) if r.when == "setup" and r.passed
            ] + [_failed(item, f"its pytest child process {how} in this test; its output:\n{tail}")]
            todo.remove(item)  # the rest start in a fresh child
        finally:
            shutil.rmtree(work, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    if in_child() or item.get_closest_marker("openvino") is None:
        return None
    if item.nodeid not in _RESULTS:
        group = _GROUPS.get(str(item.path), [item])
        _run_child(item.config, [i for i in group if i.nodeid not in _RESULTS] or [item])
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = _RESULTS.pop(item.nodeid)
    for report in reports:
        if report.when != "teardown":
            item.ihook.pytest_runtest_logreport(report=report)
    # this process's fixtures that ``nextitem`` does not need are torn down here, as after a
    # test run in it; the child's teardown report stands unless this one fails
    call = CallInfo.from_call(
        lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown"
    )
    child = [r for r in reports if r.when == "teardown"]
    if call.excinfo is not None or not child:
        child = [item.ihook.pytest_runtest_makereport(item=item, call=call)]
    item.ihook.pytest_runtest_logreport(report=child[0])
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
