"""A directory of image files, one subdirectory per class (the torchvision ImageFolder layout).

`root/<class_name>/**/<file>.{jpg,jpeg,png,bmp,gif,webp}` (extensions in any case; hidden files
and directories are ignored). Classes are the sorted subdirectory names, files are sorted by
path, and images are decoded lazily in `__getitem__`. A file that cannot be decoded stops the
run with an error naming it, or, with `on_bad_image="skip"`, reads as `None`, which
`collate_skipping` drops and counts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import torch
from PIL import Image
from torch.utils.data import Dataset

from vitkit.data.arrays import DataInfo
from vitkit.data.images import open_image
from vitkit.data.transforms import PilEvalTransform, convert_image
from vitkit.errors import VitkitError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
_DECODE_ERRORS = (OSError, ValueError, EOFError, SyntaxError, Image.DecompressionBombError)

Sample = tuple[torch.Tensor, int]


class ImageFolderDataset(Dataset):
    """Images under `root`, one subdirectory per class; items are `(uint8 [C, H, W], label)`.

    `transform` maps a PIL image (already converted to "L" for `channels=1` or "RGB" for 3) to a
    uint8 [C, H, W] tensor of size `image_size`; the default is `PilEvalTransform`.
    `class_names` fixes the label order (e.g. a validation folder uses the training folder's
    classes); by default it is the sorted subdirectory names. `samples` lists `(path, label)`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        image_size: int | tuple[int, int],
        *,
        channels: int = 3,
        transform: Callable[[Image.Image], torch.Tensor] | None = None,
        on_bad_image: Literal["stop", "skip"] = "stop",
        class_names: Sequence[str] | None = None,
        name: str | None = None,
    ) -> None:
        if channels not in (1, 3):
            raise VitkitError(f"{root}: channels must be 1 or 3, not {channels}")
        if on_bad_image not in ("stop", "skip"):
            raise VitkitError(
                f"{root}: on_bad_image must be 'stop' or 'skip', not {on_bad_image!r}"
            )
        self.root = Path(root)
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.channels = channels
        self.transform = transform or PilEvalTransform(image_size, channels)
        self.on_bad_image = on_bad_image
        classes, samples = _scan(self.root, class_names)
        self.samples: list[tuple[Path, int]] = samples
        self.info = DataInfo(
            name=name or str(root),
            num_classes=len(classes),
            class_names=classes,
            channels=channels,
            image_size=(int(size[0]), int(size[1])),
            allow_flip=True,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample | None:
        path, label = self.samples[index]
        img: Image.Image
        try:
            with open_image(path) as img:
                img.load()  # the full decode, inside the `try`
                img = convert_image(img, self.channels)  # 16-bit / float: by their range
        except _DECODE_ERRORS as e:
            if self.on_bad_image == "skip":
                return None
            reason = " ".join(f"{type(e).__name__}: {e}".split())
            raise VitkitError(
                f"{path}: cannot decode image ({reason}); pass --on-bad-image skip to skip "
                "such files"
            ) from e
        return self.transform(img), label

    def subset(
        self,
        indices: Sequence[int],
        *,
        transform: Callable[[Image.Image], torch.Tensor] | None = None,
    ) -> ImageFolderDataset:
        """The samples `indices` (in that order), optionally with another transform."""
        new = object.__new__(ImageFolderDataset)
        new.__dict__.update(self.__dict__)
        new.samples = [self.samples[i] for i in indices]
        if transform is not None:
            new.transform = transform
        return new

    def __repr__(self) -> str:
        return (
            f"ImageFolderDataset({str(self.root)!r}, n={len(self)}, "
            f"classes={self.info.num_classes}, transform={self.transform!r})"
        )


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def class_directories(root: str | os.PathLike[str]) -> tuple[str, ...]:
    """The sorted names of the (non-hidden) class subdirectories of `root`."""
    root = Path(root)
    if not root.is_dir():
        raise VitkitError(f"{root}: image folder does not exist or is not a directory")
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not _is_hidden(p.name))
    if not subdirs:
        raise VitkitError(
            f"{root}: no class subdirectories; expected {root}/<class_name>/<image files>"
        )
    return tuple(subdirs)


def _scan(
    root: Path, class_names: Sequence[str] | None
) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    subdirs = class_directories(root)
    if class_names is None:
        classes = tuple(subdirs)
    else:
        classes = tuple(class_names)
        unknown = sorted(set(subdirs) - set(classes))
        if unknown:
            raise VitkitError(
                f"{root}: class directories {', '.join(unknown)} are not among the training "
                f"classes ({', '.join(classes)})"
            )
    label_of = {name: i for i, name in enumerate(classes)}
    samples: list[tuple[Path, int]] = []
    for name in subdirs:
        files = _image_files(root / name)
        if not files and class_names is None:
            raise VitkitError(
                f"{root / name}: class directory has no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        samples.extend((path, label_of[name]) for path in files)
    if not samples:
        raise VitkitError(
            f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) in any class directory"
        )
    return classes, samples


def _image_files(directory: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = [d for d in dirnames if not _is_hidden(d)]
        for filename in filenames:
            if not _is_hidden(filename) and filename.lower().endswith(IMAGE_EXTENSIONS):
                found.append(Path(dirpath) / filename)
    return sorted(found)


def collate_skipping(
    batch: Sequence[Sample | None],
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stack samples into `(images uint8 [B, C, H, W], labels int64 [B], n_skipped)`.

    `None` entries (undecodable files under `on_bad_image="skip"`) are dropped and counted. If
    every sample was skipped, images is an empty uint8 tensor of shape [0, 0, 0, 0].
    """
    kept = [sample for sample in batch if sample is not None]
    skipped = len(batch) - len(kept)
    if not kept:
        return (
            torch.empty((0, 0, 0, 0), dtype=torch.uint8),
            torch.empty(0, dtype=torch.int64),
            skipped,
        )
    images = torch.stack([image for image, _ in kept])
    labels = torch.tensor([label for _, label in kept], dtype=torch.int64)
    return images, labels, skipped
