"""vitkit serve decodes request images in processes it can kill: a decode past its request's
deadline is stopped (503 naming --timeout) and its process replaced, a normal image is answered
while bombs decode, a decode past its memory grant fails where the OS refuses the allocation
(RLIMIT_DATA), and a WebP's header is read without Pillow allocating its canvas."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")

from test_serve_bounds import (
    call,  # noqa: E402
    fp32_unless_asked,  # noqa: E402
)
from test_serve_bounds import work as work  # noqa: E402,F401  (the module's fixture)

from vitkit.cli import build_parser  # noqa: E402
from vitkit.data.transforms import PilEvalTransform  # noqa: E402
from vitkit.serve.decode import webp_header  # noqa: E402
from vitkit.serve.decode_process import DecodeFailed, DecodeProcesses, granted  # noqa: E402
from vitkit.serve.request_images import Limits, RequestError, open_checked  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from serve_hostile import deflate_tiff, scan_bomb, webp_image  # noqa: E402


class Server:
    """``vitkit serve``'s application as the command builds it (admission included), on a
    thread (uvicorn, port 0)."""

    def __init__(self, argv: list[str]):
        import uvicorn

        from vitkit.cli.serve import served_model, server_settings
        from vitkit.cli.serve_bounds import server_options
        from vitkit.serve.http_app import build_app

        args = build_parser().parse_args(["serve", *fp32_unless_asked(argv)])
        self.app = build_app(served_model(args), server_settings(args, None))
        config = uvicorn.Config(self.app, port=0, log_level="warning", **server_options(args))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def png(side: int) -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side, 3), np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def metric(port: int, line: str) -> float:
    _, text = call(port, "/metrics")
    for row in text.decode().splitlines():
        if row.startswith(line + " "):
            return float(row.split()[-1])
    raise AssertionError(f"{line} not in /metrics")


# Decodes for about 45 s on an EPYC core (2,000 scans: 4.5 s); its request's deadline is far
# sooner in every test, so it is always stopped, however fast the host.
BOMB_SIDE, BOMB_SCANS = 1000, 20_000


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return scan_bomb(BOMB_SIDE, BOMB_SCANS)


def test_a_scan_bomb_is_stopped_at_its_deadline_and_its_process_replaced(
    work: Path, bomb: bytes
) -> None:
    server = Server([str(work / "ck"), "--timeout", "2", "--decode-workers", "1"])
    try:
        status, body = call(server.port, "/v1/classify", bomb, {"Content-Type": "image/jpeg"})
        assert status == 503, body
        error = json.loads(body)["error"]
        assert "--timeout" in error and "stopped" in error and "\n" not in error
        assert metric(server.port, 'vitkit_decodes_stopped_total{limit="time"}') == 1
        assert metric(server.port, 'vitkit_requests_dropped_total{reason="decode_time"}') == 1
        # the process was replaced: a large image decodes in a process again
        status, body = call(server.port, "/v1/classify", png(300), {"Content-Type": "image/png"})
        assert status == 200, body
    finally:
        server.stop()


def test_a_normal_image_is_answered_while_bombs_decode(work: Path, bomb: bytes) -> None:
    """Two bombs hold the processes kept started (--decode-workers 2); a 300 x 300 PNG (a
    decode process too: over 64 KB) is answered before either bomb is stopped."""
    server = Server([str(work / "ck"), "--timeout", "4", "--decode-workers", "2"])
    answers: dict[str, tuple[int, float]] = {}

    def send(name: str, data: bytes) -> None:
        status, _ = call(server.port, "/v1/classify", data, {"Content-Type": "image/jpeg"})
        answers[name] = status, time.monotonic()

    try:
        bombs = [threading.Thread(target=send, args=(f"bomb{i}", bomb)) for i in range(2)]
        for t in bombs:
            t.start()
        while metric(server.port, "vitkit_requests_in_flight") < 2:
            time.sleep(0.05)
        time.sleep(0.3)  # (both in their decodes)
        send("normal", png(300))
        for t in bombs:
            t.join(60)
        assert answers["normal"][0] == 200
        assert answers["bomb0"][0] == answers["bomb1"][0] == 503
        assert answers["normal"][1] < min(answers["bomb0"][1], answers["bomb1"][1])
    finally:
        server.stop()


@pytest.mark.parametrize(
    "name", ["lossless WebP", "animated WebP", "lossy WebP", "deflate TIFF", "16-bit PNG"]
)
def test_a_decode_past_its_memory_grant_is_stopped_by_the_os(name: str) -> None:
    """Given a quarter of what its header says it needs, the decode fails inside its process
    (the OS refuses the allocation), the request is refused with the grant named, and the pool
    decodes the next image."""
    side = 3000
    data = {
        "lossless WebP": lambda: webp_image(side),
        "animated WebP": lambda: webp_image(side, animated=True),
        "lossy WebP": lambda: webp_image(side, lossy=True),
        "deflate TIFF": lambda: deflate_tiff(side),
        "16-bit PNG": lambda: _png16(side),
    }[name]()
    transform, limits = PilEvalTransform(16, 3), Limits()
    _, need = open_checked(data, transform, 3, limits, name, pillow=False)
    pool = DecodeProcesses(1)
    try:
        with pytest.raises((DecodeFailed, RequestError)) as e:
            pool.decode((transform, 3, limits, name, need // 4), data, time.monotonic() + 60, name)
        assert e.value.status in (400, 413, 415)
        assert "--max-decode-memory" in e.value.message
        # with its grant it decodes, as Pillow in the server would
        job = (transform, 3, limits, name, granted(need, 10**10))
        got = pool.decode(job, data, time.monotonic() + 60, name)
        img = Image.open(io.BytesIO(data))
        img.load()
        assert np.array_equal(got, transform.array(img))
    finally:
        pool.close()


def _png16(side: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((side, side), 40000, np.uint16)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
@pytest.mark.parametrize("kind", ["lossless", "lossy", "animated"])
def test_a_webp_header_is_read_without_pillow(mode: str, kind: str) -> None:
    """The size read from the first chunk is Pillow's; the mode is Pillow's or RGBA (the
    estimate's worst case)."""
    buf = io.BytesIO()
    img = Image.new(mode, (37, 21), (1, 2, 3, 4)[: len(mode)])
    more = [img] if kind == "animated" else []
    img.save(buf, format="WEBP", lossless=kind != "lossy", save_all=bool(more), append_images=more)
    data = buf.getvalue()
    header = webp_header(data)
    opened = Image.open(io.BytesIO(data))
    assert header is not None and header.size == opened.size == (37, 21)
    assert header.mode in (opened.mode, "RGBA")
    assert webp_header(png(4)) is None


def test_a_webp_over_the_decode_memory_is_refused_from_its_header(work: Path) -> None:
    """A 138-byte animated WebP of 5,000 x 5,000: refused (413) from its header, in the server
    process, before any canvas is allocated."""
    server = Server([str(work / "ck"), "--max-decode-memory", "100000000"])
    try:
        data = webp_image(5000, animated=True)
        status, body = call(server.port, "/v1/classify", data, {"Content-Type": "image/webp"})
        assert status == 413, body
        assert "--max-decode-memory" in json.loads(body)["error"]
    finally:
        server.stop()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc (Linux)")
def test_the_decode_processes_never_load_pytorch() -> None:
    """The fork server and each decode process forked from it decode with Pillow and NumPy:
    after a decode, neither has PyTorch's library mapped (it held 200 MB of memory of its own
    in each)."""
    transform, limits = PilEvalTransform(16, 3), Limits()
    data = png(300)
    _, need = open_checked(data, transform, 3, limits, "the image", pillow=False)
    pool = DecodeProcesses(1)
    try:
        job = (transform, 3, limits, "the image", granted(need, 10**9))
        got = pool.decode(job, data, time.monotonic() + 60, "the image")
        img = Image.open(io.BytesIO(data))
        assert np.array_equal(got, transform.array(img))
        child = pool._idle[0].process.pid
        stat = Path(f"/proc/{child}/stat").read_text()
        fork_server = int(stat.rsplit(")", 1)[1].split()[1])  # (its parent)
        for pid in (child, fork_server):
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "libpython" in maps or "python" in maps  # (its maps were read)
            assert "libtorch" not in maps, f"process {pid} has PyTorch's library mapped"
    finally:
        pool.close()
