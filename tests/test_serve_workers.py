"""vitkit serve --workers N: one /metrics for the whole server (every worker's counters summed,
whichever worker answers the scrape, a dead worker's kept), a killed worker replaced while the
others answer."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_admission import call, listening, start  # noqa: E402

import vitkit  # noqa: E402
from vitkit.serve.prometheus import Metrics, retire  # noqa: E402

CLASSIFIED = 'vitkit_requests_total{route="/v1/classify",status="200"}'


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("workers")
    torch.manual_seed(0)
    model = vitkit.create_model(
        "Ti/4", num_classes=3, image_size=16, in_chans=3, width=32, depth=1, num_heads=2,
        mlp_dim=64,
    )  # fmt: skip
    vitkit.save_checkpoint(d / "ck", model, class_names=["a", "b", "c"])
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(d / "img.png")
    return d


def value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_workers_metrics_files_sum_keep_a_dead_workers_counts_and_drop_its_gauges(tmp_path):
    a, b = Metrics({"model": "m"}, lambda: 3), Metrics({"model": "m"}, lambda: 4)
    for m, n in ((a, 5), (b, 7)):
        for _ in range(n):
            m.request_done("/v1/classify", 200, 0.02)
        m.batch_done(n, 0.5)
        m.request_dropped("queue_full")
        m.in_flight = 1
    a.share(tmp_path)
    a.publish()
    # b plays a worker in another process: its file under another pid
    (tmp_path / "worker-999999.json").write_text(__import__("json").dumps(b.state()))
    text = a.render()
    assert value(text, CLASSIFIED) == 12
    assert value(text, 'vitkit_request_seconds_count{route="/v1/classify"}') == 12
    assert value(text, 'vitkit_request_seconds_bucket{route="/v1/classify",le="0.025"}') == 12
    assert value(text, "vitkit_batch_images_sum") == 12.0
    assert value(text, "vitkit_batch_images_count") == 2
    assert value(text, 'vitkit_requests_dropped_total{reason="queue_full"}') == 2
    assert value(text, "vitkit_queue_images") == 7 and value(text, "vitkit_requests_in_flight") == 2
    retire(tmp_path, 999999)  # that worker died: its counts stay, its gauges go
    text = a.render()
    assert value(text, CLASSIFIED) == 12
    assert value(text, "vitkit_queue_images") == 3 and value(text, "vitkit_requests_in_flight") == 1


def test_every_scrape_of_two_workers_sums_both_and_never_goes_back_even_past_a_kill(work):
    proc, lines = start(
        [str(work / "ck"), "--port", "0", "--workers", "2", "--worker-mode", "socket"]
    )
    try:
        assert lines[-1].startswith("ready: http://127.0.0.1:"), "".join(lines)
        port = int(lines[-1].rsplit(":", 1)[1].strip(" /\n"))
        png = (work / "img.png").read_bytes()
        seen: list[float] = []

        def scrape() -> float:
            seen.append(value(call(port, "/metrics")[1].decode(), CLASSIFIED))
            return seen[-1]

        with ThreadPoolExecutor(4) as pool:  # (both workers get some: the kernel shares them)
            answers = list(pool.map(lambda _: call(port, "/v1/classify", png)[0], range(40)))
            for _ in range(5):
                scrape()
        assert answers == [200] * 40
        until = time.monotonic() + 30
        while scrape() != 40 and time.monotonic() < until:  # (published within 0.1 s)
            time.sleep(0.1)
        scrapes = [scrape() for _ in range(20)]
        assert scrapes == [40] * 20, scrapes  # one worker alone would read only its own
        pids = listening(lines)
        os.kill(pids[1], signal.SIGKILL)
        for _ in range(600):
            if listening(lines).get(1, pids[1]) != pids[1]:
                break
            time.sleep(0.1)
        assert listening(lines)[1] != pids[1], "".join(lines)
        assert [call(port, "/v1/classify", png)[0] for _ in range(5)] == [200] * 5
        until = time.monotonic() + 30
        while scrape() != 45 and time.monotonic() < until:
            time.sleep(0.1)
        assert [scrape() for _ in range(20)] == [45] * 20  # the dead worker's 40-odd kept
        assert seen == sorted(seen), seen  # never backwards, a worker replaced included
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert not list(Path("/tmp").glob(f"vitkit-metrics-*/worker-{pids[2]}.json"))


def test_workers_without_a_writable_temporary_directory_are_refused_in_one_line(
    work, tmp_path, monkeypatch, capsys
):
    import tempfile

    from vitkit.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "absent"))
    code = main(
        ["serve", str(work / "ck"), "--workers", "2", "--port", "0", "--worker-mode", "socket"]
    )
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "could not make the directory where the workers sum their /metrics" in err, err
    assert len(err.strip().splitlines()) == 1
