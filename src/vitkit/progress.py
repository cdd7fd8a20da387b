"""Progress for people and for log files.

On a terminal, :func:`progress` is a tqdm bar redrawn in place. Anywhere else (a log file, a
pipe, a CI job) a bar's carriage-return updates pile up into one huge line — a logged training
run once reached 150 KB of them — so there it writes plain lines instead: one when the progress bar
closes (an epoch, a split of shards) and one every ``every`` seconds in between.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

LINE_EVERY_S = 30.0  # seconds between the plain lines of a long bar off a terminal


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    initial: int = 0,
    desc: str = "",
    enabled: bool = True,
    leave: bool = True,
    stream: TextIO | None = None,
    every: float = LINE_EVERY_S,
) -> Any:
    """A progress bar over ``iterable`` (or updated by hand with ``update``): tqdm on a
    terminal, :class:`LineProgress` elsewhere. ``leave=False``: no final line (a short bar
    inside a longer one, such as an evaluation inside an epoch)."""
    stream = sys.stderr if stream is None else stream
    if enabled and is_terminal(stream):
        from tqdm import tqdm

        return tqdm(
            iterable,
            total=total,
            initial=initial,
            desc=desc,
            leave=leave,
            file=stream,
            dynamic_ncols=True,
        )
    return LineProgress(
        iterable,
        total=total,
        initial=initial,
        desc=desc,
        enabled=enabled,
        leave=leave,
        stream=stream,
        every=every,
    )


class LineProgress:
    """The part of tqdm's interface vitkit uses, written as whole lines:
    ``DESC: N/TOTAL, key=value, ... (S s)``."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: int | None = None,
        initial: int = 0,
        desc: str = "",
        enabled: bool = True,
        leave: bool = True,
        stream: TextIO,
        every: float = LINE_EVERY_S,
    ) -> None:
        self.iterable, self.total, self.n, self.desc = iterable, total, initial, desc
        self.enabled, self.leave, self.stream, self.every = enabled, leave, stream, every
        self.postfix: dict[str, Any] = {}
        self.start = self.last_line = time.monotonic()
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None, "LineProgress over nothing: call update() instead"
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last_line >= self.every:
            self._write()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = values

    def close(self) -> None:
        if not self.closed and self.leave:
            self._write()
        self.closed = True

    def _write(self) -> None:
        self.last_line = time.monotonic()
        if not self.enabled:
            return
        done = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        shown = "".join(f", {k}={v}" for k, v in self.postfix.items())
        elapsed = self.last_line - self.start
        self.stream.write(f"{self.desc}: {done}{shown} ({elapsed:.0f} s)\n")
        self.stream.flush()
