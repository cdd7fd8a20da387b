"""Image transforms: per-sample PIL transforms for image files, batched tensor ones for arrays.

Pixel values stay on the 0..255 scale until `normalize`, which applies the paper's
normalisation (ViT maps [0, 255] to [-1, 1]: mean 0.5, std 0.5 after dividing by 255).

- Per-sample (image files, run in DataLoader workers): `PilTrainTransform` (Inception
  random-resized crop + horizontal flip) and `PilEvalTransform` (resize, centre crop). They are
  small classes so they pickle; their randomness comes from torch's global generator, which the
  DataLoader seeds in each worker.
- Batched (in-memory datasets, run in the training process on a whole batch):
  `random_resized_crop_batch`, `random_translate_scale_batch` (optionally with an elastic
  distortion), `resize_batch`. Each is one `affine_grid` + `grid_sample` (or one `interpolate`)
  per batch, and all their randomness comes from the `torch.Generator` passed in (drawn on the
  CPU), so a resumed run is bitwise identical.
  `grid_sample` does not antialias: crops much larger than the output alias a little (fine for
  the small built-in datasets, which are mostly upsampled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

IMAGE_MEAN: tuple[float, ...] = (0.5,)  # per channel (one value broadcasts), on the [0, 1] scale
IMAGE_STD: tuple[float, ...] = (0.5,)
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's convert("L")
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


def normalize(
    images: torch.Tensor,
    mean: float | Sequence[float] = IMAGE_MEAN,
    std: float | Sequence[float] = IMAGE_STD,
    scale: float = 1 / 255,
) -> torch.Tensor:
    """`(x * scale - mean) / std` for pixel values on the 0..255 scale (uint8 or float).

    Works on [C, H, W] and [B, C, H, W]; `mean` and `std` are per channel (length 1 or C).
    `scale` is a checkpoint's rescale factor (1 / 255: pixels on [0, 1]; 1: no rescaling).
    Returns float32 (or the input's float dtype).
    """
    x = images.float() if not images.is_floating_point() else images
    mean_t = torch.as_tensor(mean, dtype=x.dtype, device=x.device).reshape(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=x.dtype, device=x.device).reshape(-1, 1, 1)
    channels = x.shape[-3]
    for name, value in (("mean", mean_t), ("std", std_t)):
        if value.shape[0] not in (1, channels):  # would broadcast to the wrong channel count
            raise ValueError(
                f"normalize: {name} has {value.shape[0]} values for {channels} channels"
            )
    scaled = x / 255.0 if scale == 1 / 255 else x * scale  # the division: bitwise as before
    return (scaled - mean_t) / std_t


def match_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """Convert [..., C, H, W] to `channels`: 1 -> 3 repeats, 3 -> 1 takes luminance.

    uint8 input gives uint8 output (rounded); float stays float.
    """
    have = images.shape[-3]
    if have == channels:
        return images
    if have == 1 and channels == 3:
        return images.expand(*images.shape[:-3], 3, *images.shape[-2:]).contiguous()
    if have == 3 and channels == 1:
        weights = torch.tensor(_LUMA, dtype=torch.float32, device=images.device).reshape(3, 1, 1)
        luma = (images.float() * weights).sum(dim=-3, keepdim=True)
        if images.is_floating_point():
            return luma.to(images.dtype)
        return luma.round_().clamp_(0, 255).to(images.dtype)
    raise ValueError(f"cannot convert {have} channels to {channels}")


# --- per-sample PIL transforms ----------------------------------------------------------------


def pil_to_array(img: Image.Image) -> np.ndarray:
    """A PIL image as a contiguous uint8 [C, H, W] array: C = 1 for mode "L", else 3
    (converted to RGB)."""
    if img.mode != "L" and img.mode != "RGB":
        img = img.convert("RGB")
    array = np.asarray(img, dtype=np.uint8)
    if array.ndim == 2:
        return array[None].copy()  # (a copy: PIL's buffer is read-only)
    return np.array(array.transpose(2, 0, 1), order="C")  # (always a copy)


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """A PIL image as a uint8 [C, H, W] tensor: C = 1 for mode "L", else 3 (converted to RGB)."""
    return torch.from_numpy(pil_to_array(img))


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


class PilTrainTransform:
    """Inception crop (random area `scale` and aspect `ratio`), resize to `size`, random flip."""

    def __init__(
        self,
        size: int | tuple[int, int],
        channels: int = 3,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        interpolation: Interpolation = "bilinear",
    ) -> None:
        self.size = _pair(size)
        self.channels = channels
        self.scale = scale
        self.ratio = ratio
        self.flip = flip
        self.interpolation = interpolation

    def crop_box(self, width: int, height: int) -> tuple[int, int, int, int]:
        """A random crop (left, top, right, bottom), drawn as torchvision's RandomResizedCrop."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, (1,)).item())
                left = int(torch.randint(0, width - w + 1, (1,)).item())
                return left, top, left + w, top + h
        # Fallback: the largest centred crop with the aspect ratio clamped into `ratio`.
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            w, h = int(round(height * self.ratio[1])), height
        else:
            w, h = width, height
        left, top = (width - w) // 2, (height - h) // 2
        return left, top, left + w, top + h

    def __call__(self, img: Image.Image) -> torch.Tensor:
        img = convert_image(img, self.channels)
        box = self.crop_box(*img.size)
        out_h, out_w = self.size
        img = img.resize((out_w, out_h), _PIL_INTERPOLATION[self.interpolation], box=box)
        if self.flip and torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return pil_to_tensor(img)

    def __repr__(self) -> str:
        return (
            f"PilTrainTransform(size={self.size}, channels={self.channels}, scale={self.scale}, "
            f"ratio={self.ratio}, flip={self.flip}, interpolation={self.interpolation!r})"
        )


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


# --- batched tensor transforms ----------------------------------------------------------------


def _as_float_batch(images: torch.Tensor) -> torch.Tensor:
    if images.dim() != 4:
        raise ValueError(f"expected a batch [B, C, H, W], got shape {tuple(images.shape)}")
    return images if images.is_floating_point() else images.float()


def _uniform(
    generator: torch.Generator, shape: tuple[int, ...], low: float, high: float
) -> torch.Tensor:
    return torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low


def _batch_part(n: int, part: tuple[int, int] | None) -> tuple[int, slice]:
    """(rows to draw parameters for, the rows of them that `n` images use)."""
    if part is None:
        return n, slice(0, n)
    offset, total = part
    if offset < 0 or offset + n > total:
        raise ValueError(f"part {part}: {n} rows from offset {offset} exceed the batch of {total}")
    return total, slice(offset, offset + n)


def elastic_field(
    generator: torch.Generator, b: int, hw: tuple[int, int], alpha: float, sigma: float
) -> torch.Tensor:
    """Elastic distortion fields (Simard et al. 2003), [B, H, W, 2] (x, y) in pixels: each
    pixel's displacement ~ U(-1, 1) per axis, smoothed by a Gaussian of std `sigma` pixels
    (truncated at 3 sigma, zero outside the image, so displacements fade at the edges), times
    `alpha`. Simard's MNIST values: alpha 34, sigma 4 (about 1.4 px rms, varying smoothly over
    a stroke)."""
    h, w = hw
    u = torch.rand((b, 2, h, w), generator=generator) * 2 - 1

    def blur(n: int) -> torch.Tensor:  # the 1-D filter as an n x n matrix (zero padding)
        r = max(1, math.ceil(3 * sigma))
        t = torch.arange(-r, r + 1, dtype=torch.float64)
        k = torch.exp(-(t**2) / (2 * sigma**2))
        d = torch.arange(n).view(-1, 1) - torch.arange(n).view(1, -1)
        return torch.where(d.abs() <= r, k[(d + r).clamp(0, 2 * r)] / k.sum(), 0.0).float()

    u = blur(h) @ u @ blur(w).T  # separable: rows, then columns
    return (alpha * u).permute(0, 2, 3, 1)


def _sample(
    x: torch.Tensor,
    theta: torch.Tensor,
    out_hw: tuple[int, int],
    fill: float,
    displacement: torch.Tensor | None = None,
) -> torch.Tensor:
    """grid_sample `x` through the affine maps `theta` [B, 2, 3] (output -> input, normalised),
    each output pixel's input point moved by `displacement` [B, H, W, 2] (x, y) pixels."""
    theta = theta.to(device=x.device, dtype=x.dtype)
    grid = F.affine_grid(theta, [x.shape[0], x.shape[1], *out_hw], align_corners=False)
    if displacement is not None:
        in_h, in_w = x.shape[-2:]
        per_pixel = torch.tensor([2 / in_w, 2 / in_h])
        grid = grid + (displacement * per_pixel).to(device=x.device, dtype=x.dtype)
    if fill == 0.0:
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    out = F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out + fill


def random_resized_crop_batch(
    images: torch.Tensor,
    out_size: int | tuple[int, int],
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: bool,
    generator: torch.Generator,
    part: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Inception crop of every image in a batch, resized to `out_size`; float, 0..255 scale.

    Per image: crop area fraction ~ U(scale), log aspect ~ U(log ratio), redrawn up to 10 times
    until the crop fits (as torchvision; then clamped), uniform position, and with `flip` a
    mirror with probability 1/2. Inception's values: scale (0.08, 1), ratio (3/4, 4/3).
    `generator` (a CPU generator) is the only source of randomness. `part=(offset, total)`:
    `images` are rows `offset ..` of a batch of `total` (one rank's slice of a data-parallel
    batch); the parameters are drawn for all `total` rows, so every rank draws the same.
    """
    x = _as_float_batch(images)
    _, _, h, w = x.shape
    b, rows = _batch_part(x.shape[0], part)
    out_hw = _pair(out_size)
    tries = 10
    area = _uniform(generator, (b, tries), *scale)
    log_aspect = _uniform(generator, (b, tries), math.log(ratio[0]), math.log(ratio[1]))
    aspect = log_aspect.exp()
    # Crop width and height as fractions of the image's width and height.
    fw = (area * aspect * h / w).sqrt()
    fh = (area / aspect * w / h).sqrt()
    fits = (fw <= 1) & (fh <= 1)
    first = torch.where(fits.any(dim=1), fits.float().argmax(dim=1), 0)
    fw = fw.gather(1, first[:, None]).squeeze(1).clamp(max=1.0)
    fh = fh.gather(1, first[:, None]).squeeze(1).clamp(max=1.0)
    # Centre of the crop in normalised coordinates, so that the crop stays inside the image.
    tx = (_uniform(generator, (b,), -1.0, 1.0)) * (1 - fw)
    ty = (_uniform(generator, (b,), -1.0, 1.0)) * (1 - fh)
    sign = torch.ones(b, dtype=torch.float64)
    if flip:
        sign = torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0).double()
    theta = torch.zeros(b, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = fw * sign
    theta[:, 0, 2] = tx
    theta[:, 1, 1] = fh
    theta[:, 1, 2] = ty
    return _sample(x, theta[rows], out_hw, fill=0.0)


def random_translate_scale_batch(
    images: torch.Tensor,
    max_shift_frac: float,
    scale_range: tuple[float, float],
    rotate_deg: float,
    generator: torch.Generator,
    fill: float = 0.0,
    part: tuple[int, int] | None = None,
    elastic: tuple[float, float] | None = None,
) -> torch.Tensor:
    """A small random affine per image (for digits): zoom, rotation, shift; float, 0..255 scale.

    Zoom ~ U(scale_range) (> 1 enlarges the content), rotation ~ U(-rotate_deg, rotate_deg)
    degrees, shift ~ U(-max_shift_frac, max_shift_frac) of the width / height per axis.
    Uncovered pixels take the value `fill` (0, the background of MNIST). Output size = input size.
    For digits: max_shift_frac 0.1, scale_range (0.9, 1.1), rotate_deg 10. `generator` (a CPU
    generator) is the only source of randomness; `part` as in `random_resized_crop_batch`.
    `elastic=(alpha, sigma)`: also an elastic distortion per image (`elastic_field`), in the
    same resampling (drawn after the affine parameters, so these stay those of a run without).
    """
    x = _as_float_batch(images)
    _, _, h, w = x.shape
    b, rows = _batch_part(x.shape[0], part)
    zoom = _uniform(generator, (b,), *scale_range)
    angle = _uniform(generator, (b,), -rotate_deg, rotate_deg) * (math.pi / 180)
    shift = _uniform(generator, (b, 2), -max_shift_frac, max_shift_frac) * 2  # normalised units
    cos, sin = angle.cos() / zoom, angle.sin() / zoom
    theta = torch.zeros(b, 2, 3, dtype=torch.float64)
    # A rotation in pixel space, written in normalised coordinates (which scale x and y by
    # 2 / W and 2 / H), so non-square images are not sheared.
    theta[:, 0, 0] = cos
    theta[:, 0, 1] = -sin * h / w
    theta[:, 1, 0] = sin * w / h
    theta[:, 1, 1] = cos
    theta[:, :, 2] = -shift
    field = None
    if elastic is not None:
        field = elastic_field(generator, b, (h, w), *elastic)[rows]
    return _sample(x, theta[rows], (h, w), fill=fill, displacement=field)


def resize_batch(images: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """Bilinear resize of a batch to `size`, antialiased when shrinking; float, 0..255 scale."""
    x = _as_float_batch(images)
    out_h, out_w = _pair(size)
    if (out_h, out_w) == tuple(x.shape[-2:]):
        return x.clone() if x is images else x
    shrinking = out_h < x.shape[-2] or out_w < x.shape[-1]
    return F.interpolate(
        x, size=(out_h, out_w), mode="bilinear", align_corners=False, antialias=shrinking
    )


def to_model_input(
    images: torch.Tensor,
    image_size: tuple[int, int],
    channels: int,
    mean: Sequence[float] = IMAGE_MEAN,
    std: Sequence[float] = IMAGE_STD,
    scale: float = 1 / 255,
) -> torch.Tensor:
    """A uint8 (or 0..255 float) batch → the model's input: its channels, its size, normalised.

    The one function that turns stored images into what a checkpoint's preprocessing describes,
    used by training, evaluation and prediction alike.
    """
    x = match_channels(images, channels).float()
    if tuple(x.shape[-2:]) != tuple(image_size):
        x = resize_batch(x, image_size)
    return normalize(x, mean, std, scale)
