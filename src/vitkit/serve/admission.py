"""Admission control: which requests the server takes on, and which it gives up before the work.

- A bounded queue: at most ``max_queue`` images wait for a forward; a request that would
  overfill it is refused at once (503 with ``Retry-After``: the seconds the queue takes to
  drain at the recent forward speed, at least 1).
- A deadline per request (``timeout`` seconds from its arrival): a request whose images would
  not be answered within it is refused at once where the recent forwards say so, and images
  still waiting when it passes (or that a forward starting now would finish after it) are
  dropped before the forward and answered 503.
- A request whose client has gone while its images wait is dropped before the forward too
  (answered with nginx's 499 "client closed request", which nobody receives).
- Draining (SIGTERM): forwards stop waiting for more images; images still waiting when the
  drain timeout passes are answered 503.

Every request given up is counted by reason (:data:`REASONS`) in ``/metrics``
(``vitkit_requests_dropped_total``), and every image that was computed although its request
had gone meanwhile in ``vitkit_images_abandoned_total`` (a client that leaves during the
forward itself: the work cannot be taken back).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# A forward waits at most this long for more images (--max-wait-ms above it is refused: a
# lone request would wait that long, and a drain could not end sooner).
MAX_WAIT_MS_CAP = 10_000.0

REASONS = {
    "queue_full": "the queue of images waiting for a forward was full (--max-queue)",
    "deadline": "its deadline passed, or would have before its forward ended (--timeout)",
    "client_gone": "its client left while its images waited",
    "decode_time": "its image's decode did not end by its deadline: the decode process was "
    "killed (--timeout)",
    "shutdown": "the server was stopping and the drain timeout passed (--drain-timeout)",
    "body_memory": "the request bodies the server held were at their limit (--max-body-memory)",
}


@dataclass(frozen=True)
class Admission:
    """How much work the server takes on: images waiting (``max_queue``), seconds a request
    may take from its arrival (``timeout``; None: no deadline), seconds a stop may take."""

    max_queue: int = 256
    timeout: float | None = 30.0
    drain_timeout: float = 30.0


class Dropped(Exception):
    """A request the server gives up on before its forward: the reason (a key of
    :data:`REASONS`), the one line it answers and the seconds after which to retry."""

    def __init__(self, reason: str, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def retry_after_header(self) -> str:
        return str(max(1, math.ceil(self.retry_after)))


class ForwardTimes:
    """Recent forward times, to tell how long a queue takes to drain and whether a forward
    starting now ends before a deadline: an exponential average per batch size (and per image
    for sizes not yet seen) and of each size's deviation from it, as TCP estimates a round
    trip. :meth:`forward` with ``margin`` adds twice the deviation: on a shared host a forward
    of B/16 took up to a third longer than its average, and admitted requests answered after
    their deadline."""

    def __init__(self, alpha: float = 0.3, margin: float = 2.0):
        self.alpha = alpha
        self.margin = margin
        self.by_size: dict[int, float] = {}
        self.deviation: dict[int, float] = {}
        self.per_image = 0.0  # 0: nothing seen yet (no prediction)
        self.relative_deviation = 0.0  # for sizes not yet seen

    def observe(self, size: int, seconds: float) -> None:
        a = self.alpha
        old = self.by_size.get(size)
        if old is None:
            self.by_size[size], self.deviation[size] = seconds, seconds / 4
        else:
            self.deviation[size] = (1 - a) * self.deviation[size] + a * abs(seconds - old)
            self.by_size[size] = (1 - a) * old + a * seconds
        relative = self.deviation[size] / max(self.by_size[size], 1e-9)
        self.relative_deviation = (
            relative if not self.per_image else (1 - a) * self.relative_deviation + a * relative
        )
        each = seconds / size
        self.per_image = each if not self.per_image else (1 - a) * self.per_image + a * each

    def forward(self, size: int, margin: bool = False) -> float:
        """Expected seconds of one forward of ``size`` images (0 before any was seen);
        ``margin``: the time it takes at most, but rarely (the average plus twice its
        deviation)."""
        if size in self.by_size:
            mean, dev = self.by_size[size], self.deviation[size]
        else:
            mean = self.per_image * size
            dev = mean * self.relative_deviation
        return mean + self.margin * dev if margin else mean

    def drain(self, images: int, max_batch: int) -> float:
        """Expected seconds until ``images`` waiting images are all computed."""
        full, rest = divmod(images, max_batch)
        return full * self.forward(max_batch) + (self.forward(rest) if rest else 0.0)


class ClientGone(Exception):
    """The client closed its connection while its request waited."""


async def unless_gone(work: asyncio.Future[T], receive: Callable[[], Awaitable[Any]]) -> T:
    """``work``'s result, or ClientGone (``work`` cancelled) where the client disconnects
    first; ``receive`` is the request's ASGI receive with its body already read."""

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    watch.add_done_callback(lambda w: None if w.cancelled() else work.cancel())
    try:
        return await work
    except asyncio.CancelledError:
        if watch.done() and not watch.cancelled():
            raise ClientGone from None
        raise
    finally:
        watch.cancel()
