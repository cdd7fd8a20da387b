"""The ``vitkit`` command line: parsing and wiring only; the work is the library's.

One module per command group (``train``, ``evaluate``, ``explain``, ``checkpoint``, ``data``,
``serve``), the option groups they share in ``options``. Heavy imports happen inside the
commands, so ``vitkit --help`` is instant and thread settings (``OMP_WAIT_POLICY``) are in
place before PyTorch starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.cli import checkpoint, data, evaluate, explain, serve, study, train
from vitkit.cli.options import Parser
from vitkit.engines.allocator import keep_freed_memory
from vitkit.errors import RANK_ERRORS_ENV, VitkitError

EPILOG = "Run 'vitkit COMMAND --help' for a command's options."


def build_parser() -> argparse.ArgumentParser:
    from vitkit import __version__

    parser = Parser(
        prog="vitkit",
        description="The Vision Transformer of 'An Image is Worth 16x16 Words': train, "
        "evaluate and use paper-faithful ViTs.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    train.add_commands(sub)  # train, finetune, pretrain
    study.add_commands(sub)  # study data-scale, ...
    evaluate.add_commands(sub)  # eval, fewshot, predict
    explain.add_commands(sub)  # explain, analyze
    checkpoint.add_commands(sub)  # models, convert, inspect, export, consolidate
    data.add_commands(sub)  # shards
    serve.add_commands(sub)  # serve
    return parser


def _one_line(e: BaseException) -> str:
    """The user-facing line of an error, also when a DataLoader worker wrapped it."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "VitkitError: " in line:
            return line.split("VitkitError: ", 1)[1]
    return lines[-1] if lines else type(e).__name__


def _format_warning(
    message: Any, category: Any, filename: Any, lineno: Any, line: Any = None
) -> str:
    return f"vitkit: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    # Idle OpenMP threads sleep instead of spinning: on small shared machines spinning threads
    # stall each other for seconds. Must be set before PyTorch starts its thread pool.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Freed activations stay in the heap for the next call instead of being unmapped and
    # faulted in again (vitkit.engines.allocator: B/16 batch-32 inference 1.10-1.23x faster). Must
    # be set before PyTorch loads.
    keep_freed_memory()
    saved_format, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not as Python's message at exit
        return code
    except BrokenPipeError:  # 'vitkit ... | head' closed the pipe: end quietly, as cat does
        _quiet_closed_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a command ended by a closed pipe
    finally:
        warnings.formatwarning = saved_format


def _quiet_closed_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so that Python's flush at exit does not
    print a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout has no file descriptor (captured): nothing to flush
        pass


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help and --version end here; a wrong option printed its line
        if not e.code:
            raise
        return int(e.code)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not args.command:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except VitkitError as e:
        _refuse(_one_line(e))
        return 2
    except KeyboardInterrupt:
        print("vitkit: interrupted", file=sys.stderr)
        return 130
    except PermissionError as e:  # a read-only or immutable place met past the checks up front
        where = e.filename if e.filename is not None else "a file"
        print(f"vitkit: error: {where}: permission denied ({e.strerror})", file=sys.stderr)
        return 2
    except Exception as e:  # a DataLoader worker re-raises our errors wrapped in its own type
        from vitkit.output_files import no_room_code

        # a full disk met by a writer outside vitkit.output_files.writing
        if isinstance(e, OSError) and e.filename is not None and no_room_code(e) is not None:
            _refuse(f"{e.filename}: {e.strerror}: free space or choose another destination")
            return 2
        if "VitkitError: " in str(e):
            _refuse(_one_line(e))
            return 2
        raise


def _refuse(message: str) -> None:
    """The one error line; under `--nproc-per-node` each process hands it to the launcher,
    which prints the first once (instead of once per process)."""
    errors, rank = os.environ.get(RANK_ERRORS_ENV), os.environ.get("RANK")
    if errors and rank is not None and Path(errors).is_dir():
        (Path(errors) / f"rank{int(rank):05d}.txt").write_text(message + "\n")
        return
    print(f"vitkit: error: {message}", file=sys.stderr)
