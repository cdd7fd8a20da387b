"""vitkit serve's speed choices, checked by what they do (never by a clock): a forward expected
to be short runs on the event loop (no hand-off to the model's thread), never beside an
explanation; a model whose fullest forward is small runs on one intra-op thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

import vitkit  # noqa: E402
from vitkit.cli import main  # noqa: E402
from vitkit.registry.counts import count_flops  # noqa: E402
from vitkit.registry.model_config import ViTConfig  # noqa: E402
from vitkit.serve.batcher import Batcher  # noqa: E402
from vitkit.serve.served_model import ONE_THREAD_FLOPS, forward_threads  # noqa: E402


def recording_run(threads: list[str], spans: list[tuple[float, float]], sleep: float = 0.0) -> Any:
    def run(values: Any) -> list[Any]:
        start = time.perf_counter()
        threads.append(threading.current_thread().name)
        time.sleep(sleep)
        spans.append((start, time.perf_counter()))
        return [v * 10 for v in values]

    return run


def test_a_short_forward_runs_on_the_event_loop_once_a_forward_was_seen():
    threads: list[str] = []

    async def go(inline_ms: float) -> tuple[list[Any], int]:
        b = Batcher(recording_run(threads, []), max_batch=4, max_wait_ms=0, inline_ms=inline_ms)
        b.start()
        answers = [await b.submit([i]) for i in range(3)]
        await b.stop()
        return answers, b.inline_forwards

    loop_thread = threading.current_thread().name  # (asyncio.run runs its loop here)
    assert asyncio.run(go(1000.0)) == ([[0], [10], [20]], 2)
    # the first forward (no time seen yet) on the model's thread, the next two on the loop
    assert threads == ["vitkit-forward", loop_thread, loop_thread]
    threads.clear()
    assert asyncio.run(go(0.0)) == ([[0], [10], [20]], 0)  # (off: every forward handed over)
    assert threads == ["vitkit-forward"] * 3


def test_a_forward_longer_than_the_limit_stays_on_the_model_thread():
    threads: list[str] = []

    async def go() -> int:
        b = Batcher(recording_run(threads, [], 0.05), max_batch=4, max_wait_ms=0, inline_ms=10)
        b.start()
        for i in range(3):
            assert await b.submit([i]) == [10 * i]
        await b.stop()
        return b.inline_forwards

    assert asyncio.run(go()) == 0
    assert threads == ["vitkit-forward"] * 3


def test_no_forward_runs_on_the_loop_while_an_explanation_runs():
    """An explanation runs on the model's thread: a forward queued meanwhile waits for it
    there (the model never runs two calls at once), though it would be short."""
    threads: list[str] = []
    spans: list[tuple[float, float]] = []

    def explain() -> str:
        start = time.perf_counter()
        time.sleep(0.3)
        spans.append((start, time.perf_counter()))
        return "explained"

    async def go() -> list[Any]:
        b = Batcher(recording_run(threads, spans), max_batch=4, max_wait_ms=0, inline_ms=1000)
        b.start()
        assert await b.submit([1]) == [10]  # (a forward seen: the next short ones may go inline)
        explaining = asyncio.ensure_future(b.call(explain))
        await asyncio.sleep(0.05)  # (the explanation is running)
        both = await asyncio.gather(explaining, b.submit([2]))
        await b.stop()
        return both

    assert asyncio.run(go()) == ["explained", [20]]
    assert threads == ["vitkit-forward", "vitkit-forward"]
    (f1, _), (e0, e1), (f2, _) = sorted(spans)
    assert e0 <= f2 and e1 <= f2  # the second forward started after the explanation ended


def test_a_model_whose_full_batch_is_under_a_gflop_runs_on_one_thread():
    mnist = ViTConfig(
        image_size=28, patch_size=7, in_chans=1, width=64, depth=6, num_heads=4, mlp_dim=256,
        num_classes=10,
    )  # fmt: skip
    per_image = count_flops(mnist)
    assert forward_threads(mnist, 32) == 1
    most = int(ONE_THREAD_FLOPS // per_image)  # the largest batch still under the limit
    assert forward_threads(mnist, most) == 1
    assert forward_threads(mnist, most + 1) is None
    b16 = ViTConfig(image_size=224, patch_size=16, width=768, depth=12, num_heads=12,
                    mlp_dim=3072, num_classes=1000)  # fmt: skip
    assert forward_threads(b16, 1) is None


def test_serve_says_it_runs_a_small_model_on_one_thread_unless_threads_are_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=16, width=32, depth=1,
                                num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=["a", "b", "c"])
    threads = torch.get_num_threads()
    assert main(["serve", str(tmp_path / "ck"), "--dry-run", "--max-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "threads: 1 a forward (one of 4 images is" in out
    assert torch.get_num_threads() == threads  # (a dry run sets nothing)
    assert main(["serve", str(tmp_path / "ck"), "--dry-run", "--threads", str(threads)]) == 0
    assert "threads: 1" not in capsys.readouterr().out  # (--threads given: its choice)


def test_a_batch_holding_every_request_there_can_be_does_not_wait_for_more():
    """A forward waits for company (a recent request found another) unless no open connection
    is without a request in the server and none is on its way: then none can join."""

    async def took(idle: int | None) -> float:
        on_its_way = [2]
        b = Batcher(lambda v: v, max_batch=8, max_wait_ms=2000, others=lambda: on_its_way[0],
                    idle=lambda: idle)  # fmt: skip
        b.start()
        work = b.enqueue([1])  # (beside others on their way: company)
        on_its_way[0] = 0
        start = time.perf_counter()
        assert await work == [1]
        seconds = time.perf_counter() - start
        await b.stop()
        return seconds

    assert asyncio.run(took(0)) < 1.0  # every connection's request is in: no 2 s wait
    assert asyncio.run(took(1)) >= 1.95  # a connection could still send one
    assert asyncio.run(took(None)) >= 1.95  # (not known: the wait as before)


def test_over_http_a_forward_waits_only_while_an_open_connection_could_send_a_request(
    tmp_path: Path,
):
    from test_serve_admission import on_its_way
    from test_serve_bounds import call
    from test_serve_decode_process import Server, png

    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=16, width=32, depth=1,
                                num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=["a", "b", "c"])
    image = png(16)
    server = Server([str(tmp_path / "ck"), "--max-wait-ms", "5000"])
    try:
        with on_its_way(server.port):  # a request arriving beside it: company, and a wait
            assert call(server.port, "/v1/classify", image)[0] == 200
        start = time.perf_counter()
        assert call(server.port, "/v1/classify", image)[0] == 200
        assert time.perf_counter() - start < 3.5  # its connection is the only one: no 5 s wait
        with socket.create_connection(("127.0.0.1", server.port)):  # open, may send a request
            time.sleep(0.2)  # (accepted)
            start = time.perf_counter()
            assert call(server.port, "/v1/classify", image)[0] == 200
            assert time.perf_counter() - start >= 4.9
    finally:
        server.stop()


def test_serve_moves_what_its_start_made_out_of_the_collectors_reach_before_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """A full collection walked every object of the start (the model, PyTorch's and FastAPI's
    modules) while requests waited: by the time the server listens they are frozen. (The
    server's run here only records that and says it could not listen.)"""
    import gc

    import vitkit.cli.serve as serve_cli

    frozen: list[int] = []

    class Recording:
        def __init__(self, config: Any):
            pass

        def run(self, sockets: Any = None) -> None:
            frozen.append(gc.get_freeze_count())
            raise SystemExit(1)

    monkeypatch.setattr(serve_cli, "_draining_server", lambda: Recording)
    torch.manual_seed(0)
    model = vitkit.create_model("Ti/4", num_classes=3, image_size=16, width=32, depth=1,
                                num_heads=2, mlp_dim=64)  # fmt: skip
    vitkit.save_checkpoint(tmp_path / "ck", model, class_names=["a", "b", "c"])
    threads = torch.get_num_threads()
    gc.unfreeze()
    try:
        assert main(["serve", str(tmp_path / "ck"), "--port", "0", "--threads", "1"]) == 2
    finally:
        gc.unfreeze()
        torch.set_num_threads(threads)
    assert "could not listen" in capsys.readouterr().err
    assert len(frozen) == 1 and frozen[0] > 10_000, frozen
