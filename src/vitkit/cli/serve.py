"""``vitkit serve``: a model behind HTTP (vitkit.serve; the ``serve`` extra)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from vitkit.cli.engines import add_engine_options, inference_runner
from vitkit.cli.options import (
    add_checkpoint,
    add_command,
    loading,
    non_negative_float,
    positive_int,
    set_threads,
)
from vitkit.cli.serve_bounds import (
    DEFAULT_MAX_IMAGES,
    add_bound_options,
    check_ranges,
    request_limits,
    server_options,
    show_access_log,
)
from vitkit.errors import VitkitError
from vitkit.serve.workers import http_url

KEY_VARIABLE = "VITKIT_API_KEY"


def port_number(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535 (0: any free one), got {n}")
    return n


def wait_ms(text: str) -> float:
    """--max-wait-ms: 0 .. MAX_WAIT_MS_CAP (a request may wait that long for company)."""
    from vitkit.serve.admission import MAX_WAIT_MS_CAP

    v = non_negative_float(text)
    if v > MAX_WAIT_MS_CAP:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_WAIT_MS_CAP:,.0f} ms (a lone request waits that long for others), "
            f"got {text}"
        )
    return v


def host_name(text: str) -> str:
    if not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"not a host name or address: {text!r}")
    return text


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "serve",
        "serve a model over HTTP: top-k labels, attention maps, a page to try it",
        "Serves SOURCE (a run, a checkpoint in any format, an engine directory of 'vitkit "
        "export --int8', or a .pt2 package of 'vitkit export --format pt2') with the answers "
        "of 'vitkit predict': POST /v1/classify (top-k of one or several images, batched "
        "across clients), POST /v1/explain (attention rollout and per-layer maps), GET "
        "/v1/info, GET /health (liveness), GET /ready (readiness), GET /metrics (Prometheus), "
        "GET /openapi.json and a page at GET /. Listens on 127.0.0.1 unless --host says "
        "otherwise, once the model is loaded and warmed up; SIGTERM or Ctrl-C drains the "
        "requests in flight and exits 0. Needs pip install '.[serve]' in vitkit's clone.",
    )
    add_checkpoint(p, positional=True)
    g = p.add_argument_group("server")
    g.add_argument(
        "--host",
        type=host_name,
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1)",
    )
    g.add_argument("--port", type=port_number, default=8000, help="port (0: any free one)")
    g.add_argument(
        "--api-key",
        default=None,
        help="required on every route but /health, /ready and /metrics, as 'Authorization: "
        f"Bearer KEY' or 'X-API-Key: KEY' (default: the {KEY_VARIABLE} environment variable; "
        "none: open)",
    )
    g.add_argument("--access-log", action="store_true", help="print a line per request")
    g.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="model processes: one front process owns the port, HTTP, the queue and the "
        "batching, and N model processes pull batches from it, each with its own model and "
        "--threads (then the CPUs / N unless given); one that dies is started again and its "
        "batch goes to another (default 1: one process does everything)",
    )
    g.add_argument(
        "--worker-mode",
        choices=["front", "socket"],
        default="front",
        help="with --workers N > 1: front (default: one front, N model processes) or socket "
        "(N whole servers sharing the port, each with its own queue: a worker's death loses "
        "the requests it held)",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="load and warm up the model, say what would be served, and exit",
    )
    g = p.add_argument_group("batching")
    g.add_argument(
        "--max-batch", type=positive_int, default=32, help="images per forward (default 32)"
    )
    g.add_argument(
        "--max-wait-ms",
        type=wait_ms,
        default=5.0,
        help="how long the first image of a forward waits for others on their way (default 5, "
        "at most 10,000)",
    )
    g.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="a NaFlex model (a checkpoint, or its engine exported with --dynamic-size): each "
        "image at its own aspect ratio with at most N patches (no crop), a forward's images "
        "packed and padded to N, as predict --max-seq-len runs them (default: the length a "
        "NaFlex run trained with)",
    )
    g = p.add_argument_group(
        "admission (a request refused or given up gets 503, Retry-After and one line)"
    )
    g.add_argument(
        "--max-queue",
        type=positive_int,
        default=256,
        help="images waiting for a forward; a request that would overfill it is refused at "
        "once (default 256)",
    )
    g.add_argument(
        "--timeout",
        type=non_negative_float,
        default=30.0,
        help="seconds a request may take from its arrival: refused at once where recent "
        "forwards say it would take longer, dropped before its forward when it passes "
        "(default 30; 0: no deadline)",
    )
    g.add_argument(
        "--drain-timeout",
        type=non_negative_float,
        default=30.0,
        help="on SIGTERM, seconds to answer what is in flight; what still waits then gets "
        "503 and the server exits (default 30)",
    )
    g = p.add_argument_group("limits (a request over one gets 413 and one line)")
    g.add_argument(
        "--max-body", type=positive_int, default=20_000_000, help="bytes (default 20,000,000)"
    )
    g.add_argument(
        "--max-pixels",
        type=positive_int,
        default=25_000_000,
        help="pixels of one image, checked before it is decoded (default 25,000,000)",
    )
    g.add_argument(
        "--max-images",
        type=positive_int,
        default=None,
        help=f"images per request (default {DEFAULT_MAX_IMAGES}, or --max-queue where smaller)",
    )
    add_bound_options(g)
    add_engine_options(p, fast=True, precision=True)
    for action in p._actions:  # auto is serve's default
        if action.dest == "precision":
            action.default = "auto"
            rest = str(action.help).split("; default fp32")[0].split("; ", 1)[1]
            action.help = (
                "auto (default): bf16 where this CPU multiplies bf16 natively (AVX512-BF16 or "
                "AMX) and the model's bf16 top-1 agrees with fp32's on 32 synthetic images "
                f"measured at start, else fp32 (the ready line and /v1/info say which and why); "
                f"{rest}; a model of 'vitkit export' runs at its own"
            )
    p.add_argument(
        "--threads",
        type=positive_int,
        help="torch intra-op threads (default: 1 where a forward of --max-batch images is under "
        "1 GFLOP, else PyTorch's choice)",
    )
    p.set_defaults(func=cmd_serve)


def served_model(args: argparse.Namespace) -> Any:
    """The model of ``args.ckpt`` as the server runs it: classification by ``--engine`` /
    ``--fast`` (what ``vitkit predict`` runs) at ``--precision`` (``auto``: decided by
    :func:`vitkit.engines.runner`, :mod:`vitkit.engines.auto_precision`), explanations by the
    PyTorch model where there is one."""
    from vitkit.serve.served_model import ServedModel

    model, ckpt, engine, precision, attention, why, no_attention = _load(args)
    seq = served_sequence(args, ckpt)
    print(f"precision: {precision} ({why})")
    return ServedModel(
        model,
        ckpt,
        engine=engine,
        precision=precision,
        attention_model=attention,
        no_attention_reason=no_attention,
        precision_why=why,
        max_seq_len=seq,
    )


def served_sequence(args: argparse.Namespace, ckpt: Any) -> int | None:
    """``--max-seq-len`` (checked to fit), else a NaFlex run's own, said in one line (as
    predict takes it); None: the model's fixed size."""
    from vitkit.cli.evaluate import run_max_seq_len

    if args.max_seq_len is not None and not getattr(ckpt.model_config, "naflex", False):
        return args.max_seq_len  # (refused by ServedModel, naming the model's size)
    return run_max_seq_len(args.max_seq_len, ckpt)


def _load(args: argparse.Namespace) -> tuple[Any, ...]:
    """(model, checkpoint, engine, precision, attention model, why that precision, why no
    attention) of ``args.ckpt`` at ``args.precision``."""
    from vitkit.engines.backends import EngineModel
    from vitkit.engines.bf16 import BF16Model
    from vitkit.engines.float8_inference import GPUModel
    from vitkit.engines.pt2_package import Pt2Model
    from vitkit.eval.checkpoint_eval import check_finite_weights
    from vitkit.models.vit import VisionTransformer

    run = inference_runner(args, args.ckpt, precision=args.precision, long_lived=True)
    model, ckpt = run.model, run.checkpoint
    print(run.line)
    chosen = run.precision_why or f"--precision {args.precision}"
    attention, why = None, ""
    if isinstance(model, Pt2Model):  # (compiled: no weights to check, no attention to give)
        why = (
            "a .pt2 package (AOTInductor) gives no attention maps: serve the fp32 checkpoint "
            "it was exported from for /v1/explain"
        )
        return model, ckpt, model.engine, model.precision, None, chosen, why
    if isinstance(model, (EngineModel, BF16Model, GPUModel)):
        engine, precision = model.engine, model.precision
        if ckpt.format == "vitkit-engine":
            why = (
                f"the {engine} engine ({precision}) gives no attention maps: serve the fp32 "
                "checkpoint it was exported from (--engine torch) for /v1/explain"
            )
        elif run.reference is not None:  # (the fp32 model auto measured bf16 against)
            attention = run.reference
        else:  # a checkpoint: its fp32 PyTorch model explains
            from vitkit.checkpoints import load_model

            attention, _ = load_model(args.ckpt, **loading(args))
            attention.eval()
    else:
        engine, precision = "torch", "fp32"
        check_finite_weights(model, ckpt)
        attention = model
    if attention is not None and not isinstance(attention, VisionTransformer):
        why = f"{ckpt.model_config.short_name} is not a Vision Transformer: it has no attention"
        attention = None
    return model, ckpt, engine, precision, attention, chosen, why


def server_settings(args: argparse.Namespace, key: str | None) -> Any:
    """The server's Settings from the command line (limits, batching, admission, key)."""
    from vitkit.serve.admission import Admission
    from vitkit.serve.http_app import Settings

    limits = request_limits(args)
    admission = Admission(args.max_queue, args.timeout or None, args.drain_timeout)
    return Settings(limits, args.max_batch, args.max_wait_ms, key, admission)


def cmd_serve(args: argparse.Namespace) -> int:
    from vitkit.serve import require_serve

    _, uvicorn = require_serve()  # the missing extra first, before loading any weights

    set_threads(args.threads)
    key = args.api_key if args.api_key is not None else os.environ.get(KEY_VARIABLE)
    if key is not None and not key.strip():
        raise VitkitError(f"the API key is empty (--api-key or {KEY_VARIABLE})")
    if key is not None and key != key.strip():  # HTTP strips them from headers: never matched
        raise VitkitError(f"the API key starts or ends with a space (--api-key or {KEY_VARIABLE})")
    request_limits(args)  # (bounds that contradict each other refused before any weights)
    check_ranges(args)  # (and those the machine cannot hold)
    worker = getattr(args, "worker", None)  # (index, socket, pipe) in a worker of --workers
    if key is None and worker is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"vitkit: warning: listening on {args.host} without an API key: anyone who can "
            f"reach it can use it (--api-key or {KEY_VARIABLE})",
            file=sys.stderr,
        )
    if args.workers > 1 and args.worker_mode == "socket" and worker is None and not args.dry_run:
        from vitkit.serve.workers import supervise

        return supervise(args, cmd_serve)
    sock = None
    if worker is None and not args.dry_run:  # a busy port said before the model loads
        from vitkit.serve.workers import bind

        sock = bind(args.host, args.port)
    try:
        return _serve(args, key, worker, sock, uvicorn)
    finally:
        if sock is not None:
            sock.close()


def check_batch_memory(served: Any, max_batch: int, max_queue: int | None = None) -> None:
    """--max-batch refused where one forward of that many images would need more than half
    the machine's memory (one line, before the warm-up tries it); --max-queue where that many
    waiting images (each the model's float input) would."""
    from vitkit.serve.served_model import forward_bytes

    cfg = served.ckpt.model_config
    seq = getattr(served, "max_seq_len", None)
    need = forward_bytes(cfg, max_batch, seq)
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # (not on Linux)
        return
    if need > memory / 2:
        most = max(1, int(memory / 2 // forward_bytes(cfg, 1, seq)))
        raise VitkitError(
            f"--max-batch {max_batch:,}: one forward of {cfg.short_name} would hold about "
            f"{need / 1e9:,.1f} GB; this machine has {memory / 1e9:,.1f} GB (at most {most:,} "
            "images a forward)"
        )
    (h, w) = cfg.image_size
    pixels, what = h * w, f"{h}x{w} images"
    if seq is not None:  # (a NaFlex model's: up to max_seq_len patches each)
        pixels, what = seq * cfg.patch_size[0] * cfg.patch_size[1], f"images of {seq:,} patches"
    image = 4 * cfg.in_chans * pixels
    if max_queue is not None and max_queue * image > memory / 2:
        raise VitkitError(
            f"--max-queue {max_queue:,}: that many waiting {what} of {cfg.short_name} "
            f"would hold about {max_queue * image / 1e9:,.1f} GB; this machine has "
            f"{memory / 1e9:,.1f} GB (at most {int(memory / 2 // image):,} images waiting)"
        )


def _serve(args: argparse.Namespace, key: str | None, worker: Any, sock: Any, uvicorn: Any) -> int:
    pool = None
    if args.workers > 1 and args.worker_mode == "front" and not args.dry_run:
        pool = start_model_processes(args)  # (they load and warm up: the front holds no weights)
        served = pool.served
    else:
        served = process_model(args)
        if args.threads is None:
            small_forward_threads(served, args.max_batch, apply=not args.dry_run)
        served.warm_up(args.max_batch)
    settings = server_settings(args, key)
    try:
        return _run(args, key, worker, sock, uvicorn, served, settings, pool)
    finally:
        if pool is not None:  # (stopped already where the server ran: killed if not)
            pool.stop(0)


def process_model(args: argparse.Namespace) -> Any:
    """The served model of ``args`` (:func:`served_model`), --max-batch and --max-queue
    checked against the machine's memory before any warm-up (a model process's loader)."""
    served = served_model(args)
    check_batch_memory(served, args.max_batch, args.max_queue)
    return served


def small_forward_threads(served: Any, max_batch: int, apply: bool = True) -> None:
    """One intra-op thread where a forward of ``max_batch`` images is too small to split
    (:func:`vitkit.serve.served_model.forward_threads`), said in one line (``apply``: set it,
    not only say it)."""
    import torch

    from vitkit.registry.counts import count_flops
    from vitkit.serve.served_model import forward_threads

    cfg = served.ckpt.model_config
    threads = forward_threads(cfg, max_batch)
    if threads is not None:
        if apply:
            torch.set_num_threads(threads)
        gflop = count_flops(cfg) * max_batch / 1e9
        print(
            f"threads: {threads} a forward (one of {max_batch} images is {gflop:.2g} GFLOP, too "
            "small to split; --threads N to choose)",
            flush=True,
        )


def start_model_processes(args: argparse.Namespace) -> Any:
    """The model processes of ``--workers N`` (front mode), ready: the first loads the model
    (deciding ``--precision auto``), the others then load it at the precision it chose."""
    import copy

    from vitkit.serve.front import ModelPool
    from vitkit.serve.workers import cpus

    child = copy.copy(args)
    child.threads = args.threads or max(1, cpus() // args.workers)
    child.threads_auto = args.threads is None  # (one thread where a forward is small)

    def decide(first: argparse.Namespace, facts: dict[str, Any]) -> argparse.Namespace:
        chosen = copy.copy(first)
        if first.precision == "auto" and facts["served"].precision in ("fp32", "bf16"):
            chosen.precision = facts["served"].precision  # (measured once, in the first)
        chosen.max_seq_len = facts["served"].max_seq_len  # (said once, in the first)
        return chosen

    print(f"starting {args.workers} model processes, {child.threads} threads each", flush=True)
    return ModelPool(child, process_model, args.workers, decide)


def _run(
    args: argparse.Namespace,
    key: str | None,
    worker: Any,
    sock: Any,
    uvicorn: Any,
    served: Any,
    settings: Any,
    pool: Any,
) -> int:
    from vitkit.serve.http_app import build_app

    limits = settings.limits
    make: Any = None
    if pool is not None:
        import functools

        from vitkit.serve.front import FrontBatcher

        make = functools.partial(FrontBatcher, pool)
    shared = getattr(args, "metrics_dir", None) if worker else None
    app = build_app(served, settings, shared, make) if make else build_app(served, settings, shared)
    if pool is not None:
        app.state.metrics.processes = pool.stats
    what = (
        f"{served.describe()['model']['name']} from {args.ckpt}: batches of up to "
        f"{args.max_batch} images (waiting up to {args.max_wait_ms:g} ms), bodies up to "
        f"{limits.max_body_bytes:,} bytes, {limits.max_images} images of up to "
        f"{limits.max_pixels:,} pixels a request, at most {args.max_queue} images waiting, "
        f"{f'{args.timeout:g} s' if args.timeout else 'no'} deadline, API key "
        f"{'required' if key else 'not required'}"
    )
    if args.dry_run:
        print(f"would serve {what} on {http_url(args.host, args.port)}")
        from vitkit.cli.serve_memory import memory_line, weights_mb

        print(memory_line(args, limits, weights_mb(served)))
        return 0
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=args.access_log,
        lifespan="on",
        **server_options(args),
        timeout_graceful_shutdown=args.drain_timeout + 0.5,  # (to send the 503s)
    )
    show_access_log(args)
    server = _draining_server()(config)
    server.announce = f"serving {what}"
    server.batcher, server.drain_timeout = app.state.batcher, args.drain_timeout
    server.worker = worker
    freeze_startup_objects()
    try:
        server.run(sockets=[sock] if worker is None else [worker[1]])
    except SystemExit:  # uvicorn could not listen (the address is taken or unknown): it said why
        raise VitkitError(f"could not listen on {args.host}:{args.port}") from None
    if not server.started:
        raise VitkitError(f"could not listen on {args.host}:{args.port}")
    refused = app.state.metrics.dropped["shutdown"]
    late = f" ({refused} after --drain-timeout with 503)" if refused else ""
    print(f"stopped: every request in flight was answered{late}", flush=True)
    if not getattr(app.state, "forward_ended", True):
        print("stopped: a forward still ran after --drain-timeout; its requests were answered 503")
    sys.stdout.flush()
    sys.stderr.flush()
    # nothing is left to write: the interpreter's teardown (PyTorch, the decode processes'
    # fork server) took 2-3 s more on a loaded host, past a container's stop timeout; and a
    # forward still running after --drain-timeout is in native code, not waited for
    os._exit(0)


def freeze_startup_objects() -> None:
    """What the start made (the model, PyTorch's, FastAPI's and uvicorn's modules: about
    200,000 objects with the MNIST model) moved out of the garbage collector's reach: each full
    collection walked them all, 260 ms on a loaded 2-vCPU host with every request in flight
    waiting (the MNIST model's 99th percentile at 64 clients was that pause)."""
    import gc

    gc.collect()
    gc.freeze()


def _draining_server() -> Any:
    import asyncio

    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server; SIGTERM and Ctrl-C stop accepting, answer what is in flight and
        return (uvicorn would then re-raise the signal: the process would not exit 0)."""

        announce = ""
        batcher: Any = None
        drain_timeout = 30.0
        worker: Any = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop without waiting
            else:
                self.should_exit = True

        async def shutdown(self, sockets: Any = None) -> None:
            if self.batcher is not None:  # run what waits now; refuse it after the timeout
                self.batcher.drain(self.drain_timeout)
            await super().shutdown(sockets)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.worker is not None:  # its supervisor says ready
                index, _, conn = self.worker
                print(f"{self.announce}\nworker {index} listening (pid {os.getpid()})", flush=True)
                conn.send("ready")
                self.heartbeat = asyncio.get_running_loop().create_task(self._beat(conn))
            elif self.started and self.servers:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                print(f"{self.announce}\nready: {http_url(host, port)}/", flush=True)
                sys.stdout.flush()

        async def _beat(self, conn: Any) -> None:
            from vitkit.serve.workers import HEARTBEAT_S

            while True:  # from the event loop: a stalled loop stops beating
                await asyncio.sleep(HEARTBEAT_S)
                try:
                    conn.send("beat")
                except OSError:  # the supervisor is gone: stop too
                    self.should_exit = True
                    return

    return DrainingServer
