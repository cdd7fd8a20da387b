"""scikit-learn's 8x8 handwritten digits (1,797 images), as a tiny smoke-test dataset.

The data ship inside scikit-learn (`sklearn/datasets/data/digits.csv.gz`). Pixel values 0..16
are scaled to 0..255. There is no official test set: a fixed stratified 20 % hold-out (seed 0)
is the test split, and the rest is the training set.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.splits import stratified_holdout
from vitkit.errors import VitkitError

DIGITS_INFO = DataInfo(
    name="digits",
    num_classes=10,
    class_names=tuple(str(d) for d in range(10)),
    channels=1,
    image_size=(8, 8),
    allow_flip=False,
)
_TEST_FRACTION = 0.2
_SPLIT_SEED = 0


def load_digits(split: Literal["train", "test"]) -> ArrayDataset:
    """The digits `split`: "train" (1,437 images) or "test" (360), uint8 [N, 1, 8, 8]."""
    if split not in ("train", "test"):
        raise VitkitError(f"digits: unknown split '{split}': expected train or test")
    try:
        from sklearn.datasets import load_digits as sklearn_load_digits
    except ImportError as e:
        raise VitkitError(
            "digits: scikit-learn is not installed; run `pip install scikit-learn`"
        ) from e
    bunch = sklearn_load_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)[:, None]
    labels = np.asarray(bunch.target, dtype=np.int64)
    n_test = int(round(_TEST_FRACTION * labels.shape[0]))
    train_idx, test_idx = stratified_holdout(labels, n_test, seed=_SPLIT_SEED)
    idx = train_idx if split == "train" else test_idx
    return ArrayDataset(torch.from_numpy(images[idx]), torch.from_numpy(labels[idx]), DIGITS_INFO)
