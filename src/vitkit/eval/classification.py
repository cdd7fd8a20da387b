"""Classification evaluation: top-k accuracy, mean cross-entropy, per-class accuracy, confusion.

The loader contract is the one the data package yields: an iterable of
``(images_uint8 [B,C,H,W], labels int64 [B], n_skipped)``, where ``n_skipped`` counts the
samples of that batch that could not be decoded. Pixels reach the model through ``prepare``
(default: ``x.float() / 127.5 - 1``, i.e. [0, 255] -> [-1, 1]), on the evaluation device.

Every sum is kept on the device in float64 / int64 and read back once at the end, so the
result does not depend on the batch size and a GPU evaluation does not synchronise per batch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitkit.errors import VitkitError

Batch = tuple[torch.Tensor, torch.Tensor, int]
Prepare = Callable[[torch.Tensor], torch.Tensor]


def default_prepare(images: torch.Tensor) -> torch.Tensor:
    """Map uint8 pixels in [0, 255] to float32 in [-1, 1]."""
    return images.float() / 127.5 - 1.0


def topk_correct(
    logits: torch.Tensor, labels: torch.Tensor, ks: Sequence[int] = (1, 5)
) -> dict[int, int]:
    """Count the samples whose label is among the ``k`` largest logits, for each ``k`` in ``ks``.

    A ``k`` larger than the number of classes is clamped to it (every sample is then correct).
    Ties between logits are broken by ``torch.topk``.
    """
    counts = _topk_correct_tensors(logits, labels, ks)
    return {k: int(c) for k, c in counts.items()}


def _topk_correct_tensors(
    logits: torch.Tensor, labels: torch.Tensor, ks: Sequence[int]
) -> dict[int, torch.Tensor]:
    """``topk_correct`` with the counts left as int64 tensors on the logits' device."""
    if logits.ndim != 2:
        raise VitkitError(f"logits must be [B, K], got shape {tuple(logits.shape)}")
    if labels.shape != logits.shape[:1]:
        raise VitkitError(
            f"labels must be [B] with B={logits.shape[0]}, got shape {tuple(labels.shape)}"
        )
    if any(k < 1 for k in ks):
        raise VitkitError(f"every k must be >= 1, got {tuple(ks)}")
    num_classes = logits.shape[1]
    maxk = min(max(ks), num_classes)
    top = logits.topk(maxk, dim=1).indices  # [B, maxk], best first
    hit = top == labels.to(top.device).unsqueeze(1)  # at most one True per row
    return {k: hit[:, : min(k, num_classes)].sum(dtype=torch.int64) for k in ks}


@dataclass(frozen=True, eq=False)
class ClassificationResult:
    """Everything one pass over an evaluation set measured.

    ``eq=False`` because a dataclass ``__eq__`` cannot compare the ``confusion`` array; the
    array is copied and made read-only so the result really is frozen.
    """

    num_samples: int  # samples evaluated (skipped ones excluded)
    loss: float  # mean cross-entropy over the samples, in nats
    top1: float  # fraction in [0, 1]
    top5: float  # fraction in [0, 1]; k clamped to the number of classes
    per_class_accuracy: tuple[float, ...]  # top-1 per true class; NaN for a class with no samples
    confusion: np.ndarray  # int64 [K, K]; rows = true class, columns = predicted class
    n_skipped: int  # samples the loader could not decode, summed over batches

    def __post_init__(self) -> None:
        confusion = np.array(self.confusion, dtype=np.int64, copy=True)
        if confusion.ndim != 2 or confusion.shape[0] != confusion.shape[1]:
            raise VitkitError(f"confusion must be a square [K, K] array, got {confusion.shape}")
        if len(self.per_class_accuracy) != confusion.shape[0]:
            raise VitkitError(
                f"per_class_accuracy has {len(self.per_class_accuracy)} entries "
                f"but confusion is {confusion.shape}"
            )
        confusion.setflags(write=False)
        object.__setattr__(self, "confusion", confusion)
        object.__setattr__(self, "per_class_accuracy", tuple(self.per_class_accuracy))

    @property
    def num_classes(self) -> int:
        return int(self.confusion.shape[0])

    def metrics(self) -> dict[str, float]:
        """The scalar metrics, flat, as floats (for logging)."""
        return {
            "loss": float(self.loss),
            "top1": float(self.top1),
            "top5": float(self.top5),
            "num_samples": float(self.num_samples),
            "n_skipped": float(self.n_skipped),
        }

    def to_json_dict(self) -> dict[str, Any]:
        """Plain Python values that ``json.dumps(..., allow_nan=False)`` accepts.

        NaN (a class with no samples) becomes ``None``; the confusion matrix becomes nested lists.
        """
        return {
            "num_samples": int(self.num_samples),
            "loss": _json_float(self.loss),
            "top1": _json_float(self.top1),
            "top5": _json_float(self.top5),
            "per_class_accuracy": [_json_float(a) for a in self.per_class_accuracy],
            "confusion": self.confusion.tolist(),
            "n_skipped": int(self.n_skipped),
        }


def _json_float(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def evaluate_classification(
    model: nn.Module,
    loader: Iterable[Batch],
    num_classes: int,
    *,
    device: str | torch.device = "cpu",
    prepare: Prepare | None = None,
    autocast_dtype: torch.dtype | None = None,
    progress: bool = False,
    max_batches: int | None = None,
) -> ClassificationResult:
    """Run ``model`` over ``loader`` once and measure it.

    The model runs in eval mode under ``torch.inference_mode()`` (``torch.no_grad()`` for a
    model holding torchao's float8 layers, an fp8 run's own, whose tensors autocast cannot cast
    in inference mode); the training flag of every submodule is restored afterwards.
    ``autocast_dtype`` (e.g. ``torch.bfloat16``) turns on ``torch.autocast`` for the forward pass;
    the loss is always computed in float64.
    ``max_batches`` stops after that many batches (``None``: the whole loader).
    """
    if num_classes < 1:
        raise VitkitError(f"num_classes must be >= 1, got {num_classes}")
    if max_batches is not None and max_batches < 0:
        raise VitkitError(f"max_batches must be >= 0, got {max_batches}")
    device = torch.device(device)
    prepare = default_prepare if prepare is None else prepare
    batches = _maybe_progress(loader, progress, max_batches)

    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        float8 = any(type(m).__name__ == "Float8Linear" for m in model.modules())
        with torch.no_grad() if float8 else torch.inference_mode():
            sums = _accumulate(model, batches, num_classes, device, prepare, autocast_dtype)
    finally:
        for module, training in modes:
            module.training = training
    return _result_from_sums(*sums)


def _maybe_progress(
    loader: Iterable[Batch], progress: bool, max_batches: int | None
) -> Iterable[Batch]:
    """Cut the loader to ``max_batches`` and wrap it in a tqdm bar when asked."""
    batches: Iterable[Batch] = loader
    try:
        total: int | None = len(loader)  # type: ignore[arg-type]
    except TypeError:  # a generator, or a DataLoader over an IterableDataset
        total = None
    if max_batches is not None:
        batches = itertools.islice(loader, max_batches)
        total = max_batches if total is None else min(total, max_batches)
    if progress:
        from vitkit.progress import progress as bar

        batches = bar(batches, total=total, desc="eval", leave=False)
    return batches


def _accumulate(
    model: nn.Module,
    batches: Iterable[Batch],
    num_classes: int,
    device: torch.device,
    prepare: Prepare,
    autocast_dtype: torch.dtype | None,
) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Sum loss, top-1/top-5 hits and the confusion matrix over all batches, on ``device``."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    top1 = torch.zeros((), dtype=torch.int64, device=device)
    top5 = torch.zeros((), dtype=torch.int64, device=device)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    num_samples = 0
    n_skipped = 0
    for images, labels, skipped in batches:
        n_skipped += int(skipped)
        if labels.numel() == 0:
            continue
        _check_labels(labels, num_classes)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, dtype=torch.int64, non_blocking=True)
        x = prepare(images)
        if autocast_dtype is None:
            logits = model(x)
        else:
            with torch.autocast(device.type, dtype=autocast_dtype):
                logits = model(x)
        if logits.ndim != 2 or logits.shape != (labels.shape[0], num_classes):
            raise VitkitError(
                f"model returned logits of shape {tuple(logits.shape)}, expected "
                f"[{labels.shape[0]}, {num_classes}] (batch size, num_classes)"
            )
        logits = logits.double()
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        hits = _topk_correct_tensors(logits, labels, (1, 5))
        top1 += hits[1]
        top5 += hits[5]
        pred = logits.argmax(dim=1)
        confusion += torch.bincount(labels * num_classes + pred, minlength=num_classes**2)
        num_samples += int(labels.shape[0])
    return num_samples, loss_sum, top1, top5, confusion, n_skipped


def _check_labels(labels: torch.Tensor, num_classes: int) -> None:
    if labels.ndim != 1:
        raise VitkitError(f"labels must be [B], got shape {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.is_complex():
        raise VitkitError(f"labels must be integers, got {labels.dtype}")
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_classes:
        raise VitkitError(
            f"labels must be in [0, {num_classes}), got values in [{lo}, {hi}]; "
            f"is num_classes={num_classes} right?"
        )


def _result_from_sums(
    num_samples: int,
    loss_sum: torch.Tensor,
    top1: torch.Tensor,
    top5: torch.Tensor,
    confusion_flat: torch.Tensor,
    n_skipped: int,
) -> ClassificationResult:
    if num_samples == 0:
        raise VitkitError(
            f"the loader yielded no samples to evaluate ({n_skipped} skipped as unreadable)"
        )
    k = math.isqrt(confusion_flat.numel())
    confusion = confusion_flat.cpu().numpy().reshape(k, k)
    per_class_total = confusion.sum(axis=1)
    per_class_correct = np.diag(confusion)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(
            per_class_total > 0, per_class_correct / np.maximum(per_class_total, 1), np.nan
        )
    return ClassificationResult(
        num_samples=num_samples,
        loss=float(loss_sum) / num_samples,
        top1=int(top1) / num_samples,
        top5=int(top5) / num_samples,
        per_class_accuracy=tuple(float(a) for a in per_class),
        confusion=confusion,
        n_skipped=n_skipped,
    )


class ClassificationEvaluator:
    """The evaluator protocol for classification: built with data, ``run(model)`` -> metrics.

    ``run`` returns ``{prefix + "top1", prefix + "top5", prefix + "loss"}`` and keeps the full
    :class:`ClassificationResult` in ``last_result``.
    """

    def __init__(
        self,
        loader: Iterable[Batch],
        num_classes: int,
        *,
        device: str | torch.device = "cpu",
        prepare: Prepare | None = None,
        autocast_dtype: torch.dtype | None = None,
        prefix: str = "",
        max_batches: int | None = None,
    ) -> None:
        self.loader = loader
        self.num_classes = num_classes
        self.device = device
        self.prepare = prepare
        self.autocast_dtype = autocast_dtype
        self.prefix = prefix
        self.max_batches = max_batches
        self.last_result: ClassificationResult | None = None

    def run(self, model: nn.Module) -> dict[str, float]:
        result = evaluate_classification(
            model,
            self.loader,
            self.num_classes,
            device=self.device,
            prepare=self.prepare,
            autocast_dtype=self.autocast_dtype,
            max_batches=self.max_batches,
        )
        self.last_result = result
        p = self.prefix
        return {f"{p}top1": result.top1, f"{p}top5": result.top5, f"{p}loss": result.loss}


def format_result(result: ClassificationResult, class_names: Sequence[str]) -> str:
    """A readable multi-line report: summary lines, then one row per class."""
    if len(class_names) != result.num_classes:
        raise VitkitError(
            f"got {len(class_names)} class names for a {result.num_classes}-class result"
        )
    skipped = f" ({result.n_skipped} skipped as unreadable)" if result.n_skipped else ""
    lines = [
        f"samples: {result.num_samples}{skipped}",
        f"top-1:   {100 * result.top1:.2f}%",
        f"top-5:   {100 * result.top5:.2f}%",
        f"loss:    {result.loss:.4f}",
        "",
    ]
    totals = result.confusion.sum(axis=1)
    correct = np.diag(result.confusion)
    names = [str(n) for n in class_names]
    width = max([len("class"), *map(len, names)])
    lines.append(f"{'class':<{width}}  {'samples':>8}  {'correct':>8}  {'accuracy':>8}")
    lines.append(f"{'-' * width}  {'-' * 8}  {'-' * 8}  {'-' * 8}")
    for name, n, c, acc in zip(names, totals, correct, result.per_class_accuracy, strict=True):
        acc_text = "n/a" if math.isnan(acc) else f"{100 * acc:.2f}%"
        lines.append(f"{name:<{width}}  {int(n):>8}  {int(c):>8}  {acc_text:>8}")
    return "\n".join(lines)
