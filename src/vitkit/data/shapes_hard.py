"""`shapes-hard`: a generated RGB dataset that needs relations between objects, and that grows
to millions of images (a stand-in for the paper's large pre-training sets).

Each image holds three non-overlapping shapes (the six classes of `shapes`) of three clearly
different sizes, each in its own colour, on a random background with small clutter (2-3 px
specks of random colours) and pixel noise. The label combines two questions:

- which shape is the **largest** object (6 answers; the other two are distractors of any shape),
- is the **smallest** object to the left or to the right of the largest one (centres at least
  10 % of the side apart horizontally),

so 12 classes (``circle/left`` ...; chance 8.3 %). Flipping changes the class, so it is off.

Images are generated in chunks of :data:`CHUNK` images, chunk ``c`` of a stream from its own
random generator ``(seed, stream, c)``: the data depend only on (split, n, image_size, seed),
the first ``n`` images of a larger set are the set of ``n`` (subsets nest), and memory while
generating stays bounded; the result is held as uint8 (3 KB per 32 px image: 3 GB for 10^6;
:data:`MAX_IMAGES` caps one set). ``vitkit.data.load_dataset`` draws the "train", "val" and
"test" splits from three different streams, so a training subset of any size is generated
directly rather than carved from a pool.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import torch

from vitkit.data.arrays import ArrayDataset, DataInfo
from vitkit.data.shapes import SHAPE_CLASSES, contrasting_colours, rasterise
from vitkit.errors import VitkitError

SIDES = ("left", "right")  # where the smallest object lies relative to the largest
HARD_CLASSES = tuple(f"{shape}/{side}" for shape in SHAPE_CLASSES for side in SIDES)
CHUNK = 1024  # images per generator chunk (part of the data's definition)
MAX_IMAGES = 4_000_000  # one set: 12 GB at 32 px
STREAMS = {"train": 10, "val": 11, "test": 12}
DEFAULT_N = {"train": 50_000, "val": 5_000, "test": 10_000}
# Object sides, as fractions of the image side: largest, middle, smallest (disjoint ranges).
_SIDE_RANGES = ((0.32, 0.42), (0.22, 0.27), (0.15, 0.19))
_MIN_DX = 0.1  # |x of smallest - x of largest| at least this fraction of the side
_GAP = 1.0  # px between the objects' boxes
_CLUTTER = 4  # specks per image
_NOISE_STD = 8.0


def make_shapes_hard(
    split: Literal["train", "val", "test"],
    n: int | None = None,
    image_size: int = 32,
    seed: int = 0,
) -> ArrayDataset:
    """Generate `n` images of the `split` stream (uint8 RGB, 12 classes)."""
    if split not in STREAMS:
        raise VitkitError(f"shapes-hard: unknown split '{split}': expected train, val or test")
    n = DEFAULT_N[split] if n is None else n
    if not 0 < n <= MAX_IMAGES:
        raise VitkitError(f"shapes-hard: the number of images must be 1..{MAX_IMAGES:,}, not {n}")
    if image_size < 32:
        raise VitkitError(f"shapes-hard: image_size must be at least 32 px, not {image_size}")
    images, labels, boxes = _generate(split, n, image_size, seed)
    info = DataInfo(
        name="shapes-hard",
        num_classes=len(HARD_CLASSES),
        class_names=HARD_CLASSES,
        channels=3,
        image_size=(image_size, image_size),
        allow_flip=False,  # a flip swaps left and right
    )
    return ArrayDataset(images, labels, info, boxes=boxes)


def answer_accuracy(confusion: np.ndarray | Sequence[Sequence[int]]) -> dict[str, float]:
    """The two questions of a `shapes-hard` label, scored apart from a [12, 12] confusion
    matrix (rows: true class, columns: predicted; class ``2 * shape + side``): how often the
    largest shape is right ("shape"), the side of the smallest object ("side"), and the side
    among the images whose shape is right ("side_given_shape"). A model that knows the shapes
    but not the relation scores shape 1.0, side 0.5: top-1 0.5."""
    c = np.asarray(confusion, dtype=np.float64)
    k = len(HARD_CLASSES)
    if c.shape != (k, k):
        raise VitkitError(f"shapes-hard: a confusion matrix is {k}x{k}, not {c.shape}")
    total = c.sum()
    if total <= 0:
        raise VitkitError("shapes-hard: the confusion matrix counts no images")
    shape_of, side_of = np.divmod(np.arange(k), len(SIDES))  # of each class
    same_shape = shape_of[:, None] == shape_of[None, :]  # [true, predicted]
    same_side = side_of[:, None] == side_of[None, :]
    shape_right = c[same_shape].sum()
    return {
        "shape": float(shape_right / total),
        "side": float(c[same_side].sum() / total),
        "side_given_shape": float(np.trace(c) / shape_right) if shape_right else math.nan,
    }


@functools.lru_cache(maxsize=3)  # a study's consecutive runs share their train, val and test
def _generate(split: str, n: int, image_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    """The images, labels and boxes of a set, chunk by chunk (read-only: shared by callers)."""
    images = torch.empty((n, 3, image_size, image_size), dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.int64)
    boxes = torch.empty((n, 4), dtype=torch.float32)

    def fill(c: int) -> None:
        img, lab, box = _chunk(np.random.default_rng([seed, STREAMS[split], c]), image_size)
        start = c * CHUNK
        m = min(CHUNK, n - start)
        images[start : start + m] = torch.from_numpy(img[:m])
        labels[start : start + m] = torch.from_numpy(lab[:m])
        boxes[start : start + m] = torch.from_numpy(box[:m])

    chunks = range(-(-n // CHUNK))
    # numpy releases the GIL in its array loops: chunks generate in parallel threads, each from
    # its own generator, so the result does not depend on the number of threads.
    with ThreadPoolExecutor(max(1, min(torch.get_num_threads(), len(chunks)))) as pool:
        list(pool.map(fill, chunks))
    return images, labels, boxes


def _chunk(rng: np.random.Generator, image_size: int) -> tuple[np.ndarray, ...]:
    """One chunk: images [CHUNK, 3, S, S] uint8, labels, the largest object's box."""
    n, size = CHUNK, float(image_size)
    labels = rng.permutation(np.arange(n) % len(HARD_CLASSES))
    big_shape, side = labels // 2, labels % 2  # side 0: smallest left of the largest
    half = np.stack([rng.uniform(lo, hi, n) * size / 2 for lo, hi in _SIDE_RANGES], 1)
    cx, cy = _place(rng, half, side, size)
    shapes = np.stack([big_shape, rng.integers(0, 6, n), rng.integers(0, 6, n)], 1)
    background = rng.integers(0, 256, (n, 3)).astype(np.float32)
    img = np.broadcast_to(background[:, :, None, None], (n, 3, image_size, image_size)).copy()
    # Clutter first, under the objects: specks of 2-3 px anywhere.
    for _ in range(_CLUTTER):
        h = rng.uniform(1.0, 1.5, n)
        x, y = rng.uniform(h, size - h), rng.uniform(h, size - h)
        colour = rng.integers(0, 256, (n, 3)).astype(np.float32)
        _paint(img, _squares(x, y, h, image_size), colour)
    for k in range(3):
        colour = contrasting_colours(rng, background)
        mask = np.empty((n, image_size, image_size), dtype=bool)
        for s in range(len(SHAPE_CLASSES)):  # each image's own shape only
            sel = shapes[:, k] == s
            mask[sel] = rasterise(shapes[sel, k], cx[sel, k], cy[sel, k], half[sel, k], image_size)
        _paint(img, mask, colour)
    img += rng.standard_normal(img.shape, dtype=np.float32) * _NOISE_STD
    x, y, h = cx[:, 0], cy[:, 0], half[:, 0]
    box = np.stack([x - h, y - h, x + h, y + h], 1).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), labels.astype(np.int64), box


def _squares(x: np.ndarray, y: np.ndarray, h: np.ndarray, size: int) -> np.ndarray:
    """Masks (bool [n, size, size]) of axis-aligned squares, sampled at pixel centres."""
    centres = np.arange(size, dtype=np.float32) + 0.5
    in_x = np.abs(centres[None] - x[:, None].astype(np.float32)) <= h[:, None]
    in_y = np.abs(centres[None] - y[:, None].astype(np.float32)) <= h[:, None]
    return in_y[:, :, None] & in_x[:, None, :]


def _paint(img: np.ndarray, mask: np.ndarray, colour: np.ndarray) -> None:
    """Fill the pixels of ``mask`` (bool [n, S, S]) with ``colour`` (float32 [n, 3])."""
    np.copyto(img, np.broadcast_to(colour[:, :, None, None], img.shape), where=mask[:, None])


def _place(
    rng: np.random.Generator, half: np.ndarray, side: np.ndarray, size: float
) -> tuple[np.ndarray, np.ndarray]:
    """Centres [n, 3] of the three objects: inside the image, boxes apart, the smallest on the
    required side of the largest; drawn again where a draw breaks a rule."""
    n = len(side)
    cx, cy = np.zeros((n, 3)), np.zeros((n, 3))
    todo = np.arange(n)
    while len(todo):
        h = half[todo]
        x = rng.uniform(h, size - h)
        y = rng.uniform(h, size - h)
        ok = np.ones(len(todo), dtype=bool)
        for i, j in ((0, 1), (0, 2), (1, 2)):
            reach = h[:, i] + h[:, j] + _GAP
            ok &= (np.abs(x[:, i] - x[:, j]) >= reach) | (np.abs(y[:, i] - y[:, j]) >= reach)
        dx = x[:, 2] - x[:, 0]
        ok &= np.where(side[todo] == 0, -dx, dx) >= _MIN_DX * size
        cx[todo[ok]], cy[todo[ok]] = x[ok], y[ok]
        todo = todo[~ok]
    return cx, cy
