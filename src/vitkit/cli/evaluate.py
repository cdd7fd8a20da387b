"""``vitkit eval``, ``fewshot`` and ``predict``: a checkpoint's accuracy, frozen features and
predictions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vitkit.cli.engines import add_engine_options, load_for_inference, source_comparison
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
    non_negative_float,
    non_negative_int,
    output_dir,
    positive_float,
    positive_int,
    positive_int_list,
    set_threads,
)
from vitkit.errors import VitkitError


def add_commands(sub: Any) -> None:
    p = add_command(
        sub, "eval", "top-1/top-5, per-class accuracy and a confusion matrix for a checkpoint"
    )
    add_checkpoint(p, several=True)
    p.add_argument(
        "--seeds",
        type=positive_int,
        help="evaluate CKPT with {seed} replaced by 0..N-1 (e.g. runs/ft-s{seed}) and report "
        "mean ± std across the runs, as the paper's tables",
    )
    add_data(p, workers=True)
    add_output(p, "directory for eval.json and confusion.png", "eval_SPLIT")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier evaluation in --out (default: refused; without --out a new "
        "RUN/eval_SPLIT-2, -3, ... is used); never writes into the checkpoint read",
    )
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="a NaFlex model: every image at its aspect ratio, at most N patches, batches "
        "packed with a valid mask (as train --naflex evaluates)",
    )
    p.add_argument(
        "--tta-shift",
        type=non_negative_int,
        default=0,
        metavar="PIXELS",
        help="test-time augmentation: the mean of the image and its copies shifted PIXELS "
        "each way (5 forward passes; 0: off)",
    )
    p.add_argument(
        "--tta-rotate",
        type=non_negative_float,
        default=0,
        metavar="DEGREES",
        help="test-time augmentation: also the copies rotated +-DEGREES (2 more passes; 0: off)",
    )
    p.add_argument(
        "--tta-zoom",
        type=non_negative_float,
        default=0,
        metavar="FRACTION",
        help="test-time augmentation: also the copies scaled by 1 +- FRACTION (2 more passes)",
    )
    add_runtime(p, batch_size=256, fp8=True)
    add_engine_options(p)
    p.set_defaults(func=cmd_eval)

    p = add_command(
        sub,
        "fewshot",
        "the paper's few-shot linear evaluation of a checkpoint's frozen features",
        "Frozen pre-logit features, closed-form regularised least squares onto {-1, 1}^K "
        "targets from N images per class, accuracy on the test split as mean ± std over seeds "
        "(l2 chosen on other training images, never on the test set).",
    )
    add_checkpoint(p)
    g = add_data(p, required=True, split=None, bad_image=False)
    g.add_argument(
        "--test-split", default="test", choices=["val", "test"], help="the split to score on"
    )
    g = p.add_argument_group("probe")
    g.add_argument(
        "--shots",
        type=positive_int_list,
        default="1,5,10,25",
        help="images per class, comma-separated",
    )
    g.add_argument("--seeds", type=positive_int, default=3, help="random draws of the support set")
    g.add_argument(
        "--l2", type=positive_float, nargs="+", help="fixed l2 value(s); default: a 2^k grid"
    )
    g.add_argument(
        "--random-init",
        action="store_true",
        help="the same architecture, freshly initialised (the baseline for pre-training)",
    )
    add_output(p, "write the results as JSON to this file", file=True)
    add_overwrite(p, "replace an existing --out file (never one of the checkpoint read)")
    add_runtime(p, batch_size=256)
    p.set_defaults(func=cmd_fewshot)

    p = add_command(
        sub, "predict", "top-k labels for image files, with the checkpoint's own preprocessing"
    )
    add_images(p)
    add_checkpoint(p)
    p.add_argument("--top-k", type=positive_int, default=5, help="labels to print per image")
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="a NaFlex model: keep each image's aspect ratio, at most N patches (no crop)",
    )
    add_json(p)
    add_engine_options(p, fast=True, precision=True)
    p.set_defaults(func=cmd_predict)


def cmd_eval(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    paths = list(args.ckpt)
    if args.seeds is not None:
        if args.seeds < 1 or not all("{seed}" in p for p in paths):
            raise VitkitError("--seeds N needs N >= 1 and '{seed}' in every --from path")
        paths = [p.replace("{seed}", str(s)) for p in paths for s in range(args.seeds)]
    if args.out and len(paths) > 1:
        from vitkit.output_files import check_destination

        check_destination(args.out, writes=["summary.json"], overwrite=args.overwrite)
    results = []
    for i, path in enumerate(paths):
        out = Path(args.out) / str(i) if args.out and len(paths) > 1 else args.out
        results.append(_eval_one(args, path, out))
    if len(results) > 1:
        from vitkit.eval.checkpoint_eval import mean_std_over_runs

        summary = mean_std_over_runs(results, paths)
        for key, label in (("top1", "top-1"), ("top5", "top-5")):
            s = summary[key]
            print(f"{label}: {s['mean']:.2f} ± {s['std']:.2f} % over {len(s['values'])} runs")
        if args.out:
            from vitkit.checkpoints import atomic_write_text

            atomic_write_text(Path(args.out, "summary.json"), json.dumps(summary, indent=1))
    return 0


def auto_precision(args: argparse.Namespace, path: str) -> argparse.Namespace:
    """``--precision auto`` decided as :func:`vitkit.engines.runner` decides it (and said in
    its words): ``args`` at the precision chosen (an exported model: its own). A decision for
    the CPU: on another --device, refused in one line."""
    import copy

    from vitkit.cli.engines import inference_runner

    if args.device not in (None, "cpu"):
        raise VitkitError(
            f"--precision auto decides for the CPU (its native bf16); on --device {args.device} "
            "give --precision bf16 or fp32"
        )
    run = inference_runner(args, path, precision="auto")
    print(f"precision: {run.precision} ({run.precision_why})")
    chosen = copy.copy(args)
    chosen.precision = run.precision if run.precision in ("fp32", "bf16") else None
    return chosen


def _eval_one(args: argparse.Namespace, path: str, out_arg: str | Path | None) -> Any:
    if args.precision == "auto":
        return _eval_one(auto_precision(args, path), path, out_arg)
    from vitkit.checkpoints import atomic_write_text
    from vitkit.data.shapes_hard import HARD_CLASSES, answer_accuracy
    from vitkit.engines.backends import EngineModel
    from vitkit.engines.checkpoint_runner import bf16_weights, fp8_reference
    from vitkit.engines.float8_inference import GPUModel
    from vitkit.eval import format_result
    from vitkit.eval.checkpoint_eval import (
        EVAL_FILES,
        checkpoint_dataset,
        checkpoint_precision,
        eval_output_dir,
        evaluate_checkpoint,
    )
    from vitkit.eval.compare import Recorder, format_comparison, versus_fp32
    from vitkit.eval.tta import JitterTTA, check_jitter
    from vitkit.output_files import all_or_none
    from vitkit.plotting import plot_confusion_matrix

    fp8 = args.precision == "fp8"  # (bf16 and fp32 of a checkpoint: autocast or not, below)
    model, ckpt, engine_line = load_for_inference(
        args, path, precision="fp8" if fp8 else None, source_options=True
    )
    gpu = model if isinstance(model, GPUModel) else None
    default = output_dir(None if out_arg is None else str(out_arg), ckpt.path, f"eval_{args.split}")
    out = eval_output_dir(
        default, given=out_arg is not None, overwrite=args.overwrite, reads=[ckpt.path]
    )
    precision, why = checkpoint_precision(ckpt, args.precision)
    if isinstance(model, EngineModel):  # the engine's own precision, on the CPU
        if args.precision == "bf16" or args.device not in (None, "cpu"):
            raise VitkitError(f"{engine_line}: runs on the CPU at its own precision only")
        precision, why = model.precision, f"{model.engine} engine"
        model = Recorder(model)
    if gpu is not None:  # bf16 and float8 on its GPU, as loaded
        why = gpu.summary()
    else:
        model.to(args.device)
    jitter = (args.tta_shift, float(args.tta_rotate), float(args.tta_zoom))
    max_seq_len = args.max_seq_len  # (per checkpoint: a NaFlex run's own where not given)
    if any(jitter):
        if isinstance(model, Recorder):
            raise VitkitError(f"{engine_line}: --tta-* runs the PyTorch model only")
        problem = check_jitter(*jitter, options=True)
        if problem is not None:
            raise VitkitError(problem)
        if args.max_seq_len is not None:
            raise VitkitError("--tta-* moves whole images; it does not take --max-seq-len")
        model = JitterTTA(model, *jitter)
    elif not isinstance(model, Recorder):
        max_seq_len = run_max_seq_len(max_seq_len, ckpt)
    data = args.data or ckpt.meta.get("dataset")
    if not data:
        raise VitkitError(f"{ckpt.path}: the checkpoint names no dataset; pass --data")
    if not ckpt.model_config.num_classes:
        raise VitkitError(f"{ckpt.path}: the model has no classification head to evaluate")
    dataset = checkpoint_dataset(ckpt, data, args.split, args.data_root, args.on_bad_image)
    names = dataset.info.class_names
    fp32_model = None
    bf16 = bf16_weights(args.precision, args.device, model, any(jitter))
    if bf16 is not None:  # bf16 weights, measured beside the fp32 model
        fp32_model, model = model, Recorder(bf16)
        why += "; bf16 weights"
    reference = None
    if gpu is not None:  # the same model with bf16 weights on the same GPU, measured beside it
        reference = fp8_reference(path, gpu, **loading(args))
        if any(jitter):
            reference = JitterTTA(reference, *jitter)
        model = Recorder(model)
    result = evaluate_checkpoint(
        model,
        ckpt,
        dataset,
        batch_size=args.batch_size,
        precision="fp32" if fp32_model is not None else precision,
        device=args.device,
        num_workers=args.num_workers,
        max_seq_len=max_seq_len,
    )
    print(f"{path} ({precision}: {why}):")
    print(format_result(result, names))
    out.mkdir(parents=True, exist_ok=True)
    record = {**result.to_json_dict(), "precision": precision}
    record.update(zip(("tta_shift", "tta_rotate", "tta_zoom"), jitter))
    if max_seq_len is not None:
        record["max_seq_len"] = max_seq_len
    if gpu is not None and reference is not None:
        record["fp8"] = {"recipe": gpu.recipe, "float8_layers": gpu.float8_layers}
        record["versus_bf16"] = versus_fp32(
            model, reference, ckpt, dataset, args.batch_size, result,
            device=args.device, max_seq_len=max_seq_len,
        )  # fmt: skip
        print(format_comparison(record["versus_bf16"], "fp8", "bf16"))
    elif isinstance(model, Recorder):
        record["engine"] = model.model.engine
        versus = source_comparison(args, ckpt, dataset, model, result)
        if fp32_model is not None:
            versus = versus_fp32(
                model, fp32_model, ckpt, dataset, args.batch_size, result,
                max_seq_len=max_seq_len,
            )  # fmt: skip
            print(format_comparison(versus, "bf16"))
        if versus is not None:
            record["versus_source"] = versus
    if tuple(names) == HARD_CLASSES:  # the label's two questions, scored apart
        record["shapes_hard"] = answer_accuracy(result.confusion)
        print(
            "shapes-hard: largest shape right {shape:.2%}, side of the smallest right "
            "{side:.2%} ({side_given_shape:.2%} where the shape is right)".format(
                **record["shapes_hard"]
            )
        )
    with all_or_none(out, EVAL_FILES):  # a failure part-way (a full disk) leaves neither
        atomic_write_text(out / "eval.json", json.dumps(record, indent=1))
        png = plot_confusion_matrix(
            result.confusion, names, out / "confusion.png", title=f"{data} ({args.split})"
        )
    print(f"wrote {out / 'eval.json'} and {png}")
    return result


def cmd_fewshot(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    import torch

    from vitkit.checkpoints import atomic_write_text, load_model
    from vitkit.eval.checkpoint_eval import checkpoint_features, checkpoint_precision
    from vitkit.eval.fewshot import DEFAULT_L2_GRID, fewshot_evaluate, format_fewshot
    from vitkit.models.vit import build_model
    from vitkit.output_files import check_destination

    shots = args.shots
    model, ckpt = load_model(args.ckpt, **loading(args))
    if args.out:  # before the features are computed
        check_destination(args.out, reads=[ckpt.path], overwrite=args.overwrite)
    if args.random_init:
        torch.manual_seed(0)
        model = build_model(ckpt.model_config).eval()
    model.to(args.device)
    precision, _ = checkpoint_precision(ckpt, args.precision)
    kw = dict(batch_size=args.batch_size, precision=precision, device=args.device)
    train_f, train_y, k = checkpoint_features(model, ckpt, args.data, "train", **kw)
    test_f, test_y, _ = checkpoint_features(model, ckpt, args.data, args.test_split, **kw)
    results = fewshot_evaluate(
        (train_f, train_y), (test_f, test_y), k, shots, args.seeds, args.l2 or DEFAULT_L2_GRID
    )
    what = "random init" if args.random_init else str(args.ckpt)
    print(f"{what} on {args.data} ({len(test_y)} {args.test_split} images, {k} classes)")
    print(format_fewshot(results, args.seeds))
    if args.out:
        out = {
            "checkpoint": str(args.ckpt),
            "random_init": args.random_init,
            "data": args.data,
            "results": [r.to_json_dict() for r in results],
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps(out, indent=1))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from vitkit.data.images import check_image_files, shown_name
    from vitkit.eval.predict import format_top_k, predict_files

    check_image_files(args.images)  # the cheapest mistake first, before loading any weights
    model, ckpt, engine_line = load_for_inference(args, args.ckpt, precision=args.precision)
    if args.engine or args.fast or args.precision or ckpt.format in ("vitkit-engine", "vitkit-pt2"):
        print(engine_line, file=sys.stderr if args.json else sys.stdout)
    max_seq_len = run_max_seq_len(args.max_seq_len, ckpt)
    for path, preds in zip(
        args.images, predict_files(model, ckpt, args.images, args.top_k, max_seq_len)
    ):
        if args.json:
            print(json.dumps({"image": str(path), "top_k": preds}))
        else:
            print(f"{shown_name(path)}: {format_top_k(preds)}")
    return 0


def run_max_seq_len(given: int | None, ckpt: Any) -> int | None:
    """``--max-seq-len`` as given, else a NaFlex run's own (each image at its aspect ratio, as
    it trained and was tested), said in one line; None: the model's fixed image size."""
    if given is not None:
        _check_sequence_fits(given, ckpt.model_config)
    if given is not None or not getattr(ckpt.model_config, "naflex", False):
        return given
    trained = ckpt.meta.get("train_config")
    seq = trained.get("max_seq_len") if isinstance(trained, dict) else None
    if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
        print(
            f"{ckpt.path}: a NaFlex run trained with --max-seq-len {seq}: each image at its "
            "aspect ratio, as in training (--max-seq-len N to change)",
            file=sys.stderr,
        )
        return seq
    return None


def _check_sequence_fits(seq: int, cfg: Any) -> None:
    """One image of ``seq`` patches, as pixels and through a block (the MLP's hidden layer
    and a few token-sized tensors alive at once), must fit before it is resized and packed."""
    from vitkit.hardware import check_fits

    if not hasattr(cfg, "mlp_dim"):  # (a ResNet: --max-seq-len is refused where it is used)
        return
    ph, pw = cfg.patch_size
    per_token = ph * pw * cfg.in_chans + cfg.mlp_dim + 8 * cfg.width  # fp32 values
    check_fits(
        f"--max-seq-len {seq:,} ({cfg.short_name}, one image)",
        4 * seq * per_token,
        "a smaller --max-seq-len",
    )
