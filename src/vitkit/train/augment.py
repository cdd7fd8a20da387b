"""Batch augmentations of the data-efficient recipes ("How to train your ViT?", AugReg):
RandAugment, Mixup and CutMix, all on whole batches of tensors with an explicit generator.

- :func:`rand_augment`: per image, ``num_ops`` operations drawn uniformly from the standard
  list (identity, auto-contrast, equalize, rotate, solarize, colour, posterize, contrast,
  brightness, sharpness, shear x/y, translate x/y), each at ``magnitude`` on the usual 0..30 scale
  (AugReg uses ``randaug(2, 10)`` to ``randaug(2, 20)``), with a random sign for the geometric
  and enhancement ops. Input and output: uint8 [B, C, H, W].
- :func:`mix`: Mixup (λ ~ Beta(α, α), blend whole images) or CutMix (paste a box covering
  1 - λ of the image; λ corrected to the box actually pasted), one of the two per batch, partners
  by reversing the batch; targets become the λ-weighted soft labels.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

OPS = (
    "identity", "autocontrast", "equalize", "rotate", "solarize", "color", "posterize",
    "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y",
)  # fmt: skip
MAX_MAGNITUDE = 30.0


def _gray(x: Tensor) -> Tensor:
    if x.shape[1] == 1:
        return x
    w = torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def _blend(a: Tensor, b: Tensor, factor: Tensor) -> Tensor:
    return (b + factor.view(-1, 1, 1, 1) * (a - b)).clamp(0, 255)


def _affine(x: Tensor, theta: Tensor) -> Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    fill = torch.full_like(x, 128.0)  # the grey fill of the TF implementation
    mask = F.grid_sample(torch.ones_like(x[:, :1]), grid, mode="nearest", align_corners=False)
    out = F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out + (1 - mask) * fill


def _equalize(x: Tensor) -> Tensor:
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            v = x[i, c].round().long().clamp(0, 255)
            hist = torch.bincount(v.flatten(), minlength=256)
            nz = hist[hist > 0]
            step = (hist.sum() - nz[-1]) // 255 if len(nz) else torch.tensor(0)
            if step == 0:
                out[i, c] = x[i, c]
                continue
            lut = ((torch.cumsum(hist, 0) + step // 2) // step).clamp(0, 255)
            lut = torch.cat([torch.zeros(1, dtype=lut.dtype), lut[:-1]])
            out[i, c] = lut[v].to(x.dtype)
    return out


def apply_op(x: Tensor, op: str, m: float, sign: Tensor) -> Tensor:
    """One operation on a float batch in [0, 255]; ``m`` in [0, 1]; ``sign`` ±1 per image."""
    b = x.shape[0]
    if op == "identity":
        return x
    if op == "autocontrast":
        lo = x.amin(dim=(2, 3), keepdim=True)
        hi = x.amax(dim=(2, 3), keepdim=True)
        scale = torch.where(hi > lo, 255.0 / (hi - lo).clamp_min(1e-6), torch.ones_like(hi))
        return torch.where(hi > lo, (x - lo) * scale, x)
    if op == "equalize":
        return _equalize(x)
    if op == "solarize":
        threshold = 256.0 - m * 256.0
        return torch.where(x >= threshold, 255.0 - x, x)
    if op == "posterize":
        bits = int(round(8 - m * 4))  # 8 .. 4 bits kept
        shift = 8 - bits
        return (x.round().long() >> shift << shift).to(x.dtype)
    if op in ("color", "contrast", "brightness", "sharpness"):
        factor = 1.0 + sign * m * 0.9
        if op == "color":
            return _blend(x, _gray(x).expand_as(x), factor)
        if op == "brightness":
            return _blend(x, torch.zeros_like(x), factor)
        if op == "contrast":
            mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
            return _blend(x, mean.expand_as(x), factor)
        kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
        c = x.shape[1]
        blurred = F.conv2d(x, kernel.view(1, 1, 3, 3).repeat(c, 1, 1, 1), padding=1, groups=c)
        blurred[..., 0, :], blurred[..., -1, :] = x[..., 0, :], x[..., -1, :]
        blurred[..., :, 0], blurred[..., :, -1] = x[..., :, 0], x[..., :, -1]
        return _blend(x, blurred, factor)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    if op == "rotate":
        angle = sign * m * math.radians(30.0)
        theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle), -torch.sin(angle)
        theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle), torch.cos(angle)
    elif op == "shear_x":
        theta[:, 0, 1] = sign * m * 0.3
    elif op == "shear_y":
        theta[:, 1, 0] = sign * m * 0.3
    elif op == "translate_x":
        theta[:, 0, 2] = sign * m * 0.45 * 2  # fraction of the width, in [-1, 1] coordinates
    elif op == "translate_y":
        theta[:, 1, 2] = sign * m * 0.45 * 2
    else:
        raise ValueError(f"unknown RandAugment op {op!r}")
    return _affine(x, theta)


def rand_augment(
    images: Tensor, num_ops: int, magnitude: float, generator: torch.Generator
) -> Tensor:
    """RandAugment on a uint8 batch; every image draws its own ops and signs."""
    x = images.float()
    b = x.shape[0]
    m = min(max(magnitude / MAX_MAGNITUDE, 0.0), 1.0)
    for _ in range(num_ops):
        choice = torch.randint(len(OPS), (b,), generator=generator)
        sign = torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0)
        out = x.clone()
        for k in choice.unique().tolist():
            idx = torch.nonzero(choice == k).flatten()
            out[idx] = apply_op(x[idx], OPS[k], m, sign[idx])
        x = out
    return x.round().clamp(0, 255).to(torch.uint8)


def mix(
    images: Tensor,
    targets: Tensor,
    *,
    mixup_alpha: float,
    cutmix_alpha: float,
    generator: torch.Generator,
    switch_prob: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Mixup or CutMix of a float batch with soft ``targets`` [B, K]; partners: reversed batch.

    With both alphas > 0 one of the two is chosen per batch (CutMix with ``switch_prob``).
    """
    if mixup_alpha <= 0 and cutmix_alpha <= 0:
        return images, targets
    use_cutmix = cutmix_alpha > 0 and (
        mixup_alpha <= 0 or float(torch.rand(1, generator=generator)) < switch_prob
    )
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    # torch's Beta takes no generator; a numpy one seeded from ours keeps runs reproducible.
    seed = int(torch.randint(2**62, (1,), generator=generator))
    lam = float(np.random.default_rng(seed).beta(alpha, alpha))
    partner = images.flip(0)
    if use_cutmix:
        h, w = images.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy = int(torch.randint(h, (1,), generator=generator))
        cx = int(torch.randint(w, (1,), generator=generator))
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
        images = images.clone()
        images[..., y0:y1, x0:x1] = partner[..., y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        images = lam * images + (1.0 - lam) * partner
    return images, lam * targets + (1.0 - lam) * targets.flip(0)


def augment_batch(
    images: Tensor,
    *,
    randaugment: tuple[int, float] | None,
    geometric: Literal["none", "digits", "inception"],
    image_size: tuple[int, int],
    allow_flip: bool,
    generator: torch.Generator,
    part: tuple[int, int] | None = None,
    elastic: tuple[float, float] | None = None,
) -> Tensor:
    """A training batch's random augmentation, drawing only from ``generator``: RandAugment
    (if asked) on any uint8 batch, then the ``geometric`` one ("digits": small affine jitter;
    "inception": random resized crop + flip where ``allow_flip``) as a float batch in [0, 255].
    ``part`` = (offset, total): this rank's rows of a global batch, whose parameters are drawn
    for all its rows (so the result does not depend on the world size). ``elastic`` = (alpha,
    sigma): an elastic distortion inside the "digits" jitter (refused with any other)."""
    from vitkit.data import random_resized_crop_batch, random_translate_scale_batch

    if randaugment is not None:
        ops, magnitude = randaugment
        images = rand_augment(images, ops, magnitude, generator)
    if elastic is not None and geometric != "digits":
        raise ValueError(f"an elastic distortion needs the digits jitter, not {geometric!r}")
    if geometric == "none":
        return images
    x = images.float()
    if geometric == "digits":
        x = random_translate_scale_batch(
            x,
            max_shift_frac=0.1,
            scale_range=(0.9, 1.1),
            rotate_deg=10.0,
            generator=generator,
            part=part,
            elastic=elastic,
        )
    else:
        x = random_resized_crop_batch(
            x,
            image_size,
            scale=(0.35, 1.0),
            ratio=(3 / 4, 4 / 3),
            flip=allow_flip,
            generator=generator,
            part=part,
        )
    return x.clamp(0, 255)
