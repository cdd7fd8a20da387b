"""CIFAR-10 / CIFAR-100 in the "python version" layout of the standard download.

CIFAR-10 (``cifar-10-batches-py/``): ``data_batch_1`` ... ``data_batch_5``, ``test_batch``,
``batches.meta``. CIFAR-100 (``cifar-100-python/``): ``train``, ``test``, ``meta`` (fine labels
are used). Each batch is a pickled dict with ``data`` ([N, 3072] uint8, channel-planar 32x32) and
``labels`` / ``fine_labels``. The pickles are read with :mod:`vitkit.data.safe_pickle`, which
refuses anything but arrays and plain containers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.safe_pickle import load_data_pickle
from vitkit.errors import VitkitError

_C10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


def cifar_root(path: Path) -> Path | None:
    """The batch directory if ``path`` is (or directly holds) a CIFAR python download."""
    for p in (path, path / "cifar-10-batches-py", path / "cifar-100-python"):
        if (p / "test_batch").is_file() and (p / "data_batch_1").is_file():
            return p
        if (p / "train").is_file() and (p / "test").is_file() and (p / "meta").is_file():
            return p
    return None


def _read(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        d = load_data_pickle(f, path, "a CIFAR batch")
    if not isinstance(d, dict):
        raise VitkitError(f"{path}: not a CIFAR batch (expected a dict, got {type(d).__name__})")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in d.items()}


def _names(values: Any) -> tuple[str, ...]:
    return tuple(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values)


def load_cifar(root: str | Path, split: Literal["train", "test"]) -> ArrayDataset:
    """The official ``train`` (50k) or ``test`` (10k) split as uint8 [N, 3, 32, 32]."""
    root = Path(root)
    batches = cifar_root(root)
    if batches is None:
        raise VitkitError(f"{root}: not a CIFAR-10/100 python download")
    c100 = (batches / "meta").is_file()
    if c100:
        files = [batches / ("train" if split == "train" else "test")]
        meta, label_key, names_key = _read(batches / "meta"), "fine_labels", "fine_label_names"
    else:
        files = [batches / n for n in (_C10_TRAIN if split == "train" else ("test_batch",))]
        meta, label_key, names_key = _read(batches / "batches.meta"), "labels", "label_names"
    if names_key not in meta:
        raise VitkitError(f"{batches}: the meta file has no {names_key!r}")
    class_names = _names(meta[names_key])
    xs, ys = [], []
    for f in files:
        if not f.is_file():
            raise VitkitError(f"{f}: missing CIFAR batch")
        d = _read(f)
        if "data" not in d or label_key not in d:
            raise VitkitError(f"{f}: a CIFAR batch needs 'data' and {label_key!r}, has {sorted(d)}")
        x = np.asarray(d["data"])
        y = np.asarray(d[label_key], dtype=np.int64)
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x):
            raise VitkitError(f"{f}: expected uint8 data [N, 3072] and N labels, got {x.shape}")
        if len(y) and (y.min() < 0 or y.max() >= len(class_names)):
            raise VitkitError(f"{f}: labels outside 0..{len(class_names) - 1}")
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(y)
    info = DataInfo(
        name=str(root.resolve()),
        num_classes=len(class_names),
        class_names=class_names,
        channels=3,
        image_size=(32, 32),
        allow_flip=True,
    )
    return ArrayDataset(
        torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)), info
    )
