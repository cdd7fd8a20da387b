"""``vitkit serve --workers N``: N processes, each with its own model, threads and batcher,
sharing one listening socket (bound here, before any worker starts; the kernel hands each
connection to one worker).

The supervising process loads no model. It starts the workers, says ``ready:`` once every one
listens, and health-checks each: a worker sends a heartbeat from its event loop every second,
so a worker that died or whose event loop stalls for :data:`STALL_S` seconds is noticed. Such a
worker is killed and started again (the others keep serving meanwhile); a worker that fails
before it listens (at start or after a restart) stops the server loudly: every worker is
stopped and the command exits 1 naming it. SIGTERM or Ctrl-C is passed to every worker, which
drains as one server does (``--drain-timeout``); a worker still running :data:`STOP_MARGIN_S`
after that is killed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from vitkit.errors import VitkitError
from vitkit.serve.prometheus import retire

STALL_S = 30.0  # a worker whose event loop sends no heartbeat for this long is restarted
HEARTBEAT_S = 1.0
# A worker still running this long after --drain-timeout is killed: the whole server stops
# within --drain-timeout + this (docker stop waits 10 s: --drain-timeout 8 fits any --workers)
STOP_MARGIN_S = 1.0


def http_url(host: str, port: int) -> str:
    """``http://HOST:PORT``, an IPv6 address in brackets (``http://[::]:8000``, RFC 3986)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every worker accepts on (port 0: any free one)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        raise VitkitError(f"could not listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


class Worker:
    def __init__(self, index: int, args: argparse.Namespace, sock: socket.socket, serve: Any):
        self.index = index
        ctx = multiprocessing.get_context("spawn")  # (a fresh interpreter: no forked threads)
        self.conn, child = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_worker_main,
            args=(index, args, sock, child, serve),
            name=f"vitkit-worker-{index}",
        )
        self.process.start()
        child.close()
        self.ready = False
        self.last_beat = time.monotonic()

    def poll(self) -> None:
        try:
            while self.conn.poll():
                if self.conn.recv() == "ready":
                    self.ready = True
                self.last_beat = time.monotonic()
        except (EOFError, OSError):  # it exited: is_alive says so
            pass

    def stalled(self) -> bool:
        return self.ready and time.monotonic() - self.last_beat > STALL_S


def supervise(args: argparse.Namespace, serve: Callable[[argparse.Namespace], int]) -> int:
    """Run ``args.workers`` workers, each ``serve(args)`` (``vitkit serve``'s command, on the
    shared socket: ``args.worker``), until SIGTERM or Ctrl-C."""
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    # where each worker publishes its counters: /metrics answers their sum, whichever answers
    try:
        args.metrics_dir = tempfile.mkdtemp(prefix="vitkit-metrics-")
    except OSError as e:
        sock.close()
        raise VitkitError(
            f"--workers: could not make the directory where the workers sum their /metrics "
            f"under {tempfile.gettempdir()}: {e.strerror or e} (TMPDIR names another)"
        ) from None
    threads = args.threads or max(1, cpus() // args.workers)
    print(f"starting {args.workers} workers, {threads} threads each", flush=True)
    stopping: list[int] = []
    previous = {
        s: signal.signal(s, lambda sig, _: stopping.append(sig))
        for s in (signal.SIGTERM, signal.SIGINT)
    }
    workers = [Worker(i + 1, args, sock, serve) for i in range(args.workers)]
    announced = False
    try:
        while not stopping:
            time.sleep(0.2)
            for w in workers:
                w.poll()
            for i, w in enumerate(workers):
                dead = not w.process.is_alive()
                if not dead and not w.stalled():
                    continue
                if not w.ready:
                    raise VitkitError(
                        f"worker {w.index} exited with code {w.process.exitcode} before it "
                        "listened: stopping every worker"
                    )
                why = f"exited with code {w.process.exitcode}" if dead else (
                    f"sent no heartbeat for {STALL_S:g} s")  # fmt: skip
                print(f"vitkit: worker {w.index} {why}: starting it again", file=sys.stderr,
                      flush=True)  # fmt: skip
                w.process.kill()
                w.process.join()
                if w.process.pid is not None:  # its counters stay in the sum; gauges go
                    retire(args.metrics_dir, w.process.pid)
                workers[i] = Worker(w.index, args, sock, serve)
            if not announced and all(w.ready for w in workers):
                announced = True
                print(f"ready: {http_url(host, port)}/", flush=True)
    except BaseException:
        _stop(workers, args.drain_timeout)
        shutil.rmtree(args.metrics_dir, ignore_errors=True)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sock.close()
    codes = _stop(workers, args.drain_timeout)
    shutil.rmtree(args.metrics_dir, ignore_errors=True)
    print(f"stopped: {len(workers)} workers, exit codes {codes}", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


def _stop(workers: list[Worker], drain_timeout: float) -> list[int | None]:
    for w in workers:
        if w.process.is_alive() and w.process.pid is not None:
            os.kill(w.process.pid, signal.SIGTERM)
    until = time.monotonic() + drain_timeout + STOP_MARGIN_S
    for w in workers:
        w.process.join(max(until - time.monotonic(), 0))
        if w.process.is_alive():
            w.process.kill()
            w.process.join()
    return [w.process.exitcode for w in workers]


def _worker_main(
    index: int, args: argparse.Namespace, sock: socket.socket, conn: Any, serve: Any
) -> None:
    """A worker: ``vitkit serve`` on the shared socket, its threads its share of the CPUs (the
    environment the CLI set up, allocator and OpenMP, is inherited)."""
    if args.threads is None:
        args.threads = max(1, cpus() // args.workers)
    args.worker = (index, sock, conn)
    try:
        code = serve(args)
    except VitkitError as e:
        print(f"vitkit: worker {index}: {e}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.exit(code)
