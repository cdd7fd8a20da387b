"""Decoding in processes the server can kill: a bound the OS enforces, in memory and in time.

A header tells how much memory a decode should take (:func:`vitkit.serve.decode.decode_bytes`)
and nothing of how long it runs: a progressive JPEG whose scans repeat thousands of times
decodes for minutes from a few kilobytes, and a decoder may hold more than any estimate (Pillow's
WebP decoder about three times the image). So every image the event loop does not decode itself
(:func:`inline`) decodes in a decode process:

- **Memory**: before each decode the process lowers its own ``RLIMIT_DATA`` to what it holds
  now plus its grant: the header's estimate with half again and :data:`SLACK` beside, taken
  from ``--max-decode-memory`` (:class:`vitkit.serve.decode.DecodeBudget`: the grants of the
  decodes running together never exceed it). ``RLIMIT_DATA`` (Linux 4.7+) counts the private
  writable memory a process maps (its heap, every anonymous ``mmap``: what a decoder
  allocates) and not the shared libraries mapped or the pages shared with the server;
  ``RLIMIT_AS`` would count the whole address space (Python and Pillow's libraries, the
  reservations of each thread's arena), a limit that moves with what is loaded. An allocation
  past it fails: the decoder raises MemoryError (or the process dies), the request gets 413
  naming the limit, and the process is replaced.
- **Time**: a decode ends by its request's deadline (``--timeout`` from its arrival;
  :data:`MAX_DECODE_S` without one), or its process is killed (SIGKILL) and replaced, and the
  request gets 503 naming the limit.
- **Nothing waits behind it**: ``--decode-workers`` processes are started with the server;
  when all are busy another is started for the decode (from the fork server: milliseconds), up
  to :data:`SURGE` times as many, and exits after it. Memory stays within the budget whatever
  their number.

The decoded image comes back as the transformed uint8 [C, H, W] array through the process's
pipe (the model's input size, 150 KB at 224 x 224): never a pickled full-size image.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from vitkit.serve.request_images import (
    INLINE_BYTES,
    INLINE_PIXELS,
    RequestError,
    load_image,
    open_checked,
)

MAX_DECODE_S = 60.0  # a decode's wall-clock limit where the request has no deadline
SLACK = 16_000_000  # bytes granted beside the estimate (the decoder's tables, Python's own)
SURGE = 4  # at most this many times --decode-workers processes decode at once
# a process that holds this much more private memory after a decode than when it started
# is replaced (what a decode left behind is not carried into the next)
GROWTH = 64_000_000


def private_bytes() -> int:
    """The private writable memory this process maps (VmData: what ``RLIMIT_DATA`` counts)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def granted(need: int, memory: int) -> int:
    """The bytes a decode whose header says ``need`` may hold (at most the whole budget)."""
    return min(memory, need + need // 2 + SLACK)


# -- the decode process ------------------------------------------------------------------


def _decode(job: tuple[Any, ...], data: bytes) -> tuple[Any, ...]:
    transform, channels, limits, what, grant = job
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    soft = private_bytes() + grant
    unlimited = hard == resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_DATA, (soft if unlimited else min(soft, hard), hard))
    try:
        img, _ = open_checked(data, transform, channels, limits, what)
        array = transform.array(load_image(img, channels, what))
        del img
        return ("ok", array.shape, array)
    except RequestError as e:
        message = e.message
        if e.status in (400, 415):  # (Pillow's error: an allocation past the limit reads so too)
            mb = grant / 1e6
            message += f" (or it needed more than the {mb:,.0f} MB granted: --max-decode-memory)"
        return ("refused", e.status, message)
    except MemoryError:
        return ("memory",)
    except Exception as e:  # (a decoder's own error: the one line, never a traceback)
        return ("refused", 400, f"{what}: cannot be decoded ({type(e).__name__}: {e})")
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def _child(conn: Any) -> None:
    """A decode process: a job and its bytes in, the transformed array (or why not) out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C stops the server, which stops us)
    from vitkit.engines.allocator import release_freed_memory

    start = private_bytes()
    while True:
        try:
            job = conn.recv()
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the server is gone
            return
        reply = _decode(job, data)
        del data
        release_freed_memory()
        retire = reply[0] == "memory" or private_bytes() > start + GROWTH
        if reply[0] == "ok":
            conn.send(("ok", reply[1], retire))
            conn.send_bytes(reply[2].reshape(-1).data)  # (contiguous: no copy)
        else:
            conn.send((*reply, retire))
        if retire:
            return


# -- the server's side ---------------------------------------------------------------------


def _context() -> Any:
    """The fork server's context: a clean interpreter with the decode modules imported once
    (Pillow and NumPy: never PyTorch, :mod:`vitkit.serve.request_images`), each decode
    process forked from it (milliseconds; its pages shared)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["vitkit.serve.decode_process"])
    return ctx


class _Process:
    def __init__(self, ctx: Any):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_child, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        """SIGKILL; reaped on a thread of its own (the request is answered meanwhile)."""
        if self.process.is_alive():
            self.process.kill()
        self.conn.close()
        threading.Thread(target=self.process.join, args=(30,), daemon=True).start()


class DecodeFailed(Exception):
    """A decode stopped at a limit: the HTTP status, the one line and the limit's name."""

    def __init__(self, status: int, message: str, limit: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.limit = limit


class DecodeProcesses:
    """``workers`` decode processes kept started (up to :data:`SURGE` x as many at once);
    :meth:`decode` runs one image in one of them, within its memory grant and its time."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"decode workers must be at least 1, got {workers}")
        self.workers = workers
        self.most = SURGE * workers
        self._ctx = _context()
        self._idle: list[_Process] = []
        self._busy = 0
        self._cond = threading.Condition()
        self.killed = 0  # processes killed at a limit (time) or lost at one (memory)
        self.threads = ThreadPoolExecutor(self.most, thread_name_prefix="vitkit-decode")
        self._idle = [_Process(self._ctx) for _ in range(workers)]
        weakref.finalize(self, _close, self._idle, self.threads)

    def _take(self, until: float) -> _Process | None:
        with self._cond:
            while not self._idle and self._busy >= self.most:
                left = until - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            self._busy += 1
            if self._idle:
                return self._idle.pop()
        try:
            return _Process(self._ctx)
        except BaseException:
            self._give_back(None)
            raise

    def _give_back(self, proc: _Process | None) -> None:
        with self._cond:
            self._busy -= 1
            if proc is not None and len(self._idle) < self.workers:
                self._idle.append(proc)
                proc = None
            self._cond.notify()
        if proc is not None:  # a surge process: it exits (its pipe closed)
            proc.conn.close()
            proc.process.join(0)

    def decode(
        self,
        job: tuple[Any, ...],
        data: bytes,
        until: float,
        what: str,
        on_killed: Callable[[str], None] | None = None,
    ) -> np.ndarray:
        """``data`` decoded by a decode process (blocking: call it on :attr:`threads`):
        ``job`` = (transform, channels, limits, what, grant); ``until``: the time.monotonic()
        it must end by. Raises :class:`DecodeFailed` at a limit,
        :class:`vitkit.serve.request_images.RequestError` where the image is refused."""
        proc = self._take(until)
        seconds = max(until - time.monotonic(), 0.0)
        if proc is not None and not seconds:  # (its time passed while it waited: none left)
            self._give_back(proc)
            proc = None
        if proc is None:
            raise DecodeFailed(
                503, f"{what}: no decode process came free within the request's time "
                f"(--timeout); retry later", "time")  # fmt: skip
        keep: _Process | None = None
        try:
            proc.conn.send(job)
            proc.conn.send_bytes(data)
            left = until - time.monotonic()
            if left <= 0 or not proc.conn.poll(left):
                self._lost(proc, on_killed, "time")
                late = f"{what}: its decode did not end within the request's {seconds:.1f} s left"
                raise DecodeFailed(503, f"{late} (--timeout): the decode was stopped", "time")
            reply = proc.conn.recv()
            kind, retire = reply[0], reply[-1]
            if kind == "ok":
                shape = reply[1]
                array = np.frombuffer(proc.conn.recv_bytes(), np.uint8).reshape(shape)
            keep = None if retire else proc
            if retire and kind == "memory":
                self._lost(proc, on_killed, "memory")
            elif retire:  # (it exits by itself: what its decodes left behind goes with it)
                proc.kill()
        except (EOFError, OSError):  # it died: an allocation past its limit crashed it
            self._lost(proc, on_killed, "memory")
            kind = "memory"
        finally:
            self._give_back(keep)
        if kind == "refused":
            raise RequestError(reply[1], reply[2])
        if kind == "memory":
            grant = job[-1]
            raise DecodeFailed(
                413, f"{what}: its decode needed more than the {grant / 1e6:,.0f} MB granted "
                "to it (its header's estimate and half again, within --max-decode-memory): "
                "the decode was stopped", "memory")  # fmt: skip
        return array

    def _lost(self, proc: _Process, on_killed: Callable[[str], None] | None, limit: str) -> None:
        proc.kill()
        self.killed += 1
        if on_killed is not None:
            on_killed(limit)

    def close(self) -> None:
        _close(self._idle, self.threads)


def _close(idle: list[_Process], threads: ThreadPoolExecutor) -> None:
    threads.shutdown(wait=False, cancel_futures=True)
    for proc in idle:
        proc.kill()
    idle.clear()


def inline(img: Any, data: bytes) -> bool:
    """Whether the event loop decodes this image itself: a PNG or baseline JPEG of at most
    :data:`~vitkit.serve.request_images.INLINE_BYTES` bytes and
    :data:`~vitkit.serve.request_images.INLINE_PIXELS` pixels, whose decode is bounded by its
    pixels (well under a millisecond: less than the hop to a process)."""
    from vitkit.serve.decode import jpeg_coefficient_bytes

    small = len(data) <= INLINE_BYTES and img.width * img.height <= INLINE_PIXELS
    return small and img.format in ("PNG", "JPEG") and not jpeg_coefficient_bytes(img)


class ImageDecoder:
    """A request image -> the model's uint8 [C, H, W] input, never past the server's bounds:
    small PNGs and JPEGs on the event loop (:func:`inline`), every other image's header on a
    thread and its decode in a decode process, within its share of the
    :class:`~vitkit.serve.decode.DecodeBudget` and its request's deadline."""

    def __init__(self, served: Any, limits: Any, on_killed: Callable[[str], None] | None = None):
        from vitkit.serve.decode import DecodeBudget

        self.served = served
        self.limits = limits
        self.budget = DecodeBudget(limits.max_decode_memory)
        self.processes = DecodeProcesses(limits.decode_workers)
        self.on_killed = on_killed

    async def prepare(self, data: bytes, what: str, until: float | None) -> Any:
        """``data`` decoded and transformed by ``until`` (time.monotonic(); None: within
        :data:`MAX_DECODE_S`). Raises RequestError (refused, or 413 at its memory grant) or
        :class:`vitkit.serve.admission.Dropped` (503: past its deadline)."""
        if until is None:
            until = time.monotonic() + MAX_DECODE_S
        need = None
        if len(data) <= INLINE_BYTES:  # a small body's header is read here
            img, need = self.served.open(data, self.limits, what, self.budget, pillow=False)
            if inline(img, data):
                return self.served.finish(img, need, what, None)
        loop = asyncio.get_running_loop()
        threads = self.processes.threads
        return await loop.run_in_executor(threads, self._decode, data, what, until, need)

    def _decode(self, data: bytes, what: str, until: float, need: int | None) -> Any:
        import torch

        from vitkit.serve.admission import Dropped

        served = self.served
        if need is None:  # its header, every limit checked (413) before the decode
            _, need = served.open(data, self.limits, what, self.budget, pillow=False)
        grant = granted(need, self.budget.limit)
        channels = served.ckpt.preprocess.channels
        job = (served.transform, channels, self.limits, what, grant)
        try:
            with self.budget.hold(grant, until):
                array = self.processes.decode(job, data, until, what, self._killed)
        except TimeoutError:
            raise Dropped(
                "deadline", f"{what}: the decode memory did not come free before the "
                "request's deadline (--timeout, --max-decode-memory); retry later",
            ) from None  # fmt: skip
        except DecodeFailed as e:
            if e.status == 503:
                raise Dropped("decode_time", e.message) from None
            raise RequestError(e.status, e.message) from None
        return torch.from_numpy(array.copy())

    def _killed(self, limit: str) -> None:
        if self.on_killed is not None:
            self.on_killed(limit)

    def close(self) -> None:
        self.processes.close()
