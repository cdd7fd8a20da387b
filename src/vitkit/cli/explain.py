"""``vitkit explain`` and ``analyze``: what a model looks at and what it learned (the paper's
Figures 6 and 7)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vitkit.cli.options import (
    add_checkpoint,
    add_command,
    add_data,
    add_images,
    add_json,
    add_output,
    add_overwrite,
    add_runtime,
    loading,
    non_negative_int,
    output_dir,
    positive_int,
    set_threads,
)
from vitkit.errors import VitkitError
from vitkit.output_files import all_or_none, fresh_directory

HEAD_FUSION = ("mean", "max", "min")


def _add_head_fusion(p: Any) -> None:
    p.add_argument(
        "--head-fusion",
        default="mean",
        choices=HEAD_FUSION,
        help="how the rollout combines heads (mean, as in the paper)",
    )


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "explain",
        "attention rollout and per-layer attention maps of images (PNG), with top-k",
        "For each image: IMAGE_rollout.png (the input, the attention rollout over it and the "
        "input multiplied by it, as in the paper's Figure 6) and IMAGE_layers.png (every "
        "layer's and head's attention from the class token, or the mean query for GAP models, "
        "over the patches, with the rollout up to each layer); prints the top-k prediction.",
    )
    add_images(p)
    add_checkpoint(p)
    p.add_argument("--top-k", type=positive_int, default=5, help="labels to print")
    _add_head_fusion(p)
    add_output(p, "directory for the PNGs", "explain")
    add_overwrite(
        p,
        "replace earlier PNGs of these images in --out (default: refused; without --out a new "
        "RUN/explain-2, -3, ... is used)",
    )
    add_json(p)
    add_runtime(p, precision=False)
    p.set_defaults(func=cmd_explain)

    p = add_command(
        sub,
        "analyze",
        "the paper's Figure 7 panels, rollout examples and an HTML report for a checkpoint",
        "Writes embedding_filters.png, position_similarity.png, attention_distance.png, "
        "rollout_examples.png, analysis.json (the numbers) and report.html (self-contained: "
        "every figure embedded) into --out. Attention distance and rollout need images: from "
        "--data, else the dataset the checkpoint was trained on; a checkpoint that names none "
        "(e.g. a converted one) without --data gets the weight-only panels. For a run's "
        "checkpoint the report also shows its training curves and confusion matrix.",
    )
    add_checkpoint(p)
    add_data(p)
    g = p.add_argument_group("analysis")
    g.add_argument(
        "--num-images",
        type=positive_int,
        default=128,
        help="images (spread evenly over the split) for attention distance and rollout; the "
        "paper uses 128",
    )
    g.add_argument("--examples", type=non_negative_int, default=8, help="rollout examples drawn")
    g.add_argument(
        "--components", type=positive_int, default=28, help="embedding-filter components"
    )
    _add_head_fusion(g)
    add_output(p, "output directory", "analysis")
    add_overwrite(
        p,
        "replace an earlier analysis in --out (default: refused; without --out a run's own "
        "analysis/ and report.html are rewritten)",
    )
    add_runtime(p, batch_size=32, precision=False)
    p.set_defaults(func=cmd_analyze)


def cmd_explain(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    from vitkit.analysis.attention import require_attention
    from vitkit.analysis.image_maps import explain_files, output_names
    from vitkit.checkpoints import load_model
    from vitkit.data.images import check_image_files, shown_name
    from vitkit.eval.predict import format_top_k

    check_image_files(args.images)
    if args.top_k < 1:
        raise VitkitError(f"--top-k must be at least 1, got {args.top_k}")
    loaded, ckpt = load_model(args.ckpt, **loading(args))
    model = require_attention(loaded).to(args.device)
    out = fresh_directory(
        output_dir(args.out, ckpt.path, "explain"),
        given=args.out is not None,
        overwrite=args.overwrite,
        writes=output_names(args.images),
        reads=[ckpt.path],
    )
    with all_or_none(out, output_names(args.images)):  # a failure part-way leaves none
        found_all = explain_files(
            model, ckpt, args.images, out, k=args.top_k, head_fusion=args.head_fusion
        )
    for found in found_all:
        shown = format_top_k(found.top_k)
        if args.json:
            record: dict[str, Any] = {"image": found.image, "top_k": found.top_k}
            record.update(rollout_png=str(found.rollout_png), layers_png=str(found.layers_png))
            if found.pool_png is not None:
                record["pool_png"] = str(found.pool_png)
            if found.prefix_rollout:
                record["prefix_rollout_share"] = found.prefix_rollout
            print(json.dumps(record))
        else:
            name = shown_name(found.image)  # (a name that is not UTF-8 prints as U+FFFD)
            print(f"{name}: {shown}" if shown else f"{name}:")
            print(f"    {shown_name(found.rollout_png)}\n    {shown_name(found.layers_png)}")
            if found.pool_png is not None:
                print(f"    {shown_name(found.pool_png)}  (the MAP head's attention)")
            if found.prefix_rollout:
                shares = ", ".join(f"{k} {v:.3f}" for k, v in found.prefix_rollout.items())
                print(f"    rollout share on prefix tokens (not in the maps): {shares}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    from vitkit.analysis import analyze_model, sample_dataset, write_report
    from vitkit.analysis.attention import require_attention
    from vitkit.analysis.summary import FILES, format_numbers
    from vitkit.checkpoints import load_model
    from vitkit.eval.checkpoint_eval import checkpoint_dataset, class_mismatch

    for name in ("num_images", "batch_size", "components"):
        if getattr(args, name) < 1:
            raise VitkitError(f"--{name.replace('_', '-')} must be at least 1")
    if args.examples < 0:
        raise VitkitError(f"--examples must be at least 0, got {args.examples}")
    loaded, ckpt = load_model(args.ckpt, **loading(args))
    model = require_attention(loaded).to(args.device)
    data_name = args.data or ckpt.meta.get("dataset")
    data = None
    if data_name:
        dataset = checkpoint_dataset(
            ckpt, data_name, args.split, args.data_root, args.on_bad_image, check_classes=False
        )
        n = min(args.num_images, len(dataset))
        data = sample_dataset(
            dataset,
            n,
            ckpt.preprocess,
            description=f"{n} {args.split} images of {dataset.info.name}",
        )
        problem = class_mismatch(ckpt, dataset, data_name)
        if problem:  # attention needs no labels; accuracy and "true" captions would mislead
            print(
                f"{problem}: no accuracy, predictions shown by the model's labels", file=sys.stderr
            )
            data.labels = None
            data.class_names = ckpt.class_names
    else:
        print(
            f"{ckpt.path}: the checkpoint names no dataset and no --data was given: "
            "attention distance and rollout are skipped",
            file=sys.stderr,
        )
    # One rule with eval and explain: a default place holding an earlier analysis moves on to
    # analysis-2, -3, ...; a given --out is refused; --overwrite replaces the files written.
    out = fresh_directory(
        output_dir(args.out, ckpt.path, "analysis"),
        given=args.out is not None,
        overwrite=args.overwrite,
        writes=[*FILES.values(), "report.html"],
        reads=[ckpt.path],
    )
    with all_or_none(out, [*FILES.values(), "report.html"]):  # a failure part-way: none
        result = analyze_model(
            model,
            out,
            data,
            num_examples=args.examples,
            filter_components=args.components,
            head_fusion=args.head_fusion,
            batch_size=args.batch_size,
        )
        run_dir = ckpt.path.parent.parent if ckpt.path.parent.name == "checkpoints" else None
        # The run's own report.html is the page of its own analysis (RUN/analysis): written when it
        # is absent or with --overwrite; a moved-on analysis gets a page of its own.
        own = run_dir is not None and out == run_dir / "analysis"
        page = run_dir / "report.html" if run_dir is not None and own else None
        if page is not None and os.path.lexists(page) and not args.overwrite:
            page = None
        report = write_report(
            page or out / "report.html", model, result, source=str(ckpt.path), run_dir=run_dir
        )
    print(format_numbers(result.numbers))
    print(f"wrote {report} (self-contained) and, in {out}:")
    print("    " + "  ".join(p.name for p in result.files.values()))
    return 0
