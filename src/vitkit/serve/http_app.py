"""The HTTP application: routes, limits, the API key and one-line JSON errors (FastAPI).

Every request passes :class:`Guard` first (an ASGI middleware): the API key where one is set
(every route but the probes ``/health`` and ``/ready`` and the scrape ``/metrics``), the body
size (``Content-Length`` checked before a byte is read; a body without one is read only up to
the limit), the counters of ``/metrics``. The routes take images only from the body: no file
path or URL is ever read from a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal
from urllib.parse import parse_qs

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vitkit.serve.admission import Admission, ClientGone, Dropped, unless_gone
from vitkit.serve.batcher import Batcher
from vitkit.serve.decode_process import ImageDecoder
from vitkit.serve.limits import (
    CONNECTIONS,
    FIRST_BYTE,
    GONE,
    check_multipart,
    quiet_multipart,
)
from vitkit.serve.prometheus import CONTENT_TYPE, Metrics
from vitkit.serve.served_model import Limits, RequestError, ServedModel

ROUTES = (
    "/", "/health", "/ready", "/metrics", "/openapi.json", "/v1/info", "/v1/classify",
    "/v1/explain",
)  # fmt: skip
# Routes open without the API key: the probes and the Prometheus scrape (counters only)
OPEN_ROUTES = ("/health", "/ready", "/metrics")
# /ready answers 503 this long after a request was refused for load
SHED_WINDOW_S = 2.0
KEY_HINT = "send it as 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"


@dataclass(frozen=True)
class Settings:
    """How the server batches, what a request may hold, the API key (None: no key)."""

    limits: Limits = Limits()
    max_batch: int = 32
    max_wait_ms: float = 5.0
    api_key: str | None = None
    admission: Admission = Admission()


# -- the answers' shapes (the OpenAPI schema at /openapi.json) ----------------------------


class Label(BaseModel):
    label: str
    index: int
    prob: float


class ModelInfo(BaseModel):
    name: str
    source: str
    classes: int


class Answer(BaseModel):
    model: ModelInfo
    engine: str
    precision: str
    preprocess: dict[str, Any]


class ImageResult(BaseModel):
    top_k: list[Label]


class ClassifyAnswer(Answer):
    results: list[ImageResult]


class ExplainAnswer(Answer):
    top_k: list[Label]
    grid: list[int]
    layers: int
    heads: int
    rollout: list[list[float]]
    rollout_png: str
    input_png: str
    layer_maps: list[list[list[list[float]]]] | None = None
    rollout_maps: list[list[list[float]]] | None = None
    query_patch: int | None = None
    patch_maps: list[list[list[list[float]]]] | None = None


class ErrorAnswer(BaseModel):
    error: str


IMAGE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "image/*": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "image": {"type": "array", "items": {"type": "string", "format": "binary"}}
                    },
                }
            },
        },
    }
}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorAnswer, "description": what}
    for code, what in {
        400: "a malformed request (one line says what)",
        401: "the API key is missing or wrong",
        409: "the engine gives no attention maps (explain)",
        413: "the body, an image's pixels or the images per request exceed a limit",
        415: "not an image in a format the server reads",
        503: "busy (the queue is full or the request's deadline passed) or stopping: "
        "retry after the seconds of Retry-After",
    }.items()
}


# A forward expected to take less than this runs on the event loop, not the model's thread
# (vitkit.serve.batcher: the hand-offs cost more than such a forward); /health waits at most
# this long behind one.
INLINE_FORWARD_MS = 5.0

# A request expected to wait less than this for its forward is not watched for its client
# leaving: at most this much work is done for a client already gone.
WATCH_AFTER_S = 0.25


# A request answered past FastAPI's router: (scope, body, receive, send) -> whether it was
Direct = Callable[[Scope, bytes, Receive, Send], Awaitable[bool]]
# The query of a classify request answered past the router (anything else goes through it)
SIMPLE_QUERY = re.compile(rb"(?:top_k=([1-9][0-9]{0,5}))?")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status)


class Guard:
    """API key, body size limit and metrics for every HTTP request (pure ASGI)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        metrics: Metrics,
        batcher: Batcher | None = None,
        direct: Direct | None = None,
        connections: list[Any] | None = None,
    ):
        self.app = app
        # the server's open connections (uvicorn's set), kept here from the first request's
        # scope where the bounded protocol put them
        self.connections = connections if connections is not None else []
        self.settings = settings
        self.metrics = metrics
        # answers a request itself where it can (a raw image to classify), past the router:
        # whether it did
        self.direct = direct
        self.body_bytes = 0  # bytes of request bodies held now, all requests together
        # requests whose body is still arriving: when a drain gives up (--drain-timeout) each
        # is answered 503 rather than cut off by the server's own shutdown (a 500 and a trace)
        self.receiving: set[asyncio.Task[Any]] = set()
        self.stopped = False
        if batcher is not None:
            batcher.on_closed.append(self._give_up_bodies)

    def _give_up_bodies(self) -> None:
        self.stopped = True
        for task in self.receiving:
            task.cancel()

    def _authorized(self, scope: Scope) -> bool:
        key = self.settings.api_key
        if key is None or scope["path"] in OPEN_ROUTES:
            return True
        given: list[bytes] = []  # (bytes as sent: a key beyond ASCII arrives as UTF-8)
        for name, value in scope["headers"]:
            if name == b"x-api-key":
                given.append(value.strip())
            elif name == b"authorization" and value[:7].lower() == b"bearer ":
                given.append(value[7:].strip())
        if scope["path"] == "/" and scope.get("query_string"):  # the page: ?key=KEY
            query = parse_qs(scope["query_string"].decode("latin-1")).get("key", [])
            given += [g.encode() for g in query]
        return any(hmac.compare_digest(g, key.encode()) for g in given)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.connections and CONNECTIONS in scope:
            self.connections.append(scope[CONNECTIONS])
        start = time.perf_counter()
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status: list[int | str] = ["disconnected"]

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        # its --timeout starts at its first byte where the bounded protocol saw it
        scope.setdefault("state", {})["arrival"] = scope.get(FIRST_BYTE, time.monotonic())
        counted = scope["path"] != "/metrics"  # (a scrape does not count itself)
        self.metrics.in_flight += counted
        try:
            await self._handle(scope, receive, send_counted)
        finally:
            self.metrics.in_flight -= counted
            self.metrics.request_done(route, status[0], time.perf_counter() - start)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.settings.limits.max_body_bytes
        if not self._authorized(scope):
            await _error(401, f"missing or wrong API key: {KEY_HINT}")(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                await _error(400, "Content-Length is not a number")(scope, receive, send)
                return
            if n > limit:
                too_big = f"the body is {n:,} bytes; the server takes at most {limit:,}"
                await _error(413, f"{too_big} (--max-body)")(scope, receive, send)
                return
        held = 0  # this request's share of self.body_bytes, given back however it ends
        try:
            chunks, size = [], 0
            while True:
                message = await self._receive(receive)
                if message is None:  # the drain gave up on it
                    self.metrics.request_dropped("shutdown")
                    stopping = (
                        "the server is stopping and this request's body had not arrived when "
                        "its drain timeout passed (--drain-timeout): send it elsewhere"
                    )
                    await _error(503, stopping)(scope, receive, send)
                    return
                if message["type"] == "http.disconnect":
                    return  # the client left while sending: nobody to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    too_big = f"the body is over {limit:,} bytes, the most the server takes"
                    await _error(413, f"{too_big} (--max-body)")(scope, receive, send)
                    return
                if self.body_bytes + len(chunk) > self.settings.limits.max_body_memory:
                    await self._busy(scope, receive, send)
                    return
                self.body_bytes += len(chunk)
                held += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            del chunks
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            if self.direct is not None and await self.direct(scope, body, receive, send):
                return
            await self.app(scope, replay, send)
        finally:
            self.body_bytes -= held

    async def _receive(self, receive: Receive) -> Message | None:
        """The body's next message; None where the drain gave up before it came."""
        if self.stopped:
            return None
        task = asyncio.current_task()
        if task is None:
            return await receive()
        self.receiving.add(task)
        try:
            return await receive()
        except asyncio.CancelledError:
            if not self.stopped:
                raise
            if hasattr(task, "uncancel"):  # (Python 3.11+: the task goes on, uncancelled)
                task.uncancel()
            return None
        finally:
            self.receiving.discard(task)

    async def _busy(self, scope: Scope, receive: Receive, send: Send) -> None:
        """503 + Retry-After: the bodies held by all requests are at --max-body-memory."""
        self.metrics.request_dropped("body_memory")
        memory = self.settings.limits.max_body_memory
        answer = _error(
            503, f"busy: the request bodies the server holds are at {memory:,} bytes "
            "(--max-body-memory); retry after the seconds of Retry-After",
        )  # fmt: skip
        answer.headers["Retry-After"] = "1"
        await answer(scope, receive, send)


async def _request_images(request: Request, limits: Limits) -> list[bytes]:
    """The images of a request: a raw body (one image), or every file of a multipart form."""
    ctype = request.headers.get("content-type", "")
    if not ctype.lower().startswith("multipart/form-data"):  # (media types: any letter case)
        return [await request.body()]
    check_multipart(await request.body(), ctype, 2 * limits.max_images)
    try:
        async with request.form(max_files=limits.max_images, max_fields=limits.max_images) as form:
            files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
            datas = [await f.read() for f in files]
    except HTTPException as e:
        many = "Too many" in str(e.detail)
        code = 413 if many else 400
        raise RequestError(code, f"multipart body: {e.detail} (--max-images)" if many else
                           f"multipart body: {e.detail}") from None  # fmt: skip
    if not datas:
        raise RequestError(400, "the multipart body holds no file (send images as files)")
    return datas


def build_app(
    served: ServedModel,
    settings: Settings,
    shared_metrics: str | None = None,
    make_batcher: Callable[..., Batcher] = Batcher,
) -> FastAPI:
    """The application serving ``served`` (the batcher starts and stops with it);
    ``shared_metrics``: the directory where the workers of ``--workers --worker-mode socket``
    publish their counters (/metrics answers their sum); ``make_batcher``: the batcher's class
    (the front's of ``--workers``: :class:`vitkit.serve.front.FrontBatcher` bound to its
    model processes)."""
    limits = settings.limits
    admission = settings.admission
    metrics: Metrics
    connections: list[Any] = []  # the server's open connections (Guard: from a request)

    def idle() -> int | None:
        """Open connections with no request in the server (None: not known)."""
        return len(connections[0]) - metrics.in_flight if connections else None

    batcher: Batcher = make_batcher(
        lambda images: list(served.probabilities(images)),
        max_batch=settings.max_batch,
        max_wait_ms=settings.max_wait_ms,
        max_queue=admission.max_queue,
        on_batch=lambda n, s: metrics.batch_done(n, s),
        on_abandoned=lambda n: metrics.images_abandoned(n),
        # requests in the server that the queue does not hold yet (arriving, decoding)
        others=lambda: metrics.in_flight - batcher.requests,
        inline_ms=INLINE_FORWARD_MS,
        idle=idle,
    )
    described = served.describe()  # (every answer names them; computed once)
    info = {"model": described["model"]["name"], "engine": served.engine}
    metrics = Metrics({**info, "precision": served.precision}, lambda: batcher.depth)
    page = resources.files("vitkit.serve").joinpath("page.html").read_text()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        if shared_metrics is not None:
            metrics.share(shared_metrics)
        yield
        app.state.forward_ended = await batcher.stop()
        decoder.close()
        with contextlib.suppress(OSError):  # (the last counts, for the scrapes still to come)
            metrics.publish()

    app = FastAPI(
        title="vitkit serve",
        version="1",
        summary="A Vision Transformer behind HTTP: top-k labels and where the model looks.",
        lifespan=lifespan,
        docs_url=None,  # (Swagger UI loads from a CDN; the schema is at /openapi.json)
        redoc_url=None,
    )
    app.state.batcher, app.state.metrics = batcher, metrics  # (drained on SIGTERM)

    def refusal(e: Exception) -> JSONResponse:
        """The one-line answer to a request refused (4xx), given up (503) or failed (500)."""
        if isinstance(e, RequestError):
            return _error(e.status, e.message)
        if isinstance(e, Dropped):
            metrics.request_dropped(e.reason)
            answer = _error(503, e.message)
            answer.headers["Retry-After"] = e.retry_after_header
            return answer
        return _error(500, f"internal error: {type(e).__name__}: {e}")

    @app.exception_handler(RequestError)
    async def refused(_: Request, e: RequestError) -> JSONResponse:
        return refusal(e)

    @app.exception_handler(Dropped)
    async def dropped(_: Request, e: Dropped) -> JSONResponse:
        return refusal(e)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "query")
        return _error(400, f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(Exception)
    async def failed(_: Request, e: Exception) -> JSONResponse:
        return refusal(e)

    decoder = ImageDecoder(served, limits, lambda limit: metrics.decode_stopped(limit))
    app.state.decoder = decoder
    quiet_multipart()

    def deadline_of(scope: Scope) -> float | None:
        arrival = scope.get("state", {}).get("arrival", time.monotonic())
        return None if admission.timeout is None else arrival + admission.timeout

    async def prepare(request: Request, data: bytes, what: str) -> Any:
        return await decoder.prepare(data, what, deadline_of(request.scope))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Ready: the model is loaded and warmed up (the server listens only then)."""
        return {"status": "ready", **served.describe()}

    @app.get("/v1/info")
    async def info_route() -> dict[str, Any]:
        """The model, engine, precision and why that precision, and preprocessing."""
        info = {**served.describe(), "precision_why": served.precision_why}
        if metrics.processes is not None:  # (--workers: each model process and its state)
            info["model_processes"] = metrics.processes()
        return info

    @app.get("/ready", responses={503: {"model": ErrorAnswer, "description": "not ready"}})
    async def ready() -> JSONResponse:
        """Ready for more traffic: 503 while the server drains (SIGTERM), while no model
        process can serve (--workers) or while it sheds load (a request refused for load
        within the last 2 s). Liveness is /health."""
        if batcher.draining:
            why = "draining: the server is stopping"
        elif down := batcher.unavailable():  # (--workers: no model process can serve)
            why = down
        elif time.monotonic() - metrics.last_shed < SHED_WINDOW_S:
            why = f"shedding load: a request was refused as busy within {SHED_WINDOW_S:g} s"
        else:
            return JSONResponse({"status": "ready"})
        answer = _error(503, why)
        answer.headers["Retry-After"] = "1"
        return answer

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        """Prometheus text: requests by route and status, latency and batch-size histograms,
        queue depth, requests in flight."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post(
        "/v1/classify",
        response_model=ClassifyAnswer,
        responses=ERRORS,
        openapi_extra=IMAGE_BODY,
    )
    async def classify(
        request: Request, top_k: int = Query(5, ge=1, description="labels per image")
    ) -> JSONResponse:
        """Top-k labels of one image (the raw body) or several (multipart files, in order),
        batched with other clients' images."""
        datas = await _request_images(request, limits)  # (at most max_images: the form says)
        return await classified(request.scope, datas, top_k, request.receive)

    async def classified(
        scope: Scope, datas: list[bytes], k: int, receive: Receive
    ) -> JSONResponse:
        what = "the image" if len(datas) == 1 else "image {}"
        deadline = deadline_of(scope)
        images = [await decoder.prepare(d, what.format(i + 1), deadline)
                  for i, d in enumerate(datas)]  # fmt: skip
        wait = batcher.expected_wait(len(images)) + batcher.max_wait  # (gathering included)
        short = wait < WATCH_AFTER_S
        try:
            work = batcher.enqueue(images, deadline, scope.get(GONE))
            # a client that leaves is noticed (and its images dropped) where the wait is long
            # enough to matter; a watcher per request cost the MNIST model 12 % of its req/s
            probs = await (work if short else unless_gone(work, receive))
        except ClientGone:  # nobody to answer: nginx's "client closed request", never sent
            metrics.request_dropped("client_gone")
            return JSONResponse({"error": "the client left"}, status_code=499)
        results = [{"top_k": served.top_k(p[None], k)[0]} for p in probs]
        return JSONResponse({**described, "results": results})

    async def classify_direct(scope: Scope, body: bytes, receive: Receive, send: Send) -> bool:
        """A raw image POSTed to /v1/classify (with no query or only ``top_k=N``) answered
        here, past FastAPI's router, its middleware and its parameter parsing (a third of the
        event loop's time a request on the MNIST model); the same answer and the same one-line
        errors as the route. Whether it answered (anything else: the route answers it)."""
        if scope["method"] != "POST" or scope["path"] != "/v1/classify":
            return False
        query = SIMPLE_QUERY.fullmatch(scope.get("query_string", b""))
        ctype = next((v for n, v in scope["headers"] if n == b"content-type"), b"")
        if query is None or ctype[:19].lower() == b"multipart/form-data":
            return False
        k = int(query.group(1) or 5)
        try:
            answer = await classified(scope, [body], k, receive)
        except Exception as e:
            answer = refusal(e)
            if answer.status_code == 500:
                logging.getLogger("uvicorn.error").exception("Exception in /v1/classify")
        await answer(scope, receive, send)
        return True

    alive = JSONResponse({"status": "ready", **described})  # (/health's answer: always this)

    async def answer_direct(scope: Scope, body: bytes, receive: Receive, send: Send) -> bool:
        """/health (the probe: the answer built once) and a raw image to classify
        (:func:`classify_direct`) answered past FastAPI's router; whether it was."""
        if scope["path"] == "/health" and scope["method"] == "GET":
            await alive(scope, receive, send)
            return True
        return await classify_direct(scope, body, receive, send)

    @app.post(
        "/v1/explain",
        response_model=ExplainAnswer,
        responses=ERRORS,
        openapi_extra=IMAGE_BODY,
    )
    async def explain(
        request: Request,
        top_k: int = Query(5, ge=1, description="labels"),
        layers: bool = Query(False, description="also every layer's and head's map"),
        head_fusion: Literal["mean", "max", "min"] = Query("mean", description="rollout heads"),
        query_patch: int | None = Query(
            None, ge=0, description="also where this patch (row-major index) attends"
        ),
    ) -> JSONResponse:
        """Top-k and the attention rollout of one image over its patches (arrays and a PNG
        overlay), per-layer maps on request; refused (409) where the engine gives no
        attention."""
        served.check_explainable()
        datas = await _request_images(request, limits)
        if len(datas) != 1:
            raise RequestError(400, f"explain takes one image, got {len(datas)}")
        image = await prepare(request, datas[0], "the image")
        found = await batcher.call(
            served.explain, image, k=top_k, layers=layers, head_fusion=head_fusion,
            query_patch=query_patch,
        )  # fmt: skip
        return JSONResponse({**served.describe(), **found})

    app.add_middleware(
        Guard, settings=settings, metrics=metrics, batcher=batcher, direct=answer_direct,
        connections=connections,
    )  # fmt: skip
    return app
