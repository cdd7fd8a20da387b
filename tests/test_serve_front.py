"""vitkit serve --workers N: one front, N model processes. A model process killed mid-forward
loses no request (its batch runs on another), a batch whose processes die twice is answered 500
and the server goes on, both processes get work, and /metrics comes from one place."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_admission import call, said, start  # noqa: E402

import vitkit  # noqa: E402

CLASSIFIED = 'vitkit_requests_total{route="/v1/classify",status="200"}'


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("front")
    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/4", num_classes=3, image_size=16, in_chans=3, width=32, depth=1, num_heads=2,
        mlp_dim=64,
    )  # fmt: skip
    vitkit.save_checkpoint(d / "ck", model, class_names=["a", "b", "c"])
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(d / "img.png")
    return d


def parent(pid: int) -> int | None:
    """The parent of process ``pid`` (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def model_pids(lines: list[str]) -> dict[int, int]:
    """model process index -> pid, the latest of each."""
    found = [re.match(r"model process (\d+) ready \(pid (\d+)\)", ln) for ln in lines]
    return {int(m.group(1)): int(m.group(2)) for m in found if m}


def value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def scrape(port: int, name: str) -> float:
    return value(call(port, "/metrics")[1].decode(), name)


def serve(work: Path, *more: str) -> tuple[Any, list[str], int]:
    args = [str(work / "ck"), "--port", "0", "--workers", "2", "--precision", "fp32"]
    proc, lines = start([*args, *more])
    assert lines[-1].startswith("ready: http://127.0.0.1:"), "".join(lines)
    return proc, lines, int(lines[-1].rsplit(":", 1)[1].strip(" /\n"))


def restarted(lines: list[str], index: int, old: int) -> int:
    """The new pid of model process ``index`` once it is ready again."""
    for _ in range(1200):
        if model_pids(lines).get(index, old) != old:
            return model_pids(lines)[index]
        time.sleep(0.1)
    raise AssertionError("".join(lines))


def stopped_cleanly(proc: Any) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_a_model_process_killed_mid_forward_loses_no_request(work):
    """Both model processes frozen (SIGSTOP) with batches handed to them, one killed: its
    batch runs on the other or on its replacement, and every client gets its answer."""
    proc, lines, port = serve(work)
    try:
        pids = model_pids(lines)
        assert sorted(pids) == [1, 2], "".join(lines)
        png = (work / "img.png").read_bytes()
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(12) as pool:
            answers = [pool.submit(call, port, "/v1/classify", png) for _ in range(12)]
            time.sleep(1.0)  # (the requests reach the front, which hands each process a batch)
            assert not any(a.done() for a in answers)
            assert call(port, "/health")[0] == 200  # the front answers while forwards wait
            os.kill(pids[1], signal.SIGKILL)
            os.kill(pids[2], signal.SIGCONT)
            codes = [a.result()[0] for a in answers]
        assert codes == [200] * 12, codes
        said(lines, "model process 1 (pid")
        restarted(lines, 1, pids[1])
        assert scrape(port, 'vitkit_model_process_restarts_total{process="1"}') == 1
        assert scrape(port, CLASSIFIED) == 12
        assert [call(port, "/v1/classify", png)[0] for _ in range(4)] == [200] * 4
        stopped_cleanly(proc)
    finally:
        proc.kill()


def test_a_batch_whose_processes_die_twice_is_answered_500_and_the_server_goes_on(work):
    """A batch that kills every process it runs on (a poison input, played by SIGKILL): tried
    once more on another process, then answered 500 naming what killed them; the server goes
    on serving."""
    proc, lines, port = serve(work)
    try:
        pids = model_pids(lines)
        png = (work / "img.png").read_bytes()
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(call, port, "/v1/classify", png)
            time.sleep(1.0)  # (its batch is handed to process 1, the first to ask for one)
            os.kill(pids[1], signal.SIGKILL)
            said(lines, f"model process 1 (pid {pids[1]}) was killed by SIGKILL during a "
                 "forward of 1 images")  # fmt: skip
            restarted(lines, 1, pids[1])  # (meanwhile process 2, frozen, holds the batch)
            assert not answer.done()
            if parent(pids[2]) == proc.pid:  # (else taken for stalled and replaced meanwhile:
                os.kill(pids[2], signal.SIGKILL)  # its pid may be another process's by now)
            status, body, _ = answer.result()
        assert status == 500, (status, body)
        assert b", 2 times: the batch is not tried again" in body, body
        said(lines, f"model process 2 (pid {pids[2]})")
        restarted(lines, 2, pids[2])
        assert [call(port, "/v1/classify", png)[0] for _ in range(4)] == [200] * 4
        assert scrape(port, 'vitkit_requests_total{route="/v1/classify",status="500"}') == 1
        stopped_cleanly(proc)
    finally:
        proc.kill()


def test_both_model_processes_get_work_and_every_scrape_counts_every_answer(work):
    """Work goes where there is room: with process 1 busy (frozen on the first batch) the
    others go to process 2, and process 1 answers its own once it runs again. /metrics is the
    front's: right after each answer a scrape counts it, never going back, a model process
    killed meanwhile included. (Batches of at most 2: the frozen batch cannot hold every
    request the 8 clients have in flight, which would leave process 2 nothing to take.)"""
    proc, lines, port = serve(work, "--max-batch", "2")
    try:
        png = (work / "img.png").read_bytes()
        pids = model_pids(lines)
        os.kill(pids[1], signal.SIGSTOP)
        images = 'vitkit_model_process_images_total{{process="{}"}}'.format
        with ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(call, port, "/v1/classify", png) for _ in range(32)]
            for _ in range(1200):  # (process 2 computes while process 1 holds a batch)
                if scrape(port, images(2)) > 0:
                    break
                time.sleep(0.1)
            assert scrape(port, images(1)) == 0
            os.kill(pids[1], signal.SIGCONT)
            codes = [a.result()[0] for a in answers]
        assert codes == [200] * 32
        counts = [scrape(port, images(i)) for i in (1, 2)]
        assert sum(counts) == 32 and min(counts) > 0, counts
        seen = []
        for n in range(33, 53):
            assert call(port, "/v1/classify", png)[0] == 200
            seen.append(scrape(port, CLASSIFIED))
            assert seen[-1] == n, seen  # (one set of counters: no lag, no other worker's file)
            if n == 38:
                pid = model_pids(lines)[2]
                os.kill(pid, signal.SIGKILL)
        assert seen == sorted(seen)
        stopped_cleanly(proc)
    finally:
        proc.kill()


def test_sigterm_drains_the_forwards_still_running_in_model_processes(work):
    """SIGTERM while both model processes hold a batch (frozen): the front waits for them
    within --drain-timeout, every request is answered, every process exits and the command
    exits 0."""
    proc, lines, port = serve(work, "--drain-timeout", "20")
    try:
        pids = model_pids(lines)
        png = (work / "img.png").read_bytes()
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(6) as pool:
            answers = [pool.submit(call, port, "/v1/classify", png) for _ in range(6)]
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert proc.poll() is None and not any(a.done() for a in answers)
            for pid in pids.values():
                os.kill(pid, signal.SIGCONT)
            codes = [a.result()[0] for a in answers]
        assert codes == [200] * 6, codes
        assert proc.wait(timeout=60) == 0
        said(lines, "stopped: every request in flight was answered")
        for pid in pids.values():  # no model process left behind
            assert (
                not Path(f"/proc/{pid}").exists()
                or "zombie" in Path(f"/proc/{pid}/status").read_text()
            )
    finally:
        proc.kill()


def test_a_model_process_that_stops_answering_is_killed_and_its_batch_runs_elsewhere(work):
    """A model process frozen mid-forward (SIGSTOP: a hang in native code, say) is killed once
    its forward is 30 s past due, and its batch runs on the other process (a deadline past
    those 30 s: --timeout 120)."""
    proc, lines, port = serve(work, "--timeout", "120")
    try:
        pids = model_pids(lines)
        os.kill(pids[1], signal.SIGSTOP)  # (process 1 takes the first batch)
        status, body, _ = call(port, "/v1/classify", (work / "img.png").read_bytes())
        assert status == 200, body
        said(lines, f"model process 1 (pid {pids[1]}) gave no answer in 30 s and was killed")
        restarted(lines, 1, pids[1])
        assert scrape(port, 'vitkit_model_process_restarts_total{process="1"}') == 1
        assert scrape(port, 'vitkit_model_process_images_total{process="2"}') == 1
        stopped_cleanly(proc)
    finally:
        proc.kill()
