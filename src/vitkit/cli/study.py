"""``vitkit study STUDY``: the paper's findings, each one command made of many training runs.

Each study registers its subcommand with one function, ``add_<study>(studies)``, listed in
:data:`STUDIES`; the options every study shares (training options, ``--models``, ``--seeds``,
the output directory) are added by :func:`add_study_options`. The runs, the summary and the
plots come from `vitkit.studies`; this file only parses and wires.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
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
    q: argparse.ArgumentParser, recipe: str = "mnist", *, models_default: str = ""
) -> argparse._ArgumentGroup:
    """The training options (every run's recipe) and the study group: --models, --seeds.
    Without ``models_default`` --models is required."""
    add_train_options(q, recipe)
    g = q.add_argument_group("study")
    g.add_argument(
        "--models",
        required=not models_default,
        help="comma-separated model names, each with optional overrides in brackets, e.g. "
        "'Ti/4[depth=4,width=96],bit_r26x1[layers=1,1,1,width_factor=0.25,root=small]'; "
        "label=NAME in the brackets names the model in the table and plot, family=NAME its "
        "family (unless given: ViT, ResNet or Hybrid, from the config)"
        + (f"; default (--smoke: tiny ones): {_labels(models_default)}" if models_default else ""),
    )
    g.add_argument("--seeds", type=positive_int, default=1, help="runs per point: seeds 0..N-1")
    return g


def _labels(models: str) -> str:
    """The labels of a model list, for help texts."""
    return ", ".join(re.findall(r"label=([^,\]]+)", models))


def study_base_config(args: argparse.Namespace, name: str) -> Any:
    """The training config every run starts from; refuses the options a study sets itself.
    --smoke: on the 8x8 digits unless --data says otherwise. Without --early-stop no
    validation split is held out (all of each training set trains)."""
    for flag, value in (("--model", args.model), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None:
            raise VitkitError(f"study {name} takes --models, not {flag}")
    if args.resume:
        raise VitkitError(f"study {name} always reuses finished runs; drop --resume")
    base = train_config_from_args(args)
    if args.smoke and args.data is None:
        base = dataclasses.replace(base, data="digits")
    if base.early_stop is None and args.val_size is None:
        base = dataclasses.replace(base, val_size=0)
    return base


def study_models(args: argparse.Namespace, default: str, smoke: str) -> list[Any]:
    from vitkit.studies.common import parse_model_specs

    return parse_model_specs(args.models or (smoke if args.smoke else default))


def study_out_dir(args: argparse.Namespace, name: str, base: Any) -> Path:
    smoke = "-smoke" if args.smoke else ""
    return Path(args.out_dir or f"runs/{name}-{base.data}{smoke}")  # (data-scale: as before)


# ----- data-scale -----------------------------------------------------------------------------


def add_data_scale(studies: Any) -> None:
    from vitkit.studies.study_defaults import DATA_SCALE_COMMANDS, DATA_SCALE_MODELS

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
        "the mnist recipe's). To convergence: --early-stop PATIENCE stops each run when its "
        "validation loss stops improving and reports its best weights (the paper's Fig. 4 "
        "protocol), --min-steps gives small subsets enough steps to get there. Full size "
        "(GPU): " + " and ".join(f"'{c}'" for c in DATA_SCALE_COMMANDS) + ".",
    )

    g = add_study_options(q, models_default=DATA_SCALE_MODELS)
    g.add_argument(
        "--sizes",
        type=positive_int_list,
        help="comma-separated training-set sizes, e.g. 1000,3000,10000 (default: mnist "
        "600..59,000, shapes-hard 1,000..1,000,000; --smoke: 100,200)",
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
    from vitkit.studies import data_scale as ds

    specs = study_models(args, ds.DEFAULT_MODELS, ds.SMOKE_MODELS)  # checked now, not later
    base = study_base_config(args, "data-scale")
    sizes = args.sizes or (ds.SMOKE_SIZES if args.smoke else ds.FULL_SIZES.get(base.data))
    if not sizes:
        raise VitkitError(f"study data-scale: give --sizes for dataset '{base.data}'")
    out = study_out_dir(args, "data-scale", base)
    results = ds.run_data_scale(base, specs, sizes, args.seeds, out, min_steps=args.min_steps)
    title = f"{base.data}: test top-1 vs training images ({args.seeds} seed(s) per point)"
    paths = ds.write_study(results, out, title)
    print(paths["table"].read_text())
    print(f"plot: {paths['plot']}   loss curves: {paths['curves']}   table: {paths['table']}")
    print(f"runs: {paths['results']}   trained now: {sum(r.trained for r in results)}")
    return 0


# ----- compute --------------------------------------------------------------------------------


def add_compute(studies: Any) -> None:
    from vitkit.studies.study_defaults import COMPUTE_COMMAND, COMPUTE_MODELS

    q = add_command(
        studies,
        "compute",
        "test accuracy vs training compute for ViT, ResNet and hybrid families (paper Fig. 5)",
        "Train every model of --models (default: four sizes each of ViT, BiT ResNet and "
        "hybrid) on the same training set (--train-size images of --data) for the same "
        "budget, with --seeds seeds each; count each run's training compute analytically (3 x "
        "forward FLOPs x images seen) and write OUT/compute.png (test top-1 against total "
        "training exaFLOPs, log x, one line per family), OUT/table.md and OUT/results.json. "
        f"Runs in OUT/runs/MODEL/nSIZE/seedK are reused. Full size (GPU): '{COMPUTE_COMMAND}'.",
    )

    add_study_options(q, models_default=COMPUTE_MODELS)
    q.set_defaults(func=cmd_study_compute)


def cmd_study_compute(args: argparse.Namespace) -> int:
    if args.list_recipes:
        from vitkit.cli.train import list_recipes

        return list_recipes()
    from vitkit.studies import compute

    specs = study_models(args, compute.DEFAULT_MODELS, compute.SMOKE_MODELS)
    base = study_base_config(args, "compute")
    if base.train_size is None and not args.smoke:
        size = compute.FULL_TRAIN_SIZE.get(base.data)
        base = dataclasses.replace(base, train_size=size)
    out = study_out_dir(args, "compute", base)
    results = compute.run_compute(base, specs, args.seeds, out)
    n = f"{base.train_size:,} training images" if base.train_size else "all training images"
    title = f"{base.data}, {n}: test top-1 vs training compute ({args.seeds} seed(s))"
    paths = compute.write_compute(results, out, title, base.batch_size)
    print(paths["table"].read_text())
    print(f"plot: {paths['plot']}   table: {paths['table']}   runs: {paths['results']}")
    print(f"trained now: {sum(r.trained for r in results)}")
    return 0


# One line per study: ``add_<study>(studies)`` adds its subcommand.
STUDIES: list[Callable[[Any], None]] = [add_data_scale, add_compute, study_paper.add_commands]
