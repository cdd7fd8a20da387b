"""Images through Pillow and NumPy only, no PyTorch: the eval transform's steps (the
conversion to the model's mode, the resize and the centre crop), what its resize allocates,
known from an image's size before decoding, and the formats vitkit opens.

A serve decode process (:mod:`vitkit.serve.decode_process`) runs these and imports nothing
else of vitkit's that would load PyTorch (200 MB of its own memory); the tensor transforms
of :mod:`vitkit.data.transforms` re-export them.

:class:`PilNativeTransform` is a NaFlex model's: each image at its own aspect ratio, at most
a given number of patches, no crop. :class:`PilEvalTransform` resizes the whole image, then
crops the centre. An image of extreme
aspect ratio (1 x 1,000,000 pixels is a 1 KB PNG) is resized to a strip of billions of pixels
before the crop; its header says so before a pixel is decoded. PIL resizes the width first (an
intermediate of the new width x the old height), then the height: :func:`resize_pixels`
counts both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
from PIL import Image

if TYPE_CHECKING:
    import torch

# The image formats vitkit opens, from a file or a request (serve): PIL knows more (EPS runs
# Ghostscript on the file; others are rarely images a person has), and those are refused before
# PIL parses them further.
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")
_PIL_INTERPOLATION = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}
Interpolation = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"]
Resize = Literal["shortest_edge", "squash", "none"]


def pil_to_array(img: Image.Image) -> np.ndarray:
    """A PIL image as a contiguous uint8 [C, H, W] array: C = 1 for mode "L", else 3
    (converted to RGB)."""
    if img.mode != "L" and img.mode != "RGB":
        img = img.convert("RGB")
    array = np.asarray(img, dtype=np.uint8)
    if array.ndim == 2:
        return array[None].copy()  # (a copy: PIL's buffer is read-only)
    return np.array(array.transpose(2, 0, 1), order="C")  # (always a copy)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


def convert_image(img: Image.Image, channels: int) -> Image.Image:
    """`img` as mode "L" (`channels` 1) or "RGB" (3), the one conversion every image file
    goes through. 16-bit, 32-bit integer and float pixels (modes "I;16*", "I", "F") are first
    scaled by their own range to 8 bits (PIL's own conversion clips them at 255: white):
    "I;16" by 65535; "I" by 65535 when its values fit in 16 bits (a 16-bit PNG or TIFF), else
    by 2**31 - 1; "F" by 1 when its values lie in [0, 1], else by 255 when they lie in
    [0, 255], else by 65535. Negative, non-finite or larger values raise ValueError."""
    mode = "L" if channels == 1 else "RGB"
    if img.mode == mode:
        return img
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        img = _to_8bit(img)
    elif img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # avoids PIL's warning about palette transparency
    return img if img.mode == mode else img.convert(mode)


# Pixels _to_8bit scales at a time: its float64 band and three temporaries hold 8 MB.
BAND_PIXELS = 1 << 18


def _to_8bit(img: Image.Image) -> Image.Image:
    """A one-channel 16-bit, 32-bit integer or float image as mode "L", scaled by its range
    (in float64, a band of rows at a time: a 25-megapixel 16-bit image never holds a float64
    copy of itself, 200 MB, and its temporaries)."""
    a = np.asarray(img)
    if a.ndim != 2:
        raise ValueError(f"image mode {img.mode} with shape {a.shape} is not one channel")
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo < 0:
        raise ValueError(f"mode {img.mode} pixels in [{lo:g}, {hi:g}]: no range to scale by")
    if img.mode.startswith("I;16"):
        top = 65535.0
    elif img.mode == "I":
        top = 65535.0 if hi <= 65535 else 2.0**31 - 1
    else:
        top = next((t for t in (1.0, 255.0, 65535.0) if hi <= t), 0.0)
        if not top:
            raise ValueError(f"mode F pixels up to {hi:g}: not [0, 1], [0, 255] or [0, 65535]")
    out = np.empty(a.shape, np.uint8)
    rows = max(1, BAND_PIXELS // max(1, a.shape[1]))
    for i in range(0, a.shape[0], rows):
        band = a[i : i + rows].astype(np.float64)
        out[i : i + rows] = np.round(band * (255.0 / top)).clip(0, 255)
    return Image.fromarray(out, "L")


class PilEvalTransform:
    """Resize to `size / crop_pct` as `resize` says, then centre-crop `size`.

    `resize`: "shortest_edge" keeps the aspect ratio: a square `size` puts the shorter side at
    floor(side / crop_pct) and the longer at int(that * long / short) (torchvision's and
    Hugging Face's rule); a non-square one is timm's ResizeKeepRatio: the scale that puts one
    side at its floor(side / crop_pct) and the other at or above its own, sides rounded.
    "squash" resizes each side to floor(side / crop_pct), the aspect ratio not kept. "none"
    only crops. Where the image is smaller than the crop, the crop is padded with zeros (as
    Hugging Face's center_crop). `crop_offset` "floor" starts the crop at floor((new - size)
    / 2), as Hugging Face; "round" rounds half to even, as torchvision's CenterCrop (timm).
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        channels: int = 3,
        crop_pct: float = 0.875,
        interpolation: Interpolation = "bilinear",
        resize: Resize = "shortest_edge",
        crop_offset: Literal["floor", "round"] = "floor",
    ) -> None:
        if not 0 < crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], not {crop_pct}")
        self.size = _pair(size)
        self.channels = channels
        self.crop_pct = crop_pct
        self.interpolation = interpolation
        self.resize = resize
        self.crop_offset = crop_offset

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of an image of `width` x `height` after the resize."""
        out_h, out_w = self.size
        if self.resize == "none":
            return width, height
        target_h = int(math.floor(out_h / self.crop_pct + 1e-6))
        target_w = int(math.floor(out_w / self.crop_pct + 1e-6))
        if self.resize == "squash":
            return target_w, target_h
        if out_h == out_w:
            short, long = min(width, height), max(width, height)
            new_long = int(target_h * long / short)
            return (target_h, new_long) if width <= height else (new_long, target_h)
        # timm's ResizeKeepRatio: the side nearer its target at floor(side / crop_pct), the
        # other rounded (half to even, as Python's round)
        target_h, target_w = math.floor(out_h / self.crop_pct), math.floor(out_w / self.crop_pct)
        ratio = min(height / target_h, width / target_w)
        return round(width / ratio), round(height / ratio)

    def _offset(self, new: int, out: int) -> int:
        return int(round((new - out) / 2)) if self.crop_offset == "round" else (new - out) // 2

    def __call__(self, img: Image.Image) -> torch.Tensor:
        import torch  # (here: a decode process runs :meth:`array` without PyTorch)

        return torch.from_numpy(self.array(img))

    def array(self, img: Image.Image) -> np.ndarray:
        """The transformed image as a uint8 [C, H, W] array (no torch operation: what a
        decode process computes)."""
        img = convert_image(img, self.channels)
        out_h, out_w = self.size
        new_w, new_h = self.resized_size(*img.size)
        if (new_w, new_h) != img.size:
            img = img.resize((new_w, new_h), _PIL_INTERPOLATION[self.interpolation])
        left, top = self._offset(new_w, out_w), self._offset(new_h, out_h)
        return pil_to_array(img.crop((left, top, left + out_w, top + out_h)))

    def __repr__(self) -> str:
        return (
            f"PilEvalTransform(size={self.size}, channels={self.channels}, "
            f"crop_pct={self.crop_pct}, interpolation={self.interpolation!r}, "
            f"resize={self.resize!r}, crop_offset={self.crop_offset!r})"
        )


def fit_size(size: tuple[int, int], patch: tuple[int, int], max_seq_len: int) -> tuple[int, int]:
    """The (H, W) an image of ``size`` (H, W) is resized to so that it keeps its aspect ratio
    and has at most ``max_seq_len`` patches: timm's ``get_image_size_for_seq`` (a binary search
    on the scale down to 1e-5, sides rounded up to whole patches, at least one patch each)."""
    ph, pw = patch

    def target(ratio: float) -> tuple[int, int]:
        h = ph * math.ceil(size[0] * ratio / ph)
        w = pw * math.ceil(size[1] * ratio / pw)
        return int(max(h, ph)), int(max(w, pw))

    lo, hi = 1e-6, 100.0
    while hi - lo >= 1e-5:
        mid = (lo + hi) / 2.0
        h, w = target(mid)
        lo, hi = (mid, hi) if (h // ph) * (w // pw) <= max_seq_len else (lo, mid)
    return target(lo)


class PilNativeTransform:
    """A NaFlex model's eval transform: the image at its own aspect ratio, resized to the
    largest size of whole patches with at most ``max_seq_len`` patches (:func:`fit_size`), no
    crop; what ``vitkit predict --max-seq-len`` does to a file
    (:func:`vitkit.data.images.resize_native`), here without PyTorch (a serve decode process
    runs :meth:`array`)."""

    def __init__(
        self,
        patch: tuple[int, int],
        max_seq_len: int,
        channels: int = 3,
        interpolation: Interpolation = "bicubic",
    ) -> None:
        self.patch = _pair(patch)
        self.max_seq_len = max_seq_len
        self.channels = channels
        self.interpolation = interpolation

    def resized_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of an image of `width` x `height` after the resize."""
        h, w = fit_size((height, width), self.patch, self.max_seq_len)
        return w, h

    def __call__(self, img: Image.Image) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.array(img))

    def array(self, img: Image.Image) -> np.ndarray:
        """The resized image as a uint8 [C, H, W] array (no torch operation)."""
        img = convert_image(img, self.channels)
        size = self.resized_size(*img.size)
        return pil_to_array(img.resize(size, _PIL_INTERPOLATION[self.interpolation]))

    def __repr__(self) -> str:
        return (
            f"PilNativeTransform(patch={self.patch}, max_seq_len={self.max_seq_len}, "
            f"channels={self.channels}, interpolation={self.interpolation!r})"
        )


def resize_pixels(transform: PilEvalTransform | PilNativeTransform, width: int, height: int) -> int:
    """Pixels the resize of ``transform`` allocates for a ``width`` x ``height`` image (its
    two passes' outputs; 0 where the image is not resized)."""
    new_w, new_h = transform.resized_size(width, height)
    pixels = new_w * height if new_w != width else 0
    return pixels + (new_w * new_h if new_h != height else 0)


def resize_refusal(
    transform: PilEvalTransform | PilNativeTransform, width: int, height: int, budget: int
) -> str:
    """Why a ``width`` x ``height`` image is refused under ``budget`` pixels of resize
    intermediates ("" where it is not)."""
    need = resize_pixels(transform, width, height)
    if need <= budget:
        return ""
    new_w, new_h = transform.resized_size(width, height)
    if isinstance(transform, PilNativeTransform):
        goal = f"(at most {transform.max_seq_len} patches)"
    else:
        goal = f"before the {transform.size[1]}x{transform.size[0]} centre crop"
    return (
        f"{width}x{height} pixels would be resized to {new_w:,}x{new_h:,} {goal} ({need:,} "
        f"pixels of intermediates; at most {budget:,})"
    )
