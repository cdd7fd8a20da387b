"""Request images opened under limits and decoded in the model's mode, through Pillow and
NumPy only (no PyTorch): what a decode process (:mod:`vitkit.serve.decode_process`) runs.

An image's header is read and checked (pixels, sides, the resize plan, the decode's memory:
413) before a pixel is decoded (:func:`open_checked`); :func:`load_image` decodes it as
``vitkit predict`` opens a file. :class:`vitkit.serve.served_model.ServedModel` transforms
and batches what comes out.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError
from PIL.Image import DecompressionBombError, DecompressionBombWarning

from vitkit.pil_images import FORMATS, convert_image, resize_pixels, resize_refusal
from vitkit.serve.decode import decode_bytes, jpeg_coefficient_bytes, webp_header

# Pixels along either side of a request image (JPEG's and GIF's own limit). Pillow's resize
# keeps filter weights for every source pixel along a side it shrinks (16 to 48 bytes each,
# by the filter): a 25,000,000 x 1 PNG of 24 KB, squashed to 224 x 224, passes the resize
# plan (50,400 pixels) yet made one decode allocate 0.5 to 1.2 GB.
MAX_SIDE = 65_535
# A PNG or baseline JPEG this small is decoded on the event loop (its decode is bounded by its
# pixels: well under a millisecond, less than the hop to a decode process); every other image
# decodes in a process (vitkit.serve.decode_process).
INLINE_BYTES = 65_536
INLINE_PIXELS = 65_536
# Pillow's WebP decoder holds about three times the decoded image (its own RGBA canvas and
# the frame it hands over, an animated file's canvas besides): the estimate is multiplied.
WEBP_FACTOR = 3


class RequestError(Exception):
    """A request the server refuses: the HTTP status (4xx) and the one line it answers."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """What one request may hold and the work its images may cost: pixels decoded, pixels
    the resize before the centre crop allocates (:func:`vitkit.pil_images.resize_pixels`), decode
    processes kept started (:mod:`vitkit.serve.decode_process`); and what all requests hold
    together: bytes of images being decoded (:class:`vitkit.serve.decode.DecodeBudget`) and
    bytes of request bodies held (beyond it: 503)."""

    max_body_bytes: int = 20_000_000
    max_pixels: int = 25_000_000
    max_images: int = 16
    max_resize_pixels: int = 10_000_000
    decode_workers: int = 2
    max_decode_memory: int = 256_000_000
    max_body_memory: int = 128_000_000


def open_image(
    data: bytes,
    channels: int,
    max_pixels: int,
    what: str = "the image",
    check: Callable[[Any], None] | None = None,
    pillow: bool = True,
) -> Any:
    """Request bytes -> a PIL image opened from its header, no pixel decoded yet.

    The size is read from the header and checked against ``max_pixels`` (a decompression
    bomb never allocates); formats outside :data:`FORMATS` and unreadable headers are refused
    with one line (``RequestError``, 4xx); ``check(image)`` runs then too, on the image opened
    from its header (it raises to refuse). ``pillow=False``: a WebP's header is read here
    (:func:`vitkit.serve.decode.webp_header`), not by Pillow, whose WebP plugin allocates the
    whole canvas when it opens a file: the header a server reads costs no memory."""
    if not data:
        raise RequestError(400, f"{what}: empty (no bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DecompressionBombWarning)  # the limit below rules
            header = None if pillow else webp_header(data)
            img = header or Image.open(io.BytesIO(data), formats=FORMATS)
    except DecompressionBombError as e:
        raise RequestError(413, f"{what}: too large to decode ({e})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise RequestError(
            415, f"{what}: not an image in a format the server reads ({', '.join(FORMATS)})"
        ) from None
    w, h = img.size
    if w * h > max_pixels:
        raise RequestError(
            413, f"{what}: {w}x{h} = {w * h:,} pixels; the server takes at most "
            f"{max_pixels:,} (--max-pixels)",
        )  # fmt: skip
    if check is not None:
        check(img)
    if max(w, h) > MAX_SIDE:
        raise RequestError(
            413, f"{what}: {w}x{h} pixels; the server takes at most {MAX_SIDE:,} along a side"
        )
    return img


def load_image(img: Any, channels: int, what: str = "the image") -> Any:
    """An image :func:`open_image` opened, decoded in the model's mode (as ``vitkit predict``
    opens a file); truncated and undecodable files are refused with one line (400)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DecompressionBombWarning)
            img.load()
            return convert_image(img, channels)
    except (OSError, ValueError, SyntaxError, DecompressionBombError) as e:
        raise RequestError(400, f"{what}: cannot be decoded ({e})") from None


def decode_image(
    data: bytes,
    channels: int,
    max_pixels: int,
    what: str = "the image",
    check: Callable[[Any], None] | None = None,
) -> Any:
    """Request bytes -> a PIL image in the model's mode: :func:`open_image`, then
    :func:`load_image`."""
    return load_image(open_image(data, channels, max_pixels, what, check), channels, what)


def open_checked(
    data: bytes,
    transform: Any,
    channels: int,
    limits: Limits,
    what: str,
    memory: int | None = None,
    pillow: bool = True,
) -> tuple[Any, int]:
    """The image of ``data`` opened from its header with every limit checked before a pixel is
    decoded (pixels, sides, the resize plan of ``transform``, the decode's memory against
    ``memory``: 413), and the bytes its decode will hold (:func:`decode_bytes`; a WebP's
    decoder holds :data:`WEBP_FACTOR` times that)."""
    need = 0

    def planned(img: Any) -> None:  # before a pixel is decoded
        nonlocal need
        (width, height), mode = img.size, img.mode
        why = resize_refusal(transform, width, height, limits.max_resize_pixels)
        if why:
            raise RequestError(413, f"{what}: {why} (--max-resize-pixels)")
        resized = resize_pixels(transform, width, height)
        coefficients = jpeg_coefficient_bytes(img)
        need = decode_bytes(mode, width, height, channels, resized, coefficients)
        if img.format == "WEBP":
            need *= WEBP_FACTOR
        if memory is not None and need > memory:
            raise RequestError(
                413, f"{what}: decoding {width}x{height} pixels (mode {mode}) takes about "
                f"{need / 1e6:,.0f} MB; the server decodes at most {memory / 1e6:,.0f} "
                "MB at once (--max-decode-memory)",
            )  # fmt: skip

    return open_image(data, channels, limits.max_pixels, what, planned, pillow), need
