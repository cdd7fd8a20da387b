"""What decoding an image holds, known from its header, and the budget decodes share.

Each image's need is known from its header before a pixel is decoded (:func:`decode_bytes`);
an image that needs more than the whole ``--max-decode-memory`` is refused (413), and the
others hold their share of it (:class:`DecodeBudget`) while they decode, waiting for their turn
as the bytes they came as. The decode itself runs in a process whose memory the OS bounds by
that share (:mod:`vitkit.serve.decode_process`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vitkit.pil_images import BAND_PIXELS

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
    resize's intermediates (``resize_pixels``, :func:`vitkit.pil_images.resize_pixels`),
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


@dataclass(frozen=True)
class Header:
    """What a header says of an image, where Pillow is not asked to open it."""

    size: tuple[int, int]
    mode: str
    format: str

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]


def webp_header(data: bytes) -> Header | None:
    """A WebP file's canvas size and mode, read from its first chunk (lossy "VP8 ", lossless
    "VP8L", extended "VP8X": RFC 9649); None where ``data`` is no WebP. Mode "RGBA" where the
    file may hold alpha or frames (what Pillow decodes it to)."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w = int.from_bytes(data[26:28], "little") & 0x3FFF
        h = int.from_bytes(data[28:30], "little") & 0x3FFF
        return Header((w, h), "RGB", "WEBP")
    if chunk == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        w, h = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        return Header((w, h), "RGBA" if bits >> 28 & 1 else "RGB", "WEBP")
    if chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return Header((w, h), "RGBA" if data[20] & 0x12 else "RGB", "WEBP")
    raise ValueError("a WebP file whose first chunk is not VP8, VP8L or VP8X")


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
    def hold(self, need: int, until: float | None = None) -> Iterator[None]:
        """Hold ``need`` bytes; ``until`` (time.monotonic()): TimeoutError where they do not
        come free by then."""
        with self._cond:
            while self.held and self.held + need > self.limit:
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                self._cond.wait(left)
            self.held += need
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._cond:
                self.held -= need
                self._cond.notify_all()
