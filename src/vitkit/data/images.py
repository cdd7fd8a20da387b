"""Image files for inference: opened with one-line errors, transformed as a checkpoint says."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from PIL import Image, UnidentifiedImageError
from PIL.Image import DecompressionBombError

from vitkit.data.transforms import PilEvalTransform
from vitkit.errors import VitkitError

if TYPE_CHECKING:
    from vitkit.config import PreprocessConfig


def check_image_files(paths: Sequence[str | Path]) -> None:
    """The cheapest mistake first: every path is an existing file (before loading weights)."""
    for path in paths:
        if not Path(path).is_file():
            raise VitkitError(f"{path}: no such image file")


def load_image_file(path: str | Path, channels: int) -> Image.Image:
    """Open an image for prediction, with a one-line error naming the file if that fails."""
    p = Path(path)
    if not p.is_file():
        raise VitkitError(f"{p}: no such image file")
    try:
        with Image.open(p) as img:
            img.load()
            return img.convert("L" if channels == 1 else "RGB")
    except (UnidentifiedImageError, DecompressionBombError, OSError, ValueError) as e:
        raise VitkitError(f"{p}: cannot read image ({e})") from None


def load_images(paths: Sequence[str | Path], preprocess: PreprocessConfig) -> torch.Tensor:
    """Image files → the uint8 batch [B, C, H, W] the checkpoint's eval transform makes."""
    pre = preprocess
    if pre.interpolation not in ("bilinear", "bicubic"):
        raise VitkitError(f"unsupported interpolation {pre.interpolation!r} in the checkpoint")
    interpolation: Literal["bilinear", "bicubic"] = pre.interpolation  # type: ignore[assignment]
    transform = PilEvalTransform(
        pre.image_size, pre.channels, crop_pct=pre.crop_pct, interpolation=interpolation
    )
    images = [load_image_file(p, pre.channels) for p in paths]  # fail before any work
    return torch.stack([transform(img) for img in images])
