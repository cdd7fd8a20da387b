"""(part of serve_load.py and serve_stacks.py) A load generator for localhost HTTP servers:
clients on keep-alive connections, each sending its next request when the last is answered,
for a fixed time or count; latencies and statuses recorded. Plus starting a server process and
reading its resident memory."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # seconds, answered 2xx
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # connection failures, wrong answers
    answers: list[Any] = field(default_factory=list)  # the first few 200 answers, parsed
    seconds: float = 0.0

    def count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def summary(self) -> dict[str, Any]:
        lat = np.array(self.latencies) * 1000
        ok = len(self.latencies)

        def pct(q: float) -> float | None:
            return round(float(np.percentile(lat, q)), 2) if ok else None

        return {
            "ok": ok,
            "failed": sum(self.statuses.values()) - self.statuses.get("200", 0) + len(self.errors),
            "statuses": dict(sorted(self.statuses.items())),
            "errors": self.errors[:5],
            "seconds": round(self.seconds, 2),
            "requests_per_s": round(ok / self.seconds, 2) if self.seconds else None,
            "p50_ms": pct(50),
            "p95_ms": pct(95),
            "p99_ms": pct(99),
        }


async def http(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 request on an open connection: (status, body, server keeps it open)."""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    return await read_response(reader)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    status = int(status_line.split()[1])
    length, keep = 0, True
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "connection" and "close" in value.lower():
            keep = False
    return status, await reader.readexactly(length), keep


async def run_clients(
    port: int,
    clients: int,
    seconds: float,
    make_request: Any,
    check: Any = None,
    max_requests: int | None = None,
) -> Tally:
    """``clients`` connections, each sending ``make_request(i) -> (method, path, body,
    headers)`` until ``seconds`` pass (or ``max_requests`` were sent in all); ``check(body)``
    says whether a 200 answer to request ``i`` is right (a wrong one counts as an error)."""
    tally = Tally()
    deadline = time.perf_counter() + seconds
    sent = 0

    async def client(c: int) -> None:
        nonlocal sent
        conn = None
        i = 0
        while time.perf_counter() < deadline and (max_requests is None or sent < max_requests):
            sent += 1
            i += 1
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                rid = c * 1_000_000 + i
                method, path, body, headers = make_request(rid)
                start = time.perf_counter()
                status, answer, keep = await http(*conn, method, path, body, headers)
                took = time.perf_counter() - start
                tally.count(str(status))
                if status == 200:
                    if len(tally.answers) < 4:
                        tally.answers.append(json.loads(answer))
                    if check is None or check(answer, rid):
                        tally.latencies.append(took)
                    else:
                        tally.errors.append(f"wrong answer: {answer[:200]!r}")
                if not keep:
                    conn[1].close()
                    conn = None
            except (OSError, asyncio.IncompleteReadError, ConnectionError, ValueError) as e:
                tally.errors.append(f"{type(e).__name__}: {e}")
                if conn is not None:
                    conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    tally.seconds = time.perf_counter() - start
    return tally


def start_server(args: list[str], env: dict[str, str] | None = None) -> tuple[Any, int]:
    """``python -m vitkit serve ARGS --port 0`` (or another command that prints 'ready:
    http://HOST:PORT/'); returns the process and its port once it listens."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, preexec_fn=os.setsid,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"ready: http://[\d.]+:(\d+)/", line)
        if m:  # keep reading what it prints, so that it never blocks on a full pipe
            proc.output = lines  # type: ignore[attr-defined]
            threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
            return proc, int(m.group(1))
    raise RuntimeError("the server did not start:\n" + "".join(lines[-20:]))


def rss_mb(pid: int, children: bool = False) -> float:
    """Resident memory of a process (and its children) in MB, from /proc."""
    pids = [pid]
    if children:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    total = 0
    for p in pids:
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += int(re.search(r"VmRSS:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    return round(total / 1024, 1)


PROBE = """
import json, socket, sys, time
port, every, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ask = b"GET /health HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n\\r\\n"
took, end = [], time.perf_counter() + seconds
while time.perf_counter() < end:
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(ask)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        ok = answer.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    took.append(time.perf_counter() - start if ok else float("inf"))
    time.sleep(every)
print(json.dumps(took))
"""


class HealthProbe:
    """/health asked every ``every`` seconds on a fresh connection from a process of its own
    (as a kubelet probes), for ``seconds``: its latencies are the server's, not the wait of a
    load generator's own busy event loop."""

    def __init__(self, port: int, seconds: float, every: float = 0.05):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(port), str(every), str(seconds)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def latencies(self) -> list[float]:
        """Seconds of each probe (inf: not answered 200), once its time is over."""
        out, _ = self.proc.communicate(timeout=120)
        return [float(x) for x in json.loads(out)]
