"""vitkit serve's memory across requests: the images being decoded hold at most
--max-decode-memory together (each image's need known from its header, one that needs more
refused), and the request bodies held at once at most --max-body-memory (beyond it 503 with
Retry-After, counted in /metrics)."""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_bounds import Server, call  # noqa: E402
from test_serve_bounds import work as work  # noqa: E402,F401  (the module's fixture)

from vitkit import PreprocessConfig  # noqa: E402
from vitkit.cli import main  # noqa: E402
from vitkit.data.images import eval_transform  # noqa: E402
from vitkit.pil_images import resize_pixels  # noqa: E402
from vitkit.serve.decode import DecodeBudget, decode_bytes, jpeg_coefficient_bytes  # noqa: E402
from vitkit.serve.request_images import load_image, open_image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def images() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    w, h = 1500, 1000
    ramp = np.linspace(0, 200, w)[None, :, None] + np.linspace(0, 50, h)[:, None, None]
    photo = (ramp + rng.integers(0, 6, (h, w, 3))).astype(np.uint8)  # smooth, like a photo
    return {
        "L": png(Image.fromarray(rng.integers(0, 255, (h, w), np.uint8))),
        "RGB": png(Image.fromarray(rng.integers(0, 255, (h, w, 3), np.uint8))),
        "RGBA": png(Image.fromarray(rng.integers(0, 255, (h, w, 4), np.uint8))),
        "I;16": png(Image.fromarray(rng.integers(0, 65535, (h, w), np.uint16))),
        "P": png(Image.fromarray(rng.integers(0, 255, (h, w, 3), np.uint8)).quantize(64)),
        "progressive JPEG": jpeg(photo, progressive=True),
        "progressive JPEG 4:4:4": jpeg(photo, progressive=True, subsampling=0),
        "JPEG": jpeg(photo, progressive=False),
    }


def jpeg(pixels: np.ndarray, progressive: bool, subsampling: int = 2) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(
        buf, format="JPEG", quality=95, progressive=progressive, subsampling=subsampling
    )
    return buf.getvalue()


@pytest.mark.parametrize("channels", [1, 3])
def test_the_decode_estimate_covers_what_decoding_allocates(channels: int) -> None:
    """For every mode a PNG decodes to, the estimate from the header is at least the peak
    memory decoding, converting and transforming it took (glibc's bytes handed out, sampled
    every millisecond), and not more than about three times it."""
    import torch
    from speed import PeakMemory

    pre = PreprocessConfig(channels=channels, mean=(0.5,) * channels, std=(0.5,) * channels)
    transform = eval_transform(pre.replace(crop_pct=0.875, interpolation="bicubic"))
    for mode, data in images().items():
        img = open_image(data, channels, 25_000_000)
        w, h = img.size
        resized = resize_pixels(transform, w, h)
        need = decode_bytes(img.mode, w, h, channels, resized, jpeg_coefficient_bytes(img))
        peak = 0
        for _ in range(5):  # a sampler that missed the peak (a loaded host) measures again
            again = open_image(data, channels, 25_000_000)
            with PeakMemory(torch.device("cpu")) as pm:
                out = transform(load_image(again, channels))
            del out
            if pm.peak is None:
                pytest.skip("no glibc mallinfo2 here")
            peak = max(peak, pm.peak)
            if need <= 3 * peak + 2_000_000:
                break
        assert peak <= need, (mode, img.mode, peak, need)
        assert need <= 3 * peak + 2_000_000, (mode, img.mode, peak, need)


def test_decodes_wait_for_the_budget_and_never_hold_more_together() -> None:
    budget = DecodeBudget(100)
    order: list[str] = []

    def worker(name: str, need: int, hold_s: float) -> None:
        with budget.hold(need):
            order.append(f"{name} in")
            time.sleep(hold_s)
            order.append(f"{name} out")

    a = threading.Thread(target=worker, args=("a", 60, 0.3))
    a.start()
    time.sleep(0.05)
    b = threading.Thread(target=worker, args=("b", 60, 0.0))  # 120 > 100: waits for a
    c = threading.Thread(target=worker, args=("c", 30, 0.0))  # fits beside a
    b.start(), c.start()
    for t in (a, b, c):
        t.join()
    assert order.index("b in") > order.index("a out")
    assert order.index("c in") < order.index("a out")
    assert budget.peak <= 100 and budget.held == 0
    assert not budget.fits(101) and budget.fits(100)


def test_an_image_that_needs_more_than_the_decode_budget_gets_413_naming_it(work: Path) -> None:
    s = Server([str(work / "ck"), "--max-decode-memory", "2000000"])
    try:
        big = png(Image.new("RGB", (1000, 1000), (9, 9, 9)))  # 4 MB decoded
        status, body = call(s.port, "/v1/classify", big, {"Content-Type": "image/png"})
        assert status == 413, body
        message = json.loads(body)["error"]
        assert "--max-decode-memory" in message and "1000x1000" in message
        small = (work / "img.png").read_bytes()
        assert call(s.port, "/v1/classify", small, {"Content-Type": "image/png"})[0] == 200
    finally:
        s.stop()


def slow_body(port: int, size: int, sent: threading.Event, go: threading.Event) -> bytes:
    """POST a body of ``size`` bytes: all but its last byte, then wait for ``go``."""
    head = (
        f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\0" * (size - 1))
        sent.set()
        go.wait(30)
        sock.sendall(b"\0")
        got = b""
        while more := sock.recv(65536):
            got += more
            if b"\r\n\r\n" in got and b'"}' in got:
                break
        return got


def test_bodies_held_at_once_are_bounded_and_the_rest_get_503_with_retry_after(
    work: Path,
) -> None:
    s = Server([str(work / "ck"), "--max-body", "200000", "--max-body-memory", "300000"])
    try:
        sent, go = threading.Event(), threading.Event()
        first: list[bytes] = []
        t = threading.Thread(target=lambda: first.append(slow_body(s.port, 200_000, sent, go)))
        t.start()
        assert sent.wait(30)
        time.sleep(1.0)  # the server has read the first 199,999 bytes
        data = b"\0" * 150_000
        req_headers = {"Content-Type": "image/png"}
        status, body = call(s.port, "/v1/classify", data, req_headers)
        assert status == 503, body
        assert "--max-body-memory" in json.loads(body)["error"]
        go.set()
        t.join(30)
        assert first and first[0].split()[1] == b"415"  # (zeros: not an image) answered
        small = (work / "img.png").read_bytes()
        assert call(s.port, "/v1/classify", small, req_headers)[0] == 200  # all given back
        metrics = call(s.port, "/metrics")[1].decode()
        assert 'vitkit_requests_dropped_total{reason="body_memory"} 1' in metrics
    finally:
        s.stop()


def test_a_503_for_body_memory_says_retry_after() -> None:
    """The header a client backs off by (checked on the answer the Guard builds)."""
    import asyncio

    from vitkit.serve.http_app import Guard, Settings
    from vitkit.serve.prometheus import Metrics
    from vitkit.serve.request_images import Limits

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"x" * 10, "more_body": False}

    limits = Limits(max_body_bytes=10, max_body_memory=10)
    metrics = Metrics({}, lambda: 0)
    guard = Guard(None, settings=Settings(limits, 8, 5.0), metrics=metrics)  # type: ignore[arg-type]
    guard.body_bytes = 5  # another request holds half of it
    scope = {"type": "http", "path": "/v1/classify", "headers": [], "method": "POST"}
    asyncio.run(guard(scope, receive, send))
    start = sent[0]
    assert start["status"] == 503
    assert (b"retry-after", b"1") in start["headers"]
    assert guard.body_bytes == 5  # nothing of the refused request stays counted


def test_body_memory_below_the_largest_body_is_refused_before_loading(work: Path, capsys) -> None:
    code = main(
        ["serve", str(work / "nonexistent"), "--max-body", "1000", "--max-body-memory", "999"]
    )
    err = capsys.readouterr().err
    assert code != 0
    assert "--max-body-memory 999 is below --max-body 1,000" in err
    assert "nonexistent" not in err  # refused before the checkpoint was looked for


def test_a_thumbnail_is_not_queued_behind_a_large_decode(work: Path) -> None:
    """A small image (a body of at most 64 KB, at most 65,536 pixels) is decoded on the event
    loop, less work than the hop to a decode thread: it is answered while the only decode
    thread is busy with a 25-megapixel image, where it used to wait its turn."""
    s = Server([str(work / "ck"), "--decode-workers", "1"])
    try:
        ramp = np.tile((np.arange(5000) * 13).astype(np.uint16), (5000, 1))
        big = png(Image.fromarray(ramp))  # 16-bit, 25 megapixels, a small file
        small = (work / "img.png").read_bytes()
        headers = {"Content-Type": "image/png"}
        done: dict[str, float] = {}

        def send(name: str, body: bytes) -> None:
            assert call(s.port, "/v1/classify", body, headers)[0] == 200
            done[name] = time.perf_counter()

        t = threading.Thread(target=send, args=("big", big))
        t.start()
        time.sleep(0.1)  # the big one (0.6 s here) is being decoded
        send("small", small)
        t.join(60)
        assert done["small"] < done["big"], done
    finally:
        s.stop()
