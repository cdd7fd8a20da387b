"""The option groups that several commands share, each defined once (pip's ``cmdoptions``).

A command adds what it needs with one call per group: ``add_checkpoint(p)``,
``add_data(p, ...)``, ``add_output(p, ...)``, ``add_runtime(p, ...)``. Also here: the
formatter every command's ``--help`` uses, and the few helpers that act on parsed options
(threads, the default output directory). Nothing here imports PyTorch at import time.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vitkit.errors import VitkitError

SPLITS = ("train", "val", "test", "all")
DEVICE_HELP = "cpu, cuda, cuda:1, ..."


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
    ``source``); with ``formats`` also how to read a file whose format or heads cannot be told
    from it."""
    g = p.add_argument_group("checkpoint")
    what = "checkpoint file or directory (any format)"
    if not source:
        pass
    elif positional:
        g.add_argument("ckpt", metavar="CKPT", help=what)
    elif several:
        g.add_argument(
            "--from",
            dest="ckpt",
            required=True,
            nargs="+",
            metavar="CKPT",
            help="checkpoint or run directory (any format); several: also mean ± std across them",
        )
    else:
        g.add_argument(
            "--from",
            dest="ckpt",
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
        g.add_argument(
            "--num-heads",
            type=int,
            help="heads of a bare timm state dict whose width is not a standard size",
        )


def add_images(p: argparse.ArgumentParser) -> None:
    """Image files given on the command line (predict, explain)."""
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")


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
        g.add_argument("--data", required=True, help="dataset: a built-in name or a directory")
    else:
        g.add_argument("--data", help="dataset (default: the one the checkpoint was trained on)")
        g.add_argument("--data-root", help="mnist: directory with the IDX files")
    if split is not None:
        g.add_argument(
            "--split",
            default=split,
            choices=SPLITS,
            help="which part of --data (all: every image of an ImageFolder directory)",
        )
    if workers:
        g.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
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


def add_output(p: argparse.ArgumentParser, what: str, default_name: str | None = None) -> None:
    """``--out``: where the command writes; ``default_name``: RUN/NAME beside a run's
    checkpoint, else CKPT_NAME beside the checkpoint (:func:`output_dir`)."""
    help = what
    if default_name is not None:
        help += (
            f" (default: RUN/{default_name} for a run's checkpoint, else CKPT_{default_name} "
            "beside the checkpoint)"
        )
    p.add_argument_group("output").add_argument("--out", help=help)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")


def output_dir(out: str | None, ckpt_path: Path, name: str) -> Path:
    """``--out`` if given, else RUN/NAME for a run's checkpoint, else CKPT_NAME beside it."""
    if out:
        return Path(out)
    if ckpt_path.parent.name == "checkpoints":
        return ckpt_path.parent.parent / name
    return ckpt_path.parent / f"{ckpt_path.name}_{name}"


# ---------------------------------------------------------------------------------------------
# precision, threads, device


def add_runtime(
    p: argparse.ArgumentParser, *, batch_size: int | None = None, precision: bool = True
) -> None:
    """How a command computes: ``--batch-size``, ``--precision``, ``--threads``, ``--device``."""
    g = p.add_argument_group("compute")
    if batch_size is not None:
        g.add_argument("--batch-size", type=int, default=batch_size, help="images per forward")
    if precision:
        add_precision(g, default=None, help="bf16: autocast (default: the checkpoint's, else fp32)")
    add_threads_device(g, device="cpu")


def add_precision(g: Any, default: str | None, help: str = "bf16: autocast") -> None:
    g.add_argument("--precision", default=default, choices=["fp32", "bf16"], help=help)


def add_threads_device(g: Any, device: str | None) -> None:
    g.add_argument("--threads", type=int, help="torch intra-op threads")
    g.add_argument(
        "--device",
        default=device,
        help=DEVICE_HELP if device else f"{DEVICE_HELP} (default: cpu)",
    )


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (PyTorch's intra-op threads); None keeps PyTorch's choice."""
    if threads is not None and threads < 1:
        raise VitkitError(f"--threads must be at least 1, got {threads}")
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
