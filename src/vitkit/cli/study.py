"""``vitkit study STUDY``: the paper's findings, each one command made of many training runs.

Each study registers its subcommand with one function, ``add_<study>(studies)``, listed in
:data:`STUDIES`; the options every study shares (training options, ``--models``, ``--seeds``,
the output directory) are added by :func:`add_study_options`. The runs, the summary and the
plots come from `vitkit.studies`; this file only parses and wires.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitkit.cli import study_paper  # inside, selfsup, resolution
from vitkit.cli.options import add_command, non_negative_int, positive_int, positive_int_list
from vitkit.cli.train_options import add_train_options, train_config_from_args
from vitkit.errors import VitkitError


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "study",
        "the paper's findings as experiments made of many training runs",
        "Each study trains many runs in OUT/runs/MODEL/GROUP/seedK, reuses those that "
        "finished (so a study resumes, or grows by sizes and seeds, with the same --out-dir) "
        "and writes OUT/results.json, OUT/table.md (mean ± std over seeds) and its plots.",
    )
    studies = p.add_subparsers(dest="study", metavar="STUDY")
    for add in STUDIES:
        add(studies)

    def show_studies(args: argparse.Namespace) -> int:
        p.print_help()
        return 0

    p.set_defaults(func=show_studies)


def add_study_options(
    q: argparse.ArgumentParser, recipe: str = "mnist", *, models_required: bool = True
) -> argparse._ArgumentGroup:
    """The training options (every run's recipe) and the study group: --models, --seeds."""
    add_train_options(q, recipe)
    g = q.add_argument_group("study")
    g.add_argument(
        "--models",
        required=models_required,
        help="comma-separated model names, each with optional overrides in brackets, e.g. "
        "'Ti/4[depth=4,width=96],bit_r26x1[layers=1,1,1,width_factor=0.25,root=small]'; "
        "label=NAME in the brackets names the model in the table and plot",
    )
    g.add_argument("--seeds", type=positive_int, default=1, help="runs per point: seeds 0..N-1")
    return g


def study_base_config(args: argparse.Namespace, name: str) -> Any:
    """The training config every run starts from; refuses the options a study sets itself."""
    for flag, value in (("--model", args.model), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None:
            raise VitkitError(f"study {name} takes --models, not {flag}")
    if args.resume:
        raise VitkitError(f"study {name} always reuses finished runs; drop --resume")
    return train_config_from_args(args)


# ----- data-scale -----------------------------------------------------------------------------


def add_data_scale(studies: Any) -> None:
    q = add_command(
        studies,
        "data-scale",
        "test accuracy vs training-set size for several models (paper Fig. 3/4)",
        "Train every model of --models on class-stratified subsets of the training set of "
        "every size in --sizes, with --seeds seeds each, evaluate on the full test split and "
        "write OUT/data_scale.png (accuracy vs size), OUT/loss_curves.png (every run's "
        "training loss, one panel per size), OUT/table.md (mean ± std) and OUT/results.json. "
        "Each run lives in OUT/runs/MODEL/nSIZE/seedK; runs that finished before are reused, "
        "so a study can be resumed or extended. Any training option sets all runs (default: "
        "the mnist recipe's).",
    )
    g = add_study_options(q)
    g.add_argument(
        "--sizes",
        type=positive_int_list,
        required=True,
        help="comma-separated training-set sizes, e.g. 1000,3000,10000",
    )
    g.add_argument(
        "--min-steps",
        type=non_negative_int,
        default=0,
        help="small subsets train for more epochs so that every run takes at least this many "
        "optimizer steps",
    )
    q.set_defaults(func=cmd_study_data_scale)


def cmd_study_data_scale(args: argparse.Namespace) -> int:
    if args.list_recipes:
        from vitkit.cli.train import list_recipes

        return list_recipes()
    from vitkit.studies.common import parse_model_specs
    from vitkit.studies.data_scale import run_data_scale, write_study

    specs = parse_model_specs(args.models)  # checks names and options now, not after an hour
    base = study_base_config(args, "data-scale")
    out = Path(args.out_dir or f"runs/data-scale-{base.data}")
    base = dataclasses.replace(base, val_size=0)  # all of each subset trains
    results = run_data_scale(base, specs, args.sizes, args.seeds, out, min_steps=args.min_steps)
    title = f"{base.data}: test top-1 vs training images ({args.seeds} seed(s) per point)"
    paths = write_study(results, out, title)
    print(paths["table"].read_text())
    print(f"plot: {paths['plot']}   loss curves: {paths['curves']}   table: {paths['table']}")
    print(f"runs: {paths['results']}   trained now: {sum(r.trained for r in results)}")
    return 0


# One line per study: ``add_<study>(studies)`` adds its subcommand.
STUDIES: list[Callable[[Any], None]] = [add_data_scale, study_paper.add_commands]
