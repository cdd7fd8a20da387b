"""``vitkit serve --workers N``: one front process and N model processes.

The front owns the listening socket and everything a request meets before and after its
forward: HTTP, the API key and limits, admission, the decode processes, the batcher, the
answers and the one set of /metrics counters. It holds no weights: the forwards and the
explanations (/v1/explain) run in N model processes (:mod:`vitkit.serve.model_process`), each
with the model loaded and its share of the CPUs. The first loads alone and decides what the
others load (``--precision auto`` measured once); the front keeps what it tells about the
model without its weights (preprocessing, labels, engine, precision).

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
killed the process. A process that cannot start again is tried after 1, 2, 4, ... seconds (at
most :data:`RESTART_PAUSE_MAX_S`); after :data:`MAX_FAILED_STARTS` failed starts in a row its
slot is given up (one line in the log, ``vitkit_model_process_given_up`` in /metrics, its state
in /v1/info) and the others serve. While no process can serve, /ready answers 503; once none
ever will, every request is answered 503 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
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

# A model process that fails to start again is started once more after this many seconds,
# twice as long after each failure up to RESTART_PAUSE_MAX_S, and given up after
# MAX_FAILED_STARTS failures in a row.
RESTART_PAUSE_S = 1.0
RESTART_PAUSE_MAX_S = 30.0
MAX_FAILED_STARTS = 5
# Tries a batch gets: a batch whose model process died this many times is answered 500.
MAX_TRIES = 2
# A forward that has not answered after this many seconds plus 4 times the forwards' average
# for its size is taken for a stalled process: it is killed and its batch put back.
STALL_S = 30.0


class ProcessDied(Exception):
    """A model process's pipe closed: it died (the message says how)."""


class NoModelProcess(RequestError):
    """Answered 503: every model process was given up (none can start)."""

    def __init__(self) -> None:
        super().__init__(
            503,
            f"no model process can serve: each failed to start {MAX_FAILED_STARTS} times in a "
            "row (the server's log says why)",
        )


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


def blocking(fd: int) -> None:
    """``fd`` blocking again: uvloop's add_reader leaves it non-blocking, and a pipe message
    larger than the socket's buffer (an explanation of B/16, 365 kB) would then be read or
    written in part (BlockingIOError)."""
    with contextlib.suppress(OSError):
        os.set_blocking(fd, True)


class ModelProcess:
    """One model process, its pipe and the shared input and output tensors it made (new ones
    at each restart)."""

    def __init__(self, index: int, args: Any, load: Callable[[Any], Any]):
        self.index = index
        self.args = args
        self.load = load
        self.ready = False
        self.pid: int | None = None
        self.facts: dict[str, Any] = {}  # what it said when ready (vitkit.serve.model_process)
        self.inputs: Any = None
        self.outputs: Any = None
        self.forwards = 0  # batches this process answered (one of every process since start)
        self.images = 0
        self.restarts = 0
        self.failed_starts = 0  # in a row, now
        self.given_up = ""  # why it is not started again ("": it is)
        self.stalled = ""  # how a process killed as stalled ended (said instead of the signal)
        self.start()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # (a fresh interpreter: no forked threads)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=model_main,
            args=(self.index, self.args, self.load, child),
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
        self.pid, self.facts, self.inputs, self.outputs = message[1:]
        self.ready = True
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
            blocking(fd)
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            await loop.run_in_executor(None, self.process.join, 5)
            raise ProcessDied(self.stalled or how_it_ended(self.process.exitcode)) from None

    async def _send(self, message: Any) -> None:
        try:
            self.conn.send(message)
        except OSError:
            await asyncio.get_running_loop().run_in_executor(None, self.process.join, 5)
            raise ProcessDied(how_it_ended(self.process.exitcode)) from None

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
        await self._send(message)
        message = await self.receive()
        if message[0] == "error":
            raise RuntimeError(message[1])
        self.forwards += 1
        self.images += n
        return self.outputs[:n].clone()

    async def call(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The served model's method ``name`` (an explanation) run in the process; a
        RequestError it raised there is raised here."""
        plain = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        await self._send(("call", name, plain, kwargs))
        message = await self.receive()
        if message[0] == "refused":
            raise RequestError(message[1], message[2])
        if message[0] == "error":
            raise RuntimeError(message[1])
        return message[1]

    async def restart(self) -> bool:
        """Started again, until it says ready (True), pausing longer after each failed start;
        given up after MAX_FAILED_STARTS in a row (False, said in one line)."""
        self.restarts += 1
        pause, last = RESTART_PAUSE_S, ""
        for self.failed_starts in range(MAX_FAILED_STARTS):
            if self.failed_starts:
                await asyncio.sleep(pause)
                pause = min(2 * pause, RESTART_PAUSE_MAX_S)
            self.start()
            try:
                self._ready(await self.receive())
                self.failed_starts = 0
                return True
            except (ProcessDied, VitkitError) as e:
                last = str(e)
                print(f"vitkit: model process {self.index} could not start again: {e}",
                      file=sys.stderr, flush=True)  # fmt: skip
        self.failed_starts = MAX_FAILED_STARTS
        self.given_up = (
            f"failed to start {MAX_FAILED_STARTS} times in a row (the last: {last}): "
            "not started again"
        )
        return False

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
    """The N model processes, started and ready (blocking) before the front listens: the
    first alone (it decides how the model runs: ``decide(args, facts)`` gives the arguments
    every process loads with from then on), then the others together. ``served``: the first's
    served model without its weights, what the front answers with."""

    def __init__(
        self,
        args: Any,
        load: Callable[[Any], Any],
        count: int,
        decide: Callable[[Any, dict[str, Any]], Any] = lambda args, _: args,
    ):
        self.processes: list[ModelProcess] = []
        try:
            first = ModelProcess(1, args, load)
            self.processes.append(first)
            first.wait_ready(None)
            print(first.facts["said"], end="", flush=True)
            first.args = decide(args, first.facts)
            self.served = first.facts["served"]
            for i in range(1, count):
                self.processes.append(ModelProcess(i + 1, first.args, load))
            for p in self.processes[1:]:
                p.wait_ready(None)
        except BaseException:
            self.stop(time.monotonic())
            raise

    def stop(self, until: float) -> bool:
        return all([p.stop(until) for p in self.processes])

    def unavailable(self) -> str:
        """Why no model process can serve now ("": one can)."""
        if any(p.ready for p in self.processes):
            return ""
        if all(p.given_up for p in self.processes):
            return NoModelProcess().message
        return "no model process is ready: each is starting again"

    def stats(self) -> list[dict[str, Any]]:
        return [
            {"process": p.index, "pid": p.pid, "forwards": p.forwards, "images": p.images,
             "restarts": p.restarts, "failed_starts": p.failed_starts,
             "state": "given up" if p.given_up else "ready" if p.ready else "starting"}
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
        for proc in self.pool.processes[::-1]:  # (process 1 takes the first batch)
            self._release(proc)
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
        while self._free:  # (their pipes close now: not a death)
            self._take_free()
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
            while batch and not self._free:  # (an explanation took the process meanwhile)
                self._freed.clear()
                await self._freed.wait()
            if batch:
                task = loop.create_task(self._forward(self._take_free(), batch))
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
            what = (
                f"during a forward of {len(batch)} images: they go to the next free model process"
            )
            if not await self._died(proc, died, what):
                return
        elif outputs is not None:
            seconds = time.perf_counter() - start
            self._answer(batch, outputs, seconds)
        self._release(proc)

    async def _died(self, proc: ModelProcess, how: str, what: str) -> bool:
        """``proc`` died during ``what``: said, started again; whether it could be (else its
        slot is given up, said in one line, and where none is left every request waiting is
        answered 503)."""
        print(f"vitkit: model process {proc.index} (pid {proc.pid}) {how} {what}; "
              "starting it again", file=sys.stderr, flush=True)  # fmt: skip
        if self.on_restart is not None:
            self.on_restart(proc.index, how)
        if await proc.restart():
            return True
        left = sum(not p.given_up for p in self.pool.processes)
        print(f"vitkit: model process {proc.index} {proc.given_up}; {left} of "
              f"{len(self.pool.processes)} model processes serve", file=sys.stderr,
              flush=True)  # fmt: skip
        if not left:
            for item in [*self._waiting, *self._gathering]:
                if not item.future.done():
                    item.future.set_exception(NoModelProcess())
            self._waiting.clear()
        return False

    def unavailable(self) -> str:
        return self.pool.unavailable()

    def enqueue(self, values: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        if all(p.given_up for p in self.pool.processes):
            raise NoModelProcess()
        return super().enqueue(values, *args, **kwargs)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The served model's method ``fn`` (an explanation) run in the next free model
        process, between its forwards (the front holds no weights). A request given up
        meanwhile leaves it to finish: the process's answer is read, never left on its pipe."""
        task = asyncio.get_running_loop().create_task(self._call(fn.__name__, args, kwargs))
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)
        return await asyncio.shield(task)

    async def _call(self, name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        assert self._freed is not None
        while not self._free:
            if all(p.given_up for p in self.pool.processes):
                raise NoModelProcess()
            self._freed.clear()
            await self._freed.wait()
        proc = self._take_free()
        limit = STALL_S + 16 * self.times.forward(1)
        watch = asyncio.get_running_loop().call_later(limit, self._stalled, proc, limit)
        try:
            answer = await proc.call(name, args, kwargs)
        except ProcessDied as e:
            back = asyncio.get_running_loop().create_task(self._back(proc, str(e)))
            self._forwards.add(back)
            back.add_done_callback(self._forwards.discard)
            raise RequestError(
                500, f"the model process running this explanation {e}; it is started again"
            ) from None
        except Exception:  # (answered: the pipe is in step; cancelled at stop: not freed)
            self._release(proc)
            raise
        finally:
            watch.cancel()
        self._release(proc)
        return answer

    async def _back(self, proc: ModelProcess, how: str) -> None:
        if await self._died(proc, how, "during an explanation"):
            self._release(proc)

    def _release(self, proc: ModelProcess) -> None:
        """``proc`` free for the next batch or call; its pipe watched meanwhile (it sends
        nothing while idle: readable means it died, and it is started again at once)."""
        assert self._freed is not None
        self._free.append(proc)
        asyncio.get_running_loop().add_reader(proc.conn.fileno(), self._idle_died, proc)
        self._freed.set()

    def _take_free(self) -> ModelProcess:
        proc = self._free.pop()
        asyncio.get_running_loop().remove_reader(proc.conn.fileno())
        blocking(proc.conn.fileno())
        return proc

    def _idle_died(self, proc: ModelProcess) -> None:
        """An idle process's pipe closed: out of the free ones, started again."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(proc.conn.fileno())
        if proc not in self._free:
            return
        self._free.remove(proc)

        async def again() -> None:
            await loop.run_in_executor(None, proc.process.join, 5)
            if await self._died(proc, how_it_ended(proc.process.exitcode), "while idle"):
                self._release(proc)

        task = loop.create_task(again())
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

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
