"""Decoding off the event loop, a bounded number at a time and within a memory budget.

Every request image is decoded, converted and transformed on one of ``workers`` threads
(PIL releases the GIL while it decodes and resizes): the event loop only waits, so /health
and every other route answer meanwhile. At most ``workers`` images are decoded at once, and
together they hold at most ``--max-decode-memory`` bytes: each image's need is known from its
header before a pixel is decoded (:func:`decode_bytes`), an image that needs more than the
whole budget is refused (413), and the others wait for their turn as the bytes they came as
(:class:`DecodeBudget`). Four 25-megapixel 16-bit PNGs at once decode one after the other
instead of holding 225 MB each together.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from vitkit.data.transforms import BAND_PIXELS

T = TypeVar("T")

# Bytes per pixel PIL holds for an image of each mode ("RGB" is stored as 4 bytes a pixel).
_ONE_BYTE = ("1", "L", "P")
_WIDE = ("I", "F")  # and "I;16*": scaled to 8 bits through a numpy copy of the whole image


# What a decoder holds beside the pixels (zlib's window and row buffers, libjpeg's state).
DECODER_STATE = 1_000_000


def decode_bytes(
    mode: str,
    width: int,
    height: int,
    channels: int,
    resize_pixels: int,
    coefficients: int = 0,
) -> int:
    """The most memory decoding one ``width`` x ``height`` image of PIL ``mode`` into a
    ``channels``-channel model's input takes: the decoded image, what its conversion to "L" or
    "RGB" holds beside it (a 16-bit or float image: a numpy copy, then the 8-bit image), the
    resize's intermediates (``resize_pixels``, :func:`vitkit.data.resize_plan.resize_pixels`),
    a progressive JPEG's ``coefficients`` (:func:`jpeg_coefficient_bytes`) and the decoder's
    own state."""
    pixels = width * height
    out = 1 if channels == 1 else 4
    src = 2 if mode.startswith("I;16") else 1 if mode in _ONE_BYTE else 4
    bands = 0
    if mode in _WIDE or mode.startswith("I;16"):  # a copy and "L", then "L" and "RGB"
        beside = max(src + 1, 1 + out) if channels != 1 else src + 1
        bands = 4 * 8 * min(pixels, BAND_PIXELS + width)  # float64 band and temporaries
    else:
        beside = 0 if mode == ("L" if channels == 1 else "RGB") else out
    return pixels * (src + beside) + bands + resize_pixels * out + coefficients + DECODER_STATE


def jpeg_coefficient_bytes(img: Any) -> int:
    """Bytes a progressive JPEG's decoder holds for its DCT coefficients until the last scan
    (2 bytes each, every component at its own sampling, in whole 8 x 8 blocks); 0 for any
    other image (a baseline JPEG decodes a row of blocks at a time)."""
    info = getattr(img, "info", {})
    layers = getattr(img, "layer", None)
    if not (info.get("progressive") or info.get("progression")) or not layers:
        return 0
    w, h = img.size
    h_max = max(layer[1] for layer in layers)
    v_max = max(layer[2] for layer in layers)
    total = 0
    for _, hs, vs, _ in layers:
        cw, ch = -(-w * hs // h_max), -(-h * vs // v_max)  # the component's own size
        total += -(-cw // 8) * 8 * (-(-ch // 8) * 8)
    return 2 * total


class DecodeBudget:
    """Bytes the decodes in progress may hold together. :meth:`hold` waits until ``need``
    fits beside what the others hold (or nothing else is held)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"the decode memory budget must be positive, got {limit}")
        self.limit = limit
        self.held = 0
        self.peak = 0
        self._cond = threading.Condition()

    def fits(self, need: int) -> bool:
        return need <= self.limit

    @contextmanager
    def hold(self, need: int) -> Iterator[None]:
        with self._cond:
            while self.held and self.held + need > self.limit:
                self._cond.wait()
            self.held += need
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._cond:
                self.held -= need
                self._cond.notify_all()


class DecodePool:
    """At most ``workers`` decodes at once, none on the event loop, within ``memory`` bytes
    (the :class:`DecodeBudget` the decodes hold)."""

    def __init__(self, workers: int, memory: int = 256_000_000):
        if workers < 1:
            raise ValueError(f"decode workers must be at least 1, got {workers}")
        self.workers = workers
        self.budget = DecodeBudget(memory)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="vitkit-decode")
        weakref.finalize(self, self.pool.shutdown, wait=False)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
