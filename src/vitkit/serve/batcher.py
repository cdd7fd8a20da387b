"""Requests of many clients coalesced into one forward, under admission control.

Each request puts its images on one queue and awaits their answers. One task takes what is
queued: the first image, then more until ``max_batch`` images are taken or ``max_wait_ms``
has passed since the first, and runs them as one forward on the model's own thread (forwards
never overlap; the event loop keeps accepting requests meanwhile). While a forward runs the
next batch gathers, so under load batches fill without waiting; a client alone (no other
request on its way and none of the last ``COMPANY_WINDOW`` found another) does not wait, nor
does a batch that holds every request there can be (``idle()``: no open connection without a
request in the server, and none on its way: 8 clients each waited out the whole
``max_wait_ms`` for a 9th that could not come). A request's images always go in order and may
span two forwards.

A forward expected to take less than ``inline_ms`` (by the recent forwards of its size) runs
on the event loop itself: handing it to the model's thread and its answer back costs two
thread wake-ups and the interpreter's lock changing hands, each a wait for a CPU on a busy
host, more than such a forward takes (the MNIST model: 1.7-6 ms for 1-32 images on one
thread). The loop is then held no longer than that; the first forward of a batcher, and any
while an explanation runs on the model's thread, go to the model's thread.

The model's thread and the event loop share the interpreter: a forward of a small model is
hundreds of short PyTorch calls, each giving the interpreter up and taking it back, and a busy
event loop kept it from them for Python's whole switch interval (5 ms) each time. While the
batcher runs the switch interval is at most :data:`SWITCH_INTERVAL_S`: a batch-16 forward of
the MNIST model with the event loop busy took 29-35 ms against 57-105 ms at 5 ms (10 ms
alone; a shared 2-vCPU Zen 4 EPYC).

What the queue takes on and what it gives up before the forward (a full queue, a deadline, a
client gone, a drain past its timeout) is :mod:`vitkit.serve.admission`'s: a request given up
raises :class:`~vitkit.serve.admission.Dropped`, and none of its images reaches a forward
after that.
"""

from __future__ import annotations

import asyncio
import math
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from vitkit.serve.admission import ClientGone, Dropped, ForwardTimes

# how many of the latest requests are asked whether they found another in the server
COMPANY_WINDOW = 8

Run = Callable[[Sequence[Any]], Sequence[Any]]  # a batch of inputs -> one output per input
P = ParamSpec("P")
T = TypeVar("T")


# Python's switch interval while a batcher runs (seconds; lowered to it, never raised)
SWITCH_INTERVAL_S = 0.001

# Seconds from a forward's end to its answers sent (top-k, JSON, the socket), allowed for when
# a forward must end before its images' deadlines.
ANSWER_S = 0.05


@dataclass(eq=False)  # (identity: its value may be a tensor, which == compares elementwise)
class _Item:
    value: Any
    future: asyncio.Future[Any]
    deadline: float = math.inf  # time.monotonic()
    expiry: asyncio.TimerHandle | None = None
    started: bool = False  # in a forward: no longer dropped
    gone: Callable[[], bool] | None = None  # whether its client has gone (its connection closed)
    tries: int = 0  # forwards it was in whose model process died (vitkit.serve.front)


class ModelThread(Executor):
    """One daemon thread running the model's calls in order (a stop never waits on a forward
    longer than it chooses to, and the process can exit while one runs)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name="vitkit-forward", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        f: Future[T] = Future()
        self._jobs.put((f, fn, args, kwargs))
        return f

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            f, fn, args, kwargs = job
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn(*args, **kwargs))
            except BaseException as e:
                f.set_exception(e)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._jobs.put(None)
        if wait:
            self.thread.join()


class Batcher:
    """``await batcher.submit(values, deadline)`` runs ``values`` through ``run`` together with
    what other requests submitted meanwhile; ``on_batch(size, seconds)`` hears of every
    forward, ``on_abandoned(images)`` of images computed for a request already gone."""

    def __init__(
        self,
        run: Run,
        *,
        max_batch: int,
        max_wait_ms: float,
        max_queue: int | None = None,
        on_batch: Callable[[int, float], None] | None = None,
        on_abandoned: Callable[[int], None] | None = None,
        others: Callable[[], int] | None = None,
        inline_ms: float = 0.0,
        idle: Callable[[], int | None] | None = None,
    ):
        if max_batch < 1 or max_wait_ms < 0 or (max_queue is not None and max_queue < 1):
            raise ValueError("max_batch and max_queue must be >= 1 and max_wait_ms >= 0")
        self.inline = inline_ms / 1000  # forwards expected to take less run on the loop
        self.inline_forwards = 0  # forwards that ran on the loop
        self._calls = 0  # explanations on the model's thread now
        self.run = run
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.on_batch = on_batch
        self.on_abandoned = on_abandoned
        # requests on their way to the queue (their body arriving, their images decoding):
        # where there are none and none of the last COMPANY_WINDOW requests found another in the
        # server (a client alone; several clients' next requests may still be on the wire:
        # waiting kept the MNIST model's req/s at 2 and 8 clients), the forward starts at once
        self.others = others
        self._company: deque[bool] = deque(maxlen=COMPANY_WINDOW)
        # open connections with no request in the server (each may still send one; None: not
        # known): where none is and none is on its way, no request can join a gathering batch
        self.idle = idle
        self.requests = 0  # requests with images queued or in a forward, not yet answered
        self.times = ForwardTimes()
        self.executor = ModelThread()
        self.draining = False  # stopping: forwards no longer wait for more images
        self.closed = False  # the drain timeout passed: nothing more is taken on
        self._waiting: deque[_Item] = deque()
        self._running: list[_Item] = []  # in the forward that runs now
        self._gathering: list[_Item] = []  # the next forward's, while it waits for more
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._forward_ends = 0.0  # time.monotonic() the running forward is expected to end
        self.drain_ends: float | None = None  # time.monotonic() a drain gives up
        self.on_closed: list[Callable[[], None]] = []  # called when the drain gives up

    @property
    def depth(self) -> int:
        """Images waiting for a forward (in the queue or the batch gathering)."""
        return sum(not i.future.done() for i in (*self._gathering, *self._waiting))

    def start(self) -> None:
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._arrived = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def drain(self, timeout: float | None = None) -> None:
        """Stopping: run what waits at once (no waiting for more images); ``timeout`` seconds
        on, refuse what still waits (:meth:`refuse_waiting`) and stop waiting for a forward."""
        self.draining = True
        if self._arrived is not None:
            self._arrived.set()
        if timeout is not None:
            self.drain_ends = time.monotonic() + timeout
            asyncio.get_running_loop().call_later(timeout, self.refuse_waiting)

    def refuse_waiting(self) -> None:
        """The drain timeout passed: every image still waiting or in the forward that still
        runs is answered 503, and so is every request after it."""
        self.closed = True
        for hook in self.on_closed:
            hook()
        message = "the server is stopping and its drain timeout passed: send it elsewhere"
        for item in [*self._gathering, *self._waiting, *self._running]:
            if not item.future.done():
                item.future.set_exception(Dropped("shutdown", message))
        self._waiting.clear()

    async def stop(self) -> bool:
        """After the last request was answered: end the loop and the model's thread, waiting
        for a forward that still runs until the drain gives up (a second after its timeout);
        whether the thread ended."""
        wait_s = None if self.drain_ends is None else max(self.drain_ends + 1 - time.monotonic(), 0)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.executor.shutdown(wait=False)
        thread = self.executor.thread
        await asyncio.get_running_loop().run_in_executor(None, thread.join, wait_s)
        return not thread.is_alive()

    def expected_wait(self, images: int) -> float:
        """Seconds until ``images`` more images would be computed (0: no forward seen yet)."""
        now = time.monotonic()
        return max(self._forward_ends - now, 0.0) + self.times.drain(
            self.depth + images, self.max_batch
        )

    async def submit(
        self,
        values: Sequence[Any],
        deadline: float | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> list[Any]:
        """The outputs of ``values``; raises Dropped where the request is refused or given up
        (``deadline``: time.monotonic() by which its answer is due), ClientGone where
        ``gone()`` says its client left before its forward."""
        return list(await self.enqueue(values, deadline, gone))

    def enqueue(
        self,
        values: Sequence[Any],
        deadline: float | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> asyncio.Future[Any]:
        """``values`` queued: a future of their outputs (cancel it: none of them runs after
        that); raises Dropped at once where the request is refused. ``gone()``: whether the
        request's client has left, asked just before a forward (its images are dropped then:
        ClientGone)."""
        assert self._arrived is not None, "Batcher.start() first"
        if self.closed:
            raise Dropped("shutdown", "the server is stopping: send the request elsewhere")
        depth, n = self.depth, len(values)
        if self.max_queue is not None and depth + n > self.max_queue:
            raise Dropped(
                "queue_full",
                f"the server is busy: {depth} images wait for a forward and it queues at most "
                f"{self.max_queue} (--max-queue); retry later",
                retry_after=self.expected_wait(0),
            )
        if deadline is not None:
            expected = self.expected_wait(n)
            if time.monotonic() + expected > deadline:
                raise Dropped(
                    "deadline",
                    f"the server is busy: this request would be answered in about "
                    f"{expected:.1f} s, after its deadline (--timeout); retry later",
                    retry_after=expected,
                )
        loop = asyncio.get_running_loop()
        items = [_Item(v, loop.create_future(), gone=gone) for v in values]
        for item in items:
            if deadline is not None:
                item.deadline = deadline
                item.expiry = loop.call_later(deadline - time.monotonic(), self._expire, item)
            self._waiting.append(item)
        self._arrived.set()
        answers = asyncio.gather(*(i.future for i in items))
        if self.others is not None:  # another request held, or on its way besides this one
            self._company.append(self.requests > 0 or self.others() > 1)
        self.requests += 1

        def ended(f: asyncio.Future[Any]) -> None:
            self.requests -= 1
            if f.cancelled() or f.exception() is not None:  # dropped or its client gone
                for item in items:  # none of its images runs now
                    item.future.cancel()
                    if item.expiry is not None:
                        item.expiry.cancel()

        answers.add_done_callback(ended)
        return answers

    def _expire(self, item: _Item) -> None:
        if not item.started and not item.future.done():
            item.future.set_exception(
                Dropped("deadline", "the request's deadline passed while it waited (--timeout)")
            )

    def unavailable(self) -> str:
        """Why no forward can run now ("": one can; the front's batcher may say otherwise)."""
        return ""

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` on the model's thread, between forwards (an explanation)."""
        loop = asyncio.get_running_loop()
        self._calls += 1  # (meanwhile no forward runs on the loop: they never overlap)
        try:
            return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))
        finally:
            self._calls -= 1

    def _on_loop(self, size: int) -> bool:
        """Whether a forward of ``size`` images runs on the event loop: one of that size is
        expected to take less than ``inline_ms`` (a forward was seen) and no explanation runs on
        the model's thread."""
        return (
            self.times.per_image > 0 and self._calls == 0 and self.times.forward(size) < self.inline
        )

    def _alone(self) -> bool:
        """No other request on its way, and none of the last requests found company."""
        return self.others is not None and not any(self._company) and self.others() <= 0

    def _all_in(self) -> bool:
        """Every request there can be is in the queue: no open connection is without one and
        none is on its way (only a new connection could bring another)."""
        if self.idle is None or self.others is None:
            return False
        idle = self.idle()
        return idle is not None and idle <= 0 and self.others() <= 0

    def _pop_live(self) -> _Item | None:
        while self._waiting:
            item = self._waiting.popleft()
            if not item.future.done():
                return item
        return None

    async def _take(self) -> list[_Item]:
        assert self._arrived is not None
        while (first := self._pop_live()) is None:
            self._arrived.clear()
            await self._arrived.wait()
        batch = self._gathering = [first]
        until = time.monotonic() + self.max_wait
        while len(batch) < self.max_batch:
            item = self._pop_live()
            if item is not None:
                batch.append(item)
                continue
            left = until - time.monotonic()
            if left <= 0 or self.draining or self._alone() or self._all_in():
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                break
        self._gathering = []
        for item in batch:  # a client gone meanwhile: nobody to answer, nothing computed
            if item.gone is not None and not item.future.done() and item.gone():
                item.future.set_exception(ClientGone())
        batch = [i for i in batch if not i.future.done()]
        # a forward starting now must end before each of its images' deadlines
        while batch and self.times.per_image:
            end = time.monotonic() + self.times.forward(len(batch), margin=True) + ANSWER_S
            late = min(batch, key=lambda i: i.deadline)
            if late.deadline >= end:
                break
            batch.remove(late)
            late.future.set_exception(
                Dropped("deadline", "the request's deadline would pass before its forward "
                        "ended (--timeout); retry later")
            )  # fmt: skip
        for item in batch:
            item.started = True
            if item.expiry is not None:
                item.expiry.cancel()
        return [i for i in batch if not i.future.done()]

    async def _next_batch(self) -> list[_Item]:
        """The next batch (:meth:`_take`); where gathering it fails, every image in it hears
        why (never silently) and the batch is empty."""
        try:
            return await self._take()
        except Exception as e:
            for item in self._gathering:
                if not item.future.done():
                    item.future.set_exception(e)
            self._gathering = []
            return []

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            start = time.perf_counter()
            self._forward_ends = time.monotonic() + self.times.forward(len(batch))
            self._running = batch
            try:
                values = [i.value for i in batch]
                if self._on_loop(len(batch)):
                    self.inline_forwards += 1
                    outputs = self.run(values)
                else:
                    outputs = await loop.run_in_executor(self.executor, self.run, values)
            except Exception as e:  # the forward failed: every request in it hears why
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            finally:
                self._forward_ends, self._running = 0.0, []
            seconds = time.perf_counter() - start
            self._answer(batch, outputs, seconds)

    def _answer(self, batch: list[_Item], outputs: Sequence[Any], seconds: float) -> None:
        """A forward of ``batch`` done in ``seconds``: each request still waiting gets its
        output, those whose clients have gone are counted as abandoned."""
        self.times.observe(len(batch), seconds)
        if self.on_batch is not None:
            self.on_batch(len(batch), seconds)
        abandoned = 0
        for item, out in zip(batch, outputs):
            if item.future.done():
                abandoned += 1
            else:
                item.future.set_result(out)
        if abandoned and self.on_abandoned is not None:
            self.on_abandoned(abandoned)
