"""``vitkit train``, ``finetune`` and ``pretrain``: options → TrainConfig → Trainer."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from vitkit.cli.options import (
    add_command,
    add_loading,
    count,
    path,
    positive_float,
    positive_fraction_or_count,
    threads,
)
from vitkit.cli.train_options import add_train_options, train_config_from_args
from vitkit.errors import RANK_ERRORS_ENV, VitkitError


class _Objective(argparse.Action):
    """``--objective``, which also names the default recipe in a ``--help`` given after it
    (``pretrain --objective mae --help``: "default: mnist-mae")."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values)
        for action in parser._actions:
            if action.dest == "recipe":
                action.help = f"recipe to start from (default: mnist-{values})"


def add_commands(sub: Any) -> None:
    p = add_command(
        sub,
        "train",
        "train a ViT (default: the MNIST recipe)",
        "Train a ViT. With no options this runs the default recipe: a small ViT on the full "
        "MNIST, then prints the test accuracy and leaves a checkpoint, metrics.jsonl, "
        "curves.png and a confusion matrix in the output directory. Any option overrides the "
        "recipe's value; 'vitkit train --list-recipes' shows each recipe's settings.",
    )
    add_train_options(p, "mnist", naflex=True)
    p.add_argument(
        "--init-from",
        type=path,
        metavar="CKPT",
        help="start from this checkpoint (see also 'finetune')",
    )
    add_loading(p.add_argument_group("checkpoint"), assume=False)  # (-o: the model options)
    p.set_defaults(func=cmd_train)

    p = add_command(
        sub,
        "finetune",
        "fine-tune a checkpoint (any format) the paper's way, optionally with its lr sweep",
        "Start from CKPT (vitkit, npz, timm or Hugging Face), replace the head by a "
        "zero-initialised one, drop the pre-logits layer, resample the position embeddings to "
        "--image-size, and train with the paper-finetune recipe (SGD, momentum 0.9, no weight "
        "decay, clipping at 1, warmup + cosine). --lr-sweep picks the learning rate on a "
        "held-out slice of the training set, then retrains on all of it.",
    )
    p.add_argument(
        "--from",
        dest="init_from",
        type=path,
        required=True,
        metavar="CKPT",
        help="the checkpoint to fine-tune (any format)",
    )
    p.add_argument(
        "--lr-sweep",
        nargs="*",
        type=positive_float,
        metavar="LR",
        help="sweep these learning rates (none given: the paper's 0.001 0.003 0.01 0.03)",
    )
    p.add_argument(
        "--holdout",
        type=positive_fraction_or_count,
        default=0.1,
        help="fraction (or count) of the training set held out to choose the learning rate",
    )
    p.add_argument(
        "--no-retrain",
        action="store_true",
        help="report the best sweep run instead of retraining on the whole training set",
    )
    add_train_options(p, "paper-finetune", naflex=True)
    add_loading(p.add_argument_group("checkpoint"), assume=False)  # (-o: the model options)
    p.set_defaults(func=cmd_finetune)

    p = add_command(
        sub,
        "pretrain",
        "self-supervised pre-training without labels: masked patch prediction or MAE",
        "Pre-train a ViT on images without their labels. --objective mpp is the paper's masked "
        "patch prediction (50 % of patch embeddings corrupted: 80 % [mask], 10 % another "
        "patch, 10 % kept; the 3-bit mean colour of every corrupted patch predicted); "
        "--objective mae is the masked autoencoder (encoder on the visible 25 %, small "
        "decoder, pixel MSE). The result is an ordinary vitkit checkpoint of the encoder (no "
        "head) for 'vitkit finetune --from' and 'vitkit fewshot --from'. Objective settings: "
        "-p KEY=VALUE; mpp: corrupt_ratio, mask_prob, random_prob, target "
        "(mean-color|downsized|pixels), bits, grid; mae: mask_ratio, decoder_width, "
        "decoder_depth, decoder_heads, decoder_mlp_dim, norm_pix_loss.",
    )
    p.add_argument(
        "--objective",
        choices=["mpp", "mae"],
        action=_Objective,
        help="the pretext task (default: the recipe's; the recipe defaults to mnist-OBJECTIVE)",
    )
    p.add_argument(
        "-p",
        "--objective-opt",
        action="append",
        metavar="KEY=VALUE",
        help="override an objective setting, e.g. -p target=downsized -p mask_ratio=0.6",
    )
    add_train_options(p, "mnist-mpp", shown="mnist-OBJECTIVE, i.e. mnist-mpp or mnist-mae")
    p.set_defaults(func=cmd_pretrain, recipe=None)


# ---------------------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    if args.list_recipes:
        return list_recipes()
    if args.nproc_per_node is not None:
        check_model_before_spawning(train_config_from_args(args))
        return launch_torchrun(args.nproc_per_node, args.argv)
    from vitkit.train import distributed
    from vitkit.train.trainer import Trainer

    cfg = default_out_dir(args, train_config_from_args(args))
    env = distributed.DistEnv()
    if distributed.launched_by_torchrun():
        env = distributed.init_distributed(cfg.device)
    try:
        trainer = Trainer(cfg)
        if env.is_main:
            print(banner(trainer, env), file=sys.stderr)
        report = trainer.fit()
        if env.is_main:
            print_summary(report, cfg.out_dir)
        return 0
    finally:
        distributed.shutdown()


def cmd_finetune(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        raise VitkitError(
            "finetune runs in one process; use torchrun with 'vitkit train "
            "--recipe paper-finetune' and --init-from for data parallelism"
        )
    from vitkit.train.finetune import lr_sweep
    from vitkit.train.trainer import Trainer

    cfg = default_out_dir(args, train_config_from_args(args))
    if not cfg.data:
        raise VitkitError("finetune needs --data (a dataset to fine-tune on)")
    if args.lr_sweep is None:
        trainer = Trainer(cfg)
        print(banner(trainer, None), file=sys.stderr)
        report = trainer.fit()
        print_summary(report, cfg.out_dir)
        if "ema_test_top1" in report:
            print(f"ema_test_top1: {100 * report['ema_test_top1']:.2f} %")
        return 0
    from vitkit.train.recipes import PAPER_FINETUNE_LRS

    result = lr_sweep(
        cfg, args.lr_sweep or PAPER_FINETUNE_LRS, holdout=args.holdout, retrain=not args.no_retrain
    )
    for r in result["runs"]:
        print(f"lr {r['lr']:g}: held-out top-1 {100 * r['val_top1']:.2f} %")
    print(f"chosen lr {result['chosen_lr']:g}")
    report = result["final"]["report"]
    for key in ("test_top1", "ema_test_top1"):
        if key in report:
            print(f"{key}: {100 * report[key]:.2f} %")
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        raise VitkitError("pretrain runs in one process for now (no torchrun)")
    if args.list_recipes:
        return list_recipes()
    from vitkit.train.pretrain import Pretrainer

    if args.recipe is None:
        args.recipe = f"mnist-{args.objective or 'mpp'}"
    cfg = default_out_dir(args, train_config_from_args(args))
    if not cfg.data:
        raise VitkitError("pretrain needs --data (images to pre-train on)")
    trainer = Pretrainer(cfg)
    mc = trainer.model_cfg
    n_obj = sum(p.numel() for p in trainer.objective.parameters())
    print(
        f"pre-training {mc.short_name} ({mc.image_size[0]}x{mc.image_size[1]} px, "
        f"{sum(p.numel() for p in trainer.model.parameters()):,} parameters) with {cfg.objective} "
        f"({n_obj:,} objective parameters) on {trainer.info.name}: "
        f"{count(len(trainer.train_set), 'image')} (labels unused), "
        f"{epochs_run(trainer)}, {count(trainer.total_steps, 'step')}, "
        f"{trainer.cfg.precision}, "
        f"{threads()} threads -> {cfg.out_dir}",
        file=sys.stderr,
    )
    report = trainer.fit()
    split = "test" if "test_loss" in report else "val"
    if f"{split}_loss" in report:
        line = f"{split} {cfg.objective} loss {report[f'{split}_loss']:.4f}"
        if f"{split}_acc" in report:
            line += f", corrupted-patch target accuracy {100 * report[f'{split}_acc']:.2f} %"
        print(line + f"  ({report['wall_s']:.0f} s)")
    out = cfg.out_dir
    print(f"encoder checkpoint: {out}/checkpoints (LATEST)   report: {out}/report.json")
    print(f"plots: {out}/curves.png  {out}/preview.png")
    print(f"next: vitkit finetune --from {out} --data D  or  vitkit fewshot --from {out} --data D")
    return 0


# ---------------------------------------------------------------------------------------------


def default_out_dir(args: argparse.Namespace, cfg: Any) -> Any:
    """No --out-dir and no --resume: the recipe's run directory, or (when it already holds a
    run) the first free ``runs/NAME-2``, ``-3``, ..., said on stderr. A given --out-dir stays:
    the trainer refuses one that holds a run unless --resume."""
    from vitkit.train.checkpoint_manager import fresh_run_dir

    if args.out_dir is not None or args.resume:
        return cfg
    out = fresh_run_dir(Path(cfg.out_dir))
    if out != Path(cfg.out_dir):
        if os.environ.get("RANK", "0") == "0":  # (under torchrun: once)
            print(f"{cfg.out_dir} already holds a run; this run goes to {out}", file=sys.stderr)
        cfg = dataclasses.replace(cfg, out_dir=str(out))
    return cfg


def list_recipes() -> int:
    from vitkit.train.recipes import RECIPES
    from vitkit.train.trainer import TrainConfig

    keys = "data model model_overrides epochs batch_size optimizer lr weight_decay "
    keys += "warmup_epochs schedule grad_clip label_smoothing augment precision out_dir"
    default = TrainConfig().to_dict()
    for r in RECIPES.values():
        print(f"{r.name}\n    " + "\n    ".join(line.strip() for line in r.doc.splitlines()))
        settings = r.config.to_dict()  # the usual ones, then every other one the recipe sets
        shown = keys.split() + [k for k in settings if settings[k] != default[k]]
        shown = list(dict.fromkeys(shown))
        print("    settings: " + ", ".join(f"{k}={settings[k]}" for k in shown) + "\n")
    return 0


def check_model_before_spawning(cfg: Any) -> None:
    """The model's config, checked once before torchrun starts N processes that would each
    fail on it (and end with torchrun's traceback hint). The data's size is not known yet: an
    error about the image size is left to the run, which knows it."""
    from vitkit.data.datasets import check_data_spec
    from vitkit.registry.model_config import model_config

    if cfg.max_seq_len is not None:
        raise VitkitError("--naflex runs in one process for now (no --nproc-per-node, torchrun)")
    check_data_spec(cfg.data)
    if cfg.init_from or cfg.resume:  # (the checkpoint's config: checked where it is read)
        return
    size = {"image_size": cfg.image_size} if cfg.image_size else {}
    try:
        model_config(cfg.model, **{**cfg.model_overrides, **size})
    except VitkitError as e:
        if "image" not in str(e) or size:
            raise VitkitError(f"--model {cfg.model}: {e}") from None


def launch_torchrun(nproc_per_node: int, argv: list[str]) -> int:
    """``vitkit train --nproc-per-node N ...``: the same command under torchrun --standalone."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if nproc_per_node < 1:
        raise VitkitError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if "RANK" in os.environ:
        raise VitkitError("--nproc-per-node inside torchrun: drop it, torchrun already launched")
    argv, rest = list(argv), []
    while argv:
        a = argv.pop(0)
        if a == "--nproc-per-node":
            argv.pop(0)
        elif not a.startswith("--nproc-per-node="):
            rest.append(a)
    launch = ["--standalone", "--nproc-per-node", str(nproc_per_node), "-m", "vitkit"]
    # One line for a failure, as without the launcher: each process writes its refusal to a
    # file instead of stderr, the first one is printed once, and torchrun's own logging (the
    # elastic agent's "failed (exitcode: 2)", its traceback hint) stays quiet below errors.
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its banner
    with tempfile.TemporaryDirectory(prefix="vitkit-ranks-") as errors:
        os.environ[RANK_ERRORS_ENV] = errors
        quiet = [logging.getLogger(n) for n in ("torch.distributed", "torch.distributed.elastic")]
        levels = [q.level for q in quiet]
        for q in quiet:
            q.setLevel(logging.CRITICAL)
        try:
            torchrun([*launch, *rest])
        except ChildFailedError as e:
            written = sorted(Path(errors).glob("rank*.txt"))
            if written:
                raise VitkitError(written[0].read_text().strip()) from None
            rank, failure = e.get_first_failure()
            raise VitkitError(
                f"training process {rank} failed (exit code {failure.exitcode}); "
                "its output is above"
            ) from None
        finally:
            os.environ.pop(RANK_ERRORS_ENV, None)
            for q, level in zip(quiet, levels, strict=True):
                q.setLevel(level)
    return 0


def banner(trainer: Any, env: Any) -> str:
    """The line a training run starts with: model, data, steps, precision, threads, output (and
    for fine-tuning, the checkpoint it starts from)."""
    cfg, mc = trainer.cfg, trainer.model_cfg
    n_params = sum(p.numel() for p in trainer.model.parameters())
    scale = ""
    if env is not None and env.enabled:
        scale = f", {trainer.strategy.upper()} on {env.world_size} processes"
    compiled = ""
    if hasattr(trainer.forward_model, "_orig_mod"):  # torch.compile wrapped it
        compiled = f", compiled ({cfg.compile}; the first step compiles)"
    size = f"{mc.image_size[0]}x{mc.image_size[1]} px"
    if cfg.max_seq_len is not None:  # --naflex
        size = f"NaFlex: each image at its aspect ratio, at most {cfg.max_seq_len} patches"
    start = f" from {cfg.init_from}" if cfg.init_from else ""
    precision = cfg.precision
    if precision == "fp8":
        n = len(trainer.fp8_layers)
        precision = f"fp8 ({cfg.fp8_recipe}: {count(n, 'Linear layer')} in float8, the rest bf16)"
    if cfg.attention_backend != "auto":
        precision += f", {cfg.attention_backend} attention"
    return (
        f"{'fine-tuning' if cfg.init_from else 'training'} {mc.short_name}{start} ({size}) "
        f"({n_params:,} parameters) on {trainer.info.name}: "
        f"{count(len(trainer.train_set), 'image')}, {epochs_run(trainer)}, "
        f"{count(trainer.total_steps, 'step')}, {precision}, "
        f"{threads()} threads{scale}{compiled} -> {cfg.out_dir}"
    )


def epochs_run(trainer: Any) -> str:
    """The epochs the run will do: the recipe's, or fewer where --max-steps ends it first (the
    fine-tuning recipes set epochs=10,000 and bound the run by steps)."""
    return count(getattr(trainer, "epochs_planned", trainer.cfg.epochs), "epoch")


def print_summary(report: dict[str, Any], out_dir: str) -> None:
    """A finished run's accuracy, speed and where its files are."""
    split = "test" if "test_top1" in report else "val"
    if f"{split}_top1" in report:
        speed = report["train_images_per_s"]
        print(
            f"{split} accuracy: top-1 {100 * report[f'{split}_top1']:.2f}%  "
            f"top-5 {100 * report[f'{split}_top5']:.2f}%  ({report['wall_s']:.0f} s"
            + (f", {speed:.0f} train images/s)" if speed else ")")
        )
    print(f"checkpoint: {out_dir}/checkpoints (LATEST)   report: {out_dir}/report.json")
    print(f"report with attention analysis: {out_dir}/report.html")
    print(f"plots: {out_dir}/curves.png  {out_dir}/confusion_{split}.png")
