"""``vitkit serve --workers N``: one front process and N model processes.

The front owns the listening socket and everything a request meets before and after its
forward: HTTP, the API key and limits, admission, the decode processes, the batcher, the
answers and the one set of /metrics counters. The forwards run in N model processes
(:mod:`vitkit.serve.model_process`), each with the model loaded and its share of the CPUs.

The model processes pull: the next batch gathers only while a process is free and goes to a
free one (the one freed last, its caches warm), so work goes where there is room to run it
and, under load, every process takes the next batch as soon as it is free (balance by
construction). The batch's images cross to it through shared memory, not pickles; the front's
event loop only copies them there and waits on the pipe (``add_reader``), so /health and every
other request are answered while forwards run.

A model process that dies (SIGKILL, the OOM killer, a crash in native code) is noticed by its
pipe closing: its batch goes back to the head of the queue, taken by the next free process,
and the process is started again. A batch whose process died twice (an input that kills the
model, say) is not tried a third time: each of its requests is answered 500 naming what
killed the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from vitkit.errors import VitkitError
from vitkit.serve.batcher import Batcher, _Item
from vitkit.serve.model_process import model_main
from vitkit.serve.served_model import RequestError

# A model process that dies while starting again is started once more after this many seconds.
RESTART_PAUSE_S = 1.0
# Tries a batch gets: a batch whose model process died this many times is answered 500.
MAX_TRIES = 2
# A forward that has not answered after this many seconds plus 4 times the forwards' average
# for its size is taken for a stalled process: it is killed and its batch put back.
STALL_S = 30.0


class ProcessDied(Exception):
    """A model process's pipe closed: it died (the message says how)."""


class ModelCrashed(RequestError):
    """Answered 500: the model processes running this request's batch died ``MAX_TRIES``
    times."""

    def __init__(self, how: str):
        super().__init__(
            500,
            f"the model process running this request's batch {how}, {MAX_TRIES} times: the "
            "batch is not tried again (an image in it may crash the model)",
        )


def how_it_ended(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ModelProcess:
    """One model process, its pipe and its shared input and output tensors (kept across
    restarts)."""

    def __init__(self, index: int, args: Any, load: Callable[[Any], Any], shapes: Any):
        self.index = index
        self.args = args
        self.load = load
        (c, h, w), classes = shapes
        self.inputs = torch.empty(args.max_batch, c, h, w, dtype=torch.uint8).share_memory_()
        self.outputs = torch.empty(args.max_batch, classes).share_memory_()
        self.ready = False
        self.pid: int | None = None
        self.forwards = 0  # batches this process answered (one of every process since start)
        self.images = 0
        self.restarts = 0
        self.stalled = ""  # how a process killed as stalled ended (said instead of the signal)
        self.start()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # (a fresh interpreter: no forked threads)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=model_main,
            args=(self.index, self.args, self.load, child, self.inputs, self.outputs),
            name=f"vitkit-model-{self.index}",
        )
        self.process.start()
        child.close()
        self.ready, self.stalled = False, ""

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until it says ready (at start, before the front listens)."""
        if not self.conn.poll(timeout):
            raise VitkitError(f"model process {self.index} did not start in {timeout:g} s")
        self._ready(self._recv())

    def _recv(self) -> Any:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise ProcessDied(how_it_ended(self.process.exitcode)) from None

    def _ready(self, message: Any) -> None:
        if message[0] != "ready":
            self.process.join(5)
            raise VitkitError(f"model process {self.index} could not start: {message[1]}")
        self.pid, self.ready = message[1], True
        print(f"model process {self.index} ready (pid {self.pid})", flush=True)

    async def receive(self) -> Any:
        """The next message, without blocking the event loop (ProcessDied: the pipe closed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        fd = self.conn.fileno()

        def readable() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(fd)
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            await loop.run_in_executor(None, self.process.join, 5)
            raise ProcessDied(self.stalled or how_it_ended(self.process.exitcode)) from None

    async def forward(self, values: Sequence[Any]) -> Any:
        """Class probabilities of ``values`` (uint8 [C, H, W] each), run in the process."""
        n = len(values)
        message: Any = n
        if all(v.shape == self.inputs.shape[1:] for v in values):
            torch.stack(list(values), out=self.inputs[:n])
        else:  # images of their own sizes (NaFlex): each at the start of its row, and its shape
            for row, v in zip(self.inputs, values):
                row.view(-1)[: v.numel()] = v.reshape(-1)
            message = (n, [tuple(v.shape) for v in values])
        try:
            self.conn.send(message)
        except OSError:
            await asyncio.get_running_loop().run_in_executor(None, self.process.join, 5)
            raise ProcessDied(how_it_ended(self.process.exitcode)) from None
        message = await self.receive()
        if message[0] == "error":
            raise RuntimeError(message[1])
        self.forwards += 1
        self.images += n
        return self.outputs[:n].clone()

    async def restart(self) -> None:
        """Started again, until it says ready (pausing between tries that fail)."""
        self.restarts += 1
        while True:
            self.start()
            try:
                self._ready(await self.receive())
                return
            except (ProcessDied, VitkitError) as e:
                print(f"vitkit: model process {self.index} could not start again: {e}",
                      file=sys.stderr, flush=True)  # fmt: skip
            await asyncio.sleep(RESTART_PAUSE_S)

    def stop(self, until: float) -> bool:
        """Closed (it exits once its forward ends), killed where it still runs at ``until``
        (time.monotonic()); whether it ended by itself."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.conn.close()
        self.process.join(max(until - time.monotonic(), 0))
        ended = not self.process.is_alive()
        if not ended:
            self.process.kill()
            self.process.join()
        return ended


class ModelPool:
    """The N model processes, started and ready (blocking) before the front listens."""

    def __init__(self, args: Any, load: Callable[[Any], Any], shapes: Any, count: int):
        self.processes: list[ModelProcess] = []
        try:
            for i in range(count):
                self.processes.append(ModelProcess(i + 1, args, load, shapes))
            for p in self.processes:
                p.wait_ready(None)
        except BaseException:
            self.stop(time.monotonic())
            raise

    def stop(self, until: float) -> bool:
        return all([p.stop(until) for p in self.processes])

    def stats(self) -> list[dict[str, Any]]:
        return [
            {"process": p.index, "pid": p.pid, "forwards": p.forwards, "images": p.images,
             "restarts": p.restarts}
            for p in self.processes
        ]  # fmt: skip


class FrontBatcher(Batcher):
    """The batcher of the front: one queue; the next batch gathers only while a model process
    is free and goes to the one freed last (its caches warm: under light load one process
    does the work, under load each process takes the next batch as soon as it is free); a
    dead process's batch is put back at the head of the queue once. ``on_restart(process,
    how)`` hears of every process that died."""

    def __init__(
        self,
        pool: ModelPool,
        run: Any = None,
        *,
        on_restart: Callable[[int, str], None] | None = None,
        **kw: Any,
    ):
        super().__init__(run, **kw)  # (run: never called, the forwards run in ``pool``)
        self.pool = pool
        self.on_restart = on_restart
        self._free: list[ModelProcess] = []  # ready and idle, the one freed last at the end
        self._freed: asyncio.Event | None = None
        self._ends: dict[int, float] = {}  # process -> time.monotonic() its forward should end
        self._forwards: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._arrived, self._freed = asyncio.Event(), asyncio.Event()
        self._free = self.pool.processes[::-1]  # (process 1 takes the first batch)
        self._task = asyncio.get_running_loop().create_task(self._dispatch())

    def expected_wait(self, images: int) -> float:
        now = time.monotonic()
        ready = sum(p.ready for p in self.pool.processes)
        first = 0.0 if self._free or not self._ends else max(min(self._ends.values()) - now, 0)
        share = self.times.drain(self.depth + images, self.max_batch) / max(ready, 1)
        return first + share

    async def stop(self) -> bool:
        wait_s = 0.0 if self.drain_ends is None else max(self.drain_ends + 1 - time.monotonic(), 0)
        tasks = [t for t in (self._task, *self._forwards) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.executor.shutdown(wait=False)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.pool.stop, time.monotonic() + wait_s)

    async def _dispatch(self) -> None:
        assert self._freed is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._free:  # (gathering waits: the batch fills meanwhile)
                self._freed.clear()
                await self._freed.wait()
            batch = await self._next_batch()
            if batch:
                task = loop.create_task(self._forward(self._free.pop(), batch))
                self._forwards.add(task)
                task.add_done_callback(self._forwards.discard)

    async def _forward(self, proc: ModelProcess, batch: list[_Item]) -> None:
        assert self._freed is not None
        start = time.perf_counter()
        self._ends[proc.index] = time.monotonic() + self.times.forward(len(batch))
        self._running.extend(batch)
        died, outputs = None, None
        limit = STALL_S + 4 * self.times.forward(len(batch))
        watch = asyncio.get_running_loop().call_later(limit, self._stalled, proc, limit)
        try:
            outputs = await proc.forward([i.value for i in batch])
        except ProcessDied as e:
            died = str(e)
        except Exception as e:  # the forward failed: every request in it hears why
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(e)
        finally:
            watch.cancel()
            self._ends.pop(proc.index, None)
            self._running = [i for i in self._running if i not in batch]
        if died is not None:
            self._put_back(batch, died)
            print(f"vitkit: model process {proc.index} (pid {proc.pid}) {died} during a "
                  f"forward of {len(batch)} images: they go to the next free model "
                  "process; starting it again", file=sys.stderr, flush=True)  # fmt: skip
            if self.on_restart is not None:
                self.on_restart(proc.index, died)
            await proc.restart()
        elif outputs is not None:
            seconds = time.perf_counter() - start
            self._answer(batch, outputs, seconds)
        self._free.append(proc)
        self._freed.set()

    @staticmethod
    def _stalled(proc: ModelProcess, limit: float) -> None:
        """A forward past its limit: the process is killed (its pipe closes: the batch is put
        back as a dead process's is)."""
        proc.stalled = f"gave no answer in {limit:.0f} s and was killed"
        proc.process.kill()

    def _put_back(self, batch: list[_Item], how: str) -> None:
        """A dead process's batch: at the head of the queue again (in order), or answered 500
        where this was its last try."""
        again = []
        loop = asyncio.get_running_loop()
        for item in batch:
            if item.future.done():
                continue
            item.tries += 1
            if item.tries >= MAX_TRIES:
                item.future.set_exception(ModelCrashed(how))
                continue
            item.started = False
            if item.deadline < math.inf:
                item.expiry = loop.call_later(item.deadline - time.monotonic(), self._expire, item)
            again.append(item)
        self._waiting.extendleft(reversed(again))
        if again and self._arrived is not None:
            self._arrived.set()
