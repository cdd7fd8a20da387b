"""Deterministic hold-out splits (validation slices of a training set, test slices of a folder).

A hold-out is stratified: each class gives up the same fraction of its examples (rounded by
largest remainder), so a small or imbalanced dataset still has every class in its validation set.
It depends only on the labels, the size and the seed.
"""

from __future__ import annotations

import numpy as np

from vitkit.errors import VitkitError


def resolve_holdout_size(size: int | float, n: int, what: str) -> int:
    """`size` as a count out of `n`: an int is a count, a float in [0, 1) a fraction.

    `what` names the dataset and split for the error message.
    """
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise VitkitError(f"{what}: split size must be an int or a float, not {size!r}")
    if isinstance(size, float):
        if not 0.0 <= size < 1.0:
            raise VitkitError(f"{what}: a fractional split size must be in [0, 1), not {size}")
        count = int(round(size * n))
        if size > 0 and count == 0 and n >= 2:
            count = 1
    else:
        count = size
    if not 0 <= count < n:
        raise VitkitError(
            f"{what}: split size {size} must leave at least one of the {n} examples for training"
        )
    return count


def stratified_holdout(
    labels: np.ndarray, n_holdout: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split indices 0..len(labels)-1 into (kept, held out), both sorted, `n_holdout` held out."""
    labels = np.asarray(labels)
    n = labels.shape[0]
    if not 0 <= n_holdout <= n:
        raise ValueError(f"n_holdout={n_holdout} is not in [0, {n}]")
    classes, counts = np.unique(labels, return_counts=True)
    exact = n_holdout * counts / max(n, 1)
    quota = np.floor(exact).astype(np.int64)
    # Largest remainder; ties go to the earlier class, so the result is deterministic.
    short = n_holdout - int(quota.sum())
    order = np.lexsort((np.arange(len(classes)), -(exact - quota)))
    quota[order[:short]] += 1
    rng = np.random.default_rng(seed)
    held: list[np.ndarray] = []
    for cls, q in zip(classes, quota):
        members = np.flatnonzero(labels == cls)
        held.append(members[rng.permutation(members.shape[0])[:q]])
    mask = np.zeros(n, dtype=bool)
    if held:
        mask[np.concatenate(held)] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)
