"""Decoding off the event loop, a bounded number at a time.

Every request image is decoded, converted and transformed on one of ``workers`` threads
(PIL releases the GIL while it decodes and resizes): the event loop only waits, so /health
and every other route answer meanwhile, and at most ``workers`` images are decoded at once,
so decode memory stays within ``workers`` x (--max-pixels + --max-resize-pixels) pixels
however many requests arrive. The others wait their turn as the bytes they came as.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class DecodePool:
    """At most ``workers`` decodes at once, none on the event loop."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"decode workers must be at least 1, got {workers}")
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="vitkit-decode")
        weakref.finalize(self, self.pool.shutdown, wait=False)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
