"""Image files for inference: opened with one-line errors, transformed as a checkpoint says."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image, UnidentifiedImageError
from PIL.Image import DecompressionBombError

from vitkit.data.transforms import PilEvalTransform, convert_image
from vitkit.errors import VitkitError
from vitkit.pil_images import FORMATS, resize_refusal

if TYPE_CHECKING:
    from vitkit.registry.model_config import PreprocessConfig

RESIZE_BUDGET = 200_000_000  # pixels the eval transform's resize may allocate (about 1 GB)


def open_image(fp: Any) -> Image.Image:
    """``Image.open`` limited to :data:`FORMATS` (a file of another format: ValueError, with the
    formats named)."""
    try:
        return Image.open(fp, formats=FORMATS)
    except UnidentifiedImageError:
        raise ValueError(f"not an image of a format vitkit reads ({', '.join(FORMATS)})") from None


def shown_name(path: str | os.PathLike[str] | None) -> str:
    """A path as a figure or a line of text shows it: bytes that are not UTF-8 (which Python
    keeps as surrogates, that neither a font nor a UTF-8 terminal can take) become U+FFFD."""
    return os.fsencode(str(path) if path is None else path).decode("utf-8", "replace")


def check_image_files(paths: Sequence[str | Path]) -> None:
    """The cheapest mistake first: every path is an existing file (before loading weights)."""
    for path in paths:
        if not Path(path).is_file():
            raise VitkitError(f"{path}: no such image file")


def load_image_file(
    path: str | Path, channels: int, transform: PilEvalTransform | None = None
) -> Image.Image:
    """Open an image for prediction, with a one-line error naming the file if that fails;
    16-bit and float pixels are scaled by their range (:func:`convert_image`), not clipped.
    With ``transform``, an image it would resize to more than :data:`RESIZE_BUDGET` pixels
    (an extreme aspect ratio) is refused from its header, before it is decoded."""
    p = Path(path)
    if not p.is_file():
        raise VitkitError(f"{p}: no such image file")
    try:
        with open_image(p) as img:
            width, height = img.size
            why = (
                "" if transform is None else resize_refusal(transform, width, height, RESIZE_BUDGET)
            )
            if why:
                raise VitkitError(f"{p}: {why}: crop or resize the image first")
            img.load()
            return convert_image(img, channels)
    except (UnidentifiedImageError, DecompressionBombError, OSError, ValueError) as e:
        raise VitkitError(f"{p}: cannot read image ({e})") from None


def load_images(paths: Sequence[str | Path], preprocess: PreprocessConfig) -> torch.Tensor:
    """Image files → the uint8 batch [B, C, H, W] the checkpoint's eval transform makes
    (:func:`vitkit.data.transforms.normalize` with its mean, std and rescale factor next)."""
    transform = eval_transform(preprocess)
    images = [load_image_file(p, preprocess.channels, transform) for p in paths]  # before work
    return torch.stack([transform(img) for img in images])


def load_images_native(
    paths: Sequence[str | Path], preprocess: PreprocessConfig, patch: tuple[int, int], n: int
) -> list[torch.Tensor]:
    """Image files -> uint8 [C, H, W] each, at its own aspect ratio: resized (PIL, the
    checkpoint's interpolation) to the largest size of whole patches with at most ``n``
    patches (timm's NaFlex eval size, :func:`vitkit.models.naflex_packing.fit_size`); no crop."""
    from vitkit.data.transforms import pil_to_tensor

    images = [load_image_file(p, preprocess.channels) for p in paths]  # fail before any work
    return [pil_to_tensor(resize_native(img, patch, n, preprocess.interpolation)) for img in images]


def resize_native(
    img: Image.Image, patch: tuple[int, int], max_seq_len: int, interpolation: str
) -> Image.Image:
    """``img`` at its own aspect ratio, the largest size of whole patches with at most
    ``max_seq_len`` patches (timm's NaFlex size, :func:`vitkit.models.naflex_packing.fit_size`); no
    crop. ``predict --max-seq-len`` and NaFlex training (``data.naflex_batches``) both resize so."""
    from vitkit.data.transforms import _PIL_INTERPOLATION
    from vitkit.models.naflex_packing import fit_size

    h, w = fit_size((img.height, img.width), patch, max_seq_len)
    return img.resize((w, h), _PIL_INTERPOLATION[interpolation])


def eval_transform(preprocess: PreprocessConfig) -> PilEvalTransform:
    """The per-image transform (resize, centre crop) a checkpoint's preprocessing describes."""
    pre: Any = preprocess  # its fields are checked strings (config_checks), the Literals here
    return PilEvalTransform(
        pre.image_size,
        pre.channels,
        crop_pct=pre.crop_pct,
        interpolation=pre.interpolation,
        resize=pre.resize,
        crop_offset=pre.crop_offset,
    )
