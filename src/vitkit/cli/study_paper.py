"""``vitkit study inside | selfsup | resolution``: the paper's Figures 6-7, Sec. 4.6 and Sec.
3.2/4.1 as studies (parsing and wiring only; the work is `vitkit.studies`).

Each takes every training option (they set the study's main runs; default: the study's recipe),
``--seeds``, ``--out-dir`` (finished runs there are reused) and ``--smoke`` (seconds-long runs).
:func:`add_commands` adds the three to the ``study`` subcommands.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from vitkit.cli.options import add_command, dataset, positive_int, positive_int_list
from vitkit.cli.train_options import add_train_options, train_config_from_args
from vitkit.errors import VitkitError

_REUSE = (
    "Every run lives in OUT/runs/MODEL/GROUP/seedK and is reused once its report.json exists "
    "(an interrupted one resumes), so the same --out-dir can be carried across invocations "
    "and machines."
)


def add_commands(studies: Any) -> None:
    """Add ``inside``, ``selfsup`` and ``resolution`` to the ``study`` subparsers."""
    _add_inside(studies)
    _add_selfsup(studies)
    _add_resolution(studies)


def fraction_list(text: str) -> list[float]:
    """Comma-separated fractions in (0, 1] (``--fractions 0.01,0.1,1``)."""
    out = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        try:
            value = float(piece)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected fractions in (0, 1], got {piece!r}"
            ) from None
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"expected fractions in (0, 1], got {piece!r}")
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions, got {text!r}")
    return out


def _study_group(q: argparse.ArgumentParser, recipe: str, models_help: str) -> Any:
    add_train_options(q, recipe)
    g = q.add_argument_group("study")
    g.add_argument("--models", help=models_help)
    g.add_argument("--seeds", type=positive_int, default=3, help="seeds 0..N-1 (default: 3)")
    return g


def _base(
    args: argparse.Namespace, name: str, smoke_data: str | None = None, sets: str = ""
) -> Any:
    """Every main run's training config (the recipe with the options given), after the
    dataset has been checked, so that a wrong --data stops before any training. ``sets``: the
    option the study sets per run itself ("--train-size"), refused when given."""
    for flag, value in (("--model", args.model), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None:
            raise VitkitError(f"study {name} takes --models, not {flag}")
    if sets and getattr(args, sets[2:].replace("-", "_")) is not None:
        raise VitkitError(f"study {name} sets {sets} per run itself; drop it")
    if args.resume:
        raise VitkitError(f"study {name} always reuses finished runs; drop --resume")
    base = train_config_from_args(args)
    if args.smoke and args.data is None and smoke_data:
        base = dataclasses.replace(base, data=smoke_data)
    _check_data(base.data, base.data_root)
    return base


def _check_data(data: str, root: str | None) -> None:
    from vitkit.data import load_dataset

    load_dataset(data, "test", root=root if data == "mnist" else None)


def _one_model(args: argparse.Namespace, base: Any) -> Any:
    from vitkit.studies.common import ModelSpec, parse_model_specs

    if args.models is None:
        return ModelSpec(base.model, dict(base.model_overrides))
    specs = parse_model_specs(args.models)
    if len(specs) != 1:
        raise VitkitError(f"--models: this study trains one model, got {len(specs)}")
    return specs[0]


def _print(paths: dict[str, Path], trained: int) -> None:
    print(paths["table"].read_text())
    print("   ".join(f"{k}: {v}" for k, v in paths.items()) + f"   trained now: {trained}")


# ----- inside ---------------------------------------------------------------------------------


def _add_inside(studies: Any) -> None:
    q = add_command(
        studies,
        "inside",
        "attention distance, position embeddings and filters of a trained ViT (paper Fig. 7)",
        "Train one ViT per seed (default: the study-inside recipe, 4x4 patches on 64 px "
        "shapes) and measure each: mean attention distance per head and layer, the share of "
        "lowest-layer heads that attend globally (>= half the uniform-attention distance), "
        "distance vs depth (Spearman), position-embedding similarity and its row/column "
        "structure, patch-filter principal components. Writes OUT/results.json (with "
        "verdict_inputs), OUT/inside.md, OUT/attention_distance.png, "
        "OUT/position_similarity.png, OUT/filters.png. " + _REUSE + " Full size: 'vitkit "
        "study inside --seeds 3 --device cuda --out-dir runs/study-inside'.",
    )
    g = _study_group(q, "study-inside", "the model, NAME[K=V,...] (default: the recipe's)")
    g.add_argument(
        "--num-images", type=positive_int, default=512, help="test images the analysis averages"
    )
    q.set_defaults(func=cmd_inside)


def cmd_inside(args: argparse.Namespace) -> int:
    if args.list_recipes:
        from vitkit.cli.train import list_recipes

        return list_recipes()
    from vitkit.studies.inside import run_inside, write_inside

    base = _base(args, "inside")
    model = _one_model(args, base)
    out = Path(args.out_dir or base.out_dir)
    num_images = min(args.num_images, 16) if args.smoke else args.num_images
    results, measured = run_inside(base, model, args.seeds, out, num_images=num_images)
    _print(write_inside(results, measured, out), sum(r.trained for r in results))
    return 0


# ----- selfsup --------------------------------------------------------------------------------


def _add_selfsup(studies: Any) -> None:
    q = add_command(
        studies,
        "selfsup",
        "MPP and MAE pre-training vs supervised vs scratch at 1/10/100 %% labels (Sec. 4.6)",
        "Per seed: pre-train the encoder with masked patch prediction and with MAE on the "
        "images of --pretrain-data (labels unused) and supervised on its labels, then "
        "fine-tune every start and a random init on --fractions of the labelled training set "
        "(each run at least --min-steps steps, so scratch converges too). Writes "
        "OUT/results.json (with verdict_inputs), OUT/selfsup.md, OUT/selfsup.png (accuracy vs "
        "labelled fraction) and OUT/finetune_loss.png. " + _REUSE + " Full size: 'vitkit "
        "study selfsup --seeds 3 --min-steps 3000 --pretrain-epochs 30 --device cuda "
        "--out-dir runs/study-selfsup'.",
    )
    g = _study_group(q, "study-selfsup", "the encoder, NAME[K=V,...] (default: the recipe's)")
    g.add_argument(
        "--fractions",
        type=fraction_list,
        default=[0.01, 0.1, 1.0],
        help="labelled fractions of the training set (default: 0.01,0.1,1)",
    )
    g.add_argument(
        "--min-steps",
        type=positive_int,
        default=3000,
        help="every fine-tuning run takes at least this many optimizer steps (default: 3000)",
    )
    g.add_argument("--pretrain-data", type=dataset, help="pre-training images (default: --data)")
    g.add_argument(
        "--pretrain-epochs", type=positive_int, help="pre-training epochs (default: recipes')"
    )
    g.add_argument(
        "--starts",
        default="supervised,mpp,mae",
        help="the pre-trained starts to compare with scratch (default: supervised,mpp,mae)",
    )
    q.set_defaults(func=cmd_selfsup)


def cmd_selfsup(args: argparse.Namespace) -> int:
    if args.list_recipes:
        from vitkit.cli.train import list_recipes

        return list_recipes()
    from vitkit.data import load_dataset
    from vitkit.studies.selfsup import PRETRAINED, pretrain_configs, run_selfsup, write_selfsup

    base = _base(args, "selfsup", smoke_data="digits", sets="--train-size")
    starts = [s.strip() for s in args.starts.split(",") if s.strip()]
    if not starts or set(starts) - set(PRETRAINED):
        raise VitkitError(
            f"--starts: expected some of {', '.join(PRETRAINED)}, got {args.starts!r}"
        )
    pretrain_data = args.pretrain_data or base.data
    if pretrain_data != base.data:
        _check_data(pretrain_data, None)
    model = _one_model(args, base)
    cfgs = pretrain_configs(base, pretrain_data, epochs=args.pretrain_epochs, smoke=args.smoke)
    train = load_dataset(base.data, "train", val_size=base.val_size, root=base.data_root)
    out = Path(args.out_dir or base.out_dir)
    results, pretrained = run_selfsup(
        base,
        model,
        {s: cfgs[s] for s in starts},
        args.fractions,
        args.seeds,
        out,
        train_images=len(train),
        min_steps=args.min_steps,
    )
    paths = write_selfsup(results, pretrained, out, data=base.data, pretrain_data=pretrain_data)
    _print(paths, sum(r.trained for r in results) + sum(p["trained"] for p in pretrained))
    return 0


# ----- resolution -----------------------------------------------------------------------------


def _add_resolution(studies: Any) -> None:
    q = add_command(
        studies,
        "resolution",
        "fine-tuning at a higher resolution; few-shot probe vs fine-tuning ranks (Sec. 3.2, 4.1)",
        "Per model and seed: supervised pre-training on --pretrain-data, then fine-tuning on "
        "--data at the pre-training resolution and at --high-res (2-D interpolated position "
        "embeddings, same budget), and few-shot linear probes of the frozen features. Writes "
        "OUT/results.json (with verdict_inputs: the high-res gain per model, Spearman of the "
        "probe's ranking vs fine-tuning's), OUT/resolution.md and OUT/resolution.png. "
        + _REUSE
        + " Full size: 'vitkit study resolution --seeds 3 --device cuda --out-dir "
        "runs/study-resolution' (the default --models).",
    )
    g = _study_group(
        q,
        "study-resolution",
        "the models (default: four ViTs, width 32 to 96, depth 2 to 6, patch 4)",
    )
    g.add_argument(
        "--pretrain-data", type=dataset, help="supervised pre-training data (default: mnist)"
    )
    g.add_argument("--pretrain-epochs", type=positive_int, help="pre-training epochs (default: 9)")
    g.add_argument(
        "--high-res",
        type=positive_int,
        help="the higher fine-tuning resolution (default: twice the pre-training one)",
    )
    g.add_argument(
        "--shots",
        type=positive_int_list,
        default=[5, 10, 25],
        help="few-shot probes: images per class (default: 5,10,25)",
    )
    g.add_argument(
        "--probe-seeds", type=positive_int, default=3, help="support-set draws per probe"
    )
    q.set_defaults(func=cmd_resolution)


def cmd_resolution(args: argparse.Namespace) -> int:
    if args.list_recipes:
        from vitkit.cli.train import list_recipes

        return list_recipes()
    from vitkit.studies.common import parse_model_specs
    from vitkit.studies.resolution import (
        DEFAULT_MODELS,
        SMOKE_MODELS,
        pretrain_config,
        run_resolution,
        write_resolution,
    )

    base = _base(args, "resolution", sets="--image-size")
    pretrain_data = args.pretrain_data or ("digits" if args.smoke else "mnist")
    if pretrain_data != base.data:
        _check_data(pretrain_data, None)
    models = parse_model_specs(args.models or (SMOKE_MODELS if args.smoke else DEFAULT_MODELS))
    pre = pretrain_config(base, pretrain_data, epochs=args.pretrain_epochs, smoke=args.smoke)
    high = args.high_res or 2 * _native_size(pretrain_data, pre.image_size)
    out = Path(args.out_dir or base.out_dir)
    results, probes = run_resolution(
        base,
        models,
        pre,
        args.seeds,
        out,
        high_res=high,
        shots=args.shots,
        probe_seeds=args.probe_seeds,
    )
    paths = write_resolution(results, probes, out, data=base.data, pretrain_data=pretrain_data)
    _print(paths, sum(r.trained for r in results) + sum(p["pretrained_now"] for p in probes))
    return 0


def _native_size(data: str, image_size: int | None) -> int:
    """The pre-training resolution: the recipe's, else the dataset's own (square) side."""
    if image_size:
        return image_size
    from vitkit.data import load_dataset

    return int(load_dataset(data, "test").info.image_size[0])
