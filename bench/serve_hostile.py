"""(part of serve_load.py) Hostile requests against `vitkit serve`, and a run of them beside
good clients: every hostile request must be refused fast, the server's memory stay near idle,
/health answer throughout and the good clients see no failure.

:func:`hostile_requests` yields ``(name, method, path, headers, body)``: ``headers`` a list of
(name, value) pairs (a request may repeat a name); :data:`EXPECTED` the statuses each may get.
:func:`run` fires them, a few slow (slowloris) connections and a /health probe beside 8 good
clients. Alone, on the MNIST model:

    python bench/serve_hostile.py --seconds 20
    python bench/serve_hostile.py --alone          # each case alone: time, /health, memory
    python bench/serve_hostile.py --decode-bombs --seconds 60 --serve-args "--timeout 5"
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
from serve_http import HealthProbe, read_response, rss_mb, run_clients, start_server  # noqa: E402
from serve_reports import write_bombs, write_hostile  # noqa: E402

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


def scan_bomb(side: int, scans: int) -> bytes:
    """A progressive JPEG of ``side`` x ``side`` flat pixels whose smallest scan after the
    first is repeated ``scans`` times: each repeat costs the decoder a pass over every block
    (a 1,000 x 1,000 one of 2,000 scans: 30 KB, 4.5 s of decode on an EPYC core)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (120, 80, 40)).save(
        buf, format="JPEG", quality=90, progressive=True
    )
    data = buf.getvalue()
    starts = [i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xDA]
    end = data.rfind(b"\xff\xd9")
    a, b = min(zip(starts[1:], [*starts[2:], end]), key=lambda ab: ab[1] - ab[0])
    return data[:end] + data[a:b] * scans + data[end:]


def webp_image(side: int, *, animated: bool = False, lossy: bool = False) -> bytes:
    """A flat ``side`` x ``side`` WebP: lossless (a few hundred bytes at 5,000 x 5,000),
    lossy, or animated (two frames)."""
    from PIL import Image

    buf = io.BytesIO()
    first = Image.new("RGB", (side, side), (10, 200, 30))
    more = [Image.new("RGB", (side, side), (200, 0, 0))] if animated else []
    first.save(buf, format="WEBP", lossless=not lossy, save_all=animated, append_images=more)
    return buf.getvalue()


def deflate_tiff(side: int) -> bytes:
    """A flat ``side`` x ``side`` RGB TIFF, deflate-compressed (40 KB at 3,000 x 3,000)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (1, 2, 3)).save(
        buf, format="TIFF", compression="tiff_adobe_deflate"
    )
    return buf.getvalue()


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
    and again), 4 slowloris connections are opened and /health is asked every 50 ms, from a
    process of its own (:class:`HealthProbe`) and from the clients' event loop (its figure
    includes that loop's own waits); the server's resident memory sampled every 20 ms."""
    requests = list(hostile_requests())
    memory = PeakRss(server_pid)
    probe = HealthProbe(port, seconds)

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
    probed = probe.latencies()

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
        "health_probes": len(probed),
        "health_p50_ms": ms(probed, 50),
        "health_p99_ms": ms(probed, 99),
        "health_max_ms": ms(probed, 100),
        "health_in_client_p99_ms": ms(got["health"], 99),
        "health_in_client_max_ms": ms(got["health"], 100),
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


def tree_pss_mb(pid: int) -> float:
    """Proportional set size of ``pid`` and every descendant, summed (MB): a page that forked
    processes share counts once across them (/proc/PID/smaps_rollup)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # (it exited meanwhile)
            continue
    return round(total, 1)


def decode_bombs(
    port: int, server_pid: int, timeout: float, seconds: float, good_request: Any
) -> dict[str, Any]:
    """Each decode-bomb case as 4 concurrent requests, one case after another, under 8 good
    clients for ``seconds`` and a /health probe every 50 ms; the process tree's PSS sampled
    every 50 ms. Every bomb must be refused or answered within ``timeout`` + 1 s."""
    jpeg = [("Content-Type", "image/jpeg")]
    cases = [
        ("scan bomb 5,000 x 5,000 px, 5,000 scans", jpeg, scan_bomb(5000, 5000)),
        ("scan bomb 5,000 x 5,000 px, 40,000 scans", jpeg, scan_bomb(5000, 40000)),
        ("lossless WebP 5,000 x 5,000 px", [("Content-Type", "image/webp")], webp_image(5000)),
        ("animated WebP 5,000 x 5,000 px", [("Content-Type", "image/webp")],
         webp_image(5000, animated=True)),
        ("deflate TIFF 5,000 x 5,000 px", [("Content-Type", "image/tiff")], deflate_tiff(5000)),
        ("16-bit PNG 5,000 x 5,000 px", [("Content-Type", "image/png")],
         _png(5000, 5000, "I;16")),
    ]  # fmt: skip
    idle = tree_pss_mb(server_pid)
    peak = [idle]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_pss_mb(server_pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    own = HealthProbe(port, seconds)  # (from a process of its own, as a kubelet probes)

    async def main() -> dict[str, Any]:
        health: list[float] = []
        results: list[dict[str, Any]] = []
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                status, took = await fire(port, encode("GET", "/health", [], b""))
                health.append(took if status == 200 else float("inf"))
                await asyncio.sleep(0.05)

        async def bombs() -> None:
            for name, headers, body in cases:
                request = encode("POST", "/v1/classify", headers, body)
                got = await asyncio.gather(*(fire(port, request) for _ in range(4)))
                results.append({
                    "case": name, "bytes": len(body),
                    "statuses": sorted({s for s, _ in got}),
                    "max_s": round(max(t for _, t in got), 2),
                    "within_timeout_plus_1s": all(t <= timeout + 1 for _, t in got),
                })  # fmt: skip
            stop.set()

        good, *_ = await asyncio.gather(
            run_clients(port, 8, seconds, good_request, None), probe(), bombs()
        )
        return {"good": good, "health": health, "cases": results}

    got = asyncio.run(main())
    done.set()
    sampler.join()
    import numpy as np

    health = np.array(got["health"]) * 1000
    probed = np.array(own.latencies()) * 1000
    return {
        "cases": got["cases"],
        "good_clients": got["good"].summary(),
        "health_p99_ms": round(float(np.percentile(probed, 99)), 1),
        "health_max_ms": round(float(probed.max()), 1),
        "health_in_client_p99_ms": round(float(np.percentile(health, 99)), 1),
        "tree_pss_idle_mb": idle,
        "tree_pss_peak_mb": peak[0],
        "tree_pss_growth_mb": round(peak[0] - idle, 1),
    }


def _serve_bombs(args: Any, src: str | None, extra: str = "") -> dict[str, Any]:
    from bench_models import mnist_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = mnist_checkpoint(Path(tmp) / "mnist")
        proc, port = start_server(
            ["-m", "vitkit", "serve", str(ckpt), "--port", "0", "--timeout", "5",
             *args.serve_args.split(), *extra.split()],
            env={"PYTHONPATH": src} if src else None,
        )  # fmt: skip
        try:
            good = _png(28, 28, "L")
            request = ("POST", "/v1/classify", good, {"Content-Type": "image/png"})
            return decode_bombs(port, proc.pid, 5.0, args.seconds, lambda _: request)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _serve_hostile(args: Any, extra: str) -> dict[str, Any]:
    from bench_models import mnist_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = mnist_checkpoint(Path(tmp) / "mnist")
        argv = ["-m", "vitkit", "serve", str(ckpt), "--port", "0", *args.serve_args.split()]
        proc, port = start_server(
            argv + extra.split(), env={"PYTHONPATH": args.src} if args.src else None
        )
        try:
            request = ("POST", "/v1/classify", _png(28, 28, "L"), {"Content-Type": "image/png"})
            got = run(port=port, seconds=args.seconds, good_request=lambda _: request,
                      check=None, server_pid=proc.pid)  # fmt: skip
            return {"serve_args": " ".join([*args.serve_args.split(), *extra.split()]), **got}
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _main() -> None:
    from bench_models import mnist_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--serve-args", default="", help="more `vitkit serve` options")
    ap.add_argument("--src", default=None, help="the vitkit sources to serve (default: ../src)")
    ap.add_argument("--alone", action="store_true", help="the cases of alone() instead")
    ap.add_argument("--no-strips", action="store_true", help="with --alone: not the strips")
    ap.add_argument(
        "--decode-bombs",
        action="store_true",
        help="the decode bombs of decode_bombs() under 8 good clients (serve with --timeout 5)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="write bench/results/OUT.json and OUT.md: the hostile set (each of --variants), or "
        "with --decode-bombs those (a second run with --baseline-src beside it as the code "
        "before)",
    )
    ap.add_argument("--baseline-src", default=None, help="with --out: the code before, to compare")
    ap.add_argument(
        "--variants", default="one process=",
        help="with --out (the hostile set or --decode-bombs): 'NAME=SERVE ARGS;...', each "
        "served and measured",
    )  # fmt: skip
    args = ap.parse_args()
    if args.out and not (args.decode_bombs or args.alone):
        pairs = [v.partition("=") for v in args.variants.split(";") if v.strip()]
        write_hostile(args, {n.strip(): _serve_hostile(args, extra) for n, _, extra in pairs})
        return
    if args.decode_bombs and args.out:
        pairs = [v.partition("=") for v in args.variants.split(";") if v.strip()]
        runs = {n.strip(): _serve_bombs(args, args.src, extra) for n, _, extra in pairs}
        if args.baseline_src:
            runs["the code before"] = _serve_bombs(args, args.baseline_src)
        write_bombs(args, runs)
        return
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
                decode_bombs(port, proc.pid, 5.0, args.seconds, lambda _: request)
                if args.decode_bombs
                else alone(port, proc.pid, not args.no_strips)
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
