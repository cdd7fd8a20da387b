"""The paper's few-shot linear evaluation (Sec. 4.1, "Metrics"; Appendix).

"Few-shot accuracies are obtained by solving a regularized least-squares regression problem that
maps the (frozen) representation of a subset of training images to {-1, 1}^K target vectors."

Here, per number of shots ``n`` and per seed:

1. the *support* set: ``n`` training images per class, drawn with the seed;
2. features: the frozen model's pre-logit features (``forward_head(..., pre_logits=True)``),
   standardised with the support set's mean and standard deviation (as big_vision's evaluator);
3. targets: ``2 * one_hot(y) - 1``; the closed-form ridge solution
   ``W = X^T (X X^T + l2 I)^-1 (Y - mean(Y))`` with an unregularised intercept ``mean(Y)``
   (computed in float64; the dual form, since there are fewer samples than features);
4. ``l2`` is chosen from a grid on a *selection* set of another ``n`` training images per class,
   disjoint from the support set (never on the test set); pass one value to fix it;
5. accuracy on the whole test set: argmax of ``X_test W + b``.

Results are mean ± standard deviation over seeds, as the paper's tables report them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from vitkit.errors import VitkitError


class _FeatureModel(Protocol):
    """What a vitkit model (a ViT or a BiT ResNet) offers for its pre-logit features."""

    def forward_features(self, x: Tensor, /) -> Tensor: ...

    def forward_head(self, features: Tensor, /, pre_logits: bool = False) -> Tensor: ...


# big_vision's few-shot evaluator sweeps powers of two; this grid covers the useful part.
DEFAULT_L2_GRID: tuple[float, ...] = tuple(2.0**i for i in range(-6, 14, 2))


@torch.no_grad()
def extract_features(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor, Any]],
    prepare: Callable[[Tensor], Tensor],
    *,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """Frozen pre-logit features [N, F] (float64, on CPU) and labels [N] of every batch."""
    model.eval()
    net = cast(_FeatureModel, model)
    feats, labels = [], []
    for images, y, *_ in batches:
        x = prepare(images.to(device))
        with torch.autocast(device_type=x.device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):  # fmt: skip
            f = net.forward_head(net.forward_features(x), pre_logits=True)
        feats.append(f.double().cpu())
        labels.append(y.cpu())
    if not feats:
        raise VitkitError("no images to extract features from")
    return torch.cat(feats), torch.cat(labels)


def sample_per_class(
    labels: Tensor, shots: int, num_classes: int, seed: int, exclude: Tensor | None = None
) -> Tensor:
    """Indices of ``shots`` random samples of every class (sorted), avoiding ``exclude``."""
    g = torch.Generator().manual_seed(seed)
    taken = torch.zeros(len(labels), dtype=torch.bool)
    if exclude is not None:
        taken[exclude] = True
    out = []
    for c in range(num_classes):
        pool = torch.nonzero((labels == c) & ~taken).flatten()
        if len(pool) < shots:
            raise VitkitError(
                f"class {c} has {len(pool)} training images available, fewer than {shots} shots"
            )
        out.append(pool[torch.randperm(len(pool), generator=g)[:shots]])
    return torch.cat(out).sort().values


def fit_ridge(x: Tensor, y: Tensor, num_classes: int, l2: float) -> Callable[[Tensor], Tensor]:
    """Closed-form regularised least squares onto {-1, 1}^K; returns ``predict(x) -> scores``."""
    x = x.double()
    mean = x.mean(0, keepdim=True)
    std = x.std(0, unbiased=False, keepdim=True) + 1e-5
    xs = (x - mean) / std
    targets = 2.0 * torch.nn.functional.one_hot(y.long(), num_classes).double() - 1.0
    bias = targets.mean(0, keepdim=True)
    gram = xs @ xs.T + l2 * torch.eye(len(xs), dtype=torch.float64)
    w = xs.T @ torch.linalg.solve(gram, targets - bias)

    def predict(z: Tensor) -> Tensor:
        return ((z.double() - mean) / std) @ w + bias

    return predict


def ridge_accuracy(
    train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], num_classes: int, l2: float
) -> float:
    predict = fit_ridge(train[0], train[1], num_classes, l2)
    return float((predict(test[0]).argmax(1) == test[1]).double().mean())


@dataclass
class FewShotResult:
    """Accuracy per number of shots: one value per seed, with the l2 chosen for each."""

    shots: int
    accuracies: list[float] = field(default_factory=list)
    l2: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "shots": self.shots,
            "mean": self.mean,
            "std": self.std,
            "accuracies": self.accuracies,
            "l2": self.l2,
        }


def fewshot_evaluate(
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    num_classes: int,
    shots: Sequence[int] = (1, 5, 10, 25),
    seeds: int = 3,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
) -> list[FewShotResult]:
    """Few-shot accuracies from precomputed features (see the module docstring)."""
    if seeds < 1:
        raise VitkitError(f"seeds must be at least 1, got {seeds}")
    if not l2_grid or any(not math.isfinite(v) or v <= 0 for v in l2_grid):
        raise VitkitError(f"l2 values must be positive, got {tuple(l2_grid)}")
    results = []
    for n in shots:
        if n < 1:
            raise VitkitError(f"shots must be at least 1, got {n}")
        res = FewShotResult(n)
        for seed in range(seeds):
            support = sample_per_class(train[1], n, num_classes, seed)
            sup = (train[0][support], train[1][support])
            if len(l2_grid) == 1:
                l2 = float(l2_grid[0])
            else:
                sel = sample_per_class(train[1], n, num_classes, 10_000 + seed, exclude=support)
                held = (train[0][sel], train[1][sel])
                scores = [ridge_accuracy(sup, held, num_classes, v) for v in l2_grid]
                l2 = float(l2_grid[int(np.argmax(scores))])  # ties: the smallest l2
            res.accuracies.append(ridge_accuracy(sup, test, num_classes, l2))
            res.l2.append(l2)
        results.append(res)
    return results


def format_fewshot(results: Sequence[FewShotResult], seeds: int) -> str:
    lines = [f"{'shots':>6}  accuracy (mean ± std over {seeds} seed{'s' * (seeds > 1)})"]
    for r in results:
        lines.append(f"{r.shots:>6}  {100 * r.mean:6.2f} ± {100 * r.std:5.2f} %")
    return "\n".join(lines)
