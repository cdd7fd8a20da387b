"""Batches of images at their own aspect ratios for a NaFlex model (training and evaluation).

As timm's NaFlex loader (``timm.data.naflex_loader``) does at one sequence length: each image is
resized, keeping its aspect ratio, to the largest size of whole patches with at most
``max_seq_len`` patches (:func:`vitkit.models.naflex_packing.fit_size`, the size ``vitkit predict
--max-seq-len`` uses: :func:`resize_native`); with ``flip``, flipped left-right with
probability 1/2 first. A batch is then patchified and padded to ``max_seq_len`` with a valid
mask (:func:`vitkit.models.naflex_packing.pack`), still uint8: :class:`PackedImages`. Normalising is
the trainer's (per channel, the padding set to 0 afterwards, as ``pack`` of normalised images).

What is not timm's: one sequence length for every batch (timm's training loader draws one of
several per batch and scales the batch size with it) and no random-resized crop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset

from vitkit.data.arrays import ArrayDataset
from vitkit.data.folder import ImageFolderDataset
from vitkit.data.images import resize_native
from vitkit.data.transforms import convert_image, pil_to_tensor
from vitkit.errors import VitkitError
from vitkit.models.naflex_packing import pack


class NaFlexTransform:
    """PIL image → uint8 [C, h, w] at its aspect ratio, ``max_seq_len`` patches at most."""

    def __init__(
        self,
        patch: tuple[int, int],
        max_seq_len: int,
        channels: int,
        interpolation: str = "bicubic",
        flip: bool = False,
    ) -> None:
        self.patch, self.max_seq_len, self.channels = patch, max_seq_len, channels
        self.interpolation, self.flip = interpolation, flip

    def __call__(self, img: Image.Image) -> torch.Tensor:
        img = convert_image(img, self.channels)
        if self.flip and torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return pil_to_tensor(resize_native(img, self.patch, self.max_seq_len, self.interpolation))

    def __repr__(self) -> str:
        return (
            f"NaFlexTransform(patch={self.patch}, max_seq_len={self.max_seq_len}, "
            f"channels={self.channels}, flip={self.flip})"
        )


class _ArrayImages(Dataset):
    """An in-memory dataset's images through a PIL transform (one by one, like files)."""

    def __init__(self, base: ArrayDataset, transform: NaFlexTransform) -> None:
        self.base, self.transform, self.info = base, transform, base.info

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.base[index]
        array = image.permute(1, 2, 0).numpy()
        pil = Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)
        return self.transform(pil), int(label)


def native_dataset(dataset: Any, transform: NaFlexTransform) -> Dataset:
    """``dataset`` (an ImageFolder or in-memory one) with every image through ``transform``."""
    if isinstance(dataset, ImageFolderDataset):
        return dataset.subset(range(len(dataset)), transform=transform)
    if isinstance(dataset, ArrayDataset):
        return _ArrayImages(dataset, transform)
    raise VitkitError(
        f"{dataset.info.name}: NaFlex batches read ImageFolder directories and the built-in "
        "datasets; webdataset shards are not supported with --naflex yet"
    )


@dataclass
class PackedImages:
    """A uint8 NaFlex batch: ``patches`` [B, N, ph pw C], ``patch_coord`` [B, N, 2],
    ``patch_valid`` [B, N] (:func:`vitkit.models.naflex_packing.pack`)."""

    patches: torch.Tensor
    patch_coord: torch.Tensor
    patch_valid: torch.Tensor

    def __len__(self) -> int:
        return int(self.patches.shape[0])

    def to(self, device: Any, non_blocking: bool = False) -> PackedImages:
        return PackedImages(*(t.to(device, non_blocking=non_blocking) for t in self.tensors()))

    def pin_memory(self) -> PackedImages:  # (a DataLoader with pin_memory calls it)
        return PackedImages(*(t.pin_memory() for t in self.tensors()))

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.patches, self.patch_coord, self.patch_valid

    def grids(self) -> list[tuple[int, int]]:
        """Each image's patch grid (rows, columns)."""
        top = self.patch_coord.amax(dim=1) + 1
        return [(int(h), int(w)) for h, w in top.tolist()]


class CollatePacked:
    """``collate_fn`` of a NaFlex loader: samples (uint8 [C, h, w], label) or None (a skipped
    file) → (:class:`PackedImages`, labels [B], skipped)."""

    def __init__(self, patch: tuple[int, int], max_seq_len: int) -> None:
        self.patch, self.max_seq_len = patch, max_seq_len

    def __call__(
        self, batch: Sequence[tuple[torch.Tensor, int] | None]
    ) -> tuple[PackedImages, torch.Tensor, int]:
        kept = [s for s in batch if s is not None]
        labels = torch.tensor([label for _, label in kept], dtype=torch.int64)
        if not kept:
            empty = torch.zeros(0, self.max_seq_len, 0, dtype=torch.uint8)
            coord = torch.zeros(0, self.max_seq_len, 2, dtype=torch.int64)
            valid = torch.zeros(0, self.max_seq_len, dtype=torch.bool)
            return PackedImages(empty, coord, valid), labels, len(batch)
        packed = pack([image for image, _ in kept], self.patch, self.max_seq_len)
        images = PackedImages(packed["patches"], packed["patch_coord"], packed["patch_valid"])
        return images, labels, len(batch) - len(kept)


def normalize_packed(
    images: PackedImages,
    channels: int,
    mean: Sequence[float],
    std: Sequence[float],
    scale: float = 1 / 255,
) -> dict[str, torch.Tensor]:
    """The model's NaFlex input: patches normalised per channel (``mean`` / ``std``: 1 or
    ``channels`` values; each patch is flattened row, column, channel), the padding 0."""
    b, n, d = images.patches.shape
    x = images.patches.float().reshape(b, n, -1, channels)
    x = x / 255.0 if scale == 1 / 255 else x * scale
    mean_t = torch.as_tensor(mean, dtype=x.dtype, device=x.device)
    std_t = torch.as_tensor(std, dtype=x.dtype, device=x.device)
    x = ((x - mean_t) / std_t).reshape(b, n, d) * images.patch_valid.unsqueeze(-1)
    return {"patches": x, "patch_coord": images.patch_coord, "patch_valid": images.patch_valid}
