"""What a dataset says about itself (`DataInfo`), and the in-memory dataset (`ArrayDataset`).

The built-in datasets (MNIST, digits, shapes) are small enough to live in memory as one uint8
tensor; they are augmented a whole batch at a time in the training process (see `transforms`),
so reading a batch is a single gather (`get_batch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class DataInfo:
    """Static facts about a dataset that models, trainers and checkpoints need."""

    name: str  # "mnist", "digits", "shapes", or the ImageFolder path
    num_classes: int  # number of classes; labels are 0 .. num_classes - 1
    class_names: tuple[str, ...]  # human-readable name of each label, in label order
    channels: int  # 1 (grayscale) or 3 (RGB)
    image_size: tuple[int, int]  # (H, W) of the images the dataset yields
    allow_flip: bool  # False where a horizontal flip changes the class (digits)

    def __post_init__(self) -> None:
        if self.num_classes != len(self.class_names):
            raise ValueError(
                f"DataInfo({self.name!r}): num_classes={self.num_classes} but "
                f"{len(self.class_names)} class names"
            )
        if self.channels not in (1, 3):
            raise ValueError(
                f"DataInfo({self.name!r}): channels must be 1 or 3, not {self.channels}"
            )


class ArrayDataset(Dataset):
    """Images, labels (and optionally boxes) held as tensors.

    `images` is uint8 [N, C, H, W], `labels` int64 [N], `boxes` (optional) float32 [N, 4] as
    (x0, y0, x1, y1) in pixels. `dataset[i]` is `(image uint8 [C, H, W], label int)`;
    `dataset.get_batch(indices)` is the batched `(images [B, C, H, W], labels [B])`.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        info: DataInfo,
        boxes: torch.Tensor | None = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(
                f"{info.name}: images must be uint8 [N, C, H, W], got {images.dtype} "
                f"{tuple(images.shape)}"
            )
        if labels.dim() != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(
                f"{info.name}: labels must be [N] with N={images.shape[0]}, got "
                f"{tuple(labels.shape)}"
            )
        if images.shape[1] != info.channels or tuple(images.shape[2:]) != info.image_size:
            raise ValueError(
                f"{info.name}: images {tuple(images.shape)} do not match info "
                f"(channels={info.channels}, image_size={info.image_size})"
            )
        if boxes is not None and tuple(boxes.shape) != (images.shape[0], 4):
            raise ValueError(f"{info.name}: boxes must be [N, 4], got {tuple(boxes.shape)}")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.boxes = None if boxes is None else boxes.to(torch.float32)
        self.info = info

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])

    def get_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return self.images[idx], self.labels[idx]

    def subset(self, indices: Sequence[int] | torch.Tensor) -> ArrayDataset:
        """A new dataset holding copies of the rows `indices`, in that order, with the same info."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        boxes = None if self.boxes is None else self.boxes[idx]
        return ArrayDataset(self.images[idx], self.labels[idx], self.info, boxes)

    def __repr__(self) -> str:
        shape = tuple(self.images.shape[1:])
        return f"ArrayDataset({self.info.name!r}, n={len(self)}, image={shape})"
