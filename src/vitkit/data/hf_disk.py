"""A Hugging Face dataset saved with ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.

Layout: ``dataset_dict.json`` (``{"splits": [...]}``) with one directory per split, or a single
split's directory; each split has ``state.json`` (its ``_data_files``), ``dataset_info.json``
(its ``features``) and Arrow stream files. The image column is the first feature of type
``Image`` (bytes or a path per row), the label column the first ``ClassLabel`` (whose names become
the class names). Reading needs ``pyarrow`` (``pip install pyarrow``), not ``datasets``.

Images are decoded once into memory as uint8 (resized to the requested size), like the other
in-memory datasets; for data that does not fit, write webdataset shards instead.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.transforms import convert_image
from vitkit.errors import VitkitError


def is_hf_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def hf_splits(path: Path) -> list[str]:
    if (path / "dataset_dict.json").is_file():
        return list(_json(path / "dataset_dict.json").get("splits", []))
    return []


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise VitkitError(f"{path}: unreadable JSON ({e})") from None


def _columns(split_dir: Path) -> tuple[str, str, tuple[str, ...]]:
    features = _json(split_dir / "dataset_info.json").get("features") or {}
    image = next((k for k, v in features.items() if v.get("_type") == "Image"), None)
    label = next((k for k, v in features.items() if v.get("_type") == "ClassLabel"), None)
    if image is None or label is None:
        found = {k: v.get("_type") for k, v in features.items()}
        raise VitkitError(
            f"{split_dir}: needs an Image column and a ClassLabel column, has {found}"
        )
    return image, label, tuple(str(n) for n in features[label].get("names", ()))


def load_hf_split(
    split_dir: str | Path, image_size: tuple[int, int] | None, channels: int
) -> ArrayDataset:
    """One saved split as uint8 [N, C, H, W] (all images resized to ``image_size``; if None they
    must share one size)."""
    try:
        import pyarrow as pa
    except ImportError:
        raise VitkitError(
            f"{split_dir}: reading a Hugging Face dataset needs pyarrow (pip install pyarrow)"
        ) from None
    split_dir = Path(split_dir)
    image_col, label_col, names = _columns(split_dir)
    files = [f["filename"] for f in _json(split_dir / "state.json").get("_data_files", [])]
    mode = "L" if channels == 1 else "RGB"
    images, labels = [], []
    for name in files:
        try:
            with pa.memory_map(str(split_dir / name)) as src:
                table = pa.ipc.open_stream(src).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise VitkitError(f"{split_dir / name}: unreadable Arrow file ({e})") from None
        for row, (img, y) in enumerate(
            zip(table.column(image_col).to_pylist(), table.column(label_col).to_pylist())
        ):
            images.append(_decode(img, split_dir / name, row, mode, image_size))
            labels.append(int(y))
    if not images:
        raise VitkitError(f"{split_dir}: the split holds no rows")
    sizes = {im.shape[1:] for im in images}
    if len(sizes) > 1:
        raise VitkitError(f"{split_dir}: images of several sizes {sorted(sizes)}; give image_size")
    y = np.asarray(labels, dtype=np.int64)
    k = len(names) or int(y.max()) + 1
    if y.min() < 0 or y.max() >= k:
        raise VitkitError(f"{split_dir}: labels outside 0..{k - 1}")
    h, w = images[0].shape[1:]
    info = DataInfo(
        name=str(split_dir.resolve()),
        num_classes=k,
        class_names=names or tuple(str(i) for i in range(k)),
        channels=channels,
        image_size=(int(h), int(w)),
        allow_flip=True,
    )
    return ArrayDataset(torch.from_numpy(np.stack(images)), torch.from_numpy(y), info)


def _decode(cell: Any, file: Path, row: int, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    img: Image.Image
    try:
        if isinstance(cell, dict) and cell.get("bytes"):
            img = Image.open(io.BytesIO(cell["bytes"]))
        elif isinstance(cell, dict) and cell.get("path"):
            img = Image.open(cell["path"])
        else:
            raise ValueError("no bytes and no path")
        img = convert_image(img, 1 if mode == "L" else 3)  # 16-bit / float: by their range
        if size is not None and img.size != (size[1], size[0]):
            img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise VitkitError(f"{file}: row {row}: cannot decode the image ({e})") from None
    a = np.asarray(img, dtype=np.uint8)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
