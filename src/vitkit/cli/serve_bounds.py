"""``vitkit serve``'s bounds on the work of one request: options and what they build."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from vitkit.cli.options import non_negative_float, positive_int


def add_bound_options(g: Any) -> None:
    """--max-resize-pixels, --decode-workers, --max-decode-memory, --max-body-memory,
    --max-header-bytes, --max-headers, --read-timeout (in the limits group)."""
    g.add_argument(
        "--max-resize-pixels",
        type=positive_int,
        default=10_000_000,
        help="pixels the resize before the centre crop may allocate for one image, known from "
        "its header before it is decoded (an extreme aspect ratio, such as 1 x 1,000,000, "
        "is refused; default 10,000,000)",
    )
    g.add_argument(
        "--decode-workers",
        type=positive_int,
        default=2,
        help="decode processes kept started: every image but a small PNG or JPEG decodes in "
        "one, killed at its request's deadline and bounded in memory by the OS; up to 4x as "
        "many at once when all are busy (default 2)",
    )
    g.add_argument(
        "--max-decode-memory",
        type=positive_int,
        default=256_000_000,
        help="bytes the images being decoded may hold together, each image's need known from "
        "its header: one that needs more is refused (413), others wait their turn; each "
        "decode's share is its process's RLIMIT_DATA (past it: 413) "
        "(default 256,000,000: a 25-megapixel RGBA PNG needs about 206 MB)",
    )
    g.add_argument(
        "--max-body-memory",
        type=positive_int,
        default=128_000_000,
        help="bytes of request bodies the server holds at once, all requests together "
        "(reading, waiting and in their forward); beyond it 503 with Retry-After "
        "(default 128,000,000; at least --max-body)",
    )
    g.add_argument(
        "--max-header-bytes",
        type=positive_int,
        default=16_384,
        help="bytes of a request's line and headers (431 and the connection closed; "
        "default 16,384)",
    )
    g.add_argument(
        "--max-headers", type=positive_int, default=64, help="headers of a request (default 64)"
    )
    g.add_argument(
        "--read-timeout",
        type=non_negative_float,
        default=30.0,
        help="seconds from a request's first byte (or the connection's opening) to its last: "
        "slower ones get 408 and the connection closed (default 30; 0: none)",
    )


DEFAULT_MAX_IMAGES = 16  # images per request unless --max-images or --max-queue says less


def request_limits(args: argparse.Namespace) -> Any:
    from vitkit.errors import VitkitError
    from vitkit.serve.request_images import Limits

    if args.max_images is None:  # (a queue shorter than the default bounds it)
        args.max_images = min(DEFAULT_MAX_IMAGES, args.max_queue)
    if args.max_body_memory < args.max_body:
        raise VitkitError(
            f"--max-body-memory {args.max_body_memory:,} is below --max-body "
            f"{args.max_body:,}: a body of the size the server takes could never be held"
        )
    return Limits(
        args.max_body,
        args.max_pixels,
        args.max_images,
        max_resize_pixels=args.max_resize_pixels,
        decode_workers=args.decode_workers,
        max_decode_memory=args.max_decode_memory,
        max_body_memory=args.max_body_memory,
    )


def server_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn.Config's arguments for the request head and its read timeout."""
    from vitkit.serve.limits import HttpLimits, bounded_http

    http = HttpLimits(args.max_header_bytes, args.max_headers, args.read_timeout or None)
    return {"http": bounded_http(http)}


def show_access_log(args: argparse.Namespace) -> None:
    """--access-log: uvicorn's line per request (its Config set the logger to the server's
    log level, "warning", which leaves those INFO lines out: call this after it)."""
    if args.access_log:
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)


# Seconds beyond which a timeout is a mistake, not a setting (0 says none where it may)
MAX_TIMEOUT_S = 86_400.0


def machine_memory() -> int | None:
    """The machine's memory in bytes (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # (not on Linux)
        return None


def check_ranges(args: argparse.Namespace) -> None:
    """The numeric options a machine cannot hold, refused in one line before anything loads:
    --workers and --decode-workers at most 4 per CPU, timeouts at most a day, --max-images
    within --max-queue, and the budgets every worker may fill within the machine's memory."""
    from vitkit.cli.options import THREADS_PER_CPU
    from vitkit.errors import VitkitError
    from vitkit.serve.workers import cpus

    n = cpus()
    for name, value in (("--workers", args.workers), ("--decode-workers", args.decode_workers)):
        if value > THREADS_PER_CPU * n:
            raise VitkitError(
                f"{name} {value:,}: this machine gives the process {n} CPUs; at most "
                f"{THREADS_PER_CPU * n} processes ({THREADS_PER_CPU} per CPU)"
            )
    for name in ("timeout", "drain_timeout", "read_timeout"):
        value = getattr(args, name)
        if value > MAX_TIMEOUT_S:
            raise VitkitError(
                f"--{name.replace('_', '-')} {value:g}: at most {MAX_TIMEOUT_S:,.0f} s (a day)"
                + ("; 0: none" if name != "drain_timeout" else "")
            )
    if args.max_images > args.max_queue:
        raise VitkitError(
            f"--max-images {args.max_images:,} is above --max-queue {args.max_queue:,}: a "
            "request of that many images could never be queued"
        )
    memory = machine_memory()
    # (the front holds the bodies and decodes once; --worker-mode socket: each worker its own)
    holders = args.workers if getattr(args, "worker_mode", "front") == "socket" else 1
    budgets = (args.max_decode_memory + args.max_body_memory) * holders
    if memory is not None and budgets > memory:
        each = f" x {holders} workers" if holders > 1 else ""
        raise VitkitError(
            f"--max-decode-memory {args.max_decode_memory:,} + --max-body-memory "
            f"{args.max_body_memory:,} bytes{each} = {budgets / 1e9:,.1f} GB that requests "
            f"may hold; this machine has {memory / 1e9:,.1f} GB"
        )
