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

import torch
import torch.nn.functional as F
from PIL import Image

from vitkit.pil_images import (  # noqa: F401  (the PIL steps, re-exported: no PyTorch there)
    _PIL_INTERPOLATION,
    BAND_PIXELS,
    Interpolation,
    PilEvalTransform,
    Resize,
    _pair,
    convert_image,
    pil_to_array,
)

IMAGE_MEAN: tuple[float, ...] = (0.5,)  # per channel (one value broadcasts), on the [0, 1] scale
IMAGE_STD: tuple[float, ...] = (0.5,)
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's convert("L")


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


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """A PIL image as a uint8 [C, H, W] tensor: C = 1 for mode "L", else 3 (converted to RGB)."""
    return torch.from_numpy(pil_to_array(img))


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
