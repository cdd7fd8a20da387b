"""The option groups that several commands share, each defined once (pip's ``cmdoptions``).

A command adds what it needs with one call per group: ``add_checkpoint(p)``,
``add_data(p, ...)``, ``add_output(p, ...)``, ``add_runtime(p, ...)``. Also here: the
formatter every command's ``--help`` uses, the parser class whose errors are one line, the
argparse types every number and path option is read with (``positive_int``, ``probability``,
``fraction_or_count``, ...: a wrong value stops at parse time, naming the option), and the few
helpers that act on parsed options (threads, the default output directory). Nothing here
imports PyTorch at import time.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from vitkit.errors import VitkitError

SPLITS = ("train", "val", "test", "all")
DEVICE_HELP = "cpu, cuda, cuda:1, ..."


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, as every other error of the CLI:
    ``vitkit: error: COMMAND: argument --x: the problem (see 'vitkit COMMAND --help')``."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{command}: " if command else ""
        self.exit(2, f"vitkit: error: {where}{message} (see '{self.prog} --help')\n")


# ---------------------------------------------------------------------------------------------
# argparse types: each checks one kind of value; argparse names the option in its error


def _number(text: str, kind: type, what: str, ok: Callable[[float], bool]) -> Any:
    try:
        value = float(text) if kind is float else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if (kind is float and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (sizes, counts, steps)."""
    return int(_number(text, int, "a whole number >= 1", lambda v: v >= 1))


def image_side(text: str) -> int:
    """Pixels along a side of the model's input: 1 .. MAX_SIDE (the cap a checkpoint's config
    gets too), checked before any image is resized to it."""
    from vitkit.registry.config_checks import MAX_SIDE

    return int(
        _number(text, int, f"a whole number of pixels, 1..{MAX_SIDE}", lambda v: 1 <= v <= MAX_SIDE)
    )


def non_negative_int(text: str) -> int:
    """An integer >= 0 (workers, seeds, optional counts)."""
    return int(_number(text, int, "a whole number >= 0", lambda v: v >= 0))


def seed(text: str) -> int:
    """A random seed: a whole number in [0, 2**32) (what NumPy and PyTorch both take)."""
    return int(_number(text, int, "a whole number in [0, 2**32)", lambda v: 0 <= v < 2**32))


def positive_float(text: str) -> float:
    """A finite number > 0 (learning rates, l2)."""
    return float(_number(text, float, "a number > 0", lambda v: v > 0))


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (weight decay, clipping, alphas; 0 often means off)."""
    return float(_number(text, float, "a number >= 0", lambda v: v >= 0))


def probability(text: str) -> float:
    """A number in [0, 1)."""
    return float(_number(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1))


def fraction_or_count(text: str) -> float:
    """A fraction in [0, 1] or a whole count (``--val-size 0.1``, ``--val-size 500``)."""
    what = "a fraction in [0, 1] or a whole count"
    return float(_number(text, float, what, lambda v: 0 <= v <= 1 or v == int(v) > 1))


def positive_fraction_or_count(text: str) -> float:
    """A fraction in (0, 1] or a whole count >= 1 (``--train-size 0.01``)."""
    what = "a fraction in (0, 1] or a whole count"
    return float(_number(text, float, what, lambda v: 0 < v <= 1 or v == int(v) > 1))


def byte_count(text: str) -> int:
    """A whole number of bytes >= 1, also written 1e9."""
    return int(_number(text, float, "a number of bytes >= 1", lambda v: v >= 1))


def positive_int_list(text: str) -> list[int]:
    """Comma-separated whole numbers >= 1 (``--shots 1,5,10,25``)."""
    pieces = [piece.strip() for piece in text.split(",") if piece.strip()]
    if not pieces:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}")
    return [positive_int(piece) for piece in pieces]


# Every kind of --data that vitkit.data.load_dataset accepts
DATA_KINDS = (
    "mnist, digits, shapes, shapes-hard, or a directory: an ImageFolder, webdataset shards "
    "(vitkit shards), a CIFAR-10/100 python download or a Hugging Face dataset saved with "
    "save_to_disk"
)


def dataset(text: str) -> str:
    """A built-in dataset's name or a directory: an empty string (which a path would read as
    the current directory) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a dataset name or directory, got ''")
    return text


def path(text: str) -> str:
    """A file or directory to read: an empty string (which would mean '.') is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def output_directory(text: str) -> str:
    """A directory to write into: it, or its nearest existing parent, must be a directory."""
    _check_output_path(text)
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a directory")
    return text


def output_file(text: str) -> str:
    """A file to write: not a directory, and its nearest existing parent is a directory."""
    _check_output_path(text)
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    return text


def _check_output_path(text: str) -> None:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    for parent in Path(text).absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{text}: {parent} is a file, not a directory")
            return


def torch_device(text: str) -> str:
    """A PyTorch device this machine has (cpu, cuda, cuda:1, ...)."""
    import torch

    try:
        kind = torch.device(text).type
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {DEVICE_HELP}, got {text!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this PyTorch sees no CUDA GPU")
    return text


class HelpFormatter(argparse.HelpFormatter):
    """Shows an option's default after its help, unless the help already names it or there is
    nothing to show (no default, a switch, or a default the recipe fills in)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def add_command(
    sub: Any, name: str, help: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A subcommand's parser, with the shared help formatter."""
    return sub.add_parser(
        name, help=help, description=description or help, formatter_class=HelpFormatter
    )


# ---------------------------------------------------------------------------------------------
# checkpoints


def add_checkpoint(
    p: argparse.ArgumentParser,
    *,
    positional: bool = False,
    several: bool = False,
    formats: bool = False,
    source: bool = True,
) -> None:
    """The checkpoint a command reads: ``--from CKPT`` (or a positional ``CKPT``; none if not
    ``source``), and the loading options every command that reads one shares (``--num-heads``,
    ``-o KEY=VALUE`` for a setting the checkpoint does not say; :func:`loading` turns them
    into ``load_model``'s keywords; :func:`add_loading`); with ``formats`` also ``--format``
    (export's ``--format`` is its output's)."""
    g = p.add_argument_group("checkpoint")
    if source and positional:
        g.add_argument(
            "ckpt", metavar="CKPT", type=path, help="checkpoint file or directory (any format)"
        )
    elif source and several:
        g.add_argument(
            "--from",
            dest="ckpt",
            type=path,
            required=True,
            nargs="+",
            metavar="CKPT",
            help="checkpoint or run directory (any format); several: also mean ± std across them",
        )
    elif source:
        g.add_argument(
            "--from",
            dest="ckpt",
            type=path,
            required=True,
            metavar="CKPT",
            help="checkpoint or run directory (any format)",
        )
    if formats:
        g.add_argument(
            "--format",
            dest="src_format",
            choices=("vitkit", "npz", "timm", "hf"),
            help="format of the source (default: detected)",
        )
    add_loading(g)


def add_loading(g: Any, *, assume: bool = True) -> None:
    """The loading options every command that reads a checkpoint takes (one group, defined
    once): ``--arch``, ``--num-heads`` and (unless the command's own ``-o`` sets model
    fields already, as train's and finetune's) ``-o KEY=VALUE``."""
    g.add_argument(
        "--arch",
        metavar="NAME",
        help="a registered timm name (vit_base_patch16_224, eva02_tiny_patch14_224, ...) that "
        "states the architecture and preprocessing of a bare timm state dict: it is then read "
        "with nothing assumed; a name its weights contradict is refused",
    )
    g.add_argument(
        "--num-heads",
        type=positive_int,
        help="heads of a checkpoint that does not say them (a bare timm state dict)",
    )
    if not assume:
        return
    g.add_argument(
        "-o",
        "--assume",
        action="append",
        metavar="KEY=VALUE",
        help="a setting the checkpoint does not say, e.g. -o gelu=quick -o block=post -o "
        "num_heads=16 -o mean=0.485,0.456,0.406: replaces what vitkit would assume (it says "
        "so when it does)",
    )


def loading(args: argparse.Namespace) -> dict[str, Any]:
    """``load_model`` / ``read_checkpoint`` keywords from the loading options of
    :func:`add_checkpoint` (``-o num_heads=N`` is ``--num-heads N``)."""
    from vitkit.registry.overrides import parse_key_values

    overrides = parse_key_values(getattr(args, "assume", None))
    out: dict[str, Any] = {}
    heads = overrides.pop("num_heads", None)
    if getattr(args, "num_heads", None) is not None:
        heads = args.num_heads
    if heads is not None:
        out["num_heads"] = heads
    if getattr(args, "src_format", None):
        out["format"] = args.src_format
    if getattr(args, "arch", None):
        out["arch"] = args.arch
    return {**out, **overrides}


def reading(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`loading` for ``read_checkpoint``: the config fields under ``overrides``."""
    kw = loading(args)
    keys = ("num_heads", "format", "grid", "arch")
    reads: dict[str, Any] = {k: kw.pop(k) for k in keys if k in kw}
    return {**reads, "overrides": kw}


def add_images(p: argparse.ArgumentParser) -> None:
    """Image files given on the command line (predict, explain)."""
    p.add_argument(
        "images", nargs="+", type=path, metavar="IMAGE", help="image files (PNG, JPEG, ...)"
    )


# ---------------------------------------------------------------------------------------------
# data


def add_data(
    p: argparse.ArgumentParser,
    *,
    required: bool = False,
    split: str | None = "test",
    workers: bool = False,
    bad_image: bool = True,
) -> argparse._ArgumentGroup:
    """Which images a checkpoint command reads: ``--data`` (default: the checkpoint's own
    dataset, unless ``required``), ``--data-root``, ``--split``, ``--num-workers``,
    ``--on-bad-image``."""
    g = p.add_argument_group("data")
    if required:
        g.add_argument("--data", type=dataset, required=True, help=f"dataset: {DATA_KINDS}")
    else:
        g.add_argument(
            "--data", type=dataset, help="dataset (default: the one the checkpoint was trained on)"
        )
        g.add_argument("--data-root", type=path, help="mnist: directory with the IDX files")
    if split is not None:
        g.add_argument(
            "--split",
            default=split,
            choices=SPLITS,
            help="which part of --data (all: every image of an ImageFolder directory)",
        )
    if workers:
        g.add_argument("--num-workers", type=non_negative_int, default=0, help="DataLoader workers")
    if bad_image:
        add_bad_image(g, default="stop")
    return g


def add_bad_image(g: Any, default: str | None) -> None:
    g.add_argument(
        "--on-bad-image",
        default=default,
        choices=["stop", "skip"],
        help="a corrupt ImageFolder file: stop or skip it",
    )


# ---------------------------------------------------------------------------------------------
# output


def add_output(
    p: argparse.ArgumentParser, what: str, default_name: str | None = None, file: bool = False
) -> None:
    """``--out``: where the command writes (a directory, or with ``file`` a file);
    ``default_name``: RUN/NAME beside a run's checkpoint, else CKPT_NAME beside the checkpoint
    (:func:`output_dir`)."""
    help = what
    if default_name is not None:
        help += (
            f" (default: RUN/{default_name} for a run's checkpoint, else CKPT_{default_name} "
            "beside the checkpoint)"
        )
    kind = output_file if file else output_directory
    p.add_argument_group("output").add_argument("--out", type=kind, help=help)


def add_overwrite(p: Any, help: str) -> None:
    """``--overwrite``: replace the files the command writes where they already exist (never
    a checkpoint being read: ``vitkit.output_files.check_destination``)."""
    p.add_argument("--overwrite", action="store_true", help=help)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")


def output_dir(out: str | None, ckpt_path: Path, name: str) -> Path:
    """``--out`` if given, else RUN/NAME for a run's checkpoint, else CKPT_NAME beside it; for
    a model read from the Hugging Face cache (``.../models--ORG--NAME/snapshots/HASH``),
    ORG--NAME_NAME in the current directory (nothing is written into the cache)."""
    if out:
        return Path(out)
    if ckpt_path.parent.name == "snapshots" and ckpt_path.parent.parent.name.startswith("models--"):
        return Path(f"{ckpt_path.parent.parent.name.removeprefix('models--')}_{name}")
    if ckpt_path.parent.name == "checkpoints":
        return ckpt_path.parent.parent / name
    return ckpt_path.parent / f"{ckpt_path.name}_{name}"


# ---------------------------------------------------------------------------------------------
# precision, threads, device


def add_runtime(
    p: argparse.ArgumentParser,
    *,
    batch_size: int | None = None,
    precision: bool = True,
    fp8: bool = False,
) -> None:
    """How a command computes: ``--batch-size``, ``--precision`` (with ``fp8``: also fp8
    inference), ``--threads``, ``--device``."""
    g = p.add_argument_group("compute")
    if batch_size is not None:
        g.add_argument(
            "--batch-size", type=positive_int, default=batch_size, help="images per forward"
        )
    if precision:
        help = "bf16: autocast (default: the checkpoint's, else fp32)"
        if fp8:
            help = (
                "auto: on the CPU, bf16 where it is native and the model's bf16 top-1 agrees "
                "with fp32's on 32 synthetic images, else fp32 (vitkit.engines.runner's choice, "
                "said in one line); "
                "bf16: on the CPU the weights converted to bf16 once, measured beside fp32 "
                "(native bf16 only, refused elsewhere; autocast with --tta-*), on a GPU "
                f"autocast; {FP8_INFERENCE_HELP}, on --device (default: the checkpoint's "
                "precision as autocast, else fp32)"
            )
        add_precision(g, default=None, help=help, auto=fp8, fp8=fp8)  # (auto: eval's)
    add_threads_device(g, device="cpu")


# what --precision fp8 is for eval, predict and serve (vitkit.engines.float8_inference)
FP8_INFERENCE_HELP = (
    "fp8: bf16 on the GPU with the large Linear layers' weights cast to float8 once (NVIDIA, "
    "compute capability 8.9+; the 'fp8' extra)"
)
INFERENCE_PRECISION_HELP = (
    "auto: bf16 where this CPU has it natively and the model's bf16 top-1 agrees with fp32's "
    "on 32 synthetic images, else fp32 (says which and why); "
    "bf16: the weights converted to bf16 once, on a CPU with native bf16 (AVX512-BF16 or AMX; "
    f"refused elsewhere); {FP8_INFERENCE_HELP}, on the first visible CUDA GPU; default fp32 "
    "(a model of 'vitkit export': its own)"
)


def add_precision(
    g: Any,
    default: str | None,
    help: str = "bf16: autocast",
    auto: bool = False,
    fp8: bool = False,
) -> None:
    choices = ["auto", "fp32", "bf16"] if auto else ["fp32", "bf16"]
    g.add_argument("--precision", default=default, choices=choices + ["fp8"] * fp8, help=help)


def add_fp8_options(g: Any) -> None:
    """``--fp8-recipe`` and ``--fp8-min-params``: how ``--precision fp8`` scales and which
    Linear layers it takes (training's and inference's alike: vitkit.float8_layers)."""
    g.add_argument(
        "--fp8-recipe",
        choices=["tensorwise", "rowwise"],
        help="fp8 scaling: one scale per tensor (fastest) or per row (default: tensorwise)",
    )
    g.add_argument(
        "--fp8-min-params",
        type=non_negative_int,
        metavar="N",
        help="fp8: only Linear layers holding at least N weights (default: 1048576, 2**20)",
    )


def add_threads_device(g: Any, device: str | None) -> None:
    g.add_argument("--threads", type=positive_int, help="torch intra-op threads")
    g.add_argument(
        "--device",
        type=torch_device,
        default=device,
        help=DEVICE_HELP if device else f"{DEVICE_HELP} (default: cpu)",
    )


def count(n: int, word: str) -> str:
    """``count(1, "epoch")`` → "1 epoch", ``count(1200, "image")`` → "1,200 images"."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# --threads above this many per CPU is refused: no speed comes of it, and OpenMP's thread
# pool of 100,000 threads crashed the process (SIGSEGV) before a word was said
THREADS_PER_CPU = 4


def check_threads(threads: int | None) -> None:
    """``--threads`` at most :data:`THREADS_PER_CPU` per CPU this process may run on (one line
    otherwise)."""
    if not threads:
        return
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count() or 1
    if threads > THREADS_PER_CPU * cpus:
        raise VitkitError(
            f"--threads {threads:,}: this machine gives the process {cpus} CPUs; at most "
            f"{THREADS_PER_CPU * cpus} threads ({THREADS_PER_CPU} per CPU)"
        )


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (PyTorch's intra-op threads, checked >= 1 by its argparse type and
    at most 4 per CPU: :func:`check_threads`); None keeps PyTorch's choice. Training commands
    pass it in the TrainConfig instead."""
    check_threads(threads)
    if threads:
        import torch

        torch.set_num_threads(threads)


def threads() -> int:
    import torch

    return torch.get_num_threads()


def image_size(values: list[int] | None) -> int | tuple[int, int] | None:
    """``--image-size H [W]`` → H or (H, W)."""
    if values is None:
        return None
    if len(values) > 2:
        raise VitkitError(f"--image-size takes one or two numbers, got {values}")
    return (values[0], values[1]) if len(values) == 2 else values[0]
