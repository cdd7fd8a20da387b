"""A dense probe: a small head trained on a frozen ViT's patch features from several depths, the
way DINOv2 and DINOv3 evaluate segmentation (a linear layer on frozen multi-depth features) and
DPT reads a ViT (maps from four depths fused coarse to fine).

1. features: ``model.forward_intermediates(x, indices, norm=True, output_fmt="NCHW")`` (timm's
   feature API, :mod:`vitkit.models.features`), the maps of the chosen blocks concatenated
   along the channels, computed once (the model is frozen);
2. a head: ``"linear"`` (BatchNorm then a 1x1 convolution: DINOv2's linear probe) or ``"dpt"``
   (per depth a 1x1 projection, fused deepest first with residual 3x3 convolutions, then 2x
   upsampling: a small DPT);
3. the head's logits upsampled bilinearly to the pixels, cross-entropy against the masks,
   full-batch Adam;
4. per-class intersection over union on held-out images, and their mean (mIoU).

``random_features=True`` replaces every feature by Gaussian noise of the same mean and standard
deviation (per channel): the probe then learns the class frequencies only, the floor a real
backbone's features must clear.

Two feature sources beside a model: :class:`TiledFeatures` reads a canvas tile by tile at the
model's own image size and stitches the maps back together (a model trained on 28 px digits
reads each digit of a canvas as one of its images), and :class:`PixelPatches` is the baseline
with no model at all, each patch's raw pixels as its feature (``pixel_unshuffle``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.errors import VitkitError

HEADS = ("linear", "dpt")


@dataclass
class DenseProbeResult:
    """Per-class IoU on the test images (``class_names`` order), their mean, the final training
    loss, and the features' channels and grid."""

    iou: list[float]
    class_names: tuple[str, ...]
    train_loss: float
    channels: int
    grid: tuple[int, int]
    predictions: Tensor | None = None  # the test images' predicted masks [N, H, W]

    @property
    def miou(self) -> float:
        """The mean over the classes present (a NaN IoU, a class absent from both, is left out,
        as mmsegmentation's and DINOv2's ``nanmean``)."""
        present = [v for v in self.iou if not math.isnan(v)]
        return sum(present) / len(present) if present else float("nan")

    def table(self) -> str:
        rows = [f"{n:12s} {v:6.3f}" for n, v in zip(self.class_names, self.iou)]
        return "\n".join([*rows, f"{'mIoU':12s} {self.miou:6.3f}"])


@torch.no_grad()
def frozen_features(
    model: Any, images: Tensor, indices: Sequence[int] | int = 4, batch_size: int = 64
) -> list[Tensor]:
    """The maps [N, D, h, w] of the blocks ``indices`` (timm's meaning: an int is the last n),
    final-normed, for every image, in batches; a features-only model (``features_only=True``)
    gives its own outputs."""
    was = model.training
    model.eval()
    chunks: list[list[Tensor]] = []
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size]
        if hasattr(model, "forward_intermediates"):
            kw: dict[str, Any] = {"norm": True, "output_fmt": "NCHW", "intermediates_only": True}
            chunks.append(model.forward_intermediates(x, indices, **kw))
        else:
            chunks.append(list(model(x)))
    model.train(was)
    return [torch.cat(level) for level in zip(*chunks)]


class TiledFeatures(nn.Module):
    """A features-only view of ``model`` that reads an image tile by tile: the image is cut into
    ``tile`` x ``tile`` squares (its sides must be multiples of ``tile``), each square goes
    through ``model.forward_intermediates`` at ``tile`` px (normed maps of the blocks
    ``indices``, timm's meaning), and each depth's maps are put back in place: [B, D, rows x h,
    columns x w]. Sliding-window inference without overlap, as segmentation codebases run a
    backbone on images larger than it was trained on."""

    def __init__(self, model: nn.Module, tile: int, indices: Sequence[int] | int = 4) -> None:
        super().__init__()
        if not hasattr(model, "forward_intermediates"):
            raise VitkitError("TiledFeatures needs a model with forward_intermediates")
        self.model, self.tile = model, tile
        self.indices = indices if isinstance(indices, int) else list(indices)

    def forward(self, x: Tensor) -> list[Tensor]:
        b, c, height, width = x.shape
        t = self.tile
        if height % t or width % t:
            raise VitkitError(
                f"TiledFeatures: a {height}x{width} image is not a whole number of {t} px tiles"
            )
        rows, cols = height // t, width // t
        tiles = x.reshape(b, c, rows, t, cols, t).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, t, t)
        maps = self.model.forward_intermediates(  # type: ignore[operator]
            tiles, self.indices, norm=True, output_fmt="NCHW", intermediates_only=True
        )
        out = []
        for m in maps:  # [b * rows * cols, D, h, w] -> [b, D, rows * h, cols * w]
            d, h, w = m.shape[1:]
            m = m.reshape(b, rows, cols, d, h, w).permute(0, 3, 1, 4, 2, 5)
            out.append(m.reshape(b, d, rows * h, cols * w))
        return out


class PixelPatches(nn.Module):
    """The baseline with no model: each ``patch`` x ``patch`` patch's raw pixels as its feature
    (``pixel_unshuffle``: [B, C, H, W] -> one map [B, C * patch², H / patch, W / patch]), the
    same grid as a ViT of that patch size."""

    def __init__(self, patch: int) -> None:
        super().__init__()
        self.patch = patch

    def forward(self, x: Tensor) -> list[Tensor]:
        if x.shape[-2] % self.patch or x.shape[-1] % self.patch:
            raise VitkitError(
                f"PixelPatches: a {x.shape[-2]}x{x.shape[-1]} image is not a whole number of "
                f"{self.patch} px patches"
            )
        return [F.pixel_unshuffle(x, self.patch)]


class LinearHead(nn.Module):
    """BatchNorm over the concatenated channels, then a 1x1 convolution (DINOv2's probe)."""

    def __init__(self, channels: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(sum(channels))
        self.conv = nn.Conv2d(sum(channels), num_classes, 1)

    def forward(self, maps: list[Tensor]) -> Tensor:
        return self.conv(self.bn(torch.cat(maps, dim=1)))


class DPTHead(nn.Module):
    """A small DPT: each depth projected to ``width`` channels, fused from the deepest up (each
    step adds the next shallower map, then a residual 3x3 convolution), upsampled 2x, and a 1x1
    classifier."""

    def __init__(self, channels: Sequence[int], num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Conv2d(c, width, 1) for c in channels)
        self.fuse = nn.ModuleList(
            nn.Sequential(nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)) for _ in channels
        )
        self.classify = nn.Conv2d(width, num_classes, 1)

    def forward(self, maps: list[Tensor]) -> Tensor:
        x = torch.zeros(())
        for i in reversed(range(len(maps))):  # deepest first
            x = x + self.proj[i](maps[i])
            x = x + self.fuse[i](x)
        return self.classify(F.interpolate(x, scale_factor=2.0, mode="bilinear"))


def iou_per_class(pred: Tensor, target: Tensor, num_classes: int) -> list[float]:
    """Intersection over union of each class over every pixel (NaN where a class is absent
    from both)."""
    out = []
    for c in range(num_classes):
        p, t = pred == c, target == c
        union = (p | t).sum().item()
        out.append((p & t).sum().item() / union if union else float("nan"))
    return out


def _noise_like(maps: list[Tensor], seed: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed + 7)
    out = []
    for m in maps:
        mean, std = m.mean(dim=(0, 2, 3), keepdim=True), m.std(dim=(0, 2, 3), keepdim=True)
        out.append(torch.randn(m.shape, generator=g, dtype=m.dtype) * std + mean)
    return out


def train_dense_probe(
    model: Any,
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    class_names: Sequence[str],
    indices: Sequence[int] | int = 4,
    head: str = "linear",
    steps: int = 300,
    lr: float = 1e-2,
    seed: int = 0,
    random_features: bool = False,
) -> DenseProbeResult:
    """Train a ``head`` on ``model``'s frozen features of ``train`` (images, masks) and score it
    on ``test``: :class:`DenseProbeResult` (see the module's docstring)."""
    if head not in HEADS:
        raise VitkitError(f"unknown dense head {head!r} (choose from {', '.join(HEADS)})")
    (x, y), (xt, yt) = train, test
    for name, (images, masks) in (("train", train), ("test", test)):
        if images.shape[-2:] != masks.shape[-2:] or len(images) != len(masks):
            raise VitkitError(
                f"{name}: images {tuple(images.shape)} and masks {tuple(masks.shape)} differ "
                "in number or size"
            )
    k = len(class_names)
    if int(max(y.max(), yt.max())) >= k:
        raise VitkitError(f"the masks hold a class beyond the {k} named ({', '.join(class_names)})")
    feats, feats_t = frozen_features(model, x, indices), frozen_features(model, xt, indices)
    if random_features:
        feats, feats_t = _noise_like(feats, seed), _noise_like(feats_t, seed + 1)
    torch.manual_seed(seed)
    chans = [f.shape[1] for f in feats]
    net: nn.Module = LinearHead(chans, k) if head == "linear" else DPTHead(chans, k)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    size = tuple(y.shape[-2:])
    loss = torch.zeros(())
    net.train()
    for _ in range(steps):
        logits = F.interpolate(net(feats), size=size, mode="bilinear")
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    with torch.no_grad():
        pred = F.interpolate(net(feats_t), size=tuple(yt.shape[-2:]), mode="bilinear").argmax(1)
    grid = (int(feats[0].shape[-2]), int(feats[0].shape[-1]))
    iou = iou_per_class(pred, yt, k)
    return DenseProbeResult(iou, tuple(class_names), loss.item(), sum(chans), grid, pred)
