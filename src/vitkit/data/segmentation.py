"""A synthetic segmentation set made by code: shapes with per-pixel masks at several scales.

Each image holds one to three filled shapes (square, disc, triangle), each of a random colour at
a random position, at one of three scales (small, medium, large: about 15 %, 30 % and 50 % of the
image side), on a background of another colour with Gaussian pixel noise; later shapes lie over
earlier ones. The mask gives each pixel its class: 0 background, then the shapes in
``SEGMENTATION_CLASSES`` order. With ``colour_by_class`` (the default) each class has its own
dominant colour channel (square red, disc green, triangle blue; the other two channels random and
dimmer), so a frozen backbone's features carry the class even with random weights; without it a
shape's colour says nothing of its class, only its form does (a task for trained features).
The data depend only on (n, image_size, seed, colour_by_class).
"""

from __future__ import annotations

import torch
from torch import Tensor

from vitkit.errors import VitkitError

SEGMENTATION_CLASSES = ("background", "square", "disc", "triangle")
SCALES = (0.15, 0.3, 0.5)  # a shape's half-extent x 2, relative to the image side
NOISE_STD = 0.05  # pixel noise, on the [-1, 1] scale


def make_segmentation(
    n: int, image_size: int = 32, seed: int = 0, colour_by_class: bool = True
) -> tuple[Tensor, Tensor]:
    """``n`` images [n, 3, S, S] in [-1, 1] (float32) and their masks [n, S, S] (int64)."""
    if n <= 0:
        raise VitkitError(f"segmentation: the number of images must be positive, not {n}")
    if image_size < 16:
        raise VitkitError(f"segmentation: image_size must be at least 16 px, not {image_size}")
    g = torch.Generator().manual_seed(seed)
    s = image_size
    yy, xx = torch.meshgrid(torch.arange(s) + 0.5, torch.arange(s) + 0.5, indexing="ij")
    background = torch.rand(n, 3, 1, 1, generator=g) * 0.6 - 0.3  # dim, so shapes stand out
    images = background.expand(n, 3, s, s).clone()
    masks = torch.zeros(n, s, s, dtype=torch.int64)
    count = torch.randint(1, 4, (n,), generator=g)
    for k in range(3):
        scale = torch.tensor(SCALES)[torch.randint(0, len(SCALES), (n,), generator=g)]
        half = scale * s / 2
        cx = half + torch.rand(n, generator=g) * (s - 2 * half)
        cy = half + torch.rand(n, generator=g) * (s - 2 * half)
        cls = torch.randint(1, len(SEGMENTATION_CLASSES), (n,), generator=g)
        sign = torch.where(torch.rand(n, 3, generator=g) < 0.5, -1.0, 1.0)
        colour = sign * (0.5 + 0.5 * torch.rand(n, 3, generator=g))  # far from the background
        if colour_by_class:  # the class's channel bright, the others dimmer
            colour = colour * 0.4
            colour[torch.arange(n), cls - 1] = 0.7 + 0.3 * torch.rand(n, generator=g)
        dx = (xx - cx[:, None, None]) / half[:, None, None]  # [-1, 1] inside the box
        dy = (yy - cy[:, None, None]) / half[:, None, None]
        inside = torch.stack(
            [
                (dx.abs() <= 1) & (dy.abs() <= 1),  # square
                dx**2 + dy**2 <= 1,  # disc
                (dy <= 1) & (dx.abs() <= (dy + 1) / 2),  # triangle, apex up
            ]
        )  # [3, n, s, s]
        shape = inside[cls - 1, torch.arange(n)] & (k < count)[:, None, None]
        masks = torch.where(shape, cls[:, None, None], masks)
        images = torch.where(shape[:, None], colour[:, :, None, None], images)
    images = images + NOISE_STD * torch.randn(images.shape, generator=g)
    return images.clamp(-1, 1), masks
