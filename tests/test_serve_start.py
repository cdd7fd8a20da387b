"""vitkit serve refuses at start, in one line, what the machine cannot hold: --threads past 4
per CPU (100,000 crashed the process), a --max-batch whose forward needs more memory than the
machine has, and a busy port (said with its reason before the model loads)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_bounds import work as work  # noqa: E402,F401  (the module's fixture)

from vitkit.cli import main  # noqa: E402
from vitkit.serve.workers import http_url  # noqa: E402


def test_threads_past_four_per_cpu_are_refused_in_one_line(work: Path, capsys) -> None:
    code = main(["serve", str(work / "ck"), "--threads", "100000", "--dry-run"])
    err = capsys.readouterr().err
    cpus = len(os.sched_getaffinity(0))
    assert code != 0
    assert f"--threads 100,000: this machine gives the process {cpus} CPUs" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_threads_within_the_range_are_taken(work: Path, capsys) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert main(["serve", str(work / "ck"), "--threads", str(4 * cpus), "--dry-run"]) == 0
    assert "would serve" in capsys.readouterr().out


def test_a_batch_past_the_machines_memory_is_refused_before_the_warm_up(work: Path, capsys) -> None:
    code = main(["serve", str(work / "ck"), "--max-batch", "100000000000", "--dry-run"])
    err = capsys.readouterr().err
    assert code != 0
    assert "--max-batch 100,000,000,000: one forward of" in err and "GB" in err
    assert "images a forward" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--workers", "100000"], "--workers 100,000: this machine gives the process {cpus} CPUs"),
        (["--decode-workers", "5000"], "--decode-workers 5,000: this machine gives the process"),
        (["--timeout", "1e300"], "--timeout 1e+300: at most 86,400 s (a day); 0: none"),
        (["--drain-timeout", "1e9"], "--drain-timeout 1e+09: at most 86,400 s (a day)"),
        (["--read-timeout", "1e9"], "--read-timeout 1e+09: at most 86,400 s (a day)"),
        (["--max-images", "9", "--max-queue", "8"], "--max-images 9 is above --max-queue 8"),
        (["--max-decode-memory", "10000000000000000"], "GB that requests may hold; this machine"),
        (["--max-body-memory", "10000000000000000", "--max-body", "20000000"], "may hold; this"),
        (["--max-queue", "100000000000"], "--max-queue 100,000,000,000: that many waiting"),
    ],
)
def test_numeric_options_past_what_the_machine_holds_are_refused_in_one_line(
    work: Path, capsys, argv: list[str], says: str
) -> None:
    code = main(["serve", str(work / "ck"), *argv, "--dry-run"])
    err = capsys.readouterr().err
    assert code != 0
    assert says.format(cpus=len(os.sched_getaffinity(0))) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_options_at_the_edge_of_their_range_are_taken(work: Path, capsys) -> None:
    cpus = len(os.sched_getaffinity(0))
    argv = ["--workers", str(4 * cpus), "--decode-workers", str(4 * cpus), "--timeout", "86400"]
    argv += ["--drain-timeout", "86400", "--max-images", "8", "--max-queue", "8"]
    assert main(["serve", str(work / "ck"), *argv, "--dry-run"]) == 0
    assert "would serve" in capsys.readouterr().out


def test_a_short_queue_alone_bounds_the_images_per_request(work: Path, capsys) -> None:
    """--max-queue 8 alone was refused ("--max-images 16 is above --max-queue 8"): the default
    --max-images follows a shorter queue; only one given above it is refused."""
    assert main(["serve", str(work / "ck"), "--max-queue", "8", "--dry-run"]) == 0
    assert ", 8 images of up to " in capsys.readouterr().out
    assert main(["serve", str(work / "ck"), "--dry-run"]) == 0
    assert ", 16 images of up to " in capsys.readouterr().out


def test_a_busy_port_is_said_with_its_reason_before_the_model_loads(work: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code = main(["serve", str(work / "ck"), "--port", str(port)])
    out, err = capsys.readouterr()
    assert code != 0
    assert f"could not listen on 127.0.0.1:{port}: Address already in use" in err
    assert out == ""  # nothing loaded: the engine line is printed once the model is


def test_an_ipv6_address_is_bracketed_in_the_ready_line_of_workers(work: Path) -> None:
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    argv = [sys.executable, "-m", "vitkit", "serve", str(work / "ck"), "--host", "::1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.Popen(
        [*argv, "--port", "0", "--workers", "2", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready:"):
                break
        assert re.fullmatch(r"ready: http://\[::1\]:\d+/\n", lines[-1]), lines
        assert http_url("::1", 80) == "http://[::1]:80"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


def test_ready_turns_503_while_shedding_load_or_draining_and_health_stays_200(work: Path) -> None:
    from test_serve_bounds import call
    from test_serve_decode_process import Server

    png = (work / "img.png").read_bytes()
    # a deadline no request can meet: each is refused as busy (shedding)
    server = Server([str(work / "ck"), "--timeout", "0.000001", "--api-key", "k"])
    try:
        assert call(server.port, "/ready")[0] == 200  # (no key needed)
        status, _ = call(server.port, "/v1/classify", png, {"X-API-Key": "k"})
        assert status == 503
        status, body = call(server.port, "/ready")
        assert status == 503 and b"shedding load" in body
        assert call(server.port, "/health")[0] == 200  # liveness is not readiness
        time.sleep(2.5)  # (the shedding window passes)
        assert call(server.port, "/ready")[0] == 200
        loop = server.server.servers[0].get_loop()
        loop.call_soon_threadsafe(server.app.state.batcher.drain)
        for _ in range(100):  # (the loop runs it at its next turn)
            status, body = call(server.port, "/ready")
            if status == 503:
                break
            time.sleep(0.1)
        assert status == 503 and b"draining" in body
    finally:
        server.stop()


def test_the_front_holds_the_decode_and_body_budgets_once_socket_workers_each(
    work: Path, capsys
) -> None:
    """--workers N with a front: the bodies and decodes are the front's, counted once against
    the machine's memory; --worker-mode socket: N workers each hold their own."""
    from vitkit.cli.serve_bounds import machine_memory

    memory = machine_memory()
    if memory is None:
        pytest.skip("the machine's memory is not known here")
    argv = ["serve", str(work / "ck"), "--workers", "4", "--dry-run"]
    argv += ["--max-decode-memory", str(int(memory * 0.4)), "--max-body", "1000000"]
    argv += ["--max-body-memory", "1000000"]
    assert main(argv) == 0
    assert "4 model processes" in capsys.readouterr().out
    assert main([*argv, "--worker-mode", "socket"]) != 0
    err = capsys.readouterr().err
    assert "bytes x 4 workers = " in err and "that requests may hold" in err, err
