"""Evaluating a loaded checkpoint: its data as its model sees it, top-k on a split, features for
the few-shot probe, and the mean ± std over several runs (the paper's tables)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint
from vitkit.data import load_dataset, make_loader, to_model_input
from vitkit.data.images import eval_transform
from vitkit.errors import VitkitError
from vitkit.eval.classification import ClassificationResult, evaluate_classification
from vitkit.eval.fewshot import extract_features
from vitkit.output_files import fresh_directory

EVAL_FILES = ("eval.json", "confusion.png")


def checkpoint_dataset(
    ckpt: Checkpoint,
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
    run = ckpt.meta.get("train_config", {})  # the run's split: val must stay held out
    kw: dict[str, Any] = {"on_bad_image": on_bad_image, "train_transform": False}
    if data == run.get("data"):
        kw.update(seed=run.get("seed", 0), val_size=run.get("val_size"))
    if data_root or (data == run.get("data") and run.get("data_root")):
        kw["root"] = data_root or run["data_root"]
    pre = ckpt.preprocess  # image files: its own resize, crop and interpolation too
    kw["eval_transform"] = eval_transform(pre)
    dataset = load_dataset(data, split, image_size=pre.image_size, **kw)  # type: ignore[arg-type]
    problem = class_mismatch(ckpt, dataset, data)
    if check_classes and problem:
        raise VitkitError(problem)
    return dataset


def class_mismatch(ckpt: Checkpoint, dataset: Any, data: str) -> str | None:
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


def checkpoint_precision(ckpt: Checkpoint, precision: str | None) -> tuple[str, str]:
    """The precision to evaluate ``ckpt`` in and why: ``precision`` if given, else the one
    its run trained in (its ``train_config``), else fp32."""
    if precision is not None:
        return precision, "as asked"
    run = ckpt.meta.get("train_config")
    if isinstance(run, dict) and run.get("precision") in ("fp32", "bf16"):
        return str(run["precision"]), "the run's; --precision to change"
    if isinstance(run, dict) and run.get("precision") == "fp8":
        return "bf16", "the run's fp8 is bf16 outside its float8 matmuls; --precision to change"
    return "fp32", "the checkpoint names none"


def eval_output_dir(out: Path, given: bool, overwrite: bool, reads: Sequence[Path] = ()) -> Path:
    """Where an evaluation writes ``eval.json`` and ``confusion.png``: ``out``, unless an
    earlier evaluation is there; then the first free ``out-2``, ``out-3``, ... for a default
    place, while a ``given`` one is refused unless ``overwrite``; never inside a checkpoint in
    ``reads`` (``vitkit.output_files.fresh_directory``)."""
    return fresh_directory(out, given=given, overwrite=overwrite, writes=EVAL_FILES, reads=reads)


def non_finite_weights(model: nn.Module) -> list[str]:
    """Names of the floating-point weights holding NaN or inf (of a sharded FSDP parameter,
    this rank's shard; of a float8 weight, its values times its scales)."""
    return [
        name
        for name, t in model.state_dict().items()
        if t.is_floating_point() and not bool(torch.isfinite(_values(t)).all())
    ]


def _values(t: Tensor) -> Tensor:
    """A weight as a plain tensor: a sharded parameter's local shard, or a quantized weight
    (torchao's float8 ``--precision fp8`` inference casts once) dequantized."""
    if hasattr(t, "to_local"):
        return t.to_local()
    if type(t) is not torch.Tensor and hasattr(t, "qdata"):
        return t.dequantize()
    return t


def check_finite_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Refuse a model with NaN or infinite weights (a diverged run): its accuracy means
    nothing."""
    bad = non_finite_weights(model)
    if bad:
        raise VitkitError(
            f"{ckpt.path}: {len(bad)} weight tensor(s) hold NaN or infinite values (first: "
            f"{bad[0]}); the training that wrote it diverged, there is nothing to evaluate or "
            "predict with or export"
        )


def _prepare(ckpt: Checkpoint, device: str | None = None) -> Callable[[Tensor], Tensor]:
    """uint8 batch (moved to ``device`` if given) → the model's normalised input."""
    pre = ckpt.preprocess

    def prepare(images: Tensor) -> Tensor:
        x = images.to(device) if device is not None else images
        return to_model_input(
            x, pre.image_size, pre.channels, pre.mean, pre.std, pre.rescale_factor
        )

    return prepare


def _packed_loader(
    ckpt: Checkpoint, dataset: Any, batch_size: int, num_workers: int, max_seq_len: int
) -> tuple[Any, Callable[[Any], Any]]:
    """A NaFlex checkpoint's evaluation batches (:mod:`vitkit.data.naflex_batches`) and the
    step that normalises them."""
    from vitkit.data.naflex_batches import (
        CollatePacked,
        NaFlexTransform,
        PackedImages,
        native_dataset,
        normalize_packed,
    )
    from vitkit.registry.model_config import ViTConfig

    cfg, pre = ckpt.model_config, ckpt.preprocess
    if not isinstance(cfg, ViTConfig) or not cfg.naflex:
        raise VitkitError(
            f"{ckpt.path}: --max-seq-len packs images for a NaFlex model; this one has fixed "
            "position embeddings (evaluate it without --max-seq-len)"
        )
    transform = NaFlexTransform(cfg.patch_size, max_seq_len, pre.channels, pre.interpolation)
    loader = make_loader(
        native_dataset(dataset, transform),
        batch_size,
        shuffle=False,
        drop_last=False,
        seed=0,
        num_workers=num_workers,
        collate_fn=CollatePacked(cfg.patch_size, max_seq_len),
    )

    def prepare(images: PackedImages) -> dict[str, Tensor]:
        return normalize_packed(images, pre.channels, pre.mean, pre.std, pre.rescale_factor)

    return loader, prepare


def _autocast_dtype(precision: str) -> torch.dtype | None:
    return torch.bfloat16 if precision == "bf16" else None


def evaluate_checkpoint(
    model: nn.Module,
    ckpt: Checkpoint,
    dataset: Any,
    *,
    batch_size: int = 256,
    precision: str = "fp32",
    device: str = "cpu",
    num_workers: int = 0,
    progress: bool = True,
    max_seq_len: int | None = None,
) -> ClassificationResult:
    """Top-k, per-class accuracy and the confusion matrix of ``model`` (loaded from ``ckpt``)
    on ``dataset``, with the checkpoint's own preprocessing. ``max_seq_len`` (a NaFlex model):
    every image at its own aspect ratio, at most that many patches, batches packed with a
    valid mask (the batches ``train --naflex`` validates and tests on)."""
    num_classes = ckpt.model_config.num_classes
    if not num_classes:
        raise VitkitError(f"{ckpt.path}: the model has no classification head to evaluate")
    check_finite_weights(model, ckpt)
    prepare = _prepare(ckpt, device)
    if max_seq_len is None:
        loader = make_loader(
            dataset, batch_size, shuffle=False, drop_last=False, seed=0, num_workers=num_workers
        )
    else:
        loader, prepare = _packed_loader(ckpt, dataset, batch_size, num_workers, max_seq_len)
    return evaluate_classification(
        model,
        loader,
        num_classes,
        device=device,
        prepare=prepare,
        autocast_dtype=_autocast_dtype(precision),
        progress=progress,
    )


def checkpoint_features(
    model: nn.Module,
    ckpt: Checkpoint,
    data: str,
    split: str,
    *,
    batch_size: int = 256,
    precision: str = "fp32",
    device: str = "cpu",
) -> tuple[Tensor, Tensor, int]:
    """Frozen pre-logit features, labels and the class count of ``split`` of ``data``."""
    check_finite_weights(model, ckpt)
    pre = ckpt.preprocess
    dataset = load_dataset(data, split, image_size=pre.image_size, train_transform=False)  # type: ignore[arg-type]
    loader = make_loader(dataset, batch_size, shuffle=False, drop_last=False, seed=0)
    f, y = extract_features(
        model,
        loader,
        _prepare(ckpt),  # extract_features moves each batch to the device first
        device=device,
        autocast_dtype=_autocast_dtype(precision),
    )
    return f, y, dataset.info.num_classes


def mean_std_over_runs(
    results: Sequence[ClassificationResult], names: Sequence[str]
) -> dict[str, Any]:
    """Top-1 and top-5 in percent over several runs: mean, sample std and the values."""
    summary: dict[str, Any] = {"checkpoints": list(names)}
    for key in ("top1", "top5"):
        values = [100 * r.metrics()[key] for r in results]
        summary[key] = {
            "mean": float(np.mean(values)),
            "std": float(np.std(values, ddof=1)),
            "values": values,
        }
    return summary
