"""Requests of many clients coalesced into one forward.

Each request puts its images on one queue and awaits their answers. One task takes what is
queued: the first image, then more until ``max_batch`` images are taken or ``max_wait_ms``
has passed since the first, and runs them as one forward on the model's own thread (forwards
never overlap; the event loop keeps accepting requests meanwhile). While a forward runs the
next batch gathers, so under load batches fill without waiting; a lone request waits at most
``max_wait_ms``. A request's images always go in order and may span two forwards.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

Run = Callable[[Sequence[Any]], Sequence[Any]]  # a batch of inputs -> one output per input


@dataclass
class _Item:
    value: Any
    future: asyncio.Future[Any]


class Batcher:
    """``await batcher.submit(values)`` runs ``values`` through ``run`` together with what other
    requests submitted meanwhile; ``on_batch(size, seconds)`` hears of every forward."""

    def __init__(
        self,
        run: Run,
        *,
        max_batch: int,
        max_wait_ms: float,
        on_batch: Callable[[int, float], None] | None = None,
    ):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.run = run
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.on_batch = on_batch
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitkit-forward")
        self._queue: asyncio.Queue[_Item] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        """Images waiting for a forward."""
        return 0 if self._queue is None else self._queue.qsize()

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """After the last request was answered: end the loop and the model's thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.executor.shutdown(wait=True)

    async def submit(self, values: Sequence[Any]) -> list[Any]:
        assert self._queue is not None, "Batcher.start() first"
        loop = asyncio.get_running_loop()
        items = [_Item(v, loop.create_future()) for v in values]
        for item in items:
            self._queue.put_nowait(item)
        return list(await asyncio.gather(*(i.future for i in items)))

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` on the model's thread, between forwards (an explanation)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def _take(self) -> list[_Item]:
        assert self._queue is not None
        queue = self._queue
        batch = [await queue.get()]
        deadline = time.monotonic() + self.max_wait
        while len(batch) < self.max_batch:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), left))
            except asyncio.TimeoutError:
                break
        return [i for i in batch if not i.future.cancelled()]

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._take()
            if not batch:
                continue
            start = time.perf_counter()
            try:
                values = [i.value for i in batch]
                outputs = await loop.run_in_executor(self.executor, self.run, values)
            except Exception as e:  # the forward failed: every request in it hears why
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - start)
            for item, out in zip(batch, outputs):
                if not item.future.done():
                    item.future.set_result(out)
