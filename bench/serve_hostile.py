"""(part of serve_load.py) Hostile requests against `vitkit serve`, and a run of them beside
good clients: every hostile request must be refused fast, the server's memory stay near idle,
/health answer throughout and the good clients see no failure.

:func:`hostile_requests` yields ``(name, method, path, headers, body)``: ``headers`` a list of
(name, value) pairs (a request may repeat a name); :data:`EXPECTED` the statuses each may get.
:func:`run` fires them, a few slow (slowloris) connections and a /health probe beside 8 good
clients. Alone, on the MNIST model:

    python bench/serve_hostile.py --seconds 20
    python bench/serve_hostile.py --alone          # each case alone: time, /health, memory
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_http import read_response, rss_mb, run_clients, start_server  # noqa: E402

Request = tuple[str, str, str, list[tuple[str, str]], bytes]

EXPECTED: dict[str, tuple[int, ...]] = {
    "strip 1 x 1,000,000 px PNG": (413,),
    "strip 3,000,000 x 1 px PNG": (413,),
    "bomb header 20,000 x 20,000 px PNG": (413,),
    "5,000 x 5,000 px PNG of 25 KB": (200,),  # (within --max-pixels: decoded, off the loop)
    "one 20 MB header": (431,),
    "100 headers": (431,),
    "body over --max-body": (413,),
    "multipart: 40 fields": (413,),
    "multipart: a part's 20 KB header": (413,),
    "multipart: 17 files": (413,),
    "multipart: a malformed boundary": (400,),
}


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, (width, height)).save(buf, format="PNG", compress_level=9)
    return buf.getvalue()


def _jpeg(width: int, height: int, progressive: bool) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(
        buf, format="JPEG", quality=90, progressive=progressive
    )
    return buf.getvalue()


def _bomb(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels (a few rows of data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (width + 1) * 4)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _form(parts: list[tuple[str, bytes]]) -> tuple[list[tuple[str, str]], bytes]:
    boundary = "b0undary7e3f"
    body = b"".join(
        f"--{boundary}\r\n{head}\r\n\r\n".encode() + data + b"\r\n" for head, data in parts
    )
    body += f"--{boundary}--\r\n".encode()
    return [("Content-Type", f"multipart/form-data; boundary={boundary}")], body


def _file(data: bytes, extra: str = "") -> tuple[str, bytes]:
    head = 'Content-Disposition: form-data; name="image"; filename="x.png"\r\n'
    return head + extra + "Content-Type: image/png", data


def hostile_requests(max_body: int = 20_000_000) -> Iterator[Request]:
    """The hostile requests, one each (see :data:`EXPECTED` for what each should get)."""
    png = [("Content-Type", "image/png")]
    small = _png(28, 28, "L")
    yield "strip 1 x 1,000,000 px PNG", "POST", "/v1/classify", png, _png(1, 1_000_000)
    yield "strip 3,000,000 x 1 px PNG", "POST", "/v1/classify", png, _png(3_000_000, 1)
    yield "bomb header 20,000 x 20,000 px PNG", "POST", "/v1/classify", png, _bomb(20_000, 20_000)
    yield "5,000 x 5,000 px PNG of 25 KB", "POST", "/v1/classify", png, _png(5000, 5000, "L")
    yield "one 20 MB header", "GET", "/health", [("X-Pad", "a" * 20_000_000)], b""
    yield "100 headers", "GET", "/health", [(f"X-H{i}", "1") for i in range(100)], b""
    yield "body over --max-body", "POST", "/v1/classify", png, b"\0" * (max_body + 1)
    fields = [(f'Content-Disposition: form-data; name="f{i}"', b"1") for i in range(40)]
    yield "multipart: 40 fields", "POST", "/v1/classify", *_form([_file(small), *fields])
    big_head = [_file(small, "X-Pad: " + "a" * 20_000 + "\r\n")]
    yield "multipart: a part's 20 KB header", "POST", "/v1/classify", *_form(big_head)
    yield "multipart: 17 files", "POST", "/v1/classify", *_form([_file(small)] * 17)
    headers, body = _form([_file(small)])
    broken = body.replace(b"--", b"-x", 1)
    yield "multipart: a malformed boundary", "POST", "/v1/classify", headers, broken


def encode(method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in headers] + ["Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def fire(port: int, data: bytes) -> tuple[int, float]:
    """Send ``data`` on a fresh connection: the status and the seconds to it (the server may
    answer before it has read everything; 0: the connection was closed without one)."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        try:
            writer.write(data)
            await writer.drain()
        except OSError:
            pass  # (refused and closed while sending)

    sending = asyncio.create_task(send())
    try:
        status, _, _ = await read_response(reader)
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
        status = 0
    took = time.perf_counter() - start
    sending.cancel()
    writer.close()
    return status, took


async def slowloris(port: int, seconds: float) -> dict[str, Any]:
    """A connection that sends a header byte every 0.5 s until the server closes it: how
    long it was held (the server's --read-timeout bounds it) and what it answered."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    answer = b""
    while time.perf_counter() - start < seconds:
        try:
            writer.write(b"a")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(200), 0.5)
            if answer or reader.at_eof():
                break
        except asyncio.TimeoutError:
            continue
        except OSError:
            break
    writer.close()
    return {"held_s": round(time.perf_counter() - start, 2), "answer": answer[:12].decode()}


class PeakRss:
    """The server's resident memory now and its peak until :meth:`stop` (sampled every 20 ms)."""

    def __init__(self, pid: int):
        self.pid, self.idle = pid, rss_mb(pid)
        self.peak = self.idle
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def stop(self) -> tuple[float, float]:
        self.done.set()
        self.thread.join()
        return self.idle, round(self.peak, 1)


def run(
    *, port: int, seconds: float, good_request: Any, check: Any, server_pid: int
) -> dict[str, Any]:
    """8 good clients for ``seconds`` while every hostile request is fired in turn (again
    and again), 4 slowloris connections are opened and /health is asked every 50 ms; the
    server's resident memory sampled every 20 ms."""
    requests = list(hostile_requests())
    memory = PeakRss(server_pid)

    async def main() -> dict[str, Any]:
        stop_at = time.perf_counter() + seconds
        refusals: dict[str, list[float]] = {name: [] for name, *_ in requests}
        statuses: dict[str, dict[str, int]] = {name: {} for name, *_ in requests}
        health: list[float] = []

        async def hostile() -> None:
            while time.perf_counter() < stop_at:
                for name, method, path, headers, body in requests:
                    status, took = await fire(port, encode(method, path, headers, body))
                    statuses[name][str(status)] = statuses[name].get(str(status), 0) + 1
                    refusals[name].append(took)

        async def probe() -> None:
            while time.perf_counter() < stop_at:
                status, took = await fire(port, encode("GET", "/health", [], b""))
                health.append(took if status == 200 else float("inf"))
                await asyncio.sleep(0.05)

        good, _, _, *slow = await asyncio.gather(
            run_clients(port, 8, seconds, good_request, check),
            hostile(),
            probe(),
            *(slowloris(port, seconds) for _ in range(4)),
        )
        return {"good": good, "refusals": refusals, "statuses": statuses, "health": health,
                "slowloris": slow}  # fmt: skip

    got = asyncio.run(main())
    idle, peak = memory.stop()

    def ms(values: list[float], q: float) -> float | None:
        import numpy as np

        return round(float(np.percentile(np.array(values) * 1000, q)), 1) if values else None

    per_request = {
        name: {
            "expected": list(EXPECTED[name]),
            "statuses": got["statuses"][name],
            "as_expected": set(got["statuses"][name]) <= {str(s) for s in EXPECTED[name]},
            "p50_ms": ms(got["refusals"][name], 50),
            "p99_ms": ms(got["refusals"][name], 99),
        }
        for name in got["refusals"]
    }
    return {
        "good_clients": got["good"].summary(),
        "hostile": per_request,
        "health_p99_ms": ms(got["health"], 99),
        "health_max_ms": ms(got["health"], 100),
        "slowloris": got["slowloris"],
        "rss_idle_mb": idle,
        "rss_peak_mb": peak,
        "rss_growth_mb": round(peak - idle, 1),
    }


def alone(port: int, server_pid: int, strips: bool = True) -> list[dict[str, Any]]:
    """Cases sent alone, each while /health is asked every 50 ms: the two strips, 8 concurrent
    5,000 x 5,000 PNGs, 12 concurrent forms of 16 such PNGs, 4 concurrent 16-bit PNGs and 4
    progressive JPEGs of that size; statuses, seconds, the worst /health, the server's memory
    before and at its peak."""
    big = _png(5000, 5000, "L")
    headers, form = _form([_file(big)] * 16)
    png = [("Content-Type", "image/png")]
    form_req = encode("POST", "/v1/classify", headers, form)
    cases = [
        ("1 x 1,000,000 px PNG", [encode("POST", "/v1/classify", png, _png(1, 1_000_000))]),
        ("3,000,000 x 1 px PNG", [encode("POST", "/v1/classify", png, _png(3_000_000, 1))]),
        ("8 concurrent 5,000 x 5,000 px PNGs", [encode("POST", "/v1/classify", png, big)] * 8),
        ("12 concurrent forms of 16 such PNGs", [form_req] * 12),
        ("4 concurrent 16-bit 5,000 x 5,000 px PNGs",
         [encode("POST", "/v1/classify", png, _png(5000, 5000, "I;16"))] * 4),
        ("4 concurrent progressive 5,000 x 5,000 px JPEGs",
         [encode("POST", "/v1/classify", [("Content-Type", "image/jpeg")],
                 _jpeg(5000, 5000, progressive=True))] * 4),
    ][0 if strips else 2 :]  # fmt: skip
    out = []
    for name, requests in cases:
        memory = PeakRss(server_pid)

        async def main(requests: list[bytes]) -> tuple[list[int], float, float]:
            start, worst = time.perf_counter(), 0.0
            sent = asyncio.gather(*(fire(port, r) for r in requests))
            while not sent.done():
                status, took = await fire(port, encode("GET", "/health", [], b""))
                worst = max(worst, took if status == 200 else float("inf"))
                await asyncio.sleep(0.05)
            return [s for s, _ in await sent], time.perf_counter() - start, worst

        statuses, seconds, worst = asyncio.run(main(requests))
        idle, peak = memory.stop()
        out.append({"case": name, "statuses": sorted(set(statuses)), "seconds": round(seconds, 2),
                    "health_worst_ms": round(worst * 1000, 1), "rss_before_mb": idle,
                    "rss_peak_mb": peak})  # fmt: skip
    return out


def _main() -> None:
    from bench_models import mnist_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--serve-args", default="", help="more `vitkit serve` options")
    ap.add_argument("--src", default=None, help="the vitkit sources to serve (default: ../src)")
    ap.add_argument("--alone", action="store_true", help="the cases of alone() instead")
    ap.add_argument("--no-strips", action="store_true", help="with --alone: not the strips")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = mnist_checkpoint(Path(tmp) / "mnist")
        proc, port = start_server(
            ["-m", "vitkit", "serve", str(ckpt), "--port", "0", *args.serve_args.split()],
            env={"PYTHONPATH": args.src} if args.src else None,
        )
        try:
            good = _png(28, 28, "L")
            request = ("POST", "/v1/classify", good, {"Content-Type": "image/png"})
            out: Any = (
                alone(port, proc.pid, not args.no_strips)
                if args.alone
                else run(port=port, seconds=args.seconds, good_request=lambda _: request,
                         check=None, server_pid=proc.pid)
            )  # fmt: skip
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    _main()
