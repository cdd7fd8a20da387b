"""Limits below the application: the request head (431), its read time (408) and the parts
of a multipart body, checked before the work they would cost.

uvicorn's httptools parser keeps a header however long it grows and waits for a request's
bytes however slowly they come; :class:`BoundedHttp` is that protocol with a bound on the
request line and headers (bytes and count: 431, the connection closed) and on the time from
a request's first byte (or the connection's opening) to its last (408: a client sending a
byte a second holds no connection for long). Starlette's multipart parser bounds the files
and fields of a form but not a part's headers: :func:`check_multipart` reads the buffered
body's part heads first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from vitkit.errors import VitkitError
from vitkit.serve.request_images import RequestError

PART_HEAD_BYTES = 16_384  # one multipart part's headers
PART_HEADERS = 16  # header lines of one part
# After a refused head the connection stays half open this long, what still arrives dropped:
# closed at once with unread bytes, it is reset, and a client still sending (a 20 MB header)
# never read its 431.
LINGER_S = 1.0
# Keys of a request's ASGI scope: the time.monotonic() its first byte arrived, a callable
# telling whether its connection has closed (the client gone), and the server's open
# connections (uvicorn's set: a forward need not wait for a request none of them can send).
FIRST_BYTE = "vitkit.first_byte"
GONE = "vitkit.gone"
CONNECTIONS = "vitkit.connections"


@dataclass(frozen=True)
class HttpLimits:
    """The request head and its read time (seconds; ``None``: no limit)."""

    max_header_bytes: int = 16_384
    max_headers: int = 64
    read_timeout: float | None = 30.0


def _reason(status: int) -> bytes:
    from http import HTTPStatus

    return f"{status} {HTTPStatus(status).phrase}".encode()


def bounded_http(limits: HttpLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol under ``limits`` (uvicorn.Config's ``http``)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # (httptools is part of the serve extra)
        raise VitkitError(
            "vitkit serve needs httptools (its bounded HTTP parser): "
            "pip install '.[serve]' in vitkit's clone"
        ) from None

    class BoundedHttp(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._refused = False
            self._in_head = True  # reading a request's line and headers
            self._head_bytes = 0  # of the request line and headers so far
            self._raw_head = 0  # bytes received while a head was incomplete
            self._timer: asyncio.TimerHandle | None = None
            self._started = False  # a byte of the current request arrived
            self._heads = 0  # request heads read on this connection
            self._arm()

        def _arm(self) -> None:
            if limits.read_timeout is not None and self._timer is None:
                self._timer = self.loop.call_later(limits.read_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            self._timer = None
            if not self._started:  # an idle connection: close it without a word
                self._refused = True
                self.transport.close()
                return
            what = f"the request did not arrive within {limits.read_timeout:g} s (--read-timeout)"
            self._refuse(408, what)

        def _refuse(self, status: int, message: str) -> None:
            import json

            self._refused = True
            self._disarm()
            if self.transport.is_closing():
                return
            body = json.dumps({"error": message}).encode()
            head = [
                b"HTTP/1.1 " + _reason(status),
                b"content-type: application/json",
                b"content-length: " + str(len(body)).encode(),
                b"connection: close",
            ]
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            if self.transport.can_write_eof():  # (the answer, then end of stream)
                self.transport.write_eof()
                self.transport.resume_reading()  # (what arrives is dropped: data_received)
                self.loop.call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()

        def _head_too_large(self) -> None:
            self._refuse(
                431,
                f"the request line and headers are over {limits.max_header_bytes:,} bytes or "
                f"{limits.max_headers} headers, the most the server reads "
                "(--max-header-bytes, --max-headers)",
            )

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self._in_head:
                if not self._started:  # the request's first byte: its deadline counts from here
                    self._first_byte = time.monotonic()
                self._started = True
                self._arm()
            heads, in_head = self._heads, self._in_head
            super().data_received(data)
            if in_head and self._in_head and heads == self._heads and not self._refused:
                self._raw_head += len(data)
                if self._raw_head > limits.max_header_bytes:
                    self._head_too_large()

        def on_url(self, url: bytes) -> None:
            self._head_bytes += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_bytes += len(name) + len(value) + 4
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads += 1
            if self._refused:
                return
            # when the request began arriving, and whether its client has gone since (its
            # connection closed): read before a forward, no task watching each request
            self.scope[FIRST_BYTE] = getattr(self, "_first_byte", time.monotonic())  # type: ignore[literal-required]
            self.scope[GONE] = self.transport.is_closing  # type: ignore[literal-required]
            self.scope[CONNECTIONS] = self.server_state.connections  # type: ignore[literal-required]
            if self._head_bytes > limits.max_header_bytes or len(self.headers) > limits.max_headers:
                self._head_too_large()
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._disarm()
            self._in_head, self._started = True, False
            self._head_bytes = self._raw_head = 0
            super().on_message_complete()

    return BoundedHttp


def check_multipart(body: bytes, content_type: str, max_parts: int) -> None:
    """Refuse a multipart body with more than ``max_parts`` parts or a part whose headers
    exceed :data:`PART_HEAD_BYTES` bytes or :data:`PART_HEADERS` lines (413), before
    Starlette's parser reads it."""
    boundary = b""
    for param in content_type.split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "boundary":
            boundary = value.strip().strip('"').encode("latin-1", "replace")
    if not boundary:
        return  # (the parser says what is wrong)
    delimiter = b"--" + boundary
    parts, at = 0, body.find(delimiter)
    while at >= 0:
        at += len(delimiter)
        if body[at : at + 2] == b"--":
            return  # the closing delimiter
        parts += 1
        if parts > max_parts:
            raise RequestError(
                413,
                f"multipart body: more than {max_parts} parts (files and fields: twice "
                "--max-images)",
            )
        end = body.find(b"\r\n\r\n", at, at + PART_HEAD_BYTES + 4)
        if end < 0 and len(body) - at > PART_HEAD_BYTES:
            raise RequestError(
                413, f"multipart body: part {parts}'s headers are over {PART_HEAD_BYTES:,} bytes"
            )
        if end >= 0 and body.count(b"\r\n", at, end) > PART_HEADERS:
            raise RequestError(
                413, f"multipart body: part {parts} has more than {PART_HEADERS} header lines"
            )
        at = body.find(delimiter, at if end < 0 else end)


def quiet_multipart() -> None:
    """python-multipart logs what it skips in a malformed body; without a handler Python
    printed those as bare lines on the server's output. The client gets its own answer."""
    for name in ("python_multipart", "multipart"):  # (its name before 0.0.13, and now)
        logging.getLogger(name).addHandler(logging.NullHandler())
        logging.getLogger(name).propagate = False
